"""Softmax op (kernels/softmax.py): its NKI launch, custom op, public function and
registration."""

from __future__ import annotations

from typing import Optional

import torch

from .. import _checks, _dispatch, _kernel_sources, backward_references, references, registry, roofline
from .._custom_op import KernelBackward, define_op
from ._workloads import randn

__all__ = ["softmax"]

# Longest row done in one on-chip pass; longer rows use the online form, resident in SBUF
# up to RESIDENT_BYTES per partition, else streamed (kernels/limits.py, with the reasons).
MAX_COLS = _kernel_sources.limits().SOFTMAX_MAX_COLS
RESIDENT_BYTES = _kernel_sources.limits().SOFTMAX_RESIDENT_BYTES


def _normalize_dim(input: torch.Tensor, dim: int) -> int:
    dim = _checks.check_index("dim", dim)
    ndim = max(input.dim(), 1)
    if not -ndim <= dim < ndim:
        raise IndexError(f"dim={dim} is out of range for input with {input.dim()} dimension(s) "
                         f"(expected -{ndim} <= dim < {ndim})")
    return dim % ndim


def softmax_kernel_call(input: torch.Tensor, dim: int = -1, max_cols: Optional[int] = None,
                        resident_bytes: Optional[int] = None, split_rows: bool = True) -> _dispatch.KernelCall:
    """The NKI launch: kernels/softmax.py on ``input`` with ``dim`` moved last, viewed as [N, C].

    ``max_cols`` (default 8192) is the longest row done in one on-chip pass; longer rows use
    the online form in chunks of ``min(max_cols, 4096)``, keeping the row tile in SBUF when
    its fp32 exponentials take at most ``resident_bytes`` (default 128 KiB) per partition and
    fit the target's SBUF, else streaming it twice from HBM. Long rows in few row tiles (long
    enough for it to pay) are cut into segments over the partitions instead, in groups of at
    most 32 rows taken in turn (the split form, trn2 and trn3), unless ``split_rows`` is
    False. Tests lower the limits and turn the split off to exercise every form.
    """
    _checks.check_bool("split_rows", split_rows)
    max_cols = MAX_COLS if max_cols is None else _checks.check_index("max_cols", max_cols)
    if not 1 <= max_cols <= MAX_COLS:
        raise ValueError(f"max_cols={max_cols} is outside [1, {MAX_COLS}]")
    resident_bytes = RESIDENT_BYTES if resident_bytes is None else _checks.check_index("resident_bytes", resident_bytes)
    if not 0 <= resident_bytes <= RESIDENT_BYTES:
        raise ValueError(f"resident_bytes={resident_bytes} is outside [0, {RESIDENT_BYTES}]")
    dim = _normalize_dim(input, dim)
    x = input.reshape(1) if input.dim() == 0 else input
    moved = x.movedim(dim, -1)
    moved_shape = moved.shape
    cols = moved_shape[-1]
    shape = input.shape

    def finish(out):
        return out.reshape(moved_shape).movedim(-1, dim).reshape(shape).contiguous()

    return _dispatch.KernelCall("softmax", "softmax_kernel", (moved.reshape(-1, cols),),
                                {"max_cols": int(max_cols), "resident_bytes": int(resident_bytes),
                                 "split_rows": split_rows},
                                finish=finish)


def softmax_backward_kernel_call(grad_output: torch.Tensor, output: torch.Tensor, dim: int = -1) -> _dispatch.KernelCall:
    """The NKI launch of softmax's backward: kernels/softmax_backward.py on dy and y with
    ``dim`` moved last, viewed as [N, C] (C <= 8192, the one-pass rows)."""
    dim = _normalize_dim(output, dim)
    y = output.reshape(1) if output.dim() == 0 else output
    moved = y.movedim(dim, -1)
    moved_shape = moved.shape
    cols = moved_shape[-1]
    if cols > MAX_COLS:
        raise ValueError(f"softmax backward: output.shape[{dim}]={cols} exceeds {MAX_COLS}, the longest row the "
                         "NKI backward kernel takes (the softmax op's autograd recomputes longer rows instead)")
    dy = (grad_output.reshape(1) if grad_output.dim() == 0 else grad_output).movedim(dim, -1)
    shape = output.shape

    def finish(out):
        return out.reshape(moved_shape).movedim(-1, dim).reshape(shape).contiguous()

    return _dispatch.KernelCall("softmax_backward", "softmax_backward_kernel",
                                (dy.reshape(-1, cols), moved.reshape(-1, cols)), finish=finish)


def _softmax_backward(grad_output: torch.Tensor, output: torch.Tensor, dim: int) -> torch.Tensor: ...


_softmax_backward_op = define_op(
    _softmax_backward, kernel_call=softmax_backward_kernel_call, reference=backward_references.softmax_backward,
    fake=lambda dy, output, dim: torch.empty_like(output),
    grad_reference=lambda *a: backward_references.softmax_backward(*a, compute_dtype=torch.float32))


def _softmax_backward_applies(input: torch.Tensor, dim: int) -> bool:
    """The backward kernel takes rows of up to MAX_COLS (one pass); longer rows and empty
    inputs take the recompute backward."""
    return input.numel() > 0 and (input.dim() == 0 or input.shape[dim] <= MAX_COLS)


def _softmax(input: torch.Tensor, dim: int) -> torch.Tensor: ...


_softmax_op = define_op(_softmax, kernel_call=softmax_kernel_call, reference=references.softmax,
                        fake=lambda input, dim: torch.empty_like(input, memory_format=torch.contiguous_format),
                        grad_reference=lambda *a: references.softmax(*a, compute_dtype=torch.float32),
                        backward=KernelBackward(
                            lambda inputs, outputs, grads: (_softmax_backward_op(grads[0], outputs[0], inputs[1]),
                                                            None),
                            applies=_softmax_backward_applies, save_outputs=(0,)))


def softmax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax with the ``torch.softmax(input, dim)`` contract (no ``dtype`` argument).

    Any shape and row length: rows up to 8192 elements are done on chip in one pass, longer
    rows with an online pass (kept in SBUF up to 32K elements, fp32 on trn1 up to ~28K, streamed
    from HBM twice beyond); on trn2/trn3 long rows in few row tiles are cut into segments
    over the partitions instead of one row per partition, in groups of at most 32 rows
    taken in turn (smaller where a row length has no divisor near 4 segments): up to 32 rows in each half of the rows from about 1600 elements (1250 in
    fp32), 128 rows a half from about 5400 (4300 in fp32), in segments of at most 8192 (up
    to 1M elements for one row; e.g. sampling over a vocabulary at decode, or softmax over
    a vocabulary's logits at prefill). ``dim`` other than the last costs a transposing
    copy (the kernel works on the last dimension). dtypes: float32, bfloat16, float16; the
    result has ``input``'s dtype. Numerics of the kernel: statistics and exponentials in
    fp32, one rounding to the dtype (as the reference). Backward: NKI kernel
    (kernels/softmax_backward.py) from the output, for rows up to 8192; longer rows recompute
    with PyTorch ops.
    """
    _checks.check_float_tensor("input", input)
    return _softmax_op(input, _normalize_dim(input, dim))


def _workload(name, rows, cols, **kw):
    def make(gen):
        return (randn(gen, rows, cols, scale=4.0),), {"dim": -1}
    return registry.Workload(f"{name} [{rows}, {cols}]", make, **kw)


def _softmax_backward_inputs(gen, args, kwargs):
    """(dy, y = softmax(x), dim) from a forward workload."""
    (x,) = args
    y = torch.softmax(x.float(), kwargs["dim"]).to(x.dtype)
    return (randn(gen, *x.shape, dtype=x.dtype), y), dict(kwargs)


SOFTMAX_BACKWARD = registry.Backward(_softmax_backward_op, _softmax_backward_inputs, softmax_backward_kernel_call,
                                     backward_references.softmax_backward, roofline.softmax_backward,
                                     covers=lambda args, kwargs: _softmax_backward_applies(args[0], kwargs["dim"]))

registry.register(registry.OpSpec(
    "softmax", softmax, _softmax_op, softmax_kernel_call, references.softmax, roofline.softmax,
    workloads=(_workload("ViT-B/16 scores B=8 H=12", 8 * 12 * 197, 197, quick=True),
               _workload("LM vocab 256 rows", 256, 32000, large=True),
               _workload("Llama-3 sampling, decode batch 8", 8, 128256, inference_only=True)),
    backward=SOFTMAX_BACKWARD))

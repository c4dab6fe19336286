"""Softmax op: custom op, fake, autograd and public function (kernels/softmax.py)."""

from __future__ import annotations

from typing import Optional

import torch

from . import _checks, _dispatch, _kernel_sources, references
from ._ops import add_op_namespace_prefix

# Longest row done in one on-chip pass; longer rows use the online form, resident in SBUF
# up to RESIDENT_BYTES per partition, else streamed (kernels/limits.py, with the reasons).
MAX_COLS = _kernel_sources.limits().SOFTMAX_MAX_COLS
RESIDENT_BYTES = _kernel_sources.limits().SOFTMAX_RESIDENT_BYTES


def _normalize_dim(input: torch.Tensor, dim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    ndim = max(input.dim(), 1)
    if not -ndim <= dim < ndim:
        raise IndexError(f"dim={dim} is out of range for input with {input.dim()} dimension(s) "
                         f"(expected -{ndim} <= dim < {ndim})")
    return dim % ndim


def softmax_kernel_call(input: torch.Tensor, dim: int = -1, max_cols: Optional[int] = None,
                        resident_bytes: Optional[int] = None) -> _dispatch.KernelCall:
    """The NKI launch: kernels/softmax.py on ``input`` with ``dim`` moved last, viewed as [N, C].

    ``max_cols`` (default 8192) is the longest row done in one on-chip pass; longer rows use
    the online form in chunks of ``min(max_cols, 4096)``, keeping the row tile in SBUF when
    it takes at most ``resident_bytes`` (default 96 KiB) per partition, else streaming it
    twice from HBM. Tests lower both to exercise every form.
    """
    if max_cols is None:
        max_cols = MAX_COLS
    if not 1 <= max_cols <= MAX_COLS:
        raise ValueError(f"max_cols={max_cols} is outside [1, {MAX_COLS}]")
    if resident_bytes is None:
        resident_bytes = RESIDENT_BYTES
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
                                {"max_cols": int(max_cols), "resident_bytes": int(resident_bytes)},
                                finish=finish)


@torch.library.custom_op(add_op_namespace_prefix("softmax"), mutates_args=())
def _softmax(input: torch.Tensor, dim: int) -> torch.Tensor:
    if input.numel() == 0:
        return torch.empty_like(input)
    return _dispatch.run(
        lambda: softmax_kernel_call(input, dim),
        lambda: references.softmax(input, dim),
        input.device,
    )


@_softmax.register_fake
def _(input: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.empty_like(input)


def _softmax_setup_context(ctx, inputs, output):
    input, dim = inputs
    ctx.save_for_backward(output)
    ctx.dim = dim


def _softmax_backward(ctx, grad_output):
    # Backward with PyTorch ops from the saved output, in fp32: dx = y * (g - sum(g * y)).
    (output,) = ctx.saved_tensors
    y = output.float()
    g = grad_output.float()
    grad = y * (g - (g * y).sum(dim=ctx.dim, keepdim=True))
    return grad.to(output.dtype), None


_softmax.register_autograd(_softmax_backward, setup_context=_softmax_setup_context)


def softmax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax with the ``torch.softmax(input, dim)`` contract (no ``dtype`` argument).

    Any shape and row length: rows up to 8192 elements are done on chip in one pass, longer
    rows with an online pass (kept in SBUF up to 32K bf16 / 24K fp32 elements, streamed
    from HBM twice beyond). ``dim`` other than the last costs a transposing
    copy (the kernel works on the last dimension). dtypes: float32, bfloat16, float16; the
    result has ``input``'s dtype. Backward uses PyTorch ops on the saved output.
    """
    _checks.check_float_tensor("input", input)
    return _softmax(input, _normalize_dim(input, dim))

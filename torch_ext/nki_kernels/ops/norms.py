"""Normalisation ops: layer_norm, rms_norm, fused_add_rms_norm (kernels/layer_norm.py,
kernels/rms_norm.py).

Per op: its NKI launch (``<op>_kernel_call``), its custom op (``_custom_op.define_op``:
dispatch, fake, backward), the public function with the ``torch.nn.functional``
signature, and its registration (twin, eager model, workloads).

Backward: each op's backward is its backward custom op (``<op>_backward``: the NKI kernels
of kernels/rms_norm_backward.py and kernels/layer_norm_backward.py on ``neuron`` and the
simulator backend, ``backward_references.py`` on the reference backend) for normalised
sizes up to BACKWARD_MAX_HIDDEN; longer rows (and empty inputs) take the recompute
backward (PyTorch ops in fp32). layer_norm, when autograd will want its gradients, runs
the training forward (``layer_norm_train``: the kernel also returns each row's mean and
rstd, as native_layer_norm saves them), and its backward kernel reads those statistics
instead of recomputing them. The weight (and bias) gradients come from the kernel as
one fp32 partial per work part (kernels/weight_grads.py), summed here in fp32
(``_sum_partials``).
"""

from __future__ import annotations

import math
import operator
from typing import List, Optional, Sequence, Union

import torch

from .. import _checks, _dispatch, _kernel_sources, backward_references, references, registry, roofline
from .._custom_op import KernelBackward, define_op
from ._workloads import VIT_TOKENS, randn

__all__ = ["fused_add_rms_norm", "layer_norm", "rms_norm"]

# Largest normalised size the NKI kernels take, and the longest row they keep in SBUF (one
# pass over HBM; longer rows are streamed with two) (kernels/limits.py, with the reasons).
MAX_HIDDEN = _kernel_sources.limits().NORM_MAX_HIDDEN
ONE_PASS_MAX_HIDDEN = _kernel_sources.limits().NORM_ONE_PASS_MAX_HIDDEN
# A few rows (token generation) run the hidden-on-partitions kernels of
# kernels/norm_decode.py: up to DECODE_MAX_ROWS rows of an H that is a multiple of 128 with
# rows * H / 128 <= DECODE_MAX_ELEMENTS; the ops pick it where it is modeled faster than
# the row kernels (the DECODE_* choice constants, reasons in kernels/limits.py).
DECODE_MAX_ROWS = _kernel_sources.limits().NORM_DECODE_MAX_ROWS
DECODE_MAX_ELEMENTS = _kernel_sources.limits().NORM_DECODE_MAX_ELEMENTS
DECODE_MIN_HIDDEN = _kernel_sources.limits().NORM_DECODE_MIN_HIDDEN
DECODE_PICK_ROWS = _kernel_sources.limits().NORM_DECODE_PICK_ROWS
DECODE_WIDE_HIDDEN = _kernel_sources.limits().NORM_DECODE_WIDE_HIDDEN
DECODE_WIDE_PICK_ROWS = _kernel_sources.limits().NORM_DECODE_WIDE_PICK_ROWS

# Largest normalised size the backward kernels take, and their longest row in bytes (bf16
# up to 8192, fp32 up to 4096) (kernels/limits.py, with the reasons).
BACKWARD_MAX_HIDDEN = _kernel_sources.limits().NORM_BACKWARD_MAX_HIDDEN
BACKWARD_MAX_ROW_BYTES = _kernel_sources.limits().NORM_BACKWARD_MAX_ROW_BYTES

ShapeLike = Union[int, Sequence[int], torch.Size]


# ---------------------------------------------------------------------------- checks

def _as_shape(normalized_shape: ShapeLike) -> tuple[int, ...]:
    if isinstance(normalized_shape, int) and not isinstance(normalized_shape, bool):
        return (normalized_shape,)
    try:
        # operator.index, not int(): a float size (4.7) is refused, never truncated
        shape = tuple(operator.index(d) for d in normalized_shape if not isinstance(d, bool))
        if len(shape) != len(normalized_shape):
            raise TypeError
    except TypeError:
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
        ) from None
    if len(shape) == 0:
        raise ValueError("normalized_shape=() is empty; it must name at least the last dimension")
    return shape


def _check_normalized_shape(input: torch.Tensor, shape: tuple[int, ...]) -> None:
    trailing = tuple(input.shape[input.dim() - len(shape):]) if len(shape) <= input.dim() else None
    if trailing != shape:
        raise ValueError(
            f"normalized_shape={list(shape)} does not match the last {len(shape)} dimension(s) of "
            f"input with shape {list(input.shape)}"
        )


def _check_param(name: str, param: Optional[torch.Tensor], shape: tuple[int, ...], input: torch.Tensor,
                 shape_is: str = "normalized_shape") -> None:
    """``param`` (None, or a float tensor of exactly ``shape`` on input's device); ``shape_is``
    says where ``shape`` comes from, for the error."""
    if param is None:
        return
    _checks.check_float_tensor(name, param)
    if tuple(param.shape) != shape:
        raise ValueError(
            f"{name} has shape {list(param.shape)} but {shape_is} is {list(shape)}; "
            f"{name} must have exactly that shape"
        )
    _checks.check_same_device(input=input, **{name: param})


def _hidden(shape: Sequence[int]) -> int:
    size = 1
    for d in shape:
        size *= int(d)
    return size


def _check_hidden_for_kernel(hidden: int, what: str = "prod(normalized_shape)") -> None:
    if hidden > MAX_HIDDEN:
        raise ValueError(
            f"normalized size {hidden} ({what}) exceeds {MAX_HIDDEN}, the largest "
            "the NKI norm kernels take"
        )


def default_rms_eps(dtype: torch.dtype) -> float:
    """``F.rms_norm``'s eps for ``eps=None``: the machine epsilon of the computation (opmath)
    type, float32's for fp16/bf16/fp32 inputs (torch 2.13, ``torch.nn.RMSNorm`` docstring)."""
    return float(torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps)


def _resolve_eps(eps: Optional[float], dtype: torch.dtype) -> float:
    if eps is None:
        return default_rms_eps(dtype)
    eps = _checks.check_real("eps", eps)
    # a NaN or infinite eps turns every output into NaN or 0 (torch takes it silently); the
    # kernels add it in fp32, where a Python float past fp32's range is infinite too
    if not math.isfinite(eps) or eps < 0 or eps > _checks.FP32_MAX:
        raise ValueError(f"eps={eps} must be finite and >= 0 (in float32, where the kernels add it: "
                         f"at most {_checks.FP32_MAX:.6g})")
    return eps


def _rows_view(t: torch.Tensor, hidden: int) -> torch.Tensor:
    return t.reshape(-1, hidden)


def _stats_shape(input: torch.Tensor, normalized_shape: Sequence[int]) -> tuple[int, ...]:
    """Shape of layer_norm's saved statistics: input's row dims (all but the normalized ones)
    and (mean, rstd). Laid out by row dims, not as [N, 2], so a shard of the input along any
    row dim (a sequence-parallel Shard(1)) is the same shard of its statistics (sharding.py)."""
    return (*input.shape[:input.dim() - len(normalized_shape)], 2)


def _decode_shape(rows: int, hidden: int) -> bool:
    """Whether [rows, hidden] goes to kernels/norm_decode.py: a shape it takes (H a multiple
    of 128, DECODE_MAX_ROWS, DECODE_MAX_ELEMENTS) where it is modeled faster than the row
    kernels (DECODE_MIN_HIDDEN, DECODE_PICK_ROWS / DECODE_WIDE_PICK_ROWS)."""
    if hidden % 128 or hidden < DECODE_MIN_HIDDEN:
        return False
    pick_rows = DECODE_WIDE_PICK_ROWS if hidden >= DECODE_WIDE_HIDDEN else DECODE_PICK_ROWS
    return (rows <= min(pick_rows, DECODE_MAX_ROWS)
            and rows * (hidden // 128) <= DECODE_MAX_ELEMENTS)


# ---------------------------------------------------------------------------- backward helpers

def _sum_partials(partials: torch.Tensor, hidden: int, like: torch.Tensor) -> torch.Tensor:
    """The weight gradient from the kernel's [parts, 128, C] fp32 partials (column h at
    [part, h % 128, h // 128], kernels/weight_grads.py): the parts summed in fp32 in a
    fixed order (the same sum at LNC=1 and LNC=2), then rounded once to ``like``'s dtype
    and shape. A [parts, H] sum: cheaper here than a second kernel launch."""
    total = partials[0]
    for part in partials[1:]:
        total = total + part
    return total.t().reshape(-1)[:hidden].to(like.dtype).reshape(like.shape)


def _check_backward_hidden(hidden: int, dtype: torch.dtype) -> None:
    if hidden > BACKWARD_MAX_HIDDEN:
        raise ValueError(f"normalized size {hidden} exceeds {BACKWARD_MAX_HIDDEN}, the largest the NKI norm "
                         "backward kernels take (longer rows use the recompute backward)")
    row_bytes = hidden * dtype.itemsize
    if row_bytes > BACKWARD_MAX_ROW_BYTES:
        raise ValueError(f"a row of normalized size {hidden} in {dtype} takes {row_bytes} bytes, more than "
                         f"{BACKWARD_MAX_ROW_BYTES}, the longest row the NKI norm backward kernels take "
                         "(longer rows use the recompute backward)")


def _param_grad_fake(input: torch.Tensor, param: Optional[torch.Tensor]) -> torch.Tensor:
    return backward_references.empty_grad(input) if param is None else torch.empty_like(param)


def _kernel_backward_applies(input: torch.Tensor, hidden: int) -> bool:
    """Whether a norm's backward runs its backward op: rows within the kernels' limits, and
    at least one element (an empty input's weight gradient is zeros: the recompute
    backward gives them)."""
    return (hidden <= BACKWARD_MAX_HIDDEN and hidden * input.dtype.itemsize <= BACKWARD_MAX_ROW_BYTES
            and input.numel() > 0)


# ---------------------------------------------------------------------------- layer_norm

def layer_norm_kernel_call(input: torch.Tensor, normalized_shape: Sequence[int],
                           weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                           eps: float = 1e-5) -> _dispatch.KernelCall:
    """The NKI launch: kernels/layer_norm.py on ``input`` viewed as [N, prod(normalized_shape)]
    (kernels/norm_decode.py for a few rows, see DECODE_MAX_ROWS)."""
    hidden = _hidden(normalized_shape)
    _check_hidden_for_kernel(hidden)
    tensors = [_rows_view(input, hidden)]
    if weight is None and bias is not None:
        weight = torch.ones(tuple(normalized_shape), dtype=bias.dtype, device=bias.device)
    if weight is not None:
        tensors.append(weight.reshape(hidden))
    if bias is not None:
        tensors.append(bias.reshape(hidden))
    shape = input.shape
    kernel = ("norm_decode", "layer_norm_decode_kernel") if _decode_shape(tensors[0].shape[0], hidden) \
        else ("layer_norm", "layer_norm_kernel")
    return _dispatch.KernelCall(*kernel, tuple(tensors), {"eps": float(eps)}, finish=lambda out: out.reshape(shape))


def _layer_norm(input: torch.Tensor, normalized_shape: List[int], weight: Optional[torch.Tensor],
                bias: Optional[torch.Tensor], eps: float) -> torch.Tensor: ...


def layer_norm_train_kernel_call(input: torch.Tensor, normalized_shape: Sequence[int],
                                 weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                                 eps: float = 1e-5) -> _dispatch.KernelCall:
    """The NKI launch of the training forward: kernels/layer_norm.py with ``save_stats``
    (the row kernel at every row count: the decode kernel saves no statistics), returning
    (output, stats [*row dims, 2] fp32: mean and rstd per row, ``_stats_shape``)."""
    hidden = _hidden(normalized_shape)
    _check_backward_hidden(hidden, input.dtype)
    call = layer_norm_kernel_call(input, normalized_shape, weight, bias, eps)
    shape, stats_shape = input.shape, _stats_shape(input, normalized_shape)
    return _dispatch.KernelCall("layer_norm", "layer_norm_kernel", call.tensors, {**call.static, "save_stats": True},
                                finish=lambda outs: (outs[0].reshape(shape), outs[1].reshape(stats_shape)))


def _layer_norm_stats_fake(input: torch.Tensor, normalized_shape: Sequence[int]) -> torch.Tensor:
    return input.new_empty(_stats_shape(input, normalized_shape), dtype=torch.float32)


def _layer_norm_train_reference(input, normalized_shape, weight, bias, eps, compute_dtype=None):
    return (references.layer_norm(input, normalized_shape, weight, bias, eps, compute_dtype=compute_dtype),
            references.layer_norm_stats(input, normalized_shape, eps, compute_dtype=compute_dtype))


def _layer_norm_train(input: torch.Tensor, normalized_shape: List[int], weight: Optional[torch.Tensor],
                      bias: Optional[torch.Tensor], eps: float) -> tuple[torch.Tensor, torch.Tensor]: ...


def _check_stats(stats: torch.Tensor, input: torch.Tensor, normalized_shape: Sequence[int]) -> None:
    expected = _stats_shape(input, normalized_shape)
    if tuple(stats.shape) != expected or stats.dtype != torch.float32:
        raise ValueError(f"stats: shape {tuple(stats.shape)} {stats.dtype}; expected {expected} torch.float32, "
                         "the (mean, rstd) per row the training forward (layer_norm_train) saves")


def layer_norm_backward_kernel_call(grad_output: torch.Tensor, input: torch.Tensor, stats: torch.Tensor,
                                    normalized_shape: Sequence[int], weight: Optional[torch.Tensor] = None,
                                    bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> _dispatch.KernelCall:
    """The NKI launch of layer_norm's backward: kernels/layer_norm_backward.py on [N, H] views,
    with the forward's saved statistics (``eps`` is in them; the reference uses it)."""
    hidden = _hidden(normalized_shape)
    _check_backward_hidden(hidden, input.dtype)
    tensors = [_rows_view(grad_output, hidden), _rows_view(input, hidden)]
    _check_stats(stats, input, normalized_shape)
    tensors.append(stats.reshape(-1, 2).contiguous())          # the kernel reads [N, 2]
    if weight is not None:
        tensors.append(weight.reshape(hidden))
    shape = input.shape

    def finish(outs):
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        dx = outs.pop(0).reshape(shape)
        dw = _sum_partials(outs.pop(0), hidden, weight) if weight is not None else backward_references.empty_grad(input)
        db = _sum_partials(outs.pop(0), hidden, bias) if bias is not None else backward_references.empty_grad(input)
        return dx, dw, db

    return _dispatch.KernelCall("layer_norm_backward", "layer_norm_backward_kernel", tuple(tensors),
                                {"with_bias": bias is not None}, finish=finish)


def _layer_norm_backward(grad_output: torch.Tensor, input: torch.Tensor, stats: torch.Tensor,
                         normalized_shape: List[int], weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                         eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def _layer_norm_backward_reference(grad_output, input, stats, normalized_shape, weight, bias, eps,
                                   compute_dtype=None):
    """The reference backend's backward: the statistics recomputed from ``input`` (PyTorch
    math; ``stats`` is checked, not read), so it is also differentiable (double backward)."""
    _check_stats(stats, input, normalized_shape)
    return backward_references.layer_norm_backward(grad_output, input, normalized_shape, weight, bias, eps,
                                                   compute_dtype=compute_dtype)


_layer_norm_backward_op = define_op(
    _layer_norm_backward, kernel_call=layer_norm_backward_kernel_call,
    reference=_layer_norm_backward_reference,
    fake=lambda dy, input, stats, shape, weight, bias, eps: (
        torch.empty_like(input), _param_grad_fake(input, weight), _param_grad_fake(input, bias)),
    grad_reference=lambda *a: _layer_norm_backward_reference(*a, compute_dtype=torch.float32))


def _layer_norm_grads(inputs, outputs, grad_outputs):
    """Autograd formula of the training forward: the backward op on (dy, input, the saved
    stats); no gradient for the statistics output (they are not differentiated through)."""
    input, normalized_shape, weight, bias, eps = inputs
    grad_output = grad_outputs[0] if grad_outputs[0] is not None else torch.zeros_like(input)
    dx, dw, db = _layer_norm_backward_op(grad_output, input, outputs[1], normalized_shape, weight, bias, eps)
    return dx, None, dw if weight is not None else None, db if bias is not None else None, None


# Inference (no gradient wanted, or rows past the backward kernel's limits): no statistics
# saved; a gradient asked of this op directly takes the recompute backward.
_layer_norm_op = define_op(
    _layer_norm, kernel_call=layer_norm_kernel_call, reference=references.layer_norm,
    fake=lambda input, *_: torch.empty_like(input, memory_format=torch.contiguous_format),  # as F.*_norm
    grad_reference=lambda *a: references.layer_norm(*a, compute_dtype=torch.float32))

# Training: the output and each row's (mean, rstd), which the backward kernel reads.
_layer_norm_train_op = define_op(
    _layer_norm_train, kernel_call=layer_norm_train_kernel_call, reference=_layer_norm_train_reference,
    fake=lambda input, shape, *_: (torch.empty_like(input, memory_format=torch.contiguous_format),
                                   _layer_norm_stats_fake(input, shape)),
    grad_reference=lambda *a: _layer_norm_train_reference(*a, compute_dtype=torch.float32),
    backward=KernelBackward(
        _layer_norm_grads, save_outputs=(1,),
        applies=lambda input, shape, weight, bias, eps: _kernel_backward_applies(input, _hidden(shape))))


def _wants_grads(*tensors: Optional[torch.Tensor]) -> bool:
    """Autograd will ask for a gradient of one of ``tensors``."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def layer_norm(input: torch.Tensor, normalized_shape: ShapeLike, weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm with the ``torch.nn.functional.layer_norm`` contract.

    Normalises over ``normalized_shape`` (the last dimensions of ``input``); weight and bias,
    if given, have exactly that shape and any float dtype; the result has ``input``'s shape
    and dtype. dtypes: float32, bfloat16, float16. The NKI kernel takes
    prod(normalized_shape) <= 65536 (rows longer than 8192 stream through SBUF: two passes
    over HBM). Numerics of the kernel: statistics in fp32; fp32 input and streamed rows
    round once to the output dtype, as the reference; 16-bit rows of <= 8192 with a weight
    or bias round three times (y, y * weight, y * weight + bias, each to the input dtype),
    so an element is off by up to u * (2 |y * weight| + |out|) instead of u * |out|, u the
    dtype's unit roundoff (2**-8 bf16, 2**-11 fp16; measured ||err|| / ||ref|| in bf16:
    2.5e-3 against 1.7e-3 for one rounding). Backward: NKI kernel
    (kernels/layer_norm_backward.py) for prod(normalized_shape) <= 8192, else PyTorch ops
    in fp32.
    """
    _checks.check_float_tensor("input", input)
    shape = _as_shape(normalized_shape)
    _check_normalized_shape(input, shape)
    _check_param("weight", weight, shape, input)
    _check_param("bias", bias, shape, input)
    if eps is None:   # F.layer_norm has no default for None either (rms_norm's None is torch's)
        raise TypeError("eps=None: layer_norm needs a float eps, as F.layer_norm does")
    eps = _resolve_eps(eps, input.dtype)
    if _wants_grads(input, weight, bias) and _kernel_backward_applies(input, _hidden(shape)):
        return _layer_norm_train_op(input, list(shape), weight, bias, eps)[0]
    return _layer_norm_op(input, list(shape), weight, bias, eps)


# ---------------------------------------------------------------------------- rms_norm

def rms_norm_kernel_call(input: torch.Tensor, normalized_shape: Sequence[int],
                         weight: Optional[torch.Tensor] = None, eps: Optional[float] = None) -> _dispatch.KernelCall:
    """The NKI launch: kernels/rms_norm.py on ``input`` viewed as [N, prod(normalized_shape)]
    (kernels/norm_decode.py for a few rows, see DECODE_MAX_ROWS)."""
    hidden = _hidden(normalized_shape)
    _check_hidden_for_kernel(hidden)
    tensors = [_rows_view(input, hidden)]
    if weight is not None:
        tensors.append(weight.reshape(hidden))
    shape = input.shape
    kernel = ("norm_decode", "rms_norm_decode_kernel") if _decode_shape(tensors[0].shape[0], hidden) \
        else ("rms_norm", "rms_norm_kernel")
    return _dispatch.KernelCall(*kernel, tuple(tensors), {"eps": _resolve_eps(eps, input.dtype)},
                                finish=lambda out: out.reshape(shape))


def _dx_and_dweight(like: torch.Tensor, weight: Optional[torch.Tensor], hidden: int):
    """The ``finish`` of an RMSNorm backward launch: dx in ``like``'s shape and dweight
    summed from the kernel's per-part partials (an empty gradient without a weight)."""
    shape = like.shape

    def finish(outs):
        if weight is None:
            return outs.reshape(shape), backward_references.empty_grad(like)
        return outs[0].reshape(shape), _sum_partials(outs[1], hidden, weight)

    return finish


def rms_norm_backward_kernel_call(grad_output: torch.Tensor, input: torch.Tensor, normalized_shape: Sequence[int],
                                  weight: Optional[torch.Tensor] = None,
                                  eps: Optional[float] = None) -> _dispatch.KernelCall:
    """The NKI launch of rms_norm's backward: kernels/rms_norm_backward.py on [N, H] views."""
    hidden = _hidden(normalized_shape)
    _check_backward_hidden(hidden, input.dtype)
    tensors = [_rows_view(grad_output, hidden), _rows_view(input, hidden)]
    if weight is not None:
        tensors.append(weight.reshape(hidden))
    return _dispatch.KernelCall("rms_norm_backward", "rms_norm_backward_kernel", tuple(tensors),
                                {"eps": _resolve_eps(eps, input.dtype)},
                                finish=_dx_and_dweight(input, weight, hidden))


def _rms_norm_backward(grad_output: torch.Tensor, input: torch.Tensor, normalized_shape: List[int],
                       weight: Optional[torch.Tensor], eps: float) -> tuple[torch.Tensor, torch.Tensor]: ...


_rms_norm_backward_op = define_op(
    _rms_norm_backward, kernel_call=rms_norm_backward_kernel_call, reference=backward_references.rms_norm_backward,
    fake=lambda dy, input, shape, weight, eps: (torch.empty_like(input), _param_grad_fake(input, weight)),
    grad_reference=lambda *a: backward_references.rms_norm_backward(*a, compute_dtype=torch.float32))


def _rms_norm_grads(inputs, outputs, grad_outputs):
    input, normalized_shape, weight, eps = inputs
    dx, dw = _rms_norm_backward_op(grad_outputs[0], input, normalized_shape, weight, eps)
    return dx, None, dw if weight is not None else None, None


def _rms_norm(input: torch.Tensor, normalized_shape: List[int], weight: Optional[torch.Tensor],
              eps: float) -> torch.Tensor: ...


_rms_norm_op = define_op(
    _rms_norm, kernel_call=rms_norm_kernel_call, reference=references.rms_norm,
    fake=lambda input, *_: torch.empty_like(input, memory_format=torch.contiguous_format),  # as F.*_norm
    grad_reference=lambda *a: references.rms_norm(*a, compute_dtype=torch.float32),
    backward=KernelBackward(
        _rms_norm_grads,
        applies=lambda input, shape, weight, eps: _kernel_backward_applies(input, _hidden(shape))))


def rms_norm(input: torch.Tensor, normalized_shape: ShapeLike, weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None) -> torch.Tensor:
    """RMSNorm with the ``torch.nn.functional.rms_norm`` contract.

    ``x * rsqrt(mean(x**2 over normalized_shape) + eps) * weight``; ``eps=None`` uses
    float32's machine epsilon (the opmath type's) as torch does. weight (optional) has exactly
    ``normalized_shape`` and any float dtype; the result has ``input``'s shape and dtype.
    The NKI kernel takes prod(normalized_shape) <= 65536 (rows longer than 8192 stream
    through SBUF: two passes over HBM); statistics and products in fp32, one rounding.
    Backward: NKI kernel (kernels/rms_norm_backward.py) for prod(normalized_shape) <= 8192,
    else PyTorch ops in fp32.
    """
    _checks.check_float_tensor("input", input)
    shape = _as_shape(normalized_shape)
    _check_normalized_shape(input, shape)
    _check_param("weight", weight, shape, input)
    return _rms_norm_op(input, list(shape), weight, _resolve_eps(eps, input.dtype))


# ---------------------------------------------------------------------------- fused_add_rms_norm

def fused_add_rms_norm_kernel_call(input: torch.Tensor, residual: torch.Tensor,
                                   weight: Optional[torch.Tensor], eps: Optional[float]) -> _dispatch.KernelCall:
    """The NKI launch: kernels/rms_norm.py::fused_add_rms_norm_kernel on [N, H] views."""
    hidden = input.shape[-1]
    _check_hidden_for_kernel(hidden, "input.shape[-1]")
    tensors = [_rows_view(input, hidden), _rows_view(residual, hidden)]
    if weight is not None:
        tensors.append(weight.reshape(hidden))
    shape = input.shape
    return _dispatch.KernelCall("rms_norm", "fused_add_rms_norm_kernel", tuple(tensors),
                                {"eps": _resolve_eps(eps, input.dtype)},
                                finish=lambda outs: (outs[0].reshape(shape), outs[1].reshape(shape)))


def _fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor],
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]: ...


def fused_add_rms_norm_backward_kernel_call(grad_output: torch.Tensor, grad_total: torch.Tensor,
                                            total: torch.Tensor, weight: Optional[torch.Tensor],
                                            eps: Optional[float]) -> _dispatch.KernelCall:
    """The NKI launch of fused_add_rms_norm's backward (kernels/rms_norm_backward.py)."""
    hidden = total.shape[-1]
    _check_backward_hidden(hidden, total.dtype)
    tensors = [_rows_view(grad_output, hidden), _rows_view(grad_total, hidden), _rows_view(total, hidden)]
    if weight is not None:
        tensors.append(weight.reshape(hidden))
    return _dispatch.KernelCall("rms_norm_backward", "fused_add_rms_norm_backward_kernel", tuple(tensors),
                                {"eps": _resolve_eps(eps, total.dtype)},
                                finish=_dx_and_dweight(total, weight, hidden))


def _fused_add_rms_norm_backward(grad_output: torch.Tensor, grad_total: torch.Tensor, total: torch.Tensor,
                                 weight: Optional[torch.Tensor], eps: float) -> tuple[torch.Tensor, torch.Tensor]: ...


_fused_add_rms_norm_backward_op = define_op(
    _fused_add_rms_norm_backward, kernel_call=fused_add_rms_norm_backward_kernel_call,
    reference=backward_references.fused_add_rms_norm_backward,
    fake=lambda dy, dt, total, weight, eps: (torch.empty_like(total), _param_grad_fake(total, weight)),
    grad_reference=lambda *a: backward_references.fused_add_rms_norm_backward(*a, compute_dtype=torch.float32))


def _fused_add_rms_norm_grads(inputs, outputs, grad_outputs):
    input, residual, weight, eps = inputs
    total = outputs[1]
    dy, dt = (torch.zeros_like(total) if g is None else g for g in grad_outputs)
    d, dw = _fused_add_rms_norm_backward_op(dy, dt, total, weight, eps)
    return d, d, dw if weight is not None else None, None


_fused_add_rms_norm_op = define_op(
    _fused_add_rms_norm, kernel_call=fused_add_rms_norm_kernel_call, reference=references.fused_add_rms_norm,
    fake=lambda input, *_: (torch.empty_like(input, memory_format=torch.contiguous_format),
                            torch.empty_like(input, memory_format=torch.contiguous_format)),
    grad_reference=lambda *a: references.fused_add_rms_norm(*a, compute_dtype=torch.float32),
    backward=KernelBackward(
        _fused_add_rms_norm_grads, save_outputs=(1,),
        applies=lambda input, residual, weight, eps: _kernel_backward_applies(input, input.shape[-1])))


def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor],
                       eps: Optional[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(input + residual, weight, eps), input + residual)`` in one pass over HBM.

    input and residual: same shape and dtype, normalised over the last dimension; weight:
    [H] of any float dtype, or None; ``eps=None`` uses float32's machine epsilon, as ``rms_norm``.
    The sum is rounded to ``input.dtype`` and normalised from that rounded value (what an
    eager ``add`` followed by ``rms_norm`` computes). The NKI kernel takes H <= 65536 (rows
    longer than 8192 stream through SBUF: the inputs are read twice). Backward: NKI kernel
    (kernels/rms_norm_backward.py) for H <= 8192, else PyTorch ops in fp32; the gradients
    of ``input`` and ``residual`` are one tensor.
    """
    _checks.check_float_tensor("input", input)
    _checks.check_float_tensor("residual", residual)
    if input.dim() == 0:
        raise ValueError("input is 0-dimensional; fused_add_rms_norm normalises the last dimension")
    if residual.shape != input.shape:
        raise ValueError(
            f"residual has shape {list(residual.shape)} but input has {list(input.shape)}; they must match"
        )
    _checks.check_same_dtype(input=input, residual=residual)
    _checks.check_same_device(input=input, residual=residual)
    _check_param("weight", weight, (input.shape[-1],), input, "[input.shape[-1]]")
    return _fused_add_rms_norm_op(input, residual, weight, _resolve_eps(eps, input.dtype))


# ---------------------------------------------------------------------------- registration

def _layer_norm_workload(name, rows, hidden, eps, **kw):
    def make(gen):
        return (randn(gen, rows, hidden), (hidden,), randn(gen, hidden), randn(gen, hidden)), {"eps": eps}
    return registry.Workload(f"{name} [{rows}, {hidden}]", make, **kw)


def _rms_norm_workload(name, rows, hidden, **kw):
    def make(gen):
        return (randn(gen, rows, hidden), (hidden,), randn(gen, hidden)), {"eps": 1e-6}
    return registry.Workload(f"{name} [{rows}, {hidden}]", make, **kw)


def _fused_add_workload(name, rows, hidden, **kw):
    def make(gen):
        return (randn(gen, rows, hidden), randn(gen, rows, hidden), randn(gen, hidden)), {"eps": 1e-6}
    return registry.Workload(f"{name} [{rows}, {hidden}]", make, **kw)


def _grad_like(gen, t):
    """A fresh random output gradient shaped and typed like ``t``."""
    return randn(gen, *t.shape, dtype=t.dtype)


def _norm_backward_inputs(gen, args, kwargs):
    """Backward op arguments of rms_norm: (dy, *forward args)."""
    return (_grad_like(gen, args[0]), *args), dict(kwargs)


def _layer_norm_backward_inputs(gen, args, kwargs):
    """Backward op arguments of layer_norm: (dy, input, the training forward's saved stats,
    *the other forward args)."""
    input, shape, *rest = args
    stats = references.layer_norm_stats(input, shape, kwargs["eps"])
    return (_grad_like(gen, input), input, stats, shape, *rest), dict(kwargs)


def _fused_add_backward_inputs(gen, args, kwargs):
    """(d normed, d total, total, weight): the saved total is input + residual rounded."""
    x, residual, weight = args
    total = (x.float() + residual.float()).to(x.dtype)
    return (_grad_like(gen, x), _grad_like(gen, x), total, weight), dict(kwargs)


# issue 15: the norm backwards are memory-bound; at the main job's shapes they must reach
# this efficiency (modeled, trn2, LNC=2)
NORM_BACKWARD_EFFICIENCY_TARGET = 0.7
LAYER_NORM_BACKWARD = registry.Backward(
    _layer_norm_backward_op, _layer_norm_backward_inputs, layer_norm_backward_kernel_call,
    _layer_norm_backward_reference, roofline.layer_norm_backward,
    efficiency_target=NORM_BACKWARD_EFFICIENCY_TARGET)
RMS_NORM_BACKWARD = registry.Backward(
    _rms_norm_backward_op, _norm_backward_inputs, rms_norm_backward_kernel_call,
    backward_references.rms_norm_backward, roofline.rms_norm_backward,
    efficiency_target=NORM_BACKWARD_EFFICIENCY_TARGET)
FUSED_ADD_RMS_NORM_BACKWARD = registry.Backward(
    _fused_add_rms_norm_backward_op, _fused_add_backward_inputs, fused_add_rms_norm_backward_kernel_call,
    backward_references.fused_add_rms_norm_backward, roofline.fused_add_rms_norm_backward,
    efficiency_target=NORM_BACKWARD_EFFICIENCY_TARGET)

registry.register(registry.OpSpec(
    "layer_norm", layer_norm, _layer_norm_op, layer_norm_kernel_call, references.layer_norm,
    roofline.layer_norm,
    workloads=(_layer_norm_workload("ViT-B/16 B=8", VIT_TOKENS, 768, 1e-12, quick=True),
               _layer_norm_workload("ViT-L/16 B=8", VIT_TOKENS, 1024, 1e-12, large=True)),
    layers=("LayerNorm",), backward=LAYER_NORM_BACKWARD))
registry.register(registry.OpSpec(
    "rms_norm", rms_norm, _rms_norm_op, rms_norm_kernel_call, references.rms_norm, roofline.rms_norm,
    workloads=(_rms_norm_workload("Llama-7B 2048 tok", 2048, 4096, quick=True, large=True),
               _rms_norm_workload("Llama-70B 2048 tok", 2048, 8192, large=True)),
    layers=("RMSNorm",), backward=RMS_NORM_BACKWARD))
registry.register(registry.OpSpec(
    "fused_add_rms_norm", fused_add_rms_norm, _fused_add_rms_norm_op, fused_add_rms_norm_kernel_call,
    references.fused_add_rms_norm, roofline.fused_add_rms_norm,
    workloads=(_fused_add_workload("Llama-7B 2048 tok", 2048, 4096, quick=True, large=True),),
    backward=FUSED_ADD_RMS_NORM_BACKWARD))

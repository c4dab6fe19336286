"""Normalisation ops: layer_norm, rms_norm, fused_add_rms_norm.

Each op: a ``<op>_kernel_call`` describing the NKI launch (kernels/layer_norm.py,
kernels/rms_norm.py), a typed ``custom_op`` with its ``register_fake`` right below, a
``register_autograd`` whose backward recomputes with PyTorch ops in fp32 (no NKI backward
kernel yet), and the public function with the ``torch.nn.functional`` signature.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from . import _checks, _dispatch, _kernel_sources, references
from ._ops import add_op_namespace_prefix

# Largest normalised size the NKI kernels take (kernels/limits.py, where the reason is).
MAX_HIDDEN = _kernel_sources.limits().NORM_MAX_HIDDEN

ShapeLike = Union[int, Sequence[int], torch.Size]


# ---------------------------------------------------------------------------- checks

def _as_shape(normalized_shape: ShapeLike) -> tuple[int, ...]:
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    try:
        shape = tuple(int(d) for d in normalized_shape)
    except TypeError:
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {type(normalized_shape).__name__}"
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


def _check_param(name: str, param: Optional[torch.Tensor], shape: tuple[int, ...], input: torch.Tensor) -> None:
    if param is None:
        return
    _checks.check_float_tensor(name, param)
    if tuple(param.shape) != shape:
        raise ValueError(
            f"{name} has shape {list(param.shape)} but normalized_shape is {list(shape)}; "
            f"{name} must have exactly normalized_shape"
        )
    _checks.check_same_device(input=input, **{name: param})


def _hidden(shape: Sequence[int]) -> int:
    size = 1
    for d in shape:
        size *= int(d)
    return size


def _check_hidden_for_kernel(hidden: int) -> None:
    if hidden > MAX_HIDDEN:
        raise ValueError(
            f"normalized size {hidden} (prod(normalized_shape)) exceeds {MAX_HIDDEN}, the largest "
            "row the NKI norm kernels hold in SBUF"
        )


def _resolve_eps(eps: Optional[float], dtype: torch.dtype) -> float:
    if eps is None:
        return float(torch.finfo(dtype).eps)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if eps < 0:
        raise ValueError(f"eps={eps} is negative; it must be >= 0")
    return float(eps)


# ---------------------------------------------------------------------------- layer_norm

def layer_norm_kernel_call(input: torch.Tensor, normalized_shape: Sequence[int],
                           weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                           eps: float = 1e-5) -> _dispatch.KernelCall:
    """The NKI launch: kernels/layer_norm.py on ``input`` viewed as [N, prod(normalized_shape)]."""
    hidden = _hidden(normalized_shape)
    _check_hidden_for_kernel(hidden)
    tensors = [input.reshape(-1, hidden)]
    if weight is None and bias is not None:
        weight = torch.ones(normalized_shape, dtype=bias.dtype, device=bias.device)
    if weight is not None:
        tensors.append(weight.reshape(hidden))
    if bias is not None:
        tensors.append(bias.reshape(hidden))
    shape = input.shape
    return _dispatch.KernelCall("layer_norm", "layer_norm_kernel", tuple(tensors), {"eps": float(eps)},
                                finish=lambda out: out.reshape(shape))


@torch.library.custom_op(add_op_namespace_prefix("layer_norm"), mutates_args=())
def _layer_norm(input: torch.Tensor, normalized_shape: List[int], weight: Optional[torch.Tensor],
                bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    if input.numel() == 0:
        return torch.empty_like(input)
    return _dispatch.run(
        lambda: layer_norm_kernel_call(input, normalized_shape, weight, bias, eps),
        lambda: references.layer_norm(input, normalized_shape, weight, bias, eps),
        input.device,
    )


@_layer_norm.register_fake
def _(input, normalized_shape, weight, bias, eps):
    return torch.empty_like(input)


def _layer_norm_setup_context(ctx, inputs, output):
    input, normalized_shape, weight, bias, eps = inputs
    ctx.save_for_backward(input, weight, bias)
    ctx.normalized_shape = list(normalized_shape)
    ctx.eps = eps


def _layer_norm_backward(ctx, grad_output):
    # Backward recomputes with PyTorch ops in fp32 (no NKI backward kernel yet).
    input, weight, bias = ctx.saved_tensors
    leaves = _fp32_leaves(ctx, (input, None, weight, bias))
    with torch.enable_grad():
        out = F.layer_norm(leaves[0], ctx.normalized_shape, leaves[2], leaves[3], ctx.eps)
    grads = _grads(out, leaves, grad_output, (input, None, weight, bias))
    return grads[0], None, grads[2], grads[3], None


_layer_norm.register_autograd(_layer_norm_backward, setup_context=_layer_norm_setup_context)


def layer_norm(input: torch.Tensor, normalized_shape: ShapeLike, weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm with the ``torch.nn.functional.layer_norm`` contract.

    Normalises over ``normalized_shape`` (the last dimensions of ``input``); weight and bias,
    if given, have exactly that shape and any float dtype; the result has ``input``'s shape
    and dtype. dtypes: float32, bfloat16, float16. The NKI kernel takes
    prod(normalized_shape) <= 8192. Backward recomputes with PyTorch ops (fp32).
    """
    _checks.check_float_tensor("input", input)
    shape = _as_shape(normalized_shape)
    _check_normalized_shape(input, shape)
    _check_param("weight", weight, shape, input)
    _check_param("bias", bias, shape, input)
    return _layer_norm(input, list(shape), weight, bias, _resolve_eps(eps, input.dtype))


# ---------------------------------------------------------------------------- rms_norm

def rms_norm_kernel_call(input: torch.Tensor, normalized_shape: Sequence[int],
                         weight: Optional[torch.Tensor] = None, eps: float = 1e-6) -> _dispatch.KernelCall:
    """The NKI launch: kernels/rms_norm.py on ``input`` viewed as [N, prod(normalized_shape)]."""
    hidden = _hidden(normalized_shape)
    _check_hidden_for_kernel(hidden)
    tensors = [input.reshape(-1, hidden)]
    if weight is not None:
        tensors.append(weight.reshape(hidden))
    shape = input.shape
    return _dispatch.KernelCall("rms_norm", "rms_norm_kernel", tuple(tensors), {"eps": float(eps)},
                                finish=lambda out: out.reshape(shape))


@torch.library.custom_op(add_op_namespace_prefix("rms_norm"), mutates_args=())
def _rms_norm(input: torch.Tensor, normalized_shape: List[int], weight: Optional[torch.Tensor],
              eps: float) -> torch.Tensor:
    if input.numel() == 0:
        return torch.empty_like(input)
    return _dispatch.run(
        lambda: rms_norm_kernel_call(input, normalized_shape, weight, eps),
        lambda: references.rms_norm(input, normalized_shape, weight, eps),
        input.device,
    )


@_rms_norm.register_fake
def _(input, normalized_shape, weight, eps):
    return torch.empty_like(input)


def _rms_norm_setup_context(ctx, inputs, output):
    input, normalized_shape, weight, eps = inputs
    ctx.save_for_backward(input, weight)
    ctx.normalized_shape = list(normalized_shape)
    ctx.eps = eps


def _rms_norm_backward(ctx, grad_output):
    # Backward recomputes with PyTorch ops in fp32 (no NKI backward kernel yet).
    input, weight = ctx.saved_tensors
    leaves = _fp32_leaves(ctx, (input, None, weight))
    with torch.enable_grad():
        out = F.rms_norm(leaves[0], ctx.normalized_shape, leaves[2], ctx.eps)
    grads = _grads(out, leaves, grad_output, (input, None, weight))
    return grads[0], None, grads[2], None


_rms_norm.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup_context)


def rms_norm(input: torch.Tensor, normalized_shape: ShapeLike, weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None) -> torch.Tensor:
    """RMSNorm with the ``torch.nn.functional.rms_norm`` contract.

    ``x * rsqrt(mean(x**2 over normalized_shape) + eps) * weight``; ``eps=None`` uses
    ``torch.finfo(input.dtype).eps`` as torch does. weight (optional) has exactly
    ``normalized_shape`` and any float dtype; the result has ``input``'s shape and dtype.
    The NKI kernel takes prod(normalized_shape) <= 8192. Backward recomputes with PyTorch ops.
    """
    _checks.check_float_tensor("input", input)
    shape = _as_shape(normalized_shape)
    _check_normalized_shape(input, shape)
    _check_param("weight", weight, shape, input)
    return _rms_norm(input, list(shape), weight, _resolve_eps(eps, input.dtype))


# ---------------------------------------------------------------------------- fused_add_rms_norm

def fused_add_rms_norm_kernel_call(input: torch.Tensor, residual: torch.Tensor,
                                   weight: Optional[torch.Tensor], eps: float) -> _dispatch.KernelCall:
    """The NKI launch: kernels/rms_norm.py::fused_add_rms_norm_kernel on [N, H] views."""
    hidden = input.shape[-1]
    _check_hidden_for_kernel(hidden)
    tensors = [input.reshape(-1, hidden), residual.reshape(-1, hidden)]
    if weight is not None:
        tensors.append(weight.reshape(hidden))
    shape = input.shape
    return _dispatch.KernelCall("rms_norm", "fused_add_rms_norm_kernel", tuple(tensors), {"eps": float(eps)},
                                finish=lambda outs: (outs[0].reshape(shape), outs[1].reshape(shape)))


@torch.library.custom_op(add_op_namespace_prefix("fused_add_rms_norm"), mutates_args=())
def _fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor],
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if input.numel() == 0:
        return torch.empty_like(input), torch.empty_like(input)
    return _dispatch.run(
        lambda: fused_add_rms_norm_kernel_call(input, residual, weight, eps),
        lambda: references.fused_add_rms_norm(input, residual, weight, eps),
        input.device,
    )


@_fused_add_rms_norm.register_fake
def _(input, residual, weight, eps):
    return torch.empty_like(input), torch.empty_like(input)


def _fused_add_rms_norm_setup_context(ctx, inputs, output):
    input, residual, weight, eps = inputs
    ctx.save_for_backward(input, residual, weight)
    ctx.eps = eps


def _fused_add_rms_norm_backward(ctx, grad_normed, grad_total):
    # Backward recomputes with PyTorch ops in fp32 (no NKI backward kernel yet).
    input, residual, weight = ctx.saved_tensors
    leaves = _fp32_leaves(ctx, (input, residual, weight))
    with torch.enable_grad():
        total = leaves[0] + leaves[1]
        normed = F.rms_norm(total, [total.shape[-1]], leaves[2], ctx.eps)
    outs, grads_out = [], []
    for out, grad in ((normed, grad_normed), (total, grad_total)):
        if grad is not None:
            outs.append(out)
            grads_out.append(grad.float())
    wanted = [t for t in leaves if t is not None and t.requires_grad]
    found = torch.autograd.grad(outs, wanted, grads_out, allow_unused=True) if wanted and outs else []
    result = []
    it = iter(found)
    for leaf, orig in zip(leaves, (input, residual, weight)):
        if leaf is None or not leaf.requires_grad:
            result.append(None)
        else:
            g = next(it)
            result.append(torch.zeros_like(orig) if g is None else g.to(orig.dtype))
    return result[0], result[1], result[2], None


_fused_add_rms_norm.register_autograd(_fused_add_rms_norm_backward,
                                      setup_context=_fused_add_rms_norm_setup_context)


def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor],
                       eps: Optional[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(input + residual, weight, eps), input + residual)`` in one pass over HBM.

    input and residual: same shape and dtype, normalised over the last dimension; weight:
    [H] of any float dtype, or None; ``eps=None`` uses ``torch.finfo(input.dtype).eps``.
    The sum is rounded to ``input.dtype`` and normalised from that rounded value (what an
    eager ``add`` followed by ``rms_norm`` computes). Backward recomputes with PyTorch ops.
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
    _check_param("weight", weight, (input.shape[-1],), input)
    return _fused_add_rms_norm(input, residual, weight, _resolve_eps(eps, input.dtype))


# ---------------------------------------------------------------------------- backward helpers

def _fp32_leaves(ctx, tensors):
    """fp32 copies of the saved tensors, requiring grad where the op's input needs one."""
    leaves = []
    for i, t in enumerate(tensors):
        if t is None:
            leaves.append(None)
        else:
            leaves.append(t.detach().float().requires_grad_(bool(ctx.needs_input_grad[i])))
    return leaves


def _grads(out, leaves, grad_output, originals):
    """d(out)/d(leaf) for leaves that require grad, cast back to the original dtypes."""
    wanted = [t for t in leaves if t is not None and t.requires_grad]
    found = iter(torch.autograd.grad(out, wanted, grad_output.float()) if wanted else ())
    result = []
    for leaf, orig in zip(leaves, originals):
        if leaf is None or not leaf.requires_grad:
            result.append(None)
        else:
            result.append(next(found).to(orig.dtype))
    return result

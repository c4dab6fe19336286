"""PyTorch twins of the block ops' backward kernels (the reference backend's backward ops,
the main job's backward check, and the double backward of the backward ops).

Each twin has its backward op's signature (output gradients first, then what the forward
saved) plus ``compute_dtype``: ``None`` (the reference backend) computes in float32 and
rounds each gradient once to its input's dtype; a dtype (``torch.float64`` for the
tests) computes in that dtype. The formulas are written out (not ``torch.autograd`` of the
forward) so they are what the kernels compute, and differentiable for a double backward;
the tests check them, and the kernels, against float64 autograd of torch's own forward.

A gradient of a parameter that is None is returned as an empty tensor (``empty_grad``):
a custom op returns tensors only.
"""

from __future__ import annotations

import torch

# What the twins compute in when compute_dtype is None.
COMPUTE_DTYPE = torch.float32


def empty_grad(like: torch.Tensor) -> torch.Tensor:
    """The stand-in for the gradient of an absent (None) parameter: a [0] tensor."""
    return like.new_empty((0,))


def _rms_eps(eps, dtype: torch.dtype) -> float:
    if eps is None:
        return float(torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps)
    return float(eps)


def _rms_norm_grads(dy, x, weight, eps, hidden_dims: int):
    """dx, dw of ``rms_norm`` over the last ``hidden_dims`` dims (all in one dtype)."""
    dims = tuple(range(x.dim() - hidden_dims, x.dim()))
    n = 1
    for d in dims:
        n *= x.shape[d]
    r = torch.rsqrt((x * x).mean(dim=dims, keepdim=True) + eps)
    g = dy if weight is None else dy * weight
    c = (g * x).sum(dim=dims, keepdim=True)
    dx = r * (g - x * (r * r * c / n))
    if weight is None:
        return dx, None
    dw = (dy * x * r).reshape(-1, *weight.shape).sum(0)
    return dx, dw


def rms_norm_backward(grad_output: torch.Tensor, input: torch.Tensor, normalized_shape, weight=None, eps=None,
                      compute_dtype: torch.dtype | None = None):
    """``(d input, d weight)`` of ``F.rms_norm(input, normalized_shape, weight, eps)``."""
    cd = compute_dtype or COMPUTE_DTYPE
    w = None if weight is None else weight.to(cd)
    dx, dw = _rms_norm_grads(grad_output.to(cd), input.to(cd), w, _rms_eps(eps, input.dtype), len(normalized_shape))
    return dx.to(input.dtype), (empty_grad(input) if weight is None else dw.to(weight.dtype))


def fused_add_rms_norm_backward(grad_output: torch.Tensor, grad_total: torch.Tensor, total: torch.Tensor,
                                weight=None, eps=None, compute_dtype: torch.dtype | None = None):
    """``(d total, d weight)`` of ``fused_add_rms_norm`` given the gradients of its two
    outputs and its saved ``total = input + residual``; ``d total`` is the gradient of
    both ``input`` and ``residual``."""
    cd = compute_dtype or COMPUTE_DTYPE
    w = None if weight is None else weight.to(cd)
    dx, dw = _rms_norm_grads(grad_output.to(cd), total.to(cd), w, _rms_eps(eps, total.dtype), 1)
    dx = dx + grad_total.to(cd)
    return dx.to(total.dtype), (empty_grad(total) if weight is None else dw.to(weight.dtype))


def layer_norm_backward(grad_output: torch.Tensor, input: torch.Tensor, normalized_shape, weight=None, bias=None,
                        eps: float = 1e-5, compute_dtype: torch.dtype | None = None):
    """``(d input, d weight, d bias)`` of ``F.layer_norm``."""
    cd = compute_dtype or COMPUTE_DTYPE
    x, dy = input.to(cd), grad_output.to(cd)
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    n = 1
    for d in dims:
        n *= x.shape[d]
    mean = x.mean(dim=dims, keepdim=True)
    xc = x - mean
    r = torch.rsqrt((xc * xc).mean(dim=dims, keepdim=True) + eps)
    xhat = xc * r
    g = dy if weight is None else dy * weight.to(cd)
    m1 = g.sum(dim=dims, keepdim=True) / n
    m2 = (g * xhat).sum(dim=dims, keepdim=True) / n
    dx = r * (g - m1 - xhat * m2)
    shape = tuple(normalized_shape)
    dw = empty_grad(input) if weight is None else (dy * xhat).reshape(-1, *shape).sum(0).to(weight.dtype)
    db = empty_grad(input) if bias is None else dy.reshape(-1, *shape).sum(0).to(bias.dtype)
    return dx.to(input.dtype), dw, db


# ---------------------------------------------------------------------------- activations

_SQRT_2_PI = 0.7978845608028654   # sqrt(2 / pi)
_INV_SQRT_2PI = 0.3989422804014327  # 1 / sqrt(2 pi)


def _gelu_slope(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """d gelu(x) / dx (erf form, or the tanh approximation's derivative)."""
    if approximate == "tanh":
        inner = _SQRT_2_PI * (x + 0.044715 * x * x * x)
        t = torch.tanh(inner)
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_PI * (1.0 + 3 * 0.044715 * x * x)
    return 0.5 * (1.0 + torch.erf(x * 0.7071067811865476)) + x * _INV_SQRT_2PI * torch.exp(-0.5 * x * x)


def _silu_slope(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def gelu_backward(grad_output: torch.Tensor, input: torch.Tensor, approximate: str = "none",
                  compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """d input of ``F.gelu(input, approximate)``: ``dy * gelu'(x)``."""
    cd = compute_dtype or COMPUTE_DTYPE
    return (grad_output.to(cd) * _gelu_slope(input.to(cd), approximate)).to(input.dtype)


def silu_backward(grad_output: torch.Tensor, input: torch.Tensor,
                  compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """d input of ``F.silu``: ``dy * sigmoid(x) * (1 + x * (1 - sigmoid(x)))``."""
    cd = compute_dtype or COMPUTE_DTYPE
    return (grad_output.to(cd) * _silu_slope(input.to(cd))).to(input.dtype)


def _gated_backward(grad_output, input, value, slope, cd):
    x = input.to(cd)
    d = x.shape[-1] // 2
    gate, up = x[..., :d], x[..., d:]
    dy = grad_output.to(cd)
    return torch.cat([dy * up * slope(gate), dy * value(gate)], dim=-1).to(input.dtype)


def silu_and_mul_backward(grad_output: torch.Tensor, input: torch.Tensor,
                          compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """d input of ``silu(x[..., :d]) * x[..., d:]``: ``[dy * u * silu'(g) | dy * silu(g)]``."""
    return _gated_backward(grad_output, input, torch.nn.functional.silu, _silu_slope, compute_dtype or COMPUTE_DTYPE)


def gelu_and_mul_backward(grad_output: torch.Tensor, input: torch.Tensor, approximate: str = "none",
                          compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """d input of ``gelu(x[..., :d], approximate) * x[..., d:]``."""
    return _gated_backward(grad_output, input, lambda g: torch.nn.functional.gelu(g, approximate=approximate),
                           lambda g: _gelu_slope(g, approximate), compute_dtype or COMPUTE_DTYPE)


# ---------------------------------------------------------------------------- rotary

def apply_rotary_pos_emb_backward(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                                  compute_dtype: torch.dtype | None = None):
    """``(d q, d k)`` of the rotate-half rotary embedding: ``dout * cos + R^T(dout * sin)``
    with ``R^T(g) = [g2, -g1]`` (the transpose of rotate_half): ``dout * cos + [dout2 * sin2,
    -dout1 * sin1]``, i.e. the embedding with sin's halves swapped and negated,
    ``(-sin2, -sin1)`` (equal to -sin only when sin's two halves are equal)."""
    from . import references

    half = sin.shape[-1] // 2
    swapped = -torch.cat((sin[..., half:], sin[..., :half]), dim=-1)
    return references.apply_rotary_pos_emb(grad_q, grad_k, cos, swapped,
                                           compute_dtype=compute_dtype or COMPUTE_DTYPE)


# ---------------------------------------------------------------------------- softmax

def softmax_backward(grad_output: torch.Tensor, output: torch.Tensor, dim: int = -1,
                     compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """d input of ``torch.softmax(input, dim)`` from its output y: ``y * (dy - sum(dy * y))``."""
    cd = compute_dtype or COMPUTE_DTYPE
    y, dy = output.to(cd), grad_output.to(cd)
    return (y * (dy - (dy * y).sum(dim=dim, keepdim=True))).to(output.dtype)

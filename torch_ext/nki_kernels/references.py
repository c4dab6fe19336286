"""PyTorch twins of every kernel: the CPU implementation, the tests' reference, the
benchmarks' baseline. Each computes in float32 or wider and returns the input dtype
(``compute_dtype=torch.float64`` gives the tests' float64 reference).

Kept free of any NKI or simulator import.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gelu(input: torch.Tensor, approximate: str = "none", compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``F.gelu`` computed in ``compute_dtype``, returned in ``input.dtype``."""
    return F.gelu(input.to(compute_dtype), approximate=approximate).to(input.dtype)


def layer_norm(input: torch.Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5,
               compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``F.layer_norm`` computed in ``compute_dtype`` (weight and bias too), returned in ``input.dtype``."""
    w = None if weight is None else weight.to(compute_dtype)
    b = None if bias is None else bias.to(compute_dtype)
    out = F.layer_norm(input.to(compute_dtype), tuple(normalized_shape), w, b, eps)
    return out.to(input.dtype)


def rms_norm(input: torch.Tensor, normalized_shape, weight=None, eps=None,
             compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``F.rms_norm`` computed in ``compute_dtype``, returned in ``input.dtype``.

    ``eps=None`` means ``torch.finfo(input.dtype).eps``, as in torch (the input's dtype, not
    the compute dtype).
    """
    if eps is None:
        eps = torch.finfo(input.dtype).eps
    dims = tuple(range(-len(normalized_shape), 0))
    x = input.to(compute_dtype)
    out = x * torch.rsqrt(x.square().mean(dim=dims, keepdim=True) + eps)
    if weight is not None:
        out = out * weight.to(compute_dtype)
    return out.to(input.dtype)


def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight, eps: float,
                       compute_dtype: torch.dtype = torch.float32):
    """``(rms_norm(input + residual), input + residual)``; the sum is rounded to ``input.dtype``
    (as a separate eager add would be) and normalised from that rounded value."""
    total = (input.to(compute_dtype) + residual.to(compute_dtype)).to(input.dtype)
    hidden = total.shape[-1]
    return rms_norm(total, (hidden,), weight, eps, compute_dtype), total


def silu(input: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``F.silu`` computed in ``compute_dtype``, returned in ``input.dtype``."""
    return F.silu(input.to(compute_dtype)).to(input.dtype)


def silu_and_mul(input: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` for ``x = [..., 2d]`` (kernels-community ``activation`` contract)."""
    x = input.to(compute_dtype)
    d = x.shape[-1] // 2
    return (F.silu(x[..., :d]) * x[..., d:]).to(input.dtype)


def gelu_and_mul(input: torch.Tensor, approximate: str = "none",
                 compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``gelu(x[..., :d], approximate) * x[..., d:]`` for ``x = [..., 2d]``."""
    x = input.to(compute_dtype)
    d = x.shape[-1] // 2
    return (F.gelu(x[..., :d], approximate=approximate) * x[..., d:]).to(input.dtype)


def softmax(input: torch.Tensor, dim: int = -1, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``torch.softmax`` computed in ``compute_dtype``, returned in ``input.dtype``."""
    return torch.softmax(input.to(compute_dtype), dim=dim).to(input.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         compute_dtype: torch.dtype = torch.float32):
    """transformers' Llama rotary embedding (rotate-half): q/k ``[B, H, S, D]``, cos/sin
    ``[B, S, D]`` or ``[S, D]`` (broadcast over heads). Returns ``(q_out, k_out)`` in q/k's dtypes."""
    c = cos.to(compute_dtype)
    s = sin.to(compute_dtype)
    if c.dim() == 3:  # [B, S, D] -> [B, 1, S, D]
        c, s = c.unsqueeze(1), s.unsqueeze(1)
    qc, kc = q.to(compute_dtype), k.to(compute_dtype)
    q_out = qc * c + _rotate_half(qc) * s
    k_out = kc * c + _rotate_half(kc) * s
    return q_out.to(q.dtype), k_out.to(k.dtype)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False,
                                 compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` written out in ``compute_dtype`` (no dropout).

    q ``[..., H, Sq, D]``, k ``[..., Hkv, Sk, D]``, v ``[..., Hkv, Sk, Dv]``; ``H`` a multiple
    of ``Hkv`` when ``enable_gqa`` (query head ``h`` reads kv head ``h // (H // Hkv)``).
    ``attn_mask`` broadcasts to ``[..., H, Sq, Sk]``: bool (True = attend) or additive float.
    ``is_causal`` keeps key ``j <= i`` (top-left aligned) and combines with ``attn_mask``.
    A query row whose keys are all masked (all False / all ``-inf``) gives 0, as torch's
    SDPA does; a finite "minus large" mask (e.g. ``finfo.min``) gives the plain softmax.
    Returns ``query.dtype``.
    """
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p={dropout_p}: the reference computes attention without dropout")
    q, k, v = (t.to(compute_dtype) for t in (query, key, value))
    if enable_gqa and q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        groups = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(groups, dim=-3)
        v = v.repeat_interleave(groups, dim=-3)
    if scale is None:
        scale = query.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    sq, sk = scores.shape[-2], scores.shape[-1]
    if is_causal:
        keep = torch.ones(sq, sk, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(compute_dtype)
    # Softmax written out so that an all-masked row gives 0 (not NaN) in forward AND backward:
    # its max is -inf, replaced by 0, so every exp is 0 and the row sum is 0 (divided by 1).
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(scores - row_max)
    row_sum = weights.sum(dim=-1, keepdim=True)
    probs = weights / torch.where(row_sum == 0, torch.ones_like(row_sum), row_sum)
    return torch.matmul(probs, v).to(query.dtype)

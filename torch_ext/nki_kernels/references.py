"""PyTorch twins of every op: the CPU implementation (the reference backend), the tests'
float64 reference, the benchmarks' baseline.

``compute_dtype`` says how a twin computes:

* ``None`` (the reference backend): where the op's contract IS a torch op (``gelu``,
  ``silu``, ``softmax``, ``layer_norm``, ``rms_norm``, ``fused_add_rms_norm``'s add and
  norm, ``scaled_dot_product_attention``), torch's op in the input dtype, so the CPU path
  runs what eager PyTorch runs, as fast (issue 14). Norms with weights of another dtype
  than the input compute in float32 (torch's CPU ops would warn or promote). The ops torch
  has no single op for (``silu_and_mul``, ``gelu_and_mul``, ``apply_rotary_pos_emb``)
  compute in float32 and round once: the kernels' contract, one rounding more accurate than
  eager's composition (which rounds after every op), at 2-4x its CPU time in bf16.
* a dtype (``torch.float64`` for the tests, ``torch.float32`` for the recompute backward):
  the inputs are upcast and the same torch ops run in that dtype.

Every twin returns the input dtype. Kept free of any NKI or simulator import.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# What the twins with no torch op compute in when compute_dtype is None (see above).
SINGLE_ROUNDING_DTYPE = torch.float32


def _resolve(compute_dtype: torch.dtype | None, input: torch.Tensor, *params: torch.Tensor | None) -> torch.dtype:
    """``compute_dtype``, or for None the input dtype when every parameter shares it
    (torch's op then runs as eager runs it), else float32."""
    if compute_dtype is not None:
        return compute_dtype
    if all(p is None or p.dtype == input.dtype for p in params):
        return input.dtype
    return SINGLE_ROUNDING_DTYPE


def _to(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(dtype)


def gelu(input: torch.Tensor, approximate: str = "none", compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``F.gelu``."""
    cd = _resolve(compute_dtype, input)
    return F.gelu(input.to(cd), approximate=approximate).to(input.dtype)


def silu(input: torch.Tensor, compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``F.silu``."""
    return F.silu(input.to(_resolve(compute_dtype, input))).to(input.dtype)


def softmax(input: torch.Tensor, dim: int = -1, compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.softmax``."""
    return torch.softmax(input.to(_resolve(compute_dtype, input)), dim=dim).to(input.dtype)


def layer_norm(input: torch.Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5,
               compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``F.layer_norm`` (weight and bias in the compute dtype too)."""
    cd = _resolve(compute_dtype, input, weight, bias)
    out = F.layer_norm(input.to(cd), tuple(normalized_shape), _to(weight, cd), _to(bias, cd), eps)
    return out.to(input.dtype)


def layer_norm_stats(input: torch.Tensor, normalized_shape, eps: float = 1e-5,
                     compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Per row of ``input`` viewed as [N, prod(normalized_shape)]: ``(mean, rsqrt(var + eps))``
    (population variance), float32, computed in the compute dtype and shaped as input's row
    dims + (2,) (an [N, 2] tensor for a 2-D input): the statistics ``native_layer_norm``
    saves for its backward, and what the training op returns from the NKI kernel's
    ``save_stats``."""
    cd = _resolve(compute_dtype, input)
    hidden = 1
    for d in normalized_shape:
        hidden *= d
    x = input.to(cd).reshape(-1, hidden)
    mean = x.mean(dim=1)
    rstd = torch.rsqrt(((x - mean[:, None]) ** 2).mean(dim=1) + eps)
    rows = input.shape[:input.dim() - len(tuple(normalized_shape))]
    return torch.stack([mean, rstd], dim=1).to(torch.float32).reshape(*rows, 2)


def rms_norm(input: torch.Tensor, normalized_shape, weight=None, eps=None,
             compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``F.rms_norm``; ``eps=None`` means the machine epsilon of the input's opmath type
    (float32's for fp16/bf16/fp32, as torch 2.13 documents), whatever the compute dtype."""
    if eps is None:
        eps = torch.finfo(torch.float64 if input.dtype == torch.float64 else torch.float32).eps
    cd = _resolve(compute_dtype, input, weight)
    out = F.rms_norm(input.to(cd), tuple(normalized_shape), _to(weight, cd), eps)
    return out.to(input.dtype)


def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight, eps: float,
                       compute_dtype: torch.dtype | None = None):
    """``(rms_norm(input + residual), input + residual)``; the sum is rounded to ``input.dtype``
    (as a separate eager add would be) and normalised from that rounded value."""
    cd = _resolve(compute_dtype, input, residual)
    total = (input.to(cd) + residual.to(cd)).to(input.dtype)
    hidden = total.shape[-1]
    return rms_norm(total, (hidden,), weight, eps, compute_dtype), total


def silu_and_mul(input: torch.Tensor, compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` for ``x = [..., 2d]`` (kernels-community ``activation``
    contract), rounded once."""
    x = input.to(compute_dtype or SINGLE_ROUNDING_DTYPE)
    d = x.shape[-1] // 2
    return (F.silu(x[..., :d]) * x[..., d:]).to(input.dtype)


def gelu_and_mul(input: torch.Tensor, approximate: str = "none",
                 compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``gelu(x[..., :d], approximate) * x[..., d:]`` for ``x = [..., 2d]``, rounded once."""
    x = input.to(compute_dtype or SINGLE_ROUNDING_DTYPE)
    d = x.shape[-1] // 2
    return (F.gelu(x[..., :d], approximate=approximate) * x[..., d:]).to(input.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         compute_dtype: torch.dtype | None = None):
    """transformers' Llama rotary embedding (rotate-half): q/k ``[B, H, S, D]``, cos/sin
    ``[B, S, D]`` or ``[S, D]`` (broadcast over heads). Returns ``(q_out, k_out)`` in q/k's
    dtypes, each rounded once."""
    cd = compute_dtype or SINGLE_ROUNDING_DTYPE
    c, s = cos.to(cd), sin.to(cd)
    if c.dim() == 3:  # [B, S, D] -> [B, 1, S, D]
        c, s = c.unsqueeze(1), s.unsqueeze(1)
    qc, kc = q.to(cd), k.to(cd)
    q_out = qc * c + _rotate_half(qc) * s
    k_out = kc * c + _rotate_half(kc) * s
    return q_out.to(q.dtype), k_out.to(k.dtype)


def _with_causal(mask: torch.Tensor | None, sq: int, sk: int, device: torch.device) -> torch.Tensor:
    """``mask`` (bool, or additive float) with keys ``j > i`` masked as well (top-left)."""
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device).tril()
    if mask is None:
        return keep
    if mask.dtype == torch.bool:
        return mask & keep
    return mask.masked_fill(~keep, float("-inf"))


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False,
                                 compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` (no dropout), on q/k/v (and a float mask) in the
    compute dtype; ``scale=None`` means ``D ** -0.5`` of the query.

    torch 2.13's CPU SDPA runs its flash kernel for every dtype here, float64 included (so
    the tests' float64 reference costs one float64 flash pass), with these semantics, which
    the NKI kernel shares: a query row whose keys are all masked (all False / all ``-inf``)
    gives 0; a finite "minus large" mask (``finfo.min``) gives the plain softmax (the mean of
    the values); ``is_causal`` (top-left) combines with ``attn_mask``; a masked key holding
    inf/NaN makes its rows NaN (masking is additive). (Where torch's CPU SDPA departs from its
    contract, with a mask and ``is_causal`` on its math path or ``is_causal`` with
    ``scale <= 0``, causality is passed as a mask; a 1-D ``[Sk]`` or 0-d mask, which it
    rejects, is passed as ``[1, Sk]`` or ``[1, 1]``; a query row holding inf or NaN, whose output torch's flash kernel
    gives as 0 at fewer than 16 keys (float64 at fewer than 15), is NaN, as its scores are
    inf/NaN and as the kernel gives it, masked or not.) A float32 mask is accepted with any
    query dtype. Returns ``query.dtype``; for q/k/v that are transposed views of
    ``[B, S, H, D]`` the output is such a view too.
    """
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p={dropout_p}: the reference computes attention without dropout")
    cd = _resolve(compute_dtype, query)
    q, k, v = query.to(cd), key.to(cd), value.to(cd)
    mask = attn_mask
    if mask is not None and mask.is_floating_point() and cd != query.dtype:
        mask = mask.to(cd)       # SDPA takes bool, float32 or the query dtype
    if mask is not None and mask.dim() < 2:
        # torch 2.13's CPU SDPA raises IndexError on a 1-D [Sk] or 0-d mask, which broadcast
        mask = mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))
    if is_causal and (mask is not None or (scale is not None and scale <= 0)):
        # torch 2.13's CPU SDPA refuses a mask with is_causal on its math path (e.g. Dv != D,
        # float16) and returns NaN for is_causal with scale <= 0: give it causality as a mask
        mask = _with_causal(mask, q.shape[-2], k.shape[-2], q.device)
        is_causal = False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                         enable_gqa=bool(enable_gqa))  # a SymBool when traced
    # torch 2.13's CPU flash kernel takes a row whose max is NaN for a row with every key
    # masked and writes 0 (at fewer than 16 keys, where it does not tile the keys). A product
    # with 1 (exact) or NaN per row keeps out's strides, so transposed-view inputs keep their
    # output layout (a masked_fill or where makes it contiguous), and stays differentiable
    row = torch.where(torch.isfinite(q).all(-1, keepdim=True), 1.0, float("nan")).to(out.dtype)
    return (out * row).to(query.dtype)

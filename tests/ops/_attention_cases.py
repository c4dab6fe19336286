"""Shared builders for the attention tests: inputs, masks, the float64 reference, tolerances."""

from __future__ import annotations

import torch

from nki_kernels import references
from tests._helpers import TOLERANCES, rel_error

# (atol, rtol) per dtype come from tests/_helpers.py (why: see there). On top of the
# elementwise check, the relative error ||out - ref|| / ||ref|| must stay under:
# * float32: ~1e-7 is what the kernel reaches (fp32 matmuls, fp32 softmax) -> 1e-5;
# * bfloat16: P is rounded to bf16 before P·V (2**-9 relative) and the output once more
#   -> ~2.5e-3 observed -> 1e-2;
# * float16: 11-bit P and output -> ~2e-4 observed -> 2e-3.
REL_ERROR = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}

# Gradients (dq, dk, dv) against float64 autograd: bounds on ||g - ref|| / ||ref|| and on the
# largest element error relative to max |ref|:
# * float32: fp32 matmuls and softmax statistics; ~4e-7 observed -> 1e-5 / 1e-5;
# * bfloat16: P and dS are rounded to bf16 before their matmuls (2**-9 relative each, as the
#   forward's P), dO·Vᵀ uses the bf16 O and dO, and each gradient is rounded once more;
#   ~3.5e-3 observed (~6.7e-3 at logits of +-50) -> 1e-2 in norm, 4e-2 per element;
# * float16: the same roundings at 11 bits; ~4.5e-4 observed -> 2e-3 / 8e-3.
GRAD_REL_ERROR = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
GRAD_MAX_ERROR = {torch.float32: 1e-5, torch.bfloat16: 4e-2, torch.float16: 8e-3}


def check_grads(got, want, dtype, names="qkv"):
    """dq, dk, dv (``got``; or the gradients ``names`` lists) against their float64
    references (``want``) at ``dtype``'s bounds above; a NaN is an element the kernel never
    wrote (the simulator's poison)."""
    for name, g, w in zip(names, got, want, strict=True):
        assert g is not None and g.dtype == dtype and g.shape == w.shape, name
        assert not torch.isnan(g).any(), f"d{name}: NaN (an element the kernel never wrote?)"
        err = rel_error(g, w)
        assert err < GRAD_REL_ERROR[dtype], f"d{name}: relative error {err:.3e} >= {GRAD_REL_ERROR[dtype]}"
        worst = float((g.double() - w).abs().max() / w.abs().max().clamp_min(1e-30))
        assert worst < GRAD_MAX_ERROR[dtype], \
            f"d{name}: largest element error {worst:.3e} of max |ref| >= {GRAD_MAX_ERROR[dtype]}"


def make_qkv(b, h, hkv, sq, sk, d, dv=None, dtype=torch.bfloat16, layout="bhsd"):
    """Fresh random q [b, h, sq, d], k [b, hkv, sk, d], v [b, hkv, sk, dv]. ``layout="bshd"``
    returns transposed views of [b, s, h, d] memory, as transformers' projections give."""
    dv = dv or d

    def one(heads, s, dim):
        if layout == "bshd":
            return torch.randn(b, s, heads, dim).to(dtype).transpose(1, 2)
        return torch.randn(b, heads, s, dim).to(dtype)

    return one(h, sq, d), one(hkv, sk, d), one(hkv, sk, dv)


def make_mask(kind, b, h, sq, sk, dtype):
    """Masks broadcastable to [b, h, sq, sk]; every query row keeps at least one key
    unless the kind says otherwise."""
    if kind is None:
        return None
    if kind == "key_bool":          # key padding [b, 1, 1, sk], True = attend
        m = torch.rand(b, 1, 1, sk) > 0.3
        m[..., 0] = True
        return m
    if kind == "key_float":         # additive key padding with -inf and finite biases
        m = torch.randn(b, 1, 1, sk).to(dtype)
        m[torch.rand(b, 1, 1, sk) < 0.3] = float("-inf")
        m[..., 0] = 0.0
        return m
    if kind == "full_float":        # per head additive bias [b, h, sq, sk] (e.g. relative position)
        return torch.randn(b, h, sq, sk)
    if kind == "bool_2d":           # one [sq, sk] pattern for every batch and head
        m = torch.rand(sq, sk) > 0.5
        m[:, 0] = True
        return m
    if kind == "causal_active":     # speculative decoding: [b, 1, sq, sk], the sq active tokens
        return torch.ones(b, 1, sq, sk, dtype=torch.bool).tril(sk - sq)   # causal among themselves
    if kind == "finfo_min":         # transformers-style [b, 1, sq, sk] with finfo.min
        m = torch.zeros(b, 1, sq, sk, dtype=dtype)
        m[torch.rand(b, 1, sq, sk) < 0.4] = torch.finfo(dtype).min
        m[..., 0] = 0.0
        return m
    raise ValueError(kind)


def reference(q, k, v, mask=None, causal=False, scale=None, compute_dtype=torch.float64):
    return references.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
        enable_gqa=q.shape[-3] != k.shape[-3], compute_dtype=compute_dtype)


def check_close(out, q, k, v, mask=None, causal=False, scale=None):
    """out (kernel dtype) against the float64 reference, elementwise and in norm: the
    reference takes float64 copies (and a float mask in float64), so it is never rounded to
    the kernel's dtype."""
    f64 = [t.double() for t in (q, k, v)]
    m64 = mask.double() if mask is not None and mask.is_floating_point() else mask
    expected = reference(*f64, m64, causal, scale)
    assert expected.dtype == torch.float64
    assert out.dtype == q.dtype and out.shape == expected.shape
    assert not torch.isnan(out).any(), "NaN in the output (an element the kernel never wrote?)"
    atol, rtol = TOLERANCES[q.dtype]
    torch.testing.assert_close(out.double(), expected.double(), atol=atol, rtol=rtol)
    err = rel_error(out, expected)
    assert err < REL_ERROR[q.dtype], f"relative error {err:.3e} >= {REL_ERROR[q.dtype]}"
    return err

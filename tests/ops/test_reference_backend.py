"""The CPU default (reference backend) runs torch's own op where the op's contract is that
op, so it computes exactly what eager PyTorch computes (and as fast, issue 14); the ops
torch has no single op for compute in float32 and round once (references.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nki_kernels
from nki_kernels import references
from tests.ops._attention_cases import make_mask, make_qkv

from ._cases import randn

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
DTYPES = pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=str)


def _same(got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got, expected), f"max |diff| {(got.double() - expected.double()).abs().max():.3g}"


@DTYPES
def test_pointwise_and_norms_are_torchs_ops(reference_backend, dtype):
    # odd sizes: 5 x 7 rows of 33
    x = randn(5, 7, 33, dtype=dtype, scale=2.0)
    r = randn(5, 7, 33, dtype=dtype)
    w = randn(33, dtype=dtype, scale=0.5, shift=1.0)
    b = randn(33, dtype=dtype)
    _same(nki_kernels.gelu(x), F.gelu(x))
    _same(nki_kernels.gelu(x, "tanh"), F.gelu(x, approximate="tanh"))
    _same(nki_kernels.silu(x), F.silu(x))
    _same(nki_kernels.softmax(x, dim=1), torch.softmax(x, dim=1))
    _same(nki_kernels.layer_norm(x, (33,), w, b, 1e-5), F.layer_norm(x, (33,), w, b, 1e-5))
    _same(nki_kernels.layer_norm(x, (7, 33)), F.layer_norm(x, (7, 33)))
    _same(nki_kernels.rms_norm(x, (33,), w, 1e-6), F.rms_norm(x, (33,), w, 1e-6))
    _same(nki_kernels.rms_norm(x, (33,)), F.rms_norm(x, (33,)))          # eps None: float32 eps, as torch
    normed, total = nki_kernels.fused_add_rms_norm(x, r, w, 1e-6)
    _same(total, x + r)
    _same(normed, F.rms_norm(x + r, (33,), w, 1e-6))


def test_norm_with_wider_weights_computes_in_float32(reference_backend):
    # bf16 activations with fp32 weights (a model kept in fp32 norms): one float32 pass, rounded once
    x = randn(9, 40, dtype=BF16, scale=2.0)
    w = randn(40, dtype=F32, scale=0.5, shift=1.0)
    b = randn(40, dtype=F32)
    _same(nki_kernels.rms_norm(x, (40,), w, 1e-6), F.rms_norm(x.float(), (40,), w, 1e-6).to(BF16))
    _same(nki_kernels.layer_norm(x, (40,), w, b), F.layer_norm(x.float(), (40,), w, b).to(BF16))


@DTYPES
def test_gated_and_rotary_round_once(reference_backend, dtype):
    """No torch op computes these: the reference keeps the kernels' single rounding, which
    is at least as close to float64 as eager's op-by-op composition."""
    x = randn(6, 2 * 45, dtype=dtype, scale=2.0)
    xf = x.float()
    _same(nki_kernels.silu_and_mul(x), (F.silu(xf[:, :45]) * xf[:, 45:]).to(dtype))
    _same(nki_kernels.gelu_and_mul(x, "tanh"), (F.gelu(xf[:, :45], approximate="tanh") * xf[:, 45:]).to(dtype))
    x64 = x.double()
    exact = F.silu(x64[:, :45]) * x64[:, 45:]
    ours = (nki_kernels.silu_and_mul(x).double() - exact).abs().max()
    eager = ((F.silu(x[:, :45]) * x[:, 45:]).double() - exact).abs().max()
    assert ours <= eager

    q, k = randn(2, 4, 9, 16, dtype=dtype), randn(2, 2, 9, 16, dtype=dtype)
    cos, sin = randn(2, 9, 16, dtype=dtype), randn(2, 9, 16, dtype=dtype)
    got_q, got_k = nki_kernels.apply_rotary_pos_emb(q, k, cos, sin)
    # transformers' own Llama rotary (an implementation independent of ours) on fp32 copies,
    # rounded once to the input dtype
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_rotary

    want_q, want_k = hf_rotary(q.float(), k.float(), cos.float(), sin.float())
    _same(got_q, want_q.to(dtype))
    _same(got_k, want_k.to(dtype))


@DTYPES
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("mask, causal", [(None, True), ("key_bool", False), ("finfo_min", False),
                                          ("full_float", True)])
def test_attention_is_torchs_sdpa(reference_backend, dtype, layout, mask, causal):
    q, k, v = make_qkv(2, 6, 2, 9, 13, 24, dtype=dtype, layout=layout)
    m = make_mask(mask, 2, 6, 9, 13, dtype)
    got = nki_kernels.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, enable_gqa=True)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, enable_gqa=True)
    _same(got, expected)
    # the op's documented layout: transposed views in, a transposed view out (transformers
    # then reshapes it to [B, S, H*D] without a copy)
    assert got.stride() == expected.stride()
    assert got.transpose(1, 2).is_contiguous() == (layout == "bshd")


def test_float64_twin_is_sdpa_on_upcast_inputs():
    """The tests' float64 reference: torch's SDPA on float64 copies (a float mask too),
    returned in the input dtype; all-masked rows give 0, as the kernel does."""
    q, k, v = make_qkv(1, 4, 4, 5, 7, 8, dtype=BF16)
    mask = torch.zeros(1, 1, 5, 7, dtype=BF16)
    mask[..., 1, :] = float("-inf")
    mask[..., 3, 2:] = torch.finfo(BF16).min
    got = references.scaled_dot_product_attention(q, k, v, attn_mask=mask, compute_dtype=torch.float64)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask.double())
    assert got.dtype == BF16
    _same(got, expected.to(BF16))
    assert torch.equal(got[..., 1, :], torch.zeros_like(got[..., 1, :]))


def _attention_by_hand(q, k, v, keep, scale):
    """float64 softmax(q k^T * scale masked by keep) v, written out."""
    q, k, v = q.double(), k.double(), v.double()
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("scale", [0.0, -0.3, 0.2])
def test_attention_where_torchs_cpu_sdpa_departs_from_its_contract(reference_backend, scale):
    """torch 2.13's CPU SDPA returns NaN for is_causal with scale <= 0, and its math path
    (here Dv != D in fp16) refuses a mask together with is_causal; the reference path
    passes causality as a mask there and keeps the contract."""
    q, k, v = make_qkv(1, 2, 2, 7, 11, 32, dtype=F32)
    got = nki_kernels.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    keep = torch.ones(7, 11, dtype=torch.bool).tril()
    torch.testing.assert_close(got.double(), _attention_by_hand(q, k, v, keep, scale), atol=1e-5, rtol=1e-4)
    q, k, v = make_qkv(1, 2, 2, 7, 11, 32, dv=16, dtype=F16)
    mask = torch.rand(1, 1, 7, 11) > 0.3
    mask[..., 0] = True
    got = nki_kernels.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True, scale=scale)
    torch.testing.assert_close(got.double(), _attention_by_hand(q, k, v, keep & mask, scale), atol=2e-3, rtol=2e-3)


def test_reference_rms_norm_default_eps_is_float32s_for_16bit_inputs():
    # the benchmarks' baseline calls references.rms_norm directly: eps=None must be torch's
    # (the opmath type's epsilon, float32's for bf16), not bf16's 0.0078 (a review's mutant)
    x = (torch.randn(3, 8) * 0.05).bfloat16()
    torch.testing.assert_close(references.rms_norm(x, (8,)), torch.nn.functional.rms_norm(x, (8,)),
                               atol=0, rtol=0)

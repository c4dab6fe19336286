"""``nki_kernels.scaled_dot_product_attention``: the SDPA contract, both CPU backends,
autograd, opcheck, torch.compile and every bad-input error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import nki_kernels
from nki_kernels.ops import attention
from tests._helpers import TOLERANCES
from tests.ops._attention_cases import check_close, check_grads, make_mask, make_qkv

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
sdpa = nki_kernels.scaled_dot_product_attention


# ------------------------------------------------------------------------------ reference path

@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=str)
@pytest.mark.parametrize("kwargs", [
    {},
    {"is_causal": True},
    {"scale": 0.37},
    {"mask": "key_bool"},
    {"mask": "full_float"},
    {"mask": "bool_2d", "is_causal": True},
    {"mask": "finfo_min"},
], ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_reference_path_matches_torch_sdpa(reference_backend, dtype, kwargs):
    kwargs = dict(kwargs)
    b, h, sq, sk, d = 2, 3, 9, 13, 16
    q, k, v = make_qkv(b, h, h, sq, sk, d, dtype=dtype)
    mask = make_mask(kwargs.pop("mask", None), b, h, sq, sk, dtype)
    out = sdpa(q, k, v, attn_mask=mask, **kwargs)
    check_close(out, q, k, v, mask, kwargs.get("is_causal", False), kwargs.get("scale"))
    # torch's CPU SDPA also combines a mask with is_causal, so every case is compared
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                              attn_mask=mask.float() if mask is not None and mask.is_floating_point() else mask,
                                              **kwargs)
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out.float(), expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("backend", ["reference", "simulator"])
def test_shapes_and_layouts_like_sdpa(monkeypatch, backend):
    """3-D inputs (one head), 5-D inputs (two batch dims), GQA, Dv != D, and transposed views:
    output shape, dtype and values as torch's SDPA."""
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    cases = [
        (torch.randn(3, 7, 16), torch.randn(3, 9, 16), torch.randn(3, 9, 8), {}),
        (torch.randn(4, 7, 16), torch.randn(2, 9, 16), torch.randn(2, 9, 16),
         {"enable_gqa": True, "attn_mask": torch.rand(4, 7, 9) > 0.2}),        # 3-D GQA: dim -3 is heads
        (torch.randn(2, 3, 4, 7, 16), torch.randn(2, 3, 4, 9, 16), torch.randn(2, 3, 4, 9, 16),
         {"attn_mask": torch.rand(3, 1, 7, 9) > 0.2}),
        (*make_qkv(2, 6, 2, 5, 11, 32, dtype=F32), {"enable_gqa": True}),
        (*make_qkv(1, 4, 4, 5, 11, 32, dv=24, dtype=F32, layout="bshd"), {"is_causal": True}),
    ]
    for q, k, v, kw in cases:
        out = sdpa(q, k, v, **kw)
        expected = F.scaled_dot_product_attention(q, k, v, **kw)
        assert out.shape == expected.shape and out.dtype == expected.dtype
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", ["reference", "simulator"])
def test_autocast_casts_the_inputs_as_torch_sdpa_does(monkeypatch, backend):
    """Under torch.autocast torch's SDPA casts its floating inputs to the autocast dtype (a
    lower-precision op on CPU); the op does too, so fp32 q/k beside a bf16 v (an autocast
    model after an fp32 rotary) run in bf16 instead of being refused as mixed dtypes."""
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    q, k, v = make_qkv(2, 4, 2, 9, 13, 32, dtype=F32)
    mask = torch.rand(2, 1, 9, 13) > 0.3
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sdpa(q, k, v.bfloat16(), attn_mask=mask, enable_gqa=True)
        expected = F.scaled_dot_product_attention(q, k, v.bfloat16(), attn_mask=mask, enable_gqa=True)
    assert out.dtype == expected.dtype == torch.bfloat16
    check_close(out, q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)   # float64 math on the cast inputs
    with pytest.raises(TypeError, match="value has dtype bfloat16 but query has float32"):
        sdpa(q, k, v.bfloat16())                                         # outside autocast: refused


@pytest.mark.parametrize("backend", ["reference", "simulator"])
def test_a_per_head_key_mask_matches_torch(monkeypatch, backend):
    # a [B, H, 1, Sk] mask: one key mask per head, broadcast over the queries (the
    # review's mutant that took it for a [B, 1, 1, Sk] key mask crashed on both backends)
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    q, k, v = make_qkv(2, 3, 3, 7, 11, 16, dtype=F32)
    mask = torch.rand(2, 3, 1, 11) > 0.3
    mask[..., 0] = True                                   # every row keeps a key
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = sdpa(*leaves, attn_mask=mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-5, rtol=1e-4)
    out.sum().backward()
    ref = [t.clone().requires_grad_(True) for t in (q, k, v)]
    F.scaled_dot_product_attention(*ref, attn_mask=mask).sum().backward()
    for got, want in zip(leaves, ref):
        torch.testing.assert_close(got.grad, want.grad, atol=1e-5, rtol=1e-4)


def test_output_layout_follows_transposed_inputs(reference_backend):
    """q/k/v as transposed [B, S, H, D] views (transformers) give an output that is itself a
    transposed view, so out.transpose(1, 2) is contiguous [B, S, H, D] (no copy)."""
    q, k, v = make_qkv(2, 4, 4, 6, 6, 16, layout="bshd")
    out = sdpa(q, k, v)
    assert out.transpose(1, 2).is_contiguous()
    q, k, v = make_qkv(2, 4, 4, 6, 6, 16, layout="bhsd")
    assert sdpa(q, k, v).is_contiguous()


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_the_reference_keeps_the_layout_and_torch_s_values(dtype):
    # the reference itself (not only the op, which copies into the layout it promises) gives
    # a transposed view for transposed-view inputs, bit-equal to torch's SDPA, its NaN-row
    # correction included (review, session 68: a masked_fill made it contiguous)
    from nki_kernels import references

    q, k, v = make_qkv(2, 4, 4, 6, 6, 16, dtype=dtype, layout="bshd")
    out = references.scaled_dot_product_attention(q, k, v)
    assert out.transpose(1, 2).is_contiguous()
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v))


EMPTY = [  # (query shape, key shape, kwargs): some dim 0, as torch's SDPA takes them
    ((0, 2, 3, 8), (0, 2, 4, 8), {}),                       # B = 0
    ((1, 0, 3, 8), (1, 0, 4, 8), {}),                       # H = 0
    ((1, 0, 3, 8), (1, 0, 4, 8), {"enable_gqa": True}),     # H = Hkv = 0 with GQA
    ((1, 2, 0, 8), (1, 2, 4, 8), {}),                       # Sq = 0
    ((1, 2, 3, 8), (1, 2, 0, 8), {}),                       # Sk = 0: zeros
    ((1, 4, 3, 8), (1, 2, 0, 8), {"enable_gqa": True}),     # Sk = 0 with GQA
    ((2, 3, 8), (2, 0, 8), {}),                             # 3-D, Sk = 0
    ((2, 0, 2, 3, 8), (2, 0, 2, 4, 8), {}),                 # 5-D with an empty batch dim
]


@pytest.mark.parametrize("backend", ["reference", "simulator"])
@pytest.mark.parametrize("q_shape, k_shape, kwargs", EMPTY, ids=lambda a: str(a).replace(" ", ""))
def test_empty_dims_return_what_torch_returns(monkeypatch, backend, q_shape, k_shape, kwargs):
    """Issue 13: B, H, Sq or Sk = 0 are accepted (they were rejected) and give torch's
    result: an empty output, or zeros for Sk = 0; with a mask, causal, and backward."""
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    for extra in ({}, {"is_causal": True}, {"attn_mask": torch.rand(q_shape[-2], k_shape[-2]) > 0.5}):
        q = torch.randn(q_shape, requires_grad=True)
        k = torch.randn(k_shape, requires_grad=True)
        v = torch.randn(k_shape[:-1] + (5,), requires_grad=True)
        out = sdpa(q, k, v, **kwargs, **extra)
        expected = F.scaled_dot_product_attention(q, k, v, **kwargs, **extra)
        assert out.shape == expected.shape and out.dtype == expected.dtype
        assert torch.equal(out, expected)
        out.sum().backward()
        assert all(t.grad is not None and t.grad.shape == t.shape and not t.grad.any() for t in (q, k, v))


# ------------------------------------------------------------------------------ GQA decode: query heads folded into rows

@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("b, h, hkv, sq, sk, mask", [
    (2, 8, 2, 1, 300, None),           # decode, single pass
    (1, 6, 2, 5, 97, "key_bool"),      # a short chunk with key padding
    (2, 4, 1, 1, 2500, "key_float"),   # decode past the single-pass limit (flash kernel)
    (1, 8, 2, 31, 64, None),           # G * Sq = 124 rows: one tile of every head
])
def test_gqa_short_queries_fold_heads_into_rows_and_match_the_reference(monkeypatch, layout, b, h, hkv, sq, sk, mask):
    """Grouped-query calls with short queries, no causal and no per-row mask run with each
    kv head's query heads folded into its query rows (ops/attention.py _folded_inputs): the
    launch reads q as [B, Hkv, G * Sq, D] (bhsd) or [B, G * Sq, Hkv, D] (bshd), and the
    output, its layout and the gradients (through the folded LSE) are those of SDPA."""
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "simulator")
    q, k, v = make_qkv(b, h, hkv, sq, sk, 32, dtype=BF16, layout=layout)
    m = make_mask(mask, b, h, sq, sk, BF16)
    call = attention.attention_kernel_call(q, k, v, m, enable_gqa=True)
    rows = (h // hkv) * sq
    # (the launch's layout: a [B, 1, H, D] or [B, S, 1, D] view is contiguous, so bhsd)
    folded = (b, hkv, rows, 32) if call.static["layout"] == "bhsd" else (b, rows, hkv, 32)
    assert tuple(call.tensors[0].shape) == folded
    out = sdpa(q, k, v, attn_mask=m, enable_gqa=True)
    check_close(out, q, k, v, m)
    assert out.stride() == attention._empty_out(q, k, v).stride()
    # the training path: the forward's LSE comes back folded and is unfolded for the backward
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    grad = torch.randn(b, h, sq, 32).to(BF16)
    sdpa(*leaves, attn_mask=m, enable_gqa=True).backward(grad)
    ref = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    fm = None if m is None else (m if m.is_floating_point() else torch.zeros(m.shape).masked_fill(~m, float("-inf")))
    F.scaled_dot_product_attention(*ref, attn_mask=None if fm is None else fm.double(), enable_gqa=True).backward(grad.double())
    check_grads([t.grad for t in leaves], [t.grad for t in ref], BF16)


@pytest.mark.parametrize("case, kwargs", [
    ("causal", {"is_causal": True}),
    ("no groups", {"hkv": 8}),
    ("a full tile of queries", {"sq": 128}),
])
def test_gqa_folding_only_where_every_row_sees_the_same_keys(case, kwargs):
    """is_causal ties a row's keys to its position in the launch, so those calls keep the
    heads apart; so do calls without groups (nothing to fold) and calls with a whole 128-row
    tile of queries per head."""
    kwargs = dict(kwargs)
    hkv, sq = kwargs.pop("hkv", 2), kwargs.pop("sq", 3)
    q, k, v = make_qkv(1, 8, hkv, sq, 40, 16, dtype=F32)
    mask = make_mask(kwargs.pop("attn_mask", None), 1, 8, sq, 40, F32)
    call = attention.attention_kernel_call(q, k, v, mask, enable_gqa=True, **kwargs)
    assert tuple(call.tensors[0].shape) == (1, 8, sq, 16)


@pytest.mark.parametrize("heads", [1, 8], ids=["one mask for every head", "a mask per head"])
def test_a_per_row_mask_folds_with_the_heads(heads):
    """A per-row mask [B, Hm, Sq, Sk] folds with the query heads: row g * Sq + s of kv head
    kv is the mask of query head kv * G + g at position s (Hm = 1: the same rows for each
    head of the group)."""
    b, h, hkv, sq, sk = 2, 8, 2, 3, 40
    q, k, v = make_qkv(b, h, hkv, sq, sk, 16, dtype=F32)
    mask = torch.randn(b, heads, sq, sk)
    call = attention.attention_kernel_call(q, k, v, mask, enable_gqa=True)
    assert tuple(call.tensors[0].shape) == (b, hkv, 4 * sq, 16)
    folded = call.tensors[3]
    assert tuple(folded.shape) == (b, hkv if heads > 1 else 1, 4 * sq, sk)
    for kv in range(hkv):
        for g in range(4):
            for s_ in range(sq):
                want = mask[:, kv * 4 + g if heads > 1 else 0, s_]
                assert torch.equal(folded[:, kv if heads > 1 else 0, g * sq + s_], want)


# ------------------------------------------------------------------------------ autograd, opcheck, compile

@pytest.mark.parametrize("backend", ["reference", "simulator"])
def test_gradients_match_torch(monkeypatch, backend):
    """Backward recomputes attention with PyTorch ops: gradients for q, k, v and a float mask."""
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    q, k, v = make_qkv(2, 4, 2, 7, 9, 16, dtype=F32)
    mask = torch.randn(2, 1, 7, 9)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, mask)]
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v, mask)]
    grad = torch.randn(2, 4, 7, 16)
    sdpa(*leaves[:3], attn_mask=leaves[3], enable_gqa=True).backward(grad)
    F.scaled_dot_product_attention(*ref_leaves[:3], attn_mask=ref_leaves[3], enable_gqa=True).backward(grad)
    for a, b in zip(leaves, ref_leaves):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4)


def test_gradients_of_all_masked_rows_are_finite(reference_backend):
    q, k, v = (t.requires_grad_(True) for t in make_qkv(1, 1, 1, 3, 4, 8, dtype=F32))
    mask = torch.ones(1, 1, 3, 4, dtype=torch.bool)
    mask[..., 1, :] = False
    sdpa(q, k, v, attn_mask=mask).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("args", [
    lambda: (*make_qkv(2, 4, 4, 7, 9, 16, dtype=F32), None, False, 0.25),
    lambda: (*make_qkv(2, 4, 2, 7, 9, 16, dtype=F32, layout="bshd"), torch.randn(2, 1, 7, 9), True, 0.25),
    lambda: (*make_qkv(1, 2, 2, 5, 6, 8, dtype=BF16), torch.rand(5, 6) > 0.3, False, 0.5),
    lambda: (*make_qkv(2, 8, 2, 1, 9, 16, dtype=F32, layout="bshd"), torch.rand(2, 1, 1, 9) > 0.3, False, 0.25),
], ids=["plain", "gqa-bshd-mask-causal", "bool-mask-bf16", "gqa-decode-folded-bshd"])
def test_opcheck(args):
    q, k, v, mask, causal, scale = args()
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    torch.library.opcheck(nki_kernels.registry.get("scaled_dot_product_attention").custom_op,
                          (q, k, v, mask, causal, scale))


def test_compiles_fullgraph():
    q, k, v = make_qkv(2, 4, 4, 7, 9, 16, dtype=F32, layout="bshd")
    compiled = torch.compile(lambda a, b, c: sdpa(a, b, c, is_causal=True) * 2, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q, k, v),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2)
    compiled = torch.compile(lambda a, b, c: sdpa(a, b, c), fullgraph=True)   # inductor
    torch.testing.assert_close(compiled(q, k, v), F.scaled_dot_product_attention(q, k, v))


# ------------------------------------------------------------------------------ bad input

def _q(*shape, dtype=F32):
    return torch.randn(*shape).to(dtype)


def _under_autocast(call):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return call()


BAD = [
    ("batch", lambda: sdpa(_q(2, 2, 4, 8), _q(3, 2, 4, 8), _q(3, 2, 4, 8)), ValueError, ["batch", "(2, 2, 4, 8)", "(3, 2, 4, 8)"]),
    ("head_dim", lambda: sdpa(_q(1, 2, 4, 8), _q(1, 2, 4, 16), _q(1, 2, 4, 8)), ValueError, ["key head_dim 16", "query head_dim 8"]),
    ("head_dim>256", lambda: sdpa(_q(1, 1, 4, 260), _q(1, 1, 4, 260), _q(1, 1, 4, 64)), ValueError, ["260", "256"]),
    ("v_head_dim>256", lambda: sdpa(_q(1, 1, 4, 64), _q(1, 1, 4, 64), _q(1, 1, 4, 257)), ValueError, ["value head_dim=257", "256"]),
    ("keys", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 5, 8), _q(1, 1, 6, 8)), ValueError, ["value has 6 keys", "key has 5"]),
    ("kv_heads", lambda: sdpa(_q(1, 4, 4, 8), _q(1, 2, 4, 8), _q(1, 1, 4, 8)), ValueError, ["value has 1 heads", "key has 2"]),
    ("gqa_flag", lambda: sdpa(_q(1, 4, 4, 8), _q(1, 2, 4, 8), _q(1, 2, 4, 8)), ValueError, ["4 heads", "2", "enable_gqa=True"]),
    ("gqa_multiple", lambda: sdpa(_q(1, 6, 4, 8), _q(1, 4, 4, 8), _q(1, 4, 4, 8), enable_gqa=True), ValueError, ["6", "multiple", "4"]),
    ("ndim", lambda: sdpa(_q(4, 8), _q(4, 8), _q(4, 8)), ValueError, ["query", "at least 3 dims", "(4, 8)"]),
    ("ndim_mismatch", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 4, 8), _q(1, 4, 8)), ValueError, ["same number of dims", "4, 3"]),
    ("head_dim_0", lambda: sdpa(_q(1, 1, 3, 0), _q(1, 1, 4, 0), _q(1, 1, 4, 8)), ValueError, ["query", "head_dim 0", "(1, 1, 3, 0)"]),
    ("gqa_no_kv_heads", lambda: sdpa(_q(1, 2, 4, 8), _q(1, 0, 4, 8), _q(1, 0, 4, 8), enable_gqa=True), ValueError, ["query heads 2", "key/value heads 0"]),
    ("int", lambda: sdpa(torch.ones(1, 1, 4, 8, dtype=torch.int64), _q(1, 1, 4, 8), _q(1, 1, 4, 8)), TypeError, ["query", "int64"]),
    ("mixed", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 4, 8, dtype=BF16), _q(1, 1, 4, 8)), TypeError, ["key", "bfloat16", "float32"]),
    ("float64", lambda: sdpa(*(_q(1, 1, 4, 8).double() for _ in range(3))), TypeError, ["query", "float64"]),
    # autocast leaves float64 alone (as it does for torch's SDPA), so it is refused there too
    ("float64_autocast", lambda: _under_autocast(lambda: sdpa(*(_q(1, 1, 4, 8).double() for _ in range(3)))),
     TypeError, ["query", "float64"]),
    ("mask_5d", lambda: sdpa(_q(1, 2, 4, 8), _q(1, 2, 5, 8), _q(1, 2, 5, 8), attn_mask=torch.ones(1, 1, 2, 4, 5, dtype=torch.bool)),
     ValueError, ["attn_mask", "(1, 1, 2, 4, 5)", "[1, 2, 4, 5]"]),
    ("not_tensor", lambda: sdpa([1.0], _q(1, 1, 4, 8), _q(1, 1, 4, 8)), TypeError, ["query", "list"]),
    ("mask_shape", lambda: sdpa(_q(1, 2, 4, 8), _q(1, 2, 5, 8), _q(1, 2, 5, 8), attn_mask=torch.ones(4, 4, dtype=torch.bool)), ValueError, ["attn_mask", "(4, 4)", "[1, 2, 4, 5]"]),
    ("mask_dtype", lambda: sdpa(_q(1, 1, 4, 8, dtype=BF16), _q(1, 1, 4, 8, dtype=BF16), _q(1, 1, 4, 8, dtype=BF16), attn_mask=torch.zeros(4, 4, dtype=F16)), TypeError, ["attn_mask", "float16", "bfloat16"]),
    ("mask_int", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 4, 8), _q(1, 1, 4, 8), attn_mask=torch.zeros(4, 4, dtype=torch.int64)), TypeError, ["attn_mask", "int64"]),
    ("mask_type", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 4, 8), _q(1, 1, 4, 8), attn_mask=[[True]]), TypeError, ["attn_mask", "list"]),
    ("dropout", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 4, 8), _q(1, 1, 4, 8), dropout_p=0.1), NotImplementedError, ["dropout_p=0.1"]),
    ("dropout_range", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 4, 8), _q(1, 1, 4, 8), dropout_p=1.5), ValueError, ["dropout_p=1.5", "[0, 1]"]),
    ("scale_type", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 4, 8), _q(1, 1, 4, 8), scale="big"), TypeError, ["scale", "str"]),
    ("scale_inf", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 4, 8), _q(1, 1, 4, 8), scale=float("inf")), ValueError, ["scale=inf", "finite"]),
    ("scale_past_fp32", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 4, 8), _q(1, 1, 4, 8), scale=-1e39), ValueError, ["scale=-1e+39", "float32", "3.40282e+38"]),
    ("dropout_type", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 4, 8), _q(1, 1, 4, 8), dropout_p="0"), TypeError, ["dropout_p", "'0'", "str"]),
    ("causal_type", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 4, 8), _q(1, 1, 4, 8), is_causal=1), TypeError, ["is_causal", "1", "int", "Python bool"]),
    ("causal_numpy_bool", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 4, 8), _q(1, 1, 4, 8), is_causal=np.bool_(True)), TypeError, ["is_causal", "True", "numpy.bool", "Python bool"]),
    ("gqa_type", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 4, 8), _q(1, 1, 4, 8), enable_gqa=None), TypeError, ["enable_gqa", "NoneType"]),
    ("device_key", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 4, 8).to("meta"), _q(1, 1, 4, 8)), RuntimeError, ["key", "meta", "query", "cpu"]),
    ("device", lambda: sdpa(_q(1, 1, 4, 8), _q(1, 1, 4, 8), _q(1, 1, 4, 8), attn_mask=torch.ones(4, 4, dtype=torch.bool, device="meta")), RuntimeError, ["attn_mask", "meta", "cpu"]),
]


@pytest.mark.parametrize("bad, error, words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(bad, error, words):
    with pytest.raises(error) as info:
        bad()
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value}"


def test_a_numpy_zero_dropout_is_accepted_as_torch_accepts_it():
    q, k, v = make_qkv(1, 2, 2, 5, 7, 16, dtype=F32)
    out = sdpa(q, k, v, dropout_p=np.float32(0.0))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, dropout_p=np.float32(0.0)),
                               atol=1e-5, rtol=1e-4)


def test_unknown_cpu_backend(monkeypatch):
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "gpu")
    with pytest.raises(ValueError, match="NKI_KERNELS_CPU_BACKEND='gpu'"):
        sdpa(*make_qkv(1, 1, 1, 4, 4, 8))


def test_neuron_tensors_without_toolchain_raise():
    """The neuron path needs AWS's toolchain; here it is absent, and the error says so."""
    call = attention.attention_kernel_call(*make_qkv(1, 1, 1, 4, 4, 8))
    from nki_kernels import _dispatch
    with pytest.raises(RuntimeError, match="torch-neuronx"):
        _dispatch.run_on_neuron(call)


# ------------------------------------------------------------------------------ inf/NaN in masked keys

# Both CPU backends give what F.scaled_dot_product_attention gives when a key that the mask
# excludes holds inf or NaN (torch: NaN in every row of that head, since its score inf/NaN
# plus the mask's -inf is NaN, or its probability 0 times an inf/NaN value is): the kernel
# does, and the reference backend calls torch's own SDPA. Only head 0 holds the special key,
# so head 1 must come out finite and right (a kernel that wrote nothing would leave the
# simulator's NaN poison everywhere and fail there).


_SPECIAL = {"k-inf": ("key", float("inf")), "k-nan": ("key", float("nan")),
            "v-inf": ("value", float("inf")), "v-nan": ("value", float("nan"))}
_SPECIAL_CASES = [
    pytest.param(backend, kind, special, id=f"{backend}-{kind}-{special}")
    for backend in ("reference", "simulator") for kind in ("bool", "float") for special in _SPECIAL]


@pytest.mark.parametrize("backend, kind, special", _SPECIAL_CASES)
def test_masked_key_with_inf_or_nan_gives_what_torch_gives(monkeypatch, backend, kind, special):
    where, value = _SPECIAL[special]
    _check_masked_special_key(monkeypatch, backend, where, value, kind)


@pytest.mark.parametrize("backend", ["reference", "simulator"])
@pytest.mark.parametrize("sk", [5, 15, 16, 40])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_a_query_row_with_inf_or_nan_is_nan_on_both_backends(monkeypatch, backend, sk, dtype):
    # Review, session 68: the reference backend (torch 2.13's CPU SDPA) wrote 0 for a query
    # row holding NaN at fewer than 16 keys (its flash kernel took the NaN row max for a row
    # with every key masked); the kernel, and torch at 16 keys or more, give NaN: its scores
    # are NaN (inf: +-inf, whose max minus itself is NaN). Every other row stays right.
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    q, k, v = make_qkv(1, 2, 2, 6, sk, 16, dtype=dtype)
    q[0, 0, 1, 3] = float("nan")
    q[0, 1, 4, 0] = float("inf")
    keep = torch.ones(6, sk, dtype=torch.bool)
    keep[1] = False                               # the NaN row's keys all masked: NaN still
    for kwargs in ({}, {"is_causal": True}, {"attn_mask": keep}):
        out = sdpa(q, k, v, **kwargs).float()
        bad = torch.zeros(1, 2, 6, dtype=torch.bool)
        bad[0, 0, 1] = bad[0, 1, 4] = True
        assert out[bad].isnan().all(), kwargs
        good_q = q.clone().masked_fill(bad.unsqueeze(-1), 0.0)
        expected = _float64_sdpa(good_q, k, v, **kwargs)
        atol, rtol = TOLERANCES[dtype]
        torch.testing.assert_close(out[~bad], expected[~bad], atol=atol, rtol=rtol)


def _float64_sdpa(q, k, v, attn_mask=None, is_causal=False):
    """Attention in float64 by its definition (softmax(q kᵀ / sqrt(D) + bias) v), a fully
    masked row 0 as the ops give it."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    keep = torch.ones(s.shape[-2:], dtype=torch.bool)
    if is_causal:
        keep = keep.tril()
    if attn_mask is not None:
        keep = keep & attn_mask
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)
    return (p @ v).float()


def _check_masked_special_key(monkeypatch, backend, where, value, kind):
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    q, k, v = make_qkv(1, 2, 2, 5, 7, 16, dtype=F32)
    (k if where == "key" else v)[:, 0, 3] = value
    keep = torch.ones(1, 1, 5, 7, dtype=torch.bool)
    keep[..., 3] = False
    mask = keep if kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    out = sdpa(q, k, v, attn_mask=mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert expected[:, 0].isnan().all() and expected[:, 1].isfinite().all()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4, equal_nan=True)


@pytest.mark.parametrize("backend", ["reference", "simulator"])
def test_where_torch_sdpa_itself_falls_short(monkeypatch, backend):
    """Two inputs torch 2.13's own SDPA gets wrong, pinned to the definition on both
    backends (a reference that calls F.scaled_dot_product_attention must handle them):
    a 1-D [Sk] mask (broadcasts; torch raises IndexError) and scale=0 with is_causal (every
    visible key equally likely; torch returns NaN)."""
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    q, k, v = make_qkv(1, 2, 2, 3, 5, 8, dtype=F32)
    keep = torch.tensor([True, False, True, True, False])
    out = sdpa(q, k, v, attn_mask=keep)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=keep.expand(3, 5))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    # a 0-d mask broadcasts too (it raised IndexError on the reference backend alone, and with
    # is_causal was taken there, review of 2026-12-07): True keeps every key, False none (a
    # row with no key gives 0, as documented), with and without is_causal
    for causal in (False, True):
        plain = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(sdpa(q, k, v, attn_mask=torch.tensor(True), is_causal=causal), plain,
                                   atol=1e-5, rtol=1e-4)
        none = sdpa(q, k, v, attn_mask=torch.tensor(False), is_causal=causal)
        assert torch.equal(none, torch.zeros_like(none))
        shifted = sdpa(q, k, v, attn_mask=torch.tensor(0.75), is_causal=causal)   # softmax ignores a shift
        torch.testing.assert_close(shifted, plain, atol=1e-5, rtol=1e-4)
    out = sdpa(q, k, v, is_causal=True, scale=0.0)
    visible_mean = v.cumsum(-2)[..., :3, :] / torch.arange(1, 4).view(3, 1)
    torch.testing.assert_close(out, visible_mean, atol=1e-5, rtol=1e-4)

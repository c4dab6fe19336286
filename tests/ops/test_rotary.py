"""apply_rotary_pos_emb: the NKI kernel in the simulator vs float64 and vs transformers."""

from __future__ import annotations

import itertools

import pytest
import torch

import nki_kernels
from nki_kernels import references

from ._cases import DTYPE_IDS, DTYPES, ROWS, assert_matches, randn

# hidden size -> (query heads, key heads, head dim): the hidden sizes as heads x D,
# with grouped-query key heads where the head count allows (D = 100: not a power of two).
HEADS = {64: (1, 1, 64), 768: (12, 4, 64), 1000: (10, 5, 100), 4096: (32, 8, 128), 8192: (64, 8, 128)}
LEAN = [  # (positions S, hidden, dtypes)
    (1, 4096, DTYPES),
    (7, 1000, DTYPES),
    (129, 768, DTYPES),
    (1576, 8192, [torch.bfloat16]),   # the largest tested shape (fp32 in sweep)
]
GRID = [pytest.param(s, h, d, id=f"S{s}x{h}-{DTYPE_IDS[DTYPES.index(d)]}") for s, h, ds in LEAN for d in ds]
GRID += [pytest.param(s, h, d, marks=pytest.mark.sweep, id=f"sweep-S{s}x{h}-{i}")
         for s, h in itertools.product(ROWS, HEADS) for d, i in zip(DTYPES, DTYPE_IDS)]


def _cos_sin(batch, seq, dim, dtype, shared=False):
    # genuine rotary tables (cos^2 + sin^2 = 1), positions offset so row 0 is not the identity
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    pos = torch.arange(seq, dtype=torch.float64)[None, :] + 3 + 17 * torch.arange(batch)[:, None]
    freqs = pos[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    return (cos[0], sin[0]) if shared else (cos, sin)


def _expected(q, k, cos, sin):
    return references.apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double(),
                                           compute_dtype=torch.float64)


@pytest.mark.parametrize("seq, hidden, dtype", GRID)
def test_rotary(simulator_backend, seq, hidden, dtype):
    hq, hk, dim = HEADS[hidden]
    q = randn(1, hq, seq, dim, dtype=dtype)
    k = randn(1, hk, seq, dim, dtype=dtype, scale=2.0)
    cos, sin = _cos_sin(1, seq, dim, dtype)
    q_out, k_out = nki_kernels.apply_rotary_pos_emb(q, k, cos, sin)
    q_ref, k_ref = _expected(q, k, cos, sin)
    assert_matches(q_out, q_ref, dtype)
    assert_matches(k_out, k_ref, dtype)


@pytest.mark.parametrize("layout", ["BSD", "SD", "1SD"])
def test_rotary_cos_sin_layouts_and_batch(simulator_backend, layout):
    batch, seq, dim = 2, 130, 64
    q, k = randn(batch, 3, seq, dim), randn(batch, 1, seq, dim)
    cos, sin = _cos_sin(batch, seq, dim, torch.float32, shared=(layout != "BSD"))
    if layout == "1SD":
        cos, sin = cos[None], sin[None]
    q_out, k_out = nki_kernels.apply_rotary_pos_emb(q, k, cos, sin)
    q_ref, k_ref = _expected(q, k, cos, sin)
    assert_matches(q_out, q_ref, torch.float32)
    assert_matches(k_out, k_ref, torch.float32)


def test_rotary_arbitrary_tables_and_noncontiguous_q(simulator_backend):
    # cos/sin halves that differ (not cat(freqs, freqs)) catch a swapped half; q as the
    # transposed view transformers' attention produces
    q = randn(2, 9, 4, 32).transpose(1, 2)      # [B, H, S, D] view of [B, S, H, D]
    k = randn(2, 4, 9, 32)
    cos, sin = randn(2, 9, 32), randn(2, 9, 32)
    q_out, k_out = nki_kernels.apply_rotary_pos_emb(q, k, cos, sin)
    q_ref, k_ref = _expected(q, k, cos, sin)
    assert_matches(q_out, q_ref, torch.float32)
    assert_matches(k_out, k_ref, torch.float32)


@pytest.mark.parametrize("dim", [768, 1026])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rotary_wide_heads(simulator_backend, dim, dtype):
    # D > 512: a head does not fit a PSUM bank, so no PSUM tables; the VectorE path reads
    # cos from SBUF broadcast over the group's heads (mutation testing found that read
    # swapped for the signed sin unnoticed: every other test has D <= 128). D = 1026: a
    # half of 513, not a multiple of anything.
    q, k = randn(2, 4, 9, dim, dtype=dtype), randn(2, 2, 9, dim, dtype=dtype, scale=2.0)
    cos, sin = _cos_sin(2, 9, dim, dtype)
    q_out, k_out = nki_kernels.apply_rotary_pos_emb(q, k, cos, sin)
    q_ref, k_ref = _expected(q, k, cos, sin)
    assert_matches(q_out, q_ref, dtype)
    assert_matches(k_out, k_ref, dtype)


def test_rotary_matches_transformers(simulator_backend):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_rope

    q, k = randn(2, 8, 33, 64), randn(2, 2, 33, 64)
    cos, sin = _cos_sin(2, 33, 64, torch.float32)
    ours = nki_kernels.apply_rotary_pos_emb(q, k, cos, sin)
    theirs = hf_rope(q, k, cos, sin)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_rotary_backward_matches_torch(simulator_backend):
    q, k = randn(1, 2, 5, 16).requires_grad_(True), randn(1, 1, 5, 16).requires_grad_(True)
    cos, sin = [t.requires_grad_(True) for t in _cos_sin(1, 5, 16, torch.float32)]
    leaves = [q, k, cos, sin]
    ref = [t.detach().clone().requires_grad_(True) for t in leaves]
    gq, gk = torch.randn(1, 2, 5, 16), torch.randn(1, 1, 5, 16)
    q_out, k_out = nki_kernels.apply_rotary_pos_emb(*leaves)
    ((q_out * gq).sum() + (k_out * gk).sum()).backward()
    rq, rk = references.apply_rotary_pos_emb(*ref)
    ((rq * gq).sum() + (rk * gk).sum()).backward()
    for a, b in zip(leaves, ref):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", ["reference", "simulator"])
@pytest.mark.parametrize("empty", ["k", "q"])
def test_rotary_with_zero_heads_in_one_tensor(monkeypatch, backend, empty):
    # Issue 13, defect 3: with zero heads in k (or q) the op returned torch.empty_like for
    # BOTH outputs on both backends: the other tensor's result was uninitialised memory.
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    q, k = randn(2, 3, 9, 16), randn(2, 2, 9, 16)
    if empty == "k":
        k = k[:, :0]
    else:
        q = q[:, :0]
    cos, sin = _cos_sin(2, 9, 16, torch.float32)
    q_out, k_out = nki_kernels.apply_rotary_pos_emb(q, k, cos, sin)
    q_ref, k_ref = _expected(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    full_out, full_ref = (q_out, q_ref) if empty == "k" else (k_out, k_ref)
    assert_matches(full_out, full_ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_rotary_16bit_rounds_once_like_the_reference(simulator_backend, dtype):
    # Issue 13, defect 6: 16-bit inputs kept x*cos and rotate_half(x)*sin in the input dtype
    # (three roundings: one bf16 ulp off on some elements, and fp16 products overflowing
    # where the result does not). Now fp32 products and one rounding, as the reference:
    # the kernel equals the fp32-math reference bit for bit.
    q, k = randn(2, 5, 131, 64, dtype=dtype, scale=3.0), randn(2, 1, 131, 64, dtype=dtype)
    cos, sin = randn(2, 131, 64, dtype=dtype), randn(2, 131, 64, dtype=dtype)   # any tables
    for got, want in zip(nki_kernels.apply_rotary_pos_emb(q, k, cos, sin),
                         references.apply_rotary_pos_emb(q, k, cos, sin)):
        assert torch.equal(got, want)
    # fp16 overflow of a product: x_lo * cos = 90000 > 65504, but the result is 50000
    q = torch.empty(1, 1, 3, 8, dtype=dtype)
    q[..., :4], q[..., 4:] = 60000.0, 40000.0
    cos = torch.full((3, 8), 1.5, dtype=dtype)
    sin = torch.cat([torch.full((3, 4), 1.0), torch.full((3, 4), -0.5)], -1).to(dtype)
    q_out, _ = nki_kernels.apply_rotary_pos_emb(q, q.clone(), cos, sin)
    q_ref, _ = _expected(q, q, cos, sin)
    assert torch.isfinite(q_out).all()
    assert_matches(q_out, q_ref, dtype)


@pytest.mark.parametrize("q_dtype, table_dtype, out_dtype", [
    (torch.bfloat16, torch.float32, torch.float32),    # fp32 model under torch.autocast(bf16)
    (torch.float16, torch.bfloat16, torch.float32),    # torch promotes fp16 x bf16 to fp32
    (torch.float32, torch.bfloat16, torch.float32),
], ids=["bf16-q-fp32-tables", "fp16-q-bf16-tables", "fp32-q-bf16-tables"])
def test_rotary_mixed_dtypes_promote_like_transformers(simulator_backend, q_dtype, table_dtype, out_dtype):
    # transformers' q * cos + rotate_half(q) * sin promotes: the review found the op refusing
    # a bf16 q with fp32 cos/sin, so a Llama under torch.autocast crashed once kernelized.
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as eager_rope

    q = randn(2, 4, 37, 64, dtype=q_dtype, scale=3.0).requires_grad_()
    k = randn(2, 2, 37, 64, dtype=q_dtype)
    cos, sin = _cos_sin(2, 37, 64, table_dtype)
    q_eager_in = q.detach().clone().requires_grad_()
    q_out, k_out = nki_kernels.apply_rotary_pos_emb(q, k, cos, sin)
    q_eager, k_eager = eager_rope(q_eager_in, k, cos, sin)
    assert q_out.dtype == k_out.dtype == q_eager.dtype == k_eager.dtype == out_dtype
    q_ref, k_ref = _expected(q.detach(), k, cos, sin)   # the widened inputs, float64 math
    assert_matches(q_out.detach(), q_ref, out_dtype)
    assert_matches(k_out.detach(), k_ref, out_dtype)
    weight = randn(*q_out.shape, dtype=out_dtype)       # a non-uniform upstream gradient
    (q_out * weight).sum().backward()
    (q_eager * weight).sum().backward()
    assert q.grad.dtype == q_dtype
    assert_matches(q.grad, q_eager_in.grad.double(), q_dtype)


@pytest.mark.parametrize("seq, dim, dtype, shared, units", [(700, 128, torch.bfloat16, False, 3),
                                                           (1100, 64, torch.float32, True, 2)],
                         ids=["S700-D128-bf16", "S1100-D64-fp32-shared-cos"])
def test_rotary_one_head_tensors_take_blocks_of_position_tiles(simulator_backend, seq, dim, dtype, shared, units):
    # q and k of one head each: a work unit is a block of position tiles (D = 128: 4 tiles,
    # D = 64: 8, a PSUM bank of fp32 tables), then the rest one tile at a time, so one
    # transfer carries a block's positions: 700 = 4 x 128 | 128 | 60 and 1100 = 8 x 128 | 76
    # are ``units`` units per sequence (6 and 9 with one tile each)
    from nki_kernels import _dispatch, registry, simulator

    batch = 2
    q, k = randn(batch, 1, seq, dim, dtype=dtype), randn(batch, 1, seq, dim, dtype=dtype, scale=2.0)
    cos, sin = _cos_sin(batch, seq, dim, dtype, shared=shared)
    q_out, k_out = nki_kernels.apply_rotary_pos_emb(q, k, cos, sin)
    q_ref, k_ref = _expected(q, k, cos, sin)
    assert_matches(q_out, q_ref, dtype)
    assert_matches(k_out, k_ref, dtype)
    call = registry.get("apply_rotary_pos_emb").kernel_call(q, k, cos, sin)
    runs = [simulator.run(_dispatch.simulator_kernel(call)[lnc], *[t.contiguous() for t in call.tensors],
                          **call.static) for lnc in (1, 2)]
    for a, b in zip(runs[0].outputs, runs[1].outputs):
        assert torch.equal(a, b), "LNC=2 differs from LNC=1"
    # six transfers per unit: cos, sin, q and k in; q and k out
    dmas = sum(1 for ins in runs[0].trace if ins.op == "dma_copy")
    assert dmas == 6 * batch * units


"""Attention backward (kernels/attention_bwd.py, issue 15): gradients of
``nki_kernels.scaled_dot_product_attention`` against float64 autograd on both CPU backends,
the backward kernel's multi-chunk path, LNC=1 vs LNC=2, the LNC=2 write split, the wiring
(which op runs with and without grad, opcheck with gradients, torch.compile through forward
and backward) and the errors.

Tolerances per dtype: tests/ops/_attention_cases.py GRAD_REL_ERROR / GRAD_MAX_ERROR (why: there).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import nki_kernels
from nki_kernels import _dispatch, _kernel_sources, references, simulator
from nki_kernels.ops import attention
from nki_kernels.simulator.hardware import get_target
from tests._helpers import rel_error
from tests.ops._attention_cases import check_grads as _check_grads
from tests.ops._attention_cases import make_mask, make_qkv

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32

# (B, H, Hkv, Sq, Sk, D, Dv, dtype, layout, mask, causal)
FAST = [
    (1, 2, 2, 197, 197, 64, 64, BF16, "bshd", None, False),          # ViT tokens, transformers layout
    (2, 3, 3, 129, 129, 72, 72, F32, "bhsd", None, False),           # 128 + 1 tails, SigLIP head dim
    (1, 4, 2, 5, 257, 80, 80, BF16, "bshd", "key_bool", False),      # GQA, Sq != Sk, key padding
    (2, 2, 1, 300, 129, 96, 64, F16, "bhsd", "full_float", True),    # Sq > Sk, causal + bias, Dv != D
    (1, 1, 1, 127, 600, 64, 64, F32, "bhsd", None, True),            # causal, Sq < Sk: keys no row sees
    (1, 2, 2, 33, 40, 64, 64, BF16, "bhsd", "bool_2d", False),       # [Sq, Sk] boolean mask
    (2, 2, 2, 20, 70, 64, 64, BF16, "bhsd", "finfo_min", False),     # transformers' finfo.min mask
    (1, 2, 1, 70, 300, 200, 160, F32, "bhsd", "key_float", True),    # D > 128 in pieces, -inf keys, GQA
    (1, 2, 2, 129, 197, 256, 256, BF16, "bhsd", None, False),        # the largest head dims
    (1, 8, 2, 300, 300, 128, 128, BF16, "bhsd", None, True),         # Llama-like: GQA 4, causal
    (1, 4, 1, 600, 600, 64, 64, BF16, "bhsd", None, True),           # 5 query tiles: loads in groups
    (2, 2, 2, 1, 1, 64, 64, BF16, "bhsd", None, False),              # one query, one key
]


def _id(case):
    b, h, hkv, sq, sk, d, dv, dtype, layout, mask, causal = case
    return (f"B{b}-H{h}/{hkv}-Sq{sq}-Sk{sk}-D{d}" + (f"-Dv{dv}" if dv != d else "") +
            f"-{str(dtype)[6:]}-{layout}" + (f"-{mask}" if mask else "") + ("-causal" if causal else ""))


def _float64_grads(q, k, v, mask, causal, grad_out, scale=None):
    """dq, dk, dv by float64 autograd of torch's SDPA (references.py); a float mask in float64."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    m = mask.double() if mask is not None and mask.is_floating_point() else mask
    out = references.scaled_dot_product_attention(*leaves, attn_mask=m, is_causal=causal, scale=scale,
                                                  enable_gqa=q.shape[-3] != k.shape[-3],
                                                  compute_dtype=torch.float64)
    out.backward(grad_out.double())
    return [t.grad for t in leaves]


def _grad_case(case, scale=None):
    b, h, hkv, sq, sk, d, dv, dtype, layout, mask_kind, causal = case
    q, k, v = make_qkv(b, h, hkv, sq, sk, d, dv, dtype, layout)
    for t in (q, k, v):
        t.requires_grad_()
    mask = make_mask(mask_kind, b, h, sq, sk, dtype)
    out = nki_kernels.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                                   enable_gqa=h != hkv)
    grad_out = torch.randn(out.shape).to(dtype)
    out.backward(grad_out)
    want = _float64_grads(q, k, v, mask, causal, grad_out, scale)
    if sk == 1 and mask is None:
        # softmax over one key is 1 whatever the score, so dq and dk are exactly 0 and a
        # relative error has no scale; the kernel's are what dS = P (dP - D) keeps of two fp32
        # sums of D terms (dO . v and dO . O, O = v): each within D * 2**-24 of its terms
        # (the simulator's matmul and VectorE sum them in other orders)
        s = scale if scale is not None else 1 / math.sqrt(d)
        residue = 2 * d * 2.0 ** -24 * float(grad_out.abs().max() * v.abs().max()) * s
        assert float(q.grad.abs().max()) <= residue * float(k.abs().max()), "dq is not 0"
        assert float(k.grad.abs().max()) <= residue * float(q.abs().max()), "dk is not 0"
        _check_grads([v.grad], want[2:], dtype, names="v")
        return
    _check_grads([q.grad, k.grad, v.grad], want, dtype)


@pytest.mark.parametrize("case", FAST, ids=_id)
def test_gradients_match_float64_simulator(simulator_backend, case):
    _grad_case(case)


@pytest.mark.parametrize("case", FAST[::3], ids=_id)
def test_gradients_match_float64_reference(reference_backend, case):
    _grad_case(case)


@pytest.mark.parametrize("scale", [0.3, -0.2])
def test_gradients_custom_scale(simulator_backend, scale):
    _grad_case((1, 2, 2, 40, 50, 64, 64, F32, "bhsd", None, True), scale=scale)


def test_all_masked_rows_have_zero_gradients(simulator_backend):
    """A query row with every key masked returns 0 and passes no gradient (as SDPA)."""
    q, k, v = make_qkv(2, 2, 2, 6, 70, 64, dtype=F32)
    for t in (q, k, v):
        t.requires_grad_()
    mask = torch.rand(2, 1, 1, 70) > 0.5
    mask[1] = False                                           # batch 1: every key padded
    mask[0, ..., 0] = True
    out = nki_kernels.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    grad_out = torch.randn(out.shape)
    out.backward(grad_out)
    assert (q.grad[1] == 0).all() and (k.grad[1] == 0).all() and (v.grad[1] == 0).all()
    _check_grads([q.grad, k.grad, v.grad], _float64_grads(q, k, v, mask, False, grad_out), F32)


SWEEP = [(b, h, hkv, sq, sk, d, d, dtype, "bhsd", mask, causal)
         for (b, h, hkv) in [(2, 8, 2), (1, 12, 12)]
         for (sq, sk) in [(197, 197), (129, 1025), (1025, 129), (577, 2049)]
         for d in (64, 128) for dtype in (BF16, F32)
         for mask, causal in [(None, False), (None, True), ("key_bool", False), ("full_float", True)]]


@pytest.mark.sweep
@pytest.mark.parametrize("case", SWEEP, ids=_id)
def test_gradients_sweep(simulator_backend, case):
    _grad_case(case)


# ------------------------------------------------------------------------------ the kernel itself

def _saved(b, h, hkv, sq, sk, d, dv, dtype, mask_kind=None, causal=False):
    """Inputs of the backward op as the forward saves them (out, lse from the forward kernel)."""
    q, k, v = make_qkv(b, h, hkv, sq, sk, d, dv, dtype)
    mask = make_mask(mask_kind, b, h, sq, sk, dtype)
    call = attention.attention_lse_kernel_call(q, k, v, mask, causal, d ** -0.5)
    out, lse = _dispatch.run_simulated(call)
    grad_out = torch.randn(out.shape).to(dtype)
    return (grad_out, q, k, v, out, lse), mask


def _run_backward(args, mask, causal, lnc, **extra):
    call = attention.attention_backward_kernel_call(*args, attn_mask=mask, is_causal=causal,
                                                    scale=args[1].shape[-1] ** -0.5)
    kernel = _dispatch.simulator_kernel(call)[lnc]
    res = simulator.run(kernel, *call.tensors, target="trn2", **call.static, **extra)
    return call.finish_outputs(res.outputs), res


@pytest.mark.parametrize("case, chunk", [
    ((1, 2, 1, 300, 700, 64, 64, F32, "key_float", True), 1),     # causal: blocks first seen in chunk 2
    ((2, 3, 3, 300, 700, 64, 64, BF16, None, False), 2),          # two chunks, 512-key blocks
    ((1, 2, 1, 200, 700, 128, 160, F32, None, True), 1),           # 256-key blocks, keys no row sees
    ((1, 4, 1, 1100, 700, 64, 64, BF16, "key_bool", False), 6),    # chunks of 6 tiles loaded in groups
], ids=["causal-chunks-of-1", "bf16-chunks-of-2", "wide-causal", "grouped-loads"])
def test_multi_chunk_path_matches_float64(case, chunk):
    """Several query chunks: dK | dV partial sums through the fp32 HBM scratch."""
    b, h, hkv, sq, sk, d, dv, dtype, mask_kind, causal = case
    args, mask = _saved(b, h, hkv, sq, sk, d, dv, dtype, mask_kind, causal)
    grads, _ = _run_backward(args, mask, causal, 2, q_chunk=chunk)
    grad_out, q, k, v, _, _ = args
    _check_grads(grads, _float64_grads(q, k, v, mask, causal, grad_out), dtype)


@pytest.mark.parametrize("case", [
    (3, 4, 1, 197, 197, 64, 64, BF16, None, False),      # 3 (batch, kv head) pairs: odd split
    (1, 3, 1, 130, 260, 72, 72, F32, "key_bool", True),  # 1 pair: the second core idles
    (2, 8, 2, 129, 300, 128, 128, BF16, None, True),     # GQA 4, 4 pairs
], ids=["odd-pairs", "one-pair", "gqa"])
def test_lnc1_and_lnc2_identical(case):
    b, h, hkv, sq, sk, d, dv, dtype, mask_kind, causal = case
    args, mask = _saved(b, h, hkv, sq, sk, d, dv, dtype, mask_kind, causal)
    one, _ = _run_backward(args, mask, causal, 1)
    two, _ = _run_backward(args, mask, causal, 2)
    for a, b_ in zip(one, two):
        assert torch.equal(a, b_)


def _footprint(op):
    """Element offsets an HBM operand covers in its allocation."""
    idx = np.array([op.offset])
    for n, s in zip(op.shape, op.strides):
        idx = (idx[:, None] + np.arange(n)[None, :] * s).reshape(-1)
    return set(idx.tolist())


def test_lnc2_cores_write_disjoint_elements():
    """Race check: at LNC=2 no HBM element (of the inputs, dq, dk, dv or the chunks' fp32
    scratch) is written by one core and read or written by the other (the two programs'
    HBM tensors are the same allocations: trace operands share their alloc_id)."""
    args, mask = _saved(2, 4, 2, 200, 330, 64, 48, F32, None, True)
    _, res = _run_backward(args, mask, True, 2, q_chunk=1)
    written = {0: {}, 1: {}}
    read = {0: {}, 1: {}}
    for ins in res.trace:
        if ins.engine != "dma":
            continue
        core = ins.attrs.get("core")
        for ops, into in ((ins.writes, written), (ins.reads, read)):
            for op in ops:
                if op.buffer == "hbm":
                    into[core].setdefault(op.alloc_id, set()).update(_footprint(op))
    assert written[0] and written[1], "both cores write"
    for alloc in set(written[0]) | set(written[1]):
        w0, w1 = written[0].get(alloc, set()), written[1].get(alloc, set())
        assert not (w0 & w1), f"allocation {alloc}: elements written by both cores"
        assert not (w0 & read[1].get(alloc, set())) and not (w1 & read[0].get(alloc, set())), \
            f"allocation {alloc}: an element one core writes is read by the other"


def _transposes_hold_queues_twice_their_data(nu, r, m, itemsize):
    """Whether a head batch's dSᵀ DMA transposes (nu heads, r rows, m keys: one transfer for
    the full 128-key tiles, one for a tail) would hold the DMA queues more than twice as
    long as their data takes on trn2 (occupancy max(gap, data + hand-over) per transfer)."""
    t = get_target("trn2")
    data = [nu * r * keys * itemsize / (t.dma_bytes_per_s * t.dma_transpose_sbuf_efficiency)
            for keys in (m // 128 * 128, m % 128) if keys]
    return 2 * sum(data) < sum(max(t.dma_transfer_gap_s, x + t.dma_transfer_handoff_s) for x in data)


@pytest.mark.parametrize("case, expect", [
    # one query head per head batch (multi-head, D + Dv <= 256: 512-key blocks, one kv head's
    # dK | dV fill the accumulator banks): [128, 512] bf16 per transpose, 0.71 us of data
    # on trn2 against the 0.85 us DMA gap
    ((1, 4, 4, 300, 600, 72, 72, BF16, None, False), "share"),
    # GQA 4: four heads per batch, [128, 4, 512] bf16, data-bound: every dSᵀ by DMA
    ((1, 8, 2, 300, 600, 128, 128, BF16, None, True), "all"),
    # fp16 with a key mask, one head per batch; the 188-key block's two transfers are gap-bound
    ((1, 2, 2, 130, 700, 72, 72, F16, "key_bool", False), "share"),
    # folded mode (bf16, no mask, D = 64), three 256-key blocks: [128, 4, 256] per batch,
    # data-bound: every dSᵀ by DMA
    ((1, 4, 4, 300, 600, 64, 64, BF16, None, False), "all"),
    # folded mode with one key block (ViT-like): every dSᵀ by TensorE
    ((2, 4, 4, 197, 197, 64, 64, BF16, None, False), "none"),
], ids=["mha-gap-bound", "gqa-data-bound", "fp16-masked-gap-bound", "folded-blocks", "folded-one-block"])
def test_dst_transposes_split_by_transfer_size(case, expect):
    """dSᵀ by SBUF->SBUF DMA transposes or by TensorE transposes + a PSUM copy
    (attention_bwd_plan: _dst_dma_share, BwdBalance.use_dma): every head batch by DMA where
    one batch's transposes over a full key block are data-bound; else half of the batches
    whose transposes hold the queues at most twice their data time, spread by a credit
    (so ceil(k / 2) of a core's k), and none of the others; none in folded mode with one
    key block. Launches mixing both paths give the float64 gradients like the others."""
    b, h, hkv, sq, sk, d, dv, dtype, mask_kind, causal = case
    args, mask = _saved(b, h, hkv, sq, sk, d, dv, dtype, mask_kind, causal)
    grads, res = _run_backward(args, mask, causal, 2)
    grad_out, q, k, v, _, _ = args
    _check_grads(grads, _float64_grads(q, k, v, mask, causal, grad_out), dtype)
    by_tensor = [ins for ins in res.trace if ins.op == "nc_transpose" and ins.engine == "tensor"]
    # (folded mode's three -lse / -D_i rows also arrive by SBUF->SBUF DMA transposes, onto
    # 3 partitions; dSᵀ transposes write a key tile's rows)
    by_dma = [ins for ins in res.trace if ins.op == "dma_transpose"
              and all(o.buffer == "sbuf" for o in ins.reads) and ins.writes[0].shape[0] > 3]
    if expect == "all":
        assert by_dma and not by_tensor
        return
    if expect == "none":
        assert by_tensor and not by_dma
        return
    assert by_dma and by_tensor
    itemsize = torch.finfo(dtype).bits // 8
    # a DMA batch's transposes write one dSᵀ tile: group them, and check each batch is one
    # the rule sends to the DMA (src [r, heads, tiles, 128] or [r, heads, tail keys])
    batches = {}
    for ins in by_dma:
        src = ins.reads[0].shape
        key = (ins.attrs["core"], ins.writes[0].alloc_id)
        r, nu, keys = src[0], src[1], math.prod(src[2:])
        prev = batches.get(key, (r, nu, 0))
        batches[key] = (r, nu, prev[2] + keys)
    for r, nu, m in batches.values():
        assert not _transposes_hold_queues_twice_their_data(nu, r, m, itemsize), (r, nu, m)
    # expected per core: its (batch, head) pairs (one head per batch here) x query tiles x
    # 512-key blocks; the cores take equal halves of the pairs
    pairs_per_core = b * h // 2
    rows = [min(128, sq - t) for t in range(0, sq, 128)]
    blocks = [min(512, sk - k0) for k0 in range(0, sk, 512)]
    efficient = pairs_per_core * sum(not _transposes_hold_queues_twice_their_data(1, r, m, itemsize)
                                     for r in rows for m in blocks)
    assert len(batches) == 2 * -(-efficient // 2)
    # TensorE batches: one 16-bit dSᵀ copy out of PSUM each (every other PSUM tile is fp32)
    copies = [ins for ins in res.trace if ins.engine in ("vector", "scalar")
              and any(o.buffer == "psum" and o.dtype in ("bfloat16", "float16") for o in ins.reads)]
    assert len(copies) == 2 * pairs_per_core * len(rows) * len(blocks) - len(batches)


# ------------------------------------------------------------------------------ wiring

def test_no_grad_forward_saves_nothing(simulator_backend, monkeypatch):
    """Without grad the plain op runs (no lse, no backward state); with grad the lse op."""
    seen = []
    real = _dispatch.run_simulated
    monkeypatch.setattr(_dispatch, "run_simulated", lambda call, lnc=None: seen.append(call.static) or real(call, lnc))
    q, k, v = make_qkv(1, 2, 2, 20, 30, 64, dtype=F32)
    with torch.no_grad():
        nki_kernels.scaled_dot_product_attention(q.requires_grad_(), k, v)
    nki_kernels.scaled_dot_product_attention(q.detach(), k, v)
    assert all("return_lse" not in s for s in seen) and len(seen) == 2
    nki_kernels.scaled_dot_product_attention(q.detach().requires_grad_(), k, v)
    assert seen[-1].get("return_lse") is True


def test_mask_requiring_grad_takes_the_recompute_backward(simulator_backend):
    q, k, v = make_qkv(1, 2, 2, 20, 30, 64, dtype=F32)
    mask = torch.randn(1, 2, 20, 30, requires_grad=True)
    q.requires_grad_()
    out = nki_kernels.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.sum().backward()
    assert mask.grad is not None and q.grad is not None
    leaves = [t.detach().double().requires_grad_() for t in (q, mask)]
    ref = references.scaled_dot_product_attention(leaves[0], k.double(), v.double(), attn_mask=leaves[1],
                                                  compute_dtype=torch.float64)
    ref.sum().backward()
    assert rel_error(q.grad, leaves[0].grad) < 1e-5 and rel_error(mask.grad, leaves[1].grad) < 1e-5


def _opcheck_args(dtype=F32):
    q, k, v = make_qkv(1, 4, 2, 19, 23, 16, dtype=dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    mask = make_mask("key_bool", 1, 4, 19, 23, dtype)
    return q, k, v, mask


@pytest.mark.parametrize("backend", ["reference_backend", "simulator_backend"])
def test_opcheck_lse_and_backward_ops(request, backend):
    request.getfixturevalue(backend)
    q, k, v, mask = _opcheck_args()
    torch.library.opcheck(attention._sdpa_lse_op, (q, k, v, mask, False, 0.25))
    torch.library.opcheck(attention._sdpa_lse_op, (q, k, v, None, True, 0.25))
    out, lse = attention._sdpa_lse_op(q.detach(), k.detach(), v.detach(), None, True, 0.25)
    grad_out = torch.randn(out.shape)
    torch.library.opcheck(attention._sdpa_backward_op, (grad_out, q.detach(), k.detach(), v.detach(), out, lse,
                                                        None, True, 0.25))


@pytest.mark.parametrize("backend", ["reference_backend", "simulator_backend"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_saved_lse_is_the_rows_logsumexp(request, backend, causal):
    # the forward's second output (what the backward reads): logsumexp over the keys a row
    # attends, float64 reference; a review's mutant dropping the causal mask from the
    # reference backend's lse passed every test (the backward there recomputes)
    request.getfixturevalue(backend)
    q, k, v = make_qkv(1, 4, 2, 19, 23, 16, dtype=F32)
    mask = make_mask("key_bool", 1, 4, 19, 23, F32)
    _, lse = attention._sdpa_lse_op(q, k, v, mask, causal, 0.25)
    s = (q.double() @ k.double().repeat_interleave(2, dim=1).transpose(-1, -2)) * 0.25
    keep = mask.expand(1, 4, 19, 23)
    if causal:
        keep = keep & torch.ones(19, 23, dtype=torch.bool).tril()
    expected = torch.logsumexp(s.masked_fill(~keep, float("-inf")), dim=-1)
    torch.testing.assert_close(lse.double(), expected, atol=1e-5, rtol=1e-5)


def test_compile_fullgraph_forward_and_backward(simulator_backend):
    def step(q, k, v):
        return nki_kernels.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).square().sum()

    q, k, v = make_qkv(1, 4, 2, 40, 40, 32, dtype=F32)
    eager_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    compiled(*leaves).backward()
    step(*eager_leaves).backward()
    for a, b in zip(leaves, eager_leaves):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)


def test_dropout_stays_an_error_with_grad(simulator_backend):
    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, dtype=F32)
    with pytest.raises(NotImplementedError, match=r"dropout_p=0.1: the NKI attention kernel has no dropout"):
        nki_kernels.scaled_dot_product_attention(q.requires_grad_(), k, v, dropout_p=0.1)


def test_kernel_rejects_mismatched_saved_tensors():
    """The backward kernel names the argument, its shape and the expected one."""
    args, _ = _saved(1, 2, 2, 10, 12, 16, 16, F32)
    grad_out, q, k, v, out, lse = args
    with simulator.activated():
        kernel = _kernel_sources.load("attention_bwd", "simulator").attention_bwd_kernel
    with pytest.raises(AssertionError, match=r"lse .*expected \(1, 2, 10\)"):
        simulator.run(kernel[1], q, k, v, out, grad_out, lse[:, :, :9].contiguous(), scale=0.25)
    with pytest.raises(AssertionError, match=r"do .*expected \(1, 2, 10, 16\)"):
        simulator.run(kernel[1], q, k, v, out, grad_out[:, :, :9].contiguous(), lse, scale=0.25)


def test_empty_inputs_give_zero_gradients(simulator_backend):
    q, k, v = make_qkv(1, 2, 2, 5, 0, 16, dtype=F32)
    q.requires_grad_()
    v.requires_grad_()
    out = nki_kernels.scaled_dot_product_attention(q, k, v)
    out.sum().backward()
    assert (q.grad == 0).all() and v.grad.shape == v.shape


@pytest.mark.parametrize("causal", [False, True], ids=["folded", "causal-select"])
def test_large_logits_stay_finite(simulator_backend, causal):
    """Scaled logits of ~±50: the folded mode's -lse/scale triple is exact, and the causal
    diagonal's exp of masked columns (which can overflow) is replaced by 0, not multiplied."""
    q, k, v = make_qkv(1, 4, 4, 150, 150, 64, dtype=BF16)
    q, k = (q.float() * 4).to(BF16), (k.float() * 4).to(BF16)
    for t in (q, k, v):
        t.requires_grad_()
    out = nki_kernels.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grad_out = torch.randn(out.shape).to(BF16)
    out.backward(grad_out)
    want = _float64_grads(q, k, v, None, causal, grad_out)
    # the module's bf16 bounds, as at ordinary logits (measured ~6.7e-3 relative, as torch's
    # own bf16 SDPA backward gives: the peaked rows cost no extra accuracy)
    for g in (q.grad, k.grad, v.grad):
        assert torch.isfinite(g).all()
    _check_grads([q.grad, k.grad, v.grad], want, BF16)


@pytest.mark.sweep
@pytest.mark.parametrize("case", [
    (1, 16, 4, 2048, 2048, 128, 128, BF16, None, True),      # the main job's Llama shape x2 heads
    (1, 16, 4, 1025, 2049, 256, 256, F32, None, True),       # largest head dims, fp32
    (1, 4, 4, 4096, 4096, 128, 128, BF16, None, True),       # several query chunks per unit
    (1, 2, 2, 1000, 3000, 256, 256, BF16, "full_float", False),
], ids=lambda c: "-".join(str(x) for x in c[:7]) + f"-{str(c[7])[6:]}-{c[8]}-{c[9]}")
def test_large_shapes_fit_trn2_and_match(case):
    """The simulator raises CapacityError past trn2's SBUF / PSUM; peaks stay within them."""
    b, h, hkv, sq, sk, d, dv, dtype, mask_kind, causal = case
    args, mask = _saved(b, h, hkv, sq, sk, d, dv, dtype, mask_kind, causal)
    grads, res = _run_backward(args, mask, causal, 2)
    trn2 = get_target("trn2")
    assert res.peak_sbuf_bytes_per_partition <= trn2.sbuf_bytes_per_partition
    assert res.peak_psum_banks <= trn2.psum_banks
    grad_out, q, k, v, _, _ = args
    _check_grads(grads, _float64_grads(q, k, v, mask, causal, grad_out), dtype)


def test_tiny_vit_training_step_runs_the_backward_kernel(simulator_backend, monkeypatch, restored_attention_registries):
    """A tiny ViT fine-tuning step (train mode, attn_implementation="nki", simulator): loss
    and every parameter gradient as with "sdpa", and the attention backward kernel ran
    (once per layer). fp32: tolerances of tests/integration/test_transformers.py."""
    from nki_kernels import transformers as nkt
    from tests.integration._models import VISION, build, perturb_norms, pixels

    nkt.register()
    kernels = []
    real = _dispatch.run_simulated
    monkeypatch.setattr(_dispatch, "run_simulated",
                        lambda call, lnc=None: kernels.append(call.kernel) or real(call, lnc))
    reference = build(VISION["vit"], "sdpa")
    perturb_norms(reference)
    model = build(VISION["vit"], "sdpa")
    model.load_state_dict(reference.state_dict())
    model.set_attn_implementation("nki")
    images, target = pixels(), torch.randn(2, 26, 128)
    losses = []
    for m in (reference, model):
        m.train()
        loss = (m(pixel_values=images).last_hidden_state - target).square().mean()
        loss.backward()
        losses.append(loss)
    assert kernels.count("attention_bwd_kernel") == 2
    torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=1e-4)
    grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        # a parameter left without a gradient on one side only is a failure, not a skip
        assert (param.grad is None) == (grads[name].grad is None), name
        if param.grad is not None:
            torch.testing.assert_close(param.grad, grads[name].grad, atol=1e-5, rtol=1e-3, msg=name)


def test_the_ds_choice_prices_the_vector_way_as_the_cost_model_does():
    """BwdBalance.pick_ds charges VectorE's dS = (dP - D_i) ⊙ P (one scalar_tensor_tensor
    with dP in PSUM) what the cost model charges that instruction: one pass of its m columns
    and the fixed cost. Until session 61 it charged two passes, so the planner sent dS to
    ScalarE + GpSimd more often than the model's figures say pays (modeled trn2 LNC=2:
    SigLIP's backward 250.4 -> 239.1 us, Llama S=2048 causal 230.7 -> 214.3), with the same
    gradients either way."""
    from types import SimpleNamespace

    from nki_kernels.simulator.cost.model import compute_cost

    plan_mod = _kernel_sources.load("attention_bwd_plan", "simulator")
    args, mask = _saved(1, 8, 8, 200, 700, 72, 72, BF16)          # D = 72: not folded, dS by _ds
    grads, res = _run_backward(args, mask, False, 2)
    grad_out, q, k, v, _, _ = args
    _check_grads(grads, _float64_grads(q, k, v, mask, False, grad_out), BF16)
    on_vector = [ins for ins in res.trace if ins.op == "scalar_tensor_tensor" and ins.engine == "vector"
                 and any(r.buffer == "psum" for r in ins.reads)]
    assert on_vector                                   # the planner does pick VectorE for dS here
    trn2 = get_target("trn2")
    with simulator.activated(target="trn2"):
        for ins in on_vector:
            m = next(r for r in ins.reads if r.role == "data").free_elems
            bal = plan_mod.BwdBalance(SimpleNamespace(itemsize=2), SimpleNamespace(dst_dma_share=0.0))
            bal.loads.scalar_ns = bal.gpsimd_ns = 1e9    # force the VectorE way, then read its charge
            assert bal.pick_ds(m) == 0
            charged = bal.loads.vector_ns * bal.costs.vector_ghz
            assert charged == pytest.approx(compute_cost(ins, trn2).cycles)


def test_backward_runs_on_neuroncore_v2():
    """trn1 (NeuronCore-v2, LNC=1): the backward's ScalarE copies out of PSUM (dSᵀ, the dQ
    and dV evictions) are activation(copy), ScalarE having no tensor_copy there; until
    session 61 it failed on trn1. Gradients match float64 (the same values as on trn2)."""
    args, mask = _saved(1, 4, 4, 200, 300, 72, 72, BF16)
    call = attention.attention_backward_kernel_call(*args, attn_mask=mask, is_causal=False,
                                                    scale=args[1].shape[-1] ** -0.5)
    kernel = _dispatch.simulator_kernel(call)[1]
    res = simulator.run(kernel, *call.tensors, target="trn1", **call.static)
    assert any(ins.op == "activation" and ins.attrs.get("func") == "copy" and ins.reads[0].buffer == "psum"
               for ins in res.trace)
    grad_out, q, k, v, _, _ = args
    _check_grads(call.finish_outputs(res.outputs), _float64_grads(q, k, v, mask, False, grad_out), BF16)


def test_dq_accumulates_across_key_blocks_in_fp32(simulator_backend):
    # dQ sums one product per key block; with 16-bit inputs the sum is kept in fp32 and
    # rounded once (README: bf16 ~3.5e-3 relative to float64 per gradient). Mutation testing
    # found a bf16 accumulator passing the bounds above (1e-2): at Sk = 3000 its dQ error is
    # 4.9e-3 and grows with the key blocks, where the fp32 one stays at dK's ~2.9e-3.
    q, k, v = make_qkv(1, 2, 2, 130, 3000, 64, 64, BF16, "bhsd")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = nki_kernels.scaled_dot_product_attention(*leaves)
    dout = torch.randn(out.shape).to(BF16)
    out.backward(dout)
    ref = [t.double().requires_grad_(True) for t in (q, k, v)]
    references.scaled_dot_product_attention(*ref, compute_dtype=torch.float64).backward(dout.double())
    dq_err, dk_err = rel_error(leaves[0].grad, ref[0].grad), rel_error(leaves[1].grad, ref[1].grad)
    assert dq_err < 3.5e-3 and dq_err < 1.15 * dk_err, (dq_err, dk_err)

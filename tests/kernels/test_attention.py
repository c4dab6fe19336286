"""The NKI attention kernels (kernels/attention.py) in the simulator, through the op.

Every case runs ``nki_kernels.scaled_dot_product_attention`` with
``NKI_KERNELS_CPU_BACKEND=simulator`` and compares with the float64 reference. The
simulator fills the kernel's HBM output with NaN when it is allocated, so an element the
kernel never writes fails the NaN check; it raises ``CapacityError`` when live SBUF bytes
or PSUM banks exceed trn2's, so every case here also fits the chip.

Fast tier: one or two representative shapes per feature (tails, head dims, GQA, Sq != Sk,
masks, causal, flash, dtypes, layouts). ``-m sweep``: the wide workload grid.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import nki_kernels
from nki_kernels import _dispatch, _kernel_sources, simulator
from nki_kernels.ops import attention
from nki_kernels.simulator.hardware import get_target
from tests.ops._attention_cases import check_close, make_mask, make_qkv

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32

# (B, H, Hkv, Sq, Sk, D, Dv, dtype, layout, mask, causal)
FAST = [
    (1, 2, 2, 197, 197, 64, 64, BF16, "bshd", None, False),          # ViT-B/16 tokens, transformers layout
    (2, 3, 3, 129, 129, 72, 72, F32, "bhsd", None, False),           # 128 + 1 tails, SigLIP head dim, fp32
    (1, 2, 2, 128, 128, 128, 128, BF16, "bhsd", None, False),        # tile-exact, D = 128
    (1, 16, 16, 65, 65, 80, 80, BF16, "bshd", None, False),          # 16 heads: two head batches, D = 80
    (1, 4, 2, 5, 257, 80, 80, BF16, "bshd", "key_bool", False),      # GQA, Sq != Sk, key padding
    (2, 2, 1, 300, 129, 96, 64, F16, "bhsd", "full_float", True),    # Sq > Sk, causal + bias, Dv != D
    (1, 1, 1, 127, 1025, 64, 64, F32, "bhsd", None, True),           # causal, Sq < Sk (top-left)
    (1, 2, 2, 33, 40, 64, 64, BF16, "bhsd", "bool_2d", False),       # [Sq, Sk] boolean mask
    (2, 2, 2, 20, 70, 64, 64, BF16, "bhsd", "finfo_min", False),     # transformers' finfo.min mask
    (2, 2, 2, 1, 1, 64, 64, BF16, "bhsd", None, False),              # one query, one key
    (1, 2, 2, 130, 3000, 64, 64, BF16, "bshd", "key_float", False),  # flash: 2 key blocks + masks
    (1, 1, 1, 257, 2500, 128, 128, F32, "bhsd", None, True),         # flash, causal, fp32
    (1, 1, 1, 128, 16384, 64, 64, BF16, "bhsd", None, False),        # flash, 16K keys (8 blocks)
    # head dims past 128 (issue 13: the limit was 128; Gemma 2/3 use 256): Q·Kᵀ in two
    # accumulating matmuls, P·[V | 1] 257 columns wide
    (1, 2, 2, 129, 197, 256, 256, BF16, "bshd", None, False),        # Gemma head dim, unmasked batches
    (1, 2, 1, 70, 300, 200, 160, F32, "bhsd", "key_bool", True),     # uneven pieces 128 + 72, fp32
    (1, 4, 2, 130, 2100, 256, 256, BF16, "bhsd", "full_float", False),  # flash, D = 256
    (1, 3, 3, 65, 65, 256, 256, F16, "bhsd", None, False),           # fp16
    (1, 2, 2, 33, 100, 96, 256, BF16, "bhsd", None, False),          # transposed-scores D, Dv = 256
    # fp32: Qᵀ, Kᵀ transposed on TensorE 4 heads to a PSUM bank; 8 heads a group (one
    # batch per core at LNC=2) take a second bank (mutation testing: heads 4-7 untested)
    (2, 8, 8, 65, 130, 64, 64, F32, "bshd", None, False),
]


def _id(case):
    b, h, hkv, sq, sk, d, dv, dtype, layout, mask, causal = case
    return (f"B{b}-H{h}/{hkv}-Sq{sq}-Sk{sk}-D{d}" + (f"-Dv{dv}" if dv != d else "") +
            f"-{str(dtype)[6:]}-{layout}" + (f"-{mask}" if mask else "") + ("-causal" if causal else ""))


def _run_case(case):
    b, h, hkv, sq, sk, d, dv, dtype, layout, mask_kind, causal = case
    q, k, v = make_qkv(b, h, hkv, sq, sk, d, dv, dtype, layout)
    mask = make_mask(mask_kind, b, h, sq, sk, dtype)
    out = nki_kernels.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                   enable_gqa=h != hkv)
    check_close(out, q, k, v, mask, causal)


@pytest.mark.parametrize("case", FAST, ids=_id)
def test_kernel_matches_float64_reference(simulator_backend, case):
    _run_case(case)


# ------------------------------------------------------------------------------ sweep tier

S_GRID = [1, 5, 127, 128, 129, 196, 197, 257, 577, 729, 1025]
D_GRID = [64, 72, 80, 128]
HB_GRID = [(1, 1), (12, 3), (16, 1)]          # (H, B)
SWEEP = [(b, h, h, s, s, d, d, dtype, "bshd" if h > 1 else "bhsd", None, False)
         for s, d, (h, b), dtype in itertools.product(S_GRID, D_GRID, HB_GRID, [BF16, F32])]
SWEEP += [(2, 8, 2, sq, sk, 128, 128, dtype, "bhsd", mask, causal)
          for (sq, sk), dtype, mask, causal in itertools.product(
              [(129, 1025), (1025, 129), (197, 197), (577, 2049)], [BF16, F32],
              [None, "key_bool", "full_float"], [False, True])]
SWEEP += [(1, 2, 1, 16384, 16384, 64, 64, BF16, "bhsd", None, causal) for causal in (False, True)]


@pytest.mark.sweep
@pytest.mark.parametrize("case", SWEEP, ids=_id)
def test_kernel_sweep(simulator_backend, case):
    _run_case(case)


# ------------------------------------------------------------------------------ behaviours

def test_all_masked_rows_return_zero(simulator_backend):
    """A query row whose keys are all masked (False / -inf) returns 0, as torch's SDPA does;
    in the same launch the other rows are unaffected. Covers the key-padding and the full
    mask paths and the flash kernel."""
    for sk in (70, 2100):
        q, k, v = make_qkv(2, 2, 2, 6, sk, 64, dtype=F32)
        key_pad = torch.rand(2, 1, 1, sk) > 0.5
        key_pad[1] = False                                  # batch 1: every key padded
        full = torch.rand(2, 2, 6, sk) > 0.5
        full[0, 1, 3] = False                               # one row of one head
        for mask in (key_pad, torch.where(full, 0.0, float("-inf"))):
            out = nki_kernels.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            check_close(out, q, k, v, mask)
            rows = (mask if mask.dtype == torch.bool else mask == 0).expand(2, 2, 6, sk).any(-1)
            assert (out[~rows] == 0).all() and (~rows).any()
            torch.testing.assert_close(
                out, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                atol=1e-5, rtol=1e-4)


def test_all_finfo_min_row_is_mean_of_values(simulator_backend):
    """A row masked everywhere with a finite "minus large" value (transformers' finfo.min)
    is plain arithmetic: equal scores, so the output is the mean of the values (as SDPA)."""
    q, k, v = make_qkv(1, 1, 1, 4, 50, 64, dtype=F32)
    mask = torch.zeros(1, 1, 4, 50)
    mask[0, 0, 2] = torch.finfo(F32).min
    out = nki_kernels.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out[0, 0, 2], v[0, 0].mean(0), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                               atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("scale", [0.3, -0.2, 0.0])
def test_custom_scale(simulator_backend, scale):
    q, k, v = make_qkv(1, 2, 2, 20, 30, 64, dtype=F32)
    out = nki_kernels.scaled_dot_product_attention(q, k, v, scale=scale)
    check_close(out, q, k, v, scale=scale)
    out = nki_kernels.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=True)
    check_close(out, q, k, v, causal=True, scale=scale)


def test_variant_choice():
    q, k, v = make_qkv(1, 1, 1, 4, attention.SINGLE_PASS_MAX_KEYS, 64)
    assert attention.attention_kernel_call(q, k, v).kernel == "attention_kernel"
    q, k, v = make_qkv(1, 1, 1, 4, attention.SINGLE_PASS_MAX_KEYS + 1, 64)
    assert attention.attention_kernel_call(q, k, v).kernel == "flash_attention_kernel"


def test_layout_follows_the_inputs():
    q, k, v = make_qkv(1, 2, 2, 8, 8, 64, layout="bshd")
    call = attention.attention_kernel_call(q, k, v)
    assert call.static["layout"] == "bshd" and call.tensors[0].is_contiguous()
    q, k, v = make_qkv(1, 2, 2, 8, 8, 64, layout="bhsd")
    assert attention.attention_kernel_call(q, k, v).static["layout"] == "bhsd"


def _run_on_trn2(case):
    """(q, k, v, call, result) of the attention kernel on ``case`` (B, H, Hkv, Sq, Sk, D,
    dtype, causal) run in the simulator for trn2."""
    b, h, hkv, sq, sk, d, dtype, causal = case
    q, k, v = make_qkv(b, h, hkv, sq, sk, d, dtype=dtype)
    call = attention.attention_kernel_call(q, k, v, is_causal=causal)
    with simulator.activated():
        kernel = getattr(_kernel_sources.load(call.module, "simulator"), call.kernel)
    res = simulator.run(kernel, *[t.contiguous() for t in call.tensors], target="trn2", **call.static)
    return q, k, v, call, res


@pytest.mark.parametrize("case", [
    (1, 16, 16, 2048, 2048, 128, F32, False),        # the biggest single-pass case, fp32
    (1, 16, 4, 1025, 2049, 128, F32, True),          # flash, fp32, GQA, causal
    (1, 16, 16, 2048, 2048, 256, F32, False),        # the same at the largest head dim
    (1, 16, 4, 1025, 2049, 256, F32, True),
], ids=["single-2048-fp32", "flash-2049-fp32", "single-2048-fp32-d256", "flash-2049-fp32-d256"])
def test_fits_trn2_sbuf_and_psum(case):
    """Peak live SBUF bytes per partition and PSUM banks stay within trn2's (the 16K x 16K
    sweep cases are checked by the simulator's capacity accounting as they run)."""
    _, _, _, call, res = _run_on_trn2(case)
    trn2 = get_target("trn2")
    assert res.peak_sbuf_bytes_per_partition <= trn2.sbuf_bytes_per_partition
    assert res.peak_psum_banks <= trn2.psum_banks
    assert not torch.isnan(call.finish_outputs(res.outputs)).any()


@pytest.mark.parametrize("case", [
    (1, 2, 1, 300, 1100, 128, BF16, True),           # single pass, causal: rows of 3 PSUM banks
    (1, 2, 2, 130, 729, 72, BF16, False),            # single pass, unmasked head batches
    (1, 2, 1, 200, 2500, 64, BF16, True),            # flash, causal
    (1, 2, 2, 130, 2500, 64, BF16, False),           # flash, unmasked
], ids=["single-causal", "single-unmasked", "flash-causal", "flash-unmasked"])
def test_exps_read_the_score_rows_from_sbuf(case):
    """Outside the transposed-scores path no exp reads PSUM: VectorE's row-max pass moves each
    score row to SBUF fp32 and the exp reads it there, so the scores' PSUM buffer is free
    before the exp and the next unit's matmuls can overlap it (docs/attention.md)."""
    q, k, v, call, res = _run_on_trn2(case)
    h, sq, causal = case[1], case[3], case[7]
    exps = [ins for ins in res.trace if ins.op == "activation" and ins.attrs.get("func") == "exp"]
    # one exp per (head, query tile, key block) at least
    assert len(exps) >= h * -(-sq // 128)
    assert [ins.index for ins in exps if any(r.buffer == "psum" for r in ins.reads)] == []
    assert all(r.buffer == "sbuf" and r.dtype == "float32" for ins in exps for r in ins.reads if r.role == "data")
    check_close(call.finish_outputs(res.outputs), q, k, v, None, causal)


@pytest.mark.parametrize("d", [32, 64, 96])
def test_transposed_scores_stay_finite_for_huge_logits(simulator_backend, d):
    # Issue 13, defect 4: the transposed-scores path (bf16, no mask, Sk <= 384, D then in
    # {32, 64, 96}; longer rows and other head dims: test_long_transposed_rows_...) subtracts the row max as bf16 hi + lo, exact only to ~2^-17 relative:
    # with scaled logits of ~1e7 (q, k ~ 5e3 randn) exp overflowed and the output was NaN.
    # The max is now split into three bf16 terms that sum to it exactly.
    q, k, v = make_qkv(1, 4, 4, 70, 197, d, dtype=BF16)
    q, k = (q.float() * 5e3).to(BF16), (k.float() * 5e3).to(BF16)
    out = nki_kernels.scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(out).all()
    check_close(out, q, k, v)


def _run_lnc(b, h, s, d, lnc, target="trn2", sq=None, qk_scale=1.0, dtype=BF16):
    """(q, k, v, call, result) of the unmasked attention kernel on q [b, h, sq or s, d],
    k, v [b, h, s, d] (q and k times ``qk_scale``) run in the simulator at launch degree
    ``lnc``."""
    q, k, v = make_qkv(b, h, h, sq or s, s, d, dtype=dtype)
    q, k = (q.float() * qk_scale).to(dtype), (k.float() * qk_scale).to(dtype)
    call = attention.attention_kernel_call(q, k, v)
    kernel = _dispatch.simulator_kernel(call)[lnc]
    res = simulator.run(kernel, *[t.contiguous() for t in call.tensors], target=target, **call.static)
    return q, k, v, call, res


def _exps(res):
    return [ins for ins in res.trace if ins.op == "activation" and ins.attrs.get("func") == "exp"]


@pytest.mark.parametrize("b, h, s, d, group", [
    (1, 8, 257, 80, 2),     # 3 key tiles (ViT-H/14 at 224): Sᵀ in groups of 2 + 1; D not a multiple of 32
    (1, 8, 449, 48, 2),     # 4 key tiles: groups of 2 (S one bank per head)
    (1, 8, 729, 72, 1),     # 6 key tiles (SigLIP so400m at 384): S over two banks, groups of 1
], ids=["keys257-d80", "keys449-d48", "keys729-d72"])
def test_transposed_scores_take_long_rows_and_any_head_dim(simulator_backend, b, h, s, d, group):
    """Since session 61 the transposed-scores path takes rows past 384 keys (up to 768, with
    >= 4 query heads per core) and head dims that are not multiples of 32 (D + 3 <= 128):
    every exp reads Sᵀ straight from PSUM, covers at most ``group`` key tiles of a batch of
    heads, and each (head, query tile, key tile) is exponentiated exactly once; no
    instruction transposes P; the Sᵀ matmuls contract over D + 3 partitions (the row max as
    hi + mid + lo); the result matches float64."""
    q, k, v, call, res = _run_lnc(b, h, s, d, lnc=2)
    exps = _exps(res)
    data = [next(r for r in ins.reads if r.role == "data") for ins in exps]
    assert data and all(r.buffer == "psum" for r in data)
    nkc, q_tiles = -(-s // 128), -(-s // 128)
    assert max(r.shape[1] for r in data) == group
    # [128 keys, key tiles, heads, rows]: every (head, query tile, key tile) once
    assert sum(r.shape[1] * r.shape[2] for r in data) == b * h * q_tiles * nkc
    assert not any(ins.op == "nc_transpose" for ins in res.trace)
    transposed_p = [ins for ins in res.trace if ins.op == "dma_transpose" and ins.reads[0].buffer == "sbuf"
                    and ins.reads[0].shape[-1] != 3]          # only the hi / mid / lo columns move so
    assert transposed_p == []
    st = [ins for ins in res.trace if ins.op == "nc_matmul"
          and next(o for o in ins.reads if o.role == "moving").partitions == d + 3]
    assert len(st) == b * h * q_tiles * nkc
    check_close(call.finish_outputs(res.outputs), q, k, v)


def test_long_rows_need_four_query_heads_per_core(simulator_backend):
    """Rows past 384 keys take the transposed-scores path only where each core has >= 4 query
    heads (attention_launch.TS_LONG_MIN_HEADS): B=1 H=4 S=729 runs the single pass at LNC=2
    (two heads per core: its exps read SBUF) and the transposed path at LNC=1; 1024 keys
    (past TS_MAX_KEY_TILES) always run the single pass. Results match float64 either way."""
    for lnc, s, transposed in ((2, 729, False), (1, 729, True), (1, 1024, False)):
        q, k, v, call, res = _run_lnc(1, 4, s, 72, lnc=lnc)
        reads_psum = {any(r.buffer == "psum" for r in ins.reads if r.role == "data") for ins in _exps(res)}
        assert reads_psum == {transposed}, (lnc, s)
        check_close(call.finish_outputs(res.outputs), q, k, v)


def test_long_transposed_rows_stay_finite_for_huge_logits(simulator_backend):
    """The exact hi + mid + lo max (test_transposed_scores_stay_finite_for_huge_logits) on
    the long-row path: one head's row max over two PSUM banks, Sᵀ one key tile per exp."""
    q, k, v, call, res = _run_lnc(1, 8, 729, 72, lnc=2, sq=70, qk_scale=5e3)
    assert all(any(r.buffer == "psum" for r in ins.reads) for ins in _exps(res))
    out = call.finish_outputs(res.outputs)
    assert torch.isfinite(out).all()
    check_close(out, q, k, v)


def test_long_transposed_rows_return_the_lse(simulator_backend):
    """The training forward (return_lse) on the long-row transposed path: the lse it saves
    for the backward is logsumexp(scale·S) of every row against float64, within 2^-9: the
    row sum adds P as rounded to bf16 for P·V (the ones column of [V | 1]), each term within
    2^-9 relative, so the sum too and its log within log(1 + 2^-9) < 2^-9 (measured 3.7e-4
    on values of ~7); the output matches as without the lse."""
    q, k, v = make_qkv(1, 8, 8, 200, 729, 72, dtype=BF16)
    scale = 72 ** -0.5
    call = attention.attention_lse_kernel_call(q, k, v, None, False, scale)
    kernel = _dispatch.simulator_kernel(call)[2]
    res = simulator.run(kernel, *[t.contiguous() for t in call.tensors], target="trn2", **call.static)
    assert all(any(r.buffer == "psum" for r in ins.reads) for ins in _exps(res))
    out, lse = call.finish_outputs(res.outputs)
    ref = torch.logsumexp(scale * q.double() @ k.double().transpose(-1, -2), dim=-1)
    torch.testing.assert_close(lse.double(), ref, atol=2 ** -9, rtol=0)
    check_close(out, q, k, v)


@pytest.mark.parametrize("b, h, s, d, dtype", [
    (1, 2, 300, 64, BF16),      # single pass: Pᵀ copies out of PSUM on VectorE or ScalarE
    (1, 2, 130, 72, F32),       # fp32: Qᵀ / Kᵀ made by TensorE transposes, copied by ScalarE
    (1, 8, 197, 64, BF16),      # transposed scores
    (1, 1, 2100, 64, BF16),     # flash: the first key block's O | rowsum copied by ScalarE
], ids=["single", "fp32", "transposed", "flash"])
def test_runs_on_neuroncore_v2(simulator_backend, b, h, s, d, dtype):
    """trn1 (NeuronCore-v2, LNC=1): ScalarE has no tensor_copy there (the simulator's NKI 0.7
    rule), so the kernels' ScalarE copies out of PSUM are activation(copy)
    (attention_blocks.copy_on); until session 61 every attention launch that picked ScalarE
    for a copy failed on trn1. Each path runs and matches float64."""
    q, k, v, call, res = _run_lnc(b, h, s, d, lnc=1, target="trn1", dtype=dtype)
    assert not any(ins.op == "tensor_copy" and ins.engine == "scalar" for ins in res.trace)
    check_close(call.finish_outputs(res.outputs), q, k, v)


@pytest.mark.parametrize("mask_kind, causal", [("key", False), (None, True)], ids=["key-padding", "causal-diagonal"])
def test_softmax_planning_prices_the_row_max_as_the_cost_model_does(mask_kind, causal):
    """The planner's VectorE estimate of one unit's row max (attention_blocks.softmax_cycles)
    equals the cost model's cycles for the instructions row_max issues: one pass over the
    unmasked columns, two over the masked ones (scale·S + mask reads S in PSUM: one pass),
    each reduce's accumulator read-out and each instruction's fixed cost, less the 64-cycle
    instruction minimum the model gives a causal tile's one-column first part (the planner
    leaves MIN_II out). Until session 61 it charged masked columns three passes and no
    read-out (modeled trn2 LNC=2 with key padding: B=8 H=12 S=197 115.8 -> 102.3 us, B=4 H=8
    S=512 128.9 -> 117.4)."""
    from nki_kernels.simulator.cost.model import compute_cost

    blocks = _kernel_sources.load("attention_blocks", "simulator")
    sk = 300 if mask_kind else 100               # one query tile of 100 rows: one unit
    q, k, v = make_qkv(1, 1, 1, 100, sk, 64, dtype=BF16)
    mask = None
    if mask_kind == "key":
        mask = torch.rand(1, 1, 1, sk) > 0.3
        mask[..., 0] = True
    call = attention.attention_kernel_call(q, k, v, attn_mask=mask, is_causal=causal)
    kernel = _dispatch.simulator_kernel(call)[1]
    res = simulator.run(kernel, *[t.contiguous() for t in call.tensors], target="trn2", **call.static)
    check_close(call.finish_outputs(res.outputs), q, k, v, mask, causal)
    # the unit's row max: the reduces and the masked columns' scale·S + mask
    row_max = [ins for ins in res.trace if ins.engine == "vector"
               and ins.op in ("tensor_scalar_reduce", "scalar_tensor_tensor")]
    masked = next(ins for ins in row_max if ins.op == "scalar_tensor_tensor").writes[0].free_elems
    assert 0 < masked <= sk
    trn2 = get_target("trn2")
    # the planner's rule leaves out MIN_II: an instruction of fewer columns counts its columns
    modeled = sum(compute_cost(ins, trn2).cycles
                  - max(0, trn2.min_instruction_cycles - next(r for r in ins.reads if r.role == "data").free_elems)
                  for ins in row_max)
    with simulator.activated(target="trn2"):
        bias, diag = ("bias", None) if mask is not None else (None, (sk - masked, None))
        planned, _ = blocks.softmax_cycles(sk, bias, diag)
    assert planned == pytest.approx(modeled)


def _normalisations(res, dv):
    """Per core, the engines of the launch's normalisations of output banks, in issue order:
    "vector" (VectorE's reciprocal of the row sums, then one multiply from PSUM: the kernel
    issues nisa.reciprocal nowhere else) or "scalar" (ScalarE copies O | rowsum, Dv + 1
    fp32 columns, out of PSUM; GpSimd then scales). The cases below keep Sq, Sk and every
    query tile's rows apart from Dv + 1, so no other PSUM copy has that width."""
    seen = {}
    for ins in res.trace:
        core = ins.attrs.get("core", 0)
        if ins.op == "reciprocal" and ins.engine == "vector":
            seen.setdefault(core, []).append("vector")
        elif (ins.op == "activation" and ins.attrs.get("func") == "copy"
              and ins.reads[0].buffer == "psum" and ins.reads[0].shape[-1] == dv + 1):
            seen.setdefault(core, []).append("scalar")
    return seen


@pytest.mark.parametrize("case, lnc, mask_kind, causal", [
    ((1, 2, 2, 33, 40, 64, F32), 1, None, False),       # single pass, one unit
    ((1, 2, 2, 33, 40, 64, F32), 2, None, False),       # single pass, one unit per core
    ((1, 4, 2, 5, 257, 80, F32), 1, None, False),       # single pass, GQA, short query tile
    ((2, 3, 3, 129, 129, 72, F32), 2, None, False),     # single pass, several units per core, a tail tile
    ((1, 2, 1, 300, 1100, 128, BF16), 2, None, False),  # single pass, bf16 past the transposed path's keys
    ((2, 12, 12, 197, 197, 64, BF16), 2, None, False),  # transposed scores (ViT-B)
    ((1, 2, 2, 197, 197, 64, BF16), 1, None, True),     # single pass, causal (one unit per head and tile)
    ((2, 3, 3, 129, 129, 72, F32), 2, None, True),      # the same at LNC=2, a tail tile
    ((2, 2, 2, 70, 90, 64, BF16), 2, "key_bool", False),  # key padding (all-masked rows floored)
    ((1, 2, 2, 70, 70, 32, F32), 1, "finfo_min", False),  # a transformers-style [b, 1, sq, sk] mask
], ids=["single-fp32-lnc1", "single-fp32-lnc2", "single-gqa-lnc1", "single-units-lnc2", "single-bf16-lnc2",
        "transposed-lnc2", "causal-lnc1", "causal-lnc2", "key-mask-lnc2", "finfo-mask-lnc1"])
def test_last_unit_normalises_on_vector(simulator_backend, case, lnc, mask_kind, causal):
    """Each core's last normalisation is on VectorE, whatever the VectorE / ScalarE balance
    says (unmasked batches) and although the masked and causal units normalise on ScalarE +
    GpSimd: it ends the launch, and that path (copy, then GpSimd's scaling) is a chain of two
    engines the balance does not price (docs/attention.md; on the single-pass path since
    2026-12-06: of a 128-launch probe grid, 76 modeled faster, by up to 6 %, two slower, by
    at most 1.7 %). With a mask or causal, every other unit of each core still normalises
    on ScalarE + GpSimd; the unmasked batches before the last follow the balance (not
    pinned here)."""
    b, h, hkv, sq, sk, d, dtype = case
    assert d + 1 not in (sq, sk, min(sq, 128), sq % 128)       # _normalisations' premise
    q, k, v = make_qkv(b, h, hkv, sq, sk, d, dtype=dtype)
    mask = make_mask(mask_kind, b, h, sq, sk, dtype)
    call = attention.attention_kernel_call(q, k, v, attn_mask=mask, is_causal=causal)
    kernel = _dispatch.simulator_kernel(call)[lnc]
    res = simulator.run(kernel, *[t.contiguous() for t in call.tensors], target="trn2", **call.static)
    seen = _normalisations(res, d)
    assert sorted(seen) == list(range(lnc))
    assert {core: engines[-1] for core, engines in seen.items()} == {core: "vector" for core in range(lnc)}
    if causal or mask_kind:
        for engines in seen.values():
            assert len(engines) > 1 and set(engines[:-1]) == {"scalar"}
    check_close(call.finish_outputs(res.outputs), q, k, v, mask, causal)


@pytest.mark.parametrize("case, lnc, mask_kind, causal", [
    ((1, 2, 1, 1100, 1100, 64, BF16), 2, None, True),        # single pass, causal: pieces 640 + 460
    ((1, 1, 1, 1536, 1536, 128, F32), 1, None, True),        # single pass, fp32: 768 + 768
    ((1, 2, 1, 300, 1100, 64, BF16), 1, None, False),         # single pass, no mask (past the transposed path)
    ((1, 1, 1, 200, 2048, 64, F32), 2, None, False),          # the same, fp32: 1024 + 1024
    ((1, 2, 2, 130, 2500, 64, BF16), 2, None, False),         # flash, no mask: blocks of 2048 (1024 + 1024) + 452
    ((1, 1, 1, 2300, 2300, 64, BF16), 2, None, True),         # flash, causal
    ((1, 2, 2, 100, 2048, 64, BF16), 1, "key_float", False),  # a user mask: the row stays whole
    ((1, 2, 2, 70, 1300, 64, F32), 2, "finfo_min", False),    # the same, per-row mask
], ids=["causal-1100", "causal-fp32-1536", "unmasked-1100", "unmasked-fp32-2048", "flash-2500", "flash-causal",
        "key-mask-2048", "finfo-mask-1300"])
def test_long_score_rows_in_pieces(simulator_backend, case, lnc, mask_kind, causal):
    """The single-pass (causal or unmasked) and flash paths make a score row of more than
    S_PIECE_KEYS keys (1024) as PSUM pieces of at most that many (2 banks; bounds at even
    shares rounded up to 128-key tiles), each with its own VectorE reduce(s) and GpSimd
    taking the min of their parts: a whole row of up to 2048 keys (4 banks) kept one PSUM
    buffer, so VectorE's pass over it and the next row's matmuls ran in turn (modeled trn2
    LNC=2, Llama B=1 H=8/2kv S=2048 causal 183.5 -> 157.8 us). Under a user mask the row
    stays one tile (split, 24 key-padding launches modeled -14 % to +13 %, geomean +0.8 %).
    The row max must still be the max over the whole row, masked columns included: in the
    bf16 cases a few keys of the first piece and of a later one carry logits large enough
    that an exp stabilised by another piece's max overflows (float64 reference)."""
    piece_bytes = 2 * get_target("trn2").psum_bank_bytes      # S_PIECE_KEYS = 1024 fp32 keys
    assert _kernel_sources.load("attention_blocks", "simulator").S_PIECE_KEYS * 4 == piece_bytes
    b, h, hkv, sq, sk, d, dtype = case
    q, k, v = make_qkv(b, h, hkv, sq, sk, d, dtype=dtype)
    if dtype == BF16:
        # keys 10..19 (first piece) and 1030..1039 (a later piece) 128x larger: each row's
        # max is in one of the two, and an exp stabilised by any other piece's max overflows
        # (scaled logits past 100; exp overflows fp32 past 88). bf16 only: in fp32, rounding
        # scaled logits of ~100 is ~1e-5 relative in the weights, the fp32 tolerance itself,
        # as in the one-piece kernel
        for k0 in (10, 1030):
            k[:, :, k0:k0 + 10, :] = (k[:, :, k0:k0 + 10, :].float() * 128).to(dtype)
    mask = make_mask(mask_kind, b, h, sq, sk, dtype)
    call = attention.attention_kernel_call(q, k, v, attn_mask=mask, is_causal=causal)
    kernel = _dispatch.simulator_kernel(call)[lnc]
    res = simulator.run(kernel, *[t.contiguous() for t in call.tensors], target="trn2", **call.static)
    psum = {a.alloc_id: a.nbytes for a in res.allocations if a.buffer == "psum"}
    # the PSUM tiles VectorE's row-max passes read
    reduced = {op.alloc_id for ins in res.trace if ins.engine == "vector"
               and ins.op in ("tensor_scalar_reduce", "scalar_tensor_tensor")
               for op in ins.reads if op.buffer == "psum"}
    if mask_kind is None:
        assert max(psum.values()) <= piece_bytes
        widest = max(psum[a] for a in reduced)
        assert piece_bytes // 2 < widest <= piece_bytes     # the long rows did take 2-bank pieces
    else:
        assert max(psum[a] for a in reduced) == sk * 4
    check_close(call.finish_outputs(res.outputs), q, k, v, mask, causal)


def test_flash_key_block_inside_a_query_tile_masks_whole_rows(simulator_backend):
    """row_max clamps a row's -max to FLT_MAX only where the row can be masked everywhere: a
    user mask, or a causal block with no column visible to every row. With the default key
    block (2048) the latter never happens, and causal units, whose first column every row
    sees, issue no clamp (one GpSimd instruction less on each unit's path to the exp); a key
    block that is not a multiple of 128 (200, a static argument of flash_attention_kernel)
    can start inside a query tile (k0 = 200 for rows 128..255), and there the clamp keeps
    row_max's -max finite (the flash update's min with the running -max, finite since the
    first block, would also absorb a +inf)."""
    q, k, v = make_qkv(1, 1, 1, 2100, 2100, 64, dtype=BF16)
    call = attention.attention_kernel_call(q, k, v, is_causal=True)
    assert call.kernel == "flash_attention_kernel"
    kernel = _dispatch.simulator_kernel(call)[1]
    res = simulator.run(kernel, *[t.contiguous() for t in call.tensors], target="trn2",
                        **{**call.static, "key_block": 200})
    # the clamps: GpSimd's one-column minimum (its other tensor_scalar, the sums' power of -1
    # in divide, reads [r, heads, 1])
    clamps = [ins for ins in res.trace if ins.op == "tensor_scalar" and ins.engine == "gpsimd"
              and ins.attrs.get("op0") == "minimum" and len(ins.reads[0].shape) == 2]
    # blocks starting inside a query tile: k0 = 200 i for q0 < k0 <= q0 + 127
    inside = sum(1 for k0 in range(0, 2100, 200) for q0 in range(0, 2100, 128) if q0 < k0 <= min(2099, q0 + 127))
    assert len(clamps) == inside > 0
    check_close(call.finish_outputs(res.outputs), q, k, v, None, True)


@pytest.mark.parametrize("s, every_batch", [(449, True), (197, False)], ids=["keys449", "keys197"])
def test_row_max_split_per_batch_on_grouped_rows(simulator_backend, s, every_batch):
    """The transposed-scores path moves each query tile's hi + mid + lo with one DMA
    transpose per batch of heads on the launch's first and last tiles and one per tile in
    between (attention_plan.EngineBalance.hilo_per_batch); rows of more than two key tiles
    (grouped Sᵀ) take one per batch on every tile (since session 61: SigLIP so400m@384
    127.0 -> 122.4 us modeled). 16 heads at LNC=2: 8 per core, in batches of 4 (128-row
    tiles) or 6 (the tail tile)."""
    q, k, v, call, res = _run_lnc(1, 16, s, 48, lnc=2)
    hilo = [ins for ins in res.trace if ins.op == "dma_transpose" and ins.reads[0].buffer == "sbuf"
            and ins.reads[0].shape[-1] == 3]
    rows = [min(128, s - t * 128) for t in range(-(-s // 128))]
    batches = [-(-8 // min(6, 512 // r, 512 // 49)) for r in rows]
    per_core = sum(batches) if every_batch else batches[0] + (len(rows) - 2) + batches[-1]
    assert len(hilo) == 2 * per_core
    check_close(call.finish_outputs(res.outputs), q, k, v)

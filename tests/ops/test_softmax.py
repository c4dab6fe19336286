"""softmax: one-pass and online NKI kernels in the simulator vs float64."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import nki_kernels
from nki_kernels import _dispatch, references
from nki_kernels.ops.softmax import softmax_kernel_call

from ._cases import DTYPE_IDS, DTYPES, GRID, assert_matches, randn, run_traced


def _expected(x, dim=-1):
    return references.softmax(x.double(), dim, compute_dtype=torch.float64)


@pytest.mark.parametrize("rows, cols, dtype", GRID)
def test_softmax(simulator_backend, rows, cols, dtype):
    # scale 4: logits spread over ~30 units, so the max subtraction matters
    x = randn(rows, cols, dtype=dtype, scale=4.0)
    assert_matches(nki_kernels.softmax(x), _expected(x), dtype)


@pytest.mark.parametrize("rows, cols", [(700, 600), (513, 1000)])
def test_softmax_rows_scaled_on_both_engines_take_their_own_sums(simulator_backend, rows, cols):
    # fp32 blocks of several rows per partition in the per-row form, whose 1/sum scaling is
    # split between VectorE and ScalarE by segments: mutation testing found ScalarE's
    # segments reading row 0's 1/sum (off by up to 0.8) caught only by the sweep tier
    x = randn(rows, cols, scale=4.0)
    assert_matches(nki_kernels.softmax(x), _expected(x), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows, cols", [(3, 20000), pytest.param(130, 70001, marks=pytest.mark.sweep)])
def test_softmax_long_rows_online(rows, cols, dtype):
    # rows longer than 8192: the online (streaming) form, 3 chunks for 20000 (three rows
    # would take the split form: turned off here)
    x = randn(rows, cols, dtype=dtype, scale=4.0)
    call = softmax_kernel_call(x, split_rows=False)
    assert_matches(_dispatch.run_simulated(call), _expected(x), dtype)


def _split_taken(trace):
    return any(i.op == "nc_transpose" for i in trace)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows, cols", [
    (1, 32000),      # one row over all 128 partitions, 250 columns each (LNC=2: one core idle)
    (8, 4096),       # exact: 16 segments of 256
    (5, 50257),      # ragged: no divisor of C near 128 // 3; the last segment shorter
    (7, 2049),       # ragged: parts of 3 and 4 rows, segments of 49 and 65 columns
    (64, 4096),      # 32 rows per part: four segments per row, the most rows the form takes
])
def test_softmax_few_long_rows_split_over_partitions(rows, cols, dtype):
    # few long rows: each row cut into segments over the partitions, the segments' maxima
    # and sums combined on one partition (split form)
    x = randn(rows, cols, dtype=dtype, scale=4.0)
    out, trace = run_traced(softmax_kernel_call(x))
    assert _split_taken(trace), "the split form was not taken"
    assert_matches(out, _expected(x), dtype)


def test_softmax_split_form_rows_and_segments_keep_their_own_maxima():
    # a tile holds several rows' segments: row maxima ~1e4 apart, each row's max in a
    # different segment (first, middle, the ragged last one), whole segments of -inf in a
    # finite row (a top-k / top-p masked vocabulary), a row of -inf (NaN, as torch), a row of
    # the lowest finite float (uniform), a +inf (NaN row, as torch), a one-hot row
    x = randn(8, 5001, scale=4.0)
    x[0::2] += 1e4
    x[1, 0] = 60.0
    x[2, 2500] = 1e4 + 60.0
    x[3, 5000] = 60.0
    x[3, 100:4000] = -float("inf")
    x[4] = -float("inf")
    x[5] = torch.finfo(torch.float32).min
    x[6, 17] = float("inf")
    x[7, 4321] = 1e6
    x[7, :3000] = -float("inf")
    out, trace = run_traced(softmax_kernel_call(x))
    assert _split_taken(trace)
    ref = _expected(x)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.isnan(out[4]).all() and torch.isnan(out[6]).all()
    finite = ~torch.isnan(ref).any(dim=1)
    assert_matches(out[finite], ref[finite], torch.float32)
    assert out[7, 4321] == 1.0 and torch.equal(out[5], torch.full((5001,), 1 / 5001))
    assert (out[3, 100:4000] == 0).all() and (out[7, :3000] == 0).all()


def _split_groups(trace, core=0):
    """Split-form groups ``core`` took: each combines its rows' maxima with one transpose
    onto a partition and one back, and its sums with two more."""
    return sum(1 for i in trace if i.op == "nc_transpose" and i.attrs.get("core") == core) // 4


@pytest.mark.parametrize("rows, cols, dtype, groups", [
    (96, 4096, torch.bfloat16, 2),     # 48 rows a part: groups of 24 rows x 4 segments of 1024
    (130, 6000, torch.float32, 3),     # 65 rows a part: groups of 21-22 rows x 6 segments of 1000
    (100, 12288, torch.float16, 2),    # 50 rows a part: groups of 25 x 4 segments of 3072
    (40, 70000, torch.bfloat16, 2),    # rows too long for 20 rows' segments: groups of 10 rows
                                       # x 10 segments of 7000 (one group would need 14000)
    (32, 50257, torch.bfloat16, 4),    # GPT-2's vocabulary, 29 x 1733: no divisor in (4, 8] or
                                       # (8, 16], so groups of 4 rows x 29 segments of 1733
    (16, 32001, torch.float32, 2),     # 3 x 10667: no divisor near any S, so ragged groups of 4
                                       # rows x 32 segments (the last of 31 columns)
])
def test_softmax_split_form_takes_more_rows_in_groups(rows, cols, dtype, groups):
    # more rows than one split-form tile holds: each part's rows in groups taken in turn, so
    # one group's scaling and stores overlap the next group's loads and exps
    x = randn(rows, cols, dtype=dtype, scale=4.0)
    out, trace = run_traced(softmax_kernel_call(x))
    assert _split_groups(trace) == groups
    assert_matches(out, _expected(x), dtype)


def test_softmax_split_groups_keep_their_rows_apart():
    # fp32 [96, 4096]: two groups of 24 rows per part. Rows ~1e4 apart, and in the second
    # group of the first part (rows 24..47) and of the second part (rows 72..95): a +inf
    # (NaN row, as torch), a row of -inf (NaN), a row of the lowest finite float (uniform),
    # a one-hot row, whole segments of -inf in a finite row
    x = randn(96, 4096, scale=4.0)
    x[0::3] += 1e4
    x[30, 17] = float("inf")
    x[31] = -float("inf")
    x[32] = torch.finfo(torch.float32).min
    x[33, :] = -float("inf")
    x[33, 4000] = 5.0
    x[80, 1024:3072] = -float("inf")
    x[81, 100] = 1e6
    out, trace = run_traced(softmax_kernel_call(x))
    assert _split_groups(trace) == 2
    ref = _expected(x)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.isnan(out[30]).all() and torch.isnan(out[31]).all()
    finite = ~torch.isnan(ref).any(dim=1)
    assert_matches(out[finite], ref[finite], torch.float32)
    assert torch.equal(out[32], torch.full((4096,), 1 / 4096)) and out[33, 4000] == 1.0 and out[81, 100] == 1.0
    assert (out[80, 1024:3072] == 0).all()


def _exp_chunks(trace, core=0):
    """Column chunks the split form took on ``core``: its exps that also sum (one per chunk)."""
    return sum(1 for i in trace if i.op == "activation" and i.attrs.get("reduce") and i.attrs.get("core") == core)


@pytest.mark.parametrize("rows, cols, dtype", [
    (8, 128256, torch.bfloat16),    # Llama-3 vocabulary at decode: exact segments of 4008
    (32, 16384, torch.bfloat16),    # 16 rows per part: segments of 2048
    (8, 32000, torch.float32),      # fp32 segments of 1000 (4000 bytes)
    (8, 128201, torch.bfloat16),    # ragged (no divisor of C in (16, 32]): the last segment shorter
    (2, 262144, torch.float16),     # one row per part, fp16 segments of 2048
])
def test_softmax_split_form_takes_long_segments_in_column_chunks(rows, cols, dtype):
    # segments long enough that their load, max, exp, scaling and store pipeline over
    # column chunks, each chunk with its own max; the chunks meet in each segment's share
    x = randn(rows, cols, dtype=dtype, scale=4.0)
    out, trace = run_traced(softmax_kernel_call(x))
    assert _split_taken(trace) and _exp_chunks(trace) > 1
    assert_matches(out, _expected(x), dtype)


def test_softmax_split_form_chunks_keep_their_own_maxima():
    # fp32 [8, 128256]: 32 segments of 4008 per row, in chunks of 668 (6 per segment). Chunk
    # maxima 1e4 apart within a segment, a chunk and a whole segment of -inf in a finite row,
    # a +inf (NaN row, as torch) in the tile of two finite rows, a row of -inf (NaN), a row
    # of the lowest finite float (uniform), a one-hot row, a row 1e4 above the others
    x = randn(8, 128256, scale=4.0)
    x[0] -= 1e4
    x[0, 5 * 4008 + 3500] = 50.0                 # the max, in the last chunk of segment 5
    x[1, 0:668] = -float("inf")                  # the first chunk of segment 0
    x[1, 3 * 4008:4 * 4008] = -float("inf")      # all of segment 3
    x[2, 7 * 4008 + 1000] = float("inf")
    x[3] = -float("inf")
    x[4] = torch.finfo(torch.float32).min
    x[5, :50000] = -float("inf")
    x[5, 100000] = 1e6
    x[7] += 1e4
    out, trace = run_traced(softmax_kernel_call(x))
    assert _split_taken(trace) and _exp_chunks(trace) == 6
    ref = _expected(x)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.isnan(out[2]).all() and torch.isnan(out[3]).all()
    finite = ~torch.isnan(ref).any(dim=1)
    assert_matches(out[finite], ref[finite], torch.float32)
    assert out[0, 5 * 4008 + 3500] > 0.5
    assert (out[1, 0:668] == 0).all() and (out[1, 3 * 4008:4 * 4008] == 0).all()
    assert torch.equal(out[4], torch.full((128256,), 1 / 128256))
    assert out[5, 100000] == 1.0 and (out[5, :100000] == 0).all() and (out[5, 100001:] == 0).all()


@pytest.mark.parametrize("rows, cols, split", [
    (65, 8192, True),     # 33 rows in a part: two groups of 16 and 17 rows
    (64, 8192, True),
    (256, 2048, False),   # 128 rows in a part: four groups' combining chains would cost more
                          # than the row tile's unpipelined max, exp and scaling
    (256, 32001, False),  # ragged groups of 4 rows, priced as LNC=1 runs them (64 groups)
    (64, 2401, True),     # 7 x 343: no divisor near S = 4, so two groups of 16 rows x 7 segments
                          # (2107 = 7 x 301 until the refit of 2026-12-06 put fp32's two-group
                          # threshold at 2249 columns)
    (64, 2053, False),    # prime: only ragged groups of 4 rows, whose chains do not pay
    (8, 1024, False),     # too short for the segments to pay for the combining chain
    (8, 4096, True),
    (2, 8193, True),      # ragged, one row per part
])
def test_softmax_split_form_is_taken_only_for_few_long_rows(rows, cols, split):
    x = randn(rows, cols, scale=4.0)
    out, trace = run_traced(softmax_kernel_call(x))
    assert _split_taken(trace) == split
    assert_matches(out, _expected(x), torch.float32)
    _, off = run_traced(softmax_kernel_call(x, split_rows=False))
    assert not _split_taken(off)


@pytest.mark.parametrize("resident", [True, False], ids=["resident", "streaming"])
@pytest.mark.parametrize("max_cols", [7, 64, 300, 999])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_softmax_online_forced_small_chunks(max_cols, dtype, resident):
    # the online form with chunks far shorter than the row (7: 143 chunks; 300 and
    # 999: ragged last chunk), row maxima in every chunk position; resident (every chunk's
    # fp32 e kept in SBUF, the scaling spread over VectorE, GpSimd and ScalarE) and
    # streaming (x reloaded from HBM)
    x = randn(131, 1000, dtype=dtype, scale=4.0)
    x[5, -1] = 40.0      # the max in the last chunk
    x[6, 0] = 40.0       # the max in the first chunk
    x[7, 500] = 40.0     # the max in a middle chunk
    call = softmax_kernel_call(x, max_cols=max_cols, resident_bytes=None if resident else 0)
    out = _dispatch.run_simulated(call)
    assert_matches(out, _expected(x), dtype)


def test_softmax_extreme_values(simulator_backend):
    x = randn(7, 768, scale=4.0)
    x[0] = -1e30          # a row of (finite) huge negatives: uniform
    x[1, 3] = 1e4         # one dominant logit: one-hot
    x[2] = 0.0            # constant row: uniform
    out = nki_kernels.softmax(x)
    assert_matches(out, _expected(x), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows, cols", [(2700, 197), (1000, 77)])
def test_softmax_short_rows_block_form_with_far_apart_row_maxima(dtype, rows, cols):
    # short rows packed several to a partition take the block form (one exp per group of
    # rows, each row's own max subtracted on GpSimd first): rows sharing a partition get
    # maxima ~1e4 apart, a row of huge negatives and a one-hot row, so a max shared by the
    # partition's rows instead of each row's own would underflow every other row to 0 / 0
    x = randn(rows, cols, dtype=dtype, scale=4.0)
    x[0::7] += 1e4
    x[3] = -1e30
    x[4, 5] = 1e4
    out, trace = run_traced(softmax_kernel_call(x))
    subtracts = [i for i in trace if i.engine == "gpsimd" and i.op == "tensor_scalar"]
    exps = [i for i in trace if i.engine == "scalar" and i.op == "activation"
            and i.writes[0].dtype == "float32"]
    assert subtracts and exps, "the block form was not taken"
    assert max(i.writes[0].shape[1] for i in exps) > 1      # one exp covers several rows
    # each exp group's rows leave in a store of their own as soon as they are scaled
    # (kernels/softmax.py EXP_GROUPS), not in one store of the whole block
    groups = Counter(i.writes[0].shape[1] for i in exps if len(i.writes[0].shape) == 3)
    stores = Counter(i.writes[0].shape[1] for i in trace
                     if i.op == "dma_copy" and i.writes[0].buffer == "hbm" and len(i.writes[0].shape) == 3)
    assert groups and not groups - stores, (groups, stores)
    assert_matches(out, _expected(x), dtype)


@pytest.mark.parametrize("dim", [0, 1, -2])
def test_softmax_other_dims(simulator_backend, dim):
    x = randn(5, 129, 33, scale=2.0)
    assert_matches(nki_kernels.softmax(x, dim=dim), _expected(x, dim), torch.float32)


def test_softmax_backward_matches_torch(simulator_backend):
    x = randn(6, 200).requires_grad_(True)
    xr = x.detach().clone().requires_grad_(True)
    grad = torch.randn(6, 200)
    nki_kernels.softmax(x).backward(grad)
    torch.softmax(xr, -1).backward(grad)
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_softmax_reference_path(reference_backend, dtype):
    from tests._helpers import TOLERANCES

    x = randn(4, 33, dtype=dtype, scale=3.0)
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(nki_kernels.softmax(x).double(), _expected(x), atol=atol, rtol=rtol)


@pytest.mark.parametrize("resident", [True, False], ids=["resident", "streaming"])
def test_softmax_online_keeps_ln_sum_when_the_max_is_large(resident):
    # Issue 13, defect 1: the online form's bias -(m + ln l) was formed in fp32, which loses
    # ln l when |m| is large: a two-way tie at 1e10 came out [1, 1], and rows of randn + 3000
    # had relative error 1e-4 (8192 columns, the one-pass form: 1e-7).
    tie = torch.full((2, 8193), -1e30)
    tie[:, :2] = 1e10
    tie[1, -2:] = 1e10                                  # the tie in the last chunk too
    shifted = randn(3, 8193) + 3000.0
    for split in (False, True):   # the online form, and the split form these few rows take
        for x in (tie, shifted):
            call = softmax_kernel_call(x, resident_bytes=None if resident else 0, split_rows=split)
            assert_matches(_dispatch.run_simulated(call), _expected(x), torch.float32)
        out = _dispatch.run_simulated(softmax_kernel_call(tie, resident_bytes=None if resident else 0,
                                                          split_rows=split))
        assert out[0, :2].tolist() == [0.5, 0.5]


@pytest.mark.parametrize("resident", [True, False], ids=["resident", "streaming"])
def test_softmax_online_chunks_keep_their_own_maxima(resident):
    # the online form's chunks (4096 columns: three per 9000-column row) each have their own
    # max, met per row only after pass 1: chunk maxima 1e4 apart in a row, a chunk of -inf
    # in a finite row, a +inf (NaN row, as torch) and a row of -inf (NaN) in the tile of
    # finite rows, a one-hot row, a row 1e4 above the others
    x = randn(7, 9000, scale=4.0)
    x[0, :8192] -= 1e4                   # the max in the last (short) chunk
    x[1, 4096:8192] = -float("inf")      # all of the middle chunk
    x[2, 5000] = float("inf")
    x[3] = -float("inf")
    x[4, :4096] = -float("inf")
    x[4, 100] = 0.0                      # one finite value in the first chunk ...
    x[4, 4096:] = -1e6                   # ... far above the other chunks: one-hot
    x[6] += 1e4
    out = _dispatch.run_simulated(softmax_kernel_call(x, split_rows=False, resident_bytes=None if resident else 0))
    ref = _expected(x)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.isnan(out[2]).all() and torch.isnan(out[3]).all()
    finite = ~torch.isnan(ref).any(dim=1)
    assert_matches(out[finite], ref[finite], torch.float32)
    assert (out[1, 4096:8192] == 0).all() and out[4, 100] == 1.0 and (out[4, 101:] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_softmax_online_rows_of_finfo_min(simulator_backend, dtype):
    # Issue 13, defect 2: rows longer than 8192 whose every value is below -3e38 (masked
    # with finfo(float32).min, as transformers builds masks) returned inf: the running max
    # started at -3e38 instead of at or below the true row max.
    # Three rows take the split form by default: the online form is forced, then the split
    # form (whose segment maxima are clamped the same way) checked too.
    lowest = torch.finfo(dtype).min                     # bf16: -3.39e38
    x = torch.full((3, 8193), lowest, dtype=dtype)
    x[1, 5000] = -3.2e38                                # one value above the others
    x[2, :8000] = float("-inf")                         # -inf, then the masked value
    for split in (False, True):
        out = _dispatch.run_simulated(softmax_kernel_call(x, split_rows=split))
        assert_matches(out, _expected(x), dtype)


def test_softmax_split_form_is_not_taken_on_neuroncore_v2():
    # trn1's TensorE transposes are not bit-accurate with NaN / inf (nki.isa.nc_transpose),
    # which the split form's statistics can hold: one row per partition there
    x = randn(8, 4096, scale=4.0)
    out, trace = run_traced(softmax_kernel_call(x), lnc=1, target="trn1")
    assert not _split_taken(trace)
    assert_matches(out, _expected(x), torch.float32)

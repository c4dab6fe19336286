"""Norms for a few rows (token generation): the hidden-on-partitions kernels of
kernels/norm_decode.py, through the ops on the simulator backend, against float64."""

from __future__ import annotations

import pytest
import torch

import nki_kernels
from nki_kernels import _dispatch, _kernel_sources, references, simulator
from nki_kernels.ops import norms

from ._cases import assert_matches, randn

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
MAX_ROWS = norms.DECODE_MAX_ROWS
# up to this many rows the RMSNorm kernel issues per-row instructions, above it one per step
ROW_LOOP = _kernel_sources.limits().NORM_DECODE_ROW_LOOP_MAX_ROWS
# LayerNorm's all-rows path takes its statistics per row up to this many rows in a program
PER_ROW = _kernel_sources.limits().NORM_DECODE_PER_ROW_MAX_ROWS



@pytest.fixture(autouse=True)
def decode_for_every_shape_it_takes(monkeypatch, request):
    """The ops pick the decode kernel only where it is modeled faster (H >= 512, ...); the
    kernel itself takes every H that is a multiple of 128, so these tests route every shape
    it takes to it (except the test of the pick rule)."""
    if request.node.originalname == "test_decode_kernel_is_chosen_by_shape":
        return
    monkeypatch.setattr(norms, "DECODE_MIN_HIDDEN", 128)
    monkeypatch.setattr(norms, "DECODE_PICK_ROWS", norms.DECODE_MAX_ROWS)
    monkeypatch.setattr(norms, "DECODE_WIDE_PICK_ROWS", norms.DECODE_MAX_ROWS)


# (rows, hidden, dtype): one token, the most rows of the per-row path, an odd count just
# above it, one row per program at LNC=2, two rows per program at LNC=2 (LayerNorm's
# per-row statistics in the all-rows path: at H=4096 the rows' sums from one pass over both
# rows, at H=8192 from one tensor_scalar_reduce per row), the most rows the kernel takes
CASES = [(1, 2048, BF16), (ROW_LOOP, 2048, F16), (ROW_LOOP + 3, 4096, F32), (3, 128, BF16),
         (2 * PER_ROW, 4096, F16), (2 * PER_ROW, 8192, BF16), (MAX_ROWS, 1024, BF16)]


@pytest.mark.parametrize("rows, hidden, dtype", CASES, ids=[f"{r}x{h}-{str(d)[6:]}" for r, h, d in CASES])
@pytest.mark.parametrize("affine", ["weight", "none"])
def test_rms_norm_decode(simulator_backend, rows, hidden, dtype, affine):
    x = randn(2, rows // 2, hidden, dtype=dtype) if rows % 2 == 0 else randn(rows, hidden, dtype=dtype)
    w = randn(hidden, dtype=dtype) if affine == "weight" else None
    out = nki_kernels.rms_norm(x, (hidden,), w, 1e-6)
    expected = references.rms_norm(x.double(), (hidden,), None if w is None else w.double(), 1e-6,
                                   compute_dtype=torch.float64)
    assert_matches(out, expected, dtype, rel=None if dtype != F16 else 2e-3)


@pytest.mark.parametrize("rows", [1, ROW_LOOP, MAX_ROWS])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_decode_large_eps_on_small_variance_rows(simulator_backend, op, rows):
    # eps 0.1 against a (mean square or) variance of ~1e-4: the output is ~0.03 of the
    # eps-free one. Mutation testing found the one-row RMSNorm path without its eps passing
    # every test (their inputs have variances of ~1-4, where eps=1e-6 is invisible).
    x = randn(rows, 4096, scale=0.01)
    weight = randn(4096, scale=0.5, shift=1.0)
    out = getattr(nki_kernels, op)(x, (4096,), weight, eps=0.1)
    twin = getattr(references, op)
    args = (None,) if op == "layer_norm" else ()      # layer_norm's bias
    expected = twin(x.double(), (4096,), weight.double(), *args, 0.1, compute_dtype=torch.float64)
    assert_matches(out, expected, F32)


@pytest.mark.parametrize("rows, hidden, dtype", CASES, ids=[f"{r}x{h}-{str(d)[6:]}" for r, h, d in CASES])
@pytest.mark.parametrize("affine", ["weight+bias", "weight", "bias", "none"])
def test_layer_norm_decode(simulator_backend, rows, hidden, dtype, affine):
    _check_layer_norm(rows, hidden, dtype, affine)


def _check_layer_norm(rows, hidden, dtype, affine):
    """The op against float64 on rows with a large mean (the shift keeps their variance)."""
    x = randn(rows, hidden, dtype=dtype, scale=2.0, shift=300.0 if dtype == F32 else 30.0)
    w = randn(hidden, dtype=dtype) if "weight" in affine else None
    b = randn(hidden, dtype=dtype) if "bias" in affine else None
    out = nki_kernels.layer_norm(x, (hidden,), w, b, 1e-5)
    expected = references.layer_norm(x.double(), (hidden,), None if w is None else w.double(),
                                     None if b is None else b.double(), 1e-5, compute_dtype=torch.float64)
    assert_matches(out, expected, dtype, rel=None if dtype != F16 else 2e-3)


@pytest.mark.parametrize("rows", [1, ROW_LOOP, ROW_LOOP + 1, 40])
@pytest.mark.parametrize("hidden", [4096, 384])
def test_layer_norm_decode_large_mean(simulator_backend, rows, hidden):
    # rows of mean 1e3 and std 1 (and 384 = 3 * 128: 1/H is inexact in fp32): the second
    # pass keeps the variance exact, a one-pass E[x**2] - E[x]**2 would lose ~20 bits of it
    x = randn(rows, hidden, scale=1.0, shift=1e3)
    w, b = randn(hidden), randn(hidden)
    out = nki_kernels.layer_norm(x, (hidden,), w, b, 1e-5)
    expected = references.layer_norm(x.double(), (hidden,), w.double(), b.double(), 1e-5,
                                     compute_dtype=torch.float64)
    assert_matches(out, expected, F32)


@pytest.mark.parametrize("rows", [1, ROW_LOOP + 1, 40])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_layer_norm_decode_16bit_large_mean(simulator_backend, rows, dtype):
    # 16-bit rows are centred on the mean of 128 of their samples (norm_decode._row_shifts),
    # not on 0: fp16 rows of mean 1e4 and std 8 (fp16's step there) would lose ~20 of the
    # variance's 24 bits to a one-pass E[x**2] - E[x]**2 in fp32 ((1e4 / 8)**2 ~ 2**20; with
    # the shift set to 0 this fails at every row count). bf16 (step 64 at 1e4) cannot hold a
    # mean more than ~2**8 std out, where a one-pass variance stays within bf16's tolerance:
    # its rows check the path, not the shift
    std = 8.0 if dtype == F16 else 64.0
    x = randn(rows, 4096, dtype=dtype, scale=std, shift=1e4)
    w, b = randn(4096, dtype=dtype), randn(4096, dtype=dtype)
    out = nki_kernels.layer_norm(x, (4096,), w, b, 1e-5)
    expected = references.layer_norm(x.double(), (4096,), w.double(), b.double(), 1e-5,
                                     compute_dtype=torch.float64)
    assert_matches(out, expected, dtype, rel=None if dtype != F16 else 2e-3)


@pytest.mark.parametrize("rows", [1, PER_ROW, 40])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_layer_norm_decode_16bit_samples_far_from_the_mean(simulator_backend, rows, dtype):
    # the shift K of 16-bit rows is the mean of columns 0, H1, 2*H1, ... (one per partition);
    # with those 60 std out, K is ~sqrt(H1) std from the row's mean, near the bound
    # (K - mean)**2 <= H1 * var that _row_shifts' error estimate rests on: mean(c**2) is
    # ~(1 + H1) var, of which mean(c)**2 cancels all but var
    hidden = 8192
    h1 = hidden // 128
    x = torch.randn(rows, hidden)
    x[:, ::h1] += 60.0
    x = x.to(dtype)
    xd = x.double()
    far = (xd[:, ::h1].mean(1) - xd.mean(1)) ** 2 / xd.var(1, unbiased=False)
    assert bool((far > 0.9 * h1).all()), f"the samples are only {far.min():.1f} var from the mean"
    w, b = randn(hidden, dtype=dtype), randn(hidden, dtype=dtype)
    out = nki_kernels.layer_norm(x, (hidden,), w, b, 1e-5)
    expected = references.layer_norm(xd, (hidden,), w.double(), b.double(), 1e-5, compute_dtype=torch.float64)
    assert_matches(out, expected, dtype, rel=None if dtype != F16 else 2e-3)


@pytest.mark.parametrize("rows", [2, ROW_LOOP + 2])
def test_layer_norm_decode_constant_rows(simulator_backend, rows):
    # rows of one repeated value: var = 0, y = 0 exactly in float64, so the output is the
    # bias. The first mean of 1000.1 is ~1e-3 off in fp32 (1/384 is inexact), which times
    # rstd = 1/sqrt(1e-5) would be ~0.3; the residual-mean correction takes it to ~1e-9
    hidden = 384
    x = (1000.1 + 0.25 * torch.arange(rows, dtype=F32)).unsqueeze(1).expand(rows, hidden).contiguous()
    w, b = randn(hidden), randn(hidden)
    out = nki_kernels.layer_norm(x, (hidden,), w, b, 1e-5)
    torch.testing.assert_close(out, b.expand(rows, hidden), atol=1e-6, rtol=0)


def _result(call, lnc):
    kernel = _dispatch.simulator_kernel(call)[lnc]
    return simulator.run(kernel, *[t.contiguous() for t in call.tensors], **call.static)


def _run(call, lnc):
    return _result(call, lnc).outputs


@pytest.mark.parametrize("rows, hidden", [(2, 384), (3, 384), (ROW_LOOP + 1, 384), (MAX_ROWS - 1, 384),
                                         (5, 8192), (7, 8192), (9, 8192), (17, 8192)])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_decode_both_degrees_give_identical_outputs(op, rows, hidden):
    # both paths, odd and even splits: the path follows the total row count, so each row
    # gets the same instructions whichever program takes it. The odd counts at H = 8192
    # give the programs' row-mean matmuls other widths than LNC=1's (a review found them
    # differing in the last bit while the simulator's fp32 matmul depended on the width)
    x = randn(rows, hidden, dtype=BF16, shift=3.0)
    w, b = randn(hidden, dtype=BF16), randn(hidden, dtype=BF16)
    call = (norms.rms_norm_kernel_call(x, (hidden,), w, 1e-6) if op == "rms_norm"
            else norms.layer_norm_kernel_call(x, (hidden,), w, b, 1e-5))
    assert call.module == "norm_decode"
    one, two = _run(call, 1), _run(call, 2)
    assert not torch.isnan(two).any(), "an element no program wrote"
    assert torch.equal(one, two), "LNC=2 differs from LNC=1"


# (rows, hidden, dtype, affine) whose programs give GpSimd some rows' element-wise steps
# (norm_decode._split_rows) at LNC=2 and at LNC=1: weight and bias, weight only (an odd
# count), bias only (fp32's two-pass rows), neither (the widest H the decode kernel takes
# at 48 rows)
SPLIT_CASES = [(48, 8192, F16, "weight+bias"), (33, 8192, BF16, "weight"), (40, 4096, F32, "bias"),
               (48, 16384, BF16, "none")]


def _gpsimd_tensor_tensors(call, lnc):
    res = _result(call, lnc)
    return res.outputs, sum(1 for ins in res.trace if ins.engine == "gpsimd" and ins.op == "tensor_tensor")


@pytest.mark.parametrize("rows, hidden, dtype, affine", SPLIT_CASES,
                         ids=[f"{r}x{h}-{str(d)[6:]}-{a}" for r, h, d, a in SPLIT_CASES])
def test_layer_norm_decode_rows_split_between_vector_and_gpsimd(rows, hidden, dtype, affine):
    # a large mean (the shifted statistics keep the variance) and both degrees: the
    # split changes which engine computes a row, never its fp32 operations, so LNC=1 and
    # LNC=2 (other splits) give the same bits, and both match float64
    x = randn(rows, hidden, dtype=dtype, scale=2.0, shift=300.0 if dtype == F32 else 30.0)
    w = randn(hidden, dtype=dtype) if "weight" in affine else None
    b = randn(hidden, dtype=dtype) if "bias" in affine else None
    call = norms.layer_norm_kernel_call(x, (hidden,), w, b, 1e-5)
    assert call.module == "norm_decode"
    (one, g_one), (two, g_two) = _gpsimd_tensor_tensors(call, 1), _gpsimd_tensor_tensors(call, 2)
    # the all-rows form gives GpSimd only * weight and + bias; a split adds c = x - K,
    # y = c - m2 and y * rstd for GpSimd's rows, in every program
    affine_steps = (w is not None) + (b is not None)
    assert g_one >= 3 + affine_steps and g_two >= 2 * (3 + affine_steps), (g_one, g_two)
    assert not torch.isnan(two).any(), "an element no program wrote"
    assert torch.equal(one, two), "LNC=2 differs from LNC=1"
    expected = references.layer_norm(x.double(), (hidden,), None if w is None else w.double(),
                                     None if b is None else b.double(), 1e-5, compute_dtype=torch.float64)
    assert_matches(one, expected, dtype, rel=None if dtype != F16 else 2e-3)


@pytest.mark.parametrize("rows, hidden, decode", [
    (norms.DECODE_WIDE_PICK_ROWS, 1024, True),              # wide rows: up to 64
    (norms.DECODE_WIDE_PICK_ROWS, norms.DECODE_WIDE_HIDDEN, True),       # "wide" from this hidden on
    (norms.DECODE_PICK_ROWS + 1, norms.DECODE_WIDE_HIDDEN - 128, False),
    (norms.DECODE_WIDE_PICK_ROWS + 1, 1024, False),
    (norms.DECODE_PICK_ROWS, 512, True),                    # narrower rows: up to 40
    (norms.DECODE_PICK_ROWS + 1, 512, False),
    (8, 256, False),                                        # below DECODE_MIN_HIDDEN: row kernels
    (4, 1000, False),                                       # hidden not a multiple of 128
    (40, 8192 * 4, False),                                  # 40 x 256 = 10240 elements per partition
])
def test_decode_kernel_is_chosen_by_shape(rows, hidden, decode):
    assert hidden <= norms.MAX_HIDDEN, "a case above the kernels' limit tests nothing here"
    x = torch.randn(rows, hidden)
    call = norms.rms_norm_kernel_call(x, (hidden,), None, 1e-6)
    assert (call.module == "norm_decode") is decode
    call = norms.layer_norm_kernel_call(x, (hidden,), None, None, 1e-5)
    assert (call.module == "norm_decode") is decode


@pytest.mark.parametrize("rows", [1, ROW_LOOP + 1, 16])      # 16: the grouped layout
def test_layer_norm_decode_large_constant_rows_with_tiny_eps(simulator_backend, rows):
    # fuzz seed 13 case 766: rows of one large value (1e12) with eps 1e-12. The fp32 mean is
    # off by ulps of 1e12, so c = x - m is a nonzero constant and mean(c**2) - m2**2 rounds
    # to +-ulps of m2**2, below 0 half the time, which eps cannot lift: rstd was NaN. The
    # variance is clamped at 0 (torch: var = 0 exactly), so the output is 0
    hidden = 4096
    x = (1e12 * (1.0 + 0.125 * torch.arange(rows, dtype=F32))).unsqueeze(1).expand(rows, hidden)
    out = nki_kernels.layer_norm(x, (hidden,), None, None, 1e-12)
    torch.testing.assert_close(out, torch.zeros(rows, hidden), atol=0, rtol=0)



@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("rows, hidden, limit", [
    (MAX_ROWS + 1, 1024, r"N=65 exceeds DECODE_MAX_ROWS=64"),
    (240, 1024, r"N=240 exceeds DECODE_MAX_ROWS=64"),
    (16, 128 * 1024, r"N \* H / 128 = 16384 exceeds DECODE_MAX_ELEMENTS=8192"),
    (4, 1000, r"H=1000 is not a multiple of 128"),
])
def test_decode_kernels_refuse_shapes_outside_their_contract(op, rows, hidden, limit):
    # each limit by name (the grouped layout's first version, 2026-12-07, dispatched before the check:
    # [240, 1024] ran, [16, 131072] fp32 ran out of SBUF)
    module = _kernel_sources.load("norm_decode", "simulator")
    kernel = module.rms_norm_decode_kernel if op == "rms_norm" else module.layer_norm_decode_kernel
    x = randn(rows, hidden, dtype=BF16)
    with pytest.raises(Exception, match=limit):
        simulator.run(kernel[2], x)


# the first three take the grouped layout, the others the hidden-on-partitions one
# (test_non_finite_row_cases_take_both_layouts)
NON_FINITE_CASES = [(16, 4096, BF16), (15, 12288, F32), (64, 1024, F16),
                    (8, 4096, BF16), (14, 4096, F16), (6, 8192, F32), (57, 1024, BF16)]


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("rows, hidden, dtype", NON_FINITE_CASES)
def test_a_non_finite_row_leaves_the_other_rows_alone(simulator_backend, op, rows, hidden, dtype):
    # a NaN in one row and an inf in another: torch gives those rows NaN / 0 (and NaN at the
    # inf), every other row its own finite result. A layout tried on 2026-12-07 summed each
    # row's partitions with a block-diagonal matmul, where 0 * NaN = NaN made every row of
    # the core's part NaN (the fuzz tier found it: rms_norm seed 81 cases 32 and 1946)
    x = randn(rows, hidden, dtype=dtype, shift=1.0)
    x[3, 5] = float("nan")
    x[rows - 2, 7] = float("inf")
    w = randn(hidden, dtype=dtype)
    if op == "rms_norm":
        out = nki_kernels.rms_norm(x, (hidden,), w, 1e-6)
        expected = references.rms_norm(x.double(), (hidden,), w.double(), 1e-6, compute_dtype=torch.float64)
    else:
        b = randn(hidden, dtype=dtype)
        out = nki_kernels.layer_norm(x, (hidden,), w, b, 1e-5)
        expected = references.layer_norm(x.double(), (hidden,), w.double(), b.double(), 1e-5,
                                         compute_dtype=torch.float64)
    assert torch.equal(torch.isnan(out), torch.isnan(expected)), "NaN where torch has none, or none where it has"
    finite = [r for r in range(rows) if r not in (3, rows - 2)]
    assert_matches(out[finite], expected[finite], dtype, rel=None if dtype != F16 else 2e-3)


# ------------------------------------------------------------------------ the grouped layout
# kernels/norm_decode_grouped.py: each row on G partitions, one contiguous run each, for
# the shapes its rule (``takes``) gives it: the fewest rows it takes (8 a part), an odd
# count (parts of 7 and 8 rows), the most rows, an H that is not a power of two (F = 384
# per partition), fp32
GROUPED = _kernel_sources.load("norm_decode_grouped", "simulator")
GROUPED_CASES = [(16, 4096, F16), (15, 8192, BF16), (MAX_ROWS, 1024, BF16), (32, 3072, F32), (63, 2048, F16)]
GROUPED_IDS = [f"{r}x{h}-{str(d)[6:]}" for r, h, d in GROUPED_CASES]


@pytest.mark.parametrize("rows, hidden, takes", [
    (16, 4096, True), (15, 8192, True), (64, 1024, True), (32, 3072, True), (63, 2048, True),
    (14, 4096, False),       # a part of 7 rows: below NORM_DECODE_GROUPED_MIN_ROWS
    (17, 8192, False),       # a part of 9 rows: groups of 8 fill 72 partitions
    (57, 8192, False),       # a part of 29 rows: groups of 4 fill 116 partitions
    (16, 2048, False),       # 8 rows x 16 = 128 elements a partition in the other layout
])
def test_grouped_layout_takes_the_shapes_of_its_rule(rows, hidden, takes):
    assert GROUPED.takes(rows, hidden) is takes
    if takes:
        g = GROUPED.group_size(rows)
        assert g * -(-rows // 2) <= 128 < 2 * g * -(-rows // 2)


@pytest.mark.parametrize("lnc", [1, 2])
def test_grouped_layout_moves_one_run_per_partition(lnc):
    # the point of the layout: each partition's share of x (and of the output) is one
    # contiguous HBM run, where the other layout reads one run of H / 128 per row
    from nki_kernels.simulator.cost.model import contiguous_runs

    rows, hidden = 16, 4096
    call = norms.layer_norm_kernel_call(randn(rows, hidden, dtype=F16), (hidden,), randn(hidden, dtype=F16),
                                        randn(hidden, dtype=F16), 1e-5)
    trace = _result(call, lnc).trace
    x_loads = [ins for ins in trace if ins.op == "dma_copy" and ins.reads[0].buffer == "hbm"
               and tuple(ins.reads[0].shape) == (rows // 2 * GROUPED.group_size(rows), hidden // GROUPED.group_size(rows))]
    stores = [ins for ins in trace if ins.op == "dma_copy" and ins.writes[0].buffer == "hbm"]
    assert len(x_loads) == 2 and len(stores) == 2          # a part per program, or both in turn
    # the transfer's chunks (DMA descriptors): the larger count of its two sides
    for ins in x_loads + stores:
        assert max(contiguous_runs(ins.reads[0]), contiguous_runs(ins.writes[0])) == 128


@pytest.mark.parametrize("rows, hidden, dtype", GROUPED_CASES, ids=GROUPED_IDS)
@pytest.mark.parametrize("affine", ["weight+bias", "weight", "bias", "none"])
def test_layer_norm_decode_grouped(simulator_backend, rows, hidden, dtype, affine):
    assert GROUPED.takes(rows, hidden)
    _check_layer_norm(rows, hidden, dtype, affine)


@pytest.mark.parametrize("rows, hidden, dtype", GROUPED_CASES, ids=GROUPED_IDS)
@pytest.mark.parametrize("affine", ["weight", "none"])
def test_rms_norm_decode_grouped(simulator_backend, rows, hidden, dtype, affine):
    x = randn(rows, hidden, dtype=dtype, shift=0.5)
    w = randn(hidden, dtype=dtype) if affine == "weight" else None
    out = nki_kernels.rms_norm(x, (hidden,), w, 1e-6)
    expected = references.rms_norm(x.double(), (hidden,), None if w is None else w.double(), 1e-6,
                                   compute_dtype=torch.float64)
    assert_matches(out, expected, dtype, rel=None if dtype != F16 else 2e-3)


@pytest.mark.parametrize("rows, hidden, dtype", GROUPED_CASES, ids=GROUPED_IDS)
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_grouped_layout_gives_identical_outputs_at_both_degrees(op, rows, hidden, dtype):
    # the group size follows the total row count and LNC=1 takes the two parts in turn, so
    # each row gets the same G, the same samples and the same partial sums at both degrees
    x = randn(rows, hidden, dtype=dtype, shift=3.0)
    w, b = randn(hidden, dtype=dtype), randn(hidden, dtype=dtype)
    call = (norms.rms_norm_kernel_call(x, (hidden,), w, 1e-6) if op == "rms_norm"
            else norms.layer_norm_kernel_call(x, (hidden,), w, b, 1e-5))
    one, two = _run(call, 1), _run(call, 2)
    assert not torch.isnan(two).any(), "an element no program wrote"
    assert torch.equal(one, two), "LNC=2 differs from LNC=1"


@pytest.mark.parametrize("affine", ["weight+bias", "weight"])
@pytest.mark.parametrize("rows, hidden, dtype", [(16, 4096, F16), (32, 3072, F32)], ids=["16x4096-f16", "32x3072-f32"])
def test_grouped_layer_norm_shares_its_last_step_with_gpsimd(monkeypatch, rows, hidden, dtype, affine):
    # norm_decode_grouped._last_step: y * rstd (+ bias) reads SBUF only, so GpSimd takes some
    # of the columns beside VectorE where the cost figures say that is sooner; the same fp32
    # operations per element, so the output is bit for bit the unshared one's
    x = randn(rows, hidden, dtype=dtype, scale=2.0, shift=30.0)
    w = randn(hidden, dtype=dtype)
    b = randn(hidden, dtype=dtype) if "bias" in affine else None
    call = norms.layer_norm_kernel_call(x, (hidden,), w, b, 1e-5)
    f = hidden // GROUPED.group_size(rows)
    a = GROUPED._last_step_columns(f, b is not None)
    assert 0 < a < f, (a, f)
    def gpsimd_alu(res):
        return sum(ins.engine == "gpsimd" and ins.op in ("tensor_scalar", "tensor_tensor") for ins in res.trace)

    shared = _result(call, 2)
    monkeypatch.setattr(GROUPED, "_last_step_columns", lambda f, with_bias: f)
    alone = _result(call, 2)
    # GpSimd's share, per program: * rstd, and + bias with a bias (fp32 rows also give
    # GpSimd their rstd's clamp and power, shared or not)
    assert gpsimd_alu(shared) - gpsimd_alu(alone) == 2 * (1 + (b is not None))
    assert not torch.isnan(shared.outputs).any(), "an element no engine wrote"
    assert torch.equal(shared.outputs, alone.outputs)
    expected = references.layer_norm(x.double(), (hidden,), w.double(), None if b is None else b.double(), 1e-5,
                                     compute_dtype=torch.float64)
    assert_matches(shared.outputs, expected, dtype, rel=None if dtype != F16 else 2e-3)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_grouped_layer_norm_16bit_samples_far_from_the_mean(simulator_backend, dtype):
    # the shift of a grouped row is the mean of its first 128 elements (all on the row's
    # first partition); with those 60 std out it sits near the bound (K - mean)**2 <= (H / 128) var
    rows, hidden = 16, 8192
    assert GROUPED.takes(rows, hidden)
    sampled = torch.zeros(hidden, dtype=torch.bool)
    sampled[:128] = True
    x = torch.randn(rows, hidden)
    x[:, sampled] += 60.0
    x = x.to(dtype)
    xd = x.double()
    far = (xd[:, sampled].mean(1) - xd.mean(1)) ** 2 / xd.var(1, unbiased=False)
    assert bool((far > 0.9 * hidden / 128).all()), f"the samples are only {far.min():.1f} var from the mean"
    w, b = randn(hidden, dtype=dtype), randn(hidden, dtype=dtype)
    out = nki_kernels.layer_norm(x, (hidden,), w, b, 1e-5)
    expected = references.layer_norm(xd, (hidden,), w.double(), b.double(), 1e-5, compute_dtype=torch.float64)
    assert_matches(out, expected, dtype, rel=None if dtype != F16 else 2e-3)


def test_grouped_layer_norm_fp16_large_mean(simulator_backend):
    # as test_layer_norm_decode_16bit_large_mean, in the grouped layout: a one-pass variance
    # would lose ~20 of its 24 bits
    rows, hidden = 32, 4096
    assert GROUPED.takes(rows, hidden)
    x = randn(rows, hidden, dtype=F16, scale=8.0, shift=1e4)
    w, b = randn(hidden, dtype=F16), randn(hidden, dtype=F16)
    out = nki_kernels.layer_norm(x, (hidden,), w, b, 1e-5)
    expected = references.layer_norm(x.double(), (hidden,), w.double(), b.double(), 1e-5,
                                     compute_dtype=torch.float64)
    assert_matches(out, expected, F16, rel=2e-3)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_grouped_layer_norm_constant_rows(simulator_backend, dtype):
    # rows of one repeated value: var = 0, so the output is the bias (up to its rounding)
    rows, hidden = 16, 4096
    assert GROUPED.takes(rows, hidden)
    x = (100.25 + 0.5 * torch.arange(rows, dtype=F32)).unsqueeze(1).expand(rows, hidden).contiguous().to(dtype)
    w, b = randn(hidden, dtype=dtype), randn(hidden, dtype=dtype)
    out = nki_kernels.layer_norm(x, (hidden,), w, b, 1e-5)
    torch.testing.assert_close(out, b.expand(rows, hidden), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_grouped_layer_norm_16bit_large_constant_rows_with_tiny_eps(simulator_backend, dtype):
    # 16-bit rows take rstd without a clamp (norm_decode_grouped._layer_block): the shift is
    # the exact mean of 128 equal values, so c = 0 and var = 0 exactly, and the output is 0
    # (a shift off by an ulp would give var rounding below 0 and eps = 1e-12 could not lift
    # it: NaN, as the fp32 test above shows for the hidden-on-partitions layout)
    rows, hidden = 16, 4096
    assert GROUPED.takes(rows, hidden)
    value = 6e4 if dtype == F16 else 3e38
    x = (value * (1.0 - 0.0625 * torch.arange(rows, dtype=F32))).unsqueeze(1).expand(rows, hidden).to(dtype)
    out = nki_kernels.layer_norm(x, (hidden,), None, None, 1e-12)
    torch.testing.assert_close(out, torch.zeros(rows, hidden, dtype=dtype), atol=0, rtol=0)


def test_non_finite_row_cases_take_both_layouts():
    # test_a_non_finite_row_leaves_the_other_rows_alone pins both layouts' row independence
    # only if its shapes take both
    taken = [GROUPED.takes(rows, hidden) for rows, hidden, _ in NON_FINITE_CASES]
    assert taken == [True] * 3 + [False] * 4


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_grouped_layer_norm_16bit_near_constant_rows_with_zero_eps(simulator_backend, dtype):
    # 16-bit rows take rstd without a clamp: rows of one large value with a few elements
    # one ulp off (some among the shift's 128 samples) have a tiny variance, and with eps = 0
    # a variance that rounded below 0 would give NaN where float64 torch is finite
    rows, hidden = 16, 4096
    assert GROUPED.takes(rows, hidden)
    base = 2048.0 if dtype == F16 else 32768.0
    ulp = 2.0 if dtype == F16 else 256.0
    x = torch.full((rows, hidden), base)
    gen = torch.Generator().manual_seed(7)
    for r in range(rows):
        cols = torch.randperm(hidden, generator=gen)[: 2 + r]
        cols[0] = r                                    # one inside the shift's samples
        x[r, cols] += ulp * (2 * torch.randint(0, 2, (cols.numel(),), generator=gen) - 1)
    x = x.to(dtype)
    out = nki_kernels.layer_norm(x, (hidden,), None, None, 0.0)
    expected = references.layer_norm(x.double(), (hidden,), None, None, 0.0, compute_dtype=torch.float64)
    assert torch.isfinite(expected).all() and torch.isfinite(out).all()
    assert_matches(out, expected, dtype, rel=None if dtype != F16 else 2e-3)


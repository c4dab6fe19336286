"""layer_norm, rms_norm and fused_add_rms_norm: NKI kernels in the simulator vs float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nki_kernels
from nki_kernels import references

from ._cases import DTYPE_IDS, DTYPES, GRID, assert_matches, randn, run_traced


def _f64(*tensors):
    """float64 copies: the twins in references.py run on them give the unrounded reference."""
    return [None if t is None else t.double() for t in tensors]


def _affine(hidden, kind, dtype):
    # weight ~ N(1, 0.5) and bias ~ N(0, 1): far from the identity so a dropped or misplaced
    # parameter shows up.
    weight = randn(hidden, dtype=dtype, scale=0.5, shift=1.0) if kind != "none" else None
    bias = randn(hidden, dtype=dtype) if kind == "weight+bias" else None
    return weight, bias


@pytest.mark.parametrize("rows, hidden, dtype", GRID)
def test_layer_norm(simulator_backend, rows, hidden, dtype):
    # Mean 3 and std 2: a shifted input exercises the centring (E[x^2] - mean^2 would lose it).
    x = randn(rows, hidden, dtype=dtype, scale=2.0, shift=3.0)
    weight, bias = _affine(hidden, "weight+bias", dtype)
    out = nki_kernels.layer_norm(x, (hidden,), weight, bias, eps=1e-5)
    x64, w64, b64 = _f64(x, weight, bias)
    expected = references.layer_norm(x64, (hidden,), w64, b64, 1e-5, compute_dtype=torch.float64)
    assert_matches(out, expected, dtype)


@pytest.mark.parametrize("affine", ["none", "weight", "bias", "weight+bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_layer_norm_affine_variants(simulator_backend, affine, dtype):
    rows, hidden = 130, 1000
    x = randn(2, rows // 2, hidden, dtype=dtype, shift=-1.0)
    weight = randn(hidden, dtype=dtype, scale=0.5, shift=1.0) if "weight" in affine else None
    bias = randn(hidden, dtype=dtype) if "bias" in affine else None
    out = nki_kernels.layer_norm(x, hidden, weight, bias, eps=1e-6)
    expected = F.layer_norm(x.double(), (hidden,), None if weight is None else weight.double(),
                            None if bias is None else bias.double(), 1e-6)
    assert_matches(out, expected, dtype)


def test_layer_norm_multi_dim_normalized_shape(simulator_backend):
    x = randn(3, 5, 8, 96)
    weight, bias = randn(8, 96), randn(8, 96)
    out = nki_kernels.layer_norm(x, (8, 96), weight, bias)
    assert_matches(out, F.layer_norm(x.double(), (8, 96), weight.double(), bias.double()), torch.float32)


def test_layer_norm_fp32_weight_with_bf16_input(simulator_backend):
    # Mixed dtypes as torch allows them: the result keeps the input's dtype.
    x = randn(9, 768, dtype=torch.bfloat16)
    weight, bias = randn(768, shift=1.0), randn(768)
    out = nki_kernels.layer_norm(x, (768,), weight, bias)
    assert_matches(out, F.layer_norm(x.double(), (768,), weight.double(), bias.double()), torch.bfloat16)


@pytest.mark.parametrize("rows, hidden, dtype", GRID)
def test_rms_norm(simulator_backend, rows, hidden, dtype):
    x = randn(rows, hidden, dtype=dtype, scale=2.0, shift=0.5)
    weight = randn(hidden, dtype=dtype, scale=0.5, shift=1.0)
    out = nki_kernels.rms_norm(x, [hidden], weight, eps=1e-6)
    x64, w64 = _f64(x, weight)
    assert_matches(out, references.rms_norm(x64, (hidden,), w64, 1e-6, compute_dtype=torch.float64), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rms_norm_without_weight_and_default_eps(simulator_backend, dtype):
    # eps=None -> float32's machine epsilon for every input dtype, as F.rms_norm does (its
    # opmath type's; bf16's own 0.0078 would be visible at this input scale).
    x = randn(3, 43, 64, dtype=dtype, scale=0.05)
    out = nki_kernels.rms_norm(x, (64,))
    eps = torch.finfo(torch.float32).eps
    assert torch.equal(F.rms_norm(x, (64,)), F.rms_norm(x, (64,), eps=eps))   # torch's own default
    x64 = x.double()
    assert_matches(out, x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps), dtype)


@pytest.mark.parametrize("target, dtype, hidden, on_vector_only", [
    ("trn2", torch.bfloat16, 4096, True),    # VectorE's 16-bit mode: 1.2 us a row, ScalarE's squares 3.7
    ("trn2", torch.bfloat16, 256, True),     # 0.17 against 0.51
    ("trn3", torch.float16, 2048, True),     # 0.51 against 1.15 (ScalarE's 16-bit rate is 2 there)
    ("trn2", torch.float32, 4096, False),    # fp32: VectorE's pass (4.4 us) outlasts the squares (3.7)
    ("trn2", torch.float32, 256, False),     # 0.37 against 0.51: more than half
    ("trn3", torch.float32, 8192, False),    # about equal (6.9 against 7.1)
    ("trn1", torch.bfloat16, 4096, False),   # no 16-bit mode on NeuronCore-v2
])
def test_rms_norm_without_weight_places_the_normalisation_by_the_engines_figures(target, dtype, hidden,
                                                                                  on_vector_only):
    # kernels/rms_norm.py _unweighted_vector_share: y = x * rstd all on VectorE where its pass
    # over a row takes at most half of ScalarE's squares of it, else split with ScalarE's copy
    from nki_kernels.ops import norms

    x = randn(300, hidden, dtype=dtype, scale=2.0, shift=0.5)
    out, trace = run_traced(norms.rms_norm_kernel_call(x, (hidden,), None, 1e-6), lnc=1, target=target)
    scalar_copies = [i for i in trace if i.engine == "scalar" and i.op == "activation"
                     and i.attrs.get("func") == "copy"]
    vector_scalings = [i for i in trace if i.engine == "vector" and i.op == "tensor_scalar"]
    assert vector_scalings and (not scalar_copies) == on_vector_only
    x64 = x.double()
    assert_matches(out, x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + 1e-6), dtype)


@pytest.mark.parametrize("target, rows, hidden, dtype, affine, slot_stores", [
    # ViT-B at LNC=2: each program's last block holds 3 rows per partition (the second
    # program's follows its 40-row tail block); the affine step after each slot's y outlasts
    # the two extra transfers: stored slot by slot
    ("trn2", 1576, 768, torch.bfloat16, "weight+bias", 3),
    ("trn2", 1576, 768, torch.float32, "none", 3),      # fp32 y is a ScalarE pass per row
    ("trn3", 512, 1000, torch.float16, "weight", 2),
    # 16-bit without a weight: y alone follows the statistics, shorter than the extra transfer
    ("trn2", 1576, 768, torch.bfloat16, "none", 0),
    # 16 rows of 128 columns per partition: 16 transfers of 256 B, each a transfer gap
    ("trn2", 4096, 128, torch.bfloat16, "weight+bias", 0),
], ids=["vit-b-bf16", "fp32-no-weight", "trn3-fp16-weight", "bf16-no-weight", "rows-of-128"])
def test_layer_norm_stores_the_last_block_slot_by_slot_where_it_pays(target, rows, hidden, dtype, affine,
                                                                       slot_stores):
    # kernels/layer_norm.py DRAIN_BY_SLOT / _drains_by_slot: each program's last block, when
    # it holds several rows per partition, is stored row slot by row slot ([parts, H] stores
    # of one row per partition) where the work after the statistics outlasts the extra
    # transfers; every other block is one [parts, J, H] store
    from nki_kernels.ops import norms

    x = randn(rows, hidden, dtype=dtype, scale=2.0, shift=3.0)
    weight, bias = _affine(hidden, affine, dtype)
    out, trace = run_traced(norms.layer_norm_kernel_call(x, (hidden,), weight, bias, 1e-5), lnc=2, target=target)
    stores = [i for i in trace if i.op == "dma_copy" and i.writes[0].buffer == "hbm"]
    for core in (0, 1):
        slots = [i for i in stores if i.attrs.get("core") == core and len(i.writes[0].shape) == 2]
        assert len(slots) == slot_stores, f"core {core}"
    x64, w64, b64 = _f64(x, weight, bias)
    assert_matches(out, F.layer_norm(x64, (hidden,), w64, b64, 1e-5), dtype)


SMALL_VARIANCE = [(5, 64), (2, 1000), (3, 9001)]
SMALL_VARIANCE_IDS = ["decode-rows", "prefill-rows", "streamed-rows"]


@pytest.mark.parametrize("rows, hidden", SMALL_VARIANCE, ids=SMALL_VARIANCE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_layer_norm_large_eps_on_small_variance_rows(simulator_backend, rows, hidden, dtype):
    # eps 0.1 against a variance of ~1e-4: the output is ~0.03 of the eps-free one, so a
    # kernel that dropped or mis-scaled eps is far outside the tolerance (at eps 1e-5 and a
    # variance of ~1, a wrong eps moves the output by ~1e-6 relative, under fp32's bound)
    x = randn(rows, hidden, dtype=dtype, scale=0.01, shift=0.5)
    weight, bias = randn(hidden, dtype=dtype, scale=0.5, shift=1.0), randn(hidden, dtype=dtype)
    out = nki_kernels.layer_norm(x, (hidden,), weight, bias, eps=0.1)
    x64, w64, b64 = _f64(x, weight, bias)
    assert_matches(out, F.layer_norm(x64, (hidden,), w64, b64, eps=0.1), dtype)


@pytest.mark.parametrize("rows, hidden", SMALL_VARIANCE, ids=SMALL_VARIANCE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rms_norm_large_eps_on_small_mean_square_rows(simulator_backend, rows, hidden, dtype):
    # as the LayerNorm test above: eps 0.1 against a mean square of ~1e-4, so the output is
    # ~0.03 of the eps-free one; mutation testing found the streamed path (hidden > 8192)
    # without its eps passing the tests, whose inputs have a mean square of ~4
    x = randn(rows, hidden, dtype=dtype, scale=0.01)
    weight = randn(hidden, dtype=dtype, scale=0.5, shift=1.0)
    out = nki_kernels.rms_norm(x, (hidden,), weight, eps=0.1)
    x64, w64 = _f64(x, weight)
    assert_matches(out, references.rms_norm(x64, (hidden,), w64, 0.1, compute_dtype=torch.float64), dtype)


@pytest.mark.parametrize("rows, hidden", [(7, 1000), (130, 768), (3, 9001)])
def test_rms_norm_16bit_rounds_once(simulator_backend, rows, hidden):
    # statistics and the product with the weight in fp32, one rounding (README): the bf16
    # output is the float64 result rounded to bf16 except within fp32's error (~2**-23
    # relative) of a bf16 midpoint, ~1e-4 of the outputs at most. Mutation testing found the
    # mean of squares kept in bf16 (12 % of the outputs one bf16 step off) inside the bf16
    # tolerance of test_rms_norm.
    x = randn(rows, hidden, dtype=torch.bfloat16, scale=2.0, shift=1.0)
    weight = randn(hidden, dtype=torch.bfloat16, scale=0.5, shift=1.0)
    out = nki_kernels.rms_norm(x, (hidden,), weight, eps=1e-6)
    x64, w64 = _f64(x, weight)
    expected = references.rms_norm(x64, (hidden,), w64, 1e-6, compute_dtype=torch.float64).to(torch.bfloat16)
    off = (out != expected).float().mean().item()
    assert off < 1e-3, f"{off:.2%} of the outputs are not the float64 result rounded once"


@pytest.mark.parametrize("rows, hidden, dtype", GRID)
def test_fused_add_rms_norm(simulator_backend, rows, hidden, dtype):
    x = randn(rows, hidden, dtype=dtype)
    residual = randn(rows, hidden, dtype=dtype, scale=3.0)
    weight = randn(hidden, dtype=dtype, scale=0.5, shift=1.0)
    normed, total = nki_kernels.fused_add_rms_norm(x, residual, weight, 1e-5)
    # the sum is defined in the input dtype (what an eager add produces) ...
    expected_total = (x.double() + residual.double()).to(dtype)
    assert total.dtype == dtype
    torch.testing.assert_close(total, expected_total, atol=0, rtol=0)
    # ... and the norm is computed from it, compared unrounded in float64
    t64, w64 = _f64(expected_total, weight)
    assert_matches(normed, references.rms_norm(t64, (hidden,), w64, 1e-5, compute_dtype=torch.float64), dtype)


def test_fused_add_rms_norm_without_weight(simulator_backend):
    x, residual = randn(2, 65, 1000), randn(2, 65, 1000)
    normed, total = nki_kernels.fused_add_rms_norm(x, residual, None, None)
    t64 = x.double() + residual.double()
    eps = torch.finfo(torch.float32).eps
    assert_matches(normed, t64 * torch.rsqrt(t64.square().mean(-1, keepdim=True) + eps), torch.float32)
    assert_matches(total, t64, torch.float32)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "fused_add_rms_norm"])
def test_norm_backward_matches_torch(simulator_backend, op):
    x = randn(5, 96).requires_grad_(True)
    w = randn(96, shift=1.0).requires_grad_(True)
    b = randn(96).requires_grad_(True)
    r = randn(5, 96).requires_grad_(True)
    grad = randn(5, 96)
    leaves = [x, w, b, r]
    ref_leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
    xr, wr, br, rr = ref_leaves
    if op == "layer_norm":
        nki_kernels.layer_norm(x, (96,), w, b).backward(grad)
        F.layer_norm(xr, (96,), wr, br).backward(grad)
        check = [0, 1, 2]
    elif op == "rms_norm":
        nki_kernels.rms_norm(x, (96,), w, 1e-6).backward(grad)
        F.rms_norm(xr, (96,), wr, 1e-6).backward(grad)
        check = [0, 1]
    else:
        normed, total = nki_kernels.fused_add_rms_norm(x, r, w, 1e-6)
        (normed * grad + total * 0.5 * grad).sum().backward()
        tr = xr + rr
        (F.rms_norm(tr, (96,), wr, 1e-6) * grad + tr * 0.5 * grad).sum().backward()
        check = [0, 1, 3]
    for i in check:
        torch.testing.assert_close(leaves[i].grad, ref_leaves[i].grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_norms_reference_path(reference_backend, dtype):
    x = randn(4, 33, dtype=dtype)
    w = randn(33, dtype=dtype, shift=1.0)
    b = randn(33, dtype=dtype)
    from tests._helpers import TOLERANCES

    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(nki_kernels.layer_norm(x, (33,), w, b).double(),
                               F.layer_norm(x.double(), (33,), w.double(), b.double()), atol=atol, rtol=rtol)
    torch.testing.assert_close(nki_kernels.rms_norm(x, (33,), w, 1e-6).double(),
                               F.rms_norm(x.double(), (33,), w.double(), 1e-6), atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------- training forward

# (rows, hidden): a tail block only, hidden not a multiple of 128; ViT-B (2-3 rows per
# partition per block: row slots on both statistics engines, the slot-by-slot drain, a
# 40-row tail); one row (the decode shape the inference op sends to norm_decode.py).
TRAIN_SHAPES = [(7, 1000), (1576, 768), (1, 2048)]


@pytest.mark.parametrize("rows, hidden", TRAIN_SHAPES, ids=[f"{r}x{h}" for r, h in TRAIN_SHAPES])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_training_forward_saves_each_rows_mean_and_rstd(simulator_backend, rows, hidden, dtype):
    # norms._layer_norm_train_op: the row kernel with save_stats. Its output matches float64
    # and is the inference op's bit for bit where that runs the row kernel too (not the
    # decode kernel); its statistics are the float64 mean and rsqrt(var + eps) to fp32
    # accuracy (two-pass sums or bn_stats in fp32: bound 2e-6, ~16 fp32 ulps). Every row's
    # statistics are written (outputs start as NaN).
    from nki_kernels.ops import norms

    x = randn(rows, hidden, dtype=dtype, scale=3.0, shift=2.0)
    weight, bias = _affine(hidden, "weight+bias", dtype)
    out, stats = norms._layer_norm_train_op(x, [hidden], weight, bias, 1e-5)
    x64, w64, b64 = _f64(x, weight, bias)
    assert_matches(out, references.layer_norm(x64, (hidden,), w64, b64, 1e-5, compute_dtype=torch.float64), dtype)
    if not norms._decode_shape(rows, hidden):
        assert torch.equal(out, norms._layer_norm_op(x, [hidden], weight, bias, 1e-5))
    assert stats.shape == (rows, 2) and stats.dtype == torch.float32
    assert not torch.isnan(stats).any()
    x64 = x.double()
    mean = x64.mean(dim=1)
    rstd = torch.rsqrt(x64.var(dim=1, unbiased=False) + 1e-5)
    assert float(((stats[:, 0].double() - mean).abs() / x64.abs().amax(dim=1)).max()) < 2e-6
    assert float(((stats[:, 1].double() - rstd) / rstd).abs().max()) < 2e-6


def test_training_statistics_keep_the_inputs_row_dims(simulator_backend):
    # [B, S, H] input: stats [B, S, 2] (sharding.py shards them along the input's row dims,
    # e.g. a sequence-parallel Shard(1)); row (b, s)'s are the statistics of x[b, s], and the
    # backward takes them in that layout (the kernel reads them as [B*S, 2]). The float64
    # bounds as in the test above.
    from nki_kernels.ops import norms

    x = randn(3, 5, 200, dtype=torch.bfloat16, scale=3.0, shift=2.0)
    weight, bias = _affine(200, "weight+bias", torch.bfloat16)
    out, stats = norms._layer_norm_train_op(x, [200], weight, bias, 1e-5)
    assert stats.shape == (3, 5, 2) and stats.dtype == torch.float32
    x64 = x.double()
    mean, rstd = x64.mean(dim=-1), torch.rsqrt(x64.var(dim=-1, unbiased=False) + 1e-5)
    assert float(((stats[..., 0].double() - mean).abs() / x64.abs().amax(dim=-1)).max()) < 2e-6
    assert float(((stats[..., 1].double() - rstd) / rstd).abs().max()) < 2e-6
    dy = randn(3, 5, 200, dtype=torch.bfloat16)
    dx, dw, db = norms._layer_norm_backward_op(dy, x, stats, [200], weight, bias, 1e-5)
    flat = norms._layer_norm_backward_op(dy.reshape(15, 200), x.reshape(15, 200), stats.reshape(15, 2), [200],
                                         weight, bias, 1e-5)
    assert torch.equal(dx, flat[0].reshape(3, 5, 200)) and torch.equal(dw, flat[1]) and torch.equal(db, flat[2])


@pytest.mark.parametrize("rows, hidden, stores_per_core", [
    (2048, 4096, [1, 1]),       # 8 blocks of one row per partition per core: one run each
    (1576, 768, [1, 2]),        # 2 blocks of 3 rows per partition; core 1 also the 40-row tail
    (300, 1000, [1, 2]),        # 128 rows on core 0; 128 + a 44-row tail on core 1
], ids=["2048x4096", "1576x768", "300x1000"])
def test_training_forward_stores_statistics_once_per_run_of_blocks(rows, hidden, stores_per_core):
    # kernels/layer_norm.py _stats_plan: a part's statistics are gathered on chip and
    # stored once per run of blocks of the same shape, not once per block (each transfer
    # holds the DMA queues at least the transfer gap); every row's statistics still land
    from nki_kernels import _dispatch, simulator
    from nki_kernels.ops import norms

    x = randn(rows, hidden, dtype=torch.bfloat16, scale=2.0, shift=1.0)
    call = norms.layer_norm_train_kernel_call(x, (hidden,), None, None, 1e-5)
    result = simulator.run(_dispatch.simulator_kernel(call)[2], *call.tensors, **call.static)
    per_core = [0, 0]
    for ins in result.trace:
        if ins.op == "dma_copy" and ins.writes[0].buffer == "hbm" and ins.writes[0].shape[-1] == 2:
            per_core[ins.attrs["core"]] += 1
    assert per_core == stores_per_core
    _, stats = call.finish_outputs(result.outputs)
    torch.testing.assert_close(stats, references.layer_norm_stats(x, (hidden,), 1e-5, compute_dtype=torch.float64),
                               atol=0, rtol=2e-6)


@pytest.mark.parametrize("rows, hidden", [(128 * 600, 8), (128 * 1100 + 5, 2)], ids=["300-slots", "550-slots+tail"])
def test_training_forward_statistics_of_many_rows(rows, hidden):
    # narrow rows pack hundreds of rows per partition into one block; a part's statistics
    # tile holds at most tiling.ROW_STATS_TILE_SLOTS (512) row slots, more take another
    # tile (bounded SBUF whatever the row count): every row's statistics still land
    from nki_kernels import _dispatch, simulator
    from nki_kernels.ops import norms

    x = randn(rows, hidden, dtype=torch.bfloat16, scale=2.0, shift=1.0)
    call = norms.layer_norm_train_kernel_call(x, (hidden,), None, None, 1e-5)
    result = simulator.run(_dispatch.simulator_kernel(call)[2], *call.tensors, **call.static)
    out, stats = call.finish_outputs(result.outputs)
    torch.testing.assert_close(stats, references.layer_norm_stats(x, (hidden,), 1e-5, compute_dtype=torch.float64),
                               atol=0, rtol=2e-6)
    assert_matches(out, references.layer_norm(x.double(), (hidden,), None, None, 1e-5, compute_dtype=torch.float64),
                   torch.bfloat16)


def test_layer_norm_saves_statistics_only_when_a_gradient_is_wanted(simulator_backend, monkeypatch):
    # the public op runs the training forward (and then the backward kernel on its saved
    # statistics) only when autograd will ask for a gradient the backward kernel takes
    from nki_kernels.ops import norms

    calls = []
    for name in ("_layer_norm_op", "_layer_norm_train_op"):
        real = getattr(norms, name)
        monkeypatch.setattr(norms, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    x = randn(5, 64, dtype=torch.bfloat16)
    w = randn(64, dtype=torch.bfloat16).requires_grad_(True)
    nki_kernels.layer_norm(x, (64,), w)
    with torch.no_grad():
        nki_kernels.layer_norm(x, (64,), w)
    nki_kernels.layer_norm(x, (64,), w.detach())
    wide = norms.BACKWARD_MAX_HIDDEN + 64          # past the backward kernel: recompute
    nki_kernels.layer_norm(randn(2, wide, dtype=torch.bfloat16).requires_grad_(True), (wide,))
    assert calls == ["_layer_norm_train_op", "_layer_norm_op", "_layer_norm_op", "_layer_norm_op"]


def test_layer_norm_backward_kernel_reads_the_saved_statistics():
    # the backward kernel takes mean and rstd from the forward instead of recomputing them:
    # no ScalarE statistics pass (square) or rsqrt in its trace; dx right with the true
    # statistics (bf16 bound as tests/ops/test_norm_backward.py) and far off with a doubled
    # rstd, so the kernel follows the statistics it is given
    from nki_kernels import _dispatch, simulator
    from nki_kernels.ops import norms

    x, dy = randn(300, 256, dtype=torch.bfloat16, shift=1.0), randn(300, 256, dtype=torch.bfloat16)
    w = randn(256, dtype=torch.bfloat16, scale=0.5, shift=1.0)
    stats = references.layer_norm_stats(x, (256,), 1e-5)
    dxs = []
    for s in (stats, stats * torch.tensor([1.0, 2.0])):
        call = norms.layer_norm_backward_kernel_call(dy, x, s, (256,), w, None, 1e-5)
        result = simulator.run(_dispatch.simulator_kernel(call)[2], *call.tensors, **call.static)
        dxs.append(call.finish_outputs(result.outputs)[0])
        funcs = {ins.attrs.get("func") for ins in result.trace if ins.op == "activation"}
        assert not funcs & {"rsqrt", "square"}, funcs
    x64 = x.double().requires_grad_(True)
    want, = torch.autograd.grad(F.layer_norm(x64, (256,), w.double(), None, 1e-5), [x64], dy.double())
    scale = float(want.abs().max())
    assert float((dxs[0].double() - want).abs().max()) < 1.2e-2 * scale
    assert float((dxs[1].double() - want).abs().max()) > 0.5 * scale


@pytest.mark.parametrize("stats, match", [
    (torch.zeros(7, 2, dtype=torch.float64), r"stats: shape \(7, 2\) torch.float64; expected \(7, 2\) torch.float32"),
    (torch.zeros(6, 2), r"stats: shape \(6, 2\) torch.float32; expected \(7, 2\) torch.float32"),
    (torch.zeros(7), r"stats: shape \(7,\) torch.float32; expected \(7, 2\) torch.float32"),
    # a [1, 7, 64] input's statistics keep its row dims: [N, 2] is refused
    (torch.zeros(7, 2), r"stats: shape \(7, 2\) torch.float32; expected \(1, 7, 2\) torch.float32"),
], ids=["fp64", "rows", "1-d", "flat"])
def test_layer_norm_backward_rejects_statistics_of_another_shape_or_dtype(stats, match):
    from nki_kernels.ops import norms

    x = randn(1, 7, 64, dtype=torch.bfloat16) if "1, 7, 2" in match else randn(7, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=match):
        norms.layer_norm_backward_kernel_call(x, x, stats, (64,), None, None, 1e-5)
    with pytest.raises(ValueError, match=match):
        norms._layer_norm_backward_reference(x, x, stats, [64], None, None, 1e-5)


def _scalar_statistics_rows(x, weight, bias):
    """How many ScalarE row sums (copy activations reading their accumulator out) the 16-bit
    LayerNorm kernel issues for x: the statistics path the shift by x0 is in."""
    from nki_kernels.ops import norms

    _, trace = run_traced(norms.layer_norm_kernel_call(x, (x.shape[-1],), weight, bias, 1e-5))
    return sum(1 for i in trace if i.op == "activation" and i.attrs.get("reduce") and i.attrs["func"] == "copy")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_layer_norm_constant_rows_with_large_mean_are_exactly_zero(simulator_backend, dtype):
    # Issue 13, defect 7: the 16-bit statistics on ScalarE formed the mean as sum * (-1/H);
    # 1/1000 is inexact in fp32, so rows of 1000.0 centred to 6e-5 and came out as 0.019
    # (torch: exactly 0). [1576, 1000]: row slots on both statistics engines (ScalarE's
    # sums of x - x0 for 16-bit data, checked below), and a tail.
    x = torch.full((1576, 1000), 1000.0, dtype=dtype)
    out = nki_kernels.layer_norm(x, (1000,))
    assert out.dtype == dtype and torch.equal(out, torch.zeros_like(out))
    bias = randn(1000, dtype=dtype)
    out = nki_kernels.layer_norm(x, (1000,), torch.ones(1000, dtype=dtype), bias)
    torch.testing.assert_close(out, bias.expand_as(out), atol=0, rtol=0)
    if dtype != torch.float32:
        assert _scalar_statistics_rows(x, None, None) > 0 and _scalar_statistics_rows(x, bias, bias) > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_layer_norm_rows_whose_first_element_is_far_from_the_mean(simulator_backend, dtype):
    # The 16-bit statistics on ScalarE sum x - x0 (x0: the row's first element; a constant
    # row's mean is then exactly x0) and take mean = sum / H + x0: a first element 1000
    # standard deviations away from the rest is the worst case of that shift (the mean's
    # rounding follows |mean - x0|). [1576, 1000]: row slots on both statistics engines.
    x = randn(1576, 1000, dtype=torch.float32)
    x[:, 0] = 1000.0 * torch.where(randn(1576, dtype=torch.float32) > 0, 1.0, -1.0)
    x = x.to(dtype)
    weight, bias = _affine(1000, "weight+bias", dtype)
    out = nki_kernels.layer_norm(x, (1000,), weight, bias, eps=1e-5)
    x64, w64, b64 = _f64(x, weight, bias)
    assert_matches(out, F.layer_norm(x64, (1000,), w64, b64, 1e-5), dtype)
    assert _scalar_statistics_rows(x, weight, bias) > 0


# ---------------------------------------------------------------------------- streamed rows (H > 8192)

# (rows, hidden): just past the one-pass limit (3 chunks, ragged last), Llama-3.1-405B's
# hidden with a 128-row tile and a 2-row tail (row tiles kept in SBUF between the passes),
# 20000 (fp32: rows and weights past the SBUF budgets, reloaded from HBM per chunk), and
# the largest supported size.
STREAMED = [(3, 8193), (130, 16384), (5, 20000), pytest.param(2, 65536, marks=pytest.mark.sweep)]
STREAM_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", STREAM_DTYPES, ids=str)
@pytest.mark.parametrize("rows, hidden", STREAMED)
def test_streamed_rows(simulator_backend, rows, hidden, dtype):
    # Issue 13: hidden sizes past 8192 (the limit was 8192) stream through SBUF in column
    # chunks, two passes over HBM. Weight in the input dtype (resident up to 64 KiB) and
    # in fp32 with a bias (loaded per chunk past 16384 columns).
    x = randn(rows, hidden, dtype=dtype, scale=2.0, shift=3.0)
    weight = randn(hidden, dtype=dtype, scale=0.5, shift=1.0)
    bias32 = randn(hidden)
    x64, w64 = _f64(x, weight)
    assert_matches(nki_kernels.rms_norm(x, (hidden,), weight, 1e-6),
                   references.rms_norm(x64, (hidden,), w64, 1e-6, compute_dtype=torch.float64), dtype)
    assert_matches(nki_kernels.layer_norm(x, (hidden,), weight.float(), bias32, 1e-5),
                   references.layer_norm(x64, (hidden,), w64, bias32.double(), 1e-5,
                                         compute_dtype=torch.float64), dtype)
    residual = randn(rows, hidden, dtype=dtype)
    normed, total = nki_kernels.fused_add_rms_norm(x, residual, None, 1e-6)
    expected_total = (x.double() + residual.double()).to(dtype)
    assert torch.equal(total, expected_total)
    assert_matches(normed, references.rms_norm(expected_total.double(), (hidden,), None, 1e-6,
                                               compute_dtype=torch.float64), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows, hidden", [(3, 8193), (130, 16384)])
def test_streamed_fused_add_rms_norm_with_weight_and_large_eps(simulator_backend, rows, hidden, dtype):
    # the streamed path (hidden > 8192) of fused_add_rms_norm with a weight and eps 0.1
    # against a mean square of ~2e-4 (the output is ~0.045 of the eps-free one): mutation
    # testing found its weight and its eps each dropped without test_streamed_rows (no
    # weight, eps 1e-6 on a mean square of ~10) noticing
    x = randn(rows, hidden, dtype=dtype, scale=0.01)
    residual = randn(rows, hidden, dtype=dtype, scale=0.01)
    weight = randn(hidden, dtype=dtype, scale=0.5, shift=1.0)
    normed, total = nki_kernels.fused_add_rms_norm(x, residual, weight, 0.1)
    expected_total = (x.double() + residual.double()).to(dtype)
    assert torch.equal(total, expected_total)
    t64, w64 = _f64(expected_total, weight)
    assert_matches(normed, references.rms_norm(t64, (hidden,), w64, 0.1, compute_dtype=torch.float64), dtype)


@pytest.mark.parametrize("affine", ["none", "bias"])
def test_streamed_layer_norm_without_weight_and_with_a_large_mean(simulator_backend, affine):
    # bn_stats pieces combined over the whole row: a mean 1e4 times the spread is kept
    x = randn(5, 9000, dtype=torch.float32, scale=1.0, shift=1e4)
    bias = randn(9000) if affine == "bias" else None
    out = nki_kernels.layer_norm(x, (9000,), None, bias, 1e-5)
    expected = F.layer_norm(x.double(), (9000,), None, None if bias is None else bias.double(), 1e-5)
    # fp32 statistics: the mean is off by ~ one fp32 ulp of the mean (2**-24 * 1e4), i.e.
    # ~6e-4 of a std after centring (torch's own fp32 layer_norm too): bound 8 ulps' worth
    bound = 8 * 2.0 ** -24 * 1e4
    assert (out.double() - expected).abs().max() < bound
    torch_fp32 = F.layer_norm(x, (9000,), None, bias, 1e-5).double()
    assert (torch_fp32 - expected).abs().max() < bound

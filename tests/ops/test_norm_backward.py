"""Backward of layer_norm, rms_norm and fused_add_rms_norm: gradients of the public ops on
both CPU backends (the NKI backward kernels in the simulator; the PyTorch backward twins on
the reference backend) against float64 autograd of torch's own forward; the backward ops'
opcheck; torch.compile through forward and backward; which rows take the recompute path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nki_kernels
from nki_kernels import backward_references, references
from nki_kernels.ops import norms

from ._cases import rel_error

# Shapes (input, normalized size): one row; a tail only, hidden not a multiple of 128; one
# full 128-row tile plus a 1-row tail (3-D input); tile-exact rows and hidden; rows longer
# than a diagonal weight-gradient accumulator holds (rms_norm > 4096, layer_norm > 3584:
# the column-sum path of kernels/weight_grads.py), two parts with a tail.
SHAPES = [((1, 64), "1x64"), ((7, 1000), "7x1000"), ((3, 43, 768), "3x43x768"),
          ((256, 128), "256x128"), ((130, 4500), "130x4500")]
DTYPES = [(torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")]

# Bounds per dtype, as the largest |error| over the largest |expected| of each gradient
# (weight gradients sum over rows: their error scales with the output, not per element)
# and as ||error|| / ||expected||. fp32: fp32 arithmetic throughout (~2e-7 measured).
# 16-bit: the kernels round g = dy * w, g * x (or g * xhat), the centred terms and the
# output to the input dtype, up to four roundings of <= 2**-9 (bf16) / 2**-12 (fp16)
# relative each (measured bf16 <= 4.7e-3 max-relative, ~2e-3 norm-relative; fp16 ~6e-4);
# the reference backend rounds once. The fp16 weight gradient of rows longer than 4096
# takes bf16 products (kernels/rms_norm_backward.py: r's range) -> the bf16 bounds.
MAX_REL = {torch.float32: 2e-6, torch.bfloat16: 1.2e-2, torch.float16: 1.5e-3}
NORM_REL = {torch.float32: 1e-6, torch.bfloat16: 6e-3, torch.float16: 8e-4}


def _randn(*shape, dtype, scale=1.0, shift=0.0):
    return (torch.randn(*shape) * scale + shift).to(dtype)


def _check(got, expected, dtype, name, bf16_products=False):
    assert got.shape == expected.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    assert not torch.isnan(got).any(), f"{name}: NaN (an element never written)"
    bound_dtype = torch.bfloat16 if bf16_products else dtype
    err = float((got.double() - expected).abs().max()) / float(expected.abs().max())
    assert err < MAX_REL[bound_dtype], f"{name}: max error {err:.2e} of max |expected|"
    assert rel_error(got, expected) < NORM_REL[bound_dtype], f"{name}: ||err|| / ||expected|| {rel_error(got, expected):.2e}"


def _grads(fn, inputs, grad_outputs):
    """Gradients of ``fn(*inputs)`` w.r.t. the tensor inputs that require grad."""
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    return torch.autograd.grad(outs, leaves, grad_outputs)


def _leaf(t):
    return None if t is None else t.detach().clone().requires_grad_(True)


def _f64(t):
    return None if t is None else t.detach().double().requires_grad_(True)


def _run(kind, shape, dtype, affine):
    """(our gradients, float64 autograd gradients, names) for one case."""
    hidden = shape[-1]
    x = _randn(*shape, dtype=dtype, scale=2.0, shift=1.0 if kind == "layer_norm" else 0.0)
    w = _randn(hidden, dtype=dtype, scale=0.5, shift=1.0) if "weight" in affine else None
    b = _randn(hidden, dtype=dtype) if "bias" in affine else None
    dy = _randn(*shape, dtype=dtype)
    if kind == "layer_norm":
        ours = _grads(lambda x_, w_, b_: nki_kernels.layer_norm(x_, (hidden,), w_, b_, 1e-5),
                      [_leaf(x), _leaf(w), _leaf(b)], [dy])
        ref = _grads(lambda x_, w_, b_: F.layer_norm(x_, (hidden,), w_, b_, 1e-5),
                     [_f64(x), _f64(w), _f64(b)], [dy.double()])
        names = ["dx"] + (["dweight"] if w is not None else []) + (["dbias"] if b is not None else [])
    elif kind == "rms_norm":
        ours = _grads(lambda x_, w_: nki_kernels.rms_norm(x_, (hidden,), w_, 1e-6), [_leaf(x), _leaf(w)], [dy])
        ref = _grads(lambda x_, w_: F.rms_norm(x_, (hidden,), w_, 1e-6), [_f64(x), _f64(w)], [dy.double()])
        names = ["dx"] + (["dweight"] if w is not None else [])
    else:
        r = _randn(*shape, dtype=dtype)
        d_total = _randn(*shape, dtype=dtype)
        ours = _grads(lambda x_, r_, w_: nki_kernels.fused_add_rms_norm(x_, r_, w_, 1e-6),
                      [_leaf(x), _leaf(r), _leaf(w)], [dy, d_total])
        # the forward rounds the sum to the input dtype and normalises that (its contract):
        # the float64 reference differentiates rms_norm at the rounded sum
        total = (x.double() + r.double()).to(dtype).double().requires_grad_(True)
        w64 = _f64(w)
        d_sum, *dw = torch.autograd.grad((F.rms_norm(total, (hidden,), w64, 1e-6), total * 1.0),
                                         [total] + ([w64] if w is not None else []), [dy.double(), d_total.double()])
        ref = [d_sum, d_sum, *dw]
        names = ["dinput", "dresidual"] + (["dweight"] if w is not None else [])
    return ours, ref, names


CASES = [("rms_norm", "weight"), ("rms_norm", "none"), ("layer_norm", "weight+bias"),
         ("layer_norm", "weight"), ("layer_norm", "bias"), ("layer_norm", "none"),
         ("fused_add_rms_norm", "weight"), ("fused_add_rms_norm", "none")]


def _gradient_params():
    """Every op case on every shape and dtype, except layer_norm's partial affine cases,
    which run on one shape (their kernel path is the full one minus a product)."""
    params = []
    for kind, affine in CASES:
        for shape, shape_id in SHAPES:
            if kind == "layer_norm" and affine != "weight+bias" and shape_id != "256x128":
                continue
            for dtype, dtype_id in DTYPES:
                params.append(pytest.param(kind, affine, shape, dtype, id=f"{kind}-{affine}-{shape_id}-{dtype_id}"))
    return params


@pytest.mark.parametrize("backend", ["simulator", "reference"])
@pytest.mark.parametrize("kind, affine, shape, dtype", _gradient_params())
def test_gradients_match_float64_autograd(monkeypatch, backend, kind, affine, shape, dtype):
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    ours, ref, names = _run(kind, shape, dtype, affine)
    assert len(ours) == len(ref) == len(names)
    wide_fp16_weight = (dtype == torch.float16 and shape[-1] > 4096 and kind != "layer_norm")
    for got, want, name in zip(ours, ref, names):
        assert got.dtype == dtype, f"{name}: dtype {got.dtype}, expected {dtype}"
        _check(got, want, dtype, name, bf16_products=wide_fp16_weight and name == "dweight")


@pytest.mark.parametrize("shape", [(7, 1000), (130, 4500)], ids=["7x1000", "130x4500"])
@pytest.mark.parametrize("kind", ["rms_norm", "layer_norm"])
def test_gradients_with_large_eps_on_small_variance_rows(simulator_backend, kind, shape):
    # eps 0.1 against a variance (mean square) of ~1e-4: the rstd the backward recomputes is
    # ~0.03 of the eps-free one. Mutation testing found RMSNorm's backward without its eps
    # passing every test above (variances of ~4, where eps=1e-6 is invisible).
    hidden = shape[-1]
    x = _randn(*shape, dtype=torch.float32, scale=0.01)   # (no mean shift: fp32 centring would cost digits)
    w = _randn(hidden, dtype=torch.float32, scale=0.5, shift=1.0)
    dy = _randn(*shape, dtype=torch.float32)
    ours_fn = getattr(nki_kernels, kind)
    torch_fn = F.rms_norm if kind == "rms_norm" else (lambda x_, n, w_, eps: F.layer_norm(x_, n, w_, None, eps))
    ours = _grads(lambda x_, w_: ours_fn(x_, (hidden,), w_, eps=0.1), [_leaf(x), _leaf(w)], [dy])
    ref = _grads(lambda x_, w_: torch_fn(x_, (hidden,), w_, eps=0.1), [_f64(x), _f64(w)], [dy.double()])
    for got, want, name in zip(ours, ref, ["dx", "dweight"]):
        _check(got, want, torch.float32, name)


@pytest.mark.parametrize("dtype, hidden, kernel", [
    (torch.bfloat16, norms.BACKWARD_MAX_HIDDEN, True),         # the kernel at its limit
    (torch.bfloat16, norms.BACKWARD_MAX_HIDDEN + 1, False),    # beyond: recompute (PyTorch ops)
    (torch.float32, norms.BACKWARD_MAX_ROW_BYTES // 4, True),  # fp32 at its row-bytes limit
    (torch.float32, norms.BACKWARD_MAX_ROW_BYTES // 4 + 1, False),
], ids=["bf16-8192", "bf16-8193", "fp32-4096", "fp32-4097"])
def test_kernel_backward_within_its_limits_recompute_beyond(simulator_backend, monkeypatch, dtype, hidden, kernel):
    calls = []
    real = norms._rms_norm_backward_op
    monkeypatch.setattr(norms, "_rms_norm_backward_op", lambda *a: calls.append(a[1].shape) or real(*a))
    x = torch.randn(3, hidden).to(dtype).requires_grad_(True)
    w = torch.randn(hidden).to(dtype).requires_grad_(True)
    dy = torch.randn(3, hidden).to(dtype)
    got = torch.autograd.grad(nki_kernels.rms_norm(x, (hidden,), w, 1e-6), [x, w], dy)
    ref = [_f64(x), _f64(w)]
    want = torch.autograd.grad(F.rms_norm(ref[0], (hidden,), ref[1], 1e-6), ref, dy.double())
    for g, e, name in zip(got, want, ["dx", "dweight"]):
        _check(g, e, dtype, name)
    assert calls == ([torch.Size([3, hidden])] if kernel else [])


def test_empty_input_gives_zero_weight_gradients(simulator_backend):
    x = torch.randn(0, 40, requires_grad=True)
    w = torch.randn(40, requires_grad=True)
    b = torch.randn(40, requires_grad=True)
    out = nki_kernels.layer_norm(x, (40,), w, b)
    gx, gw, gb = torch.autograd.grad(out, [x, w, b], torch.randn(0, 40))
    assert gx.shape == (0, 40) and torch.equal(gw, torch.zeros(40)) and torch.equal(gb, torch.zeros(40))


def test_backward_kernel_rejects_rows_beyond_its_limits():
    hidden = norms.BACKWARD_MAX_HIDDEN + 1
    x = torch.randn(2, hidden, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"normalized size {hidden} exceeds {norms.BACKWARD_MAX_HIDDEN}"):
        norms.rms_norm_backward_kernel_call(x, x, (hidden,), None, 1e-6)
    x = torch.randn(2, 5000)
    with pytest.raises(ValueError, match=r"normalized size 5000 in torch.float32 takes 20000 bytes, more than 16384"):
        norms.layer_norm_backward_kernel_call(x, x, torch.randn(2, 2), (5000,), None, None, 1e-5)


def _ln_backward_args(g, weight):
    """(dy, x, x's saved statistics, shape, weight, bias, eps) of layer_norm's backward op."""
    x = g(6, 40)
    stats = references.layer_norm_stats(x.detach(), [40], 1e-5)
    return g(6, 40), x, stats, [40], g(40) if weight else None, g(40), 1e-5


def _backward_op_cases():
    g = lambda *s: torch.randn(*s, requires_grad=True)  # noqa: E731
    return [
        ("rms_norm", norms._rms_norm_backward_op, lambda: (g(3, 7, 40), g(3, 7, 40), [40], g(40), 1e-6)),
        ("rms_norm_noweight", norms._rms_norm_backward_op, lambda: (g(5, 40), g(5, 40), [40], None, 1e-6)),
        ("layer_norm", norms._layer_norm_backward_op, lambda: _ln_backward_args(g, weight=True)),
        ("layer_norm_bias", norms._layer_norm_backward_op, lambda: _ln_backward_args(g, weight=False)),
        ("fused_add_rms_norm", norms._fused_add_rms_norm_backward_op,
         lambda: (g(6, 40), g(6, 40), g(6, 40), g(40), 1e-6)),
    ]


BACKWARD_OPS = _backward_op_cases()


@pytest.mark.parametrize("backend", ["simulator", "reference"])
@pytest.mark.parametrize("name, op, make", BACKWARD_OPS, ids=[c[0] for c in BACKWARD_OPS])
def test_opcheck_backward_ops(monkeypatch, backend, name, op, make):
    # the backward ops are custom ops too: schema, fake, dispatch, and their own (double)
    # backward, the recompute of backward_references in fp32
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    torch.library.opcheck(op, make())


@pytest.mark.parametrize("backend", ["simulator", "reference"])
@pytest.mark.parametrize("affine", ["weight+bias", "none"])
def test_opcheck_layer_norm_training_forward(monkeypatch, backend, affine):
    # layer_norm's training forward (output and saved statistics) is a custom op too:
    # schema, fake (the [N, 2] fp32 statistics), dispatch and its kernel backward
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    x = torch.randn(3, 7, 40, requires_grad=True)
    w, b = (torch.randn(40, requires_grad=True), torch.randn(40, requires_grad=True)) if affine != "none" \
        else (None, None)
    torch.library.opcheck(norms._layer_norm_train_op, (x, [40], w, b, 1e-5))


def test_compile_fullgraph_forward_and_backward(simulator_backend):
    # One compiled graph through the three norms, forward and backward (the backward ops run
    # their NKI kernels in the simulator), against eager torch's gradients.
    def block(x, residual, w, b):
        h, res = nki_kernels.fused_add_rms_norm(x, residual, w, 1e-6)
        h = nki_kernels.layer_norm(h, (64,), w, b) * nki_kernels.rms_norm(res, (64,), w, 1e-6)
        return h.square().sum()

    def eager(x, residual, w, b):
        res = x + residual
        h = F.rms_norm(res, (64,), w, 1e-6)
        h = F.layer_norm(h, (64,), w, b) * F.rms_norm(res, (64,), w, 1e-6)
        return h.square().sum()

    args = [torch.randn(9, 64), torch.randn(9, 64), torch.randn(64) * 0.5 + 1, torch.randn(64)]
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    leaves = [a.clone().requires_grad_(True) for a in args]
    got = torch.autograd.grad(compiled(*leaves), leaves)
    leaves = [a.clone().requires_grad_(True) for a in args]
    want = torch.autograd.grad(eager(*leaves), leaves)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)


def test_backward_twins_match_float64_autograd():
    # backward_references' written-out formulas (the reference backend, the report's check)
    # against autograd of torch's forward, in float64
    x = torch.randn(5, 3, 40, dtype=torch.float64)
    w, b, dy = torch.randn(40, dtype=torch.float64), torch.randn(40, dtype=torch.float64), torch.randn_like(x)
    got = backward_references.layer_norm_backward(dy, x, [40], w, b, 1e-5, compute_dtype=torch.float64)
    leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
    want = torch.autograd.grad(F.layer_norm(leaves[0], (40,), leaves[1], leaves[2], 1e-5), leaves, dy)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-10)
    got = backward_references.rms_norm_backward(dy, x, [3, 40], w.repeat(3).reshape(3, 40), 1e-6,
                                                compute_dtype=torch.float64)
    leaves = [t.clone().requires_grad_(True) for t in (x, w.repeat(3).reshape(3, 40))]
    want = torch.autograd.grad(F.rms_norm(leaves[0], (3, 40), leaves[1], 1e-6), leaves, dy)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-10)


def _scalar_copies_at_lnc1(call):
    """(result, ScalarE's copies in issue order) of a norm backward launch at LNC=1 on trn2:
    "c" for a copy that reduces (a row sum), "d" for one that does not (dx)."""
    from nki_kernels import _dispatch, simulator

    with simulator.activated("trn2"):
        kernel = _dispatch.simulator_kernel(call)
    result = simulator.run(kernel[1], *[t.contiguous() for t in call.tensors], **call.static, target="trn2")
    copies = "".join("c" if i.attrs["reduce"] else "d" for i in result.trace
                     if i.engine == "scalar" and i.op == "activation" and i.attrs["func"] == "copy")
    return result, copies


@pytest.mark.parametrize("hidden, copies_per_part, last_part", [
    (4096, "cc cc d d cc d", "cc cc d d cc ddd"),     # one row per partition: software-pipelined
    (768, "cccc dd cc d", "cccc dd cc d"),            # two rows per partition, then one: in order
], ids=["one-row-blocks", "two-row-blocks"])
def test_layer_norm_backward_pipelines_blocks_of_one_row_per_partition(hidden, copies_per_part, last_part):
    # kernels/layer_norm_backward.py: ScalarE's row sums (copies that reduce: c) belong to a
    # block's first half, its dx (copies that scale: d) to the second. With one row per
    # partition block i's first half is issued before block i - 1's second half, but for
    # each part's last block (at LNC=1 768 rows are two parts of three 128-row blocks);
    # with more rows per partition each block is issued whole (768 columns: a block of 256
    # rows and one of 128 per part). The program's last block (the second part's last) makes
    # its dx in 2 KiB column chunks where its rows are that long (_back: 4096 bf16 columns
    # in four), the first of them wholly in the row's VectorE share of dx (_dx_vector_share),
    # so without a ScalarE copy
    rows, dtype = 768, torch.bfloat16
    x, dy = _randn(rows, hidden, dtype=dtype, shift=1.0), _randn(rows, hidden, dtype=dtype)
    weight, bias = _randn(hidden, dtype=dtype, scale=0.5, shift=1.0), _randn(hidden, dtype=dtype)
    stats = references.layer_norm_stats(x, (hidden,), 1e-5)
    call = norms.layer_norm_backward_kernel_call(dy, x, stats, (hidden,), weight, bias, 1e-5)
    result, copies = _scalar_copies_at_lnc1(call)
    assert copies == (copies_per_part + last_part).replace(" ", "")
    dx, dw, db = call.finish_outputs(result.outputs)
    leaves = [t.double().requires_grad_() for t in (x, weight, bias)]
    want = _grads(lambda t, w, b: F.layer_norm(t, (hidden,), w, b, 1e-5), leaves, (dy.double(),))
    for got, ref, name in zip((dx, dw, db), want, ("dx", "dweight", "dbias")):
        _check(got, ref, dtype, name)


@pytest.mark.parametrize("fused, hidden, copies_per_part, last_part", [
    (False, 4096, "c c d d c d", "c c d d c ddd"),     # the first chunk all VectorE's (below)
    (True, 2048, "c c d d c d", "c c d d c dd"),
    (True, 4096, "c c dd dd c dd", "c c dd dd c dddd"),    # fused rows wider than 2048: t * r in two halves
], ids=["rms_norm", "fused_add_rms_norm", "fused_add_rms_norm-halves"])
def test_rms_norm_backward_issues_each_blocks_first_half_before_the_previous_blocks_second_half(
        fused, hidden, copies_per_part, last_part):
    # kernels/rms_norm_backward.py: per block, ScalarE's row sums c = sum(g * x) (a copy that
    # reduces) belong to its first half and its t * r (copies that do not) to its second
    # half. Block i's first half is issued before block i - 1's second half, except for
    # each part's last block: at LNC=1, 768 rows are two parts of three 128-row blocks, so
    # each part's ScalarE copies run c0 c1 dx0 dx1 c2 dx2 (the old order, which closed a
    # block-to-block loop through GpSimd, ran c0 dx0 c1 dx1 c2 dx2); fused rows wider than
    # 2048 columns make each dx in two column halves; the program's last block (the second
    # part's last) makes its dx in chunks of 2 KiB per partition (1024 bf16 columns), and
    # for rms_norm the row's first 0.3 (_block_plan on trn2: 1229 columns) by VectorE, so
    # its first chunk has no ScalarE copy
    rows, dtype = 768, torch.bfloat16
    x, dy, dtotal = (_randn(rows, hidden, dtype=dtype) for _ in range(3))
    weight = _randn(hidden, dtype=dtype, scale=0.5, shift=1.0)
    call = (norms.fused_add_rms_norm_backward_kernel_call(dy, dtotal, x, weight, 1e-6) if fused
            else norms.rms_norm_backward_kernel_call(dy, x, (hidden,), weight, 1e-6))
    result, copies = _scalar_copies_at_lnc1(call)
    assert copies == (copies_per_part + last_part).replace(" ", "")
    dx, dw = call.finish_outputs(result.outputs)
    x64, w64 = x.double().requires_grad_(), weight.double().requires_grad_()
    ref_dx, ref_dw = _grads(lambda t, w: F.rms_norm(t, (hidden,), w, 1e-6), (x64, w64), (dy.double(),))
    _check(dx, ref_dx + (dtotal.double() if fused else 0), dtype, "dx")
    _check(dw, ref_dw, dtype, "dw")


@pytest.mark.parametrize("op", ["rms_norm", "fused_add_rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype, hidden, chunk_bytes", [
    (torch.bfloat16, 4096, [2048] * 4),
    (torch.float32, 3000, [2400] * 5),
    (torch.bfloat16, 768, []),
], ids=["bf16-4096", "fp32-3000", "bf16-768-short-rows"])
def test_norm_backward_stores_the_programs_last_block_chunk_by_chunk(op, dtype, hidden, chunk_bytes):
    # kernels/rms_norm_backward.py _back_drained and kernels/layer_norm_backward.py _back: the
    # program's last block makes dx in equal column chunks of at least 2 KiB per partition
    # (tiling.drain_chunks: 8 KiB bf16 rows in four, 12000-byte fp32 rows in five of 600
    # columns) and stores each chunk as soon as it is made, so the launch ends one chunk's
    # chain after the last t. Rows shorter than 2 KiB (768 bf16 columns) are not cut: the
    # block is stored whole. Every other block keeps one store. At LNC=1 the program's last
    # block is the second part's last (768 rows: two parts of three 128-row blocks at one row
    # per partition); the gradients stay float64-close.
    rows = 768
    x, dy, dtotal = (_randn(rows, hidden, dtype=dtype, shift=1.0) for _ in range(3))
    weight, bias = _randn(hidden, dtype=dtype, scale=0.5, shift=1.0), _randn(hidden, dtype=dtype)
    if op == "layer_norm":
        stats = references.layer_norm_stats(x, (hidden,), 1e-5)
        call = norms.layer_norm_backward_kernel_call(dy, x, stats, (hidden,), weight, bias, 1e-5)
    elif op == "fused_add_rms_norm":
        call = norms.fused_add_rms_norm_backward_kernel_call(dy, dtotal, x, weight, 1e-6)
    else:
        call = norms.rms_norm_backward_kernel_call(dy, x, (hidden,), weight, 1e-6)
    result, _ = _scalar_copies_at_lnc1(call)
    stores = [i for i in result.trace if i.op == "dma_copy" and i.writes[0].buffer == "hbm"]
    block_stores = [i for i in stores if len(i.reads[0].shape) == 3]       # [P, rows, H] views of dx
    dx_stores = [i for i in stores if i.writes[0].alloc_id == block_stores[0].writes[0].alloc_id]
    chunked = [i for i in dx_stores if len(i.reads[0].shape) == 2]         # [P, columns] chunks
    # every row of dx is stored once: whole blocks, then the last block's chunks
    assert sum(i.reads[0].nbytes for i in dx_stores) == rows * hidden * dtype.itemsize
    assert [i.reads[0].nbytes // 128 for i in chunked] == chunk_bytes
    if chunked:
        assert len(block_stores) == 5        # the six blocks but the last
        # each chunk's store is issued after the instructions that make its dx (ScalarE's
        # t * r; fused: VectorE's t * r + dtotal for a share of the chunk, GpSimd's + dtotal
        # for the rest) and before the next chunk's
        makers = [i for i in result.trace if i.writes and i.writes[0].alloc_id == chunked[0].reads[0].alloc_id
                  and i.engine != "dma"]
        spans = [(s.reads[0].offset, s.reads[0].offset + s.reads[0].shape[-1]) for s in chunked]
        per_chunk = [[i.index for i in makers if lo <= i.writes[0].offset < hi] for lo, hi in spans]
        assert sum(map(len, per_chunk)) == len(makers) and all(per_chunk)
        for k, store in enumerate(chunked):
            assert max(per_chunk[k]) < store.index
            if k + 1 < len(chunked):
                assert store.index < min(per_chunk[k + 1])
    outs = call.finish_outputs(result.outputs)
    if op == "layer_norm":
        leaves = [t.double().requires_grad_() for t in (x, weight, bias)]
        want = _grads(lambda t, w, b: F.layer_norm(t, (hidden,), w, b, 1e-5), leaves, (dy.double(),))
    else:
        leaves = [t.double().requires_grad_() for t in (x, weight)]
        want = list(_grads(lambda t, w: F.rms_norm(t, (hidden,), w, 1e-6), leaves, (dy.double(),)))
        want[0] = want[0] + (dtotal.double() if op == "fused_add_rms_norm" else 0)
    for got, ref, name in zip(outs, want, ("dx", "dweight", "dbias")):
        _check(got, ref, dtype, name)


@pytest.mark.parametrize("dtype, share, later_share", [(torch.bfloat16, 0.96 / (0.96 + 0.6), 1.0),
                                                       (torch.float32, 0.48 / (0.48 + 0.6), 0.45)],
                         ids=["bf16", "fp32"])
def test_fused_add_rms_norm_backward_gives_gpsimd_a_share_of_the_programs_first_block(dtype, share, later_share):
    # kernels/rms_norm_backward.py _front: the program's first block, whose products GpSimd
    # (with no earlier block's t = a + g and + dtotal to run) shares by the engines' rates on
    # trn2: VectorE 0.96 GHz at one 16-bit pair per cycle (0.5 for fp32), GpSimd 1.2 GHz at
    # 0.5. The later blocks split by _block_plan: 16-bit all on VectorE (GpSimd's t and
    # + dtotal keep it the busier engine), fp32 0.45 with all of dx = t * r + dtotal on
    # VectorE (0.1 from the refit of 2026-12-06, which doubled VectorE's issue interval,
    # until trn2's VectorE was read off the v5 profile, 2026-12-08: 65 fixed cycles, 48 in a
    # stream; 0.55 before that refit; until session 62 all products on VectorE for every
    # dtype, dx on ScalarE and GpSimd). The
    # first block's dtotal is loaded after the weight, which its g waits for. At LNC=1 the
    # program's first block is the first part's; the gradients stay float64-close.
    hidden, rows = 2048, 768
    x, dy, dtotal = (_randn(rows, hidden, dtype=dtype) for _ in range(3))
    weight = _randn(hidden, dtype=dtype, scale=0.5, shift=1.0)
    call = norms.fused_add_rms_norm_backward_kernel_call(dy, dtotal, x, weight, 1e-6)
    result, _ = _scalar_copies_at_lnc1(call)
    products = [i for i in result.trace if i.engine == "gpsimd" and i.op == "tensor_tensor"
                and i.attrs.get("op") == "multiply"]
    # g and q of the first block: the columns past VectorE's share; then the later blocks'
    blocks = rows * hidden // (128 * hidden)
    later = [(128, 1, hidden - round(hidden * later_share))] * 2 * (blocks - 1) if later_share < 1 else []
    assert [i.writes[0].shape for i in products] == [(128, 1, hidden - round(hidden * share))] * 2 + later
    loads = [i for i in result.trace if i.op == "dma_copy" and i.reads[0].buffer == "hbm"]
    broadcast = next(k for k, i in enumerate(loads) if 0 in i.reads[0].strides)
    assert broadcast == 2        # after the first block's dy and x, before its dtotal
    dx, dw = call.finish_outputs(result.outputs)
    x64, w64 = x.double().requires_grad_(), weight.double().requires_grad_()
    ref_dx, ref_dw = _grads(lambda t, w: F.rms_norm(t, (hidden,), w, 1e-6), (x64, w64), (dy.double(),))
    _check(dx, ref_dx + dtotal.double(), dtype, "dx")
    _check(dw, ref_dw, dtype, "dw")


@pytest.mark.parametrize("target, hidden, ring", [("trn2", 4096, 4), ("trn2", 8192, 4), ("trn1", 8192, 0)])
def test_rms_norm_backward_takes_g_from_a_ring_where_sbuf_holds_it(target, hidden, ring):
    # kernels/rms_norm_backward.py _g_ring_depth: g = dy * w of consecutive blocks in one
    # allocation of G_RING_DEPTH slots (a tile per block rotates two buffers, so block i + 2's
    # products waited for block i's t = a + g) where the ring fits beside _prefetch_ahead's
    # bound: at 8192 bf16 columns (16 KiB per block, two blocks ahead, 177 KiB in the bound)
    # trn2's 224 KiB hold four slots, trn1's 192 none. The gradients stay float64-close.
    from nki_kernels import _dispatch, simulator

    rows, dtype = 768, torch.bfloat16
    x, dy = _randn(rows, hidden, dtype=dtype), _randn(rows, hidden, dtype=dtype)
    weight = _randn(hidden, dtype=dtype, scale=0.5, shift=1.0)
    call = norms.rms_norm_backward_kernel_call(dy, x, (hidden,), weight, 1e-6)
    with simulator.activated(target):
        kernel = _dispatch.simulator_kernel(call)
    result = simulator.run(kernel[1], *[t.contiguous() for t in call.tensors], **call.static, target=target)
    row_bytes = hidden * 2
    # a ring of either depth _g_ring_depth may pick (none on trn1: the case must see neither)
    with simulator.activated(target):
        from nki_kernels.nki_src.rms_norm_backward import G_RING_DEPTH
    ring_bytes = {depth * row_bytes for depth in (G_RING_DEPTH, 3)}
    rings = [a.nbytes for a in result.allocations if a.buffer == "sbuf" and a.nbytes in ring_bytes]
    assert rings == ([ring * row_bytes] if ring else [])
    # the fused backward keeps a tile per block
    dtotal = _randn(rows, hidden, dtype=dtype)
    fused = norms.fused_add_rms_norm_backward_kernel_call(dy, dtotal, x, weight, 1e-6)
    with simulator.activated(target):
        fused_kernel = _dispatch.simulator_kernel(fused)
    fused_result = simulator.run(fused_kernel[1], *[t.contiguous() for t in fused.tensors], **fused.static,
                                 target=target)
    assert not [a for a in fused_result.allocations if a.buffer == "sbuf" and a.nbytes == 4 * row_bytes]
    dx, dw = call.finish_outputs(result.outputs)
    x64, w64 = x.double().requires_grad_(), weight.double().requires_grad_()
    ref_dx, ref_dw = _grads(lambda t, w: F.rms_norm(t, (hidden,), w, 1e-6), (x64, w64), (dy.double(),))
    _check(dx, ref_dx, dtype, "dx")
    _check(dw, ref_dw, dtype, "dw")

"""nl convenience functions: math against torch, lowering to the right instructions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nki_kernels import simulator
from nki_kernels.simulator import NkiValidationError


def _ops(result):
    return [i.op for i in result.trace]


def test_load_compute_store_kernel_numpy_in_out():
    import numpy as np  # a dev dependency: fail, never skip

    def kernel(x, y):
        import nki.language as nl

        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        a = nl.load(x)
        b = nl.load(y)
        c = nl.add(nl.multiply(a, b), 2.0)     # tensor_tensor, tensor_scalar
        d = nl.exp(nl.subtract(0.0, c))        # tensor_scalar (reversed), activation
        nl.store(out, d)
        return out

    x = np.random.randn(100, 70).astype(np.float32)
    y = np.random.randn(100, 70).astype(np.float32)
    r = simulator.run(kernel, x, y)
    assert isinstance(r.outputs, np.ndarray) and r.outputs.dtype == np.float32
    np.testing.assert_allclose(r.outputs, np.exp(-(x * y + 2.0)), rtol=2e-6, atol=1e-6)
    assert _ops(r) == ["dma_copy", "dma_copy", "tensor_tensor", "tensor_scalar",
                       "tensor_scalar", "activation", "dma_copy"]


@pytest.mark.parametrize("name, ref", [
    ("exp", torch.exp), ("tanh", torch.tanh), ("sigmoid", torch.sigmoid), ("relu", F.relu),
    ("gelu", F.gelu), ("silu", F.silu), ("square", torch.square), ("abs", torch.abs),
    ("negative", torch.neg), ("floor", torch.floor), ("ceil", torch.ceil), ("sign", torch.sign),
    ("erf", torch.erf), ("cos", torch.cos), ("trunc", torch.trunc),
])
def test_unary_helpers(sim, mk, v, name, ref):
    _, nl, _ = sim
    x = torch.randn(64, 40) * 2
    out = getattr(nl, name)(mk(x))
    assert out.buffer == nl.sbuf and out.dtype == nl.float32
    torch.testing.assert_close(v(out), ref(x), atol=2e-6, rtol=2e-6)


def test_rsqrt_helper_runs_on_gpsimd(sim, mk, v, last):
    # NKI 0.5: nl.rsqrt "now runs on the GpSimd Engine for higher numerical precision and no
    # longer accepts PSUM inputs" (migration guide); the PSUM refusal is in test_refusals.py
    _, nl, _ = sim
    x = torch.rand(64, 40) * 50 + 0.01
    out = nl.rsqrt(mk(x))
    assert (last().op, last().engine) == ("tensor_scalar", "gpsimd")
    assert out.buffer == nl.sbuf and out.dtype == nl.float32
    torch.testing.assert_close(v(out).double(), torch.rsqrt(x.double()), atol=0, rtol=2e-7)


def test_binary_helper_broadcasts_and_dtype(sim, mk, v, last):
    _, nl, _ = sim
    x, col = torch.randn(64, 40), torch.randn(64, 1)
    out = nl.maximum(mk(x), mk(col, "bfloat16"), dtype=nl.bfloat16)
    ref = torch.maximum(x, col.bfloat16().float()).bfloat16().float()
    assert out.dtype == nl.bfloat16 and torch.equal(v(out), ref)
    assert last().op == "tensor_scalar"
    out = nl.subtract(3.0, mk(x))
    torch.testing.assert_close(v(out), 3.0 - x)
    with pytest.raises(NkiValidationError, match="partitions never broadcast"):
        nl.add(mk(x), mk(torch.randn(1, 40)))


@pytest.mark.parametrize("fn, ref", [
    ("sum", lambda x: x.sum(-1)), ("max", lambda x: x.amax(-1)), ("min", lambda x: x.amin(-1)),
    ("mean", lambda x: x.mean(-1)), ("prod", lambda x: x.prod(-1)),
])
def test_reductions(sim, mk, v, fn, ref):
    _, nl, _ = sim
    x = torch.rand(128, 3, 50) + 0.5
    out = getattr(nl, fn)(mk(x), axis=2)
    assert out.shape == (128, 3)
    torch.testing.assert_close(v(out), ref(x), atol=1e-5, rtol=1e-5)
    out = getattr(nl, fn)(mk(x), axis=[1, 2], keepdims=True)
    assert out.shape == (128, 1, 1)
    out = getattr(nl, fn)(mk(x[:, 0]), axis=1)
    assert out.shape == (128, 1)


def test_var_softmax_rms_norm_where(sim, mk, v):
    _, nl, _ = sim
    x = torch.randn(96, 700) * 2 + 1
    torch.testing.assert_close(v(nl.var(mk(x), axis=1)), x.var(1, unbiased=False, keepdim=True),
                               atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(v(nl.softmax(mk(x), axis=1)), torch.softmax(x, 1), atol=1e-7, rtol=1e-5)
    w = torch.randn(96, 700)
    rn = nl.rms_norm(mk(x), mk(w), axis=1, n=700, epsilon=1e-6)
    ref = x * torch.rsqrt((x * x).mean(1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(v(rn), ref, atol=1e-5, rtol=1e-5)
    cond = (torch.rand(96, 700) > 0.5).float()
    out = nl.where(mk(cond), mk(x), -1.0)
    assert torch.equal(v(out), torch.where(cond > 0, x, torch.tensor(-1.0)))


@pytest.mark.parametrize("shape, axis, dtype", [((96, 5, 37), 2, "float32"), ((64, 3, 4, 29), (2, 3), "float32"),
                                                ((64, 3, 4, 29), -1, "float32"), ((96, 5, 37), (1, 2), "float32"),
                                                ((96, 5, 37), -1, "bfloat16")])
def test_var_softmax_rms_norm_over_trailing_axes(sim, mk, v, shape, axis, dtype):
    # the last free axes alone (axis 2 of a 3-D tile), as nl.sum / nisa.tensor_reduce take
    # them (docs/simulator.md "corrected in session 50" for the reading of the docstrings)
    _, nl, _ = sim
    nd = len(shape)
    axes = tuple(sorted(a % nd for a in ((axis,) if isinstance(axis, int) else axis)))
    kept = shape[:axes[0]]
    n = math.prod(shape[a] for a in axes)
    xt = mk(torch.randn(shape) * 3 + 1, dtype)
    x = v(xt).double()          # the tile's values (rounded to dtype), referenced in float64
    rows = x.flatten(axes[0])   # [*kept, n]
    # fp32 tiles: fp32 arithmetic over <= 116 elements, ~1e-6 relative; bf16 outputs: one
    # rounding of the result (2**-8 relative)
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == "float32" else dict(atol=2e-3, rtol=2 ** -8)
    sm = nl.softmax(xt, axis=axis)
    assert sm.shape == shape and sm.dtype == xt.dtype
    torch.testing.assert_close(v(sm).double(), torch.softmax(rows, -1).reshape(shape), **tol)
    assert nl.softmax(xt, axis=axis, dtype=nl.float32).dtype == nl.float32
    var = nl.var(xt, axis=axis)
    assert var.shape == (kept if len(kept) > 1 else kept + (1,))   # "with the specified axes removed"
    ref_var = rows.var(-1, unbiased=False)
    torch.testing.assert_close(v(var).double().reshape(-1), ref_var.reshape(-1),
                               **(dict(atol=1e-5, rtol=1e-5) if dtype == "float32" else tol))
    var_kept = nl.var(xt, axis=axis, keepdims=True)
    assert var_kept.shape == tuple(1 if d in axes else s for d, s in enumerate(shape))
    assert torch.equal(v(var_kept).reshape(-1), v(var).reshape(-1))
    w = mk(torch.randn(shape), dtype)
    rn = nl.rms_norm(xt, w, axis=axis, n=n, epsilon=1e-6)
    ref = x * torch.rsqrt((rows * rows).mean(-1).reshape(kept + (1,) * len(axes)) + 1e-6) * v(w).double()
    torch.testing.assert_close(v(rn).double(), ref, **tol)


def test_trailing_axes_reductions_lower_to_vector_reduces(sim, mk):
    # over the last axes only, the per-partition accumulators (bn_stats, the activation's
    # reduce) cannot separate a partition's rows: VectorE tensor_reduce does
    _, nl, _ = sim
    x = mk(torch.randn(32, 4, 9))
    before = len(simulator.current_trace())
    nl.softmax(x, axis=2)
    ops = [i.op for i in simulator.current_trace()[before:]]
    assert ops == ["tensor_reduce", "tensor_tensor", "activation", "tensor_reduce", "reciprocal", "tensor_tensor"]
    before = len(simulator.current_trace())
    nl.var(x, axis=2)
    ops = [i.op for i in simulator.current_trace()[before:]]
    assert ops == ["tensor_reduce", "tensor_scalar", "tensor_tensor", "tensor_tensor", "tensor_reduce",
                   "tensor_scalar"]
    before = len(simulator.current_trace())
    nl.softmax(x, axis=(1, 2))
    ops = [i.op for i in simulator.current_trace()[before:]]
    assert ops == ["tensor_reduce", "activation", "reciprocal", "tensor_scalar"]


def test_reductions_refuse_non_trailing_axes(sim, mk):
    _, nl, _ = sim
    x = mk(torch.randn(32, 4, 9))
    for fn in (lambda t: nl.softmax(t, axis=1), lambda t: nl.var(t, axis=1),
               lambda t: nl.rms_norm(t, t, axis=1, n=4), lambda t: nl.softmax(t, axis=0)):
        with pytest.raises(NkiValidationError, match="axis"):
            fn(x)


def test_matmul_and_transpose(sim, mk, v):
    _, nl, _ = sim
    a, b = torch.randn(64, 100), torch.randn(64, 300)
    p = nl.matmul(mk(a, "bfloat16"), mk(b, "bfloat16"), transpose_x=True)
    assert p.buffer == nl.psum and p.dtype == nl.float32 and p.shape == (100, 300)
    torch.testing.assert_close(v(p), a.bfloat16().float().T @ b.bfloat16().float(), atol=1e-3, rtol=1e-5)
    x = torch.randn(50, 64)
    p = nl.matmul(mk(x), mk(b), transpose_x=False)  # x @ b: a TensorE transpose first
    torch.testing.assert_close(v(p), x @ b, atol=1e-4, rtol=1e-5)
    t = nl.transpose(mk(x, "bfloat16"))
    assert t.buffer == nl.psum and t.dtype == nl.bfloat16 and torch.equal(v(t), x.bfloat16().float().T)


def test_allocation_helpers(sim, v):
    _, nl, _ = sim
    assert torch.equal(v(nl.zeros((8, 4), dtype=nl.float32)), torch.zeros(8, 4))
    assert torch.equal(v(nl.ones((8, 4), dtype=nl.bfloat16)), torch.ones(8, 4))
    assert torch.equal(v(nl.full((8, 4), 2.5, dtype=nl.float16)), torch.full((8, 4), 2.5))
    i = nl.shared_identity_matrix(n=16, dtype=nl.float32)
    assert i.buffer == nl.sbuf and torch.equal(v(i), torch.eye(16))
    z = nl.zeros_like(i)
    assert z.shape == (16, 16) and torch.equal(v(z), torch.zeros(16, 16))
    e = nl.empty_like(i)
    assert torch.isnan(v(e)).all()
    c = nl.shared_constant(torch.arange(12, dtype=torch.int32).reshape(3, 4))
    assert c.buffer == nl.shared_hbm and c.dtype == nl.int32


def test_broadcast_to_and_load_transpose2d(sim, mk, v):
    _, nl, _ = sim
    row = torch.randn(1, 30)
    b = nl.broadcast_to(mk(row), (128, 30))
    assert torch.equal(v(b), row.expand(128, 30))
    col = torch.randn(64, 1)
    assert torch.equal(v(nl.broadcast_to(mk(col), (64, 9))), col.expand(64, 9))
    h = nl.ndarray((40, 100), dtype=nl.float32, buffer=nl.shared_hbm)
    x = torch.randn(40, 100)
    h.dtype.assign(h._data, x)
    t = nl.load_transpose2d(h)
    assert t.shape == (100, 40) and torch.equal(v(t), x.T)


@pytest.mark.parametrize("src_dtype, dtype", [("bfloat16", "float32"), ("float32", "bfloat16")])
def test_load_transpose2d_with_a_dtype_returns_the_cast_tile(sim, src_dtype, dtype):
    # dtype=: the transposed tile in that dtype (a tensor_copy after the DMA transpose,
    # rounding once to nearest); mutation testing found the uncast tile returned unnoticed
    _, nl, _ = sim
    x = torch.randn(40, 100)
    h = nl.ndarray((40, 100), dtype=getattr(nl, src_dtype), buffer=nl.shared_hbm)
    h.dtype.assign(h._data, x)
    t = nl.load_transpose2d(h, dtype=getattr(nl, dtype))
    assert t.shape == (100, 40) and t.dtype == getattr(nl, dtype)
    stored = x.to(getattr(torch, src_dtype))
    assert torch.equal(t.values(), stored.to(getattr(torch, dtype)).T)


def test_load_store_rules(sim, mk):
    _, nl, _ = sim
    h = nl.ndarray((256, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    with pytest.raises(NkiValidationError, match="partition dim 256 exceeds maximum 128"):
        nl.load(h)
    with pytest.raises(NkiValidationError, match="1-D SBUF tile"):
        nl.load(h[:, 0])
    with pytest.raises(NkiValidationError, match="store: dst must be an HBM tensor"):
        nl.store(mk(torch.randn(4, 4)), mk(torch.randn(4, 4)))
    with pytest.raises(TypeError, match="mask"):  # beta 2 removed mask=
        nl.load(h[0:128], mask=None)


def test_grid_program_id_and_shared_outputs():
    def kernel(x):
        import nki.language as nl

        n = nl.num_programs()
        pid = nl.program_id(0)
        rows = x.shape[0] // n
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x[pid * rows:(pid + 1) * rows])
        nl.store(out[pid * rows:(pid + 1) * rows], nl.add(t, float(pid)))
        return out

    jit = simulator.nki_modules()["nki"].jit  # the simulator's nki.jit, without activated()
    x = torch.randn(128, 16)
    with simulator.activated():
        import nki

        jk = nki.jit(kernel)
        out = nki.simulate(jk[2])(x)
    ref = x.clone()
    ref[64:] += 1.0
    assert torch.equal(out, ref)
    r = simulator.run(jit(kernel)[2], x)
    assert sorted({i.attrs["core"] for i in r.trace}) == [0, 1]
    with pytest.raises(NkiValidationError, match="1 or 2"):
        jit(kernel)[4]


def test_tile_size_and_ranges(sim):
    _, nl, _ = sim
    ts = nl.tile_size
    assert (ts.pmax, ts.psum_bank_fmax, ts.gemm_stationary_fmax, ts.gemm_moving_fmax,
            ts.bn_stats_fmax, ts.psum_num_banks) == (128, 512, 128, 512, 512, 8)
    assert ts.total_available_sbuf_size == 224 * 1024
    assert list(nl.affine_range(3)) == list(nl.sequential_range(0, 3)) == list(nl.static_range(3))
    # sequential_range is "an alias for Python's range()": reversed, indexed, sliced, tested
    seq = nl.sequential_range(2, 11, 3)
    assert list(reversed(seq)) == [8, 5, 2] and seq[1] == 5 and seq[-1] == 8
    assert list(seq[1:]) == [5, 8] and 5 in seq and 6 not in seq and len(seq) == 3
    assert math.isclose(nl.fp32.min, -3.4028235e38, rel_tol=1e-7)


def test_device_print_prints_sbuf_and_hbm_tensors_now(sim, mk, capsys):
    # "In CPU simulation, this prints immediately to stdout"; "Can be in SBUF or HBM" (the
    # PSUM and non-string refusals are in test_refusals.py)
    _, nl, nisa = sim
    x = torch.tensor([[1.5, -2.25, 3.0], [0.5, 4.75, -1.125]])   # short decimals: torch prints them exactly
    tile = mk(x)
    hbm = nl.ndarray((2, 3), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(hbm, tile)
    for prefix, t in (("tile", tile), ("hbm", hbm)):
        nl.device_print(prefix, t)
        printed = capsys.readouterr().out
        assert printed.startswith(prefix + " ") and "4.7500" in printed and "-1.1250" in printed

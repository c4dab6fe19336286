"""nki.language behaviour the NKI 0.7 docs state and a review of 2026-12-04 found the simulator
getting wrong (each test quotes its rule)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import NkiValidationError, UnsupportedError


def _rows(nl, nisa, view, n):
    out = nl.ndarray((n, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=out, src=view)
    return out.values()


def test_indirect_offsets_step_by_the_base_tensors_stride(sim):
    # NkiTensor.ap: "indirect_dim: dimension in self.shape whose stride scales the indirect
    # scalar/vector offset"; the deep dive: it "is read from the shape of the base tensor,
    # not from the access pattern": a column slice of a [64, 32] tensor steps 32 per row
    _, nl, nisa = sim
    a = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.shared_hbm)
    vals = torch.randn(64, 32)
    a.dtype.assign(a._data, vals)
    cols = a[:, 0:16]
    at = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    at._data.fill_(37)
    got = _rows(nl, nisa, cols.ap([[16, 1], [1, 8]], scalar_offset=at, indirect_dim=0), 1)
    assert torch.equal(got, vals[37:38, 0:8])
    idx = torch.randperm(64)[:4]
    vo = nl.ndarray((4, 1), dtype=nl.int32, buffer=nl.sbuf)
    vo.dtype.assign(vo._data, idx.reshape(4, 1))
    got = _rows(nl, nisa, cols.ap([[16, 4], [1, 8]], vector_offset=vo, indirect_dim=0), 4)
    assert torch.equal(got, vals[idx, 0:8])


def test_a_register_index_is_read_when_the_instruction_runs(sim):
    # t[reg] is t.select(dim, reg) (language guide: "Indirect views are produced by select
    # with a tensor index ..."); select: "Dynamic on-chip: dim must not be 0"
    _, nl, nisa = sim
    h = nl.ndarray((4, 16, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    vals = torch.randn(4, 16, 8)
    h.dtype.assign(h._data, vals)
    reg = nisa.register_alloc(3)
    view = h[reg]
    assert view.is_indirect()
    nisa.register_move(reg, 1)
    out = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=out, src=view)
    assert torch.equal(out.values(), vals[1])
    with pytest.raises(NkiValidationError, match="partition dim"):
        nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)[reg, :]
    with pytest.raises(UnsupportedError, match="a register index takes whole slices"):
        h[reg, 0:4]


@pytest.mark.parametrize("buffer", ["private_hbm", "hbm"])
def test_a_kernel_cannot_return_a_private_hbm_tensor(buffer):
    # nl.private_hbm is "only visible to each individual kernel instance"; the LNC guide:
    # "the inputs and outputs of the kernel should be stored in the Shared HBM"; and at any
    # degree the NKI 0.3 migration guide: "All kernel output (return) tensors must be
    # allocated with buffer=nl.shared_hbm. Using nl.hbm for output tensors will cause
    # compilation failures". A returned input is the caller's tensor and stays allowed.
    with simulator.activated("trn2") as nki:
        nl = nki.language

        @nki.jit
        def per_core(a):
            out = nl.ndarray(a.shape, a.dtype, buffer=getattr(nl, buffer))
            nl.store(out, nl.add(nl.load(a), float(nl.program_id(0) + 1)))
            return out

        @nki.jit
        def shared(a):
            out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.add(nl.load(a), 1.0))
            return out

        @nki.jit
        def in_place(a):
            nl.store(a, nl.add(nl.load(a), 1.0))
            return a

        x = np.random.rand(4, 4).astype(np.float32)
        with pytest.raises(NkiValidationError, match="core 0 is in private_hbm; an LNC=2"):
            nki.simulate(per_core[2])(x)
        with pytest.raises(NkiValidationError, match="output 0 is in private_hbm; a tensor a "
                           "kernel returns must be allocated with buffer=nl.shared_hbm"):
            nki.simulate(per_core)(x)
        np.testing.assert_allclose(nki.simulate(shared)(x), x + 1.0)
        np.testing.assert_allclose(nki.simulate(in_place)(x.copy()), x + 1.0)


def test_dynamic_loops_take_a_positive_static_step_and_stay_out_of_no_reorder(sim):
    # nl.dynamic_range: "step: step size, must be a compile-time positive integer (not
    # VirtualRegister)"; nl.no_reorder: "Register-based dynamic loops (nl.fori_loop,
    # nl.while_loop) are not supported inside a no_reorder block"
    _, nl, nisa = sim
    reg = nisa.register_alloc(4)
    assert [int(i) for i in nl.dynamic_range(0, reg, np.int64(2))] == [0, 2]
    for bad in (0, -1, reg, True):
        with pytest.raises(NkiValidationError, match="step=.* must be a compile-time positive int"):
            nl.dynamic_range(0, 6, bad)
        with pytest.raises(NkiValidationError, match="step=.* must be a compile-time positive int"):
            nl.fori_loop(0, 6, lambda i: None, step=bad)
    with nl.no_reorder():
        assert list(nl.dynamic_range(0, 3)) == [0, 1, 2]       # a static range is fine
        with pytest.raises(NkiValidationError, match="not supported inside an nl.no_reorder"):
            nl.fori_loop(0, reg, lambda i: None)
        with pytest.raises(NkiValidationError, match="not supported inside an nl.no_reorder"):
            nl.dynamic_range(0, reg)
    seen = []
    nl.fori_loop(0, reg, lambda i: seen.append(int(i)))        # outside the block it runs
    assert seen == [0, 1, 2, 3]


def test_a_register_bound_dynamic_range_yields_registers(sim, mk):
    # dynamic-loops deep dive: "The loop variable is a device register, not a Python int. You
    # cannot use it in host-side Python expressions (e.g., if i == 0:)"; the v2.33
    # nl.dynamic_range page: compile-time bounds yield "integer values"
    _, nl, nisa = sim
    reg = nisa.register_alloc(3)
    x = torch.randn(3, 8)
    h = mk(x, buffer="hbm")
    out = nl.ndarray((3, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    for i in nl.dynamic_range(reg):
        assert isinstance(i, nisa.VirtualRegister)
        with pytest.raises(NkiValidationError, match="known only on the device"):
            if i == 0:
                pass
        with pytest.raises(NkiValidationError, match="known only on the device"):
            i < 2
        nisa.dma_copy(dst=out[i], src=h[i])   # t[register]: read when the instruction runs
    assert torch.equal(out.values(), x)
    assert all(type(i) is int for i in nl.dynamic_range(0, 3))
    with pytest.raises(NkiValidationError, match="known only on the device"):
        nl.fori_loop(0, reg, lambda i: i == 1)   # "i ... will be a VirtualRegister" (v2.33 fori_loop)


def test_static_select_on_a_2d_tile_keeps_the_dim_as_indexing_does(sim):
    # NkiTensor.select: "performs static selection (equivalent to t[:, index, :] when
    # dim=1)"; on-chip views are "always at least 2D"
    _, nl, _ = sim
    t = nl.ndarray((8, 6), dtype=nl.float32, buffer=nl.sbuf)
    t.dtype.assign(t._data, torch.randn(8, 6))
    picked = t.select(1, 3)
    assert picked.shape == t[:, 3].shape == (8, 1)
    assert torch.equal(picked.values(), t.values()[:, 3:4])
    with pytest.raises(NkiValidationError, match="must keep its partition dim"):
        t.select(0, 2)


def test_broadcast_to_takes_a_psum_source(sim):
    # nl.broadcast_to: ":param x: the source tile in SBUF or PSUM"
    _, nl, nisa = sim
    row = torch.randn(1, 24)
    src = nl.ndarray((1, 24), dtype=nl.float32, buffer=nl.psum)
    src.dtype.assign(src._data, row)
    out = nl.broadcast_to(src, (64, 24))
    assert out.buffer.value == "sbuf"
    assert torch.equal(out.values(), row.expand(64, 24))

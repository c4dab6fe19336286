"""``NkiTensor.ap`` (static and run-time offsets), dynamic ``select``/``vector_select`` and
dma_copy's ``oob_mode``, against the examples of AWS's "NKI Access Patterns" deep dive and
the NkiTensor/dma_copy docstrings."""

from __future__ import annotations

import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import NkiValidationError, UnsupportedError


def _reads(nl, nisa, view, expected):
    """``view`` holds ``expected``, read directly and through an instruction (tensor_copy)."""
    assert tuple(view.shape) == tuple(expected.shape)
    assert torch.equal(view.values(), expected)
    out = nl.ndarray(tuple(expected.shape), dtype=nl.float32)
    nisa.tensor_copy(out, view)
    assert torch.equal(out.values(), expected)


def test_concrete_example_reads_the_sliced_block(sim, mk):
    # deep dive: t (16, 16); ap([[16, 16], [1, 8]], offset=8) iterates t[0:16, 8:16]
    _, nl, nisa = sim
    x = torch.randn(16, 16)
    t = mk(x)
    _reads(nl, nisa, t.ap(pattern=[[16, 16], [1, 8]], offset=8), x[:, 8:16])


def test_every_other_element_and_get_pattern_round_trip(sim, mk):
    _, nl, _ = sim
    x = torch.randn(128, 64)
    t = mk(x)
    u = t.ap(pattern=[(64, 128), (2, 32)])
    assert torch.equal(u.values(), x[:, 0::2])
    s = t[:, 8:24]
    assert s.get_pattern() == [[64, 128], [1, 16]] and s.offset == 8
    assert torch.equal(t.ap(s.get_pattern(), offset=8).values(), s.values())


def test_offset_none_inherits_the_view_offset_and_an_integer_adds_to_it(sim, mk):
    # NkiTensor.ap docstring: None "inherits the current view's storage offset"; an integer
    # is "added to the view's base storage offset" (offset=0 keeps the base)
    _, nl, _ = sim
    x = torch.randn(64)
    h = mk(x, buffer="hbm")
    view = h[10:20]
    assert torch.equal(view.ap([[1, 4]]).values(), x[10:14])
    assert torch.equal(view.ap([[1, 4]], offset=0).values(), x[10:14])
    assert torch.equal(view.ap([[1, 4]], offset=5).values(), x[15:19])


def test_on_chip_partition_step_may_not_skip_partitions(sim):
    _, nl, _ = sim
    t = nl.ndarray((16, 32), dtype=nl.float32)
    with pytest.raises(NkiValidationError, match="partition step 64 .* free size 32"):
        t.ap(pattern=[[64, 8], [1, 32]], offset=0)  # the deep dive's illegal example
    with pytest.raises(NkiValidationError, match="partition step 0 .* free size 32"):
        t.ap(pattern=[[0, 8], [1, 32]], offset=0)
    t.ap(pattern=[[0, 1], [1, 32]], offset=0)        # one partition: its step is never used


def test_a_partition_step_below_the_free_size_still_walks_consecutive_partitions(sim, mk):
    # nki-library's TensorView of a column slice: tile [8, 2 x 16], the slice's width 16 as
    # the partition step (mlp_tkg gate/up bias at LNC=2)
    _, nl, nisa = sim
    x = torch.randn(8, 32)
    t = mk(x)
    _reads(nl, nisa, t.ap(pattern=[[16, 8], [1, 16]], offset=16), x[:, 16:32])


def test_out_of_range_pattern_is_built_but_fails_when_used(sim):
    _, nl, nisa = sim
    t = nl.ndarray((4, 8), dtype=nl.float32)
    bad = t.ap([[8, 4], [1, 8]], offset=4)  # the last partition runs past the tensor
    assert bad.shape == (4, 8)
    dst = nl.ndarray((4, 8), dtype=nl.float32)
    with pytest.raises(IndexError, match="outside"):
        nisa.tensor_copy(dst, bad)
    with pytest.raises(UnsupportedError, match="one .ap"):
        bad[0:2]


@pytest.mark.parametrize("direction", ["write", "read"])
def test_out_of_range_hbm_pattern_fails_in_dma_either_way(sim, direction):
    # a DMA into an out-of-range HBM pattern stores through the view, not through its data:
    # it raised AttributeError until session 51
    _, nl, nisa = sim
    hbm = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    before = torch.randn(4, 8)
    hbm.dtype.assign(hbm._data, before)
    bad = hbm.ap([[8, 2], [1, 8]], offset=24)   # elements 24..39 of 32
    tile = nl.ndarray((2, 8), dtype=nl.float32)
    tile.dtype.assign(tile._data, torch.randn(2, 8))
    with pytest.raises(IndexError, match="reaches elements 24..39 of a tensor of 32"):
        if direction == "write":
            nisa.dma_copy(dst=bad, src=tile)
        else:
            nisa.dma_copy(dst=tile, src=bad)
    assert torch.equal(hbm.values(), before)   # nothing written


def test_ap_on_a_placed_tensor_addresses_its_own_storage(sim):
    _, nl, nisa = sim
    x = torch.randn(8, 16)
    t = nl.ndarray((8, 16), dtype=nl.float32, address=(32, 1024))
    t.dtype.assign(t._data, x)
    assert t.strides == (16, 1) and t.get_pattern() == [[16, 8], [1, 16]]
    assert torch.equal(t.ap([[16, 8], [2, 8]], offset=1).values(), x[:, 1::2])


def _scalar_dynamic_kernel(a):
    import nki.isa as nisa
    import nki.language as nl

    # deep dive "scalar_dynamic_dma": A (512, 512); copy A[384:512, 0:256] with the 384
    # offset held in SBUF, applied along indirect_dim 0
    idx = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=idx, value=3 * 128)
    src = a.ap(pattern=[[512, 128], [1, 256]], offset=0, scalar_offset=idx, indirect_dim=0)
    nisa.memset(dst=idx, value=1 * 128)  # the offset is read when the DMA runs
    result = nl.ndarray((128, 256), a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(src=src, dst=result[...])
    return result


def test_scalar_offset_is_read_when_the_instruction_runs():
    a = torch.randn(512, 512)
    out = simulator.run(_scalar_dynamic_kernel, a).outputs
    assert torch.equal(out, a[128:256, 0:256])


def test_scalar_offset_scales_by_the_shape_after_indirect_dim(sim, mk):
    _, nl, nisa = sim
    x = torch.randn(4, 6, 8)
    h = mk(x, buffer="hbm")
    reg = nisa.register_alloc(2)
    v = h.ap([[8, 6], [1, 8]], offset=0, scalar_offset=reg, indirect_dim=0)  # 2 * (6*8)
    assert v.is_indirect() and torch.equal(v.values(), x[2])
    w = h.ap([[1, 8]], offset=0, scalar_offset=reg, indirect_dim=1)       # 2 * 8
    assert torch.equal(w.values(), x[0, 2])


def _gather_kernel(a, offsets, oob):
    import nki.isa as nisa
    import nki.language as nl

    idx = nl.ndarray((offsets.shape[0], 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=offsets)
    dst = nl.ndarray((offsets.shape[0], a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
    nisa.memset(dst, -1.0)
    nisa.dma_copy(dst=dst, src=a.ap([[a.shape[1], offsets.shape[0]], [1, a.shape[1]]],
                                    vector_offset=idx, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip if oob else nisa.oob_mode.error)
    out = nl.ndarray(dst.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(out, dst)
    return out


def test_vector_offset_gathers_one_row_per_partition():
    a = torch.randn(128, 40)
    rows = torch.randperm(128)[:64].to(torch.int32).reshape(64, 1)
    out = simulator.run(_gather_kernel, a, rows, False).outputs
    assert torch.equal(out, a[rows.reshape(-1).long()])


def test_out_of_range_rows_raise_or_are_skipped_by_oob_mode():
    a = torch.randn(16, 8)
    rows = torch.tensor([[3], [16], [0], [-1]], dtype=torch.int32)
    with pytest.raises(IndexError, match=r"rows \[1, 3\].*oob_mode=error"):
        simulator.run(_gather_kernel, a, rows, False)
    out = simulator.run(_gather_kernel, a, rows, True).outputs
    assert torch.equal(out[0], a[3]) and torch.equal(out[2], a[0])
    assert (out[1] == -1).all() and (out[3] == -1).all()  # skipped: dst keeps its values


def _gather_and_copy_int8(a, offsets):
    import nki.isa as nisa
    import nki.language as nl

    idx = nl.ndarray((offsets.shape[0], 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=offsets)
    gathered = nl.ndarray((offsets.shape[0], a.shape[1]), dtype=nl.int8, buffer=nl.sbuf)
    nisa.dma_copy(dst=gathered, src=a.ap([[a.shape[1], offsets.shape[0]], [1, a.shape[1]]],
                                         vector_offset=idx, indirect_dim=0))
    direct = nl.ndarray(a.shape, dtype=nl.int8, buffer=nl.sbuf)
    nisa.dma_copy(dst=direct, src=a)
    outs = [nl.ndarray(t.shape, dtype=nl.int8, buffer=nl.shared_hbm) for t in (gathered, direct)]
    for out, t in zip(outs, (gathered, direct)):
        nisa.dma_copy(out, t)
    return tuple(outs)


def test_indirect_copy_casts_as_the_direct_copy_does():
    # dma_copy casts "first ... from src.dtype to float32, then from float32 to dst.dtype"
    # (docs/simulator.md "Casts"): int32 300 -> int8 saturates to 127 (a bit truncation
    # would give 44), through a run-time row offset as through a plain copy
    a = torch.randint(-1000, 1000, (6, 5), dtype=torch.int32)
    a[0, :2] = torch.tensor([300, -300], dtype=torch.int32)
    rows = torch.tensor([[4], [0], [2]], dtype=torch.int32)
    gathered, direct = simulator.run(_gather_and_copy_int8, a, rows).outputs
    expected = a.clamp(-128, 127).to(torch.int8)
    assert expected[0, :2].tolist() == [127, -128]
    assert torch.equal(direct, expected)
    assert torch.equal(gathered, expected[[4, 0, 2]])


def _scatter_kernel(src, rows, out):
    import nki.isa as nisa
    import nki.language as nl

    idx = nl.ndarray((rows.shape[0], 1), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=rows)
    t = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    P, F = src.shape
    nisa.dma_copy(dst=out.ap([[F, P], [1, F]], vector_offset=idx, indirect_dim=0), src=t)
    return out


def test_vector_offset_scatters_into_an_input():
    src = torch.randn(8, 5)
    out = torch.randn(20, 5)    # the 12 rows the kernel does not write must keep these values
    rows = torch.tensor([19, 0, 7, 3, 11, 2, 5, 13], dtype=torch.int32).reshape(8, 1)
    ref = out.clone()
    simulator.run(_scatter_kernel, src, rows, out)
    ref[rows.reshape(-1).long()] = src
    assert torch.equal(out, ref)


def test_dynamic_select_and_vector_select(sim, mk):
    _, nl, nisa = sim
    x = torch.randn(4, 8, 6)
    h = mk(x, buffer="hbm")
    i = mk(torch.tensor([[2]]), "int32")
    assert torch.equal(h.select(0, i).values(), x[2])
    assert torch.equal(h.select(1, i).values(), x[:, 2])
    offs = mk(torch.tensor([[3], [1], [1]]), "int32")
    g = h.vector_select(0, offs)
    assert g.shape == (3, 8, 6) and torch.equal(g.values(), x[[3, 1, 1]])
    sb = nl.ndarray((4, 8), dtype=nl.float32)
    with pytest.raises(NkiValidationError, match="partition dim"):
        sb.select(0, i)
    with pytest.raises(NkiValidationError, match="only HBM"):
        sb.vector_select(0, offs)
    with pytest.raises(NkiValidationError, match="already indirect"):
        h.select(0, i).ap([[6, 8], [1, 6]], scalar_offset=i)


def test_ap_argument_rules(sim, mk):
    _, nl, _ = sim
    h = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.hbm)
    i = mk(torch.tensor([[1]]), "int32")
    with pytest.raises(NkiValidationError, match="mutually exclusive"):
        h.ap([[8, 8], [1, 8]], scalar_offset=i, vector_offset=i)
    with pytest.raises(NkiValidationError, match="indirect_dim=0 only"):
        h.ap([[8, 1], [1, 8]], vector_offset=i, indirect_dim=1)
    with pytest.raises(NkiValidationError, match="num must be >= 1"):
        h.ap([[8, 0]])
    with pytest.raises(UnsupportedError, match="negative steps"):
        h.ap([[-8, 2]])
    f = mk(torch.tensor([[1.0]]))
    with pytest.raises(NkiValidationError, match="integer dtype"):
        h.ap([[1, 8]], scalar_offset=f).values()


def test_empty_ds_is_a_view_an_instruction_refuses(sim):
    _, nl, nisa = sim
    t = nl.ndarray((8, 16), dtype=nl.float32)
    e = t[:, nl.ds(16, 0)]
    assert e.shape == (8, 0)
    with pytest.raises(NkiValidationError, match="empty"):
        nisa.memset(e, 0.0)
    with pytest.raises(IndexError):
        t[:, nl.ds(17, 0)]


def test_engine_access_patterns_have_at_most_four_free_dimensions(sim, mk):
    # deep dive, Hardware Capability: "Within each SBUF/PSUM partition, the tensor read/write
    # logic ... supports accessing elements from up to four-dimensional arrays"
    _, nl, nisa = sim
    from nki_kernels.simulator.isa.operands import free_pattern_rank
    x = torch.randn(8, 256)
    t = mk(x)

    def view(pattern, **kw):
        v = t.ap(pattern=pattern, offset=0, **kw)
        ref = x.as_strided([n for _, n in pattern], [st for st, _ in pattern])
        return v, ref

    # five dimensions that each step over the next exactly: one free dimension
    flat, ref = view([[256, 8], [128, 2], [64, 2], [32, 2], [16, 2], [1, 16]])
    assert free_pattern_rank(flat.shape, flat.strides) == 1
    _reads(nl, nisa, flat, ref)
    # four that do not merge: the limit, allowed
    four, ref = view([[256, 8], [128, 2], [32, 2], [8, 2], [2, 2]])
    assert free_pattern_rank(four.shape, four.strides) == 4
    _reads(nl, nisa, four, ref)
    # stride-0 (broadcast) dimensions merge with each other, not with a stepping one
    bcast, ref = view([[256, 8], [0, 3], [0, 5], [1, 4]])
    assert free_pattern_rank(bcast.shape, bcast.strides) == 2
    _reads(nl, nisa, bcast, ref)
    # five that do not merge: refused by every engine instruction, source or destination
    five_pattern = [[256, 8], [128, 2], [48, 2], [16, 2], [4, 2], [1, 2]]
    five, ref = view(five_pattern)
    assert free_pattern_rank(five.shape, five.strides) == 5
    out = nl.ndarray((8, 2, 2, 2, 2, 2), dtype=nl.float32)
    with pytest.raises(NkiValidationError, match=r"tensor_copy: src .* accesses 5 free dimensions .* at most 4"):
        nisa.tensor_copy(out, five)
    with pytest.raises(NkiValidationError, match="activation: data .* accesses 5 free dimensions"):
        nisa.activation(dst=out, op=nl.exp, data=five)
    with pytest.raises(NkiValidationError, match="memset: dst .* accesses 5 free dimensions"):
        nisa.memset(dst=view(five_pattern)[0], value=1.0)
    # an indirect view (run-time scalar offset) is held to it too
    reg = nisa.register_alloc(0)
    indirect, _ = view(five_pattern, scalar_offset=reg, indirect_dim=0)
    assert indirect.is_indirect()
    with pytest.raises(NkiValidationError, match="accesses 5 free dimensions"):
        nisa.tensor_copy(out, indirect)
    # DMA is not an engine access: the same five-dimension view moves to HBM
    h = nl.ndarray((8, 2, 2, 2, 2, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=h, src=five)
    assert torch.equal(h.values(), ref)

"""Explicit placement (``nl.ndarray(..., address=(partition, byte))``): aliasing, address
rules, capacity from first to last use by address ranges, and placement conflicts."""

from __future__ import annotations

import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import CapacityError, NkiValidationError
from nki_kernels.simulator.hardware import get_target
from nki_kernels.simulator.memory import PlacementConflict

TRN2 = get_target("trn2")


def test_two_tensors_at_one_address_share_their_bits(sim):
    _, nl, nisa = sim
    a = nl.ndarray((32, 16), dtype=nl.float32, address=(0, 4096))
    b = nl.ndarray((32, 64), dtype=nl.uint8, address=(0, 4096))
    nisa.memset(a, 2.0)  # 0x40000000 little endian: bytes 00 00 00 40
    assert b.values()[:, 0::4].eq(0).all() and b.values()[:, 3::4].eq(0x40).all()
    nisa.memset(b[:, 0:4], 0)
    nisa.memset(b[:, 3:4], 0x3F)  # a[:, 0] becomes 0x3F000000 = 0.5
    assert a.values()[:, 0].eq(0.5).all() and a.values()[:, 1:].eq(2.0).all()
    assert a.address == (0, 4096)
    shifted = nl.ndarray((32, 8), dtype=nl.float32, address=(0, 4096 + 32))
    assert shifted.values().eq(2.0).all()  # bytes 32.. of a's partitions


def test_partition_offset_places_the_tensor_on_those_partitions(sim):
    _, nl, nisa = sim
    whole = nl.ndarray((128, 4), dtype=nl.float32, address=(0, 0))
    nisa.memset(whole, 0.0)
    part = nl.ndarray((32, 4), dtype=nl.float32, address=(64, 0))
    nisa.memset(part, 7.0)
    v = whole.values()
    assert v[64:96].eq(7.0).all() and v[:64].eq(0).all() and v[96:].eq(0).all()


@pytest.mark.parametrize("shape, buffer, address, message", [
    ((64, 4), "sbuf", (96, 0), "partitions 96..159 exceed the 128"),
    ((8, 1024), "sbuf", (0, TRN2.sbuf_bytes_per_partition - 1024), "exceed the 229376 bytes"),
    ((8, 512), "psum", (0, 1024), "bank boundary"),
    ((8, 1024), "psum", (0, 7 * 2048), "exceed the 16384 bytes"),
    ((8, 4), "sbuf", (0, 2), "not a multiple of the 4-byte"),
    ((8, 4), "hbm", (0, 0), "explicit HBM placement .* is not supported by this simulator"),
    ((8, 4), "hbm", (64,), "explicit HBM placement \\(a 1-tuple \\(free_offset,\\), nl.ndarray\\) is not supported"),
    ((8, 4), "sbuf", (0,), "must be \\(partition_offset, byte_offset\\)"),
])
def test_address_rules(sim, shape, buffer, address, message):
    _, nl, _ = sim
    with pytest.raises(NkiValidationError, match=message):
        nl.ndarray(shape, dtype=nl.float32, buffer=getattr(nl, buffer), address=address)


def test_a_newly_placed_psum_tensor_starts_a_fresh_accumulation(sim):
    # accumulate=None overwrites on the first matmul into a tensor, even where a tensor
    # placed earlier at the same bank left an open accumulation group
    _, nl, nisa = sim
    x = torch.randn(128, 16)
    w = torch.randn(128, 32)
    st = nl.ndarray((128, 16), dtype=nl.float32)
    st.dtype.assign(st._data, x)
    mv = nl.ndarray((128, 32), dtype=nl.float32)
    mv.dtype.assign(mv._data, w)
    first = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.psum, address=(0, 2048))
    nisa.nc_matmul(first, st, mv)
    nisa.nc_matmul(first, st, mv)  # accumulates: 2 x
    second = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.psum, address=(0, 2048))
    nisa.nc_matmul(second, st, mv)  # a new tensor: overwrites
    torch.testing.assert_close(second.values(), x.t() @ w, rtol=1e-5, atol=1e-4)


def _touch(*tiles):
    import nki.isa as nisa

    for t in tiles:
        nisa.memset(t, 0.0)


def test_capacity_counts_the_union_of_live_placed_ranges():
    def kernel(x):
        import nki.language as nl

        # three tensors over the same 150 KiB: 150 KiB in use, not 450
        ts = [nl.ndarray((128, 150 * 256), dtype=nl.float32, address=(0, 0)) for _ in range(3)]
        extra = nl.ndarray((128, 40 * 256), dtype=nl.float32)  # 40 KiB unplaced
        _touch(*ts, extra)
        _touch(*ts, extra)
        return None

    r = simulator.run(kernel, torch.zeros(1, 1))
    assert r.peak_sbuf_bytes_per_partition == 190 * 1024


def test_placed_and_unplaced_tensors_overflow_together():
    def kernel(x):
        import nki.language as nl

        placed = nl.ndarray((128, 150 * 256), dtype=nl.float32, address=(0, 0), name="placed")
        other = nl.ndarray((128, 80 * 256), dtype=nl.float32, name="unplaced_80k")
        _touch(placed, other)
        _touch(placed, other)
        return None

    with pytest.raises(CapacityError, match="sbuf: unplaced_80k .* 81920 bytes"):
        simulator.run(kernel, torch.zeros(1, 1))


def test_placed_psum_counts_the_banks_it_touches():
    def kernel(x):
        import nki.language as nl

        banks = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=(0, 2048 * b))
                 for b in range(7)]
        again = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum, address=(0, 0))
        _touch(*banks, again)  # banks 0-1 again: still 7 banks
        unplaced = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum)  # + 2 = 9
        _touch(unplaced, *banks, again)  # first use while all the banks are still live
        return None

    with pytest.raises(CapacityError, match=r"psum: .*\(2 banks\).* 7 banks in use"):
        simulator.run(kernel, torch.zeros(1, 1))


def _conflict_kernel(x, reuse_after_last_read):
    import nki.isa as nisa
    import nki.language as nl

    a = nl.ndarray((128, 64), dtype=nl.float32, address=(0, 0), name="a")
    nisa.dma_copy(a, x)
    if reuse_after_last_read:
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(out, a)                       # a's last read
    b = nl.ndarray((128, 32), dtype=nl.float32, address=(0, 128), name="b")
    nisa.memset(b, 1.0)                             # b's first write: a's bytes 128..255
    if not reuse_after_last_read:
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(out, a)                       # a read again: corrupted
    return out


def test_overwriting_a_placed_tensor_that_is_read_later_is_reported():
    x = torch.randn(128, 64)
    with pytest.raises(PlacementConflict, match=r"b .* over bytes of a .* bytes 128\.\.255"):
        simulator.run(_conflict_kernel, x, False)
    out = simulator.run(_conflict_kernel, x, True).outputs  # reuse after the last read: fine
    assert torch.equal(out, x)

"""Allocation: poisoning, shape rules, SBUF/PSUM capacity accounting and liveness."""

from __future__ import annotations

import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import CapacityError, NkiValidationError
from nki_kernels.simulator.hardware import get_target


def test_new_memory_is_poisoned(sim):
    _, nl, _ = sim
    f = nl.ndarray((4, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
    i = nl.ndarray((4, 4), dtype=nl.int32, buffer=nl.sbuf)
    assert torch.isnan(f.values()).all()
    assert (i.values() == 4).all()


@pytest.mark.parametrize("shape, buffer, words", [
    ((256, 4), "sbuf", ["partition dim 256", "maximum 128"]),
    ((), "sbuf", ["at least one dim"]),
    ((64,), "psum", ["at least 2 dims (1-D: SBUF only)"]),
    ((129, 4), "psum", ["partition dim 129"]),
])
def test_on_chip_shape_rules(sim, shape, buffer, words):
    _, nl, _ = sim
    with pytest.raises(NkiValidationError) as err:
        nl.ndarray(shape, dtype=nl.float32, buffer=getattr(nl, buffer))
    for w in words:
        assert w in str(err.value)


def test_hbm_takes_any_shape(sim):
    _, nl, _ = sim
    assert nl.ndarray((1000,), dtype=nl.float32, buffer=nl.hbm).shape == (1000,)


def _touch(*tiles):
    """A memset of each tile: an instruction that uses it, so it holds its bytes."""
    import nki.isa as nisa

    for t in tiles:
        nisa.memset(t, 0.0)


def test_sbuf_overflow_raises_capacity_error_with_numbers():
    limit = get_target("trn2").sbuf_bytes_per_partition

    def kernel(x):
        import nki.language as nl

        keep = [nl.ndarray((128, 16384), dtype=nl.float32, buffer=nl.sbuf) for _ in range(3)]
        _touch(*keep)
        extra = nl.ndarray((128, 16384), dtype=nl.float32, buffer=nl.sbuf, name="one_too_many")
        _touch(extra, *keep)  # the three are used again after the fourth: all live at once
        return None

    with pytest.raises(CapacityError) as err:
        simulator.run(kernel, torch.zeros(1, 1))
    msg = str(err.value)
    for w in ("sbuf", "one_too_many", "65536", "196608", str(limit), "trn2", "memset"):
        assert w in msg


def test_psum_overflow_counts_banks():
    def kernel(x):
        import nki.language as nl

        keep = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(7)]
        _touch(*keep)
        two = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum)  # 2 banks: 9 > 8
        _touch(two, *keep)
        return None

    with pytest.raises(CapacityError, match=r"psum.*2 banks.*7 banks in use.*limit 8"):
        simulator.run(kernel, torch.zeros(1, 1))


def test_within_capacity_is_quiet_and_peaks_are_reported():
    def kernel(x):
        import nki.language as nl

        a = nl.ndarray((128, 1000), dtype=nl.bfloat16, buffer=nl.sbuf)
        p = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(8)]
        _touch(a, *p)
        _touch(a, *p)
        return None

    r = simulator.run(kernel, torch.zeros(1, 1))
    assert r.peak_sbuf_bytes_per_partition == 2000
    assert r.peak_psum_banks == 8
    assert r.core_peak_sbuf_bytes_per_partition == (2000,) and r.core_peak_psum_banks == (8,)


def test_a_tile_holds_its_bytes_from_first_to_last_use():
    def kernel(x):
        import nki.language as nl

        for _ in range(50):  # 50 x 64 KiB would overflow if they were all live
            t = nl.ndarray((128, 16384), dtype=nl.float32, buffer=nl.sbuf)
            _touch(t)
        held = [nl.ndarray((128, 16384), dtype=nl.float32, buffer=nl.sbuf) for _ in range(10)]
        for h in held:  # still referenced by the list, but each is dead after its use
            _touch(h)
        unused = [nl.ndarray((128, 16384), dtype=nl.float32, buffer=nl.sbuf) for _ in range(9)]
        return None

    r = simulator.run(kernel, torch.zeros(1, 1))
    assert r.peak_sbuf_bytes_per_partition == 65536


def test_capacity_depends_on_target():
    def kernel(x):
        import nki.language as nl

        a = nl.ndarray((128, 200 * 1024 // 4), dtype=nl.float32, buffer=nl.sbuf)  # 200 KiB
        _touch(a)
        return None

    simulator.run(kernel, torch.zeros(1, 1), target="trn2")  # 224 KiB: fits
    with pytest.raises(CapacityError, match="trn1"):
        simulator.run(kernel, torch.zeros(1, 1), target="trn1")  # 192 KiB: does not

"""The running VectorE / ScalarE load estimate both attention directions place work with
(kernels/engine_balance.py ``VectorScalarBalance``): the greedy pick, the cost of a PSUM
copy by the cost model's rule, and the even spreading of a share."""

from __future__ import annotations

import pytest

from nki_kernels import _kernel_sources, simulator
from nki_kernels.simulator.cost.model import compute_cost


def _balance(share=0.0, target="trn2"):
    with simulator.activated(target=target):
        mod = _kernel_sources.load("engine_balance", "simulator")
        return mod.VectorScalarBalance(share)


@pytest.mark.parametrize("share", [0.0, 0.25, 0.3, 0.5, 2 / 3, 1.0])
def test_a_share_is_spread_evenly(share):
    bal = _balance(share)
    taken = [bal.spread_share() for _ in range(60)]
    # after i chances round-half-up(i * share) were taken, never drifting by one or more
    for i in range(1, 61):
        assert abs(sum(taken[:i]) - i * share) <= 0.5 + 1e-9
    assert sum(taken) == round(60 * share)


def test_pick_keeps_the_two_engines_even_and_charges_the_one_it_picks():
    with simulator.activated(target="trn2") as nki:
        engine = nki.isa.engine
        bal = _balance()
        c = bal.costs
        bal.charge(vector_cycles=960.0)                      # VectorE 1000 ns ahead
        assert bal.vector_ns == pytest.approx(960.0 / c.vector_ghz)
        # a copy either engine can do goes to ScalarE, the idle one, and is charged there
        assert bal.pick(500.0, 600.0) == engine.scalar
        assert bal.scalar_ns == pytest.approx(600.0 / c.scalar_ghz)
        assert bal.vector_ns == pytest.approx(960.0 / c.vector_ghz)
        # ScalarE now ahead by more than VectorE's share of the next copy: VectorE takes it
        bal.charge(scalar_cycles=6000.0)
        assert bal.pick(500.0, 600.0) == engine.vector
        assert bal.vector_ns == pytest.approx(1460.0 / c.vector_ghz)


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
@pytest.mark.parametrize("elems, sixteen", [(8, True), (64, False), (197, True), (512, False), (512, True)])
def test_copy_cycles_are_what_the_cost_model_charges_a_psum_copy(elems, sixteen, target):
    """VectorE: a tensor_copy out of PSUM (16-bit on both sides, as a TensorE transpose of
    16-bit data leaves it: the performance mode's half factor); ScalarE: the same copy as
    activation(copy) (16-bit: 2 elements per cycle on trn3). Both floor at MIN_II (8
    elements here)."""
    from nki_kernels.simulator.hardware import get_target

    hw = get_target(target)
    with simulator.activated(target=target) as nki:
        nl, nisa = nki.language, nki.isa
        dtype = nl.bfloat16 if sixteen else nl.float32
        src = nl.ndarray((128, elems), dtype=dtype, buffer=nl.psum)
        nisa.memset(src, 1.0)
        dst = nl.ndarray((128, elems), dtype=dtype, buffer=nl.sbuf)
        on_vector = nisa.tensor_copy(dst, src, engine=nisa.engine.vector).instruction
        on_scalar = nisa.activation(dst, nl.copy, src).instruction
        vector, scalar = _balance(target=target).copy_cycles(elems, sixteen)
    assert vector == pytest.approx(compute_cost(on_vector, hw).cycles)
    assert scalar == pytest.approx(compute_cost(on_scalar, hw).cycles)

"""SimParams: one frozen, validated object of run options, read through the run."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import NkiValidationError, SimParams


def _poisoned(x):
    """Returns a never-written fp32 tile and int32 tile (stored to HBM) next to x's copy."""
    import nki.language as nl

    f = nl.ndarray((2, 3), dtype=nl.float32, buffer=nl.sbuf)
    i = nl.ndarray((2, 3), dtype=nl.int32, buffer=nl.sbuf)
    out_f = nl.ndarray((2, 3), dtype=nl.float32, buffer=nl.shared_hbm)
    out_i = nl.ndarray((2, 3), dtype=nl.int32, buffer=nl.shared_hbm)
    nl.store(out_f, f)
    nl.store(out_i, i)
    return out_f, out_i


def _lnc(x):
    import nki.language as nl

    out = nl.ndarray((1, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.full((1, 1), float(nl.num_programs()), dtype=nl.float32)
    nl.store(out[:, nl.program_id(0):nl.program_id(0) + 1], t)  # core i writes column i
    if nl.num_programs() == 1:
        nl.store(out[:, 1:2], t)
    return out


def test_defaults_and_frozen():
    p = SimParams()
    assert p.target.name == "trn2" and p.logical_cores is None and math.isnan(p.poison_float)
    assert p.poison_int == 4 and p.seed == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.poison_int = 5
    assert SimParams(target="trn3").target is simulator.SimParams(target="trn3").target


@pytest.mark.parametrize("kwargs, message", [
    ({"target": "trn5"}, r"target='trn5' is not supported; expected one of \('trn1', 'trn2', 'trn3'\)"),
    ({"logical_cores": 4}, r"logical_cores=4: the logical-core degree must be 1 or 2"),
    ({"logical_cores": True}, r"logical_cores=True: the logical-core degree must be 1 or 2"),
    ({"logical_cores": 2, "target": "trn1"}, r"logical_cores=2 exceeds the maximum 1 of trn1"),
    ({"poison_float": "nan"}, r"poison_float='nan' must be a real number"),
    ({"poison_int": 300}, r"poison_int=300 must be an integer in \[0, 127\]"),
    ({"poison_int": -1}, r"poison_int=-1 must be an integer in \[0, 127\]"),
    ({"poison_int": 2.0}, r"poison_int=2.0 must be an integer"),
    ({"seed": -3}, r"seed=-3 must be an integer in \[0, 2\*\*64\)"),
    ({"seed": 2**64}, r"seed=18446744073709551616 must be an integer in \[0, 2\*\*64\)"),
    ({"poison_float": True}, r"poison_float=True must be a real number"),
])
def test_invalid_options_name_argument_value_and_limit(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SimParams(**kwargs)


def test_poison_values_are_read_through_the_run():
    x = torch.randn(2, 3)
    f, i = simulator.run(_poisoned, x).outputs
    assert torch.isnan(f).all() and torch.equal(i, torch.full((2, 3), 4, dtype=torch.int32))
    f, i = simulator.run(_poisoned, x, params=SimParams(poison_float=-7.5, poison_int=9)).outputs
    assert torch.equal(f, torch.full((2, 3), -7.5))
    assert torch.equal(i, torch.full((2, 3), 9, dtype=torch.int32))


def test_logical_cores_from_params_or_brackets():
    x = torch.randn(1, 2)
    jit = simulator.nki_modules()["nki"].jit
    assert simulator.run(_lnc, x).outputs.tolist() == [[1.0, 1.0]]
    assert simulator.run(_lnc, x, params=SimParams(logical_cores=2)).outputs.tolist() == [[2.0, 2.0]]
    assert simulator.run(jit(_lnc)[2], x).outputs.tolist() == [[2.0, 2.0]]
    assert simulator.run(jit(_lnc)[2], x, params=SimParams(logical_cores=2)).outputs.tolist() == [[2.0, 2.0]]
    with pytest.raises(NkiValidationError, match=r"kernel\[1\]: .* must equal the run's logical_cores=2"):
        simulator.run(jit(_lnc)[1], x, params=SimParams(logical_cores=2))
    with pytest.raises(NkiValidationError, match=r"kernel\[2\]: logical-core degree 2 exceeds the maximum 1 of trn1"):
        simulator.run(jit(_lnc)[2], x, target="trn1")


def test_seed_sets_the_random_stream():
    def kernel(x):
        import nki.isa as nisa
        import nki.language as nl

        bits = nl.ndarray((4, 8), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.rng(bits)
        out = nl.ndarray((4, 8), dtype=nl.uint32, buffer=nl.shared_hbm)
        nl.store(out, bits)
        return out

    x = torch.zeros(1, 1)
    a = simulator.run(kernel, x).outputs
    assert torch.equal(a, simulator.run(kernel, x, params=SimParams(seed=0)).outputs)
    assert not torch.equal(a, simulator.run(kernel, x, params=SimParams(seed=1)).outputs)


def test_target_and_params_together_is_an_error():
    with pytest.raises(ValueError, match="target='trn3' and params=... both given"):
        simulator.run(_lnc, torch.randn(1, 2), target="trn3", params=SimParams())
    with pytest.raises(TypeError, match="must be a simulator.SimParams"):
        simulator.estimate(_lnc, params={"target": "trn2"})


def test_activated_params_apply_to_nl_calls_and_simulate():
    with simulator.activated(params=SimParams(target="trn1", poison_float=1.5)) as nki:
        import nki.language as nl

        assert nl.tile_size.total_available_sbuf_size == 192 * 1024
        assert torch.equal(nl.ndarray((2, 2), dtype=nl.float32).values(), torch.full((2, 2), 1.5))
        f, _ = nki.simulate(_poisoned)(torch.randn(2, 3))
        assert torch.equal(f, torch.full((2, 3), 1.5))


def test_the_limits_of_the_options_are_inclusive():
    x = torch.randn(2, 3)
    f, i = simulator.run(_poisoned, x, params=SimParams(poison_int=0, poison_float=0.0)).outputs
    assert torch.equal(i, torch.zeros((2, 3), dtype=torch.int32)) and torch.equal(f, torch.zeros(2, 3))
    assert SimParams(poison_int=127).poison_int == 127
    assert SimParams(seed=2**64 - 1).seed == 2**64 - 1

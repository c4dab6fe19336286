"""LNC=2 launches: the two programs run concurrently and meet at sendrecv / core_barrier;
deadlocks, races on shared HBM, per-core memory, and the launch degree from
NEURON_LOGICAL_NC_CONFIG."""

from __future__ import annotations

import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import CapacityError, NkiValidationError, SimParams
from nki_kernels.simulator.errors import DeadlockError, RaceError

LNC2 = SimParams(logical_cores=2)


def _exchange(x):
    import nki.isa as nisa
    import nki.language as nl

    me = nl.program_id(0)
    rows = x.shape[0] // 2
    mine = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(mine, x[me * rows:(me + 1) * rows])
    theirs = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - me, recv_from_rank=1 - me, pipe_id=0)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(out[me * rows:(me + 1) * rows], theirs)  # each core writes its half
    return out


def test_sendrecv_exchanges_tiles_between_the_cores():
    x = torch.randn(16, 8)
    r = simulator.run(_exchange, x, params=LNC2)
    assert torch.equal(r.outputs, torch.cat([x[8:], x[:8]]))
    sends = [i for i in r.trace if i.op == "sendrecv"]
    assert sorted(i.attrs["core"] for i in sends) == [0, 1]
    assert all(i.engine == "dma" and i.attrs["bytes"] == 8 * 8 * 4 for i in sends)


def test_runs_are_deterministic():
    x = torch.randn(16, 8)
    a = simulator.run(_exchange, x, params=LNC2).trace
    b = simulator.run(_exchange, x, params=LNC2).trace
    assert [(i.op, i.attrs.get("core")) for i in a] == [(i.op, i.attrs.get("core")) for i in b]


def _one_sided(x):
    import nki.isa as nisa
    import nki.language as nl

    t = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(t, 1.0)
    if nl.program_id(0) == 0:
        nisa.sendrecv(src=t, dst=t, send_to_rank=1, recv_from_rank=1, pipe_id=3)
    return None


def test_a_core_waiting_for_a_partner_that_never_comes_is_a_deadlock():
    with pytest.raises(DeadlockError, match=r"core 0 waits for sendrecv from core 1 "
                                            r"\(pipe_id 3\), but core 1 has finished"):
        simulator.run(_one_sided, torch.zeros(1, 1), params=LNC2)


def _barriers(x, counts, names=(None, None)):
    import nki.isa as nisa
    import nki.language as nl

    me = nl.program_id(0)
    for _ in range(counts[me]):
        nisa.core_barrier(x, (0, 1), name=names[me])
    return None


def test_unmatched_barriers_deadlock_and_named_ones_must_agree():
    x = torch.zeros(1, 1)
    simulator.run(_barriers, x, (2, 2), params=LNC2)  # matched: fine
    with pytest.raises(DeadlockError, match=r"core 1 waits for core_barrier #2.*core 0 has finished"):
        simulator.run(_barriers, x, (2, 3), params=LNC2)
    with pytest.raises(NkiValidationError, match="barrier #0 is named 'b' on core 1 but 'a' on core 0"):
        simulator.run(_barriers, x, (1, 1), ("a", "b"), params=LNC2)


def _producer_consumer(x, sync):
    import nki.isa as nisa
    import nki.language as nl

    me = nl.program_id(0)
    scratch = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="scratch")
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    if me == 0:  # core 0 produces scratch
        nisa.dma_copy(t, x)
        nisa.dma_copy(scratch, t)
    if sync:
        nisa.core_barrier(scratch, (0, 1))
    if me == 1:  # core 1 consumes it
        nisa.dma_copy(t, scratch)
        nisa.dma_copy(out, t)
    return out


def test_reading_what_the_other_core_writes_needs_a_barrier():
    x = torch.randn(8, 16)
    with pytest.raises(RaceError, match=r"scratch \(8, 16\) float32, bytes 0\.\.511: core 1 reads "
                                        r"what core 0 writes .*core 0 writes at instruction #1"):
        simulator.run(_producer_consumer, x, False, params=LNC2)
    out = simulator.run(_producer_consumer, x, True, params=LNC2).outputs
    assert torch.equal(out, x)


def _writers(x, overlap, same_values):
    import nki.isa as nisa
    import nki.language as nl

    me = nl.program_id(0)
    out = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.shared_hbm, name="out")
    t = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(t, 1.0 if same_values else float(me))
    cols = slice(0, 16) if overlap else slice(8 * me, 8 * me + 8)
    nisa.dma_copy(out[:, cols], t[:, cols])
    return out


@pytest.mark.parametrize("overlap, same, race", [(False, False, False), (True, True, False),
                                                 (True, False, True)])
def test_overlapping_writes_race_only_when_the_values_differ(overlap, same, race):
    x = torch.zeros(1, 1)
    if race:
        with pytest.raises(RaceError, match=r"out \(8, 16\) float32, bytes 0\.\.511: both cores "
                                            r"write different values"):
            simulator.run(_writers, x, overlap, same, params=LNC2)
    else:
        simulator.run(_writers, x, overlap, same, params=LNC2)


def _sendrecv_orders(x):
    import nki.isa as nisa
    import nki.language as nl

    me = nl.program_id(0)
    scratch = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    flag = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(flag, me)
    got = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    if me == 0:
        nisa.dma_copy(t, x)
        nisa.dma_copy(scratch, t)
    nisa.sendrecv(src=flag, dst=got, send_to_rank=1 - me, recv_from_rank=1 - me, pipe_id=0)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    if me == 1:
        nisa.dma_copy(t, scratch)
        nisa.dma_copy(out, t)
    return out


def test_a_sendrecv_orders_the_accesses_around_it():
    x = torch.randn(4, 4)
    assert torch.equal(simulator.run(_sendrecv_orders, x, params=LNC2).outputs, x)


def _per_core_memory(x, extra_on_core1):
    import nki.isa as nisa
    import nki.language as nl

    t = nl.ndarray((128, 180 * 256), dtype=nl.float32, buffer=nl.sbuf)  # 180 KiB
    nisa.memset(t, 0.0)
    if extra_on_core1 and nl.program_id(0) == 1:
        u = nl.ndarray((128, 60 * 256), dtype=nl.float32, buffer=nl.sbuf, name="core1_extra")
        nisa.memset(u, 0.0)
        nisa.memset(t, 0.0)
    return None


def test_each_core_has_its_own_sbuf():
    x = torch.zeros(1, 1)
    r = simulator.run(_per_core_memory, x, False, params=LNC2)  # 2 x 180 KiB: one per core
    assert r.core_peak_sbuf_bytes_per_partition == (180 * 1024, 180 * 1024)
    assert r.peak_sbuf_bytes_per_partition == 180 * 1024
    with pytest.raises(CapacityError, match=r"core1_extra .* core 1\)"):
        simulator.run(_per_core_memory, x, True, params=LNC2)


def test_static_divergence_between_the_cores_is_allowed():
    def kernel(x):
        import nki.isa as nisa
        import nki.language as nl

        out = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 4), dtype=nl.float32, buffer=nl.sbuf)
        for _ in range(1 + 3 * nl.program_id(0)):  # core 1 issues more instructions
            nisa.memset(t, float(nl.program_id(0)))
        nisa.dma_copy(out[nl.program_id(0):nl.program_id(0) + 1], t)
        return out

    r = simulator.run(kernel, torch.zeros(1, 1), params=LNC2)
    assert r.outputs.tolist() == [[0.0] * 4, [1.0] * 4]
    assert sum(1 for i in r.trace if i.op == "memset" and i.attrs["core"] == 1) == 4


def test_sendrecv_rules():
    def kernel(x, case):
        import nki.isa as nisa
        import nki.language as nl

        a = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(a, 0.0)
        if case == "psum":
            b = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum)
        elif case == "dtype":
            b = nl.ndarray((4, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
        elif case == "gpsimd":
            a = nl.ndarray((4, 512), dtype=nl.float32, buffer=nl.sbuf)
            b = nl.ndarray((4, 512), dtype=nl.float32, buffer=nl.sbuf)
        else:
            b = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
        other = 1 - nl.program_id(0)
        eng = nisa.dma_engine.gpsimd_dma if case == "gpsimd" else nisa.dma_engine.dma
        nisa.sendrecv(a, b, other, other, 0, dma_engine=eng)
        return None

    x = torch.zeros(1, 1)
    for case, msg in (("psum", "dst must be in SBUF"), ("dtype", "must be the same"),
                      ("gpsimd", "at most 1024 bytes per partition of a 32-bit type")):
        with pytest.raises(NkiValidationError, match=msg):
            simulator.run(kernel, x, case, params=LNC2)
    with pytest.raises(DeadlockError, match="not in this launch"):
        simulator.run(kernel, x, "ok")  # LNC=1: core 1 does not exist


# ---------------------------------------------------------------- launch degree
def _degree(x):
    import nki.language as nl

    out = nl.ndarray((1, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    import nki.isa as nisa

    nisa.memset(t, float(nl.num_programs()))
    nisa.dma_copy(out[:, nl.program_id(0):nl.program_id(0) + 1], t)
    if nl.num_programs() == 1:
        nisa.dma_copy(out[:, 1:2], t)
    return out


def test_nki_simulate_takes_the_degree_from_neuron_logical_nc_config(monkeypatch):
    x = torch.zeros(1, 1)
    with simulator.activated("trn2") as nki:
        assert nki.simulate(_degree)(x).tolist() == [[1.0, 1.0]]  # unset: LNC=1
        monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
        assert nki.simulate(_degree)(x).tolist() == [[2.0, 2.0]]
        assert nki.jit(_degree)(x).tolist() == [[2.0, 2.0]]
        assert nki.simulate(nki.jit(_degree)[2])(x).tolist() == [[2.0, 2.0]]
        with pytest.raises(NkiValidationError, match=r"kernel\[1\]: .* NEURON_LOGICAL_NC_CONFIG=2"):
            nki.simulate(nki.jit(_degree)[1])(x)
        monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "4")
        with pytest.raises(ValueError, match="NEURON_LOGICAL_NC_CONFIG='4'.* 1 or 2"):
            nki.simulate(_degree)(x)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    with simulator.activated("trn1") as nki:
        with pytest.raises(NkiValidationError, match="exceeds the maximum 1 of trn1"):
            nki.simulate(_degree)(x)
    # simulator.run takes the degree from its params, not from the environment
    assert simulator.run(_degree, x).outputs.tolist() == [[1.0, 1.0]]


def _dynamic_loops(x, differ):
    import nki.isa as nisa
    import nki.language as nl

    t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    trips = 2 + (nl.program_id(0) if differ else 0)  # a run-time value in a register
    nl.fori_loop(0, nisa.register_alloc(trips), lambda i: nisa.memset(t, 0))
    return None


def test_dynamic_control_flow_must_match_between_the_cores():
    x = torch.zeros(1, 1)
    simulator.run(_dynamic_loops, x, False, params=LNC2)
    with pytest.raises(NkiValidationError, match=r"run-time loop #0 \(core 0: fori_loop ran 2 "
                                                 r"iterations; core 1: fori_loop ran 3"):
        simulator.run(_dynamic_loops, x, True, params=LNC2)


def _zero_then_scatter(x, last_differs):
    """Both cores zero the whole output, then write into the same rows: the same values
    (router_topk's pattern at LNC=2: order-independent), or, with ``last_differs``, each its
    own value as its last write."""
    import nki.isa as nisa
    import nki.language as nl

    me = nl.program_id(0)
    out = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.shared_hbm, name="out")
    zeros = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(zeros, 0.0)
    nisa.dma_copy(out, zeros)
    vals = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(vals, 2.0 + me if last_differs else 2.0)
    nisa.dma_copy(out[2:5, :], vals[2:5, :])
    return out


def _intermediate_matches_last_differs(x):
    """Core 1 writes 2.0 twice; core 0 writes 1.0 once: the last writes differ even though
    core 1's second write changes nothing in the simulator's order."""
    import nki.isa as nisa
    import nki.language as nl

    me = nl.program_id(0)
    out = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.shared_hbm, name="out")
    t = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(t, 1.0 if me == 0 else 2.0)
    nisa.dma_copy(out, t)
    if me == 1:
        nisa.dma_copy(out, t)
    return out


def test_only_each_core_s_last_write_decides_a_write_race():
    x = torch.zeros(1, 1)
    out = simulator.run(_zero_then_scatter, x, False, params=LNC2).outputs
    want = torch.zeros(8, 16)
    want[2:5] = 2.0
    assert torch.equal(out, want)
    with pytest.raises(RaceError, match=r"out \(8, 16\) float32, bytes 128\.\.319: both cores write different"):
        simulator.run(_zero_then_scatter, x, True, params=LNC2)
    with pytest.raises(RaceError, match=r"out \(8, 16\) float32, bytes 0\.\.511: both cores write different"):
        simulator.run(_intermediate_matches_last_differs, x, params=LNC2)

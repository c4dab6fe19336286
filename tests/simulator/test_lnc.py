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


def test_the_bracket_takes_only_degree_1_or_2():
    # beta 2: "kernel[1] or kernel[2]"; anything else is refused where the bracket is written
    nki = simulator.nki_modules()["nki"]
    k = nki.jit(_degree)
    for bad in (0, 3, 4):
        with pytest.raises(NkiValidationError, match=rf"kernel\[{bad}\]: the logical-core degree must be 1 or 2"):
            k[bad]
    with pytest.raises(NkiValidationError, match=r"kernel\[\(1, 2\)\]: beta-2 grids carry only the logical-core"):
        k[1, 2]
    assert k[(2,)].grid == 2


def test_a_blank_neuron_logical_nc_config_is_unset(monkeypatch):
    x = torch.zeros(1, 1)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "  ")
    with simulator.activated("trn2") as nki:
        assert nki.simulate(_degree)(x).tolist() == [[1.0, 1.0]]            # the default, LNC=1
        assert nki.simulate(nki.jit(_degree)[2])(x).tolist() == [[2.0, 2.0]]  # the bracket


def _scale_my_row(out, x):
    """A jitted helper: core i copies row i of x, times i + 1, into row i of out."""
    import nki.isa as nisa
    import nki.language as nl

    me = nl.program_id(0)
    t = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(t, x[me:me + 1])
    nisa.tensor_scalar(t, t, nl.multiply, float(me + 1))
    nisa.dma_copy(out[me:me + 1], t)


def test_a_jitted_kernel_called_from_a_kernel_runs_inline_on_the_calling_core():
    # NKI 0.7 inlines a nested jitted kernel (kernel_rules.py): it is the calling core's
    # code, in the same run and trace, not a launch of its own
    nki = simulator.nki_modules()["nki"]
    helper = nki.jit(_scale_my_row)

    def kernel(x):
        import nki.language as nl

        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        helper(out, x)
        return out

    x = torch.randn(2, 8)
    r = simulator.run(kernel, x, params=LNC2)
    assert torch.equal(r.outputs, x * torch.tensor([[1.0], [2.0]]))
    assert sorted(i.attrs["core"] for i in r.trace if i.op == "tensor_scalar") == [0, 1]


def _read_before_the_barrier(x, core1_reads_after):
    """Core 0 writes scratch before a barrier both cores pass; core 1 reads it before the
    barrier (a race: nothing orders the two) or after it (ordered)."""
    import nki.isa as nisa
    import nki.language as nl

    me = nl.program_id(0)
    scratch = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="scratch")
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    if me == 0:
        nisa.dma_copy(t, x)
        nisa.dma_copy(scratch, t)
    if me == 1 and not core1_reads_after:
        nisa.dma_copy(t, scratch)
    nisa.core_barrier(scratch, (0, 1))
    if me == 1:
        if core1_reads_after:
            nisa.dma_copy(t, scratch)
        nisa.dma_copy(out, t)
    return out


def test_accesses_before_the_same_barrier_are_not_ordered():
    x = torch.randn(4, 8)
    assert torch.equal(simulator.run(_read_before_the_barrier, x, True, params=LNC2).outputs, x)
    with pytest.raises(RaceError, match=r"scratch \(4, 8\) float32, bytes 0\.\.127: core 1 reads "
                                        r"what core 0 writes"):
        simulator.run(_read_before_the_barrier, x, False, params=LNC2)


def _uneven_memory(x):
    """Core 1 holds a larger SBUF tile and more PSUM than core 0."""
    import nki.isa as nisa
    import nki.language as nl

    me = nl.program_id(0)
    t = nl.ndarray((128, 1024 * (1 + 2 * me)), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(t, 0.0)
    banks = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(1 + 2 * me)]
    for value in (0.0, 1.0):  # all of core 1's banks are live at once
        for p in banks:
            nisa.memset(p, value)
    return None


def test_the_run_s_peaks_are_the_largest_of_the_cores():
    r = simulator.run(_uneven_memory, torch.zeros(1, 1), params=LNC2)
    assert r.core_peak_sbuf_bytes_per_partition == (4 * 1024, 3 * 4 * 1024)
    assert r.peak_sbuf_bytes_per_partition == 3 * 4 * 1024
    assert r.core_peak_psum_banks == (1, 3) and r.peak_psum_banks == 3


def test_an_error_names_the_core_that_raised_it():
    def kernel(x, bad_core):
        import nki.language as nl

        if nl.program_id(0) == bad_core:
            nl.load(x)  # 256 partitions: refused
        return None

    x = torch.randn(256, 4)
    for core in (0, 1):
        with pytest.raises(NkiValidationError, match="partition dim 256") as info:
            simulator.run(kernel, x, core, params=LNC2)
        assert f"(raised by core {core} of the LNC=2 launch)" in info.value.__notes__
    with pytest.raises(NkiValidationError) as info:
        simulator.run(kernel, x, 0)  # LNC=1: one core, nothing to name
    assert not getattr(info.value, "__notes__", None)


def _outputs_per_core(x, case):
    import nki.isa as nisa
    import nki.language as nl

    me = nl.program_id(0)
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(t, x)
    nisa.dma_copy(a, t)
    nisa.dma_copy(b, t)
    if case == "same" or me == 0:
        return a, b
    if case == "fewer":
        return (a,)
    return a, 2.0  # "scalar": a number where core 0 returns a tensor


def test_the_cores_must_return_the_same_outputs():
    x = torch.randn(4, 8)
    a, b = simulator.run(_outputs_per_core, x, "same", params=LNC2).outputs
    assert torch.equal(a, x) and torch.equal(b, x)
    for case in ("fewer", "scalar"):
        with pytest.raises(NkiValidationError, match="core 1 returns different outputs from core 0"):
            simulator.run(_outputs_per_core, x, case, params=LNC2)


def _scatter_while_the_other_reads(table, rows, src):
    """Core 0 scatters src's rows into the shared input ``table`` through a run-time access
    pattern, skipping rows outside it (oob_mode.skip); core 1 reads the whole table."""
    import nki.isa as nisa
    import nki.language as nl

    P, F = src.shape
    out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.sbuf)
    if nl.program_id(0) == 0:
        idx = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=rows)
        s = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=src)
        nisa.dma_copy(dst=table.ap([[F, P], [1, F]], vector_offset=idx, indirect_dim=0), src=s,
                      oob_mode=nisa.oob_mode.skip)
    else:
        nisa.dma_copy(t, table)
        nisa.dma_copy(out, t)
    return out


def test_a_read_races_with_the_rows_a_skipping_scatter_writes():
    R, F = 8, 4
    picked = torch.randperm(R)[:2]
    rows = torch.tensor([[int(picked[0])], [R + 5], [int(picked[1])]], dtype=torch.int32)  # row 1: skipped
    lo, hi = int(picked.min()) * F * 4, (int(picked.max()) + 1) * F * 4 - 1
    with pytest.raises(RaceError, match=rf"table \(8, 4\) float32, bytes {lo}\.\.{hi}: core 1 reads "
                                        r"what core 0 writes"):
        simulator.run(_scatter_while_the_other_reads, torch.randn(R, F), rows, torch.randn(3, F),
                      params=LNC2)


def _rewrite_while_the_other_reads(x):
    """Core 0 stores the shared input x's own values back into it; core 1 reads x."""
    import nki.isa as nisa
    import nki.language as nl

    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(t, x)
    if nl.program_id(0) == 0:
        nisa.dma_copy(x, t)
    else:
        nisa.dma_copy(out, t)
    return out


def test_a_write_that_changes_nothing_does_not_race_with_a_read():
    # races.py: a write and a read race "when the write changes those bytes"
    x = torch.randn(4, 8)
    keep = x.clone()
    out = simulator.run(_rewrite_while_the_other_reads, x, params=LNC2).outputs
    assert torch.equal(out, keep) and torch.equal(x, keep)


def _after_the_exchange(x):
    """Both cores exchange a flag, then core 0 writes scratch while core 1 reads it: the
    sendrecv orders what came before it, not what both cores do after it."""
    import nki.isa as nisa
    import nki.language as nl

    me = nl.program_id(0)
    scratch = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="scratch")
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(t, x)
    flag = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(flag, me)
    got = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.sendrecv(src=flag, dst=got, send_to_rank=1 - me, recv_from_rank=1 - me, pipe_id=0)
    if me == 0:
        nisa.dma_copy(scratch, t)
    else:
        nisa.dma_copy(t, scratch)
        nisa.dma_copy(out, t)
    return out


def test_accesses_after_the_same_sendrecv_are_not_ordered():
    x = torch.randn(4, 4)
    with pytest.raises(RaceError, match=r"scratch \(4, 4\) float32, bytes 0\.\.63: core 1 reads "
                                        r"what core 0 writes"):
        simulator.run(_after_the_exchange, x, params=LNC2)


def _overlapping_rows(x, lo, hi):
    """Core 0 writes rows 0..3 of scratch; core 1 reads rows lo..hi-1 (no synchronisation)."""
    import nki.isa as nisa
    import nki.language as nl

    scratch = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="scratch")
    out = nl.ndarray((hi - lo, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    if nl.program_id(0) == 0:
        t = nl.ndarray((4, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(t, x[0:4])
        nisa.dma_copy(scratch[0:4], t)
    else:
        t = nl.ndarray((hi - lo, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(t, scratch[lo:hi])
        nisa.dma_copy(out, t)
    return out


def test_a_read_that_starts_inside_the_other_core_s_write_races():
    x = torch.randn(8, 16)
    row = 16 * 4
    with pytest.raises(RaceError, match=rf"scratch \(8, 16\) float32, bytes {2 * row}\.\.{4 * row - 1}: "
                                        r"core 1 reads what core 0 writes"):
        simulator.run(_overlapping_rows, x, 2, 6, params=LNC2)
    simulator.run(_overlapping_rows, x, 4, 8, params=LNC2)  # disjoint rows: no race


def _two_races(x):
    """Core 0 writes ``first`` then ``second``; core 1 then reads both, unsynchronised."""
    import nki.isa as nisa
    import nki.language as nl

    first = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="first")
    second = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="second")
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    if nl.program_id(0) == 0:
        nisa.dma_copy(t, x)
        nisa.dma_copy(first, t)
        nisa.dma_copy(second, t)
    else:
        nisa.dma_copy(t, first)
        nisa.dma_copy(t, second)
    return None


def test_the_earliest_race_is_reported():
    with pytest.raises(RaceError, match=r"tensor first .*core 0 writes at instruction #1 .*"
                                        r"core 1 reads at instruction #3"):
        simulator.run(_two_races, torch.randn(4, 8), params=LNC2)


def _scatter_a_row_while_the_other_reads_its_last_element(table, row, idx_in):
    """Core 0 writes row ``row`` of table through a run-time row offset; core 1 reads the
    row's last element."""
    import nki.isa as nisa
    import nki.language as nl

    F = table.shape[1]
    if nl.program_id(0) == 0:
        idx = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=idx_in)
        s = nl.ndarray((1, F), dtype=table.dtype, buffer=nl.sbuf)
        nisa.memset(s, 7.0)
        nisa.dma_copy(dst=table.ap([[F, 1], [1, F]], vector_offset=idx, indirect_dim=0), src=s)
    else:
        t = nl.ndarray((1, 1), dtype=table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(t, table[row:row + 1, F - 1:F])
    return None


def test_a_read_of_the_last_element_a_run_time_write_touches_races():
    R, F = 6, 8
    row = int(torch.randint(0, R, ()))
    at = (row * F + F - 1) * 4
    with pytest.raises(RaceError, match=rf"table \(6, 8\) float32, bytes {at}\.\.{at + 3}: core 1 reads"):
        simulator.run(_scatter_a_row_while_the_other_reads_its_last_element, torch.randn(R, F), row,
                      torch.tensor([[row]], dtype=torch.int32), params=LNC2)


def _reread_own_matching_columns(x):
    """Core 0 stores x into out. Core 1 stores x with columns 4..7 changed, then x's columns
    4..7 again (so each core's last write leaves x), then reads columns 0..3 back: those
    bytes core 1's own first store left as core 0's, so the read sees x in any order."""
    import nki.isa as nisa
    import nki.language as nl

    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="out")
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(t, x)
    if nl.program_id(0) == 0:
        nisa.dma_copy(out, t)
    else:
        u = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(u, t)
        nisa.tensor_scalar(u[:, 4:8], t[:, 4:8], nl.add, 1.0)
        nisa.dma_copy(out, u)
        nisa.dma_copy(out[:, 4:8], t[:, 4:8])
        v = nl.ndarray((x.shape[0], 4), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(v, out[:, 0:4])
    return out


def test_a_read_of_bytes_the_reader_itself_rewrote_unchanged_is_no_race():
    x = torch.randn(4, 8)
    assert torch.equal(simulator.run(_reread_own_matching_columns, x, params=LNC2).outputs, x)


def _rewritten_overlap(x):
    """Core 0 stores x's rows 0..3; core 1 first zeroes rows 2..5, then stores x's rows 2..5
    over them: on rows 2..3 both cores' last writes leave x, so the order does not matter."""
    import nki.isa as nisa
    import nki.language as nl

    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="out")
    t = nl.ndarray((4, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    if nl.program_id(0) == 0:
        nisa.dma_copy(t, x[0:4])
        nisa.dma_copy(out[0:4], t)
    else:
        z = nl.ndarray((4, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(z, 0.0)
        nisa.dma_copy(out[2:6], z)
        nisa.dma_copy(t, x[2:6])
        nisa.dma_copy(out[2:6], t)
        nisa.dma_copy(out[6:8], z[0:2])
    return out


def test_a_write_its_own_core_writes_over_is_not_compared():
    x = torch.randn(8, 16)
    want = x.clone()
    want[6:8] = 0.0
    assert torch.equal(simulator.run(_rewritten_overlap, x, params=LNC2).outputs, want)


def test_a_write_race_names_the_later_write_first():
    # races.py: "the later one decides whether the order matters"; _writers' core 1 writes
    # after core 0 in the simulator's order
    with pytest.raises(RaceError, match=r"\(core 1 writes at instruction #3 \(dma_copy, core 1\), "
                                        r"core 0 writes at instruction #1 \(dma_copy, core 0\)\)"):
        simulator.run(_writers, torch.zeros(1, 1), True, False, params=LNC2)


def _random_bits(x):
    import nki.isa as nisa
    import nki.language as nl

    bits = nl.ndarray((4, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rng(bits)
    out = nl.ndarray((2, 4, 8), dtype=nl.uint32, buffer=nl.shared_hbm)
    nl.store(out[nl.program_id(0)], bits)
    if nl.num_programs() == 1:
        nl.store(out[1], bits)
    return out


def test_each_core_has_its_own_random_state_and_core_0_starts_from_the_seed():
    x = torch.zeros(1, 1)
    for seed in (0, int(torch.randint(1, 2**31, ()))):
        one = simulator.run(_random_bits, x, params=SimParams(seed=seed)).outputs
        two = simulator.run(_random_bits, x, params=SimParams(seed=seed, logical_cores=2)).outputs
        assert torch.equal(two[0], one[0]) and not torch.equal(two[1], two[0])


def test_both_cores_must_allocate_the_same_shared_tensors():
    def kernel(x):
        import nki.language as nl

        dt = nl.float32 if nl.program_id(0) == 0 else nl.bfloat16
        nl.ndarray((4, 4), dtype=dt, buffer=nl.shared_hbm)
        return None

    with pytest.raises(NkiValidationError, match=r"core 1's shared_hbm tensor #0 \(4, 4\) bfloat16 differs "
                                                 r"from core 0's \(4, 4\) float32"):
        simulator.run(kernel, torch.zeros(1, 1), params=LNC2)


def _step0_store(x, per_core):
    """Both cores store x into out, then store through a step-0 view of out (its columns all
    land on column 0, the last one wins): the same values on both cores, or (``per_core``)
    values scaled by the core's number."""
    import nki.isa as nisa
    import nki.language as nl

    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="out")
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(t, x)
    nisa.dma_copy(out, t)
    if per_core:
        nisa.tensor_scalar(t, t, nl.multiply, float(nl.program_id(0) + 2))
    R, C = x.shape
    nisa.dma_copy(out.ap([[C, R], [0, C]]), t)
    return out


def test_a_step0_store_of_the_same_values_on_both_cores_is_no_race():
    # races.py: two cores writing the same bits give the same memory in either order; the
    # step-0 destination (the last write to each repeated address wins) is no exception
    x = torch.randn(2, 4)
    want = x.clone()
    want[:, 0] = x[:, -1]
    assert torch.equal(simulator.run(_step0_store, x, False).outputs, want)  # LNC=1
    assert torch.equal(simulator.run(_step0_store, x, False, params=LNC2).outputs, want)
    with pytest.raises(RaceError, match=r"out \(2, 4\) float32, bytes 0\.\.19: both cores write different"):
        simulator.run(_step0_store, x, True, params=LNC2)


def test_the_largest_seed_runs_at_lnc2():
    # SimParams takes any seed in [0, 2**64); core 1's random state must not overflow it
    x = torch.zeros(1, 1)
    top = 2**64 - 1
    one = simulator.run(_random_bits, x, params=SimParams(seed=top)).outputs
    two = simulator.run(_random_bits, x, params=SimParams(seed=top, logical_cores=2)).outputs
    assert torch.equal(two[0], one[0]) and not torch.equal(two[1], two[0])

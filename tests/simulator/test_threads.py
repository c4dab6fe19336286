"""Several threads simulating at once: each run has its own context (trace, memory,
registers, options), ``activated()`` is shared safely, torch's thread setting comes back."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from nki_kernels import simulator

THREADS = 4
ROUNDS = 6


def _scale_kernel(x, scale):
    """out[:, :C] = x * scale + 1 per 32-row tile, out[:, C] = the SBUF bytes per partition
    of the target active INSIDE the run (so a run seeing another thread's target shows)."""
    import nki.isa as nisa
    import nki.language as nl

    R, C = x.shape
    out = nl.ndarray((R, C + 1), dtype=x.dtype, buffer=nl.shared_hbm)
    for r in range(0, R, 32):
        t = nl.load(x[r:r + 32])
        y = nl.ndarray((32, C + 1), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(y[:, :C], t, nl.multiply, scale, op1=nl.add, operand1=1.0)
        nisa.memset(y[:, C:], float(nl.tile_size.total_available_sbuf_size))
        nl.store(out[r:r + 32], y)
    return out


def _reference(x, scale, target):
    sbuf = simulator.SimParams(target=target).target.sbuf_bytes_per_partition
    return torch.cat([x * scale + 1.0, torch.full((x.shape[0], 1), float(sbuf))], dim=1)


def _trace_shape(trace):
    return [(i.op, i.engine, tuple(o.shape for o in i.reads), tuple(o.shape for o in i.writes),
             tuple(sorted((k, str(v)) for k, v in i.attrs.items()))) for i in trace]


def _run_in_threads(job):
    barrier = threading.Barrier(THREADS)

    def worker(w):
        barrier.wait()  # start together, so the runs really overlap
        return [job(w, k) for k in range(ROUNDS)]

    with ThreadPoolExecutor(THREADS) as pool:
        return [f.result() for f in [pool.submit(worker, w) for w in range(THREADS)]]


def test_runs_in_threads_have_separate_results_traces_and_targets():
    targets = ("trn1", "trn2", "trn3", "trn2")
    inputs = {w: torch.randn(96, 40) for w in range(THREADS)}
    # single-threaded reference traces (a trace depends on the target, not on the values)
    expected = {t: _trace_shape(simulator.run(_scale_kernel, inputs[0], 2.0, target=t).trace)
                for t in set(targets)}
    threads_before = torch.get_num_threads()

    def job(w, k):
        scale = 1.0 + w + 0.25 * k
        r = simulator.run(_scale_kernel, inputs[w], scale, target=targets[w])
        assert r.target == targets[w]
        torch.testing.assert_close(r.outputs, _reference(inputs[w], scale, targets[w]),
                                   rtol=1e-6, atol=1e-6)
        assert _trace_shape(r.trace) == expected[targets[w]]
        assert [i.index for i in r.trace] == list(range(len(r.trace)))
        return r

    results = [r for rs in _run_in_threads(job) for r in rs]
    assert len(results) == THREADS * ROUNDS
    # every run allocated its own tensors: no allocation id is shared between runs
    ids = [{o.alloc_id for i in r.trace for o in i.reads + i.writes} for r in results]
    assert sum(len(s) for s in ids) == len(set().union(*ids))
    assert torch.get_num_threads() == threads_before


def test_activated_and_simulate_in_threads_restore_sys_modules():
    before = {name: sys.modules.get(name) for name in ("nki", "nki.language", "nki.isa")}
    x = torch.randn(64, 8)

    def job(w, k):
        with simulator.activated(target="trn3" if w % 2 else "trn2") as nki:
            import nki.language as nl

            assert nki.__simulator__ and nl is simulator.nki_modules()["nki.language"]
            # the options of THIS thread's activated() block apply to its nki.simulate runs
            out = nki.simulate(_scale_kernel)(x, float(w))
            target = "trn3" if w % 2 else "trn2"
            torch.testing.assert_close(out, _reference(x, float(w), target), rtol=1e-6, atol=1e-6)
            # nl calls outside a run record into this thread's activated() context only
            n = len(simulator.current_trace())
            nl.zeros((4, 4), dtype=nl.float32)
            assert len(simulator.current_trace()) == n + 1
        return True

    assert all(all(rs) for rs in _run_in_threads(job))
    assert {name: sys.modules.get(name) for name in before} == before


def test_an_error_in_one_thread_leaves_the_others_running():
    x = torch.randn(32, 8)

    def too_many_partitions(x):
        import nki.language as nl

        return nl.load(x)  # 256 partitions: raises inside the run

    def job(w, k):
        if w == 0:
            with pytest.raises(simulator.NkiValidationError, match="partition dim 256"):
                simulator.run(too_many_partitions, torch.randn(256, 8))
            return None
        return simulator.run(_scale_kernel, x, 3.0).outputs

    for outs in _run_in_threads(job)[1:]:
        for out in outs:
            torch.testing.assert_close(out, _reference(x, 3.0, "trn2"), rtol=1e-6, atol=1e-6)


def test_the_last_run_to_end_restores_the_setting_the_first_run_found():
    # run A starts (its thread, and the process default new threads start from, drop to one
    # torch thread); run B starts in a thread made meanwhile, so B finds 1; A ends first,
    # B last: B must restore what A found, not the 1 it found itself
    before = torch.get_num_threads()
    found = before + 2
    torch.set_num_threads(found)
    a_running, b_running, a_done = threading.Event(), threading.Event(), threading.Event()
    after = {}

    def kernel(x, started, wait_for):
        import nki.language as nl

        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        started.set()
        assert wait_for.wait(30)
        return out

    def run_a():
        x = torch.randn(4, 4)
        assert torch.equal(simulator.run(kernel, x, a_running, b_running).outputs, x)
        a_done.set()

    def run_b():
        assert a_running.wait(30)
        x = torch.randn(4, 4)
        assert torch.equal(simulator.run(kernel, x, b_running, a_done).outputs, x)
        after["b"] = torch.get_num_threads()

    try:
        threads = [threading.Thread(target=run_a)]
        threads[0].start()
        assert a_running.wait(30)
        threads.append(threading.Thread(target=run_b))
        threads[1].start()
        for t in threads:
            t.join(60)
        assert after == {"b": found}
    finally:
        torch.set_num_threads(before)


def test_contexts_exited_out_of_order_are_refused():
    # in a thread of its own: the refused exit leaves that thread's context stack behind
    seen = []

    def body():
        outer, inner = simulator.activated("trn2"), simulator.activated("trn3")
        outer.__enter__()
        inner.__enter__()
        try:
            outer.__exit__(None, None, None)
        except RuntimeError as err:
            seen.append(str(err))
        inner.__exit__(None, None, None)

    before = {name: sys.modules.get(name) for name in ("nki", "nki.language", "nki.isa")}
    t = threading.Thread(target=body)
    t.start()
    t.join(30)
    assert seen == ["simulator context stack corrupted (contexts exited out of order in one thread)"]
    assert {name: sys.modules.get(name) for name in before} == before

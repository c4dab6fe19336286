"""Schedule rules beyond one instruction: finite buffering, TensorE's result latency,
in-order engines, the two cores of an LNC=2 launch, and the error bars.

Expected numbers come from the rules in docs/cost-model.md and the Target fields."""

from __future__ import annotations

import dataclasses
import importlib
import json

import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator.cost import dma_cost, estimate_trace, time_range, variant
from nki_kernels.simulator.cost.uncertainty import end_latencies
from nki_kernels.simulator.cost.model import CostModelError
from nki_kernels.simulator.cost.schedule import conflicts, dependencies, rotation_edges
from nki_kernels.simulator.hardware import TARGETS, VECTOR_ISSUE_CYCLES
from nki_kernels.simulator.trace import AllocationSite
from tests.cost._build import TraceBuilder, hbm, new_alloc, psum, sbuf

TRN2 = TARGETS["trn2"]
# the module (the package's ``schedule`` attribute is the function of that name)
schedule_module = importlib.import_module("nki_kernels.simulator.cost.schedule")
# TensorE at its steady rate, for the tests of one TensorE rule at a time (the throttle a
# burst starts under: tests/cost/test_tensor_throttle.py)
TRN2_STEADY = dataclasses.replace(TRN2, tensor_throttle_start_rate=None)
US = 1e6


def _stream(chunks: int, cols: int = 2048):
    """Per chunk: load a fresh tile (one allocation site), ScalarE on it, store the result
    (another site). Returns (trace, allocations, tile ids)."""
    b = TraceBuilder()
    allocs, tiles = [], []
    x, out = new_alloc(), new_alloc()
    for i in range(chunks):
        tile, res = new_alloc(), new_alloc()
        tiles.append(tile)
        allocs += [AllocationSite(tile, "sbuf", (("k.py", 10),), None),
                   AllocationSite(res, "sbuf", (("k.py", 12),), None)]
        off = i * 128 * cols
        b.dma(sbuf("dst", tile, (128, cols)), hbm("src", x, (128, cols), offset=off))
        b.activation(sbuf("dst", res, (128, cols)), sbuf("data", tile, (128, cols)))
        b.dma(hbm("dst", out, (128, cols), offset=off), sbuf("src", res, (128, cols)))
    return b.trace, allocs, tiles


# ------------------------------------------------------------------ beta-1 sequential loops

def _sequential_kernel():
    """Per iteration of nl.sequential_range(4) (inside an ordinary outer loop of 2): load a
    [128, 2048] tile, exp on ScalarE, add 1 on VectorE, store. Returns (kernel, x)."""
    with simulator.activated():
        import nki
        import nki.isa as nisa
        import nki.language as nl

        @nki.jit
        def kernel(x):
            out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
            for j in range(2):
                for i in nl.sequential_range(4):
                    rows = slice((4 * j + i) * 128, (4 * j + i + 1) * 128)
                    t = nl.ndarray((128, 2048), dtype=x.dtype, buffer=nl.sbuf)
                    nisa.dma_copy(dst=t, src=x[rows, :])
                    e = nl.ndarray((128, 2048), dtype=x.dtype, buffer=nl.sbuf)
                    nisa.activation(dst=e, op=nl.exp, data=t)
                    r = nl.ndarray((128, 2048), dtype=x.dtype, buffer=nl.sbuf)
                    nisa.tensor_scalar(dst=r, data=e, op0=nl.add, operand0=1.0, engine=nisa.engine.vector)
                    nisa.dma_copy(dst=out[rows, :], src=r)
            return out

    return kernel, torch.randn(1024, 2048)


def test_the_simulator_marks_each_sequential_range_iteration_and_computes_the_same():
    kernel, x = _sequential_kernel()
    res = simulator.run(kernel, x)
    torch.testing.assert_close(res.outputs, torch.exp(x.double()).float() + 1, rtol=1e-5, atol=1e-5)
    marks = [i.attrs.get("sequential") for i in res.trace]
    assert all(m is not None and len(m) == 1 for m in marks)
    loops = sorted({m[0][0] for m in marks})
    assert len(loops) == 2                                    # one loop per pass of the outer range
    per_iteration = [m[0] for m in marks]
    assert per_iteration == [(loop, k) for loop in loops for k in range(4) for _ in range(4)]
    with simulator.activated():
        import nki.language as nl
        assert len(nl.sequential_range(1, 7, 2)) == 3 and list(nl.sequential_range(1, 7, 2)) == [1, 3, 5]


def test_beta1_sequential_loops_hold_each_iteration_s_loads_until_the_last_one_s_compute():
    kernel, x = _sequential_kernel()
    res = simulator.run(kernel, x)
    trace = res.trace
    beta1 = dataclasses.replace(TRN2, beta1_sequential_loops=True)
    loads = [i.index for i in trace if i.op == "dma_copy" and i.reads[0].buffer == "hbm"]
    stores = [i.index for i in trace if i.op == "dma_copy" and i.writes[0].buffer == "hbm"]
    compute = [i.index for i in trace if i.engine != "dma"]
    plain = dependencies(trace, TRN2, res.allocations)
    held = dependencies(trace, beta1, res.allocations)
    for it, load in enumerate(loads):
        before = set(compute[2 * (it - 1): 2 * it]) if it % 4 else set()   # a new loop starts afresh
        assert before <= set(held[load]) and not before & set(plain[load])
        assert not set(stores) & (set(held[load]) - set(plain[load]))       # stores still overlap
    for i in compute + stores:
        assert held[i] == plain[i]
    est_plain = estimate_trace(trace, TRN2, allocations=res.allocations)
    est_held = estimate_trace(trace, beta1, allocations=res.allocations)
    s = est_held.schedule
    for it in range(1, 4):
        assert s.start[loads[it]] >= s.finish[compute[2 * it - 1]] + TRN2.dma_latency_s - 1e-12
    assert est_held.latency_us > est_plain.latency_us
    # NKI 0.7 code (the default Target) is untouched by the marks
    assert not TRN2.beta1_sequential_loops and not TARGETS["trn1"].beta1_sequential_loops


def _prefetching_kernel():
    """nl.sequential_range(4) double-buffered by hand: x's rows for iteration i + 1 are DMAed
    into the other buffer at iteration i (the first before the loop), y's rows are loaded in
    the iteration that reads them; per iteration exp(x rows) + y rows, stored."""
    with simulator.activated():
        import nki
        import nki.isa as nisa
        import nki.language as nl

        @nki.jit
        def kernel(x, y):
            out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
            bufs = [nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf) for _ in range(2)]
            nisa.dma_copy(dst=bufs[0], src=x[0:128, :])
            for i in nl.sequential_range(4):
                if i + 1 < 4:
                    nisa.dma_copy(dst=bufs[(i + 1) % 2], src=x[(i + 1) * 128:(i + 2) * 128, :])
                w = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=w, src=y[i * 128:(i + 1) * 128, :])
                e = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
                nisa.activation(dst=e, op=nl.exp, data=bufs[i % 2])
                r = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=r, data1=e, data2=w, op=nl.add, engine=nisa.engine.vector)
                nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=r)
            return out

    return kernel, torch.randn(512, 512), torch.randn(512, 512)


def test_beta1_sequential_loops_do_not_hold_the_kernel_s_own_prefetch():
    kernel, x, y = _prefetching_kernel()
    res = simulator.run(kernel, x, y)
    torch.testing.assert_close(res.outputs, (torch.exp(x.double()) + y.double()).float(), rtol=1e-5, atol=1e-5)
    trace = res.trace
    beta1 = dataclasses.replace(TRN2, beta1_sequential_loops=True)
    plain = dependencies(trace, TRN2, res.allocations)
    held = dependencies(trace, beta1, res.allocations)
    loads = [i for i in trace if i.op == "dma_copy" and i.reads[0].buffer == "hbm"]
    x_id = loads[0].reads[0].alloc_id                  # the first load, before the loop, reads x
    x_loads = [i.index for i in loads if i.reads[0].alloc_id == x_id]
    y_loads = [i.index for i in loads if i.reads[0].alloc_id != x_id]
    compute = [i.index for i in trace if i.engine != "dma"]
    assert len(x_loads) == 4 and len(y_loads) == 4 and len(compute) == 8
    # x's rows for iteration i + 1, loaded at iteration i: read in a later iteration, not held
    for load in x_loads:
        assert held[load] == plain[load]
    # y's rows, read in their own iteration: held until the previous iteration's compute is done
    for it, load in enumerate(y_loads):
        before = set(compute[2 * (it - 1): 2 * it]) if it else set()
        assert before <= set(held[load]) and not before & set(plain[load])


# ----------------------------------------------------------------------------- buffers

def test_tiles_of_one_site_rotate_through_depth_buffers():
    trace, allocs, _ = _stream(8)
    est = estimate_trace(trace, TRN2, allocations=allocs)
    s = est.schedule
    depth = TRN2.buffer_rotation_depth
    for k in range(depth, 8):
        load, act_old, store_old = 3 * k, 3 * (k - depth) + 1, 3 * (k - depth) + 2
        # the load may only overwrite tile k-depth's buffer once its reader is done, and
        # the result tile's buffer once its store is done (the store waits on the result)
        assert s.start[load] >= s.finish[act_old] + TRN2.dma_latency_s - 1e-12
        assert s.start[3 * k + 1] >= s.finish[store_old] - 1e-12


def test_a_rotated_tile_s_first_write_waits_for_every_access_of_the_old_occupant():
    # each tile is loaded, then read on ScalarE and on VectorE; with two buffers, tile 2's
    # load takes tile 0's buffer and must wait for both reads, whichever finishes last (the
    # ScalarE read, issued first, is the longer here), not only for the last-issued one
    b = TraceBuilder()
    allocs, at, x = [], {}, new_alloc()
    for k in range(3):
        t = new_alloc()
        allocs.append(AllocationSite(t, "sbuf", (("k.py", 20),), None, nbytes=2048 * 4))
        at[k, "load"] = b.dma(sbuf("dst", t, (128, 2048), "float32"),
                              hbm("src", x, (128, 2048), "float32", offset=k * 128 * 2048)).index
        at[k, "scalar"] = b.activation(sbuf("dst", new_alloc(), (128, 2048), "float32"),
                                       sbuf("data", t, (128, 2048), "float32")).index
        at[k, "vector"] = b.tensor_copy(sbuf("dst", new_alloc(), (128, 8), "float32"),
                                        sbuf("src", t, (128, 8), "float32")).index
    edges = set(rotation_edges(b.trace, allocs, 2))
    assert {(at[0, "scalar"], at[2, "load"]), (at[0, "vector"], at[2, "load"])} <= edges
    sched = estimate_trace(b.trace, TRN2, allocations=allocs).schedule
    assert sched.start[at[2, "load"]] >= max(sched.finish[at[0, "scalar"]], sched.finish[at[0, "vector"]]) - 1e-12


def _scalar_busy_first():
    """A trace that keeps ScalarE busy ~45 us first (so the tiles' reads, on ScalarE, run
    late and an unordered write would land before them): (builder, allocations list, index
    dict, an HBM source, 1024 columns)."""
    b = TraceBuilder()
    for _ in range(6):
        b.activation(sbuf("dst", new_alloc(), (128, 8192)), sbuf("data", new_alloc(), (128, 8192)))
    return b, [], {}, new_alloc(), 1024


def test_a_write_after_the_first_read_also_waits_for_the_buffer_s_old_occupant():
    # Tiles [128, 2C] of one site, each filled and read half by half: load A, read A, load
    # B, read B. Tile 2's load of half B touches nothing its read of A touched, so only the
    # rotation orders it after tile 0's read of half B (same physical bytes). ScalarE is
    # kept busy first, so tile 0's reads run late and an unordered load would land early.
    b, allocs, at, x, cols = _scalar_busy_first()
    for k in range(3):
        t = new_alloc()
        allocs.append(AllocationSite(t, "sbuf", (("k.py", 10),), None, nbytes=2 * cols * 2))
        for half in (0, 1):
            part = dict(offset=half * cols, strides=(2 * cols, 1))
            at[k, "load", half] = b.dma(sbuf("dst", t, (128, cols), **part),
                                        hbm("src", x, (128, cols), offset=(2 * k + half) * 128 * cols)).index
            at[k, "read", half] = b.activation(sbuf("dst", new_alloc(), (128, cols)),
                                               sbuf("data", t, (128, cols), **part)).index
    edges = set(rotation_edges(b.trace, allocs, 2))
    assert (at[0, "read", 1], at[2, "load", 1]) in edges
    assert (at[0, "read", 1], at[2, "read", 1]) not in edges     # reads follow their own tile's write
    # the later write waits for the old occupant's accesses to its own bytes only (the
    # accesses up to the first read wait for all of them: the buffer changes hands)
    assert (at[0, "read", 0], at[2, "load", 1]) not in edges
    assert (at[0, "read", 1], at[2, "load", 0]) in edges
    unsized = [dataclasses.replace(a, nbytes=None) for a in allocs]   # layouts unknown: every access
    assert (at[0, "read", 0], at[2, "load", 1]) in set(rotation_edges(b.trace, unsized, 2))
    s = estimate_trace(b.trace, TRN2, allocations=allocs).schedule
    assert s.start[at[2, "load", 1]] >= s.finish[at[0, "read", 1]] - 1e-12


def test_a_later_instruction_that_reads_and_writes_the_tile_also_waits_for_the_old_occupant():
    # [128, 3C] tiles of one site: load part 0, read it, load part 1, copy part 1 into part 2
    # (reads and writes the tile), read part 2. Tile 2's copy writes the bytes tile 0's
    # last read reads: it must wait for it, though it also reads its own tile.
    b, allocs, at, x, cols = _scalar_busy_first()

    def part(h):
        return dict(offset=h * cols, strides=(3 * cols, 1))

    for k in range(3):
        t = new_alloc()
        allocs.append(AllocationSite(t, "sbuf", (("k.py", 10),), None, nbytes=3 * cols * 2))
        at[k, "load0"] = b.dma(sbuf("dst", t, (128, cols), **part(0)), hbm("src", x, (128, cols))).index
        at[k, "read0"] = b.activation(sbuf("dst", new_alloc(), (128, cols)), sbuf("data", t, (128, cols), **part(0))).index
        at[k, "load1"] = b.dma(sbuf("dst", t, (128, cols), **part(1)), hbm("src", x, (128, cols))).index
        at[k, "copy"] = b.tensor_copy(sbuf("dst", t, (128, cols), **part(2)), sbuf("src", t, (128, cols), **part(1))).index
        at[k, "read2"] = b.activation(sbuf("dst", new_alloc(), (128, cols)), sbuf("data", t, (128, cols), **part(2))).index
    edges = set(rotation_edges(b.trace, allocs, 2))
    assert (at[0, "read2"], at[2, "copy"]) in edges
    assert (at[0, "read0"], at[2, "copy"]) not in edges      # other bytes
    s = estimate_trace(b.trace, TRN2, allocations=allocs).schedule
    assert s.start[at[2, "copy"]] >= s.finish[at[0, "read2"]] - 1e-12


def test_more_buffers_prefetch_further_and_unbounded_buffers_are_the_old_model():
    trace, allocs, _ = _stream(16)
    t = {d: estimate_trace(trace, dataclasses.replace(TRN2, buffer_rotation_depth=d), allocations=allocs).latency_us
         for d in (1, 2, 4, 64)}
    assert t[1] > t[2] >= t[4] >= t[64]
    assert t[64] == pytest.approx(estimate_trace(trace, TRN2).latency_us)   # no sites: unbounded


def test_tiles_the_program_keeps_alive_get_their_own_buffers():
    # all tiles loaded first, used afterwards: live at once, so no rotation edge is possible
    b = TraceBuilder()
    tiles = [new_alloc() for _ in range(6)]
    allocs = [AllocationSite(t, "sbuf", (("k.py", 3),), None) for t in tiles]
    for t in tiles:
        b.dma(sbuf("dst", t, (128, 512)), hbm("src", new_alloc(), (128, 512)))
    for t in tiles:
        b.activation(sbuf("dst", new_alloc(), (128, 512)), sbuf("data", t, (128, 512)))
    assert rotation_edges(b.trace, allocs, 2) == []


def _sets(iters: int, per_set: int = 3):
    """Per iteration, a set of ``per_set`` tiles from one site (awslabs/nki-autotune's
    ``allocate_buffers`` leaves): all loaded, then read in four rounds on ScalarE, every
    leaf in each (as a matmul block reads its K tiles once per output tile). Returns
    (trace, allocations, {(iteration, leaf): (load, last read) instruction indices})."""
    b = TraceBuilder()
    allocs, at, x = [], {}, new_alloc()
    for i in range(iters):
        leaves = [new_alloc() for _ in range(per_set)]
        allocs += [AllocationSite(t, "sbuf", (("k.py", 5),), None, nbytes=512 * 4) for t in leaves]
        loads = [b.dma(sbuf("dst", t, (128, 512)), hbm("src", x, (128, 512), offset=(i * per_set + j) * 128 * 512)).index
                 for j, t in enumerate(leaves)]
        for _ in range(4):
            for j, t in enumerate(leaves):
                at[i, j] = (loads[j], b.activation(sbuf("dst", new_alloc(), (128, 512)),
                                                   sbuf("data", t, (128, 512))).index)
    return b.trace, allocs, at


def test_a_site_that_fills_a_set_of_tiles_per_iteration_rotates_one_set_ahead():
    # sets of 3 tiles live together: at depth 2 the site has 3 + 3 buffers, so set 1 loads
    # while set 0 is read (one iteration's fill ahead, as one tile ahead for a loop's single
    # tile) and set 2 takes set 0's buffers. Until 2026-12-07 the site had 3 (as many as it
    # kept alive): each set's loads waited for the previous set's reads, no prefetch at all
    trace, allocs, at = _sets(4)
    edges = set(rotation_edges(trace, allocs, 2))
    assert not any((at[0, j][1], at[1, k][0]) in edges for j in range(3) for k in range(3))
    assert {(at[0, j][1], at[2, j][0]) for j in range(3)} <= edges
    assert {(at[1, j][1], at[3, j][0]) for j in range(3)} <= edges
    assert _depths(trace, allocs) == {5: 6}
    assert _depths(trace, allocs, depth=1) == {5: 3}
    assert _depths(trace, allocs, depth=3) == {5: 9}
    # depth 1 is the old rule's count here: every set waits for the one before
    assert {(at[0, j][1], at[1, j][0]) for j in range(3)} <= set(rotation_edges(trace, allocs, 1))
    t = {d: estimate_trace(trace, dataclasses.replace(TRN2, buffer_rotation_depth=d), allocations=allocs).latency_us
         for d in (1, 2)}
    assert t[2] < t[1]
    # the memory's limit: sets of 3 tiles of 40 % of a partition's bytes give up buffers one
    # at a time down to the set the program keeps alive (3 tiles, 120 %: the program's own
    # overflow, which the rule does not take from); at 25 % each, exactly 4 fit
    big = [dataclasses.replace(a, nbytes=int(0.4 * TRN2.sbuf_bytes_per_partition)) for a in allocs]
    assert _depths(trace, big) == {5: 3}
    mid = [dataclasses.replace(a, nbytes=TRN2.sbuf_bytes_per_partition // 4) for a in allocs]
    assert _depths(trace, mid) == {5: 4}


def test_a_pipeline_s_prologue_does_not_count_as_one_iteration_s_fill():
    # a stream that loads 2 tiles ahead (the first 2 in a prologue, then one per iteration):
    # it keeps 3 alive, fills 1 per iteration, so it has 3 + 1 buffers at depth 2; a load
    # waits for the tile 4 back, not 6 (2 x the 3 alive) nor 3 (the old rule: its live tiles)
    from nki_kernels.simulator.cost.schedule import buffer_families, filled_together, kept_alive
    b = TraceBuilder()
    loads, reads, x = [], [], new_alloc()
    tiles = [new_alloc() for _ in range(8)]
    allocs = [AllocationSite(t, "sbuf", (("k.py", 7),), None, nbytes=2048) for t in tiles]

    def load(k):
        loads.append(b.dma(sbuf("dst", tiles[k], (128, 512)), hbm("src", x, (128, 512), offset=k * 128 * 512)).index)

    load(0)
    load(1)
    for k in range(8):
        if k + 2 < 8:
            load(k + 2)
        reads.append(b.activation(sbuf("dst", new_alloc(), (128, 512)), sbuf("data", tiles[k], (128, 512))).index)
    access = buffer_families(b.trace, allocs)[0]
    assert (kept_alive(tiles, access), filled_together(tiles, access)) == (3, 1)
    assert _depths(b.trace, allocs) == {7: 4}
    edges = set(rotation_edges(b.trace, allocs, 2))
    assert (reads[0], loads[4]) in edges and (reads[1], loads[5]) in edges
    assert (reads[1], loads[4]) not in edges and (reads[2], loads[5]) not in edges


def test_sites_give_up_buffers_level_by_iterations_buffered_not_by_count():
    # a site of sets of 4 small tiles (4 + 4 buffers: two sets) beside a loop's single large
    # tile (1 + 1: two tiles), over the memory by two small tiles: both sites buffer two
    # iterations and only the large site's buffer covers the excess, so it gives that up and
    # the set site keeps its 8 (ranked by count, the set site gave up two)
    b = TraceBuilder()
    allocs, x = [], new_alloc()
    small = TRN2.sbuf_bytes_per_partition // 32
    large = TRN2.sbuf_bytes_per_partition * 3 // 8 + small
    for i in range(4):
        leaves = [new_alloc() for _ in range(4)]
        allocs += [AllocationSite(t, "sbuf", (("k.py", 20),), None, nbytes=small) for t in leaves]
        for t in leaves:
            b.dma(sbuf("dst", t, (128, 512)), hbm("src", x, (128, 512)))
        big = new_alloc()
        allocs.append(AllocationSite(big, "sbuf", (("k.py", 21),), None, nbytes=large))
        b.dma(sbuf("dst", big, (128, 512)), hbm("src", x, (128, 512)))
        for t in (*leaves, big):
            b.activation(sbuf("dst", new_alloc(), (128, 512)), sbuf("data", t, (128, 512)))
    # 8 x 1/32 + 2 x (3/8 + 1/32) = 1 + 1/16 of the bytes: over by two small tiles
    assert _depths(b.trace, allocs) == {20: 8, 21: 1}
    roomy = dataclasses.replace(TRN2, sbuf_bytes_per_partition=2 * TRN2.sbuf_bytes_per_partition)
    assert _depths(b.trace, allocs, target=roomy) == {20: 8, 21: 2}


def test_sites_and_cores_are_separate_families():
    trace, allocs, tiles = _stream(4)
    other_site = [dataclasses.replace(a, site=(("k.py", 99 + i),)) for i, a in enumerate(allocs)]
    assert rotation_edges(trace, other_site, 1) == []
    core_of = {t: k % 2 for k, t in enumerate(tiles)}   # alternate loads on cores 0 and 1
    other_core = [dataclasses.replace(a, core=core_of.get(a.alloc_id)) for a in allocs]
    assert len(rotation_edges(trace, other_core, 1)) < len(rotation_edges(trace, allocs, 1))


def test_a_depth_below_one_is_an_error():
    trace, allocs, _ = _stream(3)
    with pytest.raises(ValueError, match="buffer_rotation_depth=0"):
        rotation_edges(trace, allocs, 0)


def test_the_simulator_records_one_site_per_allocating_line():
    with simulator.activated():
        import nki
        import nki.isa as nisa
        import nki.language as nl

        @nki.jit
        def kernel(x):
            out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
            for i in range(3):
                t = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.sbuf)      # site A
                nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
                u = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.sbuf)      # site B
                nisa.activation(dst=u, op=nl.exp, data=t)
                nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=u)
            return out

    res = simulator.run(kernel, torch.rand(384, 64))
    assert len(res.allocations) == 6 and all(a.buffer == "sbuf" for a in res.allocations)
    sites = [a.site for a in res.allocations]
    assert sites[0] == sites[2] == sites[4] and sites[1] == sites[3] == sites[5] and sites[0] != sites[1]
    assert any(f.endswith("test_schedule_rules.py") for f, _ in sites[0])
    est = simulator.estimate(kernel)(torch.rand(384, 64))
    assert est.allocations is not None and len(est.allocations) == 6


def _placed_loop(addresses):
    """A kernel whose loop places tile i at SBUF byte addresses[i] (one allocation site):
    load x[i] into it, exp on ScalarE into an unplaced tile, store. Returns the SimResult."""
    with simulator.activated():
        import nki
        import nki.isa as nisa
        import nki.language as nl

        @nki.jit
        def kernel(x):
            out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
            for i in range(len(addresses)):
                t = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.sbuf, address=(0, addresses[i]))
                nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
                u = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.sbuf)
                nisa.activation(dst=u, op=nl.exp, data=t)
                nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=u)
            return out

        return simulator.run(kernel, torch.rand(128 * len(addresses), 64))


def _loads_and_readers(res):
    loads = [i.index for i in res.trace if i.op == "dma_copy" and i.writes[0].buffer == "sbuf"]
    readers = [i.index for i in res.trace if i.op == "activation"]
    return loads, readers


def test_placed_tiles_do_not_rotate_their_bytes_are_where_the_kernel_put_them():
    # four tiles of one site at four disjoint addresses (fp32 [128, 64]: 256 bytes each): the
    # compiler's rotation does not apply, so no load waits for an earlier tile's reader
    res = _placed_loop([0, 256, 512, 768])
    assert all(a.placed is not None for a in res.allocations if a.buffer == "sbuf" and a.site == res.allocations[0].site)
    assert res.allocations[0].placed == (0, 128, 0, 256)
    preds = dependencies(res.trace, TRN2, res.allocations)
    loads, readers = _loads_and_readers(res)
    for k, load in enumerate(loads):
        assert not set(readers[:k]) & set(preds[load]), (k, preds[load])
    # the same trace without placement records rotates through depth buffers (the old rule)
    unplaced = [dataclasses.replace(a, placed=None) for a in res.allocations]
    preds = dependencies(res.trace, TRN2, unplaced)
    depth = TRN2.buffer_rotation_depth
    assert readers[0] in preds[loads[depth]]


def test_placed_tiles_over_the_same_bytes_wait_for_each_other():
    # tiles 0 and 2 share bytes 0..255, tile 1 sits at 128..383 (overlapping both halves),
    # tile 3 at 1024 overlaps none: each load waits for the readers of the tiles under it
    res = _placed_loop([0, 128, 0, 1024])
    preds = dependencies(res.trace, TRN2, res.allocations)
    loads, readers = _loads_and_readers(res)
    assert readers[0] in preds[loads[1]]                 # write after read over bytes 128..255
    assert {readers[0], readers[1]} <= set(preds[loads[2]])   # both tiles under bytes 0..255
    assert not set(readers) & set(preds[loads[3]])       # its own bytes: no wait
    est = estimate_trace(res.trace, TRN2, allocations=res.allocations)
    s = est.schedule
    assert s.start[loads[1]] >= s.finish[readers[0]] - 1e-12
    assert s.start[loads[2]] >= s.finish[readers[1]] - 1e-12


# ----------------------------------------------------------------------------- capacity

BANK = TRN2.psum_bank_bytes


def _psum_pipeline(banks: tuple[int, ...], iters: int = 6, placed=None):
    """Per iteration, one PSUM tile per entry of ``banks`` (one site each, that many banks
    per partition): a matmul writes it, ScalarE copies it out. ``placed``: (b0, b1) bytes of
    a placed PSUM tile live throughout. Returns (trace, allocations, {site line: tiles})."""
    b = TraceBuilder()
    allocs, tiles = [], {}
    st, mv = new_alloc(), new_alloc()
    if placed is not None:
        fixed = new_alloc()
        allocs.append(AllocationSite(fixed, "psum", (("k.py", 1),), None, (0, 128, *placed), placed[1] - placed[0]))
        b.matmul(psum("dst", fixed, (128, 128)), sbuf("stationary", st, (128, 128)), sbuf("moving", mv, (128, 128)))
    for _ in range(iters):
        for line, nb in enumerate(banks, start=10):
            t = new_alloc()
            tiles.setdefault(line, []).append(t)
            allocs.append(AllocationSite(t, "psum", (("k.py", line),), None, None, nb * BANK))
            cols = nb * BANK // 4
            for c0 in range(0, cols, 512):
                b.matmul(psum("dst", t, (128, 512), offset=c0), sbuf("stationary", st, (128, 128)),
                         sbuf("moving", mv, (128, 512)))
            b.activation(sbuf("dst", new_alloc(), (128, cols)), psum("data", t, (128, cols)))
    if placed is not None:
        b.activation(sbuf("dst", new_alloc(), (128, 128)), psum("data", fixed, (128, 128)))
    return b.trace, allocs, tiles


def _peak_banks(est, allocs) -> int:
    """Most PSUM banks the modeled schedule holds at once in the tiles ``allocs`` (one
    core's; a tile: first access start to last access end)."""
    banks = {a.alloc_id: -(-a.nbytes // BANK) for a in allocs}
    life = {}
    for ins in est.trace:
        for o in list(ins.reads) + list(ins.writes):
            if o.alloc_id in banks:
                lo, hi = life.get(o.alloc_id, (float("inf"), 0.0))
                life[o.alloc_id] = (min(lo, est.schedule.start[ins.index]), max(hi, est.schedule.finish[ins.index]))
    return max(sum(banks[a] for a, (lo, hi) in life.items() if lo <= t < hi) for t, _ in life.values())


def test_rotation_keeps_two_buffers_per_site_while_the_banks_hold_them():
    trace, allocs, tiles = _psum_pipeline((2, 1))           # 2 x 2 + 2 x 1 = 6 of 8 banks
    assert sorted(_depths(trace, allocs).values()) == [2, 2]
    assert rotation_edges(trace, allocs, 2, TRN2) == rotation_edges(trace, allocs, 2)


def _depths(trace, allocs, target=TRN2, depth=2):
    """{site line: buffers} family_depths gives the hand-built sites (k.py lines)."""
    from nki_kernels.simulator.cost.schedule import buffer_families, family_depths
    access, families = buffer_families(trace, allocs)
    return {k[2][0][1]: d for k, d in family_depths(families, access, allocs, depth, target).items()
            if k[2][0][0] == "k.py"}


def test_sites_give_up_buffers_until_the_banks_hold_them_fewest_first():
    # 3, 2 and 1 banks at two buffers each = 12 of 8 banks: no single site covers the
    # excess of 4, so the largest gives one up (9); the 1-bank site then covers the excess of
    # 1 (8): the 2-bank site keeps its two buffers (the attention kernel's S, Sᵀ and O)
    trace, allocs, tiles = _psum_pipeline((3, 2, 1))
    assert _depths(trace, allocs) == {10: 1, 11: 2, 12: 1}
    est = estimate_trace(trace, TRN2, allocations=allocs)
    assert _peak_banks(est, allocs) <= TRN2.psum_banks
    # without the capacity rule the same schedule holds more banks than PSUM has
    free = dependencies(trace, TRN2, None)
    for p, s_ in rotation_edges(trace, allocs, 2):
        free[s_].setdefault(p, 0.0)
    from nki_kernels.simulator.cost.schedule import schedule
    over = schedule(trace, TRN2, allocs, preds=free)
    assert _peak_banks(dataclasses.replace(est, schedule=over), allocs) > TRN2.psum_banks


def test_at_four_buffers_the_sites_give_up_buffers_level():
    # the error bar's optimistic end starts every site at 4 buffers (24 banks here): the
    # sites with the most buffers give one up first, so the result is the central one, not
    # one site squeezed to a single buffer while the others keep four
    trace, allocs, _ = _psum_pipeline((3, 2, 1))
    assert _depths(trace, allocs, depth=4) == {10: 1, 11: 2, 12: 1}
    trace, allocs, _ = _psum_pipeline((1, 1))                # 4 + 4 = 8 banks: all fit
    assert _depths(trace, allocs, depth=4) == {10: 4, 11: 4}


def test_placed_tiles_reserve_every_bank_they_touch():
    trace, allocs, _ = _psum_pipeline((2,), placed=(0, 4 * BANK))      # 4 banks left: 2 x 2
    assert _depths(trace, allocs) == {10: 2}
    trace, allocs, _ = _psum_pipeline((2,), placed=(0, 5 * BANK))      # 3 left: one buffer
    assert _depths(trace, allocs) == {10: 1}


def test_sbuf_tiles_rotate_within_the_bytes_of_a_partition():
    trace, allocs, tiles = _stream(6, cols=2048)
    # two sites of 60 KiB tiles at two buffers: 240 KiB of trn2's 192 KiB per partition; one
    # buffer less covers the excess: the later site (the results) gives it up
    sized = [dataclasses.replace(a, nbytes=60 * 1024) for a in allocs]
    assert _depths(trace, sized) == {10: 2, 12: 1}
    est = estimate_trace(trace, TRN2, allocations=sized)
    assert est.latency_us > estimate_trace(trace, TRN2, allocations=allocs).latency_us   # less prefetch
    small = [dataclasses.replace(a, nbytes=4096) for a in allocs]
    assert sorted(_depths(trace, small).values()) == [2, 2]


def test_tiles_the_program_keeps_alive_are_never_squeezed():
    # six 2-bank tiles of one site all live at once in program order: the program itself
    # needs 12 banks (the simulator would refuse it); the rule takes nothing away and the
    # rotation still gives every live tile its own buffer
    b = TraceBuilder()
    tiles = [new_alloc() for _ in range(6)]
    allocs = [AllocationSite(t, "psum", (("k.py", 3),), None, None, 2 * BANK) for t in tiles]
    st, mv = new_alloc(), new_alloc()
    for t in tiles:
        b.matmul(psum("dst", t, (128, 512)), sbuf("stationary", st, (128, 128)), sbuf("moving", mv, (128, 512)))
    for t in tiles:
        b.activation(sbuf("dst", new_alloc(), (128, 512)), psum("data", t, (128, 512)))
    assert _depths(b.trace, allocs) == {3: 6}                 # every live tile keeps its buffer
    assert rotation_edges(b.trace, allocs, 2, TRN2) == []


def test_our_attention_schedule_holds_at_most_the_psum_banks():
    # ViT-shaped attention (transposed scores): S for the row max (a bank of heads at a time),
    # Sᵀ (2 banks) and O (1 bank) each rotate two buffers: exactly PSUM's 8 banks, and the
    # modeled schedule never holds more (before, S took 3 banks with 6 heads: 12 of 8)
    from nki_kernels import _dispatch
    from nki_kernels.ops import attention
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(4, 12, 197, 64, generator=gen).to(torch.bfloat16) for _ in range(3))
    call = attention.attention_kernel_call(q, k, v)
    kernel = _dispatch.simulator_kernel(call)
    est = simulator.estimate(kernel, target="trn2")(*[t.contiguous() for t in call.tensors], **call.static)
    psum_allocs = [a for a in est.allocations if a.buffer == "psum"]
    assert psum_allocs and all(a.nbytes for a in psum_allocs)
    assert _peak_banks(est, psum_allocs) <= TRN2.psum_banks


# ----------------------------------------------------------------------------- engines

def test_a_psum_reader_waits_for_the_matmul_pipeline():
    b = TraceBuilder()
    acc = new_alloc()
    b.matmul(psum("dst", acc, (128, 128)), sbuf("stationary", new_alloc(), (128, 128)),
             sbuf("moving", new_alloc(), (128, 128)))
    b.tensor_copy(sbuf("dst", new_alloc(), (128, 128), "float32"), psum("src", acc, (128, 128)))
    est = estimate_trace(b.trace, TRN2_STEADY)
    interval = 128 / TRN2.tensor_hz
    assert est.schedule.start[1] == pytest.approx(interval + TRN2.matmul_latency_cycles / TRN2.tensor_hz)


def test_back_to_back_matmuls_do_not_wait_for_the_pipeline():
    b = TraceBuilder()
    acc = new_alloc()
    st = sbuf("stationary", new_alloc(), (128, 128))
    for _ in range(4):   # accumulating into one PSUM tile
        b.matmul(psum("dst", acc, (128, 512)), st, sbuf("moving", new_alloc(), (128, 512)))
    assert estimate_trace(b.trace, TRN2_STEADY).latency_us == pytest.approx(4 * 512 / TRN2.tensor_hz * US)


def _tiled_matmuls(tiles, target=TRN2_STEADY, n=512):
    """One bf16 matmul per PE tile (start row, start column, rows, columns; None = the whole
    array), each into its own PSUM tile; returns the Estimate."""
    b = TraceBuilder()
    for tile in tiles:
        rows = tile[2] if tile else 128
        cols = tile[3] if tile else 128
        ins = b.matmul(psum("dst", new_alloc(), (cols, n)), sbuf("stationary", new_alloc(), (rows, cols)),
                       sbuf("moving", new_alloc(), (rows, n)))
        if tile:
            ins.attrs["tile"] = tile
    return estimate_trace(b.trace, target)


def test_matmuls_on_disjoint_pe_tiles_run_in_parallel():
    # v2.33 nki.isa.nc_matmul, "Tiling mode": matmuls with a stationary tile smaller than
    # [128, 128] "run in parallel"; v3 slices the array into 4 x 32 columns (or rows)
    one = 512 / TRN2.tensor_hz * US
    columns = [(0, 32 * j, 128, 32) for j in range(4)]
    assert _tiled_matmuls(columns).latency_us == pytest.approx(one)
    rows_and_columns = [(64 * r, 64 * c, 64, 64) for r in range(2) for c in range(2)]
    assert _tiled_matmuls(rows_and_columns).latency_us == pytest.approx(one)
    # the same tile, or overlapping ones, take turns
    assert _tiled_matmuls([(0, 32, 128, 32)] * 4).latency_us == pytest.approx(4 * one)
    assert _tiled_matmuls([(0, 0, 128, 64), (0, 32, 128, 32)]).latency_us == pytest.approx(2 * one)
    # a whole-array matmul waits for every tile, and the next tiled one waits for it
    est = _tiled_matmuls([(0, 0, 128, 32), (0, 96, 128, 32), None, (0, 32, 128, 32)])
    assert est.schedule.start[1] == est.schedule.start[0] == 0.0
    assert est.schedule.start[2] == pytest.approx(one / US)
    assert est.schedule.start[3] == pytest.approx(2 * one / US)
    # TensorE's busy time is the union of its matmuls' intervals
    assert _tiled_matmuls(columns).engine_busy_us["tensor"] == pytest.approx(one)


def test_tiling_follows_the_generation_and_can_be_switched_off():
    trn1 = TARGETS["trn1"]   # v2: 2 x 64 tiles only
    one = 512 / trn1.tensor_hz * US
    assert _tiled_matmuls([(0, 0, 128, 64), (0, 64, 128, 64)], trn1).latency_us == pytest.approx(one)
    off = dataclasses.replace(TRN2_STEADY, matmul_tiles_parallel=False)
    columns = [(0, 32 * j, 128, 32) for j in range(4)]
    assert _tiled_matmuls(columns, off).latency_us == pytest.approx(4 * 512 / TRN2.tensor_hz * US)


def test_the_simulator_records_each_matmul_s_pe_tile():
    with simulator.activated():
        import nki
        import nki.isa as nisa
        import nki.language as nl

        @nki.jit
        def kernel(a, b):
            out = nl.ndarray((32, 4, 512), dtype=nl.float32, buffer=nl.shared_hbm)
            at = nl.ndarray((128, 32), dtype=a.dtype, buffer=nl.sbuf)
            bt = nl.ndarray((128, 512), dtype=b.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=at, src=a)
            nisa.dma_copy(dst=bt, src=b)
            # four PSUM tiles alive together (each its own buffer), one column tile each
            accs = [nl.ndarray((32, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(4)]
            for j in range(4):
                nisa.nc_matmul(dst=accs[j], stationary=at, moving=bt, tile_position=(0, 32 * j), tile_size=(128, 32))
            for j in range(4):
                res = nl.ndarray((32, 512), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_copy(dst=res, src=accs[j])
                nisa.dma_copy(dst=out[:, j, :], src=res)
            whole = nl.ndarray((32, 512), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=whole, stationary=at, moving=bt)
            return out

    a, b = torch.rand(128, 32).to(torch.bfloat16), torch.rand(128, 512).to(torch.bfloat16)
    res = simulator.run(kernel, a, b)
    mm = [i for i in res.trace if i.op == "nc_matmul"]
    assert [i.attrs["tile"] for i in mm] == [(0, 32 * j, 128, 32) for j in range(4)] + [(0, 0, 128, 128)]
    ref = (a.double().t() @ b.double()).float()   # every tile computes the same product
    for j in range(4):
        torch.testing.assert_close(res.outputs[:, j, :], ref, rtol=1e-5, atol=1e-5)
    est = simulator.estimate(kernel)(a, b)
    starts = sorted(est.schedule.start[i.index] for i in mm[:4])
    assert starts[-1] - starts[0] < 512 / TRN2.tensor_hz   # all four in flight together


def test_a_ready_instruction_passes_a_stalled_earlier_one_on_its_engine():
    # the compiler's scheduler reorders independent operations (nl.no_reorder's docstring)
    b = TraceBuilder()
    t = new_alloc()
    b.dma(sbuf("dst", t, (128, 4096)), hbm("src", new_alloc(), (128, 4096)))
    b.activation(sbuf("dst", new_alloc(), (128, 64)), sbuf("data", t, (128, 64)))        # waits on the load
    b.activation(sbuf("dst", new_alloc(), (128, 64)), sbuf("data", new_alloc(), (128, 64)))  # ready at once
    est = estimate_trace(b.trace, TRN2)
    assert est.schedule.start[2] == 0.0 < est.schedule.start[1]


# ----------------------------------------------------------------------------- VectorE pipeline

TRN1 = TARGETS["trn1"]


def _two_vector_ops(dependent: bool):
    """Two [128, 512] fp32 tensor_tensor; the second reads the first's result or not."""
    b = TraceBuilder()
    first = new_alloc()
    b.tensor_tensor(sbuf("dst", first, (128, 512), "float32"), sbuf("a", new_alloc(), (128, 512), "float32"),
                    sbuf("b", new_alloc(), (128, 512), "float32"))
    src = first if dependent else new_alloc()
    b.tensor_tensor(sbuf("dst", new_alloc(), (128, 512), "float32"), sbuf("a", src, (128, 512), "float32"),
                    sbuf("b", new_alloc(), (128, 512), "float32"))
    return b.trace


def test_vector_takes_an_independent_instruction_before_the_current_one_ends():
    # hardware.py vector_overlap_cycles: trn1's Mamba profiles show VectorE active for less
    # time than its instructions' durations add up to
    assert 0 < TRN1.vector_overlap_cycles <= TRN1.vector_static_cycles
    est = estimate_trace(_two_vector_ops(dependent=False), TRN1)
    first = est.schedule.finish[0] - est.schedule.start[0]
    assert est.schedule.start[1] == pytest.approx(first - TRN1.vector_overlap_cycles / TRN1.vector_hz)
    # busy time is the union of the two intervals; each slot keeps its whole duration
    durations = [s.end - s.start for s in est.schedule.slots]
    assert durations == pytest.approx([first, first])
    assert est.engine_busy_us["vector"] == pytest.approx(est.schedule.finish[1] * US)
    assert est.engine_busy_us["vector"] < sum(durations) * US


def test_a_dependent_vector_instruction_waits_for_the_whole_duration():
    est = estimate_trace(_two_vector_ops(dependent=True), TRN1)
    wait = TRN1.dependency_latency_cycles / TRN1.vector_hz
    assert est.schedule.start[1] == pytest.approx(est.schedule.finish[0] + wait)
    assert est.engine_busy_us["vector"] == pytest.approx(
        sum(s.end - s.start for s in est.schedule.slots) * US)


def test_the_overlap_is_capped_at_the_fixed_cost_and_off_when_zero():
    big = dataclasses.replace(TRN1, vector_overlap_cycles=10 * TRN1.vector_static_cycles)
    est = estimate_trace(_two_vector_ops(dependent=False), big)
    first = est.schedule.finish[0] - est.schedule.start[0]
    assert est.schedule.start[1] == pytest.approx(first - TRN1.vector_static_cycles / TRN1.vector_hz)
    est = estimate_trace(_two_vector_ops(dependent=False), dataclasses.replace(TRN2, vector_overlap_cycles=0.0))
    assert est.schedule.start[1] == pytest.approx(est.schedule.finish[0])


@pytest.mark.parametrize("name, interval", [("trn1", VECTOR_ISSUE_CYCLES), ("trn2", 48.0), ("trn3", 48.0)])
def test_every_generation_issues_independent_vector_instructions_its_measured_interval_apart(name, interval):
    # hardware.py: trn1's interval (fixed cost less overlap, VECTOR_ISSUE_CYCLES) is fitted
    # on its Mamba profiles, trn2's read off the v5 matmul's profile (65 - 17), and trn3,
    # with no measurement of its own, takes trn2's
    target = TARGETS[name]
    assert target.vector_static_cycles - target.vector_overlap_cycles == interval
    est = estimate_trace(_two_vector_ops(dependent=False), target)
    first = est.schedule.finish[0] - est.schedule.start[0]
    assert est.schedule.start[1] == pytest.approx(first - target.vector_overlap_cycles / target.vector_hz)


def test_readiness_is_the_latest_producer_plus_its_own_latency():
    # a producer that finishes first can still release its consumer last: a matmul's
    # result latency (made long here) outlasts a longer VectorE producer finishing after it
    slow = dataclasses.replace(TRN2, matmul_latency_cycles=10**6, tensor_throttle_start_rate=None)
    b = TraceBuilder()
    mm_out, vec_out = new_alloc(), new_alloc()
    b.matmul(psum("dst", mm_out, (128, 64)), sbuf("stationary", new_alloc(), (128, 128)),
             sbuf("moving", new_alloc(), (128, 64)))
    b.tensor_copy(sbuf("dst", vec_out, (128, 8192), "float32"), sbuf("src", new_alloc(), (128, 8192), "float32"))
    b.tensor_tensor(sbuf("dst", new_alloc(), (128, 64), "float32"), psum("data1", mm_out, (128, 64)),
                    sbuf("data2", vec_out, (128, 64), "float32"))
    sched = estimate_trace(b.trace, slow).schedule
    assert sched.finish[0] < sched.finish[1]
    assert sched.ready[2] == pytest.approx(sched.finish[0] + 10**6 / slow.tensor_hz)


def test_an_instruction_waits_for_the_latest_of_its_producers():
    # the consumer reads a long ScalarE result issued first and a short VectorE one issued
    # second: it is ready when the later-finishing one (the first) is done, whatever order
    # its dependencies come in
    b = TraceBuilder()
    long_out, short_out = new_alloc(), new_alloc()
    b.activation(sbuf("dst", long_out, (128, 8192), "float32"), sbuf("data", new_alloc(), (128, 8192), "float32"))
    b.tensor_copy(sbuf("dst", short_out, (128, 8), "float32"), sbuf("src", new_alloc(), (128, 8), "float32"))
    b.tensor_tensor(sbuf("dst", new_alloc(), (128, 8), "float32"), sbuf("data1", long_out, (128, 8), "float32"),
                    sbuf("data2", short_out, (128, 8), "float32"))
    sched = estimate_trace(b.trace).schedule
    assert sched.finish[0] > sched.finish[1]
    assert sched.ready[2] >= sched.finish[0] and sched.start[2] >= sched.finish[0]


def test_an_in_place_update_still_waits_the_result_latency_of_its_producer():
    # the consumer reads and rewrites the producer's tile: the read-after-write edge keeps
    # the write-back latency even though a write-after-write edge joins the same pair
    b = TraceBuilder()
    t = new_alloc()
    b.activation(sbuf("dst", t, (128, 512), "float32"), sbuf("data", new_alloc(), (128, 512), "float32"))
    b.tensor_tensor(sbuf("dst", t, (128, 512), "float32"), sbuf("data1", t, (128, 512), "float32"),
                    sbuf("data2", new_alloc(), (128, 512), "float32"))
    sched = estimate_trace(b.trace).schedule
    latency = TRN2.dependency_latency_cycles / TRN2.scalar_hz
    assert latency > 0
    assert sched.ready[1] == pytest.approx(sched.finish[0] + latency)


# ----------------------------------------------------------------------------- two cores

def _two_core_trace(rows_core1: int):
    b = TraceBuilder()
    for core, rows in ((0, 8), (1, rows_core1)):
        for _ in range(rows):
            t = new_alloc()
            b._add("dma_copy", "dma", [hbm("src", new_alloc(), (128, 2048))], [sbuf("dst", t, (128, 2048))],
                   bytes=128 * 2048 * 2, core=core)
            b._add("activation", "scalar", [sbuf("data", t, (128, 2048))],
                   [sbuf("dst", new_alloc(), (128, 2048))], core=core)
    return b.trace


def test_each_core_has_its_busy_time_latency_and_the_launch_is_the_later_core(tmp_path):
    est = estimate_trace(_two_core_trace(4))
    assert est.cores == 2 and set(est.core_latency_us) == {0, 1}
    assert est.latency_us == pytest.approx(max(est.core_latency_us.values()))
    assert est.core_busy_us[0]["scalar"] == pytest.approx(2 * est.core_busy_us[1]["scalar"])
    assert est.imbalance == pytest.approx(1 - est.core_latency_us[1] / est.core_latency_us[0])
    assert 0.3 < est.imbalance < 0.7
    assert "imbalance" in est.summary()
    doc = json.loads(est.to_chrome_trace(tmp_path / "t.json").read_text())
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert sorted(procs) == [1, 2] and "NeuronCore 1" in procs[2]
    lanes = {(e["pid"], e["args"]["name"]) for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert (1, "ScalarE") in lanes and (2, "ScalarE") in lanes and (2, "DMA queue 15") in lanes
    pids = {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert pids == {1, 2}
    assert doc["otherData"]["imbalance"] == pytest.approx(est.imbalance)


def test_one_core_launch_has_no_imbalance():
    est = estimate_trace(_two_core_trace(0)[:16])
    assert est.cores == 1 and est.imbalance == 0.0


def test_two_streaming_cores_share_the_hbm_stack():
    trace = _two_core_trace(8)
    est = estimate_trace(trace)
    share = TRN2.hbm_stack_bytes_per_s / (2 * TRN2.dma_bytes_per_s)
    assert share < 1
    alone = dma_cost(trace[0], TRN2)
    assert est.schedule.costs[0].data_seconds == pytest.approx(alone.data_seconds / share)
    one_core = estimate_trace(trace[:16])
    assert one_core.schedule.costs[0].data_seconds == pytest.approx(alone.data_seconds)
    # the stack is HBM's: a transfer between on-chip buffers of the same launch is not slowed
    b = TraceBuilder()
    for core in (0, 1):
        for _ in range(8):
            b._add("dma_copy", "dma", [hbm("src", new_alloc(), (128, 2048))], [sbuf("dst", new_alloc(), (128, 2048))],
                   bytes=128 * 2048 * 2, core=core)
        b._add("dma_copy", "dma", [sbuf("src", new_alloc(), (128, 2048))], [sbuf("dst", new_alloc(), (128, 2048))],
               bytes=128 * 2048 * 2, core=core)
    both = estimate_trace(b.trace)
    on_chip = [i for i, ins in enumerate(b.trace) if ins.reads[0].buffer == "sbuf"]
    assert both.schedule.costs[on_chip[0]].data_seconds == pytest.approx(dma_cost(b.trace[on_chip[0]], TRN2).data_seconds)
    assert both.schedule.costs[0].data_seconds == pytest.approx(alone.data_seconds / share)


def _exchange_trace(busy_rows: int):
    """Core 1 runs ``busy_rows`` ScalarE passes before its sendrecv; core 0 sends at once."""
    b = TraceBuilder()
    src0, dst0, src1, dst1 = new_alloc(), new_alloc(), new_alloc(), new_alloc()
    t = new_alloc()
    for _ in range(busy_rows):
        b._add("activation", "scalar", [sbuf("data", t, (128, 2048))], [sbuf("dst", t, (128, 2048))], core=1)
    b._add("activation", "scalar", [sbuf("data", t, (128, 2048))], [sbuf("dst", src1, (128, 8))], core=1)
    b._add("memset", "vector", [], [sbuf("dst", src0, (128, 8))], core=0)
    for core, src, dst in ((0, src0, dst0), (1, src1, dst1)):
        b._add("sendrecv", "dma", [sbuf("src", src, (128, 8))], [sbuf("dst", dst, (128, 8))],
               bytes=128 * 8 * 4, core=core, send_to_rank=1 - core, recv_from_rank=1 - core, pipe_id=0)
    return b.trace


def test_a_sendrecv_waits_for_the_other_core_s_side():
    """nki.isa.sendrecv: "all operations in the group must complete before any can
    proceed": core 0's exchange starts only once core 1's tile is made, however early core 0
    is ready; with nothing before it on core 1, core 0 does not wait."""
    trace = _exchange_trace(6)
    est = estimate_trace(trace)
    s = est.schedule
    ex0, ex1 = (i for i, ins in enumerate(trace) if ins.op == "sendrecv")
    made = ex0 - 2                                              # core 1's last ScalarE pass
    assert s.start[ex0] >= s.finish[made] - 1e-12 and s.start[ex1] >= s.finish[made] - 1e-12
    assert s.finish[made] > 5 * (s.finish[ex0 - 1] - s.start[ex0 - 1])   # core 0 was ready long before
    quick = estimate_trace(_exchange_trace(0))
    assert quick.latency_us < est.latency_us / 4


# ----------------------------------------------------------------------------- error bars

def test_variants_put_every_uncertain_number_at_its_end():
    opt, pes = variant("trn2", "optimistic"), variant("trn2", "pessimistic")
    for name, o, p in TRN2.cost_ranges:
        field = name.removesuffix("_scale")
        if name.endswith("_scale"):
            assert getattr(opt, field) == pytest.approx(getattr(TRN2, field) * o)
            assert getattr(pes, field) == pytest.approx(getattr(TRN2, field) * p)
        else:
            assert getattr(opt, field) == o and getattr(pes, field) == p


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_fixed_cost_range_holds_its_generations_value(name):
    # the fixed costs are per engine and generation, and so are their ranges: each must
    # contain the target's own fitted value, or the error bar would exclude the model
    target = TARGETS[name]
    ranges = {n: (o, p) for n, o, p in target.cost_ranges}
    for engine in ("vector", "scalar", "gpsimd"):
        o, p = ranges[f"{engine}_static_cycles"]
        assert o <= target.static_cycles(engine) <= p, (name, engine)


def test_the_time_range_brackets_the_central_value():
    trace, allocs, _ = _stream(12)
    est = estimate_trace(trace, TRN2, allocations=allocs)
    low, high = time_range(est)
    assert low < est.latency_us < high


def test_the_time_range_widens_both_ends_by_the_model_error_band():
    trace, allocs, _ = _stream(12)
    est = estimate_trace(trace, TRN2, allocations=allocs)
    ends = end_latencies(est)
    bare = dataclasses.replace(TRN2, model_error_band=(1.0, 1.0))
    wide = dataclasses.replace(TRN2, model_error_band=(0.7, 1.4))
    low, high = time_range(est, bare, ends=ends)
    assert (low, high) == (pytest.approx(min(ends["optimistic"], est.latency_us)),
                           pytest.approx(max(ends["pessimistic"], est.latency_us)))
    assert time_range(est, wide, ends=ends) == (pytest.approx(0.7 * low), pytest.approx(1.4 * high))
    # the default: the target's own band, whatever it is
    band = TRN2.model_error_band
    assert time_range(est, ends=ends) == (pytest.approx(band[0] * low), pytest.approx(band[1] * high))


def test_dependencies_of_an_exchange_and_a_stream_follow_the_rules():
    """The dependency rules on two small traces, expected edges derived by hand (docstring
    of cost/schedule.py, item 1), with the conflicts found once and the latencies of each
    target applied to them. The exchange: core 1's two ScalarE passes (the second reads
    the first's tile), core 0's memset, then the two sides of a sendrecv; each side waits for
    its own input's producer and, paired, for the other side's (nki.isa.sendrecv). The
    stream (two chunks: load, ScalarE, store): each instruction waits for its input's
    producer, a DMA's result with no extra latency."""
    trace = _exchange_trace(1)
    found = conflicts(trace)
    for cycles in (100.0, 250.0):
        target = dataclasses.replace(TRN2, dependency_latency_cycles=cycles)
        scalar, vector = cycles / target.scalar_hz, cycles / target.vector_hz
        assert dependencies(trace, target, found=found) == [
            {}, {0: scalar}, {}, {2: vector, 1: scalar}, {1: scalar, 2: vector}]
    trace, allocs, _ = _stream(2)
    deep = dataclasses.replace(TRN2, buffer_rotation_depth=2)
    scalar = TRN2.dependency_latency_cycles / TRN2.scalar_hz
    assert dependencies(trace, deep, allocs, conflicts(trace, allocs)) == [
        {}, {0: 0.0}, {1: scalar}, {}, {3: 0.0}, {4: scalar}]


def _traces_for_reuse():
    """(name, trace, allocations) of traces that exercise every part of the dependency walk:
    finite buffering, beta-1 sequential loops, placed tiles, an LNC=2 exchange."""
    stream, allocs, _ = _stream(6)
    kernel, x = _sequential_kernel()
    sequential = simulator.run(kernel, x)
    placed = _placed_loop([0, 128, 0, 1024])
    return [("stream", stream, allocs), ("sequential", sequential.trace, sequential.allocations),
            ("placed", placed.trace, placed.allocations), ("exchange", _exchange_trace(3), None)]


def test_conflicts_found_once_serve_every_target(monkeypatch):
    """The error bars and the calibration re-schedule one trace on several targets with the
    conflicts walked once (schedule.conflicts): using them leaves them as they were, so each
    target (central, both ends, beta-1 loops) gets the dependencies a walk of its own finds,
    latencies and order included; the central schedule keeps them, and the error bars' ends
    walk the trace no more and equal fresh schedules at each end."""
    beta1 = dataclasses.replace(TRN2, beta1_sequential_loops=True)
    targets = [TRN2, variant(TRN2, "optimistic"), variant(TRN2, "pessimistic"), beta1]
    walks = []
    real = schedule_module.conflicts
    monkeypatch.setattr(schedule_module, "conflicts", lambda *a, **k: walks.append(1) or real(*a, **k))
    for name, trace, allocs in _traces_for_reuse():
        found = real(trace, allocs)
        for target in targets:
            fresh = dependencies(trace, target, allocs)
            reused = dependencies(trace, target, allocs, found)
            assert [list(d.items()) for d in reused] == [list(d.items()) for d in fresh], (name, target)
        walks.clear()
        est = estimate_trace(trace, TRN2, allocations=allocs)
        assert est.schedule.conflicts is not None and len(walks) == 1, name
        ends = end_latencies(est)
        assert len(walks) == 1, name      # the ends reused the central schedule's conflicts
        for end in ("optimistic", "pessimistic"):
            assert ends[end] == estimate_trace(trace, variant(TRN2, end), allocations=allocs).latency_us, (name, end)


def test_conflicts_of_a_trace_of_another_length_are_an_error():
    trace, allocs, _ = _stream(4)
    other, other_allocs, _ = _stream(5)
    with pytest.raises(CostModelError, match=r"found: conflicts of 15 instructions for a trace of 12"):
        dependencies(trace, TRN2, allocs, conflicts(other, other_allocs))


def test_bad_variant_requests_are_errors():
    with pytest.raises(ValueError, match="end='middle'"):
        variant("trn2", "middle")
    bad = dataclasses.replace(TRN2, cost_ranges=(("no_such_field", 1.0, 2.0),))
    with pytest.raises(ValueError, match="no_such_field"):
        variant(bad, "optimistic")
    # an Estimate stripped of its trace / schedule cannot be re-scheduled / exported
    trace, allocs, _ = _stream(4)
    est = estimate_trace(trace, TRN2, allocations=allocs)
    with pytest.raises(ValueError, match="this Estimate kept no trace to re-schedule"):
        end_latencies(dataclasses.replace(est, trace=None))
    with pytest.raises(ValueError, match="this Estimate has no schedule to export"):
        dataclasses.replace(est, schedule=None).to_chrome_trace("unused.json")

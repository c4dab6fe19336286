"""The list schedule: when each traced instruction runs on the modeled NeuronCore(s).

1. Dependencies. Walking the trace in issue order, an instruction depends on every
   earlier instruction that

   * wrote an overlapping part of an allocation it reads (read after write); the
     consumer also waits the producer's result latency (model.py: Vector/Scalar/GpSimd
     write-back, TensorE pipeline);
   * read (write after read) or wrote (write after write) an overlapping part of an
     allocation it writes.

   Footprints are exact sets of element runs (regions.py).
   1b. Only for ports of beta-1 kernels (``Target.beta1_sequential_loops``): in a loop the
   beta-1 compiler kept sequential (``nl.sequential_range``), an iteration's loads from HBM
   also wait for the previous iteration's compute instructions, unless the kernel itself
   loads them for a later iteration (``beta1_sequential_edges``).
2. Buffers. Tiles allocated by the same line on the same call path (loop iterations) share
   their site's physical buffers, rotated in allocation order: as many as the program keeps
   alive at once plus ``buffer_rotation_depth`` - 1 iterations' fills (``rotation_buffers``:
   a loop's single tile 2, a set of tiles filled per iteration one set ahead). The first
   writes of tile k wait for every instruction that touched the tile whose buffer it takes
   (write after read on the physical buffer). So prefetching reaches as far ahead as the
   buffers allow, as with the compiler's address rotation. A site keeps its buffers only
   while they fit in SBUF / PSUM beside everything live with them (``family_depths``).
   Without allocation sites (hand-built traces) every allocation is its own buffer.
3. List scheduling. Engines run in parallel, each one instruction at a time. Whenever an
   engine is idle it starts, among the instructions whose dependencies are done, the one
   issued first (the kernel's order is the priority; an independent later instruction
   may run ahead of a stalled earlier one: "without [nl.no_reorder], the compiler scheduler
   is free to reorder independent operations for better hardware utilization" [I]).
   VectorE is pipelined: it takes its next instruction ``vector_overlap_cycles`` (at most
   its fixed cost) before the current one ends. Only an instruction that does not depend
   on the current one can be ready then, so a dependent one still waits for the end. An
   engine's busy time is the union of its instructions' intervals (the profiler's "Event
   Duration Active"); each slot keeps the instruction's whole duration.
   TensorE on trn2/trn3 is throttled (hardware.py ``tensor_throttle_*``, AWS's Neuron
   Explorer docs): a burst of TensorE work starts with its utilization capped at half the
   peak FLOPs, and the cap reaches the peak after ~3 us of busy time; an instruction that
   uses less than the cap at its own rate is not slowed (``throttled_seconds``,
   ``cost/model.py`` ``tensor_utilization``). After a window in which TensorE used less than
   half its peak (an idle gap, or only matmuls that use a small share of it) the next
   instruction starts a new burst.
   A DMA transfer, ``dma_latency_s`` after its dependencies are done, is split over
   ``queues`` of its core's 16 DMA engines (lanes "dma_q<k>", the ones with the least
   pending work); an engine moves one share's data at a time, and each of its queues
   starts its shares in issue order, no sooner than the transfer gap after its previous
   start. With one queue per engine (``dma_site_queues`` = 1, the default, trn1's) that is one
   transfer per engine per max(gap, data); with more, the shares of other allocation
   sites' queues take turns between them (round robin). The transfer completes when its
   last share lands. With ``dma_descriptor_generation_s`` > 0 (trn2 and trn3: 600 ns, with 16 site queues)
   each core also has one descriptor generator: a released transfer's data waits until the
   generator has spent that long on it. The generator takes the earliest-issued of the
   released transfers waiting for it (DGE work is triggered by engine sequencers, which
   serve their instruction streams in program order [A2]), but does not wait for an
   earlier-issued transfer that is not released yet (a kernel's DMAs leave from more than
   one sequencer). Taking them in release order instead let a prefetch released early
   hold up an earlier-issued transfer on the critical path (attention backward ViT-B 84.2 ->
   88.9 us with the generator on, 83.7 us in issue priority); a single in-order stream per
   core holds them all up (135.7 us).
4. Cores. Instructions of a kernel[2] trace carry their core (``attrs["core"]``); each core
   has its own engines and queues. While both cores are active, transfers touching HBM get
   ``min(1, hbm_stack_bytes_per_s / (cores x dma_bytes_per_s))`` of the bandwidth (the two
   cores of a logical core share one HBM stack).

The modeled latency is the completion of the last instruction (the later core).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

import numpy as np

from ..hardware import Target
from .model import (COMPUTE_ENGINES, CostModelError, compute_cost, dependency_latency_seconds, dma_cost,
                    engine_hz, tensor_utilization)
from .regions import Region, region_of


class _AccessList:
    """Accesses of one kind (reads or writes) to one allocation, sorted by hull start.

    ``max_len`` (the longest hull) bounds where an overlapping access can start, so
    queries over disjoint chunks (the common case: a kernel walking a tensor tile by
    tile) look at a handful of entries instead of every earlier access.
    """

    __slots__ = ("los", "entries", "max_len")

    def __init__(self):
        self.los: list[int] = []
        self.entries: list[tuple[Region, int]] = []
        self.max_len = 0

    def overlapping(self, region: Region):
        lo = bisect_left(self.los, region.lo - self.max_len)
        hi = bisect_left(self.los, region.hi)
        return [idx for reg, idx in self.entries[lo:hi] if reg.overlaps(region)]

    def add(self, region: Region, index: int) -> None:
        pos = bisect_right(self.los, region.lo)
        self.los.insert(pos, region.lo)
        self.entries.insert(pos, (region, index))
        self.max_len = max(self.max_len, region.hi - region.lo)

    def drop_covered(self, region: Region) -> None:
        lo = bisect_left(self.los, region.lo)
        hi = bisect_left(self.los, region.hi)
        if lo == hi:
            return
        keep = [(reg, idx) for reg, idx in self.entries[lo:hi] if not region.covers(reg)]
        if len(keep) != hi - lo:
            self.entries[lo:hi] = keep
            self.los[lo:hi] = [reg.lo for reg, _ in keep]


class _AllocState:
    """Earlier reads and writes of one allocation (instruction indices)."""

    __slots__ = ("writes", "reads")

    def __init__(self):
        self.writes = _AccessList()
        self.reads = _AccessList()

    def writers_of(self, region: Region):
        return self.writes.overlapping(region)

    def users_of(self, region: Region):
        return self.writes.overlapping(region) + self.reads.overlapping(region)

    def add_read(self, region: Region, index: int) -> None:
        self.reads.add(region, index)

    def add_write(self, region: Region, index: int) -> None:
        # Accesses this write fully covers are ordered before it (it depends on them), so
        # later accesses that depend on it are ordered after them too: drop them.
        self.writes.drop_covered(region)
        self.reads.drop_covered(region)
        self.writes.add(region, index)


# Physical placement (trace.AllocationSite.placed): a byte of partition p of a core's SBUF or
# PSUM is address p * _PHYS_ROW + byte, so a tile's rectangle of partitions x bytes is a
# regular Region (one run per partition, stride _PHYS_ROW) and two rectangles compare in
# closed form. Larger than any partition (SBUF 192-224 KiB, PSUM 16 KiB).
_PHYS_ROW = 1 << 20
_PHYS_PAGE = 4096   # bytes per bucket when finding the placed tiles that share bytes


def _rectangle(p0: int, p1: int, b0: int, b1: int) -> Region:
    if p1 - p0 == 1:
        return Region(p0 * _PHYS_ROW + b0, p0 * _PHYS_ROW + b1)
    starts = np.arange(p0, p1, dtype=np.int64) * _PHYS_ROW + b0
    return Region(int(starts[0]), int(starts[-1]) + b1 - b0, starts, starts + (b1 - b0),
                  pattern=(_PHYS_ROW, p1 - p0, b1 - b0))


class _Placement:
    """The explicitly placed tiles of a trace: which of them share physical bytes, and the
    bytes an access to one of them touches (the partitions and, within one partition, the
    bytes of its footprint; an access over several partitions counts the tile's whole byte
    range: coarse, so it can only add dependencies, and only between different tiles)."""

    def __init__(self, allocations):
        self.rect: dict[int, tuple] = {}
        pages: dict[tuple, list[int]] = {}
        for a in allocations or ():
            if a.placed is None:
                continue
            p0, p1, b0, b1 = a.placed
            self.rect[a.alloc_id] = (a.core, a.buffer, p0, p1, b0, b1)
            for page in range(b0 // _PHYS_PAGE, (b1 - 1) // _PHYS_PAGE + 1):
                pages.setdefault((a.core, a.buffer, page), []).append(a.alloc_id)
        self.aliases: dict[int, list[int]] = {}
        for alloc, (core, buf, p0, p1, b0, b1) in self.rect.items():
            seen = set()
            for page in range(b0 // _PHYS_PAGE, (b1 - 1) // _PHYS_PAGE + 1):
                for other in pages[(core, buf, page)]:
                    if other == alloc or other in seen:
                        continue
                    _, _, q0, q1, c0, c1 = self.rect[other]
                    if q0 < p1 and p0 < q1 and c0 < b1 and b0 < c1:
                        seen.add(other)
            if seen:
                self.aliases[alloc] = sorted(seen)

    def region(self, operand, reg: Region) -> Region:
        _, _, p0, p1, b0, b1 = self.rect[operand.alloc_id]
        elems = operand.itemsize   # bytes per element
        per_part = (b1 - b0) // elems
        if per_part <= 0 or reg.hi <= reg.lo:
            return _rectangle(p0, p1, b0, b1)
        first, last = reg.lo // per_part, (reg.hi - 1) // per_part
        if p0 + last >= p1:   # a view in another element size than the tile's: all its bytes
            return _rectangle(p0, p1, b0, b1)
        if first == last:
            lo = b0 + (reg.lo % per_part) * elems
            hi = b0 + ((reg.hi - 1) % per_part + 1) * elems
            return _rectangle(p0 + first, p0 + first + 1, lo, min(hi, b1))
        return _rectangle(p0 + first, p0 + last + 1, b0, b1)


class Conflicts:
    """What ``dependencies`` finds in a trace that no Target number changes, per instruction
    in issue order: the earlier instructions it reads a result of (``reads_from``: read after
    write) and those whose reads or writes its writes overlap (``writes_over``: write after
    read or write), each in the order the walk meets them, repeats kept; each instruction's
    engine (``engines``); and the positions of the LNC=2 exchanges (``sendrecv``), which
    ``dependencies`` pairs. Built once by ``conflicts`` and reused for every target a trace is
    re-scheduled on (the error bars' two ends, the calibration's fits): the footprint
    comparisons are most of a dependency walk's time."""

    __slots__ = ("reads_from", "writes_over", "engines", "sendrecv")

    def __init__(self, reads_from, writes_over, engines, sendrecv):
        self.reads_from: list[list[int]] = reads_from
        self.writes_over: list[list[int]] = writes_over
        self.engines: list[str] = engines
        self.sendrecv: list[int] = sendrecv


def _state(states: dict[int, _AllocState], alloc: int) -> _AllocState:
    """The accesses so far of ``alloc`` (made on its first access only)."""
    state = states.get(alloc)
    if state is None:
        state = states[alloc] = _AllocState()
    return state


def conflicts(trace, allocations=None) -> Conflicts:
    """The trace's read-after-write and write-after-read/write pairs (``Conflicts``), with
    ``allocations`` (``trace.AllocationSite`` records) also those between explicitly placed
    tiles over the same bytes."""
    allocs: dict[int, _AllocState] = {}
    placement = _Placement(allocations)
    phys: dict[int, _AllocState] = {}      # placed tile -> its accesses as physical bytes
    reads_from: list[list[int]] = []
    writes_over: list[list[int]] = []
    engines: list[str] = []
    sendrecv: list[int] = []

    def access(o):
        """(allocation, footprint, physical footprint if the tile shares bytes, else None)."""
        reg = region_of(o)
        return o.alloc_id, reg, placement.region(o, reg) if o.alloc_id in placement.aliases else None

    def earlier(alloc, reg, preg, which):
        """Earlier accesses conflicting with this one: ``which`` is "writers_of" (for a
        read) or "users_of" (for a write), asked of the tile and of the placed tiles over
        its bytes."""
        found = list(getattr(allocs[alloc], which)(reg)) if alloc in allocs else []
        if preg is not None:
            for other in placement.aliases[alloc]:
                if other in phys:
                    found += getattr(phys[other], which)(preg)
        return found

    for pos, ins in enumerate(trace):
        if ins.index != pos:
            raise CostModelError(f"trace is not in issue order: position {pos} holds instruction {ins.index}")
        reads = [access(o) for o in ins.reads]
        writes = [access(o) for o in ins.writes]
        reads_from.append([p for alloc, reg, preg in reads for p in earlier(alloc, reg, preg, "writers_of")])
        writes_over.append([p for alloc, reg, preg in writes for p in earlier(alloc, reg, preg, "users_of")])
        for alloc, reg, preg in reads:
            _state(allocs, alloc).add_read(reg, pos)
            if preg is not None:
                _state(phys, alloc).add_read(preg, pos)
        for alloc, reg, preg in writes:
            _state(allocs, alloc).add_write(reg, pos)
            if preg is not None:
                _state(phys, alloc).add_write(preg, pos)
        engines.append(ins.engine)
        if ins.op == "sendrecv":
            sendrecv.append(pos)
    return Conflicts(reads_from, writes_over, engines, sendrecv)


def dependencies(trace, target: Target, allocations=None, found: Conflicts | None = None) -> list[dict[int, float]]:
    """Per instruction: {predecessor index: extra latency in seconds}. With
    ``allocations`` (``trace.AllocationSite`` records), also the buffer-rotation edges and
    the edges between explicitly placed tiles over the same bytes. ``found``: the trace's
    ``conflicts(trace, allocations)`` when already computed (they hold for every target)."""
    trace = trace if isinstance(trace, list) else list(trace)
    if found is None:
        found = conflicts(trace, allocations)
    if len(found.reads_from) != len(trace):
        # the only check possible: conflicts of another trace of this length pass unnoticed
        raise CostModelError(f"found: conflicts of {len(found.reads_from)} instructions for a trace of {len(trace)}")
    latency = {engine: dependency_latency_seconds(engine, target) for engine in set(found.engines)}
    preds: list[dict[int, float]] = []
    first_reader: dict[int, int] = {}      # instruction -> the first one that reads its result
    track_readers = target.beta1_sequential_loops   # only rule 1b asks for first_reader
    for pos, (reads_from, writes_over) in enumerate(zip(found.reads_from, found.writes_over)):
        mine: dict[int, float] = {}
        for p in reads_from:
            if track_readers:
                first_reader.setdefault(p, pos)
            lat = latency[found.engines[p]]
            if mine.get(p, -1.0) < lat:
                mine[p] = lat
        for p in writes_over:
            if p not in mine:
                mine[p] = 0.0
        mine.pop(pos, None)
        preds.append(mine)
    exchanges: dict[tuple, list[int]] = {}  # sendrecv positions not yet matched, per direction
    for pos in found.sendrecv:
        _pair_exchange(trace[pos], pos, exchanges, preds)
    if allocations:
        for p, s in rotation_edges(trace, allocations, int(target.buffer_rotation_depth), target):
            preds[s].setdefault(p, 0.0)
    if target.beta1_sequential_loops:
        for p, s in beta1_sequential_edges(trace, first_reader):
            preds[s].setdefault(p, 0.0)
    return preds


def beta1_sequential_edges(trace, first_reader: dict[int, int] | None = None) -> list[tuple[int, int]]:
    """(earlier, later) pairs of the beta-1 compiler's ``sequential_range`` (rule 1b).

    Beta-1 NKI replaced "any use of Python range(...)" in a kernel with sequential_range,
    which "informs Neuron compiler to respect inter-loop dependency and perform much more
    conservative loop-level optimizations compared to affine_range" and "prevents Neuron
    compiler from unrolling the loops until entering compiler backend"
    (nki.language.sequential_range, NKI beta-1 API). The model's reading: such a loop's
    iterations are not software-pipelined, so an iteration's loads from HBM are not issued
    before the previous iteration's compute instructions are done (its stores may still
    run). Pipelining is what the compiler declines, so a load whose first reader
    (``first_reader``, from the dependencies) is not in the load's own iteration of the loop
    (a later one, or after the loop) -- the kernel's own prefetch, double buffering by hand --
    is not held in that loop: the kernel has already placed it ahead. The simulator marks the iterations of
    ``nl.sequential_range`` (in NKI 0.7 a plain alias of range); only ports of beta-1 kernels
    ask for this (calibrate.py, docs/cost-model.md "Beta-1 sequential loops")."""
    compute: dict[tuple[int, int, int], list[int]] = {}   # (core, loop, iteration) -> compute instructions
    loads: list[tuple[int, tuple]] = []
    for ins in trace:
        marks = ins.attrs.get("sequential")
        if not marks:
            continue
        core = _core(ins)
        if ins.engine != "dma":
            for loop, k in marks:
                compute.setdefault((core, loop, k), []).append(ins.index)
        elif any(o.buffer == "hbm" for o in ins.reads):
            loads.append((ins.index, tuple((core, loop, k) for loop, k in marks)))
    edges = []
    for i, keys in loads:
        reader = (first_reader or {}).get(i)
        read_in = dict(trace[reader].attrs.get("sequential") or ()) if reader is not None else None
        for core, loop, k in keys:
            if read_in is not None and read_in.get(loop) != k:
                continue          # first read after this iteration (a later one, or after the loop): a prefetch
            edges.extend((p, i) for p in compute.get((core, loop, k - 1), ()))
    return edges


def _pair_exchange(ins, pos, exchanges, preds):
    """A ``sendrecv`` between the cores of an LNC=2 launch: "operations with the same pipe_id
    form a logical group where all operations in the group must complete before any can
    proceed" (nki.isa.sendrecv, NKI 0.7 API docs), so neither side starts before both
    sides' inputs are ready: each side also waits for the other's predecessors. Matched by
    order: the k-th exchange core a sends to core b with pipe p meets the k-th core b sends
    to core a with pipe p."""
    a = int(ins.attrs.get("core", 0) or 0)
    b = ins.attrs.get("send_to_rank", a)
    pipe = ins.attrs.get("pipe_id")
    waiting = exchanges.get((b, a, pipe))
    if waiting:
        other = waiting.pop(0)
        mine, theirs = dict(preds[pos]), dict(preds[other])
        for p, lat in theirs.items():
            if preds[pos].get(p, -1.0) < lat:
                preds[pos][p] = lat
        for p, lat in mine.items():
            if preds[other].get(p, -1.0) < lat:
                preds[other][p] = lat
        return
    exchanges.setdefault((a, b, pipe), []).append(pos)


def rotation_edges(trace, allocations, depth: int, target: Target | None = None) -> list[tuple[int, int]]:
    """(earlier, later) instruction pairs the sharing of physical buffers adds.

    Tiles of one family (same site, buffer kind and core) take ``rotation_buffers``
    buffers: what the program keeps alive at once plus ``depth`` - 1 iterations' fills
    (until 2026-12-07 ``max(depth, kept alive)``, so a site that fills several tiles per
    iteration had no buffer ahead), in allocation order (fewer where the memory cannot hold
    them: ``family_depths``, with ``target``); a new tile takes the buffer whose occupant
    was last used longest ago among those whose occupant is dead in program order (last
    access issued before the new tile's first access), or a fresh buffer when none is (the
    program keeps them all alive, so the compiler must give it its own). The new tile's
    accesses up to and
    including its first read then wait for every access of the old occupant (the address
    rotation: the buffer changes hands). A later write of the new tile (to a part that first
    read did not touch: a tile filled chunk by chunk) depends on nothing of its own tile, so
    it waits for the old occupant's accesses to the same bytes (write after read on the
    physical buffer; both tiles from one site have one layout, so their element offsets
    compare; where the sizes differ, every access). Until 2026-12-06 such writes waited for
    nothing and could overwrite the buffer while the old occupant's readers still ran
    (attention backward at Llama S=2048 causal and RMSNorm backward at Llama-7B had 10 and
    4, modeled 0.6 / 0.4 % too fast). Later reads need no edge: each reads what one of
    these writes made."""
    if depth < 1:
        raise CostModelError(f"buffer_rotation_depth={depth}; expected at least 1")
    access, families = buffer_families(trace, allocations)
    depths = family_depths(families, access, allocations, depth, target) if target is not None else {}
    size = {a.alloc_id: a.nbytes for a in allocations}
    edges: list[tuple[int, int]] = []

    def footprints(index, alloc, written_only=False):
        """(itemsize, region) of each operand of instruction ``index`` on tile ``alloc`` (of
        its written operands only, with ``written_only``)."""
        ins = trace[index]
        operands = ins.writes if written_only else (*ins.reads, *ins.writes)
        return [(o.itemsize, region_of(o)) for o in operands if o.alloc_id == alloc]

    for key, members in families.items():
        d = depths[key] if key in depths else rotation_buffers(members, access, depth)[0]
        if len(members) <= d:
            continue
        occupants: list[int] = []
        for alloc in members:
            acc = access[alloc]
            first = acc[0][0]
            dead = [b for b, occ in enumerate(occupants) if access[occ][-1][0] < first]
            if len(occupants) < d or not dead:
                occupants.append(alloc)
                continue
            b = min(dead, key=lambda b: access[occupants[b]][-1][0])
            old = [i for i, _ in access[occupants[b]]]
            initial, later, read_seen = [], [], False
            for i, is_read in acc:
                if not read_seen:
                    initial.append(i)
                else:
                    written = footprints(i, alloc, written_only=True)
                    if written:          # a write, also one that reads the tile too
                        later.append((i, written))
                read_seen = read_seen or is_read
            edges.extend((p, s) for s in initial for p in old)
            if later:
                same_layout = size.get(alloc) is not None and size.get(alloc) == size.get(occupants[b])
                old_parts = [(p, footprints(p, occupants[b])) for p in old]
                for s, mine in later:
                    edges.extend(
                        (p, s) for p, theirs in old_parts
                        if not same_layout or any(ia != ib or ra.overlaps(rb) for ia, ra in mine for ib, rb in theirs))
            occupants[b] = alloc
    return edges


def buffer_families(trace, allocations) -> tuple[dict[int, list[tuple[int, bool]]], dict[tuple, list[int]]]:
    """(access, families): each on-chip tile's accesses in issue order, (instruction index,
    is a read), and the tiles without an explicit address grouped by family (core, buffer,
    site) in allocation order; tiles the kernel placed are its own layout and belong to
    none."""
    access: dict[int, list[tuple[int, bool]]] = {}
    for ins in trace:
        seen = set()
        for o in ins.reads:
            if o.buffer != "hbm" and o.alloc_id not in seen:
                seen.add(o.alloc_id)
                access.setdefault(o.alloc_id, []).append((ins.index, True))
        for o in ins.writes:
            if o.buffer != "hbm" and o.alloc_id not in seen:
                seen.add(o.alloc_id)
                access.setdefault(o.alloc_id, []).append((ins.index, False))
    families: dict[tuple, list[int]] = {}
    for a in allocations:
        # a placed tile's bytes are the kernel's choice, not the compiler's rotation
        if a.alloc_id in access and a.placed is None:
            families.setdefault((a.core, a.buffer, a.site), []).append(a.alloc_id)
    return access, families


def kept_alive(members, access) -> int:
    """The most tiles of ``members`` live at once in program order (first to last access)."""
    kept, ends = 1, []
    for lo, hi in sorted((access[m][0][0], access[m][-1][0]) for m in members):
        ends = [e for e in ends if e >= lo] + [hi]
        kept = max(kept, len(ends))
    return kept


def filled_together(members, access) -> int:
    """How many tiles of ``members`` one iteration of the program fills: runs of tiles first
    touched one after another, with no other access to the family between them, and of
    those run lengths the most frequent (the larger on a tie), so a pipeline's prologue,
    which fills several iterations' tiles at once, does not count. 1 for a loop's tile; a
    set's tiles, loaded before any is read; a block's x and residual."""
    runs, run = {}, 0
    for _, first in sorted((i, n == 0) for m in members for n, (i, _) in enumerate(access[m])):
        if first:
            run += 1
            continue
        if run:
            runs[run] = runs.get(run, 0) + 1
        run = 0
    if run:
        runs[run] = runs.get(run, 0) + 1
    return max(runs, key=lambda r: (runs[r], r)) if runs else 1


def rotation_buffers(members, access, depth: int) -> tuple[int, int, int]:
    """(buffers, kept alive, filled together) of one family at rotation ``depth``: the
    tiles the program keeps alive at once, plus ``depth`` - 1 more iterations' fills (the
    migration guide's "2 physical tiles" for a loop's tile, one iteration ahead), at most a
    buffer per tile."""
    kept = kept_alive(members, access)
    group = min(kept, filled_together(members, access))
    return min(len(members), kept + (depth - 1) * group), kept, group


def family_depths(families, access, allocations, depth: int, target: Target) -> dict[tuple, int]:
    """Buffers per family within the on-chip memory (rule 2's capacity).

    The compiler places every physical buffer of the tiles live at one point of the program
    in SBUF (bytes per partition) or PSUM (whole banks: "The allocation for PSUM tensors
    must start at the beginning of each bank", NKI 0.2 migration guide), so a family's
    rotation buffers must fit beside everything live with them. Each family starts at
    ``rotation_buffers`` and needs that much space; returns buffers per family. Where a
    point of the program needs more than the memory (less what placed tiles ever touch: the
    kernel's own layout), a family live there gives up one buffer, down to what the program
    itself keeps alive, until every point fits: among those with the most iterations
    buffered (buffers per iteration's fill), the one with the smallest tiles that still
    cover the excess, else the one with the largest (depths stay level and the fewest
    buffers are given up; the compiler's own choice is not documented). Without
    allocation sizes (hand-built traces) nothing changes."""
    units_of: dict[int, int] = {}
    reserved: dict[tuple, set] = {}
    reserved_bytes: dict[tuple, list] = {}
    for a in allocations:
        if a.buffer not in ("sbuf", "psum"):
            continue
        pool = (a.core, a.buffer)
        if a.placed is not None:
            _, _, b0, b1 = a.placed
            if a.buffer == "psum":
                reserved.setdefault(pool, set()).update(
                    range(b0 // target.psum_bank_bytes, (b1 - 1) // target.psum_bank_bytes + 1))
            else:
                reserved_bytes.setdefault(pool, []).append((b0, b1))
        elif a.nbytes is not None:
            units_of[a.alloc_id] = (-(-a.nbytes // target.psum_bank_bytes) if a.buffer == "psum"
                                    else int(a.nbytes))
    # every tile the compiler places belongs to a family (a lone tile is a family of one)
    fams: dict[tuple, list[int]] = dict(families)
    in_family = {m for members in families.values() for m in members}
    for a in allocations:
        if a.alloc_id in units_of and a.alloc_id in access and a.alloc_id not in in_family:
            fams[(a.core, a.buffer, ("tile", a.alloc_id))] = [a.alloc_id]
    # family -> (pool, units, span (first, last access: the first orders the families), kept
    # alive, filled together)
    info = {}
    depths = {}               # family -> buffers: rotation_buffers, then what the memory holds
    for key, members in fams.items():
        if any(m not in units_of for m in members):
            return {}                          # a hand-built trace: sizes unknown
        first = min(access[m][0][0] for m in members)
        last = max(access[m][-1][0] for m in members)
        depths[key], kept, group = rotation_buffers(members, access, depth)
        pool = (key[0], key[1])
        info[key] = (pool, max(units_of[m] for m in members), (first, last), kept, group)
    cap = {}
    for pool in {v[0] for v in info.values()}:
        if pool[1] == "psum":
            cap[pool] = target.psum_banks - len(reserved.get(pool, ()))
        else:
            cap[pool] = target.sbuf_bytes_per_partition - _covered(reserved_bytes.get(pool, []))

    def iterations(k):
        """Iterations a family's buffers hold: buffers per iteration's fill (a set of tiles
        counts as one, a pipeline's own lookahead counts)."""
        return depths[k] / info[k][4]

    for pool, limit in cap.items():
        keys = [k for k, v in info.items() if v[0] == pool]
        while True:
            points = sorted({info[k][2][0] for k in keys})
            worst, worst_t = 0, None
            for t in points:
                need = sum(info[k][1] * depths[k] for k in keys
                           if info[k][2][0] <= t <= info[k][2][1])
                if need > worst:
                    worst, worst_t = need, t
            if worst <= limit:
                break
            live = [k for k in keys if info[k][2][0] <= worst_t <= info[k][2][1]
                    and depths[k] > info[k][3]]
            if not live:
                break                          # the program itself keeps this much alive
            # among the sites with the most iterations buffered, the one with the smallest
            # tiles that cover the excess, else the largest (the later allocated on a tie):
            # depths stay level and the fewest buffers are given up
            top = max(iterations(k) for k in live)
            live = [k for k in live if iterations(k) == top]
            excess = worst - limit
            covering = [k for k in live if info[k][1] >= excess]
            k = (min(covering, key=lambda k: (info[k][1], -info[k][2][0])) if covering
                 else max(live, key=lambda k: (info[k][1], info[k][2][0])))
            depths[k] -= 1
    return depths


def _covered(ranges):
    """Length covered by half-open ranges [(a, b), ...] in any order: the bytes of placed SBUF
    tiles (any partitions), the seconds TensorE was busy in a window."""
    covered, end = 0, float("-inf")
    for b0, b1 in sorted(ranges):
        if b1 > end:
            covered += b1 - max(b0, end)
            end = b1
    return covered


@dataclass(frozen=True, slots=True)
class Slot:
    """One piece of work on one lane (an instruction, or one queue's share of a DMA)."""

    index: int            # instruction index in the trace
    op: str
    engine: str           # "tensor" | "vector" | "scalar" | "gpsimd" | "dma"
    lane: str             # engine name, or "dma_q<k>" for DMA queue k ("core1/..." on core 1)
    start: float          # seconds: when the lane starts the work (DMA: when data starts moving)
    end: float            # seconds: when the work ends


@dataclass
class Schedule:
    slots: list[Slot]
    start: list[float]                   # per instruction: start (seconds)
    finish: list[float]                  # per instruction: completion (seconds)
    latency: float                       # completion of the last instruction (seconds)
    engine_busy: dict[str, float]        # seconds; "dma" = mean busy time of the DMA queues
    queue_busy: list[float]              # seconds per DMA queue (core 0's, then core 1's...)
    hbm_bytes: int
    dma_bytes: int
    lanes: list[str] = field(default_factory=list)  # every lane name, in display order
    costs: list = field(default_factory=list, repr=False)  # InstructionCost | DmaCost per instruction
    ready: list[float] = field(default_factory=list, repr=False)  # when dependencies were met
    # per physical core: its engines' busy seconds ("dma" = mean over its queues) and the
    # completion of its last instruction
    core_busy: dict[int, dict[str, float]] = field(default_factory=dict)
    core_finish: dict[int, float] = field(default_factory=dict)
    # per physical core: seconds TensorE's current throttle added to its instructions
    # (hardware.py tensor_throttle_*; 0 where the target has none)
    tensor_throttle: dict[int, float] = field(default_factory=dict)
    # the trace's conflicts when this schedule found them (re-schedules of the trace reuse
    # them: cost/uncertainty.py)
    conflicts: "Conflicts | None" = field(default=None, repr=False, compare=False)

    def detail(self, index: int) -> dict:
        """What the model charged instruction ``index`` (for traces and debugging)."""
        c = self.costs[index]
        common = {"ready_us": self.ready[index] * 1e6, "start_us": self.start[index] * 1e6,
                  "finish_us": self.finish[index] * 1e6}
        if hasattr(c, "queues"):
            return {"bytes": c.bytes, "queues": c.queues, "bytes_per_queue": round(c.bytes_per_queue),
                    "descriptors": c.descriptors, "rule": c.rule, "latency_us": c.latency_seconds * 1e6,
                    "gap_us": c.gap_seconds * 1e6, "data_us_per_queue": c.data_seconds * 1e6, **common}
        return {"cycles": round(c.cycles, 1), "rule": c.rule, "lanes": c.lanes, **common}


class _Lane:
    __slots__ = ("name", "free_at", "waiting", "backlog", "busy", "running", "last_end", "recent",
                 "burst_start", "burst_busy")

    def __init__(self, name: str):
        self.name = name
        self.free_at = 0.0
        self.waiting: list = []      # heap of (instruction index, payload)
        self.backlog = 0.0           # seconds of work waiting (DMA queue choice)
        self.busy = 0.0              # seconds the lane had work (union of its intervals)
        self.running = False
        self.last_end = 0.0          # end of the latest interval counted in busy
        # TensorE's throttle (hardware.py tensor_throttle_*): its (start, end, utilization)
        # intervals of the last window, in start order; when the current burst began; busy
        # seconds before it
        self.recent: list = []
        self.burst_start = None
        self.burst_busy = 0.0


def throttled_seconds(work: float, progress: float, target: Target, utilization: float = 1.0) -> float:
    """Seconds TensorE takes for ``work`` seconds of full-rate work when it has been busy
    ``progress`` seconds in the current burst: the utilization limit starts at
    target.tensor_throttle_start_rate and rises linearly to 1 over the burst's first
    target.tensor_throttle_ramp_s of busy time (hardware.py [X]). An instruction that uses
    ``utilization`` of the peak at its full rate runs at min(1, limit / utilization) of it:
    one under the limit is not slowed; past the ramp the work takes its own time."""
    f0, ramp = target.tensor_throttle_start_rate, target.tensor_throttle_ramp_s
    if f0 is None or progress >= ramp or work <= 0.0:
        return work
    u = min(1.0, utilization)
    rate0 = f0 + (1.0 - f0) * progress / ramp          # the limit now
    if rate0 >= u:
        return work
    left = (u - rate0) * ramp / (1.0 - f0)             # seconds until the limit reaches u
    in_ramp = left * (rate0 + u) / (2.0 * u)           # full-rate work done by then
    if work >= in_ramp:
        return left + (work - in_ramp)
    a = (1.0 - f0) / (2.0 * ramp)                      # u * work(t) = rate0 t + a t^2
    return (-rate0 + math.sqrt(rate0 * rate0 + 4.0 * a * u * work)) / (2.0 * a)


def _tensor_burst(lane: _Lane, now: float, target: Target) -> float:
    """TensorE work done in the current burst before ``now`` (seconds), starting a new burst
    at ``now`` when the engine's utilization over the last window (counted from the burst's
    start while the burst is younger than a window) was under the release utilization."""
    window = target.tensor_throttle_window_s
    lane.recent = [iv for iv in lane.recent if iv[1] > now - window]
    if lane.burst_start is not None:
        w0 = max(now - window, lane.burst_start)
        if now > w0:
            if target.tensor_throttle_by_flops:
                # the peak's fraction TensorE was asked for over the window: each interval at
                # its instruction's utilization at full rate (not the throttled rate, or a
                # burst that starts under the limit could never count as busy enough)
                busy = sum((min(b, now) - max(a, w0)) * u for a, b, u in lane.recent if min(b, now) > max(a, w0))
            else:
                busy = _covered((max(a, w0), min(b, now)) for a, b, _ in lane.recent if min(b, now) > max(a, w0))
            if busy / (now - w0) < target.tensor_throttle_release_utilization:
                lane.burst_start = None
    if lane.burst_start is None:
        lane.burst_start, lane.burst_busy = now, lane.busy
    return lane.busy - lane.burst_busy


def _core(ins) -> int:
    return int(ins.attrs.get("core", 0) or 0)


def _pe_cells(tile, target: Target) -> frozenset:
    """The cells of TensorE's PE array a tile occupies (``tile`` = (start row, start column,
    rows, columns), as nc_matmul records it in ``attrs["tile"]``), in cells of the smallest
    tile size; ``None`` (a transpose, a hand-built trace) is the whole array."""
    g = min(target.matmul_tile_sizes)
    r0, c0, rows, cols = tile or (0, 0, target.matmul_rows, target.matmul_columns)
    return frozenset((r, c) for r in range(r0 // g, (r0 + rows) // g) for c in range(c0 // g, (c0 + cols) // g))


def _dma_site_queues(trace, allocations, target: Target) -> dict[int, int]:
    """{DMA instruction index: its queue on every engine it uses}: the allocation site of
    its SBUF side (destination first), sites numbered in order of first use, modulo
    ``target.dma_site_queues`` (hardware.py); transfers with no SBUF side share queue 0."""
    queues = max(1, int(target.dma_site_queues))
    site_of = {a.alloc_id: (a.site, a.core) for a in allocations or ()}
    numbers: dict = {}
    queue_of = {}
    for ins in trace:
        if ins.engine != "dma":
            continue
        key = None
        if queues > 1:
            for o in list(ins.writes) + list(ins.reads):
                if o.buffer == "sbuf" and o.alloc_id in site_of:
                    key = site_of[o.alloc_id]
                    break
        if key is None:
            queue_of[ins.index] = 0
            continue
        if key not in numbers:
            numbers[key] = len(numbers)
        queue_of[ins.index] = numbers[key] % queues
    return queue_of


def schedule(trace, target: Target, allocations=None, preds=None) -> Schedule:
    """List-schedule ``trace`` (instructions in issue order) on ``target``; ``allocations``
    (where each on-chip tile was allocated) turns on finite buffering. ``preds``: the
    trace's ``dependencies(trace, target, allocations)`` when already computed for this
    ``target`` (its latencies, buffer depth, memory sizes and beta-1 flag shape them)."""
    trace = list(trace)
    n = len(trace)
    found_conflicts = None
    if preds is None:
        found_conflicts = conflicts(trace, allocations)
        preds = dependencies(trace, target, allocations, found_conflicts)
    succs: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    missing = [0] * n
    for i, mine in enumerate(preds):
        missing[i] = len(mine)
        for p, lat in mine.items():
            succs[p].append((i, lat))

    # Lanes: per physical core (kernel[2] traces tag instructions with attrs["core"]).
    cores: dict[int, tuple[dict[str, _Lane], list[_Lane]]] = {}

    def core_lanes(core: int):
        if core not in cores:
            prefix = "" if core == 0 else f"core{core}/"
            cores[core] = ({e: _Lane(prefix + e) for e in COMPUTE_ENGINES},
                           [_Lane(f"{prefix}dma_q{k}") for k in range(target.dma_queues)])
        return cores[core]

    core_lanes(0)
    for ins in trace:
        core_lanes(_core(ins))
    # Two cores streaming at once share one HBM stack (static share: both assumed active).
    dma_cores = {_core(ins) for ins in trace if ins.engine == "dma"}
    hbm_share = target.hbm_share(len(dma_cores))
    costs = []
    hbm_bytes = dma_bytes = 0
    for ins in trace:
        if ins.engine == "dma":
            touches_hbm = any(o.buffer == "hbm" for o in list(ins.reads) + list(ins.writes))
            c = dma_cost(ins, target, hbm_share if touches_hbm else 1.0)
            hbm_bytes += c.hbm_bytes
            dma_bytes += c.bytes
        elif ins.engine in COMPUTE_ENGINES:
            c = compute_cost(ins, target)
        else:
            raise CostModelError(f"instruction {ins.index} ({ins.op}): engine={ins.engine!r}; "
                                 "expected tensor, vector, scalar, gpsimd or dma")
        costs.append(c)

    site_queue_of = _dma_site_queues(trace, allocations, target)
    site_queue_free: dict[tuple[str, int], float] = {}   # (DMA engine lane, queue): next start allowed
    n_site_queues = len(set(site_queue_of.values()))
    ready_at = [0.0] * n
    start = [0.0] * n
    finish = [0.0] * n
    shares_left = [0] * n
    slots: list[Slot] = []
    # events: (time, kind, seq, payload); kind 0 lane free, 1 instruction ready, 2 DMA share
    # done, 3 compute instruction done, 4 DMA trigger latency over (goes to its queues),
    # 5 a core's descriptor generator free (payload: the core).
    # Events pushed for `now` while handling `now` (zero-latency successors) are handled in
    # the same round, before idle lanes pick work.
    events: list = []
    seq = 0

    def push(time, kind, payload):
        nonlocal seq
        heapq.heappush(events, (time, kind, seq, payload))
        seq += 1

    for i in range(n):
        if missing[i] == 0:
            push(0.0, 1, i)

    touched: set = set()
    pe_free: dict[tuple[int, tuple[int, int]], float] = {}   # (core, PE cell): when its matmul ends
    # per TensorE instruction, the PE cells it holds (tiling mode), found once
    pe_cells = [_pe_cells(ins.attrs.get("tile"), target)
                if ins.engine == "tensor" and target.matmul_tiles_parallel else None for ins in trace]
    n_pe_cells = len(_pe_cells(None, target))
    # per TensorE instruction, the share of the peak it uses at its own rate (the throttle)
    by_flops = target.tensor_throttle_start_rate is not None and target.tensor_throttle_by_flops
    tensor_util = [tensor_utilization(ins, target, costs[i].cycles)
                   if by_flops and ins.engine == "tensor" else 1.0 for i, ins in enumerate(trace)]
    # VectorE's pipeline overlap (hardware.py: vector_overlap_cycles, capped at the fixed cost)
    overlap_s = {"vector": min(target.vector_overlap_cycles, target.vector_static_cycles)
                 / engine_hz(target, "vector")}
    throttle_s: dict[int, float] = {}   # per core: seconds TensorE's throttle added

    generation_s = target.dma_descriptor_generation_s
    generator_waiting: dict[int, list] = {}   # per core: (issue index, release time) of released transfers
    generator_busy: set[int] = set()          # cores whose generator is making a descriptor
    generator_touched: set[int] = set()       # cores whose generator may start one this round

    def generate(core: int, now: float) -> None:
        """The core's generator, if free, starts the earliest-issued waiting transfer."""
        if core in generator_busy or not generator_waiting.get(core):
            return
        i, released = heapq.heappop(generator_waiting[core])
        made = now + generation_s
        generator_busy.add(core)
        push(max(released + costs[i].latency_seconds, made), 4, i)
        push(made, 5, core)

    def release(i: int, now: float) -> None:
        ins = trace[i]
        c = costs[i]
        if ins.engine == "dma":
            start[i] = float("inf")
            if generation_s > 0:
                # waits for the core's generator (started once this round's releases are in)
                heapq.heappush(generator_waiting.setdefault(_core(ins), []), (i, now))
                generator_touched.add(_core(ins))
            else:
                push(now + c.latency_seconds, 4, i)
        else:
            lane = core_lanes(_core(ins))[0][ins.engine]
            heapq.heappush(lane.waiting, (i, c.seconds))
            touched.add(lane)

    def enqueue_dma(i: int, now: float) -> None:
        c = costs[i]
        occ = c.data_seconds + c.handoff_seconds   # the engine's bandwidth; the gap is the queue's
        queues = core_lanes(_core(trace[i]))[1]
        sq = site_queue_of[i]
        chosen = sorted(queues, key=lambda q: (max(q.free_at, site_queue_free.get((q.name, sq), 0.0), now)
                                               + q.backlog, q.name))[: c.queues]
        shares_left[i] = len(chosen)
        for q in chosen:
            heapq.heappush(q.waiting, (i, occ))
            q.backlog += c.occupancy_seconds
            touched.add(q)

    def complete(i: int, now: float) -> None:
        finish[i] = now
        for s, lat in succs[i]:
            t = now + lat
            if t > ready_at[s]:
                ready_at[s] = t
            missing[s] -= 1
            if missing[s] == 0:
                push(ready_at[s], 1, s)

    def next_share(lane: _Lane, now: float):
        """The first-issued waiting share whose queue may start now (shares of one queue
        leave in issue order; another queue's may pass a blocked one: round robin)."""
        held = []
        blocked: set[int] = set()
        found = None
        while lane.waiting and len(blocked) < n_site_queues:
            item = heapq.heappop(lane.waiting)
            sq = site_queue_of[item[0]]
            if sq not in blocked and site_queue_free.get((lane.name, sq), 0.0) <= now:
                found = item
                break
            blocked.add(sq)
            held.append(item)
        for item in held:
            heapq.heappush(lane.waiting, item)
        if found is None:   # every waiting queue is inside its gap: look again when one opens
            push(min(site_queue_free[(lane.name, site_queue_of[i])] for i, _ in held), 0, lane)
        return found

    def dispatch(lane: _Lane, now: float) -> None:
        if lane.running or not lane.waiting or lane.free_at > now:
            return
        if trace[lane.waiting[0][0]].engine == "dma":
            item = next_share(lane, now)
            if item is None:
                return
            i, occ = item
            c = costs[i]
            # the queue is held for max(gap, data + hand-over); the engine only for the data
            queue_end = now + c.occupancy_seconds
            site_queue_free[(lane.name, site_queue_of[i])] = queue_end
            lane.running = True
            lane.busy += max(0.0, queue_end - max(now, lane.last_end))
            lane.last_end = max(lane.last_end, queue_end)
            lane.free_at = now + occ
            lane.backlog -= c.occupancy_seconds
            done = now + c.data_seconds
            if now < start[i]:
                start[i] = now
            slots.append(Slot(i, trace[i].op, "dma", lane.name, now, done))
            push(now + occ, 0, lane)
            push(done, 2, i)
            return
        i, occ = lane.waiting[0]
        ins = trace[i]
        cells = pe_cells[i]
        if cells is not None:
            # tiling mode: a matmul starts once its PE tile is free; one on a tile smaller than
            # the array leaves the other tiles to the next instructions at once
            core = _core(ins)
            tiles_free = max(pe_free.get((core, cell), 0.0) for cell in cells)
            if tiles_free > now:
                lane.running = True
                push(tiles_free, 0, lane)
                return
        heapq.heappop(lane.waiting)
        if ins.engine == "tensor" and target.tensor_throttle_start_rate is not None:
            full, u = occ, tensor_util[i]
            occ = throttled_seconds(full, _tensor_burst(lane, now, target), target, u)
            throttle_s[_core(ins)] = throttle_s.get(_core(ins), 0.0) + occ - full
            lane.recent.append((now, now + occ, u))
        lane.running = True
        lane.busy += max(0.0, now + occ - max(now, lane.last_end))
        lane.last_end = max(lane.last_end, now + occ)
        start[i] = now
        slots.append(Slot(i, ins.op, ins.engine, lane.name, now, now + occ))
        # the lane takes its next (necessarily independent) instruction early
        lane.free_at = now + occ - overlap_s.get(ins.engine, 0.0)
        if cells is not None:
            for cell in cells:
                pe_free[(core, cell)] = now + occ
            if len(cells) < n_pe_cells:
                lane.free_at = now
        push(lane.free_at, 0, lane)
        push(now + occ, 3, i)

    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, _, payload = heapq.heappop(events)
            if kind == 0:
                payload.running = False
                touched.add(payload)
            elif kind == 1:
                release(payload, now)
            elif kind == 2:
                shares_left[payload] -= 1
                if shares_left[payload] == 0:
                    complete(payload, now)
            elif kind == 4:
                enqueue_dma(payload, now)
            elif kind == 5:
                generator_busy.discard(payload)
                generator_touched.add(payload)
            else:
                complete(payload, now)
        for core in sorted(generator_touched):
            generate(core, now)
        generator_touched.clear()
        for lane in sorted(touched, key=lambda l: l.name):
            dispatch(lane, now)
        touched.clear()

    if any(m > 0 for m in missing):
        raise CostModelError("dependency cycle in the trace (an instruction never became ready)")

    latency = max(finish, default=0.0)
    n_cores = len(cores)
    core_busy = {}
    for k, (engines, queues) in sorted(cores.items()):
        b = {e: engines[e].busy for e in COMPUTE_ENGINES}
        b["dma"] = sum(q.busy for q in queues) / len(queues)
        core_busy[k] = b
    core_finish = {k: 0.0 for k in cores}
    for ins in trace:
        k = _core(ins)
        core_finish[k] = max(core_finish[k], finish[ins.index])
    busy = {e: sum(b[e] for b in core_busy.values()) / n_cores for e in COMPUTE_ENGINES + ("dma",)}
    queue_busy = [q.busy for c in cores.values() for q in c[1]]
    names = [lane.name for c in cores.values() for lane in list(c[0].values()) + c[1]]
    return Schedule(slots, start, finish, latency, busy, queue_busy, hbm_bytes, dma_bytes, names,
                    costs, ready_at, core_busy, dict(sorted(core_finish.items())),
                    {k: throttle_s.get(k, 0.0) for k in sorted(cores)}, found_conflicts)

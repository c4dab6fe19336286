"""The list schedule: when each traced instruction runs on the modeled NeuronCore.

1. Dependencies. Walking the trace in issue order, an instruction depends on every
   earlier instruction that

   * wrote an overlapping part of an allocation it reads (read after write); when that
     producer ran on VectorE/ScalarE/GpSimd the consumer also waits the dependency
     latency (model.py);
   * read (write after read) or wrote (write after write) an overlapping part of an
     allocation it writes.

   Footprints are exact sets of element runs (regions.py).
2. List scheduling. Engines run in parallel, each one instruction at a time. Whenever an
   engine is idle it starts, among the instructions whose dependencies are done, the one
   issued first (the kernel's order is the priority; an independent later instruction
   may run ahead of a stalled earlier one, as the compiler's scheduler would hoist it).
   A DMA transfer, once ready, is split over ``queues`` of the 16 DMA queues (the ones
   with the least pending work); each queue serves its shares in issue order, occupying
   ``max(fixed, data)`` per share, and the transfer completes when its last share lands.

The modeled latency is the completion of the last instruction. Every allocation is its
own buffer: the model assumes the compiler gives each tile the buffers it needs (the
simulator checks that the live tiles fit SBUF/PSUM), so prefetching is limited only by the
dependencies a kernel expresses, e.g. by reusing one tile for every iteration.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

from ..hardware import Target
from .model import COMPUTE_ENGINES, CostModelError, compute_cost, dependency_latency_seconds, dma_cost
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


def dependencies(trace, target: Target) -> list[dict[int, float]]:
    """Per instruction: {predecessor index: extra latency in seconds}."""
    allocs: dict[int, _AllocState] = {}
    preds: list[dict[int, float]] = []
    engine_of: dict[int, str] = {}
    for pos, ins in enumerate(trace):
        if ins.index != pos:
            raise CostModelError(f"trace is not in issue order: position {pos} holds instruction {ins.index}")
        mine: dict[int, float] = {}
        reads = [(o.alloc_id, region_of(o)) for o in ins.reads]
        writes = [(o.alloc_id, region_of(o)) for o in ins.writes]
        for alloc, reg in reads:
            st = allocs.get(alloc)
            if st is not None:
                for p in st.writers_of(reg):
                    lat = dependency_latency_seconds(engine_of[p], target)
                    if mine.get(p, -1.0) < lat:
                        mine[p] = lat
        for alloc, reg in writes:
            st = allocs.get(alloc)
            if st is not None:
                for p in st.users_of(reg):
                    if p not in mine:
                        mine[p] = 0.0
        mine.pop(pos, None)
        for alloc, reg in reads:
            allocs.setdefault(alloc, _AllocState()).add_read(reg, pos)
        for alloc, reg in writes:
            allocs.setdefault(alloc, _AllocState()).add_write(reg, pos)
        engine_of[pos] = ins.engine
        preds.append(mine)
    return preds


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

    def detail(self, index: int) -> dict:
        """What the model charged instruction ``index`` (for traces and debugging)."""
        c = self.costs[index]
        common = {"ready_us": self.ready[index] * 1e6, "start_us": self.start[index] * 1e6,
                  "finish_us": self.finish[index] * 1e6}
        if hasattr(c, "queues"):
            return {"bytes": c.bytes, "queues": c.queues, "bytes_per_queue": round(c.bytes_per_queue),
                    "fixed_us": c.fixed_seconds * 1e6, "data_us_per_queue": c.data_seconds * 1e6, **common}
        return {"cycles": round(c.cycles, 1), "rule": c.rule, "lanes": c.lanes, **common}


class _Lane:
    __slots__ = ("name", "free_at", "waiting", "backlog", "busy", "running")

    def __init__(self, name: str):
        self.name = name
        self.free_at = 0.0
        self.waiting: list = []      # heap of (instruction index, payload)
        self.backlog = 0.0           # seconds of work waiting (DMA queue choice)
        self.busy = 0.0
        self.running = False


def schedule(trace, target: Target) -> Schedule:
    """List-schedule ``trace`` (instructions in issue order) on ``target``."""
    trace = list(trace)
    n = len(trace)
    preds = dependencies(trace, target)
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
    costs = []
    hbm_bytes = dma_bytes = 0
    for ins in trace:
        core_lanes(int(ins.attrs.get("core", 0) or 0))
        if ins.engine == "dma":
            c = dma_cost(ins, target)
            hbm_bytes += c.hbm_bytes
            dma_bytes += c.bytes
        elif ins.engine in COMPUTE_ENGINES:
            c = compute_cost(ins, target)
        else:
            raise CostModelError(f"instruction {ins.index} ({ins.op}): engine={ins.engine!r}; "
                                 "expected tensor, vector, scalar, gpsimd or dma")
        costs.append(c)

    ready_at = [0.0] * n
    start = [0.0] * n
    finish = [0.0] * n
    shares_left = [0] * n
    slots: list[Slot] = []
    # events: (time, kind, seq, payload); kind 0 lane free, 1 instruction ready, 2 DMA share
    # done, 3 compute instruction done. Events pushed for `now` while handling `now` (zero-
    # latency successors) are handled in the same round, before idle lanes pick work.
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

    def release(i: int, now: float) -> None:
        ins = trace[i]
        lanes, queues = core_lanes(int(ins.attrs.get("core", 0) or 0))
        c = costs[i]
        if ins.engine == "dma":
            occ = c.occupancy_seconds
            chosen = sorted(queues, key=lambda q: (max(q.free_at, now) + q.backlog, q.name))[: c.queues]
            shares_left[i] = len(chosen)
            start[i] = float("inf")
            for q in chosen:
                heapq.heappush(q.waiting, (i, occ))
                q.backlog += occ
                touched.add(q)
        else:
            lane = lanes[ins.engine]
            heapq.heappush(lane.waiting, (i, c.seconds))
            touched.add(lane)

    def complete(i: int, now: float) -> None:
        finish[i] = now
        for s, lat in succs[i]:
            t = now + lat
            if t > ready_at[s]:
                ready_at[s] = t
            missing[s] -= 1
            if missing[s] == 0:
                push(ready_at[s], 1, s)

    def dispatch(lane: _Lane, now: float) -> None:
        if lane.running or not lane.waiting or lane.free_at > now:
            return
        i, occ = heapq.heappop(lane.waiting)
        ins = trace[i]
        lane.running = True
        lane.busy += occ
        lane.free_at = now + occ
        if ins.engine == "dma":
            c = costs[i]
            lane.backlog -= occ
            data_start = now + c.fixed_seconds
            done = data_start + c.data_seconds
            if now < start[i]:
                start[i] = now
            slots.append(Slot(i, ins.op, "dma", lane.name, data_start, done))
            push(now + occ, 0, lane)
            push(done, 2, i)
        else:
            start[i] = now
            slots.append(Slot(i, ins.op, ins.engine, lane.name, now, now + occ))
            push(now + occ, 0, lane)
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
            else:
                complete(payload, now)
        for lane in sorted(touched, key=lambda l: l.name):
            dispatch(lane, now)
        touched.clear()

    if any(m > 0 for m in missing):
        raise CostModelError("dependency cycle in the trace (an instruction never became ready)")

    latency = max(finish, default=0.0)
    n_cores = len(cores)
    busy = {e: sum(c[0][e].busy for c in cores.values()) / n_cores for e in COMPUTE_ENGINES}
    queue_busy = [q.busy for c in cores.values() for q in c[1]]
    busy["dma"] = sum(queue_busy) / len(queue_busy)
    names = [lane.name for c in cores.values() for lane in list(c[0].values()) + c[1]]
    return Schedule(slots, start, finish, latency, busy, queue_busy, hbm_bytes, dma_bytes, names,
                    costs, ready_at)

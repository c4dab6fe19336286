"""``estimate_trace(trace, target)``: model an instruction trace; the ``Estimate`` result.

The result is an :class:`Estimate`: MODELED numbers for one NeuronCore of the target,
derived from the exact instruction stream a kernel issued in the simulator (see model.py
for the per-instruction rules and schedule.py for the schedule). They are estimates, never
measurements: label them "modeled (<target>)" wherever they are shown. Running a kernel
and modeling it in one call is ``simulator.estimate`` (the cost model never imports the
interpreter).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..hardware import DEFAULT_TARGET, Target, get_target
from .model import ENGINES
from .schedule import Schedule, schedule

_LANE_TITLES = {"tensor": "TensorE", "vector": "VectorE", "scalar": "ScalarE", "gpsimd": "GpSimdE"}


@dataclass
class Estimate:
    """Modeled execution of one kernel call on ``target`` (one NeuronCore, or the two
    physical cores of a kernel[2] launch: latency = the later core)."""

    target: str
    latency_us: float                    # modeled: completion of the last instruction
    engine_busy_us: dict[str, float]     # modeled busy time per engine ("dma" = mean over the queues;
                                         # at LNC=2 the mean over the cores: see core_busy_us)
    hbm_bytes: int                       # bytes DMA moved to or from HBM
    flops: int                           # sum of the trace's FLOPs (2*K*M*N per matmul, elements otherwise)
    matmul_flops: int                    # FLOPs of nc_matmul instructions (transposes excluded)
    instruction_counts: dict[str, int]   # per ISA op name
    engine_instruction_counts: dict[str, int]
    outputs: Any = None                  # the kernel's outputs (as nki.simulate returns them)
    dma_queue_busy_us: list[float] = field(default_factory=list)
    schedule: Schedule | None = field(default=None, repr=False)
    trace: list | None = field(default=None, repr=False)   # the modeled Instruction records
    # per physical core (one entry at LNC=1): busy us per engine ("dma" = mean over its
    # queues) and the completion of the core's last instruction
    core_busy_us: dict[int, dict[str, float]] = field(default_factory=dict)
    core_latency_us: dict[int, float] = field(default_factory=dict)
    allocations: list | None = field(default=None, repr=False)  # where tiles were allocated
    # modeled fixed cost of the launch itself (Target.launch_overhead_s, + second_core_launch_s
    # on two cores): not in latency_us; add it to compare with a whole-launch measurement
    launch_us: float = 0.0

    @property
    def cores(self) -> int:
        """Physical cores the trace ran on (2 for a kernel[2] launch)."""
        return max(1, len(self.core_latency_us))

    @property
    def imbalance(self) -> float:
        """Idle fraction of the less loaded core: 1 - (its completion / the later core's).
        0.0 at LNC=1 and for perfectly balanced cores; 1.0 when a core had nothing to do."""
        if len(self.core_latency_us) < 2 or self.latency_us <= 0:
            return 0.0
        return 1.0 - min(self.core_latency_us.values()) / max(self.core_latency_us.values())

    @property
    def bottleneck(self) -> str:
        """The engine with the most busy time (ties: the first of tensor, vector, scalar, gpsimd, dma)."""
        return max(ENGINES, key=lambda e: (self.engine_busy_us.get(e, 0.0), -ENGINES.index(e)))

    @property
    def utilization(self) -> dict[str, float]:
        """Busy time / latency per engine (0..1)."""
        if self.latency_us <= 0:
            return {e: 0.0 for e in ENGINES}
        return {e: self.engine_busy_us.get(e, 0.0) / self.latency_us for e in ENGINES}

    @property
    def instructions(self) -> int:
        return sum(self.instruction_counts.values())

    def summary(self) -> str:
        """A few human-readable lines, every number labelled as modeled."""
        util = self.utilization
        busy = ", ".join(f"{e} {self.engine_busy_us[e]:.2f} ({util[e]:.0%})" for e in ENGINES)
        text = (f"modeled ({self.target}): latency {self.latency_us:.2f} us, bound by {self.bottleneck}; "
                f"busy us: {busy}; HBM {self.hbm_bytes / 1e6:.3f} MB; "
                f"{self.flops / 1e9:.3f} GFLOP; {self.instructions} instructions")
        if self.cores > 1:
            per = "; ".join(f"core {k} {t:.2f} us" for k, t in self.core_latency_us.items())
            text += f"; {self.cores} cores: {per}, imbalance {self.imbalance:.0%}"
        return text

    def to_chrome_trace(self, path, max_events: int = 200_000) -> Path:
        """Write the modeled timeline as Chrome trace-event JSON (open it in Perfetto).

        One process per physical core (two for a kernel[2] launch), one lane (thread) per
        engine and per DMA queue of that core; each
        instruction is a complete ("X") event with its op, operands' cost rule and cycles.
        Timestamps are microseconds of modeled time. At most ``max_events`` instruction
        events are written (the earliest ones); ``otherData.truncated`` says if any were cut.
        """
        if self.schedule is None:
            raise ValueError("this Estimate has no schedule to export (it was built without one)")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        lanes = self.schedule.lanes
        pid = {name: _lane_core(name) + 1 for name in lanes}
        tid = {name: i + 1 for i, name in enumerate(lanes)}
        events: list[dict] = []
        for core in sorted(set(pid.values())):
            latency = self.core_latency_us.get(core - 1, self.latency_us)
            events.append({"ph": "M", "pid": core, "name": "process_name",
                           "args": {"name": f"NeuronCore {core - 1} ({self.target}, modeled, "
                                            f"{latency:.2f} us)"}})
            events.append({"ph": "M", "pid": core, "name": "process_sort_index",
                           "args": {"sort_index": core}})
        for name in lanes:
            _, _, base = name.rpartition("/")
            title = _LANE_TITLES.get(base, base.replace("dma_q", "DMA queue "))
            events.append({"ph": "M", "pid": pid[name], "tid": tid[name], "name": "thread_name",
                           "args": {"name": title}})
            events.append({"ph": "M", "pid": pid[name], "tid": tid[name], "name": "thread_sort_index",
                           "args": {"sort_index": tid[name]}})
        seen: set[int] = set()
        slots = sorted(self.schedule.slots, key=lambda s: (s.start, s.index))
        truncated = len(slots) > max_events
        for s in slots[:max_events]:
            if s.index in seen:  # later shares of a DMA: the first carries the details
                args = {"instruction": s.index}
            else:
                seen.add(s.index)
                args = {"instruction": s.index, **self.schedule.detail(s.index)}
                if self.trace is not None:
                    ins = self.trace[s.index]
                    args["reads"] = [_describe(o) for o in ins.reads]
                    args["writes"] = [_describe(o) for o in ins.writes]
            events.append({
                "ph": "X", "pid": pid[s.lane], "tid": tid[s.lane], "name": s.op, "cat": s.engine,
                "ts": s.start * 1e6, "dur": max(s.end - s.start, 0.0) * 1e6, "args": args,
            })
        doc = {
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": {
                "what": "MODELED timeline from the nki_kernels cost model (not a measurement)",
                "target": self.target,
                "latency_us": self.latency_us,
                "engine_busy_us": self.engine_busy_us,
                "bottleneck": self.bottleneck,
                "core_latency_us": {str(k): v for k, v in self.core_latency_us.items()},
                "core_busy_us": {str(k): v for k, v in self.core_busy_us.items()},
                "imbalance": self.imbalance,
                "truncated": truncated,
            },
        }
        path.write_text(json.dumps(doc))
        return path


def _lane_core(name: str) -> int:
    """Core of a schedule lane: "core1/vector" -> 1, "vector" -> 0."""
    prefix, _, _ = name.rpartition("/")
    return int(prefix.removeprefix("core")) if prefix else 0


def _describe(o) -> str:
    return f"{o.role}: {o.buffer} {o.dtype} {list(o.shape)}"


def estimate_trace(trace, target: str | Target = DEFAULT_TARGET, outputs: Any = None,
                   allocations=None, preds=None) -> Estimate:
    """Model an instruction trace (a list of ``trace.Instruction``) on ``target``.

    ``allocations``: where each on-chip tile was allocated (``SimResult.allocations``),
    for finite buffering; without it every allocation is its own buffer. ``preds``: the
    schedule's dependencies when already computed (schedule.dependencies)."""
    tgt = get_target(target)
    trace = list(trace)
    sched = schedule(trace, tgt, allocations, preds)
    ops = Counter(ins.op for ins in trace)
    engines = Counter(ins.engine for ins in trace)
    cores = max(1, len(sched.core_finish))
    return Estimate(
        target=tgt.name,
        latency_us=sched.latency * 1e6,
        engine_busy_us={e: sched.engine_busy.get(e, 0.0) * 1e6 for e in ENGINES},
        hbm_bytes=sched.hbm_bytes,
        flops=sum(int(ins.flops) for ins in trace),
        matmul_flops=sum(int(ins.flops) for ins in trace
                         if ins.op == "nc_matmul" and not ins.attrs.get("is_transpose", False)),
        instruction_counts=dict(sorted(ops.items())),
        engine_instruction_counts={e: engines.get(e, 0) for e in ENGINES},
        outputs=outputs,
        dma_queue_busy_us=[b * 1e6 for b in sched.queue_busy],
        schedule=sched,
        trace=trace,
        core_busy_us={k: {e: v * 1e6 for e, v in b.items()} for k, b in sched.core_busy.items()},
        core_latency_us={k: v * 1e6 for k, v in sched.core_finish.items()},
        allocations=allocations,
        launch_us=(tgt.launch_overhead_s + (cores - 1) * tgt.second_core_launch_s) * 1e6,
    )

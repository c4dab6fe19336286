#!/usr/bin/env python
"""The main job (`make demo`): every kernel on its workload grid, run in the bundled NKI
simulator on CPU, checked against the PyTorch reference, and MODELED on a Trainium target
(``--target``, default trn2, at the ``--lnc`` degree, default the target's: 2 on trn2/trn3).

For each op of the registry (``nki_kernels.registry.ops()``) and each of its workloads it

1. builds the op's NKI launch with the op's ``kernel_call``,
2. runs the kernel in the simulator (``simulator.estimate``), which records every
   instruction it issues, and compares the result with the op's PyTorch twin computed on
   CPU in float64 (float32 for the largest attention shapes): max |kernel - reference|;
3. models that instruction stream on the target's logical core, both NeuronCores at LNC=2
   (simulator/cost/: per-instruction costs, list schedule over the engines and each core's 16
   DMA queues);
4. computes the op's limit and the modeled eager-PyTorch baseline (the op's ``roofline``,
   nki_kernels/roofline.py): efficiency = limit / modeled, speedup = eager / modeled.

Outputs (``--out``, default out/report): report.csv, report.md, report.png and one Chrome
trace per row under traces/ (open in https://ui.perfetto.dev). Nothing here ran on a
Trainium: kernel/limit/eager times are MODELED (trn2); errors and wall times are MEASURED
(CPU).

Backward rows: an op with a backward kernel (``OpSpec.backward``) gets a row "<op> backward"
after each forward row, on the same workload: the backward kernel, its limit, and the
modeled EAGER-AUTOGRAD baseline (the ATen ops autograd runs for the op's backward, each at
its own limit, every intermediate through HBM).

Usage: python benchmarks/model_report.py [--ops scaled_dot_product_attention,rms_norm] [--quick] [--out DIR]
       [--target trn2|trn3|trn1] [--lnc 1|2] [--no-traces]
(the full grid takes about 3 min on 2 CPU cores, --quick about 45 s; measured, CPU, 2026-12-05)
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
import time
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from nki_kernels import _dispatch, registry, simulator

sys.path.insert(0, str(Path(__file__).resolve().parent))    # benchmarks/: its shared script support
import script_support  # noqa: E402
from nki_kernels.simulator.hardware import TARGETS, get_target
from nki_kernels.simulator.cost import estimate_trace, time_range, variant
from nki_kernels.simulator.cost.uncertainty import ENDS, end_latencies

MODELED = "modeled (trn2)"
MEASURED = "measured (CPU)"
HOST_CPU = script_support.cpu_name()
# max |out - ref| allowed per dtype for the report's check (the tests hold the strict ones):
# bf16 outputs carry a final rounding of 2**-8 relative on values of magnitude up to ~4-8.
CHECK_TOL = {torch.bfloat16: (6e-2, 2e-2), torch.float16: (1e-2, 1e-2), torch.float32: (1e-3, 1e-3)}
EFFICIENCY_TARGET = 0.6
EFFICIENCY_TARGET_LARGE_MEMORY_BOUND = 0.8
# LNC=2 rows whose two cores finish more than this far apart (idle fraction of the core that
# finishes first) are flagged as unbalanced.
IMBALANCE_FLAG = 0.10


@dataclass(frozen=True)
class Case:
    """One row of the report: an op of the registry on one of its workloads."""

    spec: registry.OpSpec
    workload: registry.Workload
    backward: bool = False             # the op's backward kernel (spec.backward) on this workload

    @property
    def op(self) -> str:
        return self.spec.name + (" backward" if self.backward else "")

    def _pieces(self):
        return self.spec.backward if self.backward else self.spec

    def inputs(self, gen: torch.Generator) -> tuple[tuple, dict]:
        """The arguments of the row's op: the workload's (forward), or the backward op's
        made from them (fresh output gradients plus the saved tensors)."""
        args, kwargs = self.workload.make(gen)
        return self.spec.backward.inputs(gen, args, kwargs) if self.backward else (args, kwargs)

    @property
    def speedup_target(self) -> float | None:
        """The workload's speedup target; a backward row's from ``Backward.speedup_targets``
        (by workload name), else none."""
        if self.backward:
            return self.spec.backward.speedup_targets.get(self.workload.name)
        return self.workload.speedup_target

    def kernel_call(self, *args, **kwargs):
        return self._pieces().kernel_call(*args, **kwargs)

    def reference(self, *args, **kwargs):
        return self._pieces().reference(*args, **kwargs)

    def roofline(self, *args, **kwargs):
        return self._pieces().roofline(*args, **kwargs)

    @property
    def name(self) -> str:
        return self.workload.name

    @property
    def slug(self) -> str:
        safe = "".join(c if c.isalnum() else "_" for c in f"{self.op}_{self.name}")
        return "_".join(filter(None, safe.split("_")))


def grid(quick: bool) -> list[Case]:
    """Every (op, workload) of the registry, each followed by its backward row where the op
    has a backward kernel; with ``quick``, the workloads marked quick."""
    return [Case(spec, w, backward) for spec in registry.ops() for w in spec.workloads if w.quick or not quick
            for backward in ((False, True) if _backward_covers(spec, w) else (False,))]


def _backward_covers(spec: registry.OpSpec, workload: registry.Workload) -> bool:
    """Whether the op's backward kernel takes this workload (shapes only: made on meta)."""
    if spec.backward is None or workload.inference_only:
        return False
    args, kwargs = workload.make(torch.Generator().manual_seed(0))
    return spec.backward.covers(args, kwargs)


# ----------------------------------------------------------------------------- one case

@dataclass
class Row:
    case: Case
    status: str = "ok"                 # ok | skipped | error | mismatch
    note: str = ""
    max_abs_err: float = float("nan")  # measured (CPU)
    sim_wall_s: float = float("nan")   # measured (CPU)
    eager_cpu_ms: float = float("nan")  # measured (CPU): the PyTorch twin in the input dtype
    lnc: int = 2                       # the logical-core degree of the main columns
    modeled_us: float = float("nan")
    modeled_us_lnc1: float = float("nan")   # the same kernel at LNC=1 (one core)
    efficiency_lnc1: float = float("nan")   # against the one-core limit
    imbalance: float = float("nan")    # LNC=2: idle fraction of the core that finishes first
    limit_us: float = float("nan")
    limit_bound: str = ""
    efficiency: float = float("nan")
    bound_by: str = ""
    bound_busy: float = float("nan")   # busy fraction of the bound-by engine
    eager_us: float = float("nan")
    speedup: float = float("nan")
    hbm_mb: float = float("nan")
    instructions: int = 0
    busy_us: dict = field(default_factory=dict)
    hot: list = field(default_factory=list)  # top instruction groups on the bound-by engine
    trace: str = ""
    # error bars (modeled): the kernel time at the optimistic / pessimistic end of the cost
    # model's uncertain numbers, and the speedups they give (error_bars())
    modeled_low_us: float = float("nan")
    modeled_high_us: float = float("nan")
    speedup_low: float = float("nan")
    speedup_high: float = float("nan")

    @property
    def efficiency_target(self) -> float:
        if self.case.backward and self.case.spec.backward.efficiency_target is not None:
            return self.case.spec.backward.efficiency_target
        if self.case.workload.large and self.limit_bound == "dma":
            return EFFICIENCY_TARGET_LARGE_MEMORY_BOUND
        return EFFICIENCY_TARGET

    @property
    def meets(self) -> bool | None:
        if self.status != "ok":
            return None
        ok = self.efficiency >= self.efficiency_target
        if self.case.speedup_target is not None:
            # a speedup is claimed only where the low end of its error bar clears it
            ok = ok and speedup_claimed(self.speedup_low, self.case.speedup_target)
        return ok

    @property
    def target_text(self) -> str:
        t = f"eff>={self.efficiency_target:g}"
        if self.case.speedup_target is not None:
            t += f", speedup low end>={self.case.speedup_target:g}x"
        return t


# The uncertain numbers (Target.cost_ranges) that enter eager's limits (roofline.Work.terms):
# only the achieved DMA bandwidth.
EAGER_FIELDS = ("dma_bytes_per_s",)


def error_bars(est, eager_us_on) -> dict:
    """The error bar of a modeled kernel time and of its speedup over eager.

    The kernel's trace is re-scheduled with every uncertain cost number at its optimistic
    and at its pessimistic end (simulator.cost.time_range, docs/cost-model.md "Error
    bars"). ``eager_us_on(target)`` is the eager baseline (the limit-based lower bound on
    eager) on a variant of the hardware: both sides of a speedup run on one machine, so
    each speedup compares them under one hypothesis. The fixed costs only slow the kernel,
    so the low end has them pessimistic; the DMA bandwidth slows both, so the low end is
    the smaller ratio with it at either end (the ratio is monotone in it). The high end
    likewise, mirrored. The kernel's ends are then widened by the target's model-error band
    (what the parameter ranges do not explain, fitted on hardware measurements:
    hardware.py ``model_error_band``). The central speedup always lies inside."""
    kernel_at = end_latencies(est)          # the kernel at each end, as scheduled
    low, high = time_range(est, ends=kernel_at)
    base = get_target(est.target)
    # the model-error band widens the kernel's ends (eager is a limit-based lower bound:
    # no modeled schedule, nothing to widen)
    band = dict(zip(("optimistic", "pessimistic"), base.model_error_band))
    ends = {end: variant(base, end) for end in ENDS}

    def ratio(tgt, kernel_us):
        return eager_us_on(tgt) / kernel_us if kernel_us > 0 else float("nan")

    ratios = {}
    for end, other in (("pessimistic", "optimistic"), ("optimistic", "pessimistic")):
        swapped = dataclasses.replace(ends[end], **{f: getattr(ends[other], f) for f in EAGER_FIELDS})
        ratios[end] = [ratio(ends[end], kernel_at[end] * band[end]),
                       ratio(swapped, estimate_trace(est.trace, swapped, allocations=est.allocations).latency_us
                             * band[end])]
    central = eager_us_on(base) / est.latency_us if est.latency_us > 0 else float("nan")
    return {"modeled_low_us": low, "modeled_high_us": high,
            "speedup_low": min(ratios["pessimistic"] + [central]),
            "speedup_high": max(ratios["optimistic"] + [central])}


def speedup_claimed(speedup_low: float, target: float = 1.0) -> bool:
    """A speedup counts only where the low end of its error bar clears the target."""
    return not math.isnan(speedup_low) and speedup_low >= target


def _max_abs_err(out, ref) -> float:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    if len(outs) != len(refs):
        raise ValueError(f"kernel returned {len(outs)} outputs, reference {len(refs)}")
    err = 0.0
    for o, r in zip(outs, refs):
        if tuple(o.shape) != tuple(r.shape):
            raise ValueError(f"kernel output shape {tuple(o.shape)} != reference {tuple(r.shape)}")
        diff = (o.double() - r.double()).abs()
        if torch.isnan(diff).any():
            return float("nan")
        err = max(err, float(diff.max()))
    return err


def _check(out, ref, dtype) -> bool:
    atol, rtol = CHECK_TOL[dtype]
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    return all(torch.allclose(o.double(), r.double(), atol=atol, rtol=rtol) for o, r in zip(outs, refs))


def _check_scaled(out, ref, dtype) -> bool:
    """The backward rows' check: each output within atol + rtol * max |reference| of the
    reference everywhere. A weight gradient sums thousands of rows, so its error scales
    with the output's magnitude, not with each element's (an element that cancels to ~0
    keeps the rounding error of its large terms)."""
    atol, rtol = CHECK_TOL[dtype]
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    return all(r.numel() == 0 or float((o.double() - r.double()).abs().max())
               <= atol + rtol * float(r.double().abs().max()) for o, r in zip(outs, refs))


def _hot_spots(est, engine: str, top: int = 3) -> list[str]:
    """The instruction groups that take most of ``engine``'s modeled time."""
    sched = est.schedule
    groups: dict[tuple, list] = {}
    seen: set[int] = set()
    for slot in sched.slots:
        if slot.engine != engine or slot.index in seen:
            continue  # a DMA transfer counts once (its first queue share)
        seen.add(slot.index)
        d = sched.detail(slot.index)
        key = (slot.op, d.get("rule", f"{d.get('queues', '?')} queues"))
        g = groups.setdefault(key, [0, 0.0])
        g[0] += 1
        g[1] += slot.end - slot.start
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][1])[:top]
    return [f"{op} x{n} ({rule}): {t * 1e6:.1f} us" for (op, rule), (n, t) in ranked]


def run_case(case: Case, target: str, traces_dir: Path | None, lnc: int = 2) -> Row:
    row = Row(case, lnc=lnc)
    work = case.workload
    gen = torch.Generator().manual_seed(zlib.crc32(case.slug.encode()))
    args, kwargs = case.inputs(gen)
    call = case.kernel_call(*args, **kwargs)
    kernel = _dispatch.simulator_kernel(call)
    tensors = tuple(t.detach().contiguous() for t in call.tensors)
    t0 = time.perf_counter()
    est = simulator.estimate(kernel[lnc], target)(*tensors, **call.static)
    row.sim_wall_s = time.perf_counter() - t0
    row.imbalance = est.imbalance
    if lnc != 1:
        one = simulator.estimate(kernel[1], target)(*tensors, **call.static)
        row.modeled_us_lnc1 = one.latency_us
        row.efficiency_lnc1 = case.roofline(*args, **kwargs, lnc=1, target=target).efficiency(one.latency_us)
    out = call.finish_outputs(est.outputs)
    ref = case.reference(*args, **kwargs, compute_dtype=work.reference_dtype)
    row.eager_cpu_ms = _eager_cpu_ms(case, args, kwargs)
    row.max_abs_err = _max_abs_err(out, ref)
    if not (_check_scaled if case.backward else _check)(out, ref, work.dtype):
        row.status = "mismatch"
        row.note = f"max |kernel - reference| = {row.max_abs_err:.3g} exceeds atol/rtol {CHECK_TOL[work.dtype]}"

    roof = case.roofline(*args, **kwargs, lnc=lnc, target=target)
    row.modeled_us = est.latency_us
    row.limit_us, row.limit_bound = roof.limit_us, roof.bound
    row.efficiency = roof.efficiency(est.latency_us)
    row.eager_us = roof.eager_us
    row.speedup = roof.speedup(est.latency_us)
    row.bound_by = est.bottleneck
    row.bound_busy = est.utilization[est.bottleneck]
    row.busy_us = dict(est.engine_busy_us)
    row.hbm_mb = est.hbm_bytes / 1e6
    row.instructions = est.instructions
    row.hot = _hot_spots(est, est.bottleneck)
    bars = error_bars(est, lambda tgt: case.roofline(*args, **kwargs, lnc=lnc, target=tgt).eager_us)
    for k, v in bars.items():
        setattr(row, k, v)
    if traces_dir is not None:
        path = est.to_chrome_trace(traces_dir / f"{case.slug}.json")
        row.trace = str(path)
    return row


def _eager_cpu_ms(case: Case, args, kwargs, repeats: int = 3) -> float:
    """Median wall time of the eager PyTorch twin on this CPU, in the input dtype, at torch's
    default thread count (the simulator runs single-threaded; the CSV records both), as a
    scale for the simulator's own wall time (measured, CPU; not Trainium)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        case.reference(*args, **kwargs, compute_dtype=case.workload.dtype)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


# ----------------------------------------------------------------------------- output

def _columns():
    """(label, header, record key, formatter); label is MEASURED, MODELED or ''."""
    return [
        ("", "op", "op", str),
        ("", "workload", "workload", str),
        ("", "dtype", "dtype", str),
        (MEASURED, "max abs err", "max_abs_err", lambda v: f"{v:.2e}"),
        (MODELED, "kernel us", "kernel_us", lambda v: f"{v:.1f}"),
        (MODELED, "kernel us range", "kernel_range_us", str),
        (MODELED, "limit us", "limit_us", lambda v: f"{v:.1f}"),
        (MODELED, "efficiency", "efficiency", lambda v: f"{v:.2f}"),
        (MODELED, "bound by", "bound_by", str),
        (MODELED, "eager us", "eager_us", lambda v: f"{v:.1f}"),
        (MODELED, "speedup", "speedup", lambda v: f"{v:.2f}x"),
        (MODELED, "speedup low/high", "speedup_range", str),
        (MODELED, "LNC=1 us", "kernel_us_lnc1", lambda v: f"{v:.1f}"),
        (MODELED, "LNC=1 eff", "efficiency_lnc1", lambda v: f"{v:.2f}"),
        (MODELED, "LNC2/LNC1", "lnc_ratio", lambda v: f"{v:.2f}"),
        (MODELED, "core idle", "core_imbalance", lambda v: f"{v:.0%}"),
        (MEASURED, "sim wall s", "sim_wall_s", lambda v: f"{v:.2f}"),
        (MEASURED, "eager wall ms", "eager_cpu_ms", lambda v: f"{v:.1f}"),
        ("", "goal", "goal", str),
        ("", "status", "status", str),
    ]


def _range_text(low: float, high: float, fmt: str) -> str:
    if math.isnan(low) or math.isnan(high):
        return ""
    return f"{fmt.format(low)}-{fmt.format(high)}"


def _slug(label: str) -> str:
    return label.replace(" (", "_").replace(")", "").lower()


def _record(row: Row) -> dict:
    """One row as a flat dict; keys of numbers carry their label (e.g. kernel_us_modeled_trn2)."""
    c = row.case
    mod, meas = _slug(MODELED), _slug(MEASURED)
    rec = {
        "op": c.op, "workload": c.name, "dtype": str(c.workload.dtype).removeprefix("torch."), "lnc": row.lnc,
        f"max_abs_err_{meas}": row.max_abs_err, f"sim_wall_s_{meas}": row.sim_wall_s,
        f"eager_cpu_ms_{meas}": row.eager_cpu_ms,
        f"kernel_us_{mod}": row.modeled_us, f"limit_us_{mod}": row.limit_us, f"limit_set_by_{mod}": row.limit_bound,
        f"efficiency_{mod}": row.efficiency, f"bound_by_{mod}": row.bound_by,
        f"bound_by_busy_fraction_{mod}": row.bound_busy, f"eager_us_{mod}": row.eager_us,
        f"speedup_{mod}": row.speedup, f"hbm_mb_{mod}": row.hbm_mb, "instructions": row.instructions,
        f"kernel_us_lnc1_{mod}": row.modeled_us_lnc1, f"efficiency_lnc1_{mod}": row.efficiency_lnc1,
        f"lnc_ratio_{mod}": row.modeled_us / row.modeled_us_lnc1 if row.lnc != 1 else float("nan"),
        f"core_imbalance_{mod}": row.imbalance if row.lnc != 1 else float("nan"),
        "unbalanced": bool(row.lnc != 1 and row.imbalance > IMBALANCE_FLAG),
        f"kernel_low_us_{mod}": row.modeled_low_us, f"kernel_high_us_{mod}": row.modeled_high_us,
        f"speedup_low_{mod}": row.speedup_low, f"speedup_high_{mod}": row.speedup_high,
        f"kernel_range_us_{mod}": _range_text(row.modeled_low_us, row.modeled_high_us, "{:.1f}"),
        f"speedup_range_{mod}": _range_text(row.speedup_low, row.speedup_high, "{:.2f}x"),
        "goal": row.target_text, "efficiency_goal": row.efficiency_target,
        "speedup_low_goal": c.speedup_target if c.speedup_target is not None else float("nan"),
        "meets_goal": row.meets,
        "status": row.status if row.meets is not False else "below target",
        "note": row.note, "trace": row.trace,
        # what the measured columns were measured on: the simulator computes with one torch
        # thread (simulator/interpreter.py), eager at torch's default count
        f"host_cpu_{meas}": HOST_CPU, f"simulator_threads_{meas}": 1,
        f"eager_threads_{meas}": torch.get_num_threads(),
    }
    for e in ("tensor", "vector", "scalar", "gpsimd", "dma"):
        rec[f"busy_us_{e}_{mod}"] = row.busy_us.get(e, float("nan"))
    return rec


def _value(rec: dict, key: str):
    """A record's value by short key (kernel_us -> kernel_us_modeled_trn2)."""
    if key in rec:
        return rec[key]
    for k, v in rec.items():
        if k.startswith(key + "_"):
            return v
    raise KeyError(key)


def _cell(rec: dict, key: str, fmt) -> str:
    v = _value(rec, key)
    if isinstance(v, float) and math.isnan(v):
        return "-"
    if v in ("", None):
        return "-"
    return fmt(v)


def format_table(records: list[dict]) -> str:
    cols = _columns()
    labels = [lab for lab, _, _, _ in cols]
    headers = [h for _, h, _, _ in cols]
    body = [[_cell(r, k, f) for _, _, k, f in cols] for r in records]
    widths = [max(len(labels[i]), len(h), *(len(b[i]) for b in body)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(labels), line(headers), line(["-" * w for w in widths])] + [line(b) for b in body])


def write_csv(records: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(records[0]))
        w.writeheader()
        w.writerows(records)


def _lnc_sentence(lnc: int) -> str:
    """What the report's main columns are, at the run's logical-core degree."""
    if lnc == 1:
        return ("The main columns are at LNC=1: the kernel runs on one NeuronCore, and the limit and the eager "
                "baseline are those of one core (the LNC=1 columns and `core idle` are empty).")
    return (f"The main columns are at LNC={lnc} (a logical core of {lnc} physical NeuronCores, the compiler's "
            "default on trn2 and trn3): the kernel runs on both cores, and the limit and the eager baseline are "
            "those of the same logical core. `LNC=1 us` / `LNC=1 eff` are the same kernel on one core against "
            "the one-core limit; `core idle` is the idle fraction of the core that finishes first (rows above "
            f"{IMBALANCE_FLAG:.0%} are flagged as unbalanced).")


def write_markdown(rows: list[Row], records: list[dict], path: Path, target: str, wall_s: float) -> None:
    lines = [
        f"# nki-kernels: modeled report ({target})",
        "",
        f"Kernel, limit and eager times are **{MODELED}**: the analytical cost model of a NeuronCore "
        "applied to the exact instructions each kernel issued in the simulator (docs/cost-model.md). "
        f"Errors and wall times are **{MEASURED}**: {HOST_CPU}, the simulator on one torch thread, eager "
        f"PyTorch on {torch.get_num_threads()}. Nothing here ran on a Trainium.",
        "",
        _lnc_sentence(rows[0].lnc if rows else 2),
        "",
        "* efficiency = limit / modeled kernel time (limit: max of compulsory HBM bytes / DMA bandwidth, "
        "matmul FLOPs / TensorE peak, transcendentals / ScalarE rate);",
        "* speedup = modeled eager PyTorch / modeled kernel, eager charged at each ATen op's own limit with "
        "zero launch overhead (the best case for eager, so the speedup is a lower bound); kernel times "
        "leave out the fixed cost of a launch (Estimate.launch_us), which eager would pay per ATen op;",
        "* kernel us range / speedup low/high: the error bar, the kernel re-modeled with every uncertain "
        "cost number at its optimistic and its pessimistic end (docs/cost-model.md \"Error bars\"), and "
        "eager's limits at the same end (the achieved DMA bandwidth is the one such number they use); a "
        "speedup target counts as met only where the low end clears it.",
        "",
        "| " + " | ".join(f"{h}, {lab}" if lab else h for lab, h, _, _ in _columns()) + " |",
        "|" + "---|" * len(_columns()),
    ]
    for rec in records:
        lines.append("| " + " | ".join(_cell(rec, k, f) for _, _, k, f in _columns()) + " |")
    lines += ["", f"Report generated in {wall_s:.0f} s ({MEASURED} wall time).", "", "## Where the time goes"]
    for row, rec in zip(rows, records):
        c = row.case
        lines.append("")
        # the table's status (accuracy, then the modeled target), so a heading never says "ok"
        # for a row the table marks "below target"
        lines.append(f"**{c.op} — {c.name}** ({rec['status']}; target {row.target_text})")
        if row.note:
            lines.append(f"- note: {row.note}")
        if row.status in ("ok", "mismatch"):
            busy = ", ".join(f"{e} {row.busy_us[e]:.1f}" for e in ("tensor", "vector", "scalar", "gpsimd", "dma"))
            lines.append(f"- {MODELED}: {row.modeled_us:.1f} us (error bar {row.modeled_low_us:.1f}-"
                         f"{row.modeled_high_us:.1f} us); limit {row.limit_us:.1f} us set by "
                         f"{row.limit_bound}; busy us: {busy}; HBM {row.hbm_mb:.2f} MB; "
                         f"{row.instructions} instructions; simulated in {row.sim_wall_s:.2f} s ({MEASURED})")
            lines.append(f"- bound by {row.bound_by} ({row.bound_busy:.0%} busy); its largest instruction groups:")
            lines += [f"  - {h}" for h in row.hot]
            if row.trace:
                lines.append(f"- trace: `{Path(row.trace).name}` (traces/, open in Perfetto)")
    path.write_text("\n".join(lines) + "\n")


def write_plot(records: list[dict], path: Path, target: str) -> bool:
    ok = [r for r in records if r["status"] in ("ok", "below target") and not math.isnan(_value(r, "speedup"))]
    if not ok:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['op']}\n{r['workload']}" for r in ok]
    y = list(range(len(ok)))[::-1]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 0.55 * len(ok) + 2), sharey=True)
    central = [_value(r, "speedup") for r in ok]
    lows = [_value(r, "speedup_low") for r in ok]
    highs = [_value(r, "speedup_high") for r in ok]
    xerr = [[max(0.0, c - lo) if not math.isnan(lo) else 0.0 for c, lo in zip(central, lows)],
            [max(0.0, hi - c) if not math.isnan(hi) else 0.0 for c, hi in zip(central, highs)]]
    ax1.barh(y, central, color="tab:blue", label="speedup over eager", xerr=xerr, error_kw={"elinewidth": 0.8, "capsize": 2})
    ax1.axvline(1.0, color="black", lw=0.8)
    # each row's own goals (the report's goal column): the speedup's low end where the row has
    # one, and the efficiency
    goals = [(yi, r["speedup_low_goal"]) for yi, r in zip(y, ok) if not math.isnan(r["speedup_low_goal"])]
    if goals:
        ax1.scatter([g for _, g in goals], [yi for yi, _ in goals], marker="|", s=160, color="tab:red", zorder=3,
                    label="the row's speedup goal (low end)")
    ax1.set_xscale("log")
    from matplotlib.ticker import FixedLocator, NullLocator

    speedups = [_value(r, "speedup") for r in ok]
    spread = [v for v in speedups + lows + highs if not math.isnan(v) and v > 0]
    ticks = [v for v in (0.0625, 0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32)
             if min(spread) / 2 <= v <= max(spread + [g for _, g in goals]) * 2]
    ax1.xaxis.set_major_locator(FixedLocator(ticks))
    ax1.xaxis.set_minor_locator(NullLocator())
    ax1.set_xticklabels([f"{v:g}x" for v in ticks])
    for yi, v in zip(y, speedups):
        ax1.text(v, yi, f" {v:.2f}x", va="center", fontsize=7)
    for yi, r in zip(y, ok):
        ax2.text(_value(r, "efficiency"), yi, f" {_value(r, 'efficiency'):.2f}", va="center", fontsize=7)
    ax1.set_xlabel(f"speedup over eager PyTorch [{MODELED}, lower bound; bars: error bar]")
    ax1.set_yticks(y, labels, fontsize=7)
    # legends below the x-axis label (borderaxespad in font sizes), kept by bbox_inches="tight"
    ax1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0), borderaxespad=4.5, ncol=2)
    ax2.barh(y, [_value(r, "efficiency") for r in ok],
             color=["tab:green" if r["meets_goal"] else "tab:orange" for r in ok])
    ax2.scatter([r["efficiency_goal"] for r in ok], y, marker="|", s=160, color="tab:red", zorder=3,
                label="the row's efficiency goal")
    ax2.set_xlim(0, 1.05)
    ax2.set_xlabel(f"efficiency = limit / kernel [{MODELED}]")
    from matplotlib.patches import Patch

    # the bar colours say whether the row meets its target (efficiency, and speedup where set)
    handles, _ = ax2.get_legend_handles_labels()
    handles += [Patch(color="tab:green", label="meets its target"), Patch(color="tab:orange", label="below its target")]
    ax2.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0), borderaxespad=4.5,
               ncol=2)
    fig.suptitle(f"nki-kernels on {target} at LNC={ok[0]['lnc']}: MODELED by the cost model (not measured on hardware)")
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ops", default="", help="comma-separated ops to run (default: all), e.g. softmax,rms_norm")
    ap.add_argument("--quick", action="store_true",
                    help="the workloads marked quick: one to three shapes of every op but silu and gelu_and_mul")
    ap.add_argument("--out", default="out/report", help="output folder (default out/report)")
    ap.add_argument("--target", default="trn2", choices=sorted(TARGETS), help="modeled target (hardware.py's)")
    ap.add_argument("--no-traces", action="store_true", help="do not write Chrome traces")
    ap.add_argument("--lnc", type=int, default=None, choices=(1, 2),
                    help="logical-core degree of the main columns (default: the target's, trn2/trn3: 2); "
                         "at 2 the LNC=1 figures are reported beside")
    args = ap.parse_args(argv)
    from nki_kernels.simulator.hardware import get_target

    lnc = args.lnc or get_target(args.target).max_logical_cores   # neuronx-cc's default degree
    if lnc > get_target(args.target).max_logical_cores:
        ap.error(f"--lnc {lnc}: {args.target} runs LNC=1 only")

    global MODELED
    MODELED = f"modeled ({args.target})"
    cases = grid(args.quick)
    if args.ops:
        wanted = {o.strip() for o in args.ops.split(",") if o.strip()}
        names = {c.op for c in grid(False)} | {c.spec.name for c in grid(False)}
        unknown = wanted - names
        if unknown:
            ap.error(f"--ops {sorted(unknown)} unknown; choose from {sorted(names)}")
        # an op's name selects its forward and backward rows; "<op> backward" the backward only
        if not wanted:
            ap.error(f"--ops {args.ops!r} names no op; choose from {sorted(names)}")
        cases = [c for c in cases if c.op in wanted or c.spec.name in wanted]
        if not cases:
            ap.error(f"--ops {args.ops!r}{' with --quick' if args.quick else ''} selects no workload "
                     "(silu and gelu_and_mul have no quick workload)")
    problem = script_support.output_path_error("--out", args.out, folder=True)
    if problem:
        ap.error(problem)
    out = Path(args.out)
    traces = None if args.no_traces else out / "traces"
    out.mkdir(parents=True, exist_ok=True)
    if traces is not None:
        traces.mkdir(exist_ok=True)
        if not args.ops:  # a run of every op owns the folder: drop traces of rows it does not make
            for old in traces.glob("*.json"):
                old.unlink()

    t0 = time.perf_counter()
    rows: list[Row] = []
    bar = tqdm(cases, desc="simulate + model", unit="case", file=sys.stderr)
    for case in bar:
        bar.set_postfix_str(f"{case.op}: {case.name}"[:60])
        try:
            row = run_case(case, args.target, traces, lnc)
        except Exception as err:  # report it, keep going: the report must survive a broken kernel
            row = Row(case, lnc=lnc, status="error", note=f"{type(err).__name__}: {err}".splitlines()[0][:300])
            traceback.print_exc(file=sys.stderr)
        rows.append(row)
    wall = time.perf_counter() - t0

    records = [_record(r) for r in rows]
    print()
    print(f"nki-kernels on {args.target} at LNC={lnc} (limit and eager baseline on the same "
          f"{lnc}-core logical core): kernel/limit/eager times {MODELED}; errors {MEASURED}. "
          "Not measured on hardware.")
    print(format_table(records))
    for r in rows:
        if r.note:
            print(f"note: {r.case.op} [{r.case.name}]: {r.note}")
    write_csv(records, out / "report.csv")
    write_markdown(rows, records, out / "report.md", args.target, wall)
    plotted = write_plot(records, out / "report.png", args.target)
    print(f"\nwrote {out / 'report.csv'}, {out / 'report.md'}" + (f", {out / 'report.png'}" if plotted else "")
          + (f", traces in {traces}" if traces is not None else "") + f"  ({wall:.0f} s, {MEASURED})")
    below = [r for r in rows if r.meets is False]
    if below:
        print(f"{len(below)} row(s) below target: " + "; ".join(f"{r.case.op} [{r.case.name}] bound by "
              f"{r.bound_by}" for r in below))
    unbalanced = [r for r in rows if r.lnc != 1 and r.status == "ok" and r.imbalance > IMBALANCE_FLAG]
    if unbalanced:
        print(f"{len(unbalanced)} row(s) with cores unbalanced by more than {IMBALANCE_FLAG:.0%}: "
              + "; ".join(f"{r.case.op} [{r.case.name}] {r.imbalance:.0%}" for r in unbalanced))
    failed = [r for r in rows if r.status in ("error", "mismatch")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

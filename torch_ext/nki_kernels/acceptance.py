"""The acceptance run for the first Trn2/Trn3 host: ``python -m nki_kernels.acceptance``.

Set the host up as README "Running on a Trainium host" says, then run this one command.
For every op of the registry at every workload of the main job (``registry`` workloads,
the shapes ``benchmarks/model_report.py`` models):

1. makes the main job's inputs (same seeds) on CPU and moves them to ``neuron``;
2. runs the op (its public function: custom op -> NKI kernel through torch-neuronx) and
   checks it against the op's PyTorch reference computed on CPU (float64, or float32 for
   the largest attention shapes);
3. times the op and eager PyTorch (the op's PyTorch twin in the input dtype, one ATen op
   at a time, as TorchNeuron's eager mode runs it) on the device: warm-up calls, then
   repeats each ended by ``torch.neuron.synchronize()`` (p10/p50/p90 of the per-call
   latency), and one back-to-back batch with a single synchronisation;
4. captures one call with TorchNeuron's profiler (``torch_neuronx.profiling``) where it
   imports, into ``<out>/profiles/<case>/`` (open with Neuron Explorer);
5. models the same kernel launch (the op's ``kernel_call``) with the project's cost
   model (``simulator.estimate``) at the same logical-core degree on the same target,
   and the eager baseline with ``roofline``;

and writes one table, measured beside modeled, row by row, with the model's error
(``<out>/acceptance.md``, ``.csv``, ``.json``; the table is printed too). MEASURED numbers
come from the Trainium device; MODELED ones from the cost model; the two are labelled
everywhere. Exit status: 0 when every op ran and matched its reference, 1 when one did
not, 2 when this is not a Trainium host (said in one line) or the target is unknown.

Options: ``--ops a,b`` (default all), ``--quick`` (the main job's quick grid),
``--warmup N`` (default 10), ``--repeats N`` (default 100), ``--batch N`` (back-to-back
calls, default 50), ``--target trn2|trn3`` (default: ``NEURON_PLATFORM_TARGET_OVERRIDE`` or
the EC2 instance type), ``--out DIR`` (default out/acceptance), ``--no-profile``.

The logical-core degree is neuronx-cc's (``_neuron.compiler_degree``: ``NEURON_CC_FLAGS``
``--lnc``, else ``NEURON_LOGICAL_NC_CONFIG``, else 2); set ``NEURON_LOGICAL_NC_CONFIG`` to
run the kernels in the call form NKI 0.7 documents (``_neuron.py``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import sys
import time
import traceback
import zlib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import torch

from . import _custom_op, _dispatch, _neuron, registry

MEASURED = "measured"
MODELED = "modeled"
DEVICE = "neuron"
TARGETS = ("trn2", "trn3")
TARGET_ENV = "NEURON_PLATFORM_TARGET_OVERRIDE"   # AWS's platform-target override (compiler, simulator)
INSTANCE_TYPE_FILE = Path("/sys/devices/virtual/dmi/id/product_name")   # EC2: the instance type
EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2
# The check's max |op - reference| per output dtype, the main job's (benchmarks/model_report.py):
# a bf16 output carries a final rounding of 2**-8 relative on values up to ~4-8, fp16 2**-11.
CHECK_TOL = {torch.bfloat16: (6e-2, 2e-2), torch.float16: (1e-2, 1e-2), torch.float32: (1e-3, 1e-3)}
# AWS's profiling guide: "Warm up first (3+ iterations)"; the first call also compiles.
DEFAULT_WARMUP, DEFAULT_REPEATS, DEFAULT_BATCH = 10, 100, 50


# ---------------------------------------------------------------------------- timing

def percentile(samples: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``samples``, linear between order statistics."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class Timing:
    """Per-call latencies (µs) of synchronised repeats, and the back-to-back mean (µs)."""

    samples_us: list[float] = field(default_factory=list)
    back_to_back_us: float = math.nan

    @property
    def p10(self) -> float:
        return percentile(self.samples_us, 10)

    @property
    def p50(self) -> float:
        return percentile(self.samples_us, 50)

    @property
    def p90(self) -> float:
        return percentile(self.samples_us, 90)


def time_call(fn: Callable[[], Any], sync: Callable[[], None], warmup: int, repeats: int, batch: int,
              clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Time ``fn`` on an asynchronous device: ``warmup`` calls and a sync (the first call
    compiles); ``repeats`` samples of one call each, the clock read with the queue empty
    and after the call's sync; then ``batch`` calls back to back between two syncs."""
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        sync()
        samples.append((clock() - t0) * 1e6)
    back_to_back = math.nan
    if batch > 0:
        t0 = clock()
        for _ in range(batch):
            fn()
        sync()
        back_to_back = (clock() - t0) * 1e6 / batch
    return Timing(samples, back_to_back)


# ---------------------------------------------------------------------------- one row

@dataclass
class Row:
    """One (op, workload) of the acceptance run. ``*_us`` are microseconds; measured ones
    come from the device, modeled ones from the cost model (never mixed)."""

    op: str
    workload: str
    dtype: str
    lnc: int
    status: str = "ok"                  # ok | mismatch | error
    note: str = ""
    max_abs_err: float = math.nan       # measured: |op on neuron - reference on CPU|
    kernel_p10_us: float = math.nan     # measured
    kernel_p50_us: float = math.nan     # measured
    kernel_p90_us: float = math.nan     # measured
    kernel_back_to_back_us: float = math.nan   # measured
    eager_p50_us: float = math.nan      # measured
    eager_back_to_back_us: float = math.nan    # measured
    modeled_kernel_us: float = math.nan
    modeled_eager_us: float = math.nan
    modeled_bound_by: str = ""
    profile: str = ""                   # profile directory, or why there is none

    @property
    def measured_speedup(self) -> float:
        return _ratio(self.eager_p50_us, self.kernel_p50_us)

    @property
    def modeled_speedup(self) -> float:
        return _ratio(self.modeled_eager_us, self.modeled_kernel_us)

    @property
    def kernel_model_error(self) -> float:
        """modeled / measured - 1 of the kernel's p50 latency (+0.25: the model says 25% slower)."""
        return _ratio(self.modeled_kernel_us, self.kernel_p50_us) - 1.0

    @property
    def eager_model_error(self) -> float:
        return _ratio(self.modeled_eager_us, self.eager_p50_us) - 1.0

    @property
    def speedup_model_error(self) -> float:
        return _ratio(self.modeled_speedup, self.measured_speedup) - 1.0

    def record(self) -> dict:
        out = asdict(self)
        for name in ("measured_speedup", "modeled_speedup", "kernel_model_error", "eager_model_error",
                     "speedup_model_error"):
            out[name] = getattr(self, name)
        return out

    @classmethod
    def from_record(cls, record: dict) -> "Row":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})


def _ratio(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)) or b <= 0:
        return math.nan
    return a / b


# ---------------------------------------------------------------------------- the table

def _num(value: float, fmt: str) -> str:
    return format(value, fmt) if math.isfinite(value) else "—"


def _pct(value: float) -> str:
    return f"{value * 100:+.0f}%" if math.isfinite(value) else "—"


COLUMNS: list[tuple[str, Callable[[Row], str]]] = [
    ("op", lambda r: r.op),
    ("workload", lambda r: r.workload),
    ("dtype", lambda r: r.dtype),
    ("LNC", lambda r: str(r.lnc)),
    ("check", lambda r: r.status if not r.note or r.status == "ok" else f"{r.status}: {r.note}"),
    (f"max err ({MEASURED})", lambda r: _num(r.max_abs_err, ".2g")),
    (f"kernel p50 µs ({MEASURED})", lambda r: _num(r.kernel_p50_us, ".1f")),
    (f"kernel p10–p90 µs ({MEASURED})",
     lambda r: f"{_num(r.kernel_p10_us, '.1f')}–{_num(r.kernel_p90_us, '.1f')}"),
    (f"kernel back-to-back µs ({MEASURED})", lambda r: _num(r.kernel_back_to_back_us, ".1f")),
    (f"kernel µs ({MODELED})", lambda r: _num(r.modeled_kernel_us, ".1f")),
    ("kernel model error", lambda r: _pct(r.kernel_model_error)),
    (f"eager p50 µs ({MEASURED})", lambda r: _num(r.eager_p50_us, ".1f")),
    (f"eager µs ({MODELED})", lambda r: _num(r.modeled_eager_us, ".1f")),
    (f"speedup ({MEASURED})", lambda r: _num(r.measured_speedup, ".2f") + ("x" if math.isfinite(r.measured_speedup) else "")),
    (f"speedup ({MODELED})", lambda r: _num(r.modeled_speedup, ".2f") + ("x" if math.isfinite(r.modeled_speedup) else "")),
    ("speedup model error", lambda r: _pct(r.speedup_model_error)),
]


def format_table(rows: list[Row]) -> str:
    """The markdown table, one line per row."""
    header = "| " + " | ".join(name for name, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    lines = [header, rule]
    for row in rows:
        lines.append("| " + " | ".join(cell(row).replace("|", "\\|") for _, cell in COLUMNS) + " |")
    return "\n".join(lines)


def _geomean(values: list[float]) -> float:
    values = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def model_error_summary(rows: list[Row]) -> dict[str, float]:
    """The model's error over the rows that ran and matched: the geometric mean of
    modeled / measured (kernel, eager, speedup), the median |error| and the worst one."""
    ok = [r for r in rows if r.status == "ok"]
    kernel = [r.kernel_model_error for r in ok if math.isfinite(r.kernel_model_error)]
    return {
        "rows": len(ok),
        "kernel_modeled_over_measured_geomean": _geomean([1 + e for e in kernel]),
        "eager_modeled_over_measured_geomean": _geomean([1 + r.eager_model_error for r in ok]),
        "speedup_modeled_over_measured_geomean": _geomean([1 + r.speedup_model_error for r in ok]),
        "kernel_median_abs_error": percentile([abs(e) for e in kernel], 50),
        "kernel_worst_abs_error": max((abs(e) for e in kernel), default=math.nan),
    }


def format_summary(rows: list[Row]) -> str:
    s = model_error_summary(rows)
    return (f"Model error over {s['rows']} matching rows: modeled/measured kernel latency "
            f"{_num(s['kernel_modeled_over_measured_geomean'], '.2f')}x (geometric mean), median |error| "
            f"{_pct(s['kernel_median_abs_error'])}, worst {_pct(s['kernel_worst_abs_error'])}; eager "
            f"{_num(s['eager_modeled_over_measured_geomean'], '.2f')}x; speedup "
            f"{_num(s['speedup_modeled_over_measured_geomean'], '.2f')}x.")


def exit_code(rows: list[Row]) -> int:
    """0 when every row ran and matched its reference, else 1."""
    return EXIT_OK if rows and all(r.status == "ok" for r in rows) else EXIT_FAILED


def write_outputs(rows: list[Row], meta: dict, out: Path) -> dict[str, Path]:
    """acceptance.md (header, table, model-error summary), .csv and .json (rows + meta)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "acceptance.md", "csv": out / "acceptance.csv", "json": out / "acceptance.json"}
    header = (f"# nki-kernels acceptance run on {meta.get('target', '?')} (LNC={meta.get('lnc', '?')})\n\n"
              f"MEASURED columns: this Trainium host (per-call latency synchronised with the device, "
              f"p10/p50/p90 of {meta.get('repeats', '?')} repeats after {meta.get('warmup', '?')} warm-up "
              f"calls; back-to-back: {meta.get('batch', '?')} calls between two synchronisations). "
              f"MODELED columns: the project's cost model (simulator.estimate of the same kernel launch "
              f"at the same LNC on {meta.get('target', '?')}; eager from roofline). Model error = "
              "modeled / measured - 1.\n\n"
              + "".join(f"- {k}: {v}\n" for k, v in sorted(meta.items())) + "\n")
    paths["md"].write_text(header + format_table(rows) + "\n\n" + format_summary(rows) + "\n")
    records = [r.record() for r in rows]
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]) if records else ["op"])
        writer.writeheader()
        writer.writerows(records)
    paths["json"].write_text(json.dumps({"meta": meta, "rows": records}, indent=1, default=str) + "\n")
    return paths


# ---------------------------------------------------------------------------- running a case

def case_slug(op: str, workload: str) -> str:
    """The main job's case slug (benchmarks/model_report.py), which seeds its inputs."""
    safe = "".join(c if c.isalnum() else "_" for c in f"{op}_{workload}")
    return "_".join(filter(None, safe.split("_")))


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _outputs(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def max_abs_err_and_check(out, ref, dtype) -> tuple[float, bool]:
    """max |out - ref| over every output, and whether each is within CHECK_TOL[dtype]."""
    atol, rtol = CHECK_TOL[dtype]
    worst, ok = 0.0, True
    for o, r in zip(_outputs(out), _outputs(ref)):
        o, r = o.detach().to("cpu", torch.float64), r.detach().to("cpu", torch.float64)
        if o.shape != r.shape:
            return math.nan, False
        diff = (o - r).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        ok = ok and bool((diff <= atol + rtol * r.abs()).all())
    return worst, ok


def model_case(spec: registry.OpSpec, args, kwargs, target: str, lnc: int) -> tuple[float, float, str]:
    """(modeled kernel µs, modeled eager µs, bound-by engine): the cost model on the op's
    own kernel launch at degree ``lnc`` (as the main job runs it), eager from roofline."""
    from . import simulator

    call = spec.kernel_call(*args, **kwargs)
    kernel = _dispatch.simulator_kernel(call)[lnc]
    tensors = tuple(t.detach().contiguous() for t in call.tensors)
    est = simulator.estimate(kernel, target)(*tensors, **call.static)
    roof = spec.roofline(*args, **kwargs, lnc=lnc, target=target)
    return est.latency_us, roof.eager_us, est.bottleneck


def profile_call(fn: Callable[[], Any], out: Path) -> str:
    """One call of ``fn`` under TorchNeuron's profiler (AWS profiling guide, 2.32: torch.profiler
    with ProfilerActivity.PrivateUse1 and torch_neuronx.profiling.NeuronConfig, "private
    beta"); the profile directory, or why there is none."""
    try:
        from torch.profiler import ProfilerActivity, profile
        from torch_neuronx.profiling import NeuronConfig, NeuronProfiler, ProfileMode
    except ImportError as err:
        return f"unavailable ({err})"
    try:
        out.mkdir(parents=True, exist_ok=True)
        config = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir=str(out))
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                     experimental_config=config, on_trace_ready=NeuronProfiler(config).export_trace):
            fn()
            _neuron.synchronize()   # "Ensures device finishes before export"
    except Exception as err:  # a beta profiler must not stop the acceptance run
        return f"failed ({type(err).__name__}: {err})"
    return str(out)


def run_case(spec: registry.OpSpec, work: registry.Workload, target: str, lnc: int, *, device: str | None = None,
             sync: Callable[[], None] | None = None, warmup: int = DEFAULT_WARMUP,
             repeats: int = DEFAULT_REPEATS, batch: int = DEFAULT_BATCH, profile_dir: Path | None = None) -> Row:
    """Measure and model one (op, workload) (module docstring, steps 1-5) on ``device``
    (default ``DEVICE``, "neuron"), synchronising with ``sync`` (default the device's)."""
    device = device or DEVICE
    sync = sync or _neuron.synchronize
    row = Row(spec.name, work.name, str(work.dtype).removeprefix("torch."), lnc)
    gen = torch.Generator().manual_seed(zlib.crc32(case_slug(spec.name, work.name).encode()))
    args, kwargs = work.make(gen)
    try:
        row.modeled_kernel_us, row.modeled_eager_us, row.modeled_bound_by = model_case(spec, args, kwargs, target, lnc)
    except Exception as err:
        row.note = f"model: {type(err).__name__}: {err}".splitlines()[0][:200]
    try:
        dargs, dkwargs = _to(args, device), _to(kwargs, device)

        def kernel():
            return spec.function(*dargs, **dkwargs)

        def eager():
            return spec.reference(*dargs, **dkwargs, compute_dtype=work.dtype)

        out = kernel()
        sync()
        ref = spec.reference(*args, **kwargs, compute_dtype=work.reference_dtype)
        row.max_abs_err, ok = max_abs_err_and_check(out, ref, work.dtype)
        if not ok:
            row.status = "mismatch"
            row.note = f"max |op - reference| {row.max_abs_err:.3g} exceeds atol/rtol {CHECK_TOL[work.dtype]}"
        t = time_call(kernel, sync, warmup, repeats, batch)
        row.kernel_p10_us, row.kernel_p50_us, row.kernel_p90_us = t.p10, t.p50, t.p90
        row.kernel_back_to_back_us = t.back_to_back_us
        try:
            e = time_call(eager, sync, warmup, repeats, batch)
            row.eager_p50_us, row.eager_back_to_back_us = e.p50, e.back_to_back_us
        except Exception as err:
            row.note = (row.note + "; " if row.note else "") + f"eager: {type(err).__name__}: {err}".splitlines()[0][:200]
        if profile_dir is not None:
            row.profile = profile_call(kernel, profile_dir / case_slug(spec.name, work.name))
    except Exception as err:
        row.status = "error"
        row.note = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        traceback.print_exc(file=sys.stderr)
    return row


# ---------------------------------------------------------------------------- the command

# NEURON_PLATFORM_TARGET_OVERRIDE's values, "trn2|gen3" and "trn3|gen4" (the nki.jit
# reference, aws-neuron-sdk nki/api/nki/__init__.py)
TARGET_ALIASES = {"gen3": "trn2", "gen4": "trn3"}


def detect_target() -> str | None:
    """trn2 / trn3 from ``NEURON_PLATFORM_TARGET_OVERRIDE`` (a target or its gen3 / gen4
    alias) or the EC2 instance type (any size of the trn2 / trn3 families and their
    variants: trn2.48xlarge, trn2u.48xlarge, the Trn2 UltraServer's, in the trn2
    architecture guide; trn3pds...), else None."""
    candidates = [os.environ.get(TARGET_ENV, "")]
    try:
        candidates.append(INSTANCE_TYPE_FILE.read_text())
    except OSError:
        pass
    for text in candidates:
        text = text.strip().lower()
        if text in TARGET_ALIASES:
            return TARGET_ALIASES[text]
        family = text.partition(".")[0]
        for target in TARGETS:
            # "trn2", "trn2.48xlarge", "trn2u.48xlarge", "trn2n.48xlarge"; not "trn20..."
            if family == target or (family.startswith(target) and family[len(target):].isalpha()):
                return target
    return None


def _versions() -> dict:
    found = {"python": platform.python_version(), "torch": torch.__version__}
    for name in _neuron.TOOLCHAIN:
        module = sys.modules.get(name)
        found[name] = getattr(module, "__version__", "?") if module is not None else "not imported"
    return found


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m nki_kernels.acceptance",
                                 description="Acceptance run on a Trn2/Trn3 host: every op at the main job's "
                                             "shapes, measured on the device beside the cost model.")
    ap.add_argument("--ops", default="", help="comma-separated op names (default: every op)")
    ap.add_argument("--quick", action="store_true", help="only the main job's quick workloads")
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    ap.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    ap.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="back-to-back calls (0: skip)")
    ap.add_argument("--target", choices=TARGETS, default=None,
                    help=f"the Trainium generation (default: {TARGET_ENV} or the EC2 instance type)")
    ap.add_argument("--out", type=Path, default=Path("out/acceptance"))
    ap.add_argument("--no-profile", action="store_true", help="skip the Neuron profiler captures")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    available, why = _neuron.device_available()
    if not available:
        print(f"nki_kernels.acceptance: no Trainium here: {why}; run it on a Trn2/Trn3 host set up as "
              f"{_neuron.README_SECTION} says", file=sys.stderr)
        return EXIT_CANNOT_RUN
    target = args.target or detect_target()
    if target is None:
        print(f"nki_kernels.acceptance: cannot tell trn2 from trn3 here ({TARGET_ENV} unset, instance type "
              f"unknown); pass --target trn2 or --target trn3", file=sys.stderr)
        return EXIT_CANNOT_RUN
    wanted = [n for n in args.ops.split(",") if n]
    specs = [registry.get(n) for n in wanted] if wanted else list(registry.ops())
    cases = [(s, w) for s in specs for w in s.workloads if w.quick or not args.quick]
    form, lnc = _neuron.launch_form()
    meta = {"target": target, "lnc": lnc, "launch form": form, "warmup": args.warmup, "repeats": args.repeats,
            "batch": args.batch, "registration": ", ".join(sorted(set(_custom_op.registered_with.values()))),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), **_versions()}
    rows = []
    for i, (spec, work) in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {spec.name}: {work.name}", file=sys.stderr, flush=True)
        rows.append(run_case(spec, work, target, lnc, warmup=args.warmup, repeats=args.repeats, batch=args.batch,
                             profile_dir=None if args.no_profile else args.out / "profiles"))
    paths = write_outputs(rows, meta, args.out)
    print(format_table(rows))
    print()
    print(format_summary(rows))
    print(f"written: {', '.join(str(p) for p in paths.values())}")
    return exit_code(rows)


if __name__ == "__main__":
    sys.exit(main())

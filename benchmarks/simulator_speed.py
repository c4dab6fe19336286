"""How fast the NKI simulator runs, next to eager CPU torch doing the same math.

Measures two kernels written in beta-2 NKI (a tiled matmul and an elementwise chain):
wall time of one simulated call (median of ``--repeats``; ``simulator.run``, so including
input wrapping and building the trace), instructions issued, microseconds per instruction,
and eager torch's time for the same math on the same CPU (1 thread, as the simulator uses;
median of at least 20 calls). All MEASURED on this CPU. Prints a table and writes
out/simulator_speed.csv. Plain script (not part of pytest):

    .venv/bin/python benchmarks/simulator_speed.py [--repeats 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "torch_ext"))
sys.path.insert(0, str(ROOT / "benchmarks"))     # its shared script support

import script_support  # noqa: E402
from nki_kernels import simulator  # noqa: E402

# Shapes: the matmul is C[M, N] = A[K, M].T @ B[K, N] with K tiled by 128 (PSUM accumulation),
# M by 128 and N by 512; the elementwise kernel runs 6 ops per [128, 512] tile.
MM_K, MM_M, MM_N = 1024, 512, 1024
EW_ROWS, EW_COLS = 2048, 1024


def matmul_kernel(a_t, b):
    """C = a_t.T @ b. a_t [K, M] HBM bf16, b [K, N] HBM bf16 -> [M, N] HBM fp32."""
    import nki.isa as nisa
    import nki.language as nl

    K, M = a_t.shape
    _, N = b.shape
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for m in range(M // 128):
        for n in range(N // 512):
            acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)  # one PSUM bank
            for k in range(K // 128):
                at = nl.ndarray((128, 128), dtype=a_t.dtype, buffer=nl.sbuf)
                bt = nl.ndarray((128, 512), dtype=b.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=at, src=a_t[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128])
                nisa.dma_copy(dst=bt, src=b[k * 128:(k + 1) * 128, n * 512:(n + 1) * 512])
                nisa.nc_matmul(dst=acc, stationary=at, moving=bt)  # TensorE, fp32 accumulate
            res = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512], src=res)
    return out


def elementwise_kernel(x, y, tile_cols=512):
    """out = gelu(x * 0.5 + y) * y - x, fp32 [R, C] HBM, rows tiled by 128, cols by tile_cols."""
    import nki.language as nl

    R, C = x.shape
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    for r in range(R // 128):
        for c in range(C // tile_cols):
            rows, cols = slice(r * 128, (r + 1) * 128), slice(c * tile_cols, (c + 1) * tile_cols)
            xt = nl.load(x[rows, cols])
            yt = nl.load(y[rows, cols])
            h = nl.add(nl.multiply(xt, 0.5), yt)
            g = nl.gelu(h)
            o = nl.subtract(nl.multiply(g, yt), xt)
            nl.store(out[rows, cols], o)
    return out


def torch_matmul(a_t, b):
    return a_t.float().T @ b.float()


def torch_elementwise(x, y):
    return torch.nn.functional.gelu(x * 0.5 + y) * y - x


def _median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5,
                    help="timed simulator runs per case, the median kept (eager torch: at least 20)")
    ap.add_argument("--out", default=str(ROOT / "out" / "simulator_speed.csv"), help="CSV of the rows")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: at least 1 timed run per case")
    problem = script_support.output_path_error("--out", args.out)
    if problem:
        ap.error(problem)

    torch.manual_seed(0)
    a_t = torch.randn(MM_K, MM_M).bfloat16()
    b = torch.randn(MM_K, MM_N).bfloat16()
    x = torch.randn(EW_ROWS, EW_COLS)
    y = torch.randn(EW_ROWS, EW_COLS)
    cases = [
        ("matmul", f"K{MM_K} M{MM_M} N{MM_N} bf16", matmul_kernel, torch_matmul, (a_t, b)),
        ("elementwise", f"{EW_ROWS}x{EW_COLS} fp32, 6 ops", elementwise_kernel,
         torch_elementwise, (x, y)),
    ]
    rows = []
    cpu, cores = script_support.cpu_name(), script_support.cores()     # (read once, recorded on every row)
    xs, ys = x[:, :256], y[:, :256]
    cases.append(("elementwise", f"{EW_ROWS}x256 fp32, [128,32] tiles", elementwise_kernel,
                  torch_elementwise, (xs.contiguous(), ys.contiguous()), {"tile_cols": 32}))
    for name, shape, kernel, ref, inputs, *kw in cases:
        kw = kw[0] if kw else {}
        result = simulator.run(kernel, *inputs, **kw)  # warm-up; also checks the math
        expected = ref(*inputs)
        err = (result.outputs.float() - expected).abs().max().item()
        n_instr = len(result.trace)
        sim_s = _median_time(lambda: simulator.run(kernel, *inputs, **kw), args.repeats)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # same as the simulator; 2 threads only add noise on 2 cores
        try:
            torch_s = _median_time(lambda: ref(*inputs), max(args.repeats, 20))
        finally:
            torch.set_num_threads(threads)
        rows.append({
            "kernel": name, "shape": shape, "instructions": n_instr,
            "sim_wall_ms_measured_cpu": round(sim_s * 1e3, 2),
            "sim_wall_us_per_instruction_measured_cpu": round(sim_s / n_instr * 1e6, 1),
            "torch_eager_wall_ms_measured_cpu": round(torch_s * 1e3, 3), "sim_over_torch": round(sim_s / torch_s, 1),
            "max_abs_err": f"{err:.2e}", "torch_threads": 1,
            "cpu": cpu, "cores": cores,
        })

    print(f"NKI simulator speed vs eager torch, MEASURED on this CPU ({cpu}, {cores} cores; both "
          "single-threaded torch; median of repeats; wall ms = "
          "one simulator.run() incl. trace; us/instr: CPU wall time per simulated instruction)")
    header = f"{'kernel':12} {'shape':34} {'instr':>6} {'sim wall ms':>11} {'us/instr':>9} " \
             f"{'torch ms':>9} {'sim/torch':>10} {'max err':>9}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['kernel']:12} {r['shape']:34} {r['instructions']:>6} {r['sim_wall_ms_measured_cpu']:>11} "
              f"{r['sim_wall_us_per_instruction_measured_cpu']:>9} {r['torch_eager_wall_ms_measured_cpu']:>9} "
              f"{r['sim_over_torch']:>10} "
              f"{r['max_abs_err']:>9}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out} (MEASURED on this CPU)")


if __name__ == "__main__":
    main()

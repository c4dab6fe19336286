"""The fuzz tier (`make fuzz`): seeded random cases of every op on both CPU backends against
float64, with the bounds of tests/fuzz/ops.py.

    python -m tests.fuzz                       # 1000 cases per op, both backends, 2 processes
    python -m tests.fuzz --cases 200 --ops softmax,rms_norm --backend simulator
    python -m tests.fuzz --op softmax --seed 0 --case 537 --backend simulator   # one case

Every failure prints its inputs and the one line that reproduces it. Exit status 1 if any
case fails. Wall times are measured on this machine's CPU.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor

from .ops import OPS
from .runner import BACKENDS, build, format_failure, init_worker, run_case, run_cases

DEFAULT_SEED = 13
DEFAULT_CASES = 1000
# cases per task handed to a worker process: small enough to balance two workers
CHUNK = 25


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=DEFAULT_CASES, help="cases per op (default 1000)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"run seed (default {DEFAULT_SEED})")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated op names (default: all)")
    parser.add_argument("--op", help="one op (with --case: one case)")
    parser.add_argument("--case", type=int, help="run only this case index (needs --op)")
    parser.add_argument("--backend", choices=BACKENDS + ("both",), default="both")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    args = parser.parse_args(argv)

    ops = [args.op] if args.op else [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        parser.error(f"unknown op(s) {unknown}; expected some of {list(OPS)}")
    backends = BACKENDS if args.backend == "both" else (args.backend,)

    if args.case is not None:
        if not args.op:
            parser.error("--case needs --op")
        _, _, desc = build(args.op, args.seed, args.case)
        print(f"{args.op} case {args.case} (seed {args.seed}): {desc}")
        failed = False
        for backend in backends:
            result = run_case(args.op, args.seed, args.case, backend)
            if result.problem:
                failed = True
                print(format_failure(result, args.seed))
            else:
                print(f"ok   {backend} ({result.seconds:.2f} s)")
        return 1 if failed else 0

    tasks = [(op, args.seed, lo, min(args.cases, lo + CHUNK), backend)
             for op in ops for backend in backends for lo in range(0, args.cases, CHUNK)]
    wall = defaultdict(float)
    counts = defaultdict(int)
    failures = []
    t0 = time.perf_counter()
    if args.jobs > 1:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=init_worker) as pool:
            chunks = pool.map(run_cases, *zip(*tasks))
            results = [r for chunk in chunks for r in chunk]
    else:
        init_worker()
        results = [r for t in tasks for r in run_cases(*t)]
    for r in results:
        wall[r.op, r.backend] += r.seconds
        counts[r.op, r.backend] += 1
        if r.problem:
            failures.append(r)
            print(format_failure(r, args.seed), flush=True)
    total = time.perf_counter() - t0

    print(f"\nfuzz: seed {args.seed}, {args.cases} cases per op and backend, measured (CPU) wall times")
    print(f"{'op':30s} {'backend':10s} {'cases':>6s} {'failed':>6s} {'op time s':>10s}")
    for op in ops:
        for backend in backends:
            n_fail = sum(1 for f in failures if f.op == op and f.backend == backend)
            print(f"{op:30s} {backend:10s} {counts[op, backend]:6d} {n_fail:6d} {wall[op, backend]:10.1f}")
    print(f"{len(failures)} mismatch(es) in {len(results)} runs; {total:.0f} s wall ({args.jobs} process(es))")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

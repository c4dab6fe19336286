#!/usr/bin/env python3
"""Run AWS's nki-samples beta-2 kernels in nki_kernels.simulator.

    python tools/run_nki_samples.py /path/to/nki-samples [--sdk /path/to/aws-neuron-sdk]

Given a checkout of https://github.com/aws-neuron/nki-samples (read at run time; nothing of
it is copied here), this imports its beta-2 tutorial kernels (``import nki``; the rest of
nki-samples is beta 1, ``neuronxcc.nki``, out of scope) and runs them:

* tutorials/matrix_multiplication: the five matmul kernels on bf16 inputs, against a float64
  matmul;
* tutorials/mxfp-matmul (trn3): the MX kernels as its ``mx_toplevel.py`` runs them, on
  inputs from the tutorial's own ``generate_stabilized_mx_data`` and against its own goldens
  (``nc_matmul_mx_golden``, ``quantize_mx_golden``); plus a direct check of
  ``nisa.nc_matmul_mx`` against ``nc_matmul_mx_golden`` on the tutorial's data;
* with ``--sdk PATH`` (an aws-neuron/aws-neuron-sdk checkout), the same runs on the SDK's
  copy of that tutorial, ``nki/deep-dives/src/mxfp-matmul``, which is beta 2 where
  nki-samples' copy is not.

and prints kernel | status | max error | modeled µs. A kernel that is not valid beta 2
(e.g. ``nisa.tensor_copy(..., dtype=...)``: beta-2 ``tensor_copy`` takes ``dst, src, engine,
name``) is reported as such with the simulator's error. Needs numpy and ml_dtypes.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "torch_ext"))


def _load(path: Path, name: str):
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path, help="path of an aws-neuron/nki-samples checkout")
    ap.add_argument("--sdk", type=Path, default=None,
                    help="also an aws-neuron-sdk checkout: its MX deep dive's kernels "
                         "(nki/deep-dives/src/mxfp-matmul, beta 2)")
    args = ap.parse_args(argv)
    tut = args.checkout.resolve() / "src" / "nki_samples" / "tutorials"
    if not tut.is_dir():
        ap.error(f"{args.checkout} is not an nki-samples checkout (no src/nki_samples/tutorials)")
    sdk_mx = None
    if args.sdk is not None:
        sdk_mx = args.sdk.resolve() / "nki" / "deep-dives" / "src" / "mxfp-matmul"
        if not sdk_mx.is_dir():
            ap.error(f"--sdk {args.sdk}: not an aws-neuron-sdk checkout (no nki/deep-dives/src/mxfp-matmul)")

    import ml_dtypes
    import numpy as np

    from nki_kernels import simulator
    from nki_kernels.simulator import harness
    from nki_kernels.simulator.cost import estimate_trace

    simulator.install_aws_harness()  # `import nki` in the samples -> this simulator
    rows = []

    def run(label, kernel, target, args_, ref, kw=None, rtol=2e-2):
        try:
            with simulator.activated(target):
                out = harness.cpu_simulate(kernel)[1](*args_, **(kw or {}))
            res = harness.last_result()
            out = np.asarray(out, dtype=np.float64)
            err = float(np.max(np.abs(out - ref)))
            rel = err / max(float(np.max(np.abs(ref))), 1e-30)
            try:
                us = f"{estimate_trace(res.trace, res.target).latency_us:.1f}"
            except Exception as e:  # noqa: BLE001 (reported)
                us = f"cost model: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
            rows.append((label, "PASS" if rel <= rtol else "MISMATCH",
                         f"{err:.3g} ({rel:.2g} of max|ref|)", us, ""))
        except Exception as e:  # noqa: BLE001
            tb = traceback.extract_tb(e.__traceback__)
            site = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb)
                         if "tutorials" in f.filename), "")
            msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]} {site}"
            invalid = "unexpected keyword argument 'dtype'" in str(e)
            rows.append((label, "NOT BETA 2" if invalid else "FAIL", "-", "-", msg))

    rng = np.random.default_rng(0)
    bf16 = ml_dtypes.bfloat16
    mm = _load(tut / "matrix_multiplication" / "matrix_multiplication_nki_kernels.py", "nki07_mm")
    a = rng.standard_normal((64, 128)).astype(bf16)
    b = rng.standard_normal((128, 512)).astype(bf16)
    run("matmul/nki_matmul_basic_ [64x128x512 bf16]", mm.nki_matmul_basic_, "trn2",
        (np.ascontiguousarray(a.T), b), a.astype(np.float64) @ b.astype(np.float64))
    a = rng.standard_normal((256, 256)).astype(bf16)
    b = rng.standard_normal((256, 1024)).astype(bf16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    for k in ("nki_matmul_tiled_", "nki_matmul_hoist_load_", "nki_matmul_block_free_dimension_"):
        run(f"matmul/{k} [256x256x1024 bf16]", getattr(mm, k), "trn2",
            (np.ascontiguousarray(a.T), b), ref)
    run("matmul/nki_matmul_fully_optimized_ [256x256x1024 bf16, blocks 2/2/2]",
        mm.nki_matmul_fully_optimized_, "trn2", (np.ascontiguousarray(a.T), b), ref,
        dict(TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=2))

    _mx_checks(run, tut / "mxfp-matmul", "nki07_mx_kernels", "mxfp")
    if sdk_mx is not None:
        _mx_checks(run, sdk_mx, "sdk_mx_kernels", "sdk mxfp")

    w = [max(len(r[i]) for r in rows + [("kernel", "status", "max error", "modeled µs", "")])
         for i in range(4)]
    print(" | ".join(h.ljust(w[i]) for i, h in
                     enumerate(("kernel", "status", "max error", "modeled µs"))))
    print("-+-".join("-" * x for x in w))
    for r in rows:
        print(" | ".join(r[i].ljust(w[i]) for i in range(4)))
        if r[4]:
            print(f"{'':{w[0]}}   -> {r[4]}")
    valid = [r for r in rows if r[1] != "NOT BETA 2"]
    print(f"\nvalid beta-2 kernels (and checks) that run and match: "
          f"{sum(r[1] == 'PASS' for r in valid)} of {len(valid)}; not beta 2: "
          f"{len(rows) - len(valid)}")
    return 0


def _mx_checks(run, mxdir: Path, module: str, label: str) -> None:
    """The MX tutorial's runs (its mx_toplevel.py's __main__: every kernel, the dtypes it
    pairs) on inputs from its own generate_stabilized_mx_data, against its own goldens;
    plus nisa.nc_matmul_mx directly against nc_matmul_mx_golden on the same data."""
    import ml_dtypes
    import numpy as np

    from nki_kernels import simulator

    sys.modules.pop("mx_cpu_utils", None)      # each directory brings its own helpers
    sys.modules.pop("mx_kernel_utils", None)
    cpu = _load(mxdir / "mx_cpu_utils.py", "mx_cpu_utils")
    mxk = _load(mxdir / "mx_kernels.py", module)
    nl = simulator.nki_modules()["nki.language"]
    bf16 = ml_dtypes.bfloat16
    e5m2, fp4 = ml_dtypes.float8_e5m2, ml_dtypes.float4_e2m1fn
    x4 = {e5m2: nl.float8_e5m2_x4, ml_dtypes.float8_e4m3fn: nl.float8_e4m3fn_x4, fp4: nl.float4_e2m1fn_x4}
    np.random.seed(0)
    M, K, N = 128, 128, 512
    for q in (e5m2, fp4):
        _, _, st, st_s = cpu.generate_stabilized_mx_data(q, (K, M * 4))
        _, _, mv, mv_s = cpu.generate_stabilized_mx_data(q, (K, N * 4))
        gold = cpu.nc_matmul_mx_golden(st, mv, st_s, mv_s, q, q)
        run(f"{label}/kernel_offline_quantized_mx_matmul [{q.__name__}]",
            mxk.kernel_offline_quantized_mx_matmul, "trn3", (st, st_s, mv, mv_s, x4[q]), gold)
        run(f"{label}/nisa.nc_matmul_mx vs nc_matmul_mx_golden [{q.__name__}]",
            _direct_mx_kernel, "trn3", (st.view(np.uint8), st_s, mv.view(np.uint8), mv_s,
                                        x4[q]), gold, rtol=1e-5)
    for qs, qm in ((fp4, e5m2), (e5m2, e5m2)):
        _, _, st, st_s = cpu.generate_stabilized_mx_data(qs, (K, M * 4))
        mv_fp, _, _, _ = cpu.generate_stabilized_mx_data(qm, (K, N * 4))
        mvq, mvq_s = cpu.quantize_mx_golden(mv_fp, qm)
        gold = cpu.nc_matmul_mx_golden(st, mvq, st_s, mvq_s, qs, qm)
        run(f"{label}/kernel_on_device_quantize_matmul_mx [{qs.__name__} @ {qm.__name__}]",
            mxk.kernel_on_device_quantize_matmul_mx, "trn3",
            (st, st_s, mv_fp.astype(bf16), x4[qs], x4[qm]), gold)
    st_fp, _, _, _ = cpu.generate_stabilized_mx_data(e5m2, (512, 128))
    mv_fp, _, _, _ = cpu.generate_stabilized_mx_data(e5m2, (512, 512))
    for name in ("kernel_copy_strided_quantize_matmul_mx",
                 "kernel_copy_strided_quantize_matmul_mx_packed_scale"):
        if not hasattr(mxk, name):
            continue
        for use_tensor_copy in (True, False):
            run(f"{label}/{name} [e5m2, {'tensor_copy' if use_tensor_copy else 'DMA'}]",
                getattr(mxk, name), "trn3",
                (st_fp.astype(bf16), mv_fp.astype(bf16), x4[e5m2], use_tensor_copy),
                st_fp.T.astype(np.float64) @ mv_fp.astype(np.float64), rtol=5e-2)


def _direct_mx_kernel(st_bytes, st_scale, mv_bytes, mv_scale, mx_dtype):
    """nc_matmul_mx on the tutorial's packed data, scales spread per quadrant."""
    import nki.isa as nisa
    import nki.language as nl

    K = st_bytes.shape[0]
    tiles = []
    for data, scale in ((st_bytes, st_scale), (mv_bytes, mv_scale)):
        raw = nl.ndarray(data.shape, dtype=nl.uint8, buffer=nl.sbuf)
        nisa.dma_copy(raw, data)
        sc = nl.ndarray((K, scale.shape[1]), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.memset(sc, 0)
        for q in range(K // 32):  # scale rows 4q..4q+3 -> partitions 32q..32q+3
            nisa.dma_copy(sc[32 * q:32 * q + 4], scale[4 * q:4 * q + 4])
        tiles.append((raw.view(mx_dtype), sc))
    (st, st_s), (mv, mv_s) = tiles
    out = nl.ndarray((st.shape[1], mv.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(out, st, mv, st_s, mv_s)
    res = nl.ndarray(out.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(res, out)
    hbm = nl.ndarray(out.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(hbm, res)
    return hbm


if __name__ == "__main__":
    sys.exit(main())

"""Numerics of the calibration kernels (benchmarks/calibration/kernels/): each port computes
what its source's reference computes, at a small shape the port supports, in the simulator
(fresh random inputs; the simulator poisons every allocation with NaN, so an output element
the kernel never writes fails the comparison). One section per kernel."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from nki_kernels import simulator

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "benchmarks" / "calibration" / "kernels"
U32 = 2.0 ** -24   # fp32 unit roundoff


def _module(name):
    with simulator.activated():
        spec = importlib.util.spec_from_file_location(f"calibration_kernels_{name}_test", KERNELS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def nkibench():
    return _module("nkibench")


def _output(result):
    return result.outputs[0] if isinstance(result.outputs, (list, tuple)) else result.outputs


# --------------------------------------------------------------------- matmul_add_rmsnorm

def _matmul_add_rmsnorm_reference(x, w, eps, z, g):
    """NKIBench's numpy forward in float64: y = x @ w + z; y * g / sqrt(mean(y ** 2) + eps)."""
    y = x.double() @ w.double() + z.double()
    rms = torch.sqrt((y * y).mean(-1, keepdim=True) + eps)
    return y * g.double() / rms, y, rms


def test_matmul_add_rmsnorm_matches_the_reference(nkibench):
    # 3 row blocks, 3 K tiles, 3 N chunks of 512 (odd counts of every tile).
    M, K, N = 3 * 128, 3 * 128, 3 * 512
    gen = torch.Generator().manual_seed(11)
    # x scaled so that mean(y ** 2) ~ 2 and eps = 0.25 visibly shifts the rms
    x = torch.randn(M, K, generator=gen) / K ** 0.5
    w = torch.randn(K, N, generator=gen)
    z = torch.randn(M, N, generator=gen)
    g = torch.randn(N, generator=gen)
    eps = 0.25
    out = _output(simulator.run(nkibench.matmul_add_rmsnorm, x_tensor=x, w_tensor=w, eps=eps,
                                z_tensor=z, g_tensor=g, target="trn1")).double()
    ref, y, rms = _matmul_add_rmsnorm_reference(x, w, eps, z, g)
    # Forward error bound of fp32: y's K products summed plus z, (K + 2) u (|x| @ |w| + |z|)
    # per element; the rms's relative error is at most mean(|y| E) / mean(y^2) (squares),
    # N u (the row sum) and a few ulp for the divide, add and rsqrt; out = y g / rms.
    err_y = (K + 2) * U32 * (x.double().abs() @ w.double().abs() + z.double().abs())
    rel_rms = (y.abs() * err_y).mean(-1, keepdim=True) / (y * y).mean(-1, keepdim=True) + (N + 8) * U32
    tol = g.double().abs() / rms * err_y + ref.abs() * (rel_rms + 4 * U32)
    assert out.shape == (M, N)
    bad = ~((out - ref).abs() <= tol)   # NaN (an element never written) counts as off
    assert not bool(bad.any()), f"{int(bad.sum())} elements off; max error {(out - ref).abs().max():.3g}"


def test_matmul_add_rmsnorm_rejects_shapes_off_its_tiles(nkibench):
    gen = torch.Generator().manual_seed(12)
    x, w = torch.randn(128, 128, generator=gen), torch.randn(128, 640, generator=gen)
    z, g = torch.randn(128, 640, generator=gen), torch.randn(640, generator=gen)
    with pytest.raises(ValueError, match=r"w_tensor.shape\[1\] \(N\)=640 must be a multiple of 512"):
        simulator.run(nkibench.matmul_add_rmsnorm, x_tensor=x, w_tensor=w, eps=1e-5, z_tensor=z,
                      g_tensor=g, target="trn1")


# ------------------------------------------------------------------------ transpose_matmul

def test_transpose_matmul_matches_the_reference(nkibench):
    # NKIBench's layouts: lhs [K, M] as [128, K/128, M], rhs [K, N] as [128, K/128, N]. M = 9
    # tiles (a full 1024-column block and a 128-column one), 3 K tiles, N = 1224: a full
    # 1024-column block and a partial one of 200 (beta-1's masked tail, here < 512).
    M, KT, N = 9 * 128, 3, 1224
    K = 128 * KT
    gen = torch.Generator().manual_seed(13)
    lhs = torch.randn(K, M, generator=gen)
    rhs = torch.randn(K, N, generator=gen)
    out = _output(simulator.run(nkibench.transpose_matmul, lhs=lhs.reshape(128, KT, M),
                                rhs=rhs.reshape(128, KT, N), target="trn1"))
    assert out.shape == (M // 128, 128, N)
    out = out.reshape(M, N).double()
    ref = lhs.double().T @ rhs.double()
    # fp32 dot products of K terms: |error| <= K u sum_k |lhs_km| |rhs_kn|
    tol = K * U32 * (lhs.double().abs().T @ rhs.double().abs())
    bad = ~((out - ref).abs() <= tol)   # NaN (an element never written) counts as off
    assert not bool(bad.any()), f"{int(bad.sum())} elements off; max error {(out - ref).abs().max():.3g}"


def test_transpose_matmul_rejects_m_off_the_partition_tile(nkibench):
    gen = torch.Generator().manual_seed(14)
    with pytest.raises(ValueError, match=r"lhs.shape\[2\] \(M\)=200 must be a multiple of 128"):
        simulator.run(nkibench.transpose_matmul, lhs=torch.randn(128, 1, 200, generator=gen),
                      rhs=torch.randn(128, 1, 256, generator=gen), target="trn1")

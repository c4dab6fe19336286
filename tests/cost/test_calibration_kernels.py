"""The calibration kernels (benchmarks/calibration/kernels/) compute what their sources'
references compute: each port runs in the simulator at a small shape it supports and is
compared with a float64 reference written from the source's math. Sections per kernel."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from nki_kernels import simulator

ROOT = Path(__file__).resolve().parents[2]


_modules: dict[str, object] = {}


def _calibration_kernel(spec: str):
    """``module:function`` of benchmarks/calibration/kernels, imported with nki bound to the
    simulator (as calibrate.py does)."""
    name, _, fn = spec.partition(":")
    if name not in _modules:
        path = ROOT / "benchmarks" / "calibration" / "kernels" / f"{name}.py"
        with simulator.activated():
            s = importlib.util.spec_from_file_location(f"test_calibration_kernels_{name}", path)
            mod = importlib.util.module_from_spec(s)
            s.loader.exec_module(mod)
        _modules[name] = mod
    return getattr(_modules[name], fn)


def _fp32_matmul_bound(y: torch.Tensor, w: torch.Tensor, k: int) -> torch.Tensor:
    """Elementwise error bound of an fp32 y @ w with y itself computed in fp32 from a
    K-term sum of squares: gamma_K (K roundings of the dot product's accumulation) plus the
    normalisation's relative error (the sum of squares' K roundings, halved by the rsqrt,
    and a few roundings of rsqrt and the multiplies), both times |y| @ |w|. u = 2^-24."""
    return (2 * k + 16) * 2.0 ** -24 * (y.abs() @ w.abs())


# ---------------------------------------------------------------------------- rmsnorm_matmul
# NKIBench rmsnorm_matmul_M4096_N2048_K1024 (reference rmsnorm_matmul_..._numpy_1.py):
# x / sqrt(sum(x^2 / K, axis=1)) @ w, on x [T, 128, K] and w [K/128, 128, N].

def _rmsnorm_matmul_ref(x, w):
    xd = x.double().reshape(-1, x.shape[2])
    y = xd / torch.sqrt((xd.square() / x.shape[2]).sum(dim=1, keepdim=True))
    wd = w.double().reshape(-1, w.shape[2])
    return y, wd, (y @ wd).reshape(x.shape[0], x.shape[1], w.shape[2])


def test_rmsnorm_matmul_matches_the_numpy_reference():
    # 6 row tiles in 2 blocks of 3, K = 3 x 512 (12 K tiles), N = one 1024-column part
    x = torch.randn(6, 128, 1536)
    w = torch.randn(12, 128, 1024)
    out = simulator.run(_calibration_kernel("nkibench:rmsnorm_matmul"), target="trn1", x=x, w=w,
                        rows_per_block=3).outputs
    y, wd, ref = _rmsnorm_matmul_ref(x, w)
    bound = _fp32_matmul_bound(y, wd, 1536).reshape(ref.shape)
    err = (torch.as_tensor(out).double() - ref).abs()
    assert out.shape == (6, 128, 1024) and bool((err <= bound).all()), float((err / bound).max())


@pytest.mark.parametrize("x_shape, w_shape, block, match", [
    ((3, 64, 512), (4, 64, 1024), 3, r"x.shape\[1\]=64"),
    ((3, 128, 640), (5, 128, 1024), 3, r"x.shape\[2\]=640 must be a multiple of 512"),
    ((3, 128, 512), (8, 128, 1024), 3, r"equal w.shape\[0\] x 128 = 1024"),
    ((3, 128, 512), (4, 128, 512), 3, r"w.shape\[2\]=512 must be a multiple of 1024"),
    ((3, 128, 512), (4, 128, 1024), 2, r"x.shape\[0\]=3 must be a multiple of rows_per_block=2"),
])
def test_rmsnorm_matmul_rejects_shapes_it_does_not_tile(x_shape, w_shape, block, match):
    with pytest.raises(ValueError, match=match):
        simulator.run(_calibration_kernel("nkibench:rmsnorm_matmul"), target="trn1", x=torch.randn(x_shape),
                      w=torch.randn(w_shape), rows_per_block=block)


# ------------------------------------------------------------------------ add_rmsnorm_matmul
# NKIBench add_rmsnorm_matmul_M4096_N2048_K1024 (reference add_rmsnorm_matmul_..._numpy_1.py):
# y = x + z; y / sqrt(sum(y^2 / K) + eps) * g @ w.

def _add_rmsnorm_matmul_ref(x, w, eps, z, g):
    y = x.double() + z.double()
    t = (y.square() / y.shape[-1]).sum(dim=-1, keepdim=True) + eps
    y = y / torch.sqrt(t) * g.double()
    return y, w.double(), y @ w.double()


def test_add_rmsnorm_matmul_matches_the_numpy_reference():
    # M, K = 3 tiles of 128 (K < 512: g's broadcast takes one partial 512-column piece),
    # N = 3 x 512; eps = 0.5 is large against mean(y^2) ~ 2, so a lost eps shows (~12 %)
    m, k, n, eps = 384, 384, 1536, 0.5
    x, z, w, g = torch.randn(m, k), torch.randn(m, k), torch.randn(k, n), torch.randn(k)
    out = simulator.run(_calibration_kernel("nkibench:add_rmsnorm_matmul"), target="trn1", x_tensor=x,
                        w_tensor=w, eps=eps, z_tensor=z, g_tensor=g).outputs
    y, wd, ref = _add_rmsnorm_matmul_ref(x, w, eps, z, g)
    err = (torch.as_tensor(out).double() - ref).abs()
    bound = _fp32_matmul_bound(y, wd, k)
    assert out.shape == (m, n) and bool((err <= bound).all()), float((err / bound).max())


@pytest.mark.parametrize("shapes, match", [
    (((256, 128), (128, 512), (256, 256), (128,)), r"z_tensor.shape=\(256, 256\) must equal"),
    (((256, 128), (256, 512), (256, 128), (128,)), r"w_tensor.shape\[0\]=256"),
    (((256, 128), (128, 512), (256, 128), (64,)), r"g_tensor.shape=\(64,\)"),
    (((200, 128), (128, 512), (200, 128), (128,)), r"M and K must be multiples of 128"),
    (((256, 128), (128, 640), (256, 128), (128,)), r"w_tensor.shape\[1\]=640 must be a multiple of 512"),
])
def test_add_rmsnorm_matmul_rejects_shapes_it_does_not_tile(shapes, match):
    x, w, z, g = (torch.randn(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        simulator.run(_calibration_kernel("nkibench:add_rmsnorm_matmul"), target="trn1", x_tensor=x,
                      w_tensor=w, eps=1e-5, z_tensor=z, g_tensor=g)

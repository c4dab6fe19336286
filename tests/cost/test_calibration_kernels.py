"""The calibration kernels (benchmarks/calibration/kernels/) compute what their sources'
references compute: each port runs in the simulator at a small shape and is compared with a
float64 reference written from the source's own reference code. One section per kernel."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from nki_kernels import simulator

KERNELS = Path(__file__).resolve().parents[2] / "benchmarks" / "calibration" / "kernels"
_modules: dict[str, object] = {}


def calibration_kernel(module: str, function: str):
    """``function`` of benchmarks/calibration/kernels/<module>.py, imported with nki bound to
    the simulator (as benchmarks/calibrate.py imports it)."""
    if module not in _modules:
        with simulator.activated():
            spec = importlib.util.spec_from_file_location(f"test_calibration_kernels_{module}",
                                                          KERNELS / f"{module}.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        _modules[module] = mod
    return getattr(_modules[module], function)


# ---------------------------------------------------------------------------------------
# nkibench.adamw (NKIBench adamw_M10944_N2048; reference NKIBench/reference/
# adamw_M10944_N2048_numpy_1.py: theta, g, m ~ N(0, 1), v = |N(0, 1)|)

def _adamw_reference(theta, g, m, v):
    """The numpy reference's step in float64; also the update term, whose size bounds the
    rounding error of the fp32 result."""
    theta, g, m, v = (t.double() for t in (theta, g, m, v))
    decayed = theta - 1e-5 * theta
    m_t = 0.9 * m + 0.1 * g
    v_t = 0.999 * v + 0.001 * g * g
    update = 0.01 * m_t / (torch.sqrt(v_t * 1000) + 1e-8)
    return decayed - update, update


def _adamw_inputs(rows, cols, seed):
    gen = torch.Generator().manual_seed(seed)
    theta, g, m, v = (torch.randn(rows, cols, generator=gen) for _ in range(4))
    return {"theta": theta, "g": g, "m": m, "v": v.abs()}


@pytest.mark.parametrize("rows, cols", [(320, 3072), (384, 1024)])
def test_adamw_port_computes_the_nkibench_reference(rows, cols):
    # 320 rows: two full row tiles and a 64-row one (the beta-1 kernel's row mask, as at
    # M = 10944); 3072 columns: three 1024-column blocks. 384 x 1024: tile-exact.
    args = _adamw_inputs(rows, cols, seed=rows + cols)
    out = simulator.run(calibration_kernel("nkibench", "adamw"), target="trn1", **args).outputs
    ref, update = _adamw_reference(**args)
    assert out.shape == (rows, cols) and out.dtype == torch.float32
    assert torch.isfinite(out).all()   # the output is NaN-poisoned: every element was stored
    # fp32 chain: ~10 roundings (each <= 2^-24 relative) on the decayed theta and on the
    # update, whose sqrt and reciprocal can make it larger than theta where v and g are
    # small; 1e-6 of |decayed| + |update| is ~16 roundings' worth.
    bound = 1e-6 * (ref.abs() + 2 * update.abs()) + 1e-12
    err = (out.double() - ref).abs()
    assert (err <= bound).all(), f"max error {err.max():.3g}, worst ratio {(err / bound).max():.3g}"


def test_adamw_port_rejects_columns_that_are_not_whole_blocks():
    args = _adamw_inputs(128, 1536, seed=1)
    with pytest.raises(ValueError, match=r"theta.shape\[1\]=1536 must be a multiple of 1024"):
        simulator.run(calibration_kernel("nkibench", "adamw"), target="trn1", **args)

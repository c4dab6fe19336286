"""Shapes, tolerances and input makers shared by the op tests (norms, activations, softmax, rotary)."""

from __future__ import annotations

import itertools

import pytest
import torch

from tests._helpers import TOLERANCES, rel_error  # noqa: F401  (re-exported)

# Row counts (tokens) and hidden sizes: rows not multiples of 128 (1, 7, 129)
# plus the ViT-B/16 batch of 8 (197 * 8 = 1576 = 12 * 128 + 40, a tail of 40); hidden sizes
# not multiples of 512 (64, 768, 1000) next to 4096 and the largest supported, 8192.
ROWS = [1, 7, 129, 197 * 8]
HIDDEN = [64, 768, 1000, 4096, 8192]
DTYPES = [torch.float32, torch.bfloat16]
DTYPE_IDS = ["fp32", "bf16"]

# The default tier keeps one shape per feature: a single row, a row tail with a non-512
# hidden, one full row block + tail, a packed small-hidden batch, and the largest shape
# (bf16 only by default: it is the one the report quotes; fp32 at that size runs in sweep).
LEAN = [
    (1, 8192, DTYPES),            # one partition, widest row, 16 bn_stats chunks
    (7, 1000, DTYPES),            # tail only, hidden not a multiple of 512
    (129, 768, DTYPES),           # one full 128-row tile + 1-row tail
    (1576, 64, DTYPES),           # 12 rows per partition packed, tail of 40
    (1576, 8192, [torch.bfloat16]),  # the largest tested shape
]


def _dtype_id(dtype):
    return DTYPE_IDS[DTYPES.index(dtype)]


def grid():
    """pytest params (rows, hidden, dtype): LEAN in the default tier, the full cross product
    ROWS x HIDDEN x DTYPES in the sweep tier (ids prefixed "sweep-")."""
    params = [pytest.param(r, h, d, id=f"{r}x{h}-{_dtype_id(d)}") for r, h, ds in LEAN for d in ds]
    params += [pytest.param(r, h, d, marks=pytest.mark.sweep, id=f"sweep-{r}x{h}-{_dtype_id(d)}")
               for r, h, d in itertools.product(ROWS, HIDDEN, DTYPES)]
    return params


GRID = grid()


# Relative-error (||out - ref|| / ||ref||) bounds vs float64. One bf16 rounding is <= 2**-9
# relative (round to nearest), ~1.1e-3 RMS; layer_norm's 16-bit affine rounds three times
# (~2.5e-3 measured) -> 4e-3 bounds every bf16 kernel. fp16: one rounding <= 2**-12
# relative, ~1.4e-4 RMS -> 5e-4. fp32 kernels compute in fp32 throughout (~1e-7
# measured) -> 2e-6.
REL_BOUND = {torch.float32: 2e-6, torch.bfloat16: 4e-3, torch.float16: 5e-4}


def randn(*shape, dtype=torch.float32, scale=1.0, shift=0.0):
    """Fresh normal data (never zeros) rounded to ``dtype``."""
    return (torch.randn(*shape) * scale + shift).to(dtype)


def assert_matches(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, rel: float | None = None):
    """out (the kernel's) against a float64 expected, with the per-dtype tolerances."""
    assert out.dtype == dtype, f"dtype {out.dtype}, expected {dtype}"
    assert out.shape == expected.shape, f"shape {tuple(out.shape)}, expected {tuple(expected.shape)}"
    assert not torch.isnan(out).any(), "NaN in the output: an element was never written"
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), expected.double(), atol=atol, rtol=rtol)
    bound = REL_BOUND[dtype] if rel is None else rel
    err = rel_error(out, expected)
    assert err < bound, f"relative error {err:.3e} exceeds {bound:.1e}"
    return err


def run_traced(call, lnc=2, target="trn2"):
    """Run a kernel call in the simulator at launch degree ``lnc`` on ``target``: (its output
    as a tensor, its instruction trace), for tests of which engines or forms a kernel takes."""
    from nki_kernels import _dispatch, simulator

    with simulator.activated(target):
        kernel = _dispatch.simulator_kernel(call)
    result = simulator.run(kernel[lnc], *[t.contiguous() for t in call.tensors], **call.static, target=target)
    return torch.as_tensor(result.outputs), result.trace

"""Norms for a few rows (token generation): the hidden-on-partitions kernels of
kernels/norm_decode.py, through the ops on the simulator backend, against float64."""

from __future__ import annotations

import pytest
import torch

import nki_kernels
from nki_kernels import references
from nki_kernels.ops import norms

from ._cases import assert_matches, randn

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
MAX_ROWS = norms.DECODE_MAX_ROWS

# (rows, hidden, dtype): one token, a few, an odd count, the most rows the kernel takes
CASES = [(1, 2048, BF16), (4, 2048, F16), (7, 4096, F32), (3, 128, BF16), (MAX_ROWS, 1024, BF16)]


@pytest.mark.parametrize("rows, hidden, dtype", CASES, ids=[f"{r}x{h}-{str(d)[6:]}" for r, h, d in CASES])
@pytest.mark.parametrize("affine", ["weight", "none"])
def test_rms_norm_decode(simulator_backend, rows, hidden, dtype, affine):
    x = randn(2, rows // 2, hidden, dtype=dtype) if rows % 2 == 0 else randn(rows, hidden, dtype=dtype)
    w = randn(hidden, dtype=dtype) if affine == "weight" else None
    out = nki_kernels.rms_norm(x, (hidden,), w, 1e-6)
    expected = references.rms_norm(x.double(), (hidden,), None if w is None else w.double(), 1e-6,
                                   compute_dtype=torch.float64)
    assert_matches(out, expected, dtype, rel=None if dtype != F16 else 2e-3)


@pytest.mark.parametrize("rows, hidden, dtype", CASES, ids=[f"{r}x{h}-{str(d)[6:]}" for r, h, d in CASES])
@pytest.mark.parametrize("affine", ["weight+bias", "weight", "bias", "none"])
def test_layer_norm_decode(simulator_backend, rows, hidden, dtype, affine):
    # a large mean: the two-pass statistics keep the variance exact
    x = randn(rows, hidden, dtype=dtype, scale=2.0, shift=300.0 if dtype == F32 else 30.0)
    w = randn(hidden, dtype=dtype) if "weight" in affine else None
    b = randn(hidden, dtype=dtype) if "bias" in affine else None
    out = nki_kernels.layer_norm(x, (hidden,), w, b, 1e-5)
    expected = references.layer_norm(x.double(), (hidden,), None if w is None else w.double(),
                                     None if b is None else b.double(), 1e-5, compute_dtype=torch.float64)
    assert_matches(out, expected, dtype, rel=None if dtype != F16 else 2e-3)


@pytest.mark.parametrize("rows, hidden, decode", [
    (MAX_ROWS, 1024, True), (MAX_ROWS + 1, 1024, False),   # the row count limit
    (4, 1000, False),                                       # hidden not a multiple of 128
    (40, 8192 * 4, False),                                  # 40 x 256 = 10240 elements per partition
])
def test_decode_kernel_is_chosen_by_shape(rows, hidden, decode):
    if hidden > norms.MAX_HIDDEN:
        pytest.skip(f"hidden {hidden} is above the kernels' limit {norms.MAX_HIDDEN} on this branch")
    x = torch.randn(rows, hidden)
    call = norms.rms_norm_kernel_call(x, (hidden,), None, 1e-6)
    assert (call.module == "norm_decode") is decode
    call = norms.layer_norm_kernel_call(x, (hidden,), None, None, 1e-5)
    assert (call.module == "norm_decode") is decode

"""gelu (foundation kernel, over this issue's shapes), silu, silu_and_mul and gelu_and_mul:
NKI kernels in the simulator vs float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nki_kernels
from nki_kernels import references

from ._cases import DTYPE_IDS, DTYPES, GRID, assert_matches, randn


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("rows, hidden, dtype", GRID)
def test_gelu(simulator_backend, rows, hidden, dtype, approximate):
    x = randn(rows, hidden, dtype=dtype, scale=3.0)
    out = nki_kernels.gelu(x, approximate=approximate)
    expected = references.gelu(x.double(), approximate, compute_dtype=torch.float64)
    assert_matches(out, expected, dtype)


@pytest.mark.parametrize("rows, hidden, dtype", GRID)
def test_silu(simulator_backend, rows, hidden, dtype):
    x = randn(rows, hidden, dtype=dtype, scale=3.0)
    out = nki_kernels.silu(x)
    assert_matches(out, references.silu(x.double(), compute_dtype=torch.float64), dtype)


# (op name, public call, float64 twin)
GATED = [
    ("silu_and_mul", lambda x: nki_kernels.silu_and_mul(x),
     lambda x: references.silu_and_mul(x, compute_dtype=torch.float64)),
    ("gelu_and_mul", lambda x: nki_kernels.gelu_and_mul(x),
     lambda x: references.gelu_and_mul(x, "none", compute_dtype=torch.float64)),
    ("gelu_tanh_and_mul", lambda x: nki_kernels.gelu_and_mul(x, approximate="tanh"),
     lambda x: references.gelu_and_mul(x, "tanh", compute_dtype=torch.float64)),
]
GATED_IDS = [g[0] for g in GATED]


@pytest.mark.parametrize("name, op, twin", GATED, ids=GATED_IDS)
@pytest.mark.parametrize("rows, hidden, dtype", GRID)
def test_gated(simulator_backend, rows, hidden, dtype, name, op, twin):
    # hidden is the output width d; the input row is 2d (d = 8192: column-chunked path)
    x = randn(rows, 2 * hidden, dtype=dtype, scale=2.0)
    out = op(x)
    assert out.shape == (rows, hidden)
    assert_matches(out, twin(x.double()), dtype)


@pytest.mark.parametrize("name, op, twin", GATED, ids=GATED_IDS)
def test_gated_leading_dims_and_odd_width(simulator_backend, name, op, twin):
    x = randn(3, 43, 2 * 333)
    out = op(x)
    assert out.shape == (3, 43, 333)
    assert_matches(out, twin(x.double()), torch.float32)


# gelu_and_mul "none" runs the NKI backward kernel, "tanh" the PyTorch recompute path
@pytest.mark.parametrize("name", ["silu", "silu_and_mul", "gelu_and_mul-none", "gelu_and_mul-tanh"])
def test_activation_backward_matches_torch(simulator_backend, name):
    x = randn(4, 130).requires_grad_(True)
    xr = x.detach().double().requires_grad_(True)
    if name == "silu":
        out, ref = nki_kernels.silu(x), F.silu(xr)
    elif name == "silu_and_mul":
        out, ref = nki_kernels.silu_and_mul(x), F.silu(xr[:, :65]) * xr[:, 65:]
    else:
        approximate = name.split("-")[1]
        out = nki_kernels.gelu_and_mul(x, approximate)
        ref = F.gelu(xr[:, :65], approximate=approximate) * xr[:, 65:]
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad.double())
    # fp32 kernels against float64 autograd
    torch.testing.assert_close(x.grad.double(), xr.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_activations_reference_path(reference_backend, dtype):
    from tests._helpers import TOLERANCES

    x = randn(4, 34, dtype=dtype)
    atol, rtol = TOLERANCES[dtype]
    x64 = x.double()
    torch.testing.assert_close(nki_kernels.silu(x).double(), F.silu(x64), atol=atol, rtol=rtol)
    torch.testing.assert_close(nki_kernels.silu_and_mul(x).double(), F.silu(x64[:, :17]) * x64[:, 17:],
                               atol=atol, rtol=rtol)
    torch.testing.assert_close(nki_kernels.gelu_and_mul(x).double(), F.gelu(x64[:, :17]) * x64[:, 17:],
                               atol=atol, rtol=rtol)

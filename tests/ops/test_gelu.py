"""gelu: the foundation op, through the reference path and the NKI kernel in the simulator."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nki_kernels
from tests._helpers import TOLERANCES, rel_error

# Element counts around the kernel's tiling: < 128 (tail only), 128*k (body only),
# 128*k + r (body and tail), a body wider than one 2048-column chunk, and shapes whose
# last dims are not multiples of 128 or 512.
SHAPES = [(7,), (128,), (3, 129), (197, 768), (2, 7, 1000), (129, 4096)]
DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gelu_kernel_in_simulator(simulator_backend, shape, dtype, approximate):
    x = (torch.randn(shape) * 3).to(dtype)
    out = nki_kernels.gelu(x, approximate=approximate)
    expected = F.gelu(x.double(), approximate=approximate)
    atol, rtol = TOLERANCES[dtype]
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=rtol)
    assert rel_error(out, expected) < (1e-6 if dtype == torch.float32 else 4e-3)


def test_gelu_kernel_writes_every_element(simulator_backend):
    # The simulator fills new HBM outputs with NaN: a skipped element would show as NaN.
    x = torch.randn(5, 259)
    assert not torch.isnan(nki_kernels.gelu(x)).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_gelu_reference_path(reference_backend, dtype):
    x = torch.randn(4, 33).to(dtype)
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(
        nki_kernels.gelu(x).double(), F.gelu(x.double()), atol=atol, rtol=rtol
    )


# "none" runs the NKI backward kernel; "tanh" has none and recomputes with PyTorch's
# autograd on the reference (tests/kernels/test_activation_backward.py): both against float64
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_backward_matches_torch(simulator_backend, approximate):
    x = torch.randn(3, 130, dtype=torch.float64).float().requires_grad_(True)
    x_ref = x.detach().double().requires_grad_(True)
    grad = torch.randn(3, 130)
    nki_kernels.gelu(x, approximate=approximate).backward(grad)
    F.gelu(x_ref, approximate=approximate).backward(grad.double())
    # fp32 kernel against float64: a few ulps of fp32 per element
    torch.testing.assert_close(x.grad.double(), x_ref.grad, atol=1e-5, rtol=1e-4)


def test_gelu_opcheck():
    x = torch.randn(3, 130, requires_grad=True)
    torch.library.opcheck(nki_kernels.registry.get("gelu").custom_op, (x, "tanh"))


def test_gelu_compiles_fullgraph():
    compiled = torch.compile(lambda t: nki_kernels.gelu(t) * 2, fullgraph=True, backend="eager")
    x = torch.randn(9, 17)
    torch.testing.assert_close(compiled(x), F.gelu(x) * 2)


@pytest.mark.parametrize(
    "bad, error, words",
    [
        (lambda: nki_kernels.gelu(torch.arange(6)), TypeError, ["input", "int64"]),
        (lambda: nki_kernels.gelu(torch.randn(3), approximate="fast"), ValueError, ["approximate", "'fast'"]),
        (lambda: nki_kernels.gelu([1.0, 2.0]), TypeError, ["input", "list"]),
    ],
    ids=["integer", "approximate", "not-a-tensor"],
)
def test_gelu_bad_input(bad, error, words):
    with pytest.raises(error) as info:
        bad()
    for word in words:
        assert word in str(info.value)


def test_cpu_backend_switch_rejects_unknown_value(monkeypatch):
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "gpu")
    with pytest.raises(ValueError, match="NKI_KERNELS_CPU_BACKEND='gpu'"):
        nki_kernels.gelu(torch.randn(4))


@pytest.mark.parametrize("backend", ["reference", "simulator"])
def test_erf_gelu_of_infinities(monkeypatch, backend):
    # README ("non-finite cases"): gelu(+inf) is +inf (float64 torch), which the kernel gives;
    # the reference backend is torch's fp32 CPU erf-gelu, bit for bit, whose value at +inf
    # differs between machines (NaN on those of earlier sessions, +inf on this session's
    # AMD EPYC, 2026-12-06), so it is held to torch's own output on the whole tensor, not to
    # either value. -inf gives NaN everywhere (-inf * Phi(-inf) = -inf * 0); finite values
    # stay right.
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    x = torch.randn(4, 130) * 3
    x[0, 5], x[2, 77] = float("inf"), float("-inf")
    out = nki_kernels.gelu(x)
    exact = F.gelu(x.double())
    assert exact[0, 5] == float("inf") and exact[2, 77].isnan()
    if backend == "simulator":
        assert out[0, 5] == float("inf")
    else:                      # torch's fp32 result, whatever this machine's path gives
        torch.testing.assert_close(out, F.gelu(x), equal_nan=True, atol=0, rtol=0)
    assert out[2, 77].isnan()
    finite = torch.isfinite(x)
    torch.testing.assert_close(out[finite].double(), exact[finite], atol=1e-5, rtol=1e-4)

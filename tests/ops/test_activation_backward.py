"""Backward of gelu, silu, silu_and_mul and gelu_and_mul: gradients of the public ops on both
CPU backends (kernels/activation_backward.py in the simulator; backward_references.py on
the reference backend) against float64 autograd of torch's own forward; the backward ops'
opcheck; gelu's tanh form takes the recompute backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nki_kernels
from nki_kernels.ops import activations

from ._cases import rel_error

# Bounds per dtype as max |error| / max |expected| and ||error|| / ||expected||: f' and the
# products in fp32, one rounding of each output (bf16 <= 2**-9 relative, fp16 <= 2**-12;
# measured bf16 <= 2.7e-3, fp16 <= 3.2e-4 max-relative); fp32 ~2e-7.
MAX_REL = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}
NORM_REL = {torch.float32: 1e-6, torch.bfloat16: 4e-3, torch.float16: 5e-4}
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.float16, id="fp16")]


def _gated(act):
    def eager(x):
        d = x.shape[-1] // 2
        return act(x[..., :d]) * x[..., d:]
    return eager


# (name, our op, torch's eager composition, shapes): elementwise shapes of < 128 elements
# (tail only), a 128-multiple body with a tail, a tile-exact body; gated rows packed J per
# partition, one row, and rows wider than a column chunk (4096 outputs)
OPS = [
    ("gelu", nki_kernels.gelu, F.gelu, [(7,), (3, 129, 7), (256, 64)]),
    ("silu", nki_kernels.silu, F.silu, [(7,), (3, 129, 7), (256, 64)]),
    ("silu_and_mul", nki_kernels.silu_and_mul, _gated(F.silu), [(3, 130, 80), (1, 2), (129, 2 * 4100)]),
    ("gelu_and_mul", nki_kernels.gelu_and_mul, _gated(F.gelu), [(3, 130, 80), (1, 2), (129, 2 * 4100)]),
]
CASES = [pytest.param(name, ours, eager, shape, id=f"{name}-{'x'.join(map(str, shape))}")
         for name, ours, eager, shapes in OPS for shape in shapes]


@pytest.mark.parametrize("backend", ["simulator", "reference"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, ours, eager, shape", CASES)
def test_gradients_match_float64_autograd(monkeypatch, backend, dtype, name, ours, eager, shape):
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    x = (torch.randn(*shape) * 2).to(dtype).requires_grad_(True)
    out = ours(x)
    dy = torch.randn(out.shape).to(dtype)
    (got,) = torch.autograd.grad(out, x, dy)
    x64 = x.detach().double().requires_grad_(True)
    (want,) = torch.autograd.grad(eager(x64), x64, dy.double())
    assert got.dtype == dtype and got.shape == x.shape
    assert not torch.isnan(got).any()
    err = float((got.double() - want).abs().max()) / float(want.abs().max())
    assert err < MAX_REL[dtype], f"max error {err:.2e} of max |expected|"
    assert rel_error(got, want) < NORM_REL[dtype]


def test_silu_and_mul_backward_16bit_rounds_once(simulator_backend):
    # d gate = dy * up * silu'(gate) and d up = dy * silu(gate), each in fp32 and rounded
    # once: bf16 gradients are the float64 ones rounded to bf16 but for values within fp32's
    # error of a bf16 midpoint (~1e-4 of them). Mutation testing found dy * up held in bf16
    # (26 % of d gate off by one bf16 step) inside the bf16 tolerance above.
    x = (torch.randn(130, 2 * 768) * 3).to(torch.bfloat16).requires_grad_(True)
    out = nki_kernels.silu_and_mul(x)
    dy = torch.randn(out.shape).to(torch.bfloat16)
    (got,) = torch.autograd.grad(out, x, dy)
    x64 = x.detach().double().requires_grad_(True)
    (want,) = torch.autograd.grad(_gated(F.silu)(x64), x64, dy.double())
    for half, name in ((slice(0, 768), "d gate"), (slice(768, None), "d up")):
        off = (got[:, half] != want[:, half].to(torch.bfloat16)).float().mean().item()
        assert off < 1e-3, f"{name}: {off:.2%} not the float64 gradient rounded once"


@pytest.mark.parametrize("fn, spied", [
    (lambda x: nki_kernels.gelu(x, "tanh"), "_gelu_backward_op"),
    (lambda x: nki_kernels.gelu_and_mul(x, "tanh"), "_gelu_and_mul_backward_op"),
], ids=["gelu", "gelu_and_mul"])
def test_gelu_tanh_recomputes(simulator_backend, monkeypatch, fn, spied):
    # ScalarE has no derivative of the tanh approximation: the recompute backward runs
    monkeypatch.setattr(activations, spied, lambda *a: pytest.fail("the backward op ran for approximate='tanh'"))
    x = torch.randn(4, 40, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda t: fn(t.float()).double(), (x,), eps=1e-3, atol=1e-3, rtol=1e-3)


def test_backward_kernel_call_rejects_gelu_tanh():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"approximate='tanh': the NKI backward kernels take gelu's erf form only"):
        activations.gelu_backward_kernel_call(x, x, "tanh")


BACKWARD_OPS = [
    ("gelu", activations._gelu_backward_op, lambda g: (g(4, 33), g(4, 33), "none")),
    ("gelu_tanh_reference", activations._gelu_backward_op, lambda g: (g(4, 33), g(4, 33), "tanh")),
    ("silu", activations._silu_backward_op, lambda g: (g(2, 5, 7), g(2, 5, 7))),
    ("silu_and_mul", activations._silu_and_mul_backward_op, lambda g: (g(2, 5, 17), g(2, 5, 34))),
    ("gelu_and_mul", activations._gelu_and_mul_backward_op, lambda g: (g(3, 17), g(3, 34), "none")),
]


# the tanh form has no backward kernel (test_backward_kernel_call_rejects_gelu_tanh): its
# backward op is checked on the reference backend only
OPCHECK = [pytest.param(backend, name, op, make, id=f"{name}-{backend}") for name, op, make in BACKWARD_OPS
           for backend in ("simulator", "reference") if not (name.endswith("_reference") and backend == "simulator")]


@pytest.mark.parametrize("backend, name, op, make", OPCHECK)
def test_opcheck_backward_ops(monkeypatch, backend, name, op, make):
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    torch.library.opcheck(op, make(lambda *s: torch.randn(*s, requires_grad=True)))


def test_compile_fullgraph_forward_and_backward(simulator_backend):
    def block(x):
        return (nki_kernels.silu_and_mul(x) * nki_kernels.gelu(x[..., :16])).sum() + nki_kernels.silu(x).sum()

    def eager(x):
        return (F.silu(x[..., :16]) * x[..., 16:] * F.gelu(x[..., :16])).sum() + F.silu(x).sum()

    x = torch.randn(5, 32)
    a = x.clone().requires_grad_(True)
    (got,) = torch.autograd.grad(torch.compile(block, fullgraph=True, backend="aot_eager")(a), a)
    b = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(eager(b), b)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)

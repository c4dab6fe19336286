"""Cases of backward_references' twins that the ops' gradient tests do not reach: the tanh
form of gelu's derivative (the ops recompute it, so only a direct call of a twin or of a
backward op uses it), rms_norm's default eps in float64, and the dtype of a 16-bit weight
gradient. Twins in float64 against float64 autograd of torch's own forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nki_kernels import backward_references
from nki_kernels.ops import activations, norms

F64 = torch.float64


def _gated(act):
    def fn(x):
        d = x.shape[-1] // 2
        return act(x[..., :d]) * x[..., d:]
    return fn


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("name, twin, eager", [
    ("gelu", backward_references.gelu_backward, F.gelu),
    ("gelu_and_mul", backward_references.gelu_and_mul_backward, None),
])
def test_gelu_twins_match_float64_autograd(name, twin, eager, approximate):
    x = torch.randn(5, 3, 64, dtype=F64) * 2
    act = lambda t: F.gelu(t, approximate=approximate)  # noqa: E731
    fn = act if eager is not None else _gated(act)
    leaf = x.clone().requires_grad_(True)
    out = fn(leaf)
    dy = torch.randn_like(out)
    (want,) = torch.autograd.grad(out, leaf, dy)
    got = twin(dy, x, approximate, compute_dtype=F64)
    # float64 throughout; the formulas differ from autograd's only in operation order
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("name, op, eager", [
    ("gelu", activations._gelu_backward_op, F.gelu),
    ("gelu_and_mul", activations._gelu_and_mul_backward_op, None),
])
def test_backward_ops_take_the_tanh_form_on_the_reference_backend(reference_backend, name, op, eager):
    # the backward ops are public custom ops: called with "tanh", they give tanh's
    # derivative (fp32 arithmetic: ~1e-7 relative, bounded at 1e-5)
    x = torch.randn(7, 96) * 2
    act = lambda t: F.gelu(t, approximate="tanh")  # noqa: E731
    fn = act if eager is not None else _gated(act)
    x64 = x.double().requires_grad_(True)
    out = fn(x64)
    dy = torch.randn(out.shape)
    (want,) = torch.autograd.grad(out, x64, dy.double())
    got = op(dy, x, "tanh")
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rms_norm_twin_default_eps_is_the_input_dtype_s(dtype):
    # eps=None is torch.finfo(input.dtype).eps, as F.rms_norm takes it; rows of mean square
    # ~1e-12 make eps a visible part of the normaliser (float32's eps would be 1e-4 of it
    # for float64 input)
    x = (torch.randn(6, 48, dtype=F64) * 1e-6).to(dtype)
    w, dy = torch.randn(48, dtype=dtype), torch.randn(6, 48, dtype=dtype)
    got = backward_references.rms_norm_backward(dy, x, [48], w, None, compute_dtype=F64)
    leaves = [x.double().requires_grad_(True), w.double().requires_grad_(True)]
    eps = torch.finfo(dtype).eps
    want = torch.autograd.grad(F.rms_norm(leaves[0], (48,), leaves[1], eps), leaves, dy.double())
    for g, e in zip(got, want):
        # float64 arithmetic on exact float64 copies of the inputs, then one rounding to the
        # input dtype (float32: 2**-24 relative)
        rtol = 1e-9 if dtype == F64 else 2.0 ** -23
        torch.testing.assert_close(g.double(), e, atol=1e-10 * float(e.abs().max()), rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_weight_gradients_are_in_the_weight_dtype(reference_backend, dtype):
    # a custom op's outputs must have its fake's dtypes (torch.compile checks them): the
    # backward ops' weight gradients come back in the weight's dtype, like the twins'
    x, w, dy = (torch.randn(4, 40).to(dtype) for _ in range(3))
    w = w[0]
    for grads in (backward_references.rms_norm_backward(dy, x, [40], w, 1e-6),
                  norms._rms_norm_backward_op(dy, x, [40], w, 1e-6),
                  backward_references.fused_add_rms_norm_backward(dy, dy, x, w, 1e-6),
                  backward_references.layer_norm_backward(dy, x, [40], w, w, 1e-5)):
        assert [g.dtype for g in grads] == [dtype] * len(grads)


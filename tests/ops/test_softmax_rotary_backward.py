"""Backward of softmax and apply_rotary_pos_emb: gradients of the public ops on both CPU
backends against float64 autograd of torch's (transformers') forward; the backward ops'
opcheck; the recompute path for what the kernels do not take."""

from __future__ import annotations

import pytest
import torch

import nki_kernels
from nki_kernels.ops import rotary, softmax

from ._cases import rel_error, run_traced

# Bounds per dtype (max |error| / max |expected|, ||error|| / ||expected||). softmax: the
# gradient starts from the forward's output y rounded to the dtype (as eager's does), then
# p = dy * y rounded and dx rounded: ~3 roundings (measured bf16 <= 7.7e-3 max-relative on
# 7-element rows, where dx cancels to a small sum; fp16 <= 1.2e-3). rotary: fp32 products,
# one rounding (bf16 <= 2.9e-3, fp16 <= 4.1e-4).
MAX_REL = {torch.float32: 4e-6, torch.bfloat16: 1.5e-2, torch.float16: 2e-3}
NORM_REL = {torch.float32: 1e-6, torch.bfloat16: 6e-3, torch.float16: 8e-4}
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.float16, id="fp16")]


def _close(got, want, dtype, name):
    assert got.dtype == dtype and got.shape == want.shape, name
    assert not torch.isnan(got).any(), name
    err = float((got.double() - want).abs().max()) / float(want.abs().max())
    assert err < MAX_REL[dtype], f"{name}: max error {err:.2e} of max |expected|"
    assert rel_error(got, want) < NORM_REL[dtype], name


@pytest.mark.parametrize("backend", ["simulator", "reference"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, dim", [((7,), 0), ((3, 9, 40), -1), ((9, 40), 0), ((300, 197), -1),
                                        ((128, 256), -1)], ids=["7", "3x9x40", "9x40-dim0", "300x197", "128x256"])
def test_softmax_gradients(monkeypatch, backend, dtype, shape, dim):
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    x = (torch.randn(*shape) * 3).to(dtype).requires_grad_(True)
    y = nki_kernels.softmax(x, dim)
    dy = torch.randn(shape).to(dtype)
    (got,) = torch.autograd.grad(y, x, dy)
    x64 = x.detach().double().requires_grad_(True)
    (want,) = torch.autograd.grad(torch.softmax(x64, dim), x64, dy.double())
    _close(got, want, dtype, "dx")


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_backward_rows_take_all_three_ways(dtype):
    # ViT-like short rows, 10 to a partition: _row_split sends some rows' y * (-c) through
    # ScalarE, some through GpSimd (then one GpSimd p + m) and the rest through one VectorE
    # scalar_tensor_tensor each; every way must give the float64 gradient (2700 rows: two
    # full blocks and an odd tail). 16-bit inputs use all three ways; fp32's p and c leave
    # VectorE the busiest, so its rows go to GpSimd
    from nki_kernels import backward_references

    y = torch.softmax(torch.randn(2700, 197) * 3, -1).to(dtype)
    dy = torch.randn(2700, 197).to(dtype)
    out, trace = run_traced(softmax.softmax_backward_kernel_call(dy, y, -1))
    ops = {(i.engine, i.op) for i in trace}
    ways = {("scalar", "activation"), ("gpsimd", "tensor_scalar"), ("vector", "scalar_tensor_tensor")}
    assert ways <= ops if dtype != torch.float32 else ("gpsimd", "tensor_scalar") in ops
    want = backward_references.softmax_backward(dy.double(), y.double(), -1, compute_dtype=torch.float64)
    _close(out, want, dtype, "dx")


def test_softmax_long_rows_recompute(simulator_backend, monkeypatch):
    cols = softmax.MAX_COLS + 1
    monkeypatch.setattr(softmax, "_softmax_backward_op", lambda *a: pytest.fail("the backward op ran"))
    x = torch.randn(2, cols, requires_grad=True)
    dy = torch.randn(2, cols)
    (got,) = torch.autograd.grad(nki_kernels.softmax(x, -1), x, dy)
    (want,) = torch.autograd.grad(torch.softmax(x, -1), x, dy)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
    with pytest.raises(ValueError, match=rf"output.shape\[1\]={cols} exceeds {softmax.MAX_COLS}"):
        softmax.softmax_backward_kernel_call(dy, x, -1)


def _rope(b, h, hk, s, d, dtype, halves="repeated"):
    # "repeated": transformers' cos/sin (the frequencies twice); "distinct": any cos/sin the
    # op accepts, where the backward must swap sin's halves, not only negate them
    ang = torch.randn(b, s, d // 2).repeat(1, 1, 2) if halves == "repeated" else torch.randn(b, s, d)
    q = torch.randn(b, h, s, d).to(dtype).requires_grad_(True)
    k = torch.randn(b, hk, s, d).to(dtype).requires_grad_(True)
    return q, k, ang.cos().to(dtype), ang.sin().to(dtype)


@pytest.mark.parametrize("backend", ["simulator", "reference"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims", [(2, 4, 2, 9, 16), (1, 3, 1, 130, 64), (1, 2, 2, 128, 128), (2, 1, 1, 700, 128)],
                         ids=["gqa-9", "gqa-130", "tile-exact", "one-head-blocks"])
@pytest.mark.parametrize("halves", ["repeated", "distinct"])
def test_rotary_gradients(monkeypatch, backend, dtype, dims, halves):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf

    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    q, k, cos, sin = _rope(*dims, dtype, halves)
    qo, ko = nki_kernels.apply_rotary_pos_emb(q, k, cos, sin)
    gq, gk = torch.randn(qo.shape).to(dtype), torch.randn(ko.shape).to(dtype)
    got = torch.autograd.grad((qo, ko), (q, k), (gq, gk))
    q64, k64 = (t.detach().double().requires_grad_(True) for t in (q, k))
    want = torch.autograd.grad(hf(q64, k64, cos.double(), sin.double()), (q64, k64), (gq.double(), gk.double()))
    for g, w, name in zip(got, want, ("dq", "dk")):
        _close(g, w, dtype, name)


def test_rotary_cos_sin_gradients_recompute(simulator_backend, monkeypatch):
    # the kernel backward gives d q and d k only (KernelBackward.grads_for): a gradient of
    # cos or sin takes the recompute backward, and is right
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf

    monkeypatch.setattr(rotary, "_rotary_backward_op", lambda *a: pytest.fail("the backward op ran"))
    q, k = torch.randn(1, 2, 5, 8, requires_grad=True), torch.randn(1, 1, 5, 8, requires_grad=True)
    cos, sin = torch.randn(1, 5, 8, requires_grad=True), torch.randn(1, 5, 8, requires_grad=True)
    got = torch.autograd.grad(sum(t.sum() for t in nki_kernels.apply_rotary_pos_emb(q, k, cos, sin)), (q, k, cos, sin))
    want = torch.autograd.grad(sum(t.sum() for t in hf(q, k, cos, sin)), (q, k, cos, sin))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


BACKWARD_OPS = [
    ("softmax", softmax._softmax_backward_op, lambda g: (g(3, 9, 40), torch.softmax(g(3, 9, 40), -1), -1)),
    ("softmax_dim0", softmax._softmax_backward_op, lambda g: (g(9, 40), torch.softmax(g(9, 40), 0), 0)),
    ("rotary", rotary._rotary_backward_op, lambda g: (g(2, 4, 9, 16), g(2, 2, 9, 16), g(2, 9, 16), g(2, 9, 16))),
]


@pytest.mark.parametrize("backend", ["simulator", "reference"])
@pytest.mark.parametrize("name, op, make", BACKWARD_OPS, ids=[c[0] for c in BACKWARD_OPS])
def test_opcheck_backward_ops(monkeypatch, backend, name, op, make):
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    args = make(lambda *s: torch.randn(*s, requires_grad=True))
    args = tuple(a.detach().requires_grad_(True) if isinstance(a, torch.Tensor) else a for a in args)
    torch.library.opcheck(op, args)

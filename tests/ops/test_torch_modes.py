"""Ops under the caller's torch modes: inference mode, autocast, and in-place changes of an
op's output while autograd records (an audit of 2026-12-07 found each failing on the
simulator backend alone). torch's own ops and the reference backend take all three."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nki_kernels


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 128, generator=g)
    w, b = torch.randn(128, generator=g), torch.randn(128, generator=g)
    q = torch.randn(1, 2, 9, 16, generator=g)
    k, v = torch.randn(1, 2, 11, 16, generator=g), torch.randn(1, 2, 11, 16, generator=g)
    return x, w, b, q, k, v


def _calls(x, w, b, q, k, v):
    return {
        "rms_norm": lambda: nki_kernels.rms_norm(x, (128,), w, 1e-6),
        "layer_norm": lambda: nki_kernels.layer_norm(x, (128,), w, b),
        "fused_add_rms_norm": lambda: nki_kernels.fused_add_rms_norm(x, x.flip(0), w, 1e-6)[0],
        "softmax": lambda: nki_kernels.softmax(x, dim=-1),
        "silu_and_mul": lambda: nki_kernels.silu_and_mul(x),
        "scaled_dot_product_attention": lambda: nki_kernels.scaled_dot_product_attention(q, k, v),
    }


@pytest.mark.parametrize("backend", ["reference", "simulator"])
@pytest.mark.parametrize("lnc", ["1", "2"])
def test_ops_under_inference_mode_give_their_plain_results(monkeypatch, backend, lnc):
    # inference mode is per thread and the simulator's LNC=2 cores run in threads of their
    # own: the run's inference tensors could not be written there (RuntimeError)
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", lnc)
    calls = _calls(*_inputs(7))
    for name, call in calls.items():
        plain = call()
        with torch.inference_mode():
            inferred = call()
        assert torch.equal(inferred, plain), name


@pytest.mark.parametrize("lnc", ["1", "2"])
def test_an_enclosing_autocast_does_not_reach_the_simulated_kernel(monkeypatch, lnc):
    # fp32 ops keep fp32 statistics under torch.autocast("cpu", bfloat16): at LNC=1 the
    # kernel runs in the caller's thread, and its simulated matmuls and reductions took the
    # autocast's bf16 (rms_norm's relative error 1.5e-7 -> 8.6e-4); the same bits at both
    # degrees (README: bit-identical at LNC=1 and LNC=2)
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "simulator")
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", lnc)
    x, w, b, *_ = _inputs(11)
    for name, call in {"rms_norm": lambda: nki_kernels.rms_norm(x, (128,), w, 1e-6),
                       "layer_norm": lambda: nki_kernels.layer_norm(x, (128,), w, b)}.items():
        plain = call()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under = call()
        assert under.dtype == torch.float32
        assert torch.equal(under, plain), name
    # SDPA itself follows the autocast (its inputs cast to bf16, as torch's SDPA does)
    _, _, _, q, k, v = _inputs(12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = nki_kernels.scaled_dot_product_attention(q, k, v)
    assert out.dtype == torch.bfloat16
    expected = nki_kernels.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert torch.equal(out, expected)


@pytest.mark.parametrize("backend", ["reference", "simulator"])
def test_an_output_changed_in_place_keeps_its_gradient(monkeypatch, backend):
    # y.add_(1) after the op (a residual added in place): the kernel backends returned a view
    # of the kernel's output (finish's reshape), which autograd refused to change in place
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    x, w, b, *_ = _inputs(13)
    pairs = {
        "rms_norm": (lambda t: nki_kernels.rms_norm(t, (128,), w, 1e-6), lambda t: F.rms_norm(t, (128,), w, 1e-6)),
        "layer_norm": (lambda t: nki_kernels.layer_norm(t, (128,), w, b), lambda t: F.layer_norm(t, (128,), w, b)),
        "fused_add_rms_norm": (lambda t: nki_kernels.fused_add_rms_norm(t, x.flip(0), w, 1e-6)[0],
                               lambda t: F.rms_norm(t + x.flip(0), (128,), w, 1e-6)),
        "silu_and_mul": (lambda t: nki_kernels.silu_and_mul(t), lambda t: F.silu(t[:, :64]) * t[:, 64:]),
        "gelu": (lambda t: nki_kernels.gelu(t), lambda t: F.gelu(t)),
    }
    for name, (ours, torchs) in pairs.items():
        grads = []
        for fn in (ours, torchs):
            t = x.clone().requires_grad_()
            y = fn(t)
            y.add_(1.0)
            (y * y).sum().backward()
            grads.append(t.grad)
        torch.testing.assert_close(grads[0], grads[1], atol=1e-4, rtol=1e-4, msg=name)


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_simulate_writes_an_inference_tensor_input_in_place(lnc, dtype):
    # nki.simulate aliases a contiguous fp32 input and copies others back: an inference
    # tensor is copied (the run cannot write it in place) and written back in inference mode
    from nki_kernels import simulator

    with simulator.activated("trn2") as nki:
        nl, nisa = nki.language, nki.isa

        @nki.jit
        def double_in_place(x):
            rows = x.shape[0] // nl.num_programs()
            r0 = nl.program_id(0) * rows
            t = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x[r0:r0 + rows, :])
            nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
            nisa.dma_copy(dst=x[r0:r0 + rows, :], src=t)
            return x

        with torch.inference_mode():
            x = torch.randn(4, 8).to(dtype)
            before = x.clone()
            out = nki.simulate(double_in_place[lnc])(x)
        assert x.is_inference()
        assert torch.equal(x, before * 2) and torch.equal(out, before * 2)

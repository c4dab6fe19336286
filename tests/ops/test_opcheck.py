"""torch.library.opcheck on every custom op of this issue, on the reference path and with
the NKI kernels in the simulator; and torch.compile calling the ops for real."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nki_kernels
from nki_kernels import registry


OP = {spec.name: spec.custom_op for spec in registry.ops()}


def _cases():
    g = lambda *s: torch.randn(*s, requires_grad=True)  # noqa: E731
    return [
        ("layer_norm", OP["layer_norm"], lambda: (g(3, 7, 40), [40], g(40), g(40), 1e-5)),
        ("layer_norm_noaffine", OP["layer_norm"], lambda: (g(5, 40), [40], None, None, 1e-5)),
        ("rms_norm", OP["rms_norm"], lambda: (g(3, 7, 40), [40], g(40), 1e-6)),
        ("rms_norm_noweight", OP["rms_norm"], lambda: (g(5, 40), [40], None, 1e-6)),
        ("fused_add_rms_norm", OP["fused_add_rms_norm"], lambda: (g(6, 40), g(6, 40), g(40), 1e-6)),
        ("silu", OP["silu"], lambda: (g(4, 33),)),
        ("silu_and_mul", OP["silu_and_mul"], lambda: (g(2, 5, 34),)),
        ("gelu_and_mul", OP["gelu_and_mul"], lambda: (g(3, 34), "tanh")),
        ("softmax", OP["softmax"], lambda: (g(3, 9, 40), -1)),
        ("softmax_dim0", OP["softmax"], lambda: (g(9, 40), 0)),
        ("rotary", OP["apply_rotary_pos_emb"], lambda: (g(2, 4, 9, 16), g(2, 2, 9, 16), g(2, 9, 16), g(2, 9, 16))),
        # non-contiguous inputs: the fake's output strides must be the real output's (a
        # compiled graph checks them), whatever layout each backend computes in
        ("layer_norm_transposed", OP["layer_norm"], lambda: (t(6, 8, 10), [10], g(10), g(10), 1e-5)),
        ("rms_norm_transposed", OP["rms_norm"], lambda: (t(6, 8, 10), [10], g(10), 1e-6)),
        ("fused_add_transposed", OP["fused_add_rms_norm"], lambda: (t(6, 8, 10), t(6, 8, 10), None, 1e-6)),
        ("gelu_transposed", OP["gelu"], lambda: (t(6, 8, 10), "none")),
        ("silu_transposed", OP["silu"], lambda: (t(6, 8, 10),)),
        ("silu_and_mul_channels_last", OP["silu_and_mul"],
         lambda: (torch.randn(2, 6, 3, 4).to(memory_format=torch.channels_last).requires_grad_(True),)),
        ("softmax_transposed_dim0", OP["softmax"], lambda: (t(6, 8, 10), 0)),
        ("rotary_bshd_views", OP["apply_rotary_pos_emb"],
         lambda: (bshd(2, 9, 4, 16), bshd(2, 9, 2, 16), g(2, 9, 16), g(2, 9, 16))),
        ("sdpa_bshd_query", OP["scaled_dot_product_attention"],
         lambda: (bshd(1, 8, 2, 16), g(1, 2, 8, 16), g(1, 2, 8, 16), None, False, 0.25)),
    ]


def t(*shape):
    """A transposed (non-contiguous, dense) view that requires grad."""
    return torch.randn(*reversed(shape)).transpose(0, -1).requires_grad_(True)


def bshd(b, s, h, d):
    """transformers' q/k: [B, S, H, D] storage seen as [B, H, S, D]."""
    return torch.randn(b, s, h, d).transpose(1, 2).requires_grad_(True)


CASES = _cases()


@pytest.mark.parametrize("name, op, make", CASES, ids=[c[0] for c in CASES])
def test_opcheck_reference(reference_backend, name, op, make):
    torch.library.opcheck(op, make())


@pytest.mark.parametrize("name, op, make", CASES, ids=[c[0] for c in CASES])
def test_opcheck_simulator(simulator_backend, name, op, make):
    torch.library.opcheck(op, make())


def test_ops_compile_fullgraph(simulator_backend):
    # A compiled graph through every op, run for real (kernels in the simulator), compared
    # against the same composition in eager torch.
    def block(x, residual, w, q, k, cos, sin):
        h, res = nki_kernels.fused_add_rms_norm(x, residual, w, 1e-6)
        h = nki_kernels.layer_norm(h, (64,), w, None) + nki_kernels.rms_norm(h, (64,), w, 1e-6)
        h = nki_kernels.silu_and_mul(torch.cat([h, h * 0.5], -1)) + nki_kernels.gelu_and_mul(
            torch.cat([h, res], -1), "tanh") + nki_kernels.silu(h)
        q2, k2 = nki_kernels.apply_rotary_pos_emb(q, k, cos, sin)
        return nki_kernels.softmax(h, -1), q2, k2

    def eager(x, residual, w, q, k, cos, sin):
        res = x + residual
        h = F.rms_norm(res, (64,), w, 1e-6)
        h = F.layer_norm(h, (64,), w, None) + F.rms_norm(h, (64,), w, 1e-6)
        h = F.silu(h) * (h * 0.5) + F.gelu(h, approximate="tanh") * res + F.silu(h)
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf

        q2, k2 = hf(q, k, cos, sin)
        return torch.softmax(h, -1), q2, k2

    args = (torch.randn(9, 64), torch.randn(9, 64), torch.randn(64), torch.randn(1, 2, 9, 16),
            torch.randn(1, 1, 9, 16), torch.randn(1, 9, 16), torch.randn(1, 9, 16))
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(*args), eager(*args)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", ["reference", "simulator"])
def test_compile_fullgraph_on_non_contiguous_inputs(monkeypatch, backend):
    # transposed activations and transformers' [B, S, H, D] q/k views through a compiled
    # graph: the graph checks each real output against its fake's strides
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf

    def block(b, q, k, cos, sin):
        x = b.transpose(0, 2)                                      # [6, 8, 10], strides (1, 6, 48)
        h = nki_kernels.layer_norm(x, (10,)) * 2 + nki_kernels.gelu(x) + nki_kernels.softmax(x, 0)
        q2, k2 = nki_kernels.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return h, q2, k2

    def eager(b, q, k, cos, sin):
        x = b.transpose(0, 2)
        h = F.layer_norm(x, (10,)) * 2 + F.gelu(x) + torch.softmax(x, 0)
        return (h, *hf(q.transpose(1, 2), k.transpose(1, 2), cos, sin))

    args = (torch.randn(10, 8, 6), torch.randn(2, 9, 4, 16), torch.randn(2, 9, 2, 16),
            torch.randn(2, 9, 16), torch.randn(2, 9, 16))
    compiled = torch.compile(block, fullgraph=True)   # inductor: it asserts every output's strides
    for got, want in zip(compiled(*args), eager(*args)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)

"""``nki_attention_forward`` as a transformers attention backend: tiny ViT, SigLIP-vision
and DINOv2 models built from configs (random weights, no download) run with the NKI kernel
in the simulator and match the same model with ``attn_implementation="sdpa"``."""

from __future__ import annotations

import pytest
import torch

from transformers import (AttentionInterface, Dinov2Config, Dinov2Model, SiglipVisionConfig,  # noqa: E402
                          SiglipVisionModel, ViTConfig, ViTModel)

import nki_kernels  # noqa: E402
from nki_kernels import _dispatch  # noqa: E402
from tests._helpers import rel_error  # noqa: E402

NAME = "nki_kernels_test"

# image 40 / patch 8 -> 25 patches (+ CLS for ViT and DINOv2): sequences of 25-26 tokens,
# not multiples of anything; head dims 64 (ViT, DINOv2) and 72 (SigLIP so400m).
MODELS = {
    "vit": (ViTModel, lambda: ViTConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=256, image_size=40, patch_size=8)),
    "siglip": (SiglipVisionModel, lambda: SiglipVisionConfig(hidden_size=144, num_hidden_layers=2,
                                                             num_attention_heads=2, intermediate_size=256,
                                                             image_size=40, patch_size=8)),
    "dinov2": (Dinov2Model, lambda: Dinov2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                                 intermediate_size=256, image_size=40, patch_size=8)),
}


@pytest.fixture(autouse=True)
def _registered():
    AttentionInterface.register(NAME, nki_kernels.nki_attention_forward)
    yield


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the kernel launches that ran in the simulator."""
    calls = []
    real = _dispatch.run_simulated

    def spy(call):
        calls.append(call.kernel)
        return real(call)

    monkeypatch.setattr(_dispatch, "run_simulated", spy)
    return calls


def _pair(name, dtype):
    cls, make_config = MODELS[name]
    config = make_config()
    config._attn_implementation = "sdpa"
    model = cls(config).eval().to(dtype)
    pixels = torch.randn(2, 3, 40, 40).to(dtype)
    return model, pixels


@pytest.mark.parametrize("name", list(MODELS))
def test_model_matches_sdpa(simulator_backend, kernel_calls, name):
    model, pixels = _pair(name, torch.float32)
    with torch.no_grad():
        expected = model(pixel_values=pixels).last_hidden_state
        model.set_attn_implementation(NAME)
        out = model(pixel_values=pixels).last_hidden_state
    assert model.config._attn_implementation == NAME
    assert kernel_calls == ["attention_kernel"] * model.config.num_hidden_layers
    assert not torch.isnan(out).any()
    # fp32 kernel (fp32 matmuls and softmax) against fp32 SDPA, through 2 layers + LayerNorms
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_vit_bf16_matches_sdpa(simulator_backend, kernel_calls):
    model, pixels = _pair("vit", torch.bfloat16)
    with torch.no_grad():
        expected = model(pixel_values=pixels).last_hidden_state
        model.set_attn_implementation(NAME)
        out = model(pixel_values=pixels).last_hidden_state
    assert len(kernel_calls) == 2
    # bf16 everywhere: both runs round activations to bf16 at every op; the kernel keeps
    # softmax statistics in fp32 (SDPA's CPU math path upcasts too), so they differ by a
    # few bf16 ulps that LayerNorm and the MLP carry along.
    assert rel_error(out, expected) < 2e-2


def test_reference_backend_model(reference_backend, kernel_calls):
    model, pixels = _pair("dinov2", torch.float32)
    with torch.no_grad():
        expected = model(pixel_values=pixels).last_hidden_state
        model.set_attn_implementation(NAME)
        out = model(pixel_values=pixels).last_hidden_state
    assert kernel_calls == []
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_interface_contract(simulator_backend):
    """Direct call with transformers' arguments: [B, H, S, D] in, ([B, S, H, D], None) out,
    mask and GQA as transformers passes them, causal only without a mask."""
    module = torch.nn.Module()
    module.is_causal = True
    q = torch.randn(2, 10, 4, 32).transpose(1, 2)
    k = torch.randn(2, 10, 2, 32).transpose(1, 2)
    v = torch.randn(2, 10, 2, 32).transpose(1, 2)
    out, weights = nki_kernels.nki_attention_forward(module, q, k, v, None, scaling=0.2)
    assert weights is None and out.shape == (2, 10, 4, 32) and out.is_contiguous()
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2,
                                                                enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    mask = torch.zeros(2, 1, 10, 10)
    mask[..., 7:] = torch.finfo(torch.float32).min
    out, _ = nki_kernels.nki_attention_forward(module, q, k, v, mask, is_causal=True)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    # a module without ``is_causal`` is causal, as in transformers' sdpa_attention_forward
    out, _ = nki_kernels.nki_attention_forward(torch.nn.Module(), q, k, v, None)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    with pytest.raises(NotImplementedError, match="dropout"):
        nki_kernels.nki_attention_forward(module, q, k, v, None, dropout=0.1)
    with pytest.raises(ValueError, match="softcap"):
        nki_kernels.nki_attention_forward(module, q, k, v, None, softcap=30.0)

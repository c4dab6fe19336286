"""Tiny random-weight transformers models built from configs (no download), and inputs for them.

Sizes are small enough for the simulator backend (a forward of a two-layer model runs each
NKI kernel a few times in well under a second) and odd where it matters: 9-11 tokens, head
dims 16 and 72, 25-26 vision tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

TEXT = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(**TEXT))


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    return Qwen2ForCausalLM(Qwen2Config(**TEXT))


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return Qwen3ForCausalLM(Qwen3Config(**TEXT, head_dim=16))


def _mistral():
    # a window of 4 over 9-15 tokens: every layer needs the sliding-window mask
    from transformers import MistralConfig, MistralForCausalLM
    return MistralForCausalLM(MistralConfig(**TEXT, sliding_window=4))


def _gemma3():
    # one sliding (window 4) and one full layer; head_dim 16 (Gemma3's default 256 is above
    # the kernel's head-dim limit, see test_gemma_defaults_fail_clearly)
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    return Gemma3ForCausalLM(Gemma3TextConfig(**TEXT, head_dim=16, sliding_window=4,
                                              layer_types=["sliding_attention", "full_attention"]))


CAUSAL_LM = {"llama": _llama, "qwen2": _qwen2, "qwen3": _qwen3, "mistral": _mistral, "gemma3": _gemma3}


def _clip():
    from transformers import CLIPConfig, CLIPModel
    return CLIPModel(CLIPConfig(
        text_config=dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=32, eos_token_id=2),
        vision_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                           image_size=40, patch_size=8)))


def _siglip():
    from transformers import SiglipConfig, SiglipModel
    return SiglipModel(SiglipConfig(
        text_config=dict(vocab_size=97, hidden_size=144, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=32),
        vision_config=dict(hidden_size=144, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                           image_size=40, patch_size=8)))      # head dim 72, as SigLIP so400m


DUAL_ENCODER = {"clip": _clip, "siglip": _siglip}


def _vit():
    from transformers import ViTConfig, ViTModel
    return ViTModel(ViTConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
                              image_size=40, patch_size=8))


def _dinov2():
    from transformers import Dinov2Config, Dinov2Model
    return Dinov2Model(Dinov2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=256, image_size=40, patch_size=8))


def _siglip_vision():
    from transformers import SiglipVisionConfig, SiglipVisionModel
    return SiglipVisionModel(SiglipVisionConfig(hidden_size=144, num_hidden_layers=2, num_attention_heads=2,
                                                intermediate_size=256, image_size=40, patch_size=8))


VISION = {"vit": _vit, "dinov2": _dinov2, "siglip_vision": _siglip_vision}


@dataclass
class Batch:
    """Token ids with a padding mask: row 0 full, rows 1 and 2 padded by 4 and 2 on ``side``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor

    @property
    def valid(self) -> torch.Tensor:
        return self.attention_mask.bool()

    def kwargs(self) -> dict:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}


def padded_batch(side: str, length: int = 9, rows: int = 3) -> Batch:
    ids = torch.randint(3, 97, (rows, length))
    mask = torch.ones(rows, length, dtype=torch.long)
    for row, pad in zip(range(1, rows), (4, 2)):
        if side == "left":
            mask[row, :pad] = 0
        else:
            mask[row, length - pad:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return Batch(ids, mask)


def pixels(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 40, 40)


def perturb_norms(model: torch.nn.Module) -> None:
    """transformers initialises norm weights to ones (biases to zeros): move them off the
    identity so a kernel that drops or misplaces them shows up."""
    with torch.no_grad():
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if type(module).__name__.endswith(("RMSNorm", "LayerNorm")) and isinstance(weight, torch.Tensor):
                weight.add_(torch.randn_like(weight) * 0.2)
                bias = getattr(module, "bias", None)
                if isinstance(bias, torch.Tensor):
                    bias.add_(torch.randn_like(bias) * 0.2)


def build(make: Callable[[], torch.nn.Module], attn: str = "sdpa") -> torch.nn.Module:
    model = make().eval()
    model.set_attn_implementation(attn)
    return model

"""Helpers for the ops' representative workloads (registry.Workload)."""

from __future__ import annotations

import torch

# ViT-B/16 and ViT-L/16 at 224 px, batch 8: 8 images x 197 tokens.
VIT_TOKENS = 8 * 197


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype = torch.bfloat16, scale: float = 1.0) -> torch.Tensor:
    """Fresh normal values from ``gen`` (times ``scale``) in ``dtype``."""
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)

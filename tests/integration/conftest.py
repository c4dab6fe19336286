"""Fixtures of the transformers / kernels integration tests."""

from __future__ import annotations

import collections

import pytest
import torch

from nki_kernels import _dispatch


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts (kernel name -> launches) of the NKI kernels that ran in the simulator."""
    calls: collections.Counter = collections.Counter()
    real = _dispatch.run_simulated

    def spy(call):
        calls[call.kernel] += 1
        return real(call)

    monkeypatch.setattr(_dispatch, "run_simulated", spy)
    return calls


_FAMILY_MODULES = ("llama", "mistral", "qwen2", "qwen3")


@pytest.fixture(autouse=True)
def _restore_kernel_names():
    """``nki_kernels.transformers.kernelize`` names transformers' classes (and ``nn.LayerNorm``)
    for kernels and wraps the families' ``apply_rotary_pos_emb``, process-wide by design;
    undo it after each test so that no other test sees kernelized families."""
    import importlib

    from transformers import activations

    from nki_kernels.transformers import FAMILIES

    modules = [importlib.import_module(f"transformers.models.{f}.modeling_{f}") for f in _FAMILY_MODULES]
    classes = [torch.nn.LayerNorm, activations.SiLUActivation, activations.GELUActivation, activations.GELUTanh]
    for module, family in zip(modules, _FAMILY_MODULES):
        classes += [getattr(module, name) for name in FAMILIES[family]]
    saved_attrs = {cls: {k: vars(cls)[k] for k in ("kernel_layer_name", "kernel_condition") if k in vars(cls)}
                   for cls in classes}
    saved_rope = {module: module.apply_rotary_pos_emb for module in modules}
    yield
    for cls, attrs in saved_attrs.items():
        for key in ("kernel_layer_name", "kernel_condition"):
            if key in attrs:
                setattr(cls, key, attrs[key])
            elif key in vars(cls):
                delattr(cls, key)
    for module, rope in saved_rope.items():
        module.apply_rotary_pos_emb = rope

"""The device side of ``_neuron`` that tests/neuron/test_launch.py does not reach: whether a
neuron device is usable here, how the device is synchronised without ``torch.neuron``,
what :func:`_neuron.toolchain` hands back, and the compiler / runtime degree the other way
round (a flag of 1 under a runtime of 2). ``torch_neuronx``, ``nki`` and the accelerator
are test doubles (no Trainium has run this project)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from nki_kernels import _dispatch, _neuron
from nki_kernels.ops import activations
from tests.neuron._doubles import RecordingKernel


def _toolchain_modules(monkeypatch, missing=None):
    modules = {}
    for name in _neuron.TOOLCHAIN:
        modules[name] = None if name == missing else types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, modules[name])
    return modules


def _accelerator(monkeypatch, kind):
    """torch.accelerator reporting a device of type ``kind`` (None: no accelerator)."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: kind is not None)
    monkeypatch.setattr(torch.accelerator, "current_accelerator",
                        lambda: None if kind is None else types.SimpleNamespace(type=kind))


def test_a_neuron_accelerator_with_the_toolchain_is_available(monkeypatch):
    _toolchain_modules(monkeypatch)
    _accelerator(monkeypatch, "neuron")
    assert _neuron.device_available() == (True, "")


@pytest.mark.parametrize("kind", ["cuda", "xpu", None])
def test_another_accelerator_is_not_a_neuron_device(monkeypatch, kind):
    # torch-neuronx importing does not make a host with a GPU (or none) a Trainium
    _toolchain_modules(monkeypatch)
    _accelerator(monkeypatch, kind)
    available, why = _neuron.device_available()
    assert not available
    assert "torch sees no neuron device" in why and f"accelerator: {kind or 'none'}" in why


@pytest.mark.parametrize("missing", ["torch_neuronx", "nki"])
def test_each_toolchain_module_is_required(monkeypatch, missing):
    # a neuron accelerator without `nki` (or torch-neuronx) cannot run the kernels
    _toolchain_modules(monkeypatch, missing)
    _accelerator(monkeypatch, "neuron")
    available, why = _neuron.device_available()
    assert not available and why.startswith(f"{missing} does not import")


def test_toolchain_returns_torch_neuronx_then_nki(monkeypatch):
    modules = _toolchain_modules(monkeypatch)
    assert _neuron.toolchain() == (modules["torch_neuronx"], modules["nki"])


def test_synchronize_without_torch_neuron_uses_the_accelerator_api(monkeypatch):
    # TorchNeuron registers as PrivateUse1: where torch.neuron has no synchronize, the
    # generic accelerator API must still drain the queue (the acceptance timings rely on it)
    calls = []
    monkeypatch.delattr(torch, "neuron", raising=False)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a: calls.append("accelerator"))
    _neuron.synchronize()
    monkeypatch.setattr(torch, "neuron", types.SimpleNamespace(), raising=False)   # no synchronize
    _neuron.synchronize()
    assert calls == ["accelerator", "accelerator"]


@pytest.mark.parametrize("cc_flags", ["--lnc=1", "-lnc 1", "--logical-nc-config=1"])
def test_a_compiler_flag_below_the_runtime_s_core_size_raises_before_launch(monkeypatch, cc_flags):
    # the runtime at 2 (its variable), neuronx-cc told to compile for 1: the reverse of the
    # case tests/neuron/test_launch.py covers, and just as unsupported [LNC-CONFIG]
    monkeypatch.delenv(_neuron.LNC_ENV, raising=False)
    monkeypatch.setenv(_neuron.CC_FLAGS_ENV, cc_flags)
    monkeypatch.setenv(_neuron.RT_CORE_SIZE_ENV, "2")
    _toolchain_modules(monkeypatch)
    kernel = RecordingKernel()
    monkeypatch.setattr(_dispatch._kernel_sources, "kernel", lambda *a: kernel)
    with pytest.raises(ValueError) as info:
        _dispatch.run_on_neuron(activations.silu_kernel_call(torch.randn(4, 5)))
    for words in ("NEURON_RT_VIRTUAL_CORE_SIZE=2", "LNC=1", "NEURON_CC_FLAGS's --lnc 1",
                  "set --lnc 2 in NEURON_CC_FLAGS (or remove it) and export NEURON_LOGICAL_NC_CONFIG=2"):
        assert words in str(info.value)
    assert kernel.events == []

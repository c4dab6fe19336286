"""How an op launches its NKI kernel on ``neuron`` tensors: the call form, the
logical-core degree and the arguments, with ``nki`` / ``torch_neuronx`` and the kernel
replaced by recording test doubles (tests/neuron/_doubles.py).

The forms are AWS's (torch_ext/nki_kernels/_neuron.py cites them): with
``NEURON_LOGICAL_NC_CONFIG`` set the kernel is called plainly (the 2.33 nki.jit reference);
without it, as ``kernel[n]`` at neuronx-cc's degree (2 on Trn2/Trn3, or ``--lnc`` from
``NEURON_CC_FLAGS``), never a plain call at the kernel's default LNC=1 (NCC_EVRF066).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from nki_kernels import _dispatch, _neuron
from nki_kernels.ops import activations, attention, norms
from tests.neuron._doubles import RecordingKernel


@pytest.fixture
def toolchain(monkeypatch):
    """Both toolchain modules importable (as empty doubles); returns the requested kernels."""
    monkeypatch.setitem(sys.modules, "torch_neuronx", types.ModuleType("torch_neuronx"))
    monkeypatch.setitem(sys.modules, "nki", types.ModuleType("nki"))
    requested = []

    def install(kernel):
        def lookup(module, name, flavour):
            requested.append((module, name, flavour))
            return kernel
        monkeypatch.setattr(_dispatch._kernel_sources, "kernel", lookup)
        return requested
    return install


def _environment(monkeypatch, lnc=None, cc_flags=None, rt_size=None):
    for var, value in ((_neuron.LNC_ENV, lnc), (_neuron.CC_FLAGS_ENV, cc_flags),
                       (_neuron.RT_CORE_SIZE_ENV, rt_size)):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)


@pytest.mark.parametrize("lnc, cc_flags, form, degree", [
    (None, None, "bracket", 2),                          # neuronx-cc's Trn2/Trn3 default
    ("2", None, "plain", None),                          # the variable sets kernel and compiler
    ("1", None, "plain", None),
    (None, "--lnc=2", "bracket", 2),                     # the compiler flag alone, at the runtime's default
    (None, "-O2 --logical-nc-config 2 --verbose", "bracket", 2),
    ("2", "--lnc 2", "plain", None),                     # agreeing variable and flag
    ("1", "-lnc 1", "plain", None),                      # neuronx-cc's short form
    (None, "--lnc 1 -O2 --lnc=2", "bracket", 2),         # repeated: the last one counts
])
def test_call_form_and_degree(monkeypatch, toolchain, lnc, cc_flags, form, degree):
    _environment(monkeypatch, lnc, cc_flags)
    kernel = RecordingKernel(compute=lambda x, **_: torch.nn.functional.gelu(x))
    requested = toolchain(kernel)
    x = torch.randn(7, 33)
    out = _dispatch.run_on_neuron(activations.gelu_kernel_call(x))
    assert requested == [("elementwise", "elementwise_kernel", "neuron")]
    assert len(kernel.events) == 1
    got_form, got_degree, env_at_call, args, kwargs = kernel.events[0]
    assert (got_form, got_degree, env_at_call) == (form, degree, lnc)
    assert len(args) == 1 and torch.equal(args[0], x) and kwargs == {"op": "gelu"}
    torch.testing.assert_close(out, torch.nn.functional.gelu(x))


@pytest.mark.parametrize("lnc, cc_flags, words", [
    ("2", "--lnc=1", ["NEURON_LOGICAL_NC_CONFIG=2", "LNC=1", "NCC_EVRF066"]),
    ("1", "--logical-nc-config=2", ["NEURON_LOGICAL_NC_CONFIG=1", "LNC=2"]),
    ("3", None, ["NEURON_LOGICAL_NC_CONFIG='3'", "expected 1 or 2"]),
    (None, "--lnc=4", ["NEURON_CC_FLAGS", "--lnc '4'", "1 or 2"]),
    (None, "--lnc", ["NEURON_CC_FLAGS", "--lnc ''"]),
    ("2", "-lnc=1", ["NEURON_LOGICAL_NC_CONFIG=2", "LNC=1", "NCC_EVRF066"]),
    # a flag of 1 alone: the runtime runs at its default 2, which AWS does not support
    (None, "--lnc=1", ["NEURON_CC_FLAGS", "LNC=1", "neither NEURON_LOGICAL_NC_CONFIG nor NEURON_RT_VIRTUAL_CORE_SIZE "
                       "is set", "default LNC=2", "export NEURON_LOGICAL_NC_CONFIG=1"]),
    (None, "-O2 -lnc 1", ["LNC=1", "export NEURON_LOGICAL_NC_CONFIG=1"]),
])
def test_degrees_that_neuronx_cc_would_reject_raise_before_launch(monkeypatch, toolchain, lnc, cc_flags, words):
    _environment(monkeypatch, lnc, cc_flags)
    _assert_refused_before_launch(toolchain, words)


def _assert_refused_before_launch(toolchain, words):
    kernel = RecordingKernel()
    toolchain(kernel)
    with pytest.raises(ValueError) as info:
        _dispatch.run_on_neuron(activations.silu_kernel_call(torch.randn(4, 5)))
    for word in words:
        assert word in str(info.value)
    assert kernel.events == []


@pytest.mark.parametrize("lnc, cc_flags, rt_size, form, degree", [
    (None, None, "2", "bracket", 2),       # the runtime's variable at neuronx-cc's default
    ("2", None, "2", "plain", None),
    ("1", None, "1", "plain", None),
    (None, "--lnc=2", "2", "bracket", 2),
    (None, "--lnc=1", "1", "bracket", 1),  # flag and runtime variable agree at 1
])
def test_the_runtime_s_core_size_variable_agreeing_changes_nothing(monkeypatch, toolchain, lnc, cc_flags,
                                                                   rt_size, form, degree):
    _environment(monkeypatch, lnc, cc_flags, rt_size)
    kernel = RecordingKernel(compute=lambda x, **_: torch.nn.functional.gelu(x))
    toolchain(kernel)
    _dispatch.run_on_neuron(activations.gelu_kernel_call(torch.randn(3, 8)))
    assert kernel.events[0][:2] == (form, degree)


@pytest.mark.parametrize("lnc, cc_flags, rt_size, words", [
    # NEURON_RT_VIRTUAL_CORE_SIZE=1 alone: the runtime at 1, neuronx-cc at its default 2
    (None, None, "1", ["NEURON_RT_VIRTUAL_CORE_SIZE=1", "LNC=2", "neuronx-cc's default",
                       "export NEURON_LOGICAL_NC_CONFIG=1"]),
    ("2", None, "1", ["NEURON_LOGICAL_NC_CONFIG=2 but NEURON_RT_VIRTUAL_CORE_SIZE=1", "must agree"]),
    ("1", None, "2", ["NEURON_LOGICAL_NC_CONFIG=1 but NEURON_RT_VIRTUAL_CORE_SIZE=2", "must agree"]),
    # the flag sets the compiler's degree: the advice names it, not the variable it overrides
    (None, "--lnc=2", "1", ["NEURON_RT_VIRTUAL_CORE_SIZE=1", "NEURON_CC_FLAGS's --lnc 2",
                            "set --lnc 1 in NEURON_CC_FLAGS (or remove it) and export NEURON_LOGICAL_NC_CONFIG=1"]),
    (None, None, "4", ["NEURON_RT_VIRTUAL_CORE_SIZE='4'", "expected 1 or 2"]),
])
def test_a_runtime_core_size_the_compiler_does_not_match_raises_before_launch(monkeypatch, toolchain, lnc,
                                                                              cc_flags, rt_size, words):
    _environment(monkeypatch, lnc, cc_flags, rt_size)
    _assert_refused_before_launch(toolchain, words)


def test_arguments_static_values_and_finish(monkeypatch, toolchain):
    # rms_norm of a 3-D input: the kernel gets the [N, H] view (contiguous), the weight and
    # eps as a Python float (a compile-time value); its [N, H] result is reshaped back
    _environment(monkeypatch, lnc="2")
    seen = {}

    def compute(x, w, eps):
        seen.update(x=x, w=w, eps=eps)
        return torch.zeros(x.shape)

    requested = toolchain(RecordingKernel(compute))
    x = torch.randn(4, 64, 2, 48).transpose(1, 2)[:, 1]            # [4, 64, 48] non-contiguous
    w = torch.randn(48)
    out = _dispatch.run_on_neuron(norms.rms_norm_kernel_call(x, (48,), w, 1e-5))
    assert requested == [("rms_norm", "rms_norm_kernel", "neuron")]
    assert seen["x"].shape == (4 * 64, 48) and seen["x"].is_contiguous()
    assert torch.equal(seen["x"], x.reshape(-1, 48)) and torch.equal(seen["w"], w)
    assert type(seen["eps"]) is float and seen["eps"] == 1e-5
    assert out.shape == x.shape


def test_attention_static_arguments(monkeypatch, toolchain):
    _environment(monkeypatch)
    kernel = RecordingKernel(compute=lambda q, k, v, **_: torch.zeros_like(q))
    requested = toolchain(kernel)
    q, k, v = torch.randn(1, 4, 9, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    _dispatch.run_on_neuron(attention.attention_kernel_call(q, k, v, is_causal=True, enable_gqa=True))
    assert requested == [("attention", "attention_kernel", "neuron")]
    form, degree, _, args, kwargs = kernel.events[0]
    assert (form, degree, len(args)) == ("bracket", 2, 3)
    assert kwargs == {"scale": 16 ** -0.5, "causal": True, "layout": "bhsd"}


def test_neuron_device_routes_to_the_toolchain(monkeypatch):
    calls = []
    monkeypatch.setattr(_dispatch, "run_on_neuron", lambda call: calls.append(call) or "kernel")
    x = torch.randn(3, 4)
    result = _dispatch.run(lambda: activations.gelu_kernel_call(x), lambda: "reference",
                           types.SimpleNamespace(type="neuron"))
    assert result == "kernel" and calls[0].kernel == "elementwise_kernel"
    assert _dispatch.run(lambda: None, lambda: "reference", torch.device("cpu")) == "reference"
    with pytest.raises(RuntimeError, match=r"nki_kernels has no implementation for device meta; "
                                           r"supported devices are 'neuron'"):
        _dispatch.run(lambda: None, lambda: "reference", torch.device("meta"))


@pytest.mark.parametrize("missing", ["torch_neuronx", "nki"])
def test_a_missing_toolchain_module_is_named(monkeypatch, missing):
    for name in _neuron.TOOLCHAIN:
        monkeypatch.setitem(sys.modules, name, None if name == missing else types.ModuleType(name))
    with pytest.raises(_neuron.ToolchainMissing, match=rf"importing {missing} failed") as info:
        _dispatch.run_on_neuron(activations.gelu_kernel_call(torch.randn(2, 3)))
    assert isinstance(info.value, RuntimeError) and "README" in str(info.value)


def test_synchronize_uses_torch_neuron(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "neuron", types.SimpleNamespace(synchronize=lambda: calls.append("neuron")),
                        raising=False)
    _neuron.synchronize()
    assert calls == ["neuron"]

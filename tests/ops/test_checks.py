"""``_checks``' helpers hand back the Python type the kernels' static arguments need: a
numpy scalar (what a config loaded with numpy gives) becomes a Python float / int, so a
kernel launch sees the same compile-time value as for the Python number."""

from __future__ import annotations

import fractions
import sys
import types

import numpy as np
import pytest
import torch

from nki_kernels import _checks, _dispatch, _neuron
from nki_kernels.ops import norms
from tests.neuron._doubles import RecordingKernel


@pytest.mark.parametrize("value", [np.float32(0.125), np.float16(0.125), np.int64(3), fractions.Fraction(1, 8), 2])
def test_check_real_gives_a_python_float(value):
    got = _checks.check_real("eps", value)
    assert type(got) is float and got == float(value)


@pytest.mark.parametrize("value", [np.int32(-2), np.uint8(7), 5])
def test_check_index_gives_a_python_int(value):
    got = _checks.check_index("dim", value)
    assert type(got) is int and got == int(value)


def test_a_numpy_eps_reaches_the_kernel_as_a_python_float(monkeypatch):
    # (every distinct non-tensor argument is a compile on the device: np.float32(x) and x
    # must be the same one)
    for name in _neuron.TOOLCHAIN:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setenv(_neuron.LNC_ENV, "2")
    monkeypatch.delenv(_neuron.CC_FLAGS_ENV, raising=False)
    monkeypatch.delenv(_neuron.RT_CORE_SIZE_ENV, raising=False)
    kernel = RecordingKernel(compute=lambda x, w, eps: torch.zeros(x.shape))
    monkeypatch.setattr(_dispatch._kernel_sources, "kernel", lambda *a: kernel)
    x, w = torch.randn(3, 32), torch.randn(32)
    _dispatch.run_on_neuron(norms.rms_norm_kernel_call(x, (32,), w, np.float32(2.0 ** -10)))
    eps = kernel.events[0][4]["eps"]
    assert type(eps) is float and eps == 2.0 ** -10

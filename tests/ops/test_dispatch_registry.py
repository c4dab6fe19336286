"""Defaults of the CPU dispatch and the registry's contract that the other tests take for
granted: the reference backend when ``NKI_KERNELS_CPU_BACKEND`` is unset or blank, the
simulator launch on contiguous inputs, registering a spec again, the registry's order and
its error naming what is registered."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nki_kernels import _dispatch, registry


@pytest.mark.parametrize("value", [None, "", "   "], ids=["unset", "empty", "blank"])
def test_the_cpu_backend_defaults_to_the_reference(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(_dispatch.CPU_BACKEND_ENV, raising=False)
    else:
        monkeypatch.setenv(_dispatch.CPU_BACKEND_ENV, value)
    assert _dispatch.cpu_backend() == "reference"
    ran = _dispatch.run(lambda: pytest.fail("the kernel ran"), lambda: "reference", torch.device("cpu"))
    assert ran == "reference"


def test_an_unknown_cpu_backend_is_named(monkeypatch):
    monkeypatch.setenv(_dispatch.CPU_BACKEND_ENV, "Neuron")
    with pytest.raises(ValueError, match=r"NKI_KERNELS_CPU_BACKEND='neuron' is not supported; "
                                         r"expected one of \('reference', 'simulator'\)"):
        _dispatch.cpu_backend()


def test_the_simulator_launch_gets_contiguous_inputs(monkeypatch):
    # a KernelCall may carry a strided view (a custom op's input as given); the simulated
    # kernel, like the device one, is handed a contiguous copy of the same values
    monkeypatch.delenv(_dispatch.LNC_ENV, raising=False)
    seen = []

    class Kernel:
        def __getitem__(self, degree):
            return self

        def __call__(self, *tensors, **static):
            seen.extend(tensors)
            return tensors[0]

    monkeypatch.setattr(_dispatch, "simulator_kernel", lambda call: Kernel())
    from nki_kernels import simulator

    fake_nki = type("nki", (), {"simulate": staticmethod(lambda kernel: kernel)})
    monkeypatch.setattr(simulator, "nki_modules", lambda: {"nki": fake_nki})
    x = torch.randn(6, 40).t()                        # [40, 6], not contiguous
    call = _dispatch.KernelCall("elementwise", "elementwise_kernel", (x,), {"op": "silu"})
    out = _dispatch.run_simulated(call)
    assert len(seen) == 1 and seen[0].is_contiguous() and torch.equal(seen[0], x)
    assert torch.equal(out, x)


def test_registering_the_same_spec_again_changes_nothing():
    before = registry.ops()
    spec = registry.get("silu")
    assert registry.register(spec) is spec
    assert registry.ops() == before


def test_ops_are_in_registration_order(monkeypatch):
    monkeypatch.setattr(registry, "_OPS", dict(registry._OPS))
    first = registry.ops()
    spec = registry.get("gelu")

    def extra_op(*args, **kwargs):
        return spec.function(*args, **kwargs)

    added = registry.register(dataclasses.replace(spec, name="extra_op", function=extra_op))
    assert registry.ops() == first + (added,)


def test_an_unknown_op_name_lists_the_registered_ones():
    with pytest.raises(KeyError) as info:
        registry.get("rmsnorm")
    message = str(info.value)
    assert "no op named 'rmsnorm'" in message
    for spec in registry.ops():
        assert spec.name in message


def test_workloads_are_checked_against_float64_unless_declared():
    # the main job's and the acceptance run's check compares against a float64 reference
    # by default (Workload.reference_dtype); a workload opts into float32 explicitly
    work = registry.Workload("w", lambda g: ((torch.randn(2, 3, generator=g),), {}))
    assert work.reference_dtype == torch.float64


@pytest.mark.parametrize("target, degree", [("trn1", 1), ("trn2", 2)])
def test_the_simulator_launch_follows_the_active_target(simulator_backend, monkeypatch, target, degree):
    # an op inside simulator.activated(target) launches at that target's degree (trn1: LNC=1
    # only; it raised "degree 2 exceeds the maximum 1 of trn1" when the degree came from the
    # default target), unless NEURON_LOGICAL_NC_CONFIG says otherwise
    import nki_kernels
    from nki_kernels import simulator

    monkeypatch.delenv(_dispatch.LNC_ENV, raising=False)
    launched = []
    real = _dispatch.simulator_kernel

    def spy(call):
        kernels = real(call)

        class Degrees:
            def __getitem__(self, lnc):
                launched.append(lnc)
                return kernels[lnc]
        return Degrees()

    monkeypatch.setattr(_dispatch, "simulator_kernel", spy)
    x, w = torch.randn(5, 256), torch.randn(256)
    with simulator.activated(target):
        out = nki_kernels.rms_norm(x, (256,), w, 1e-6)
    assert launched == [degree]
    ref = torch.nn.functional.rms_norm(x.double(), (256,), w.double(), 1e-6)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)   # fp32 row sums: ~1e-6

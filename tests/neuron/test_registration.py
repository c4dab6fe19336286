"""Op registration where ``torch_neuronx`` imports: ``torch_neuronx.nki_op`` in the form
TorchNeuron documents, with the fake and the autograd our CPU ops have; and plain
``torch.library.custom_op`` everywhere else (the CPU ops unchanged).

``torch_neuronx`` is a recording test double (tests/neuron/_doubles.py): these tests pin
the call shape, not AWS's implementation.
"""

from __future__ import annotations

import inspect
import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, Optional

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from nki_kernels import _custom_op, _neuron, references
from nki_kernels.ops import norms
from tests._helpers import TOLERANCES
from tests.neuron._doubles import RecordingNkiOp, torch_neuronx_module

ROOT = Path(__file__).resolve().parents[2]
_fresh = itertools.count()


class _Counted:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def _define_rms_norm_twin():
    """An rms_norm op under a fresh name (ops cannot be registered twice), built from the
    real op's pieces, with counters on the kernel launch and the reference."""
    name = f"_neuron_test_rms_norm_{next(_fresh)}"

    def stub(input: torch.Tensor, normalized_shape: List[int], weight: Optional[torch.Tensor],
             eps: float) -> torch.Tensor: ...

    stub.__name__ = stub.__qualname__ = name
    kernel_call, reference = _Counted(norms.rms_norm_kernel_call), _Counted(references.rms_norm)
    op = _custom_op.define_op(
        stub, kernel_call=kernel_call, reference=reference,
        fake=lambda input, *_: torch.empty_like(input),
        grad_reference=lambda *a: references.rms_norm(*a, compute_dtype=torch.float32))
    return op, f"_nki_kernels_dev::{name.lstrip('_')}", kernel_call, reference


@pytest.fixture(autouse=True)
def _twins_leave_the_package_registry(monkeypatch):
    """A twin is a test's op: each test registers into a copy of
    ``_custom_op.registered_with`` (define_op writes the module's dict), so the package's
    list of its ops is as before once the test ends (tests/integration/test_distributed.py
    checks each has a sharding rule, and under ``pytest -n`` this file can run before that
    one). torch keeps the op itself: an op cannot be unregistered, and _define_rms_norm_twin
    takes a fresh name each time."""
    monkeypatch.setattr(_custom_op, "registered_with", dict(_custom_op.registered_with))


@pytest.fixture
def nki_op(monkeypatch):
    double = RecordingNkiOp()
    monkeypatch.setitem(sys.modules, "torch_neuronx", torch_neuronx_module(double))
    return double


def _inputs(rows=5, hidden=24, dtype=torch.float32):
    return torch.randn(rows, 3, hidden).to(dtype), torch.randn(hidden).to(dtype)


def test_nki_op_is_called_in_the_documented_form(nki_op):
    op, name, _, _ = _define_rms_norm_twin()
    assert len(nki_op.calls) == 1
    call = nki_op.calls[0]
    # @nki_op("<ns>::<name>", mutates_args={}) on the function (AWS's example form)
    assert call.name == name
    assert call.mutates_args == {} and isinstance(call.mutates_args, dict)
    assert not call.fn_given_directly and call.other_kwargs == {}
    # "explicit type signatures": every parameter and the return annotated, with real types
    params = call.signature.parameters
    assert list(params) == ["input", "normalized_shape", "weight", "eps"]
    assert all(p.annotation is not inspect.Parameter.empty for p in params.values())
    assert params["weight"].annotation == Optional[torch.Tensor] and params["eps"].annotation is float
    assert call.signature.return_annotation is torch.Tensor
    assert call.annotations["return"] is torch.Tensor and call.annotations["eps"] is float
    assert call.schema == "(Tensor input, SymInt[] normalized_shape, Tensor? weight, float eps) -> Tensor"
    assert _custom_op.registered_with[name] == _custom_op.NKI_OP


def test_cpu_results_are_the_reference(nki_op):
    op, _, kernel_call, reference = _define_rms_norm_twin()
    x, w = _inputs()
    out = op(x, [24], w, 1e-6)
    torch.testing.assert_close(out, references.rms_norm(x, (24,), w, 1e-6))
    assert (reference.calls, kernel_call.calls) == (1, 0)


def test_cpu_simulator_backend_runs_the_kernel(nki_op, simulator_backend):
    op, _, kernel_call, reference = _define_rms_norm_twin()
    x, w = _inputs(rows=3, hidden=40)
    out = op(x, [40], w, 1e-6)
    want = references.rms_norm(x.double(), (40,), w.double(), 1e-6, compute_dtype=torch.float64)
    atol, rtol = TOLERANCES[torch.float32]
    torch.testing.assert_close(out.double(), want, atol=atol, rtol=rtol)
    assert (kernel_call.calls, reference.calls) == (1, 0)


def test_the_fake_is_ours_not_the_body(nki_op):
    # nki_op registers the body as the fake (it would run the kernel's shape inference);
    # the package replaces it with the same empty outputs its CPU ops use
    op, _, kernel_call, reference = _define_rms_norm_twin()
    x, w = _inputs(dtype=torch.bfloat16)
    with FakeTensorMode() as mode:
        fx, fw = mode.from_tensor(x), mode.from_tensor(w)
        out = op(fx, [24], fw, 1e-6)
    assert out.shape == x.shape and out.dtype == torch.bfloat16 and out.stride() == x.stride()
    assert (kernel_call.calls, reference.calls) == (0, 0)
    meta = op(x.to("meta"), [24], w.to("meta"), 1e-6)
    assert meta.device.type == "meta" and meta.shape == x.shape


def test_autograd_is_the_fp32_recompute(nki_op):
    op, _, _, _ = _define_rms_norm_twin()
    x, w = _inputs()
    x.requires_grad_(True)
    w.requires_grad_(True)
    g = torch.randn(x.shape)
    gx, gw = torch.autograd.grad(op(x, [24], w, 1e-6), (x, w), g)
    xr, wr = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    want = torch.autograd.grad(references.rms_norm(xr, (24,), wr, 1e-6, compute_dtype=torch.float64),
                               (xr, wr), g.double())
    torch.testing.assert_close(gx.double(), want[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(gw.double(), want[1], atol=1e-5, rtol=1e-4)


def test_opcheck_passes_on_the_nki_op_registration(nki_op):
    op, _, _, _ = _define_rms_norm_twin()
    x, w = _inputs()
    torch.library.opcheck(op, (x.requires_grad_(True), [24], w, 1e-6))


def test_compile_fullgraph_on_cpu(nki_op):
    op, _, _, _ = _define_rms_norm_twin()
    x, w = _inputs()
    fn = torch.compile(lambda a, b: op(a, [24], b, 1e-6) * 2.0, fullgraph=True, backend="eager")
    torch.testing.assert_close(fn(x, w), references.rms_norm(x, (24,), w, 1e-6) * 2.0)


def test_without_torch_neuronx_ops_are_torch_custom_ops(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_neuronx", raising=False)
    assert _neuron.registrar() is None
    op, name, _, _ = _define_rms_norm_twin()
    assert _custom_op.registered_with[name] == _custom_op.TORCH_CUSTOM_OP
    assert "torch_neuronx" not in sys.modules
    assert isinstance(op, torch._library.custom_ops.CustomOpDef)


@pytest.mark.parametrize("module", [None, torch_neuronx_module(nki_op=None)],
                         ids=["import-fails", "xla-era-without-nki_op"])
def test_a_torch_neuronx_without_nki_op_keeps_torch_custom_ops(monkeypatch, module):
    # None in sys.modules makes `import torch_neuronx` raise ImportError
    monkeypatch.setitem(sys.modules, "torch_neuronx", module)
    _, name, _, _ = _define_rms_norm_twin()
    assert _custom_op.registered_with[name] == _custom_op.TORCH_CUSTOM_OP


def test_the_package_registers_every_op_with_nki_op_on_a_neuron_host(tmp_path):
    """A fresh interpreter with a recording ``torch_neuronx`` on its path: every op of the
    registry is registered through nki_op in the documented form, and still works on CPU
    (result, fake, backward, torch.compile)."""
    pkg = tmp_path / "torch_neuronx"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from tests.neuron._doubles import RecordingNkiOp\nnki_op = RecordingNkiOp()\n")
    code = textwrap.dedent("""
        import json, torch, torch_neuronx
        import nki_kernels
        from nki_kernels import _custom_op, registry
        from torch._subclasses.fake_tensor import FakeTensorMode
        calls = torch_neuronx.nki_op.calls
        x = torch.randn(6, 64, requires_grad=True)
        y = nki_kernels.gelu(x)
        y.sum().backward()
        ok_ref = torch.allclose(y, torch.nn.functional.gelu(x))
        x_ref = x.detach().clone().requires_grad_(True)
        torch.nn.functional.gelu(x_ref).sum().backward()
        ok_grad = x.grad is not None and torch.allclose(x.grad, x_ref.grad, atol=1e-5, rtol=1e-4)
        with FakeTensorMode() as m:
            fake = nki_kernels.rms_norm(m.from_tensor(torch.randn(3, 8)), (8,), None, 1e-6)
        compiled = torch.compile(lambda t: nki_kernels.silu(t) + 1, fullgraph=True, backend="eager")
        ok_compile = torch.allclose(compiled(x.detach()), torch.nn.functional.silu(x.detach()) + 1)
        print(json.dumps({
            "names": [c.name for c in calls],
            "forms": sorted({(repr(c.mutates_args), c.fn_given_directly, repr(c.other_kwargs)) for c in calls}),
            "unannotated": [c.name for c in calls if any(p.annotation is p.empty for p in c.signature.parameters.values())
                            or c.signature.return_annotation is c.signature.empty],
            "registered_with": sorted(set(_custom_op.registered_with.values())),
            # every op of the registry, its backward op, and the training forwards that save
            # what the backward reads (attention's lse, layer_norm's statistics)
            "ops": [s.custom_op._qualname for s in registry.ops()]
                   + [s.backward.custom_op._qualname for s in registry.ops() if s.backward is not None]
                   + [nki_kernels.ops.attention._sdpa_lse_op._qualname,
                      nki_kernels.ops.norms._layer_norm_train_op._qualname],
            "ok": [ok_ref, ok_grad, tuple(fake.shape) == (3, 8), ok_compile],
        }))
    """)
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin", "NKI_KERNELS_CPU_BACKEND": "reference"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(out["names"]) == sorted(out["ops"]) and len(out["ops"]) >= 10
    assert out["forms"] == [["{}", False, "{}"]]
    assert out["unannotated"] == []
    assert out["registered_with"] == [_custom_op.NKI_OP]
    assert out["ok"] == [True, True, True, True]

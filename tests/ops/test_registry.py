"""The op registry: every op is declared once, and everything that enumerates ops sees it
(exports, layers, kernels, twins, eager models, opcheck, the main job, benchmarks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import nki_kernels
from nki_kernels import _dispatch, _kernel_sources, layers, registry

ROOT = Path(__file__).resolve().parents[2]
SPECS = registry.ops()
IDS = [s.name for s in SPECS]
EXPECTED = {"scaled_dot_product_attention", "layer_norm", "rms_norm", "fused_add_rms_norm", "gelu", "silu",
            "silu_and_mul", "gelu_and_mul", "softmax", "apply_rotary_pos_emb"}


def test_every_op_is_registered_once():
    assert [s.name for s in SPECS] == list(dict.fromkeys(s.name for s in SPECS))
    assert set(IDS) == EXPECTED


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_op_is_exported_with_its_custom_op(spec):
    assert spec.name in nki_kernels.__all__
    assert getattr(nki_kernels, spec.name) is spec.function
    qualified = spec.custom_op._qualname if hasattr(spec.custom_op, "_qualname") else spec.custom_op._name
    assert qualified.endswith("::" + spec.name)


LAYERS = [(s.name, name) for s in SPECS for name in s.layers]


def test_every_layer_class_is_one_ops_layer():
    # the ops' layer lists name every nn.Module layers.py defines (an alias such as
    # SiluAndMul is the same class), each once; an op without layers, such as softmax, lists none
    defined = {v for v in vars(layers).values()
               if isinstance(v, type) and issubclass(v, torch.nn.Module) and v.__module__ == layers.__name__}
    names = [name for _, name in LAYERS]
    assert len(names) == len(set(names))
    assert {getattr(layers, name) for name in names} == defined


@pytest.mark.parametrize("op, name", LAYERS, ids=[f"{op}-{name}" for op, name in LAYERS])
def test_layers_exist(op, name):
    layer = getattr(layers, name)
    assert issubclass(layer, torch.nn.Module) and "forward" in vars(layer)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_workloads_launch_an_existing_kernel(spec):
    # every workload's inputs reach a kernel that exists in both flavours' sources, and
    # the limit / eager model accepts them (the main job runs the kernels themselves)
    assert spec.workloads
    for w in spec.workloads:
        args, kwargs = w.make(torch.Generator().manual_seed(0))
        call = spec.kernel_call(*args, **kwargs)
        assert isinstance(call, _dispatch.KernelCall)
        assert callable(_dispatch.simulator_kernel(call))
        assert _kernel_sources.source_path(call.module).is_file()
        roof = spec.roofline(*args, **kwargs)
        assert roof.limit_us > 0 and roof.eager_us >= roof.limit_us * (1 - 1e-12)


def test_opcheck_covers_every_op():
    text = (ROOT / "tests" / "ops" / "test_opcheck.py").read_text()
    covered = set(re.findall(r'OP\["(\w+)"\]', text))
    # two ops have their opcheck beside their other tests: found there, not assumed
    for path in ("test_attention.py", "test_gelu.py"):
        other = (ROOT / "tests" / "ops" / path).read_text()
        covered |= set(re.findall(r'torch\.library\.opcheck\(\s*nki_kernels\.registry\.get\("(\w+)"\)\.custom_op', other))
    assert {"scaled_dot_product_attention", "gelu"} <= covered
    assert covered >= set(IDS), sorted(set(IDS) - covered)


def test_every_op_has_a_benchmark():
    text = "\n".join(p.read_text() for p in (ROOT / "benchmarks").glob("benchmark_*.py"))
    missing = [name for name in IDS if f"self.kernel.{name}(" not in text]
    assert not missing, missing


def test_register_rejects_a_mismatched_or_duplicate_name():
    spec = registry.get("gelu")
    with pytest.raises(ValueError, match="differs from its function"):
        registry.register(registry.OpSpec("not_gelu", spec.function, spec.custom_op, spec.kernel_call,
                                          spec.reference, spec.roofline))
    from dataclasses import replace

    with pytest.raises(ValueError, match="registered twice"):
        registry.register(replace(spec))
    with pytest.raises(KeyError, match="no op named 'nope'"):
        registry.get("nope")

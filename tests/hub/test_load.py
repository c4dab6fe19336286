"""Loading the built Hub tree with the `kernels` library, offline, as users do.

Every loader of kernels 0.17.2 that works without network is exercised: get_local_kernel,
get_kernel from a Hub cache laid out exactly as huggingface_hub leaves it after a download,
LOCAL_KERNELS, LocalLayerRepository + kernelize; plus variant selection on a (simulated)
Trainium host and two builds loaded side by side.
"""

from __future__ import annotations

import hashlib
import os
import sys
import types
from pathlib import Path

import pytest
import torch

import kernels
import nki_kernels as dev  # the development package: what the build must behave like
from kernels.variants import VariantAccepted, VariantRejected, get_variants_local, resolve_variants
from tests._helpers import TOLERANCES

from .conftest import ROOT

REPO_ID = "nki-kernels/nki-kernels"


def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


# Example calls for every public function of the package: name -> () -> [(args, kwargs)].
# Fresh random inputs, odd shapes next to tile-exact ones. When an op lands in __all__, add
# it here (test_every_public_function_runs fails until it is).
EXAMPLES = {
    "cpu_backend": lambda: [((), {})],
    "gelu": lambda: [
        ((_x(3, 7, 33),), {}),
        ((_x(2, 128, dtype=torch.bfloat16),), {"approximate": "tanh"}),
        ((_x(5, 17, dtype=torch.float16),), {}),
    ],
    "silu": lambda: [((_x(3, 7, 33),), {}), ((_x(128, 4, dtype=torch.bfloat16),), {})],
    "silu_and_mul": lambda: [((_x(5, 2 * 37),), {}), ((_x(2, 3, 256, dtype=torch.bfloat16),), {})],
    "gelu_and_mul": lambda: [((_x(5, 2 * 37),), {}), ((_x(4, 128, dtype=torch.bfloat16),), {"approximate": "tanh"})],
    "layer_norm": lambda: [
        ((_x(5, 96), (96,), _x(96), _x(96)), {"eps": 1e-5}),
        ((_x(2, 3, 100, dtype=torch.bfloat16), [100]), {}),
    ],
    "rms_norm": lambda: [
        ((_x(6, 80), (80,), _x(80)), {"eps": 1e-6}),
        ((_x(3, 130, dtype=torch.bfloat16), [130]), {}),
    ],
    "fused_add_rms_norm": lambda: [((_x(4, 72), _x(4, 72), _x(72), 1e-6), {}), ((_x(3, 64), _x(3, 64), None, None), {})],
    "apply_rotary_pos_emb": lambda: [((_x(2, 4, 9, 16), _x(2, 2, 9, 16), _x(2, 9, 16), _x(2, 9, 16)), {})],
    "softmax": lambda: [((_x(3, 5, 77),), {"dim": -1}), ((_x(4, 6, dtype=torch.bfloat16),), {"dim": 0})],
    "scaled_dot_product_attention": lambda: [
        ((_x(2, 3, 17, 64), _x(2, 3, 17, 64), _x(2, 3, 17, 64)), {}),
        ((_x(1, 4, 9, 72, dtype=torch.bfloat16), _x(1, 2, 13, 72, dtype=torch.bfloat16),
          _x(1, 2, 13, 72, dtype=torch.bfloat16)), {"is_causal": True, "enable_gqa": True}),
        ((_x(2, 2, 5, 32), _x(2, 2, 7, 32), _x(2, 2, 7, 32)), {"attn_mask": torch.rand(2, 1, 1, 7) > 0.3}),
    ],
    "nki_attention_forward": lambda: [
        ((torch.nn.Module(), _x(2, 4, 11, 64), _x(2, 2, 11, 64), _x(2, 2, 11, 64), None), {"scaling": 0.125}),
    ],
}


def _public_functions(module) -> list[str]:
    return [n for n in module.__all__ if callable(getattr(module, n)) and not isinstance(getattr(module, n), type)]


def _same(actual, expected) -> bool:
    if isinstance(expected, torch.Tensor):
        return isinstance(actual, torch.Tensor) and actual.dtype == expected.dtype and torch.equal(actual, expected)
    if isinstance(expected, (tuple, list)):
        return type(actual) is type(expected) and len(actual) == len(expected) and all(map(_same, actual, expected))
    return actual == expected


def _ops_of(module) -> dict[str, str]:
    """Custom ops defined by ``module``'s code: {qualified op name: defining module}."""
    from torch._library.custom_ops import OPDEFS

    prefix = module.__name__ + "."
    return {
        qualname: opdef._init_fn.__module__
        for qualname, opdef in OPDEFS.items()
        if getattr(opdef._init_fn, "__module__", "").startswith(prefix)
    }


@pytest.fixture(scope="module")
def hub(default_build):
    """The default build, loaded for this (CPU) host with kernels.get_local_kernel."""
    out, _ = default_build
    return kernels.get_local_kernel(out)


# ------------------------------------------------------------------------------ get_local_kernel

def test_get_local_kernel_loads_the_cpu_variant(hub, default_build):
    out, summary = default_build
    assert hub.__name__ == f"_nki_kernels_cpu_{summary['id']}"
    assert Path(hub.__file__).parent == out / "torch-cpu"
    assert hub.__all__ == dev.__all__
    # Every submodule was imported from the build, none from the development tree.
    for name, module in list(sys.modules.items()):
        if name.startswith(hub.__name__ + ".") and getattr(module, "__file__", None):
            assert Path(module.__file__).is_relative_to(out / "torch-cpu"), name


def test_every_custom_op_uses_the_generated_namespace(hub):
    ops = _ops_of(hub)
    assert ops, "the loaded build defines no custom op"
    for qualname in ops:
        namespace, op = qualname.split("::")
        assert namespace == hub.__name__, qualname
        assert hasattr(getattr(torch.ops, namespace), op)
    # The development namespace holds only the development package's ops.
    assert not [q for q in ops if q.startswith("_nki_kernels_dev::")]


def test_every_public_function_runs(hub, monkeypatch):
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "reference")
    missing = [n for n in _public_functions(hub) if n not in EXAMPLES]
    assert not missing, f"add example calls for {missing} to EXAMPLES in {Path(__file__).name}"
    for name in _public_functions(hub):
        for args, kwargs in EXAMPLES[name]():
            got = getattr(hub, name)(*args, **kwargs)
            want = getattr(dev, name)(*args, **kwargs)
            assert _same(got, want), f"{name}: the Hub build differs from the source package"


@pytest.mark.parametrize("dtype, shape", [(torch.float32, (3, 7, 33)), (torch.bfloat16, (2, 128))])
def test_gelu_runs_its_shipped_nki_kernel_in_the_simulator(hub, default_build, monkeypatch, dtype, shape):
    out, _ = default_build
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "simulator")
    x = _x(*shape, dtype=dtype)
    y = hub.gelu(x)
    atol, rtol = TOLERANCES[dtype]
    expected = dev.references.gelu(x.double(), compute_dtype=torch.float64)  # float64 reference
    torch.testing.assert_close(y.double(), expected, atol=atol, rtol=rtol)
    # It was the NKI source copied into the build that ran, not the repository's kernels/.
    kernel_module = hub._kernel_sources.load("elementwise", "simulator")
    assert Path(kernel_module.__file__) == out / "torch-cpu" / "nki_src" / "elementwise.py"


# ------------------------------------------------------------------------------ get_kernel from the Hub cache

def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def make_hub_cache(cache_dir: Path, build_dir: Path, publish_hub, repo_id: str = REPO_ID, version: int = 1) -> Path:
    """Lay out ``cache_dir`` as huggingface_hub leaves it after downloading the published repo:
    ``kernels--<org>--<name>/{blobs,refs,snapshots}`` with snapshot files symlinked to blobs."""
    plan = publish_hub.make_plan(build_dir, repo_id, version)
    repo = cache_dir / ("kernels--" + repo_id.replace("/", "--"))
    for revision in (plan.branch, "main"):
        files = plan.files(revision)
        commit = hashlib.sha1("\n".join(f"{revision}:{u.path_in_repo}" for u in files).encode()).hexdigest()
        for upload in files:
            data = upload.local.read_bytes()
            blob = repo / "blobs" / _git_blob_id(data)
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
            link = repo / "snapshots" / commit / upload.path_in_repo
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / revision).write_text(commit)
    return repo


def test_get_kernel_from_the_offline_hub_cache(offline_hub, build_with_id, publish_hub, monkeypatch):
    build = build_with_id("hubcache")
    repo = make_hub_cache(offline_hub / "hub", build, publish_hub)
    assert kernels.has_kernel(REPO_ID, version=1)
    module = kernels.get_kernel(REPO_ID, version=1)
    assert module.__name__ == "_nki_kernels_cpu_hubcache"
    commit = (repo / "refs" / "v1").read_text()
    assert Path(module.__file__).parent == repo / "snapshots" / commit / "build" / "torch-cpu"
    x = _x(4, 9)
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "reference")
    assert torch.equal(module.gelu(x), dev.gelu(x))
    with pytest.raises(ValueError, match="Version 2 not found, available versions: 1"):
        kernels.get_kernel(REPO_ID, version=2)


def test_get_kernel_from_the_hub_cache_runs_the_simulator(offline_hub, build_with_id, publish_hub, monkeypatch):
    # Hub snapshots hold symlinks into blobs/: the package must find nki_src/ next to itself.
    build = build_with_id("hubcachesim")
    repo = make_hub_cache(offline_hub / "hub", build, publish_hub)
    module = kernels.get_kernel(REPO_ID, version=1)
    assert module.__name__ == "_nki_kernels_cpu_hubcachesim"
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "simulator")
    x = _x(3, 65)
    expected = dev.references.gelu(x.double(), compute_dtype=torch.float64)
    torch.testing.assert_close(module.gelu(x).double(), expected,
                               atol=TOLERANCES[torch.float32][0], rtol=TOLERANCES[torch.float32][1])
    source = Path(module._kernel_sources.load("elementwise", "simulator").__file__)
    assert source.parent.name == "nki_src" and source.is_relative_to(repo)


def test_get_kernel_from_kernels_cache(offline_hub, build_with_id, publish_hub, monkeypatch, tmp_path):
    import kernels.resolver

    cache = tmp_path / "kernels_cache"
    monkeypatch.setenv("KERNELS_CACHE", str(cache))
    monkeypatch.setattr(kernels.resolver, "CACHE_DIR", str(cache))  # read at import, as in a fresh process
    make_hub_cache(cache, build_with_id("kcache"), publish_hub)
    assert kernels.get_kernel(REPO_ID, version=1).__name__ == "_nki_kernels_cpu_kcache"


def test_local_kernels_override(offline_hub, build_with_id, monkeypatch):
    build = build_with_id("localenv")
    monkeypatch.setenv("LOCAL_KERNELS", f"{REPO_ID}={build}")
    module = kernels.get_kernel(REPO_ID, version=1)
    assert module.__name__ == "_nki_kernels_cpu_localenv"
    assert Path(module.__file__).parent == build / "torch-cpu"


# ------------------------------------------------------------------------------ layers

LAYERS_SOURCE = ROOT / "torch_ext" / "nki_kernels" / "layers.py"


def test_local_layer_repository_and_kernelize(build_with_id, monkeypatch):
    assert LAYERS_SOURCE.exists(), "torch_ext/nki_kernels/layers.py (the kernelize layers) is missing"
    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

    @use_kernel_forward_from_hub("RMSNorm")
    class RMSNorm(torch.nn.Module):  # the Llama RMSNorm shape: weight + variance_epsilon
        def __init__(self, hidden: int, eps: float = 1e-6):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(hidden))
            self.variance_epsilon = eps

        def forward(self, hidden_states):
            variance = hidden_states.float().pow(2).mean(-1, keepdim=True)
            return self.weight * (hidden_states.float() * torch.rsqrt(variance + self.variance_epsilon)).to(hidden_states.dtype)

    @use_kernel_forward_from_hub("SiluAndMul")
    class SiluAndMul(torch.nn.Module):
        def forward(self, x):
            d = x.shape[-1] // 2
            return torch.nn.functional.silu(x[..., :d]) * x[..., d:]

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = RMSNorm(96)
            self.act = SiluAndMul()

        def forward(self, x):
            return self.act(self.norm(x))

    build = build_with_id("hublayers")
    mapping = {
        name: {"cpu": LocalLayerRepository(repo_path=build, layer_name=name)} for name in ("RMSNorm", "SiluAndMul")
    }
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "reference")
    model = Block()
    x = _x(3, 5, 96)
    eager = model(x)
    with use_kernel_mapping(mapping):
        model = kernelize(model, mode=Mode.INFERENCE, device="cpu")
    hub_module = sys.modules["_nki_kernels_cpu_hublayers"]
    assert model.norm.forward.__func__ is hub_module.layers.RMSNorm.forward
    assert model.act.forward.__func__ is hub_module.layers.SiluAndMul.forward
    out = model(x)
    torch.testing.assert_close(out, eager, atol=1e-5, rtol=1e-4)  # fp32 reference vs eager fp32
    expected = dev.silu_and_mul(dev.rms_norm(x, (96,), model.norm.weight.detach(), 1e-6))
    assert torch.equal(out.detach(), expected)


# ------------------------------------------------------------------------------ simulated Trainium host

@pytest.fixture
def neuron_host(monkeypatch):
    """`torch.neuron` present, as torch-neuronx makes it; kernels then selects the neuron backend."""
    monkeypatch.setattr(torch, "neuron", types.ModuleType("torch.neuron"), raising=False)
    monkeypatch.delitem(sys.modules, "nki", raising=False)
    yield


def _decisions(build: Path):
    _, trace = resolve_variants(get_variants_local(build))
    return {d.variant.variant_str: d for d in trace}, trace


def test_cpu_host_selects_torch_cpu(default_build):
    decisions, trace = _decisions(default_build[0])
    assert isinstance(trace[0], VariantAccepted) and trace[0].variant.variant_str == "torch-cpu"
    assert isinstance(decisions["torch-neuron"], VariantRejected)


def test_neuron_host_selects_torch_neuron_and_rejects_torch_cpu(default_build, neuron_host):
    decisions, trace = _decisions(default_build[0])
    assert isinstance(trace[0], VariantAccepted) and trace[0].variant.variant_str == "torch-neuron"
    assert isinstance(decisions["torch-cpu"], VariantRejected)
    assert "neuron" in decisions["torch-cpu"].reason


def test_neuron_host_without_nki_gets_a_clear_error_before_import(build_with_id, neuron_host):
    build = build_with_id("neuronnonki")
    with pytest.raises(ImportError, match="nki"):
        kernels.get_local_kernel(build)
    assert "_nki_kernels_neuron_neuronnonki" not in sys.modules


def test_neuron_variant_imports_without_the_toolchain(build_with_id, neuron_host, monkeypatch, tmp_path):
    # An `nki` that kernels' dependency check can find but that cannot be imported: the
    # package must import without touching it, and say what is missing when an op needs it.
    stub = tmp_path / "stubs" / "nki"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('stub nki: not the real toolchain')\n")
    monkeypatch.syspath_prepend(str(stub.parent))
    build = build_with_id("neuronhost")
    module = kernels.get_local_kernel(build)
    assert module.__name__ == "_nki_kernels_neuron_neuronhost"
    assert Path(module.__file__).parent == build / "torch-neuron"
    assert "nki" not in sys.modules and "torch_neuronx" not in sys.modules
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "reference")
    x = _x(6, 11)
    assert torch.equal(module.gelu(x), dev.gelu(x))  # CPU tensors still work on a neuron host
    with pytest.raises(RuntimeError, match=r"NKI toolchain .*`nki` and `torch-neuronx`"):
        module._dispatch.run_on_neuron(module.registry.get("gelu").kernel_call(x))


# ------------------------------------------------------------------------------ two builds side by side

def test_two_builds_load_side_by_side(build_with_id, monkeypatch):
    a = kernels.get_local_kernel(build_with_id("sidea"))
    b = kernels.get_local_kernel(build_with_id("sideb"))
    assert (a.__name__, b.__name__) == ("_nki_kernels_cpu_sidea", "_nki_kernels_cpu_sideb")
    ops_a, ops_b = _ops_of(a), _ops_of(b)
    assert ops_a and {q.split("::")[1] for q in ops_a} == {q.split("::")[1] for q in ops_b}
    assert not set(ops_a) & set(ops_b)
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "reference")
    x = _x(5, 31)
    assert torch.equal(a.gelu(x), b.gelu(x))

    # Each build's op runs its own code: break b's reference and a is unaffected.
    def broken(*args, **kwargs):
        raise RuntimeError("build b's dispatch ran")

    monkeypatch.setattr(b._dispatch, "run", broken)
    assert torch.equal(a.gelu(x), dev.gelu(x))
    with pytest.raises(RuntimeError, match="build b's dispatch ran"):
        b.gelu(x)


# ------------------------------------------------------------------------------ kernels benchmark

BENCHMARKS = sorted((ROOT / "benchmarks").glob("benchmark*.py"))


def test_kernels_benchmark_finds_the_benchmarks_in_the_build(default_build):
    from kernels.cli.benchmark import discover_benchmark_classes, discover_benchmark_scripts

    assert BENCHMARKS, "benchmarks/benchmark*.py (the measured benchmarks) are missing"
    out, _ = default_build
    scripts = discover_benchmark_scripts(str(out), out)  # what `kernels benchmark <build dir>` runs
    assert [s.name for s in scripts] == [b.name for b in BENCHMARKS]
    for script in scripts:
        classes = discover_benchmark_classes(script, out)
        assert classes, f"{script.name} defines no kernels.benchmark.Benchmark subclass"
        for cls in classes:
            assert [m for m in dir(cls) if m.startswith("benchmark_")], f"{cls.__name__} has no benchmark_ method"


@pytest.mark.sweep
def test_kernels_benchmark_cli_runs_every_benchmark_on_the_build(default_build):
    # `kernels benchmark <build dir>` end to end (all workloads once; ~10-20 s on CPU).
    assert BENCHMARKS, "benchmarks/benchmark*.py (the measured benchmarks) are missing"
    import tabulate  # noqa: F401  (kernels[benchmark] is a pinned dev dependency: fail, never skip)
    import subprocess

    out, summary = default_build
    result = subprocess.run(
        [sys.executable, "-c", "from kernels.cli import main; main()", "benchmark", str(out),
         "--iterations", "1", "--warmup", "0"],
        capture_output=True, text=True, cwd=out.parent,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for script in BENCHMARKS:
        assert f"Running {script.name}" in result.stderr
    assert f"Kernel: {summary['id'][:7]}" in result.stderr

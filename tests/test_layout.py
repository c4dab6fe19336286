"""The repository layout promises: kernels/ never shadows Hugging Face's `kernels`, NKI
sources import only nki, the stdlib and sibling kernel modules, and the shipped package
imports only relatively."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNEL_SOURCES = sorted((ROOT / "kernels").glob("*.py"))
PACKAGE_SOURCES = sorted((ROOT / "torch_ext" / "nki_kernels").rglob("*.py"))
NKI_ALLOWED = {"nki", "nki.language", "nki.isa"}
STDLIB = set(sys.stdlib_module_names)


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, 0
        elif isinstance(node, ast.ImportFrom):
            yield (node.module or ""), node.level


def test_kernels_dir_is_not_a_package():
    assert not (ROOT / "kernels" / "__init__.py").exists()


def test_hf_kernels_importable_from_repo_root():
    # `kernels/` at the repo root must not shadow the Hugging Face library.
    result = subprocess.run(
        [sys.executable, "-c", "import kernels; kernels.get_kernel; print(kernels.__file__)"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    assert "site-packages" in result.stdout


def test_there_are_kernel_sources():
    assert {"elementwise.py", "limits.py", "tiling.py"} <= {p.name for p in KERNEL_SOURCES}


@pytest.mark.parametrize("path", KERNEL_SOURCES, ids=lambda p: p.name)
def test_kernel_sources_import_only_nki_stdlib_and_siblings(path):
    siblings = {p.stem for p in KERNEL_SOURCES}
    for module, level in _imports(path):
        if level:
            # `from .tiling import ...`: a sibling module of the kernel package, one level up
            assert level == 1 and module.split(".")[0] in siblings, f"{path.name}: import {'.' * level}{module}"
            continue
        top = module.split(".")[0]
        assert module in NKI_ALLOWED or top in STDLIB, f"{path.name} imports {module!r}"


def test_limits_import_nothing():
    # the op layer reads kernels/limits.py on hosts without any NKI toolchain
    assert list(_imports(ROOT / "kernels" / "limits.py")) == []


# The Hugging Face integration module may import transformers and kernels, lazily inside its
# functions (checked by test_package_imports_without_optional_deps).
HF_INTEGRATION = ROOT / "torch_ext" / "nki_kernels" / "transformers.py"


@pytest.mark.parametrize("path", PACKAGE_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_package_imports_are_relative_or_torch(path):
    optional = {"numpy", "nki", "torch_neuronx"} | ({"transformers", "kernels"} if path == HF_INTEGRATION else set())
    for module, level in _imports(path):
        if level:
            continue
        top = module.split(".")[0]
        # numpy / nki / torch_neuronx (and transformers / kernels in the integration module)
        # are imported lazily inside functions only (checked by test_package_imports_without_optional_deps).
        assert top in STDLIB or top in {"torch"} | optional, (
            f"{path.relative_to(ROOT)} imports {module!r}; the shipped package may only "
            "use relative imports, the stdlib and torch"
        )


def test_package_imports_without_optional_deps():
    # Importing the package must not pull numpy, transformers, kernels or nki.
    code = (
        "import sys\n"
        "for name in ('numpy', 'transformers', 'kernels', 'nki', 'torch_neuronx'):\n"
        "    sys.modules[name] = None  # makes `import name` raise ImportError\n"
        "import nki_kernels, nki_kernels.simulator\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"

"""A local kernel repository holding this package, for ``kernels.get_local_kernel`` and
``kernels.LocalLayerRepository``: the tree ``tools/build_hub.py`` writes (what ``make build``
publishes), so the integration tests load exactly what the Hub would serve.

Layout::

    <root>/build/torch-cpu/      the package, nki_src/, _ops.py (op namespace
                                 _nki_kernels_cpu_<id>: the dev tree's _nki_kernels_dev is
                                 already registered in this process), metadata.json
    <root>/build/torch-neuron/   the same for the neuron backend (not loaded on CPU)
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _build_hub():
    spec = importlib.util.spec_from_file_location("_build_hub_for_tests", ROOT / "tools" / "build_hub.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module            # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def build_local_repo(root: Path, unique_id: str) -> tuple[Path, str]:
    """Build the Hub tree under ``root / "build"`` with id ``unique_id`` (no modeled report
    in its card); return (repo path, module name / op namespace of its CPU variant)."""
    _build_hub().build(root / "build", unique_id=unique_id, report=None)
    return root, f"_nki_kernels_cpu_{unique_id}"

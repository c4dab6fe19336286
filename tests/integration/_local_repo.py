"""A local kernel repository holding this package, for ``kernels.LocalLayerRepository``.

Layout (what ``kernels.get_local_kernel`` reads)::

    <root>/build/torch-cpu/
        __init__.py ...   a copy of torch_ext/nki_kernels (no __pycache__)
        nki_src/*.py      a copy of the NKI sources in kernels/
        _ops.py           op namespace _nki_kernels_cpu_<id> (the dev tree's is _nki_kernels_dev,
                          already registered in this process)
        metadata.json     name, id (= the module name kernels imports it under), version,
                          license, backend, python-depends

This mirrors tools/build_hub.py's variant without depending on it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "torch_ext" / "nki_kernels"
NKI_SOURCES = ROOT / "kernels"

OPS = '''"""Op namespace of a test build of nki-kernels."""

import torch

_OP_NAMESPACE = "{namespace}"

ops = getattr(torch.ops, _OP_NAMESPACE)


def add_op_namespace_prefix(op_name: str) -> str:
    return f"{{_OP_NAMESPACE}}::{{op_name}}"
'''


def build_local_repo(root: Path, unique_id: str) -> tuple[Path, str]:
    """Write the repository under ``root``; return (repo path, module name / op namespace)."""
    namespace = f"_nki_kernels_cpu_{unique_id}"
    variant = root / "build" / "torch-cpu"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(PACKAGE, variant, ignore=ignore)
    shutil.copytree(NKI_SOURCES, variant / "nki_src", ignore=ignore)
    (variant / "_ops.py").write_text(OPS.format(namespace=namespace))
    metadata = {
        "name": "nki-kernels",
        "id": namespace,
        "version": 1,
        "license": "Apache-2.0",
        "backend": {"type": "cpu"},
        "python-depends": [],
    }
    (variant / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    return root, namespace

"""Fixtures of the cost-model tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script(path: str):
    """A script of the repository (``path`` from its root; not part of the package) as a
    module."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def calibrate():
    """benchmarks/calibrate.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("calibrate", ROOT / "benchmarks" / "calibrate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["calibrate"] = mod   # its dataclasses look their module up
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("calibrate", None)

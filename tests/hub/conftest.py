"""Fixtures for the Hub packaging tests: build trees made once per session in tmp dirs.

Loading a build imports it under its metadata id and registers its ops in
``_nki_kernels_<backend>_<id>``; one process cannot import the same id from two paths
without the second silently replacing the first's ops, so every test that loads a tree from
a new place builds its own id (``build_with_id``). Builds are cheap: the card's API
introspection (a subprocess) runs once, for the default build, and is reused.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"


def _load_tool(name: str):
    if name in sys.modules:
        return sys.modules[name]
    path = list(sys.path)
    sys.path.insert(0, str(TOOLS))  # publish_hub imports its sibling build_hub
    try:
        spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)   # publish_hub puts its folder on sys.path too
    finally:
        sys.path[:] = path     # the tool modules are in sys.modules now
    return module


@pytest.fixture(scope="session")
def build_hub():
    return _load_tool("build_hub")


@pytest.fixture(scope="session")
def publish_hub(build_hub):
    return _load_tool("publish_hub")


@pytest.fixture(scope="session")
def default_build(build_hub, tmp_path_factory):
    """The tree `make build` writes, with the content-hash id: (path, summary)."""
    out = tmp_path_factory.mktemp("hub") / "build"
    summary = build_hub.build(out)
    return out, summary


@pytest.fixture(scope="session")
def build_with_id(build_hub, default_build, tmp_path_factory):
    """``build_with_id("abc")`` -> path of a build with id ``abc`` (made once per session)."""
    cache: dict[str, Path] = {}
    api = default_build[1]["api"]

    def make(unique_id: str) -> Path:
        if unique_id not in cache:
            out = tmp_path_factory.mktemp(f"hub-{unique_id}") / "build"
            build_hub.build(out, unique_id=unique_id, api=api)
            cache[unique_id] = out
        return cache[unique_id]

    return make


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """An isolated, offline Hugging Face environment (HF_HOME in tmp, no token, no network)."""
    import huggingface_hub.constants as hf_constants
    import kernels.hf_hub
    import kernels.resolver

    hf_home = tmp_path / "hf_home"
    (hf_home / "hub").mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("HF_TOKEN", "KERNELS_CACHE", "LOCAL_KERNELS", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    # These are read when huggingface_hub / kernels are imported; set them as a fresh
    # interpreter started with the variables above would have them.
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(kernels.resolver, "CACHE_DIR", None)
    monkeypatch.setattr(kernels.hf_hub, "CACHE_DIR", None)
    return hf_home

"""Shared test fixtures: a seeded RNG per test, the CPU-backend switch, and a check that no
test module leaves attention functions registered in transformers."""

from __future__ import annotations

import sys
import zlib

import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded(request):
    # A different but reproducible seed per test: fresh random data, never the same tensor
    # twice. crc32, not hash(): str hashes are salted per process.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield


def _our_attention_functions() -> set[tuple[int, str]]:
    """(registry, name) of every function of this package (a module of ``nki_kernels`` or of
    a loaded build of it) in transformers' attention registries, if transformers is loaded."""
    if "transformers" not in sys.modules:
        return set()
    from tests._helpers import attention_registries
    return {(i, name) for i, table in enumerate(attention_registries()) for name, fn in table.items()
            if "nki_kernels" in (getattr(fn, "__module__", "") or "")}


@pytest.fixture(autouse=True, scope="module")
def _no_attention_functions_left_registered():
    """A test module adds none of this package's functions to transformers' process-wide
    attention registries for good (register inside ``restored_attention_registries`` or
    tests/_helpers.py ``attention_registries_restored``): the suite runs its files in any
    order on several processes, and a name one file registers would otherwise decide whether
    another file's test passes."""
    registered = _our_attention_functions()
    yield
    added = sorted(name for _, name in _our_attention_functions() - registered)
    assert not added, f"this test module left {added} in transformers' attention registries"


@pytest.fixture
def restored_attention_registries():
    """What this test registers in transformers' attention registries is gone after it."""
    from tests._helpers import attention_registries_restored
    with attention_registries_restored():
        yield


@pytest.fixture
def simulator_backend(monkeypatch):
    """Run ops' NKI kernels in the bundled simulator for this test (CPU tensors)."""
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "simulator")


@pytest.fixture
def reference_backend(monkeypatch):
    """Run ops' PyTorch references for this test (the CPU default)."""
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "reference")

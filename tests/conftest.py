"""Shared test fixtures: a seeded RNG per test, the CPU-backend switch, and a check that no
test module leaves attention functions registered in transformers."""

from __future__ import annotations

import zlib

import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded(request):
    # A different but reproducible seed per test: fresh random data, never the same tensor
    # twice. crc32, not hash(): str hashes are salted per process.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield


@pytest.fixture(autouse=True, scope="module")
def _no_attention_names_left_registered():
    """A test module leaves transformers' attention registries as it found them: it
    registers inside ``restored_attention_registries`` (or tests/_helpers.py
    ``attention_registries_restored``). The suite runs its files in any order on several
    processes, and a name one file leaves registered would otherwise decide whether another
    file's test passes. Imports transformers (once per process) so that the starting tables
    are known; names registered while a test module is imported are not seen."""
    from tests._helpers import attention_registries, attention_registries_restored

    before = {name: set(table) for name, table in attention_registries().items()}
    with attention_registries_restored():      # a leaking module's names go: the next starts clean
        yield
        added = {name: sorted(set(table) - before[name]) for name, table in attention_registries().items()}
    added = {name: names for name, names in added.items() if names}
    assert not added, (f"this test module left names in transformers' attention registries: {added} (register "
                       "inside the restored_attention_registries fixture or tests._helpers.attention_registries_restored)")


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

"""Shared test fixtures: a seeded RNG per test and the CPU-backend switch."""

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


@pytest.fixture
def simulator_backend(monkeypatch):
    """Run ops' NKI kernels in the bundled simulator for this test (CPU tensors)."""
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "simulator")


@pytest.fixture
def reference_backend(monkeypatch):
    """Run ops' PyTorch references for this test (the CPU default)."""
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "reference")

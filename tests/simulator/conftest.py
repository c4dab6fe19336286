"""Fixtures of the simulator tests: a fixed seed for every test, and the simulated modules."""

from __future__ import annotations

import zlib

import pytest
import torch

from nki_kernels import simulator


@pytest.fixture(autouse=True)
def _seed(request):
    # reproducible (crc32, not the salted hash()) and different per test: fresh data each test
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield


@pytest.fixture
def sim():
    """(nki, nl, nisa) of the simulator, with the simulator activated for the test."""
    with simulator.activated("trn2") as nki:
        yield nki, nki.language, nki.isa


@pytest.fixture
def mk(sim):
    """mk(values, dtype="float32", buffer="sbuf") -> a tile holding ``values`` (rounded to dtype)."""
    _, nl, _ = sim

    def make(values, dtype="float32", buffer="sbuf"):
        t = nl.ndarray(tuple(values.shape), dtype=dtype, buffer=getattr(nl, buffer))
        t.dtype.assign(t._data, values)
        return t

    return make


def last_instruction():
    """The most recent trace record of the activated simulator context."""
    return simulator.current_trace()[-1]


@pytest.fixture
def last():
    return last_instruction


def val(t):
    """A tile's values as a float32 torch tensor."""
    return t.values().to(torch.float32).clone()


@pytest.fixture
def v():
    return val

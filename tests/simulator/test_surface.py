"""The NKI 0.7 names beside nl/nisa: the small nki.* modules, AWS's harness entry point,
nc_version ordering, NKI class semantics and tile_size.psum_fmax."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import harness


def test_small_modules_resolve_inside_activated():
    with simulator.activated("trn2") as nki:
        import nki.compiler as ncc
        import nki.isa as nisa
        import nki.typing as nt
        from nki.isa.constants import dge_mode, matmul_perf_mode, oob_mode

        assert oob_mode is nisa.oob_mode and dge_mode is nisa.dge_mode
        assert matmul_perf_mode.double_row.value == "double_row"
        assert nki.dtype.bfloat16 is nki.language.bfloat16
        assert sys.modules["nki.dtype"] is sys.modules["nki.language.dtypes"]
        assert nt.tensor[[128, 512], nki.language.float32] is nt.tensor
        assert ncc.CompileConfig().address_rotation is ncc.AddressRotation.AUTO
        assert nisa.scalar_engine is nisa.engine.scalar  # not the engine module
        with pytest.raises(simulator.UnsupportedError, match="collectives between ranks"):
            nki.collectives.all_reduce([], [], nki.collectives.ReplicaGroup(), None)
    # restored on exit, like the other aliased names
    assert sys.modules.get("nki.isa.constants") is not simulator.nki_modules()["nki.isa.constants"]


def test_nc_version_orders_by_generation():
    with simulator.activated("trn2") as nki:
        nisa = nki.isa
        v = nisa.get_nc_version()
        assert v == nisa.nc_version.gen3 and v == 3
        assert nisa.nc_version.gen2 < v <= nisa.nc_version.gen3 < nisa.nc_version.gen4
        assert v >= 3 and not v > 3 and {v: 1}[nisa.nc_version.gen3] == 1
    with simulator.activated("trn3") as nki:
        assert nki.isa.get_nc_version() >= nki.isa.nc_version.gen4


def test_nki_classes_get_the_default_initializer():
    with simulator.activated("trn2") as nki:
        NKIObject = nki.language.NKIObject

        @dataclasses.dataclass
        class C(NKIObject):  # the language guide's example
            x: int
            y: bool = False

            def toggle(self):
                self.y = not self.y

        c = C(1)
        c.toggle()
        assert (c.x, c.y) == (1, True) and C().x is None

        class Plain(NKIObject):  # unannotated fields, no @dataclass
            a = None
            b = 3

            def __post_init__(self):
                self.sum = (self.a or 0) + self.b

        p = Plain(a=2)
        assert (p.a, p.b, p.sum) == (2, 3, 5) and Plain(4, 5).sum == 9
        with pytest.raises(TypeError, match="takes 2 positional arguments"):
            Plain(1, 2, 3)
        with pytest.raises(TypeError, match="Plain\\(\\) got multiple values for argument 'a'"):
            Plain(1, a=2)

        class Own(NKIObject):
            def __init__(self, q):
                self.q = q

        class Child(Own):
            pass

        assert Child(7).q == 7  # a user __init__ is inherited, as in Python

        @dataclasses.dataclass(frozen=True)
        class Frozen(NKIObject):
            k: int = 1

        assert Frozen(2).k == 2


def test_an_operator_selector_is_not_callable():
    # nl.average / nl.bypass / nl.prelu name an operation for an instruction's op= argument;
    # NKI 0.7 has no nl.average(x) function
    with simulator.activated("trn2") as nki:
        with pytest.raises(TypeError, match=r"nl.average is an operator selector only; it cannot be called"):
            nki.language.average(np.ones((2, 2), np.float32))


def test_psum_fmax_is_one_psum_bank():
    with simulator.activated("trn2") as nki:
        ts = nki.language.tile_size
        assert ts.psum_fmax == ts.psum_bank_fmax == ts.gemm_moving_fmax == 512


def _add_one(x):
    import nki.language as nl

    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    nl.store(out, nl.add(t, 1.0))
    return out


def test_install_aws_harness_and_cpu_simulate(monkeypatch):
    saved = {k: v for k, v in sys.modules.items()
             if k == "nki" or k.startswith(("nki.", "nki_cpu_simulator", "neuronxcc"))}
    try:
        simulator.install_aws_harness()
        import nki_cpu_simulator.nki.language.dtypes as sim_dtypes
        import neuronxcc.nki.typing as nt
        import nki

        assert nki.__simulator__ and sim_dtypes.float32 == "float32"
        assert nt.mutable_tensor is sys.modules["nki.typing"].mutable_tensor
        x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
        monkeypatch.setenv("NKI_NC_VERSION", "gen4")
        out = nki.cpu_simulate(nki.jit(_add_one))[2](x=x)
        assert isinstance(out, np.ndarray) and np.array_equal(out, x + 1)
        last = harness.last_result()
        assert last.target == "trn3" and {i.attrs.get("core") for i in last.trace} == {0, 1}
        monkeypatch.setenv("NKI_NC_VERSION", "gen9")
        with pytest.raises(ValueError, match="NKI_NC_VERSION='gen9'"):
            nki.cpu_simulate(_add_one)[1](x=x)
    finally:
        for k in [k for k in sys.modules if k == "nki" or k.startswith(
                ("nki.", "nki_cpu_simulator", "neuronxcc"))]:
            del sys.modules[k]
        sys.modules.update(saved)


def test_jit_accepts_the_07_config_objects():
    with simulator.activated("trn2") as nki:
        k = nki.jit(_add_one, compile_config=nki.compiler.CompileConfig(prefetch_auto=True),
                    specialization_config=nki.compiler.SpecializationConfig())
        x = torch.randn(2, 3)
        assert torch.equal(k(x), x + 1)

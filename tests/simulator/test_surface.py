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


def test_every_documented_collective_exists_and_is_refused():
    # the functions of the nki.collectives reference (AWS Neuron docs, nki.collectives)
    documented = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v",
                  "collective_permute", "collective_permute_implicit",
                  "collective_permute_implicit_reduce",
                  "collective_permute_implicit_current_processing_rank_id", "rank_id")
    with simulator.activated("trn2") as nki:
        import nki.collectives as cc

        for name in documented:
            assert name in cc.__all__
            with pytest.raises(simulator.UnsupportedError, match=rf"nki.collectives.{name}: collectives "
                                                                 "between ranks are not simulated"):
                getattr(nki.collectives, name)()


def test_nki_isa_and_nki_language_are_packages():
    # nki.isa.constants and nki.language.dtypes are submodules: their parents are packages,
    # so a missing submodule is "No module named ...", not "... is not a package"
    import importlib

    with simulator.activated("trn2"):
        for parent in ("nki", "nki.isa", "nki.language"):
            with pytest.raises(ModuleNotFoundError, match=rf"^No module named '{parent}.nope'$"):
                importlib.import_module(f"{parent}.nope")


def _harness_names():
    return {k: v for k, v in sys.modules.items()
            if k == "nki" or k.startswith(("nki.", "nki_cpu_simulator", "neuronxcc"))}


def _restore_harness_names(saved):
    for k in list(_harness_names()):
        del sys.modules[k]
    sys.modules.update(saved)


def test_install_aws_harness_replaces_a_stranger_and_leaves_what_it_must():
    import types

    saved = _harness_names()
    sim = simulator.nki_modules()
    try:
        for k in list(_harness_names()):
            del sys.modules[k]
        stranger = types.ModuleType("nki_cpu_simulator")   # a stale package of that name
        own_nki = types.ModuleType("nki")
        real = types.ModuleType("neuronxcc")               # an installed neuronxcc
        real.__file__ = "/site-packages/neuronxcc/__init__.py"
        sys.modules.update({"nki_cpu_simulator": stranger, "nki": own_nki, "neuronxcc": real})
        simulator.install_aws_harness(alias_nki=False)
        pkg = sys.modules["nki_cpu_simulator"]
        assert pkg is not stranger and pkg.__simulator__ and pkg.nki is sim["nki"]
        assert sys.modules["nki_cpu_simulator.nki.isa"] is sim["nki.isa"]
        assert sys.modules["nki"] is own_nki and "nki.isa" not in sys.modules   # not aliased
        simulator.install_aws_harness()
        assert sys.modules["nki"] is sim["nki"]
        assert sys.modules["neuronxcc"] is real and not hasattr(real, "nki")  # never shadowed
        assert "neuronxcc.nki.typing" not in sys.modules
    finally:
        _restore_harness_names(saved)


def test_compile_config_defaults_are_the_documented_ones():
    # nki.compiler.CompileConfig reference: nki_alloc_fallback "On by default", prefetch_auto
    # "Off by default", address rotation AUTO
    with simulator.activated("trn2") as nki:
        cfg = nki.compiler.CompileConfig()
        assert cfg.nki_alloc_fallback is True and cfg.prefetch_auto is False
        assert cfg.address_rotation is nki.compiler.AddressRotation.AUTO


def test_nki_isa_constants_holds_every_isa_enum():
    import enum

    with simulator.activated("trn2") as nki:
        import nki.isa.constants as constants

        enums = [n for n in nki.isa.__all__
                 if isinstance(getattr(nki.isa, n), type) and issubclass(getattr(nki.isa, n), enum.Enum)]
        assert {"oob_mode", "dge_mode", "dma_engine"} <= set(enums)
        for name in enums:
            assert getattr(constants, name) is getattr(nki.isa, name)


@pytest.mark.parametrize("var, value, target", [
    ("NKI_NC_VERSION", "gen2", "trn1"), ("NKI_NC_VERSION", "Gen3", "trn2"),
    ("NEURON_PLATFORM_TARGET_OVERRIDE", "inf2", "trn1"), ("NEURON_PLATFORM_TARGET_OVERRIDE", "TRN3", "trn3"),
])
def test_cpu_simulate_takes_the_target_from_the_environment(monkeypatch, var, value, target):
    # nki.jit docs: NEURON_PLATFORM_TARGET_OVERRIDE "trn1|inf2|gen2", "trn2|gen3", "trn3|gen4"
    for name in ("NKI_NC_VERSION", "NEURON_PLATFORM_TARGET_OVERRIDE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(var, value)
    x = np.random.default_rng().standard_normal((4, 8)).astype(np.float32)
    with simulator.activated("trn2"):
        out = harness.cpu_simulate(_add_one)[1](x=x)
    assert np.array_equal(out, x + 1) and harness.last_result().target == target


def test_cpu_simulate_takes_the_degree_of_a_bracketed_kernel():
    x = np.random.default_rng().standard_normal((4, 8)).astype(np.float32)
    with simulator.activated("trn2") as nki:
        assert np.array_equal(harness.cpu_simulate(nki.jit(_add_one)[2])(x=x), x + 1)
        assert {i.attrs.get("core") for i in harness.last_result().trace} == {0, 1}
        assert np.array_equal(harness.cpu_simulate(nki.jit(_add_one)[2])[1](x=x), x + 1)
        assert {i.attrs.get("core") for i in harness.last_result().trace} == {None}
        for bad in (0, 4):
            with pytest.raises(simulator.NkiValidationError, match=rf"cpu_simulate\(kernel\)\[{bad}\]: "
                                                                  "the logical-core degree must be 1 or 2"):
                harness.cpu_simulate(_add_one)[bad]


def _groups_in_kernel(x):
    # a kernel builds its replica group from the partition op (the v2.33 API) and passes it on
    import nki.collectives as cc
    import nki.language as nl

    group = cc.ReplicaGroup.from_partition_op(8, cc.rg_partition_op.mod, 2)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    nl.store(out, t if len(group.replica_groups) == 2 else t + 1)
    return out


@pytest.mark.parametrize("op, operand, groups", [
    # the v2.33 nki.collectives.ReplicaGroup page's three examples over 8 ranks
    ("bitwise_and", 0, [[0, 1, 2, 3, 4, 5, 6, 7]]),
    ("div", 4, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("mod", 4, [[0, 4], [1, 5], [2, 6], [3, 7]]),
    # rank & 2 in {0, 2}: ranks 0, 1, 4, 5 and 2, 3, 6, 7; rank // 3: three lists, the last short
    ("bitwise_and", 2, [[0, 1, 4, 5], [2, 3, 6, 7]]),
    ("div", 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
])
def test_replica_group_from_partition_op(op, operand, groups):
    with simulator.activated("trn2") as nki:
        import nki.collectives as cc

        group = cc.ReplicaGroup.from_partition_op(8, getattr(cc.rg_partition_op, op), operand)
        assert group.replica_groups == groups
        assert sorted(r for g in group.replica_groups for r in g) == list(range(8))
        x = torch.randn(4, 6)
        assert torch.equal(nki.jit(_groups_in_kernel)(x), x)


@pytest.mark.parametrize("args, match", [
    ((0, "div", 4), r"world_size=0 must be an integer >= 1"),
    ((8, "div", 0), r"operand=0 must be an integer >= 1"),
    ((8, "mod", -1), r"operand=-1 must be an integer >= 1"),
    ((8, "bitwise_and", -1), r"operand=-1 must be an integer >= 0"),
    ((8.0, "div", 4), r"world_size=8.0 must be an integer >= 1"),
    ((8, "div", True), r"operand=True must be an integer >= 1"),
    ((8, "div_str", 4), r"op='div' must be an rg_partition_op \(rg_partition_op.bitwise_and, "
                        r"rg_partition_op.div, rg_partition_op.mod\)"),
])
def test_replica_group_from_partition_op_refuses_bad_arguments(args, match):
    with simulator.activated("trn2"):
        import nki.collectives as cc

        world_size, op, operand = args
        op = "div" if op == "div_str" else getattr(cc.rg_partition_op, op)
        with pytest.raises(ValueError, match=match):
            cc.ReplicaGroup.from_partition_op(world_size, op, operand)

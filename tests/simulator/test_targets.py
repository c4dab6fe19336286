"""The rules read their limits from the active target (hardware.py): per-generation ISA
limits differ where AWS's docs say so, and a custom Target changes what the rules check."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import NkiValidationError
from nki_kernels.simulator.hardware import TARGETS


@pytest.fixture
def on():
    """on(target) -> (nl, nisa, make) with the simulator activated for ``target``."""
    stack = []

    def enter(target):
        cm = simulator.activated(params=simulator.SimParams(target=target))
        nki = cm.__enter__()
        stack.append(cm)
        nl, nisa = nki.language, nki.isa

        def make(shape, dtype="float32", buffer="sbuf"):
            t = nl.ndarray(shape, dtype=dtype, buffer=getattr(nl, buffer))
            t.dtype.assign(t._data, torch.randn(shape))
            return t

        return nl, nisa, make

    yield enter
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


def _matmul(nl, nisa, make, n, dst_dtype="float32", dtype="bfloat16"):
    dst = nl.ndarray((64, n), dtype=dst_dtype, buffer=nl.psum)
    nisa.nc_matmul(dst, make((32, 64), dtype), make((32, n), dtype))
    return dst


def test_matmul_moving_free_size_per_generation(on):
    nl, nisa, make = on("trn2")
    _matmul(nl, nisa, make, 512)
    with pytest.raises(NkiValidationError, match="moving free size 513 exceeds maximum 512"):
        _matmul(nl, nisa, make, 513)
    with pytest.raises(NkiValidationError, match="dst dtype must be float32, got bfloat16"):
        _matmul(nl, nisa, make, 64, dst_dtype="bfloat16")
    with pytest.raises(NkiValidationError, match="moving free size 4096 exceeds maximum 512"):
        _matmul(nl, nisa, make, 4096)
    # v4: the moving tile may fill all 8 PSUM banks (4096 fp32 / 8192 bf16 elements; one
    # more does not fit PSUM, so the capacity check refuses it first), and dst may be bf16
    nl, nisa, make = on("trn3")
    _matmul(nl, nisa, make, 4096)
    _matmul(nl, nisa, make, 8192, dst_dtype="bfloat16")


def test_matmul_dtypes_tiles_and_modes_per_generation(on):
    nl, nisa, make = on("trn2")
    with pytest.raises(NkiValidationError, match="stationary dtype float8_e4m3fn is not supported"):
        _matmul(nl, nisa, make, 64, dtype="float8_e4m3fn")
    nl3, nisa3, make3 = on("trn3")
    _matmul(nl3, nisa3, make3, 64, dtype="float8_e4m3fn")
    nl1, nisa1, make1 = on("trn1")
    dst = nl1.ndarray((32, 64), dtype=nl1.float32, buffer=nl1.psum)
    with pytest.raises(NkiValidationError, match=r"must use sizes from \(64, 128\)"):
        nisa1.nc_matmul(dst, make1((32, 32)), make1((32, 64)), tile_position=(0, 0), tile_size=(32, 128))
    with pytest.raises(NkiValidationError, match=r"double_row needs NeuronCore-v3 \(trn2\) or newer"):
        nisa1.nc_matmul(dst, make1((32, 2, 32), "float8_e4m3"), make1((32, 2, 64), "float8_e4m3"),
                        perf_mode=nisa1.matmul_perf_mode.double_row)


def test_accumulate_onto_a_memset_is_refused_before_v4(on):
    for target, allowed in (("trn2", False), ("trn3", True)):
        nl, nisa, make = on(target)
        dst = nl.ndarray((64, 16), dtype=nl.float32, buffer=nl.psum)
        nisa.memset(dst, 0.0)
        st, mv = make((32, 64)), make((32, 16))
        if allowed:
            nisa.nc_matmul(dst, st, mv, accumulate=True)
        else:
            with pytest.raises(NkiValidationError, match="no previous matmul initialized"):
                nisa.nc_matmul(dst, st, mv, accumulate=True)


def _indirect_transpose(nl, nisa, make):
    """The v2.33 dma_transpose docstring's gather-transpose: 128 rows of a bf16 table."""
    table = make((256, 64), "bfloat16", "hbm")
    idx = nl.ndarray((128, 1), dtype=nl.uint32, buffer=nl.sbuf)
    idx.dtype.assign(idx._data, torch.randperm(256)[:128].reshape(128, 1))
    view = table.ap(pattern=[[64, 128], [1, 64]], vector_offset=idx, indirect_dim=0)
    nisa.dma_transpose(nl.ndarray((64, 128), dtype=nl.bfloat16, buffer=nl.sbuf), view, axes=(1, 0))


def _mx_operands(nl, make):
    """nc_matmul_mx's operands at the smallest legal shape (fp8 x4 data, uint8 scales)."""
    a = nl.ndarray((32, 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    b = nl.ndarray((32, 8), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    return (nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.psum), a, b,
            nl.ndarray((32, 4), dtype=nl.uint8, buffer=nl.sbuf), nl.ndarray((32, 8), dtype=nl.uint8, buffer=nl.sbuf))


# Every rule that an instruction, option or operator exists only from some NeuronCore
# version on (each from its v2.33 API page): (instruction, version, what is gated, the
# call). The refusal is one message everywhere (isa/operands.py generation_refusal).
GENERATION_GATES = [
    ("tensor_copy", 3, "engine=scalar",
     lambda nl, nisa, make: nisa.tensor_copy(make((8, 4)), make((8, 4)), engine=nisa.engine.scalar)),
    ("activation", 3, "a scalar bias",
     lambda nl, nisa, make: nisa.activation(make((8, 4)), nl.exp, make((8, 4)), bias=1.0)),
    ("range_select", 3, "",
     lambda nl, nisa, make: nisa.range_select(make((8, 4)), make((8, 4)), nl.greater_equal, nl.less,
                                              make((8, 1)), make((8, 1)))),
    ("sendrecv", 3, "",
     lambda nl, nisa, make: nisa.sendrecv(make((8, 4)), make((8, 4)), send_to_rank=0, recv_from_rank=0,
                                          pipe_id=0)),
    ("core_barrier", 3, "",
     lambda nl, nisa, make: nisa.core_barrier(nl.ndarray((8, 4), dtype=nl.float32, buffer=nl.shared_hbm),
                                              (0, 1))),
    ("nonzero_with_count", 3, "",
     lambda nl, nisa, make: nisa.nonzero_with_count(make((128, 9)), make((128, 8)))),
    ("dma_transpose", 3, "an indirect transpose", _indirect_transpose),
    ("dma_copy", 3, "dge_mode=hwdge",
     lambda nl, nisa, make: nisa.dma_copy(make((8, 16), buffer="hbm"), make((8, 16)),
                                          dge_mode=nisa.dge_mode.hwdge)),
    ("nc_matmul", 3, "perf_mode double_row",
     lambda nl, nisa, make: nisa.nc_matmul(nl.ndarray((32, 64), dtype=nl.float32, buffer=nl.psum),
                                           make((32, 2, 32), "float8_e4m3"), make((32, 2, 64), "float8_e4m3"),
                                           perf_mode=nisa.matmul_perf_mode.double_row)),
    ("dma_copy", 4, "priority=2",
     lambda nl, nisa, make: nisa.dma_copy(make((8, 16), buffer="hbm"), make((8, 16)), priority=2)),
    ("activation", 4, "engine=gpsimd",
     lambda nl, nisa, make: nisa.activation(make((8, 4)), nl.exp, make((8, 4)), engine=nisa.engine.gpsimd)),
    ("exponential", 4, "",
     lambda nl, nisa, make: nisa.exponential(make((8, 4)), make((8, 4)))),
    ("quantize_mx", 4, "",
     lambda nl, nisa, make: nisa.quantize_mx(None, None, None)),
    ("nc_matmul_mx", 4, "",
     lambda nl, nisa, make: nisa.nc_matmul_mx(*_mx_operands(nl, make))),
    ("tensor_tensor", 4, "op: nl.abs_max",
     lambda nl, nisa, make: nisa.tensor_tensor(make((8, 4)), make((8, 4)), make((8, 4)), op=nl.abs_max)),
    ("tensor_scalar", 4, "op0: nl.abs_min",
     lambda nl, nisa, make: nisa.tensor_scalar(make((8, 4)), make((8, 4)), op0=nl.abs_min, operand0=0.5)),
]

FAMILY = {3: "trn2", 4: "trn3"}


@pytest.mark.parametrize("instr,version,feature,call", GENERATION_GATES,
                         ids=[f"{i}-v{v}-{f or 'instruction'}" for i, v, f, _ in GENERATION_GATES])
def test_every_generation_gate_names_the_instruction_the_version_and_the_target(on, instr, version,
                                                                                 feature, call):
    older = {3: "trn1", 4: "trn2"}[version]
    nl, nisa, make = on(older)
    gated = f"{re.escape(feature)} needs" if feature else "needs"
    with pytest.raises(NkiValidationError,
                       match=rf"^{instr}: {gated} NeuronCore-v{version} \({FAMILY[version]}\) or newer"
                             rf".*; the target is {older}"):
        call(nl, nisa, make)
    # on the generation that has it, the gate is not what stops the call (some calls above
    # stop later, at an operand rule of the instruction's own, which is not this test's)
    nl, nisa, make = on(FAMILY[version])
    try:
        call(nl, nisa, make)
    except NkiValidationError as err:
        assert "needs NeuronCore" not in str(err), err


def test_v2_reports_its_version(on):
    nl, nisa, make = on("trn1")
    assert nisa.get_nc_version() is nisa.nc_version.gen2


def test_a_custom_target_changes_the_rules(on):
    small = dataclasses.replace(TARGETS["trn2"], name="small", bn_stats_fmax=256,
                                transpose_vector_max=16, max8_max_elems=100)
    nl, nisa, make = on(small)
    assert nl.tile_size.bn_stats_fmax == 256
    nisa.bn_stats(make((8, 6)), make((8, 256)))
    with pytest.raises(NkiValidationError, match="257 elements per partition, exceeds maximum 256"):
        nisa.bn_stats(make((8, 6)), make((8, 257)))
    with pytest.raises(NkiValidationError, match=r"exceeds maximum \[16, 16\] on the vector engine"):
        nisa.nc_transpose(make((20, 8)), make((8, 20)), engine=nisa.engine.vector)
    with pytest.raises(NkiValidationError, match="between 8 and 100 are allowed"):
        nisa.max8(make((8, 8)), make((8, 101)))
    # nl.var splits its bn_stats by the target's limit
    x = torch.randn(8, 600)
    t = make((8, 600))
    t.dtype.assign(t._data, x)
    n = len(simulator.current_trace())
    torch.testing.assert_close(nl.var(t, axis=1).values(), x.var(1, unbiased=False, keepdim=True),
                               atol=1e-5, rtol=1e-5)
    assert [i.op for i in simulator.current_trace()[n:]].count("bn_stats") == 3  # ceil(600 / 256)


def test_tile_size_follows_the_target(on):
    for target, sbuf in (("trn1", 192), ("trn2", 224), ("trn3", 256)):
        nl, _, _ = on(target)
        ts = nl.tile_size
        assert (ts.pmax, ts.psum_bank_fmax, ts.psum_bank_fmax_bytes, ts.gemm_stationary_fmax,
                ts.gemm_moving_fmax, ts.psum_num_banks, ts.psum_fmax) == (128, 512, 2048, 128, 512, 8, 512)
        assert ts.sbuf_fmax_bytes == sbuf * 1024 and ts.sbuf_size_bytes == 128 * sbuf * 1024

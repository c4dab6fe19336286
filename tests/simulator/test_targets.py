"""The rules read their limits from the active target (hardware.py): per-generation ISA
limits differ where AWS's docs say so, and a custom Target changes what the rules check."""

from __future__ import annotations

import dataclasses

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
    with pytest.raises(NkiValidationError, match="double_row needs NeuronCore-v3 or newer"):
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


def test_v2_feature_flags(on):
    nl, nisa, make = on("trn1")
    with pytest.raises(NkiValidationError, match="Scalar engine cannot copy on NeuronCore-v2"):
        nisa.tensor_copy(make((8, 4)), make((8, 4)), engine=nisa.engine.scalar)
    with pytest.raises(NkiValidationError, match="scalar bias needs v3"):
        nisa.activation(make((8, 4)), nl.exp, make((8, 4)), bias=1.0)
    with pytest.raises(NkiValidationError, match="range_select: needs NeuronCore-v3 or newer"):
        nisa.range_select(make((8, 4)), make((8, 4)), nl.greater_equal, nl.less, 0.0, 2.0)
    # "Available only on NeuronCore-v3 or newer" (nki.isa.sendrecv, nki.isa.core_barrier)
    with pytest.raises(NkiValidationError, match="sendrecv: needs NeuronCore-v3 or newer; the target is trn1"):
        nisa.sendrecv(make((8, 4)), make((8, 4)), send_to_rank=0, recv_from_rank=0, pipe_id=0)
    with pytest.raises(NkiValidationError, match="core_barrier: needs NeuronCore-v3 or newer; the target is trn1"):
        nisa.core_barrier(nl.ndarray((8, 4), dtype=nl.float32, buffer=nl.shared_hbm), (0, 1))
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

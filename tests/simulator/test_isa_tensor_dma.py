"""TensorE (nc_matmul, nc_transpose) and DMA instructions: math, precision, accumulation
semantics and rules in both directions."""

from __future__ import annotations

import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import NkiValidationError

# Matmul sizes: exact tile limits next to deliberately odd ones.
SIZES = [(128, 128, 512), (7, 83, 129), (64, 1, 1), (100, 72, 257)]


@pytest.mark.parametrize("K, M, N", SIZES)
def test_nc_matmul_bf16_operands_fp32_accumulation(sim, mk, v, last, K, M, N):
    _, nl, nisa = sim
    a, b = torch.randn(K, M), torch.randn(K, N)
    dst = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=dst, stationary=mk(a, "bfloat16"), moving=mk(b, "bfloat16"))
    ab, bb = a.bfloat16().double(), b.bfloat16().double()
    ref = (ab.T @ bb).float()  # bf16 values, products exact, fp32 accumulation
    torch.testing.assert_close(v(dst), ref, atol=1e-4 * K ** 0.5, rtol=1e-5)
    # and NOT a bf16 accumulation: the result is not bf16-representable in general
    if K > 1 and M * N > 100:
        assert not torch.equal(v(dst), v(dst).bfloat16().float())
    ins = last()
    assert (ins.op, ins.engine, ins.flops) == ("nc_matmul", "tensor", 2 * K * M * N)
    assert (ins.attrs["K"], ins.attrs["M"], ins.attrs["N"], ins.attrs["fp32"]) == (K, M, N, False)


def test_nc_matmul_accumulate_semantics(sim, mk, v, last):
    _, nl, nisa = sim
    a1, b1, a2, b2 = (torch.randn(64, 32), torch.randn(64, 100), torch.randn(64, 32),
                      torch.randn(64, 100))
    p1, p2 = a1.T @ b1, a2.T @ b2
    dst = nl.ndarray((32, 100), dtype=nl.float32, buffer=nl.psum)
    # None: first write overwrites (the NaN poison disappears), second adds
    nisa.nc_matmul(dst, mk(a1), mk(b1))
    torch.testing.assert_close(v(dst), p1)
    assert last().attrs["accumulate"] == "auto"
    nisa.nc_matmul(dst, mk(a2), mk(b2))
    torch.testing.assert_close(v(dst), p1 + p2, atol=1e-4, rtol=1e-5)
    # False overwrites, True adds
    nisa.nc_matmul(dst, mk(a2), mk(b2), accumulate=False)
    torch.testing.assert_close(v(dst), p2)
    nisa.nc_matmul(dst, mk(a1), mk(b1), accumulate=True)
    torch.testing.assert_close(v(dst), p1 + p2, atol=1e-4, rtol=1e-5)
    # a non-matmul write closes the accumulation group: the next None overwrites
    nisa.memset(dst, 0.0)
    nisa.nc_matmul(dst, mk(a1), mk(b1))
    torch.testing.assert_close(v(dst), p1)


def test_nc_matmul_accumulate_true_on_uninitialized_psum_is_flagged(sim, mk):
    _, nl, nisa = sim
    dst = nl.ndarray((32, 100), dtype=nl.float32, buffer=nl.psum)
    with pytest.raises(NkiValidationError, match="accumulate=True"):
        nisa.nc_matmul(dst, mk(torch.randn(64, 32)), mk(torch.randn(64, 100)), accumulate=True)


def test_nc_matmul_accumulates_per_location(sim, mk, v):
    _, nl, nisa = sim
    dst = nl.ndarray((32, 1024), dtype=nl.float32, buffer=nl.psum)
    a, b = torch.randn(16, 32), torch.randn(16, 512)
    nisa.nc_matmul(dst[:, 0:512], mk(a), mk(b))
    nisa.nc_matmul(dst[:, 512:1024], mk(a), mk(b))  # a different location: overwrites
    torch.testing.assert_close(v(dst)[:, 512:], a.T @ b)


def test_nc_matmul_fp32_pairs_and_flag(sim, mk, v, last):
    _, nl, nisa = sim
    a, b = torch.randn(32, 16), torch.randn(32, 64)
    dst = nl.ndarray((16, 64), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst, mk(a, "float32"), mk(b, "tfloat32"))
    assert last().attrs["fp32"] is True
    with pytest.raises(NkiValidationError, match="float32/tfloat32 operand pairs only"):
        nisa.nc_matmul(dst, mk(a, "float32"), mk(b, "bfloat16"))


@pytest.mark.parametrize("shapes, msg", [
    (((64, 129), (64, 64), (128, 64)), "stationary free size 129 exceeds maximum 128"),
    (((64, 16), (64, 513), (16, 513)), "moving free size 513 exceeds maximum 512"),
    (((64, 16), (32, 64), (16, 64)), "moving partition dim 32 must equal"),
    (((64, 16), (64, 64), (16, 32)), "elements per partition"),
    (((129, 16), (64, 64), (16, 64)), "partition dim 129 exceeds maximum 128"),
])
def test_nc_matmul_size_rules(sim, mk, shapes, msg):
    _, nl, nisa = sim
    st, mv, d = shapes
    with pytest.raises(NkiValidationError, match=msg):
        nisa.nc_matmul(nl.ndarray(d, dtype=nl.float32, buffer=nl.psum), mk(torch.randn(st), "bfloat16"),
                       mk(torch.randn(mv), "bfloat16"))


def test_nc_matmul_row_tiling_limits_the_contraction(sim, mk):
    _, nl, nisa = sim
    a, b = mk(torch.randn(128, 16), "bfloat16"), mk(torch.randn(128, 64), "bfloat16")
    dst = nl.ndarray((16, 64), dtype=nl.float32, buffer=nl.psum)
    with pytest.raises(NkiValidationError, match="stationary partition dim 128 exceeds maximum 64"):
        nisa.nc_matmul(dst, a, b, tile_position=(0, 0), tile_size=(64, 128))
    nisa.nc_matmul(dst, a[0:64], b[0:64], tile_position=(64, 0), tile_size=(64, 128))


def test_nc_matmul_memory_rules(sim, mk):
    _, nl, nisa = sim
    a, b = mk(torch.randn(64, 16), "bfloat16"), mk(torch.randn(64, 32), "bfloat16")
    with pytest.raises(NkiValidationError, match="dst must be in PSUM"):
        nisa.nc_matmul(nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.sbuf), a, b)
    with pytest.raises(NkiValidationError, match="stationary must be in SBUF"):
        nisa.nc_matmul(nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.psum),
                       mk(torch.randn(64, 16), buffer="psum"), b)
    with pytest.raises(NkiValidationError, match="dst dtype must be float32"):
        nisa.nc_matmul(nl.ndarray((16, 32), dtype=nl.bfloat16, buffer=nl.psum), a, b)


def test_nc_matmul_is_transpose_is_bit_accurate(sim, mk, v):
    _, nl, nisa = sim
    x = torch.randn(64, 48)
    x[3, 5] = float("nan")
    ident = nl.shared_identity_matrix(64, dtype=nl.bfloat16)
    dst = nl.ndarray((48, 64), dtype=nl.bfloat16, buffer=nl.psum)
    nisa.nc_matmul(dst, mk(x, "bfloat16"), ident, is_transpose=True)
    assert torch.equal(v(dst).isnan(), x.T.isnan())  # the NaN is moved, not spread
    assert torch.equal(torch.nan_to_num(v(dst)), torch.nan_to_num(x.bfloat16().float().T))


def test_nc_transpose_engines(sim, mk, v, last):
    _, nl, nisa = sim
    x = torch.randn(128, 96)
    dst = nl.ndarray((96, 128), dtype=nl.bfloat16, buffer=nl.psum)
    nisa.nc_transpose(dst, mk(x, "bfloat16"))
    assert torch.equal(v(dst), x.bfloat16().float().T)
    assert last().engine == "tensor"
    small = nl.ndarray((20, 30), dtype=nl.float32, buffer=nl.sbuf)
    nisa.nc_transpose(small, mk(torch.randn(30, 20)), engine=nisa.engine.vector)
    assert last().engine == "vector"
    with pytest.raises(NkiValidationError, match="exceeds maximum \\[32, 32\\]"):
        nisa.nc_transpose(nl.ndarray((40, 30), dtype=nl.float32, buffer=nl.sbuf),
                          mk(torch.randn(30, 40)), engine=nisa.engine.vector)
    with pytest.raises(NkiValidationError, match="dst dtype"):
        nisa.nc_transpose(nl.ndarray((96, 128), dtype=nl.float32, buffer=nl.psum),
                          mk(x, "bfloat16"))


def test_dma_copy_casts_reshapes_and_records(sim, mk, v, last):
    _, nl, nisa = sim
    x = torch.randn(4, 128, 64)
    hbm = nl.ndarray((4, 128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    hbm.dtype.assign(hbm._data, x)
    sb = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=hbm[2])
    assert torch.equal(v(sb), x[2].bfloat16().float())
    ins = last()
    assert (ins.op, ins.engine, ins.flops) == ("dma_copy", "dma", 0)
    assert ins.attrs["direction"] == "hbm_to_sbuf" and ins.attrs["bytes"] == 128 * 64 * 2
    assert ins.reads[0].buffer == "hbm" and ins.writes[0].buffer == "sbuf"
    assert ins.reads[0].span == (2 * 128 * 64, 3 * 128 * 64)
    flat = nl.ndarray((128 * 64,), dtype=nl.float32, buffer=nl.hbm)
    nisa.dma_copy(flat, sb)  # element counts match: shapes may differ
    assert torch.equal(flat.values(), x[2].bfloat16().float().reshape(-1))
    assert last().attrs["direction"] == "sbuf_to_hbm"


def test_dma_copy_rules(sim, mk):
    _, nl, nisa = sim
    sb = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    with pytest.raises(NkiValidationError, match="src is in PSUM"):
        nisa.dma_copy(sb, mk(torch.randn(128, 64), buffer="psum"))
    with pytest.raises(NkiValidationError, match="8192 elements"):
        nisa.dma_copy(sb, nl.ndarray((128, 65), dtype=nl.float32, buffer=nl.hbm))


def test_trace_operands(sim, mk, last):
    _, nl, nisa = sim
    a = mk(torch.randn(64, 32), "bfloat16")
    dst = nl.ndarray((64, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst, nl.add, a.reshape((64, 16, 2)), axis=2)
    ins = last()
    r = ins.reads[0]
    assert (r.role, r.buffer, r.shape, r.dtype, r.partitions, r.free_elems, r.nbytes) == \
        ("data", "sbuf", (64, 16, 2), "bfloat16", 64, 32, 64 * 32 * 2)
    assert r.alloc_id == a._alloc.alloc_id
    assert ins.writes[0].role == "dst" and ins.index == len(simulator.current_trace()) - 1


def test_integer_to_integer_copies_go_through_fp32(sim, mk):
    # "first casting from src.dtype to float32, then from float32 to dst.dtype" (dma_copy),
    # "intermediate FP32 cast when input and output data types differ" (tensor_copy): round
    # to nearest even and saturate, never wrap
    _, nl, nisa = sim
    x = mk(torch.tensor([[300, -50, -1, 70000, 16777217, 5]], dtype=torch.int32), "int32")
    i8 = nl.ndarray((1, 6), dtype=nl.int8, buffer=nl.sbuf)
    nisa.tensor_copy(dst=i8, src=x)
    assert i8.values().tolist() == [[127, -50, -1, 127, 127, 5]]
    u8 = nl.ndarray((1, 6), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.dma_copy(dst=u8, src=x)
    assert u8.values().tolist() == [[255, 0, 0, 255, 255, 5]]
    u32 = nl.ndarray((1, 6), dtype=nl.uint32, buffer=nl.hbm)
    nisa.dma_copy(dst=u32, src=x)
    assert u32.values().tolist() == [[300, 0, 0, 70000, 16777216, 5]]   # 2**24 + 1 rounds in fp32


def test_a_tensore_output_must_fit_one_psum_bank(sim):
    # "each nc_matmul can only write to a single PSUM bank" (trainium_inferentia2_arch.rst):
    # a [128, 1024] fp32 PSUM tile holds two banks; a 512-column write from column 256
    # straddles them, one from column 512 does not
    nki, nl, nisa = sim
    a = nl.ndarray((64, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
    b = nl.ndarray((64, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.memset(a, 1.0)
    nisa.memset(b, 1.0)
    p = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(p[:, 512:1024], a, b)
    with pytest.raises(NkiValidationError, match=r"dst writes bytes \[1024, 3072\) of each PSUM partition, "
                                                 r"across banks 0 to 1; .*one PSUM bank \(2048 bytes"):
        nisa.nc_matmul(p[:, 256:768], a, b)
    # a placed tile: its bytes are counted from its address (banks 3 and 4 from byte 6144)
    q = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum, address=(0, 6144))
    nisa.nc_matmul(q[:, 512:1024], a, b)
    with pytest.raises(NkiValidationError, match=r"dst writes bytes \[7168, 9216\) of each PSUM partition, "
                                                 r"across banks 3 to 4"):
        nisa.nc_matmul(q[:, 256:768], a, b)
    # TensorE transposes are matmuls: a bf16 [128, 128] transpose at column 960 of a 2-bank
    # bf16 tile ends at byte 2176
    t = nl.ndarray((128, 2048), dtype=nl.bfloat16, buffer=nl.psum)
    src = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.memset(src, 2.0)
    nisa.nc_transpose(t[:, 1024:1152], src)
    with pytest.raises(NkiValidationError, match=r"nc_transpose: dst writes bytes \[1920, 2176\)"):
        nisa.nc_transpose(t[:, 960:1088], src)

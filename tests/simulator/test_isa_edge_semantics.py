"""Instruction semantics that a mutation-testing review (2026-12-06) found no simulator test
pinning: each of these changed one line of the simulator and every test in tests/simulator
still passed (five were caught only by the fuzz tier). Each test states the rule it pins and
where the rule comes from; the data is fresh per test (conftest's seed)."""

from __future__ import annotations

import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import SimParams
from nki_kernels.simulator.errors import RaceError


def f64(t):
    return t.values().to(torch.float64)


# ---------------------------------------------------------------- arithmetic and reductions

def test_int32_multiply_is_exact(sim, mk):
    # integer tensor_tensor add/subtract/multiply compute in integers (docs/simulator.md
    # "Casts"); through fp32, 4097 * 4097 = 16785409 would come back 16785408
    _, nl, nisa = sim
    a = torch.tensor([[4097, 12345, -5001]])
    dst = nl.ndarray((1, 3), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst, mk(a, "int32"), mk(a, "int32"), nl.multiply)
    assert dst.values().to(torch.int64).tolist() == (a * a).tolist()


def test_reduce_with_subtract_negates_the_sum(sim, mk):
    # the accumulator starts at 0 and takes acc - x for each element: -sum(x)
    _, nl, nisa = sim
    x = torch.randn(4, 8)
    dst = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst, nl.subtract, mk(x), axis=1)
    torch.testing.assert_close(f64(dst).reshape(-1), -x.double().sum(1), atol=1e-5, rtol=1e-6)


def test_maximum_and_max_reduce_propagate_nan(sim, mk):
    # nl.maximum is "Similar to numpy.maximum" (its docstring), which propagates NaN; a max
    # reduce over a row holding NaN is NaN (numpy's max)
    _, nl, nisa = sim
    a = torch.tensor([[1.0, float("nan"), 3.0]])
    b = torch.tensor([[2.0, 5.0, float("nan")]])
    dst = nl.ndarray((1, 3), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst, mk(a), mk(b), nl.maximum)
    got = dst.values()
    assert got[0, 0].item() == 2.0 and torch.isnan(got[0, 1:]).all()
    row_max = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(row_max, nl.maximum, mk(a), axis=1)
    assert torch.isnan(row_max.values()).all()


def test_partition_reduce_mean_divides_by_the_partition_count(sim, mk):
    _, nl, nisa = sim
    x = torch.randn(16, 8)
    dst = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_partition_reduce(dst, nl.mean, mk(x))
    torch.testing.assert_close(f64(dst).reshape(-1), x.double().mean(0), atol=1e-6, rtol=1e-6)


def test_copy_predicated_with_reverse_pred_copies_where_the_predicate_is_zero(sim, mk):
    _, nl, nisa = sim
    src = torch.randn(2, 4)
    pred = torch.tensor([[1, 0, 1, 0], [0, 0, 1, 1]])
    keep = torch.randn(2, 4)
    dst = mk(keep)
    nisa.tensor_copy_predicated(dst, mk(src), mk(pred, "uint8"), reverse_pred=True)
    assert torch.equal(dst.values(), torch.where(pred == 0, src, keep))


def test_tensor_tensor_scan_reverse0_swaps_the_first_operation(sim, mk):
    # reverse0: op0 takes (previous, data0[i]) instead of (data0[i], previous)
    _, nl, nisa = sim
    a, b = torch.randn(2, 5), torch.randn(2, 5)
    dst = nl.ndarray((2, 5), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor_scan(dst, mk(a), mk(b), 0.5, nl.subtract, nl.add, reverse0=True)
    prev, expected = torch.full((2,), 0.5, dtype=torch.float64), []
    for i in range(5):
        prev = (prev - a[:, i].double()) + b[:, i].double()
        expected.append(prev)
    torch.testing.assert_close(f64(dst), torch.stack(expected, 1), atol=1e-5, rtol=1e-6)


def test_iota_computes_in_int32_and_wraps(sim):
    # iota's values are int32 arithmetic before the cast to dst's dtype
    _, nl, nisa = sim
    dst = nl.ndarray((1, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst, [[1, 4]], offset=2**31 - 2)
    expected = torch.tensor([2**31 - 2, 2**31 - 1, -2**31, -2**31 + 1], dtype=torch.float32)
    assert torch.equal(dst.values().reshape(-1), expected)


# ---------------------------------------------------------------- rounding: once, to nearest even

def test_memset_stores_the_fp32_value(sim):
    _, nl, nisa = sim
    dst = nl.ndarray((2, 3), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst, 0.1)
    assert (dst.values() == torch.tensor(0.1, dtype=torch.float32)).all()


def test_fp32_to_fp16_rounds_to_nearest_even(sim, mk):
    _, nl, nisa = sim
    x = torch.tensor([[1 + 2**-11 + 2**-20, -(1 + 2**-11 + 2**-20), 1 + 3 * 2**-11, 1 + 2**-11]])
    dst = nl.ndarray((1, 4), dtype=nl.float16, buffer=nl.sbuf)
    nisa.tensor_copy(dst, mk(x))
    assert torch.equal(dst.values(), x.to(torch.float16))   # torch rounds to nearest even


def test_reduce_results_sum_the_fp32_values_not_the_rounded_outputs(sim, mk):
    # activation_reduce and scalar_tensor_tensor write a bf16 dst, but their reduce_res adds
    # the fp32 results (the rounding to dst is the output's alone)
    _, nl, nisa = sim
    x, y = torch.randn(4, 256), torch.randn(4, 256)
    out = nl.ndarray((4, 256), dtype=nl.bfloat16, buffer=nl.sbuf)
    sums = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(out, nl.exp, mk(x), nl.add, sums)
    # fp32 sums of 256 terms: <= 256 * 2**-24 relative (1.5e-5); bf16-rounded terms: ~4e-4
    torch.testing.assert_close(f64(sums).reshape(-1), x.double().exp().sum(1), atol=0, rtol=3e-5)
    nisa.scalar_tensor_tensor(dst=out, data=mk(x), op0=nl.multiply, operand0=1.5, op1=nl.add,
                              operand1=mk(y), reduce_op=nl.add, reduce_res=sums)
    torch.testing.assert_close(f64(sums).reshape(-1), (x.double() * 1.5 + y.double()).sum(1),
                               atol=1e-4, rtol=0)


def test_activation_scales_its_input_in_fp32(sim, mk):
    # func(data * scale + bias) with data * scale in fp32, not in data's bf16
    _, nl, nisa = sim
    x = torch.randn(4, 64).bfloat16()
    dst = nl.ndarray((4, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst, nl.exp, mk(x, "bfloat16"), scale=1.37, bias=None)
    torch.testing.assert_close(f64(dst), (x.double() * 1.37).exp(), atol=0, rtol=1e-5)


def test_dma_compute_sums_in_fp32_and_rounds_once(sim, mk):
    _, nl, nisa = sim
    xs = [torch.randn(8, 64) for _ in range(4)]
    dst = nl.ndarray((8, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_compute(dst, [mk(x) for x in xs], nl.add)
    expected = sum(x.double() for x in xs).float().bfloat16()
    assert torch.equal(dst.values(), expected)


# ---------------------------------------------------------------- TensorE, DMA, views

def test_matmul_without_accumulate_overwrites_a_tile_no_matmul_wrote(sim, mk):
    # accumulate=None accumulates only onto an earlier matmul's result in that tile; a PSUM
    # tile last written by memset is overwritten
    _, nl, nisa = sim
    a, b = torch.randn(8, 4), torch.randn(8, 6)
    dst = nl.ndarray((4, 6), dtype=nl.float32, buffer=nl.psum)
    nisa.memset(dst, 7.0)
    nisa.nc_matmul(dst, mk(a), mk(b))
    torch.testing.assert_close(f64(dst), a.double().t() @ b.double(), atol=1e-5, rtol=1e-5)


def test_matmul_without_accumulate_decides_per_psum_element(sim, mk):
    # docs/simulator.md "Matmul": with accumulate=None, per PSUM element, the first matmul
    # write overwrites and later matmul writes add; a matmul over a tile that an earlier
    # matmul wrote only in part adds on those columns and overwrites the rest
    _, nl, nisa = sim
    a, b1, b2 = torch.randn(8, 4), torch.randn(8, 3), torch.randn(8, 6)
    dst = nl.ndarray((4, 6), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst[:, 0:3], mk(a), mk(b1))
    nisa.nc_matmul(dst, mk(a), mk(b2))
    a64 = a.double().t()
    expected = a64 @ b2.double()
    expected[:, 0:3] += a64 @ b1.double()
    # fp32 products and sums of 8 terms of ~N(0, 1): well inside 1e-5
    torch.testing.assert_close(f64(dst), expected, atol=1e-5, rtol=1e-5)


def test_a_matmul_columns_bits_do_not_depend_on_the_moving_width(sim, mk):
    # TensorE makes each output column from its own moving column: the same column against
    # 7 moving columns or alone gives the same bits (torch's fp32 product, which blocks its
    # sums by the width, gave other bits here; a kernel splitting rows over two programs
    # then differed between LNC=1 and LNC=2), and each is the float64 sum rounded once
    _, nl, nisa = sim
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(128, 128, generator=g), torch.randn(128, 7, generator=g) * 1000
    wide = nl.ndarray((128, 7), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(wide, mk(a), mk(b))
    alone = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(alone, mk(a), mk(b[:, 0:1].contiguous()))
    assert torch.equal(wide.values()[:, 0:1], alone.values())
    assert torch.equal(wide.values(), (a.double().t() @ b.double()).float())


def test_dma_transpose_of_a_3d_tile_reverses_its_axes(sim, mk):
    _, nl, nisa = sim
    x = torch.randn(2, 3, 4)
    dst = nl.ndarray((4, 3, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_transpose(dst, mk(x, buffer="shared_hbm"))
    assert torch.equal(dst.values(), x.permute(2, 1, 0))


def test_an_access_pattern_one_past_the_partition_is_refused(sim, mk):
    # the last element of [[8, 2], [2, 4]] at offset 2 is free index 2 + 3 * 2 = 8 of an
    # 8-wide partition: one past it (it would read the next partition's first element)
    _, nl, nisa = sim
    t = mk(torch.randn(4, 8))
    dst = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.sbuf)
    with pytest.raises(IndexError):
        nisa.tensor_copy(dst, t.ap([[8, 2], [2, 4]], offset=2))
    nisa.tensor_copy(dst, t.ap([[8, 2], [2, 4]], offset=1))   # last element at 7: inside


def _gather_scatter_skip(a, rows, dst_rows):
    import nki.isa as nisa
    import nki.language as nl

    n, width = rows.shape[0], a.shape[1]
    src_idx = nl.ndarray((n, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=src_idx, src=rows)
    dst_idx = nl.ndarray((n, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=dst_idx, src=dst_rows)
    out = nl.ndarray((4, width), dtype=a.dtype, buffer=nl.shared_hbm)
    fill = nl.ndarray((4, width), dtype=a.dtype, buffer=nl.sbuf)
    nisa.memset(fill, -1.0)
    nisa.dma_copy(out, fill)
    nisa.dma_copy(dst=out.ap([[width, n], [1, width]], vector_offset=dst_idx, indirect_dim=0),
                  src=a.ap([[width, n], [1, width]], vector_offset=src_idx, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    return out


def test_oob_skip_with_indirect_source_and_destination_skips_a_bad_source_row():
    # oob_mode.skip drops a row whose source index is out of bounds even when the
    # destination is indirect too (its own index being in bounds)
    a = torch.randn(16, 8)
    out = simulator.run(_gather_scatter_skip, a, torch.tensor([[3], [16]], dtype=torch.int32),
                        torch.tensor([[0], [1]], dtype=torch.int32)).outputs
    assert torch.equal(out[0], a[3])
    assert (out[1:] == -1).all()


def _rewrite_then_read(x):
    import nki.isa as nisa
    import nki.language as nl

    me = nl.program_id(0)
    out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm, name="out")
    t = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(t, 0.0)
    nisa.dma_copy(out, t)
    nisa.core_barrier(out, (0, 1))
    if me == 1:
        nisa.dma_copy(out, t)          # writes 0 over 0: changes nothing
        for _ in range(3):
            nisa.dma_copy(t, t)
        nisa.dma_copy(t, out)          # reads 0 or core 0's 5, depending on the timing
    else:
        nisa.dma_copy(t, t)
        nisa.memset(t, 5.0)
        nisa.dma_copy(out, t)          # 5 ...
        nisa.memset(t, 0.0)
        nisa.dma_copy(out, t)          # ... then 0 again, with no barrier before core 1's read
    r = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm, name="r")
    nisa.dma_copy(r, t)
    return r


def test_a_core_rewriting_the_same_bits_does_not_excuse_its_later_read():
    # core 1's own write of 0 does not order it after core 0's unsynchronised 5-then-0: its
    # read of out can see either value, a read race
    with pytest.raises(RaceError):
        simulator.run(_rewrite_then_read, torch.randn(1, 1), params=SimParams(logical_cores=2))

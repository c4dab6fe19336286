"""nl helpers lower through the nisa instructions they stand for: their values, the
instructions they record, and the instruction rules they therefore obey."""

from __future__ import annotations

import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import NkiValidationError


def _issued(fn):
    """(result of fn(), ops of the instructions it recorded)."""
    n = len(simulator.current_trace())
    out = fn()
    return out, [(i.op, i.engine) for i in simulator.current_trace()[n:]]


def test_where_takes_a_float_condition_and_lowers_to_a_predicate_and_a_select(sim, mk, v):
    _, nl, nisa = sim
    x = torch.randn(96, 70)
    cond = (torch.rand(96, 70) > 0.5).float()
    cond[0, :5] = torch.tensor([0.25, -2.0, float("nan"), 0.0, 1.0])  # nonzero is true
    out, ops = _issued(lambda: nl.where(mk(cond), mk(x), -1.0))
    assert ops == [("tensor_scalar", "vector"), ("select_reduce", "vector")]
    assert torch.equal(v(out), torch.where(cond != 0, x, torch.tensor(-1.0)))
    # the instruction itself keeps its documented predicate dtypes
    with pytest.raises(NkiValidationError, match="predicate dtype must be int8, uint8, int16 or uint16"):
        nisa.select_reduce(mk(x), mk(cond), mk(x), 0.0)


def test_where_scalar_on_true_reverses_the_predicate(sim, mk, v):
    _, nl, _ = sim
    y = torch.randn(40, 9)
    cond = (torch.rand(40, 9) > 0.3).float()
    out, ops = _issued(lambda: nl.where(mk(cond), 2.5, mk(y, "bfloat16")))
    assert ops == [("tensor_scalar", "vector"), ("select_reduce", "vector")]
    assert out.dtype == nl.bfloat16
    assert torch.equal(v(out), torch.where(cond != 0, torch.tensor(2.5), y.bfloat16().float()))


def test_where_two_tiles_is_a_copy_and_a_predicated_copy(sim, mk, v):
    _, nl, _ = sim
    x, y = torch.randn(64, 33), torch.randn(64, 33)
    cond = (torch.rand(64, 33) > 0.5).float()
    out, ops = _issued(lambda: nl.where(mk(cond), mk(x, "bfloat16"), mk(y), dtype=nl.float32))
    assert [op for op, _ in ops] == ["tensor_scalar", "tensor_copy", "tensor_copy",
                                     "tensor_copy_predicated"]
    assert torch.equal(v(out), torch.where(cond != 0, x.bfloat16().float(), y))


def test_where_int32_tiles_and_two_scalars(sim, mk, v):
    _, nl, _ = sim
    cond = (torch.rand(16, 12) > 0.5).float()
    xi = torch.randint(-1000, 1000, (16, 12))
    # select_reduce does not take int32 on_true: the predicated copy does
    out, ops = _issued(lambda: nl.where(mk(cond), mk(xi, "int32"), 7))
    assert [op for op, _ in ops] == ["tensor_scalar", "memset", "tensor_copy_predicated"]
    assert torch.equal(v(out), torch.where(cond != 0, xi.float(), torch.tensor(7.0)))
    out = nl.where(mk(cond), 3.0, -4.0)
    assert out.dtype == nl.float32 and torch.equal(v(out), torch.where(cond != 0, 3.0, -4.0))


def test_where_shape_mismatch_is_the_instruction_rule(sim, mk):
    _, nl, _ = sim
    with pytest.raises(NkiValidationError, match="select_reduce: dst has 40 elements per partition but on_true has 30"):
        nl.where(mk(torch.ones(8, 40)), mk(torch.randn(8, 30)), 0.0)


def test_rand_is_rng_then_a_scale_and_follows_the_seed(sim, mk, v):
    _, nl, _ = sim
    r, ops = _issued(lambda: nl.rand((128, 300), dtype=nl.float32))
    assert ops == [("rng", "vector"), ("tensor_scalar", "vector")]
    u = v(r)
    assert u.min() >= 0.0 and u.max() < 1.0 and 0.45 < u.mean() < 0.55
    assert torch.equal(u * 65536, torch.round(u * 65536))  # 16 random bits per value
    seed = nl.full((1, 1), 42, dtype=nl.int32)
    nl.random_seed(seed)
    a = v(nl.rand((8, 16), dtype=nl.float32))
    nl.random_seed(seed)
    assert torch.equal(a, v(nl.rand((8, 16), dtype=nl.float32)))


def test_rand_and_full_on_hbm_go_through_sbuf_and_dma(sim, v):
    _, nl, _ = sim
    # 3 x 100 = 300 elements: a [128, 2] block and a 44-element tail
    h, ops = _issued(lambda: nl.full((3, 100), 2.5, dtype=nl.bfloat16, buffer=nl.shared_hbm))
    assert ops == [("memset", "vector"), ("dma_copy", "dma"), ("dma_copy", "dma")]
    assert torch.equal(v(h), torch.full((3, 100), 2.5))
    z, ops = _issued(lambda: nl.zeros((128 * 4100,), dtype=nl.int32, buffer=nl.hbm))
    assert ops == [("memset", "vector")] + [("dma_copy", "dma")] * 3  # 2048 + 2048 + 4 columns
    assert torch.equal(v(z), torch.zeros(128 * 4100))
    r, ops = _issued(lambda: nl.rand((5, 7), dtype=nl.float32, buffer=nl.shared_hbm))
    assert ops == [("rng", "vector"), ("tensor_scalar", "vector"), ("dma_copy", "dma")]
    assert 0.0 <= v(r).min() and v(r).max() < 1.0


def test_identity_matrix_is_a_constant_loaded_by_dma(sim, v):
    _, nl, _ = sim
    i, ops = _issued(lambda: nl.shared_identity_matrix(n=24, dtype=nl.bfloat16))
    assert ops == [("dma_copy", "dma")]
    ins = simulator.current_trace()[-1]
    assert ins.attrs["direction"] == "hbm_to_sbuf" and ins.reads[0].buffer == "hbm"
    assert i.buffer == nl.sbuf and torch.equal(v(i), torch.eye(24))


def test_gather_flattened_is_nc_n_gather(sim, mk, v):
    _, nl, _ = sim
    data = torch.randn(16, 50)
    idx = torch.randint(0, 50, (16, 7))
    g, ops = _issued(lambda: nl.gather_flattened(mk(data), mk(idx, "uint32")))
    assert ops == [("nc_n_gather", "gpsimd")] and torch.equal(v(g), torch.gather(data, 1, idx))
    g, ops = _issued(lambda: nl.gather_flattened(mk(data), mk(idx, "int16"), dtype=nl.bfloat16))
    assert [op for op, _ in ops] == ["tensor_copy", "nc_n_gather", "tensor_copy"]
    assert g.dtype == nl.bfloat16
    assert torch.equal(v(g), torch.gather(data, 1, idx).bfloat16().float())
    with pytest.raises(NkiValidationError, match="indices must be an integer tile"):
        nl.gather_flattened(mk(data), mk(idx.float()))
    with pytest.raises(NkiValidationError, match="nc_n_gather: data must be in SBUF, got PSUM"):
        nl.gather_flattened(mk(data, buffer="psum"), mk(idx, "uint32"))


def test_partition_broadcast_is_one_dma(sim, mk, v):
    _, nl, _ = sim
    row = torch.randn(1, 30)
    b, ops = _issued(lambda: nl.broadcast_to(mk(row), (128, 30), dtype=nl.bfloat16))
    assert ops == [("dma_copy", "dma")]
    ins = simulator.current_trace()[-1]
    assert ins.attrs["direction"] == "sbuf_to_sbuf"
    assert torch.equal(v(b), row.bfloat16().float().expand(128, 30))
    col, ops = _issued(lambda: nl.broadcast_to(mk(torch.randn(64, 1)), (64, 9)))
    assert ops == [] and col.shape == (64, 9)  # free axes: a view, no instruction

"""The less common nisa instructions against torch, with one rule check each."""

from __future__ import annotations

import pytest
import torch

from nki_kernels.simulator import NkiValidationError, UnsupportedError


def test_dma_transpose(sim, mk, v, last):
    _, nl, nisa = sim
    x = torch.randn(48, 100)
    dst = nl.ndarray((100, 48), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_transpose(dst, mk(x, "bfloat16"))
    assert torch.equal(v(dst), x.bfloat16().float().T) and last().engine == "dma"
    with pytest.raises(NkiValidationError, match="dtype"):
        nisa.dma_transpose(dst, mk(x))


def test_dma_compute_adds(sim, mk, v):
    _, nl, nisa = sim
    a, b = torch.randn(16, 10), torch.randn(16, 10)
    dst = nl.ndarray((16, 10), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_compute(dst, [mk(a), mk(b)], nl.add)
    torch.testing.assert_close(v(dst), a + b)
    with pytest.raises(NkiValidationError, match="only nl.add"):
        nisa.dma_compute(dst, [mk(a), mk(b)], nl.multiply)


def test_dma_compute_reads_each_source_at_its_own_dtype(sim, mk, v, last):
    # fp32 sources summed into a bf16 dst: the engines read 2 x 4 B per element and write
    # 2 B; the transfer is priced by the larger side (cost/model.py dma_cost)
    _, nl, nisa = sim
    a, b = torch.randn(16, 10), torch.randn(16, 10)
    dst = nl.ndarray((16, 10), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_compute(dst, [mk(a), mk(b)], nl.add)
    torch.testing.assert_close(v(dst), (a + b).bfloat16().float())   # one rounding of the fp32 sum
    ins = last()
    assert (ins.attrs["bytes"], ins.attrs["src_bytes"]) == (16 * 10 * 2, 2 * 16 * 10 * 4)


def test_tensor_copy_predicated(sim, mk, v):
    _, nl, nisa = sim
    x, y = torch.randn(32, 20), torch.randn(32, 20)
    pred = torch.randint(0, 2, (32, 20))
    dst = mk(y)
    nisa.tensor_copy_predicated(dst, mk(x), mk(pred, "uint8"))
    assert torch.equal(v(dst), torch.where(pred != 0, x, y))
    with pytest.raises(NkiValidationError, match="predicate dtype"):
        nisa.tensor_copy_predicated(dst, mk(x), mk(pred, "int32"))


def test_tensor_partition_reduce(sim, mk, v):
    _, nl, nisa = sim
    x = torch.randn(64, 30)
    dst = nl.ndarray((1, 30), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_partition_reduce(dst, nl.add, mk(x))
    torch.testing.assert_close(v(dst), x.sum(0, keepdim=True), atol=1e-5, rtol=1e-5)
    nisa.tensor_partition_reduce(dst, nl.maximum, mk(x))
    assert torch.equal(v(dst), x.amax(0, keepdim=True))


def test_tensor_scalar_cumulative(sim, mk, v):
    _, nl, nisa = sim
    x = torch.randn(16, 40)
    dst = nl.ndarray((16, 40), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_cumulative(dst, mk(x), nl.multiply, nl.add, 2.0)
    torch.testing.assert_close(v(dst), torch.cumsum(2 * x, 1), atol=1e-5, rtol=1e-5)
    nisa.tensor_scalar_cumulative(dst, mk(x), nl.add, nl.maximum, 0.0)
    assert torch.equal(v(dst), torch.cummax(x, 1).values)


@pytest.mark.parametrize("op", ["add", "multiply"])
def test_tensor_scalar_cumulative_rounds_the_register_to_fp32_at_each_step(sim, mk, v, op):
    # "reg = op1(op0(in_tensor[i], imm0), reg)" with VectorE's fp32 register: each step
    # rounds to fp32 (torch's CPU cumsum / cumprod carry float64 and round only the output)
    _, nl, nisa = sim
    if op == "add":
        x = torch.rand(4, 3000) * 1000
    else:
        x = 1 + (torch.rand(4, 3000) - 0.5) * 1e-2
    dst = nl.ndarray((4, 3000), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_cumulative(dst, mk(x), nl.multiply, getattr(nl, op), 1.0)
    step = torch.add if op == "add" else torch.mul
    ref = x.clone()
    for i in range(1, 3000):
        ref[:, i] = step(x[:, i], ref[:, i - 1])
    assert torch.equal(v(dst), ref)
    wide = (torch.cumsum if op == "add" else torch.cumprod)(x.double(), 1).float()
    assert not torch.equal(ref, wide)       # the rows are long enough to tell the two apart


def test_tensor_tensor_scan(sim, mk, v):
    _, nl, nisa = sim
    a, b = torch.rand(8, 12), torch.randn(8, 12)
    dst = nl.ndarray((8, 12), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor_scan(dst, mk(a), mk(b), 0.5, nl.multiply, nl.add)
    prev = torch.full((8,), 0.5)
    ref = torch.empty(8, 12)
    for i in range(12):
        prev = a[:, i] * prev + b[:, i]
        ref[:, i] = prev
    torch.testing.assert_close(v(dst), ref)


def test_range_select(sim, mk, v):
    _, nl, nisa = sim
    x = torch.randn(32, 64)
    lo, hi = torch.randint(0, 30, (32, 1)).float(), torch.randint(30, 64, (32, 1)).float()
    dst = nl.ndarray((32, 64), dtype=nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.range_select(dst, mk(x), nl.greater_equal, nl.less, mk(lo), mk(hi), reduce_res=res)
    idx = torch.arange(64).float()
    ref = torch.where((idx >= lo) & (idx < hi), x, torch.tensor(-3.4028235e38))
    assert torch.equal(v(dst), ref) and torch.equal(v(res), ref.amax(1, keepdim=True))
    # on_false_value "must be FP32_MIN" (docstring); FP32_MIN spelled as torch's finfo is it
    nisa.range_select(dst, mk(x), nl.greater_equal, nl.less, mk(lo), mk(hi),
                      on_false_value=float(torch.finfo(torch.float32).min))
    with pytest.raises(NkiValidationError, match=r"on_false_value=0\.0 must be FP32_MIN"):
        nisa.range_select(dst, mk(x), nl.greater_equal, nl.less, mk(lo), mk(hi), on_false_value=0.0)
    # a range_start shifts the compared index; the docstring's other limits are refused (the
    # simulator max-reduced whatever reduce_op said, and took scalar bounds and 0.5 as a start)
    nisa.range_select(dst, mk(x), nl.greater_equal, nl.less, mk(lo), mk(hi), range_start=5)
    assert torch.equal(v(dst), torch.where((idx + 5 >= lo) & (idx + 5 < hi), x, torch.tensor(-3.4028235e38)))
    for kwargs, message in (({"reduce_op": nl.add}, "reduce_op .*add.*: only nl.maximum is supported"),
                            ({"bound0": 2.0}, "bound0 must be a \\(P, 1\\) tile .* got float 2.0"),
                            ({"range_start": 0.5}, "range_start=0.5 must be a compile-time integer"),
                            ({"range_start": True}, "range_start=True must be a compile-time integer")):
        args = {"bound0": mk(lo), "bound1": mk(hi), "reduce_res": res, **kwargs}
        with pytest.raises(NkiValidationError, match=message):
            nisa.range_select(dst, mk(x), nl.greater_equal, nl.less, **args)


def test_gathers_and_max8(sim, mk, v):
    _, nl, nisa = sim
    data = torch.randn(16, 50)
    idx = torch.randint(0, 50, (16, 7))
    dst = nl.ndarray((16, 7), dtype=nl.float32, buffer=nl.sbuf)
    nisa.nc_n_gather(dst, mk(data), mk(idx, "uint32"))
    assert torch.equal(v(dst), torch.gather(data, 1, idx))
    g = nl.gather_flattened(mk(data), mk(idx, "int32"))
    assert torch.equal(v(g), torch.gather(data, 1, idx))
    with pytest.raises(IndexError, match="out of range"):
        nl.gather_flattened(mk(data), mk(idx + 50, "int32"))
    top = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(top, mk(data))
    assert torch.equal(v(top), torch.topk(data, 8, 1).values)
    found = nl.ndarray((16, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(found, mk(data), top)
    assert torch.equal(found.values(), torch.topk(data, 8, 1).indices)


def _check_match_replace8(sim, mk, v, data, vals, replaced, expected_idx):
    """nc_match_replace8 of ``vals`` in ``data`` [4, n]: the ``replaced`` columns become -1,
    and dst_idx holds ``expected_idx`` on every row."""
    _, nl, nisa = sim
    dst = nl.ndarray(tuple(data.shape), dtype=nl.float32, buffer=nl.sbuf)
    idx = nl.ndarray((4, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_match_replace8(dst, mk(data), mk(vals), -1.0, dst_idx=idx)
    ref = data.clone()
    ref[:, replaced] = -1.0
    assert torch.equal(v(dst), ref)
    assert torch.equal(idx.values(), torch.tensor(expected_idx).expand(4, 8))


def test_nc_match_replace8(sim, mk, v):
    data = torch.randn(4, 20)
    cols = [3, 7, 1, 0, 9, 11, 15, 19]
    _check_match_replace8(sim, mk, v, data, data[:, cols], cols, cols)


def test_nc_match_replace8_pairs_duplicate_vals_with_distinct_positions(sim, mk, v):
    # nki.isa.nc_match_replace8 (v2.32 docstring): duplicate vals are processed in reverse
    # order (i = 7..0), each taking the next unmatched occurrence in data, so the first
    # matched position goes to the highest dst_idx slot: its example, data [1, 2, 3, 4, 8 x 7]
    # and vals [3, 8 x 7], gives dst_idx [2, 10, 9, 8, 7, 6, 5, 4]. Here with random values
    # in place of 3 and 8; every duplicate is replaced.
    data = torch.randn(4, 11)
    data[:, 4:] = data[:, 4:5]                      # one value seven times
    vals = torch.cat([data[:, 2:3], data[:, 4:5].expand(4, 7)], 1)
    _check_match_replace8(sim, mk, v, data, vals, [2, 4, 5, 6, 7, 8, 9, 10], [2, 10, 9, 8, 7, 6, 5, 4])


def test_nc_stream_shuffle(sim, mk, v):
    _, nl, nisa = sim
    x = torch.randn(64, 5)
    dst = nl.ndarray((64, 5), dtype=nl.float32, buffer=nl.sbuf)
    mask = list(reversed(range(32)))
    nisa.nc_stream_shuffle(dst, mk(x), mask)
    ref = torch.cat([x[0:32].flip(0), x[32:64].flip(0)])
    assert torch.equal(v(dst), ref)


def test_dropout_and_rng(sim, mk, v):
    _, nl, nisa = sim
    x = torch.rand(64, 200) + 1
    dst = nl.ndarray((64, 200), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dropout(dst, mk(x), 0.25)
    ints = nl.ndarray((64, 200), dtype=nl.int32, buffer=nl.sbuf)
    with pytest.raises(NkiValidationError, match="prob tile must be float32, got bfloat16"):
        # integer data: "prob data type must be float32"
        nisa.dropout(ints, mk(torch.randint(1, 9, (64, 200)), "int32"), mk(torch.rand(64, 1), "bfloat16"))
    kept = v(dst) != 0
    assert torch.equal(v(dst)[kept], x[kept]) and 0.15 < 1 - kept.float().mean() < 0.35
    # integers keep "their original values", also above 2**24 (no fp32 round trip)
    big = torch.tensor([[16777217, 1073741827, 123456789, -2147483647]] * 4, dtype=torch.int32)
    ints = nl.ndarray((4, 4), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dropout(ints, mk(big, "int32"), 0.0)
    assert torch.equal(ints.values().to(torch.int64), big.to(torch.int64))
    nisa.dropout(ints, mk(big, "int32"), 1.0)
    assert torch.equal(ints.values().to(torch.int64), torch.zeros(4, 4, dtype=torch.int64))
    r = nl.ndarray((64, 8), dtype=nl.uint16, buffer=nl.sbuf)
    nisa.rng(r)
    vals = r.values().to(torch.int64).reshape(-1).double()
    # 512 draws from 65536 values: ~2 repeats expected, so a fill (or an unwritten poisoned
    # tile) shows as few distinct values; the mean is within 4 sigma of uniform's 32767.5
    assert vals.unique().numel() > 490
    assert abs(float(vals.mean()) - 32767.5) < 4 * 65536 / 12 ** 0.5 / 512 ** 0.5
    with pytest.raises(NkiValidationError, match="integer dtype"):
        nisa.rng(dst)


def test_registers_and_loops(sim, mk):
    _, nl, nisa = sim
    reg = nisa.register_alloc(3)
    seen = []
    nl.fori_loop(0, reg, lambda i: seen.append(int(i)))
    assert seen == [0, 1, 2]
    t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.register_store(t, reg)
    reg2 = nisa.register_alloc()
    nisa.register_load(reg2, t)
    assert int(reg2) == 3
    count = [0]

    def body(r):
        count[0] += 1
        nisa.register_move(r, int(r) - 1)
        return r

    nl.while_loop(reg2, body)
    assert count[0] == 3


def _register_docstring_examples(out):
    """The v2.33 register_load and register_store examples, as one kernel: a bound of 1
    loaded from a 1-D SBUF tensor, a counter stored into another and sent to HBM."""
    import nki.isa as nisa
    import nki.language as nl

    computed_bound = nl.ones([1], dtype=nl.int32, buffer=nl.sbuf)  # bound of 1 in SBUF
    loop_reg = nisa.register_alloc()
    nisa.register_load(loop_reg, computed_bound)
    counter_reg = nisa.register_alloc(0)
    nl.fori_loop(0, loop_reg, lambda i: nisa.register_move(counter_reg, int(counter_reg) + 5))
    result_tensor = nl.ndarray([1], dtype=nl.int32, buffer=nl.sbuf)
    nisa.register_store(result_tensor, counter_reg)
    nisa.dma_copy(out, result_tensor)
    return out


def test_register_docstring_examples_with_one_dim_sbuf_tensors_run_and_model():
    # v2.33 nki.isa.register_load / register_store: "a NKI tensor with exactly one element
    # (shape [1] or [1, 1])", their examples allocating shape [1] in SBUF
    from nki_kernels import simulator
    from nki_kernels.simulator.cost import estimate_trace

    out = torch.full((1,), -77, dtype=torch.int32)
    res = simulator.run(_register_docstring_examples, out)
    assert res.outputs.tolist() == [5]          # one trip of the loop the loaded bound makes
    # the cost model takes the 1-D tiles too: the DMA of 4 bytes to HBM at least
    est = estimate_trace(res.trace, "trn2", allocations=res.allocations)
    assert est.latency_us > 0 and est.instruction_counts.get("dma_copy") == 1


def test_a_one_dim_on_chip_tensor_is_no_engine_operand(sim, mk):
    _, nl, nisa = sim
    t = nl.ndarray((4,), dtype=nl.float32, buffer=nl.sbuf)
    assert t.shape == (4,)
    for call in (lambda: nisa.memset(t, 1.0), lambda: nisa.tensor_copy(t, mk(torch.randn(4, 1))),
                 lambda: nisa.activation(mk(torch.randn(4, 1)), nl.exp, t), lambda: nl.exp(t)):
        with pytest.raises(NkiValidationError, match=r"is a 1-D on-chip tensor \(shape \(4,\)\).*reshape\(\(4, 1\)\)"):
            call()
    # its [P, 1] view is an ordinary tile, and nl.ones fills a 1-D tile through it
    x = torch.randn(4, 1)
    nisa.tensor_copy(t.reshape((4, 1)), mk(x))
    assert torch.equal(t.values(), x.reshape(4))
    ones = nl.ones((4,), dtype=nl.float32, buffer=nl.sbuf)
    assert torch.equal(ones.values(), torch.ones(4))
    assert t.reshape((4, 1)).reshape((4,)).shape == (4,)
    with pytest.raises(NkiValidationError, match=r"on-chip sbuf tensor needs >= 1 dims, got \(\)"):
        nl.ndarray((1,), dtype=nl.float32, buffer=nl.sbuf).reshape(())
    # squeeze_dim agrees with reshape: SBUF may drop to 1-D, PSUM may not (review, session 68)
    assert nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf).squeeze_dim(1).shape == (4,)
    psum = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.psum)
    with pytest.raises(NkiValidationError, match=r"reshape: on-chip psum tensor needs >= 2 dims, got \(4,\)"):
        psum.reshape((4,))
    with pytest.raises(NkiValidationError, match=r"squeeze_dim: on-chip psum tensor \(4, 1\) must keep its partition dim and 2"):
        psum.squeeze_dim(1)
    # a single-pair access pattern is a 1-D view too: no engine operand either
    with pytest.raises(NkiValidationError, match="is a 1-D on-chip tensor"):
        nisa.memset(nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf).ap([[8, 4]]), 0.0)


def test_unsupported_names_raise_clearly(sim):
    _, nl, nisa = sim
    with pytest.raises(UnsupportedError, match="activate2"):
        nisa.activate2()
    t = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
    with pytest.raises(UnsupportedError, match="indirect"):
        t.indirect(t)


def test_find_index8_takes_successive_occurrences_of_a_repeated_value(sim, mk):
    # AWS's simulator fix "to match hardware" (Neuron 2.32 release notes): the k-th copy of a
    # value in vals finds its k-th occurrence; absent (or exhausted) values get all ones
    _, nl, nisa = sim
    data = torch.tensor([[1, 5, 3, 5, 2, 5, 0, 4, 1, 3, -1, -2]], dtype=torch.float32)
    vals = torch.tensor([[5, 5, 5, 4, 3, 3, 2, 9]], dtype=torch.float32)
    found = nl.ndarray((1, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(found, mk(data), mk(vals))
    assert found.values().tolist() == [[1, 3, 5, 7, 2, 9, 4, 0xFFFFFFFF]]
    vals4 = torch.tensor([[5, 5, 5, 5, 1, 1, 1, 0]], dtype=torch.float32)    # 4th 5 and 3rd 1: none
    short = nl.ndarray((1, 8), dtype=nl.uint16, buffer=nl.sbuf)
    nisa.nc_find_index8(short, mk(data), mk(vals4))
    assert short.values().tolist() == [[1, 3, 5, 0xFFFF, 0, 8, 0xFFFF, 6]]
    with pytest.raises(NkiValidationError, match="dst dtype float32 must be uint16 or uint32"):
        nisa.nc_find_index8(nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.sbuf), mk(data), mk(vals))
    with pytest.raises(NkiValidationError, match="data has 4 elements per partition; between 8 and 16384"):
        nisa.nc_find_index8(found, mk(data[:, :4]), mk(vals))
    # "The data tensor can be up to 3-dimensional, while the vals tensor must be up to
    # 3-dimensional"; dst "a 2D tile ... [par_dim, 8]": a 3-D data is found as flattened
    found3 = nl.ndarray((1, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(found3, mk(data.reshape(1, 3, 4)), mk(vals.reshape(1, 2, 4)))
    assert found3.values().tolist() == [[1, 3, 5, 7, 2, 9, 4, 0xFFFFFFFF]]
    with pytest.raises(NkiValidationError, match=r"data has rank 4 \(1, 3, 2, 2\); at most 3"):
        nisa.nc_find_index8(found, mk(data.reshape(1, 3, 2, 2)), mk(vals))
    with pytest.raises(NkiValidationError, match=r"vals has rank 4 \(1, 2, 2, 2\); at most 3"):
        nisa.nc_find_index8(found, mk(data), mk(vals.reshape(1, 2, 2, 2)))
    with pytest.raises(NkiValidationError, match=r"dst must be 2-D \[partitions, 8\], got shape \(1, 2, 4\)"):
        nisa.nc_find_index8(nl.ndarray((1, 2, 4), dtype=nl.uint32, buffer=nl.sbuf), mk(data), mk(vals))
    # nc_match_replace8's vals: "the 8 values per partition to match"
    with pytest.raises(NkiValidationError, match="vals has 4 elements per partition; it must have 8"):
        nisa.nc_match_replace8(nl.ndarray((1, 12), dtype=nl.float32, buffer=nl.sbuf), mk(data),
                               mk(vals[:, :4]), 0.0)


def test_dma_options_follow_their_documented_limits(sim, mk):
    _, nl, nisa = sim
    x = mk(torch.randn(8, 16))
    out = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.hbm)
    nisa.dma_copy(out, x, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.sync)     # allowed
    with pytest.raises(NkiValidationError, match="only valid with dge_mode=nisa.dge_mode.hwdge"):
        nisa.dma_copy(out, x, engine=nisa.engine.sync)
    with pytest.raises(NkiValidationError, match="must be nisa.engine.sync or nisa.engine.scalar"):
        nisa.dma_copy(out, x, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.gpsimd)
    with pytest.raises(NkiValidationError, match=r"priority=2 needs NeuronCore-v4 \(trn3\) or newer \(nki.isa.dma_copy\); the target is trn2"):
        nisa.dma_copy(out, x, priority=2)


def test_dma_priority_on_trn3():
    from nki_kernels import simulator

    with simulator.activated("trn3") as nki:
        nl, nisa = nki.language, nki.isa
        src = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(src, 1.5)
        out = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.hbm)
        nisa.dma_copy(out, src, priority=3)
        assert torch.equal(out.values(), torch.full((8, 16), 1.5))
        with pytest.raises(NkiValidationError, match="priority=4 must be an int in 0..3"):
            nisa.dma_copy(out, src, priority=4)

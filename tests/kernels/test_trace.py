"""Structural properties of the kernels' instruction traces at the large shapes: full
128-partition tiles, large DMA transfers, work spread over the engines, SBUF within trn2.
(Layout checks on the simulator's trace, not timings.)"""

from __future__ import annotations

import sys

import pytest
import torch

from nki_kernels import _dispatch, simulator
from nki_kernels.ops import activations, norms, rotary

from nki_kernels.ops import softmax as softmax_module
TRN2_SBUF = 224 * 1024


def _run(call):
    with simulator.activated():
        kernel = _dispatch.simulator_kernel(call)
    return simulator.run(kernel, *[t.contiguous() for t in call.tensors], target="trn2", **call.static)


def _calls(rows, hidden, dtype):
    x = torch.randn(rows, hidden).to(dtype)
    w = torch.randn(hidden).to(dtype)
    return {
        "layer_norm": norms.layer_norm_kernel_call(x, (hidden,), w, torch.randn(hidden).to(dtype)),
        "rms_norm": norms.rms_norm_kernel_call(x, (hidden,), w, 1e-6),
        "fused_add_rms_norm": norms.fused_add_rms_norm_kernel_call(x, x.clone(), w, 1e-6),
        "softmax": softmax_module.softmax_kernel_call(x),
        "silu_and_mul": activations.silu_and_mul_kernel_call(torch.randn(rows, 2 * hidden).to(dtype)),
        "silu": activations.silu_kernel_call(x),
    }


OPS = ["layer_norm", "rms_norm", "fused_add_rms_norm", "softmax", "silu_and_mul", "silu"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("rows, hidden", [(1576, 768), (1576, 8192)], ids=["1576x768", "1576x8192"])
def test_row_kernels_use_full_partitions_and_large_dmas(op, rows, hidden):
    result = _run(_calls(rows, hidden, torch.bfloat16)[op])
    # row data transfers (not the one-time stride-0 broadcast of weight / bias)
    dmas = [i for i in result.trace if i.op == "dma_copy"
            and not any(0 in o.strides for o in i.reads if o.buffer == "hbm")]
    sbuf_sides = [next(o for o in i.reads + i.writes if o.buffer == "sbuf") for i in dmas]
    partial = [o for o in sbuf_sides if o.partitions < 128]
    # 1576 = 12 * 128 + 40 rows: only the 40-row tail is partial (its loads and stores)
    assert all(o.partitions == 40 for o in partial), [o.shape for o in partial]
    # every full-partition transfer moves >= 4 KiB per partition (the DMA guide's figure),
    # except the elementwise kernel's one remainder chunk (its load and its store) and
    # layer_norm's last block at 768 columns: 3 rows per partition, stored one row slot at
    # a time (kernels/layer_norm.py DRAIN_BY_SLOT, where the cost model says the shorter
    # drain outweighs the extra transfers), 1536 B each
    full = [o for o in sbuf_sides if o.partitions == 128]
    small = [o.nbytes // 128 for o in full if o.nbytes // 128 < 4096]
    allowed_small = {"silu": 2, "layer_norm": 3 if hidden == 768 else 0}.get(op, 0)
    assert full and len(small) <= allowed_small, sorted({o.nbytes // 128 for o in full})
    if op == "layer_norm":
        assert small == [hidden * 2] * allowed_small       # one bf16 row per partition each
    assert result.peak_sbuf_bytes_per_partition <= TRN2_SBUF


@pytest.mark.parametrize("op, engines", [
    ("rms_norm", {"vector", "scalar", "gpsimd"}),
    ("layer_norm", {"vector", "scalar", "gpsimd"}),
    ("softmax", {"vector", "scalar"}),
    ("silu_and_mul", {"vector", "scalar", "gpsimd"}),
])
def test_work_is_spread_over_engines(op, engines):
    # bf16 traffic is cheap enough that one compute engine alone would be the bottleneck;
    # the kernels split the elementwise work (see each kernel's VECTOR_SHARE derivation).
    result = _run(_calls(1576, 8192, torch.bfloat16)[op])
    used = {i.engine for i in result.trace if i.engine != "dma" and i.flops >= 128 * 1024}
    assert engines <= used, used


def test_rotary_loads_heads_in_groups_and_starts_each_group_before_the_last_one_finishes():
    # kernels/rotary.py: 16 heads of 128 per group (HEAD_COLS = 2048 columns, 4 KiB bf16 per
    # partition), q and k of one 128-position tile sharing its cos/sin; each group's load
    # and GpSimd's first products are issued before the previous group's paths and store
    q, k = torch.randn(1, 32, 256, 128).bfloat16(), torch.randn(1, 8, 256, 128).bfloat16()
    cos, sin = torch.randn(256, 128).bfloat16(), torch.randn(256, 128).bfloat16()
    result = _run(rotary.apply_rotary_pos_emb_kernel_call(q, k, cos, sin))
    # the head groups' loads ([P, G, D]; cos and sin come as [P, 1, D], one position tile)
    loads = [i for i in result.trace if i.op == "dma_copy" and i.writes[0].buffer == "sbuf"
             and len(i.writes[0].shape) == 3 and i.writes[0].shape[1] > 1]
    assert [i.writes[0].shape for i in loads] == [(128, 16, 128), (128, 16, 128), (128, 8, 128)] * 2
    stores = [i for i in result.trace if i.op == "dma_copy" and i.writes[0].buffer == "hbm"]
    assert len(stores) == len(loads)
    # group g + 1 is loaded before group g is stored, for every g
    assert all(loads[g + 1].index < stores[g].index for g in range(len(loads) - 1))
    assert result.peak_sbuf_bytes_per_partition <= TRN2_SBUF


def test_fused_add_rms_norm_loads_its_blocks_ahead_of_their_compute():
    # kernels/rms_norm.py fused_add_rms_norm_kernel: x and residual of block i + ahead are
    # loaded before block i's sum (tiling.pipelined), two blocks ahead where a block's two
    # rows take at most PREFETCH_MAX_ROW_BYTES (bf16 H = 4096: 16 KiB), one beyond (bf16
    # H = 8192); each block's output is stored after the next block's sum. Session 58's
    # kernel loaded each block just before its own compute: modeled trn2 LNC=2, Llama-7B
    # [2048, 4096] 103.1 -> 97.3 us. The result is the float64 reference's, rounded once.
    for hidden, ahead in ((4096, 2), (8192, 1)):
        x, r = torch.randn(640, hidden).bfloat16(), torch.randn(640, hidden).bfloat16()
        w = torch.randn(hidden).bfloat16()
        result = _run(norms.fused_add_rms_norm_kernel_call(x, r, w, 1e-6))
        trace = result.trace
        loads = [i.index for i in trace if i.op == "dma_copy" and i.reads[0].buffer == "hbm"
                 and i.writes[0].buffer == "sbuf" and i.writes[0].shape == (128, 1, hidden)]
        sums = [i.index for i in trace if i.engine == "vector" and i.op == "tensor_tensor"
                and i.writes[0].shape == (128, 1, hidden)]
        stores = [i for i in trace if i.op == "dma_copy" and i.writes[0].buffer == "hbm"]
        # the first store is block 0's sum (total), stored as soon as it is made
        total_id = stores[0].writes[0].alloc_id
        out_stores = [i.index for i in stores if i.writes[0].alloc_id != total_id and len(i.reads[0].shape) == 3]
        # the last block's output goes in 4 KiB column chunks (_normalize_or_drain), after its sum
        chunk_stores = [i.index for i in stores if i.writes[0].alloc_id != total_id and len(i.reads[0].shape) == 2]
        assert len(loads) == 2 * len(sums) == 2 * (len(out_stores) + 1) == 10
        assert len(chunk_stores) == hidden * 2 // 4096 and min(chunk_stores) > sums[-1]
        # block b's two loads come before block b - ahead's sum, not before b - ahead - 1's
        for b in range(ahead, len(sums)):
            assert loads[2 * b + 1] < sums[b - ahead]
            if b - ahead - 1 >= 0:
                assert loads[2 * b] > sums[b - ahead - 1]
        assert all(out_stores[b] > sums[b + 1] for b in range(len(sums) - 1))
        normed, total = result.outputs
        s64 = (x.double() + r.double()).to(torch.bfloat16).double()
        ref = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        # one rounding to bf16 each (2**-8 relative); the kernel rounds its fp32 value and the
        # reference its float64 one, which may land one bf16 step apart: 2**-7
        torch.testing.assert_close(normed.double(), ref.to(torch.bfloat16).double(), atol=0, rtol=2 ** -7)
        assert torch.equal(total, (x.float() + r.float()).bfloat16())


@pytest.mark.parametrize("op", ["rms_norm", "fused_add_rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype, hidden, chunk_bytes", [
    (torch.bfloat16, 4096, [4096] * 2),
    (torch.bfloat16, 8192, [4096] * 4),
    (torch.float32, 3000, [6000] * 2),
    (torch.bfloat16, 1024, []),
], ids=["bf16-4096", "bf16-8192", "fp32-3000", "bf16-1024-short-rows"])
def test_norms_store_the_programs_last_block_chunk_by_chunk(op, dtype, hidden, chunk_bytes):
    # kernels/rms_norm.py _normalize_or_drain: the program's last block is normalised in
    # equal column chunks of at least 4 KiB per partition (tiling.DMA_SATURATING_BYTES) and
    # each chunk is stored as soon as it is made; rows shorter than that (1024 bf16 columns)
    # are stored whole. kernels/layer_norm.py COLUMN_DRAIN does so for 16-bit blocks of one
    # row per partition with a weight (its fp32 rows are stored whole). Every other block
    # keeps one store. The result is the float64 reference's, rounded as the kernel rounds.
    rows = 640
    if op == "layer_norm" and dtype == torch.float32:
        chunk_bytes = []
    x, r = torch.randn(rows, hidden).to(dtype), torch.randn(rows, hidden).to(dtype)
    w, b = torch.randn(hidden).to(dtype), torch.randn(hidden).to(dtype)
    call = {"fused_add_rms_norm": lambda: norms.fused_add_rms_norm_kernel_call(x, r, w, 1e-6),
            "rms_norm": lambda: norms.rms_norm_kernel_call(x, (hidden,), w, 1e-6),
            "layer_norm": lambda: norms.layer_norm_kernel_call(x, (hidden,), w, b, 1e-5)}[op]()
    result = _run(call)
    out = result.outputs[0] if op == "fused_add_rms_norm" else result.outputs
    stores = [i for i in result.trace if i.op == "dma_copy" and i.writes[0].buffer == "hbm"]
    out_id = stores[-1].writes[0].alloc_id            # the output's rows are stored last
    out_stores = [i for i in stores if i.writes[0].alloc_id == out_id]
    chunks = [i for i in out_stores if len(i.reads[0].shape) == 2]
    assert sum(i.reads[0].nbytes for i in out_stores) == rows * hidden * dtype.itemsize
    assert [i.reads[0].nbytes // 128 for i in chunks] == chunk_bytes
    # between two chunk stores the engines write exactly the next chunk's columns of the
    # output tile: each chunk is stored as soon as it is made, before the next is begun
    tile_id = chunks[0].reads[0].alloc_id if chunks else None
    writes = [(i.index, o.offset, o.offset + o.shape[-1]) for i in result.trace if i.engine != "dma"
              for o in i.writes if o.alloc_id == tile_id]
    for before, store in zip(chunks, chunks[1:]):
        lo, hi = store.reads[0].offset, store.reads[0].offset + store.reads[0].shape[-1]
        covered = set()
        for k, first, end in writes:
            if before.index < k < store.index:
                covered.update(range(first, end))
        assert covered == set(range(lo, hi))
    if op == "layer_norm":
        ref = torch.nn.functional.layer_norm(x.double(), (hidden,), w.double(), b.double(), 1e-5)
        # 16-bit: y, y * w and + b each rounded to bf16 (kernels/layer_norm.py "Expected
        # error"): within a few bf16 steps of the output scale
        tol = dict(atol=2 ** -6 * ref.abs().max().item(), rtol=2 ** -6) if dtype == torch.bfloat16 \
            else dict(atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.double(), ref, **tol)
        return
    s64 = (x.double() + r.double()).to(dtype).double() if op == "fused_add_rms_norm" else x.double()
    ref = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    # one rounding to the output dtype; the kernel rounds its fp32 value and the reference
    # its float64 one, which may land one step apart (bf16: 2**-7); fp32: fp32 arithmetic
    rtol = 2 ** -7 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.double(), ref.to(dtype).double(), atol=1e-6, rtol=rtol)


def _rms_norm_paths(trace, hidden):
    """Columns per program of a traced rms_norm's normalisation on its three paths: VectorE
    scalar_tensor_tensor, GpSimd tensor_scalar (x * rstd) and ScalarE copy into fp32."""
    cols = {"vector": 0, "gpsimd": 0, "scalar": 0}
    for ins in trace:
        if ins.op == "scalar_tensor_tensor" and ins.engine == "vector":
            cols["vector"] += ins.writes[0].shape[-1]
        elif ins.op == "tensor_scalar" and ins.engine == "gpsimd":
            cols["gpsimd"] += ins.writes[0].shape[-1]
        elif ins.op == "activation" and ins.attrs.get("func") == "copy" and ins.writes[0].dtype == "float32":
            cols["scalar"] += ins.writes[0].shape[-1]
    return cols


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_rms_norm_splits_its_normalisation_by_the_active_generations_costs(target):
    # kernels/rms_norm.py _weighted_shares: the shares of the three normalisation paths
    # come from the generation's figures (engine_costs.py), not from constants swept on
    # trn2 (0.5 / 0.3 until session 62): [640, 4096] bf16 with a weight (one row per
    # partition: the split is by columns) takes 0.55 / 0.2 / 0.25 on trn1, 0.55 / 0.35 /
    # 0.1 on trn2 and 0.55 / 0.1 / 0.35 on trn3 (0.55 / 0.4 / 0.05 and 0.55 / 0.15 / 0.3
    # until the refit of 2026-12-06 made their VectorE instructions 150 cycles, 80 of them
    # behind an independent one), every block alike. The result is the
    # float64 reference's rounded once, whichever path made each column. (The programs' last
    # blocks are made in two column chunks, each split in the row's shares.)
    rows, hidden = 640, 4096
    x, w = torch.randn(rows, hidden).bfloat16(), torch.randn(hidden).bfloat16()
    call = norms.rms_norm_kernel_call(x, (hidden,), w, 1e-6)
    with simulator.activated():
        kernel = _dispatch.simulator_kernel(call)
    lnc = 1 if target == "trn1" else 2
    result = simulator.run(kernel[lnc], *call.tensors, target=target, **call.static)
    expected = {"trn1": (0.55, 0.2), "trn2": (0.55, 0.35), "trn3": (0.55, 0.1)}[target]
    paths = _rms_norm_paths(result.trace, hidden)
    total = sum(paths.values())
    assert total == rows // 128 * hidden               # every row's columns, once (all programs)
    # the shares within the rounding of each block's (or drained chunk's) cut, a column each
    assert abs(paths["vector"] - expected[0] * total) <= 8
    assert abs(paths["gpsimd"] - expected[1] * total) <= 8
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    # one rounding to bf16 on every path; the kernel rounds its fp32 value and the reference
    # its float64 one, which may land one bf16 step apart: 2**-7
    torch.testing.assert_close(result.outputs.double(), ref.to(torch.bfloat16).double(), atol=1e-6, rtol=2 ** -7)


def test_rms_norm_prices_its_paths_as_the_cost_model_does():
    # kernels/rms_norm.py _block_engine_ns, which _weighted_shares minimises, charges each
    # engine of a block what the cost model charges the block's instructions there: ScalarE
    # squares (16-bit: at the 16-bit rate, 2 on trn3) and rsqrt, VectorE's
    # scalar_tensor_tensor two passes (no performance mode), GpSimd's tensor_scalar one and
    # tensor_tensor two, ScalarE's copy into fp32 one; each with its engine's fixed cost
    # (VectorE's less the pipeline overlap the schedule gives a stream of independent
    # instructions), the squares' accumulator read-out left out. [512, 1024] bf16 at LNC=1:
    # two [128, 2, 1024] blocks (the launch's two row parts, tiling.WORK_PARTS), each
    # split by rows between the paths, on trn1, trn2 and trn3.
    from nki_kernels import _kernel_sources
    from nki_kernels.simulator.cost.model import compute_cost
    from nki_kernels.simulator.hardware import get_target

    rms_norm = _kernel_sources.load("rms_norm", "simulator")
    rows, hidden = 512, 1024
    x, w = torch.randn(rows, hidden).bfloat16(), torch.randn(hidden).bfloat16()
    call = norms.rms_norm_kernel_call(x, (hidden,), w, 1e-6)
    with simulator.activated():
        kernel = _dispatch.simulator_kernel(call)
    covered = set()
    for target in ("trn1", "trn2", "trn3"):
        result = simulator.run(kernel[1], *call.tensors, target=target, **call.static)
        model = get_target(target)
        modeled = {"vector": 0.0, "scalar": 0.0, "gpsimd": 0.0}
        rows_on = {"vector": 0, "gpsimd": 0, "scalar": 0}
        for ins in result.trace:
            func = ins.attrs.get("func") if ins.op == "activation" else None
            if not ((ins.op == "scalar_tensor_tensor" and ins.engine == "vector") or ins.engine == "gpsimd"
                    or func in ("square", "rsqrt", "copy")):
                continue
            seconds = compute_cost(ins, model).seconds
            if func == "square":
                seconds -= model.activation_readout_cycles / model.scalar_hz
            if ins.engine == "vector":
                seconds -= model.vector_overlap_cycles / model.vector_hz
            modeled[ins.engine] += seconds * 1e9
            path = {"scalar_tensor_tensor": "vector", "tensor_scalar": "gpsimd"}.get(
                ins.op, "scalar" if func == "copy" else None)
            if path:
                rows_on[path] += 1
        assert sum(rows_on.values()) == 4                  # two blocks' two rows, each on one path
        with simulator.activated(target=target):
            estimated, _ = rms_norm._block_engine_ns(2, hidden, True, False, rows_on["vector"] / 4,
                                                     rows_on["gpsimd"] / 4)
        assert [2 * e for e in estimated] == pytest.approx([modeled[k] for k in ("vector", "scalar", "gpsimd")])
        covered |= {path for path, n in rows_on.items() if n}
    assert covered == {"vector", "gpsimd", "scalar"}      # trn1 takes a row to ScalarE, trn2/trn3 to GpSimd


@pytest.mark.parametrize("fused", [False, True], ids=["rms_norm", "fused_add_rms_norm"])
@pytest.mark.parametrize("dtype, rows, hidden, per", [(torch.bfloat16, 512, 1024, 2), (torch.float32, 1024, 512, 4)],
                         ids=["bf16", "fp32"])
def test_rms_norm_backward_splits_its_work_as_the_cost_model_prices_it(dtype, rows, hidden, per, fused):
    # kernels/rms_norm_backward.py _block_plan: the VectorE share of g = dy * w and
    # q = g * x and the share of dx made by one VectorE scalar_tensor_tensor (rms_norm:
    # g * r + a' in place of GpSimd's t = a + g and ScalarE's t * r; fused_add_rms_norm:
    # t * r + dtotal in place of ScalarE's t * r and GpSimd's + dtotal) leave the busiest
    # engine least busy over a block as _block_engine_ns prices it (rms_norm: plus q's later
    # part), and that price is the cost model's for the block's instructions (VectorE: the
    # products, 16-bit in its performance mode, a / a' and xhat per row, the dx share;
    # ScalarE: squares, row sums, rsqrt, t * r; GpSimd: its share of the products, t = a + g,
    # + dtotal; VectorE's fixed cost less the pipeline overlap, ScalarE's accumulator
    # read-outs left out). Until session 62 the product share was 0.8 on every generation
    # and dtype (1.0 fused; swept on trn2 bf16) and dx never on VectorE. At LNC=1 each
    # launch is two blocks (the two row parts, tiling.WORK_PARTS; the last drained in chunks
    # of one row at these widths); the gradients stay float64-close.
    from nki_kernels import _kernel_sources
    from nki_kernels.simulator.cost.model import compute_cost
    from nki_kernels.simulator.hardware import get_target

    backward = _kernel_sources.load("rms_norm_backward", "simulator")
    engine_costs = _kernel_sources.load("engine_costs", "simulator")
    x, dy, dtotal = (torch.randn(rows, hidden).to(dtype) for _ in range(3))
    w = (1 + 0.1 * torch.randn(hidden)).to(dtype)
    call = (norms.fused_add_rms_norm_backward_kernel_call(dy, dtotal, x, w, 1e-6) if fused
            else norms.rms_norm_backward_kernel_call(dy, x, (hidden,), w, 1e-6))
    with simulator.activated():
        kernel = _dispatch.simulator_kernel(call)
    shares = {}
    for target in ("trn1", "trn2", "trn3"):
        result = simulator.run(kernel[1], *call.tensors, target=target, **call.static)
        model = get_target(target)
        modeled = {"vector": 0.0, "scalar": 0.0, "gpsimd": 0.0}
        cols, products = {"dx": 0}, []
        for ins in result.trace:
            shape = ins.writes[0].shape if ins.writes else ()
            # the block's products ([P, J, w]) and per-row passes ([P, <= H]); not the [P, J]
            # statistics nor the dw partial's diagonal extraction ([P, 7, 128]); every
            # activation (ScalarE's work is all the blocks')
            block_work = (shape[1:2] == (per,) and len(shape) == 3) or (len(shape) == 2 and shape[1] > per)
            if ins.engine == "scalar":
                seconds = compute_cost(ins, model).seconds
                if any(o.role == "reduce_res" for o in ins.writes):
                    seconds -= model.activation_readout_cycles / model.scalar_hz
            elif ins.engine in ("vector", "gpsimd") and block_work and ins.op in (
                    "tensor_tensor", "tensor_scalar", "scalar_tensor_tensor"):
                seconds = compute_cost(ins, model).seconds
                if ins.engine == "vector":
                    seconds -= model.vector_overlap_cycles / model.vector_hz
            else:
                continue
            modeled[ins.engine] += seconds * 1e9
            if ins.op == "tensor_tensor" and ins.attrs.get("op") == "multiply":
                products.append((ins.engine, shape[-1]))
            elif ins.op == "scalar_tensor_tensor":
                cols["dx"] += shape[-1]
        # the second block's g and q (fused: the program's first block splits its products
        # by the engines' rates, engine_costs.vector_gpsimd_share)
        second = products[len(products) // 2:]
        share = sum(w for e, w in second if e == "vector") / (2 * hidden)
        dx_share = cols["dx"] / (rows // 128 * hidden)                   # of the two blocks' rows
        sixteen = dtype == torch.bfloat16
        with simulator.activated(target=target):
            chosen = backward._block_plan(per, hidden, sixteen, "diagonal", fused)
            c = engine_costs.active()
            first_share = c.vector_gpsimd_share(c.vector_two_input_rate(sixteen)) if fused else share
            estimated = [a + b for a, b in zip(
                backward._block_engine_ns(per, hidden, sixteen, "diagonal", fused, first_share, dx_share),
                backward._block_engine_ns(per, hidden, sixteen, "diagonal", fused, share, dx_share))]
        assert chosen == pytest.approx((share, dx_share), abs=1 / hidden)
        assert estimated == pytest.approx([modeled[k] for k in ("vector", "scalar", "gpsimd")]), target
        shares[target] = (round(share, 2), round(dx_share, 2))
        dx, dw = call.finish_outputs(result.outputs)
        x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
        y = torch.nn.functional.rms_norm(x64, (hidden,), w64, 1e-6)
        ref_dx, ref_dw = torch.autograd.grad(y, (x64, w64), dy.double())
        if fused:
            ref_dx = ref_dx + dtotal.double()
        # bf16: g, q, a rounded to bf16 (kernels/rms_norm_backward.py "Expected error":
        # ~3 * 2**-9 relative of the terms), dw's fp32 sums of bf16 xhat; fp32: fp32 arithmetic
        tol = 2 ** -6 if sixteen else 1e-4
        torch.testing.assert_close(dx.double(), ref_dx, atol=tol * ref_dx.abs().max().item(), rtol=tol)
        torch.testing.assert_close(dw.double(), ref_dw, atol=tol * ref_dw.abs().max().item(), rtol=tol)
    # (product share, dx share) per generation: the model's engines differ (trn1 has no
    # 16-bit performance mode; trn3's ScalarE reads 16-bit data at twice trn2's rate)
    # (since the refit of 2026-12-06: trn1 VectorE 360 -> 400 cycles, trn2 / trn3 100 -> 150
    # with an issue interval of 80, 40 before; until then bf16 rms_norm trn2 (0.6, 0.55),
    # trn3 (0.65, 0.4), fused trn2 (0.95, 0.3), trn3 (1.0, 0.4), fp32 rms_norm trn1 (0.5, 0.0),
    # trn3 (0.5, 0.3), fp32 fused trn1 (0.2, 1.0); since trn2's VectorE was read off the v5
    # profile, 2026-12-08, 150 -> 65 cycles with an interval of 48: until then bf16 rms_norm
    # trn2 (0.6, 0.45), trn3 (0.7, 0.3), fused trn2 (1.0, 0.2), trn3 (1.0, 0.35), fp32
    # rms_norm trn3 (0.5, 0.2))
    expected = {(torch.bfloat16, False): {"trn1": (0.45, 0.0), "trn2": (0.6, 0.5), "trn3": (0.7, 0.35)},
                (torch.bfloat16, True): {"trn1": (0.15, 1.0), "trn2": (1.0, 0.25), "trn3": (1.0, 0.4)},
                (torch.float32, False): {"trn1": (0.45, 0.0), "trn2": (0.45, 0.0), "trn3": (0.5, 0.3)},
                (torch.float32, True): {"trn1": (0.15, 1.0), "trn2": (0.1, 1.0), "trn3": (0.25, 1.0)}}
    assert shares == expected[(dtype, fused)]


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_layer_norm_backward_makes_a_share_of_dx_on_vector_as_the_model_prices_it(target):
    # kernels/layer_norm_backward.py _dx_vector_share: a share of each row's dx made by one
    # VectorE scalar_tensor_tensor, dx = g * r + a'' with a'' = xhat * (-m2 r) - m1 r, in
    # place of GpSimd's t = a + g and ScalarE's t * r, where that leaves the busiest engine
    # least busy by the model's figures: none on trn1 (no 16-bit performance mode, VectorE
    # already the busiest), a share on trn2 and trn3 (until session 62 none anywhere). The
    # new instructions cost what the estimate charges them (a'' at the 16-bit tensor_scalar
    # rate, the scalar_tensor_tensor two passes); the gradients are float64-close.
    from nki_kernels import _kernel_sources
    from nki_kernels.simulator.cost.model import compute_cost
    from nki_kernels.simulator.hardware import get_target
    from nki_kernels import references

    backward = _kernel_sources.load("layer_norm_backward", "simulator")
    engine_costs = _kernel_sources.load("engine_costs", "simulator")
    rows, hidden = 512, 4096
    x, dy = torch.randn(rows, hidden).bfloat16(), torch.randn(rows, hidden).bfloat16()
    w, b = (1 + 0.1 * torch.randn(hidden)).bfloat16(), torch.randn(hidden).bfloat16()
    stats = references.layer_norm_stats(x, (hidden,), 1e-5)
    call = norms.layer_norm_backward_kernel_call(dy, x, stats, (hidden,), w, b, 1e-5)
    with simulator.activated():
        kernel = _dispatch.simulator_kernel(call)
    result = simulator.run(kernel[1], *call.tensors, target=target, **call.static)
    model = get_target(target)
    stt = [i for i in result.trace if i.op == "scalar_tensor_tensor" and i.writes[0].shape[-1] > 2]
    vector_cols = sum(i.writes[0].shape[-1] for i in stt)
    with simulator.activated(target=target):
        c = engine_costs.active()
        # one row per partition; dw on TensorE's diagonal (two products) where its
        # accumulator fits PSUM beside db's, else from p = dy * xhat (three); the planner's
        # row-sum placement
        diagonal = backward.diag_fits(hidden, other_banks=1)
        placement = backward._row_sums_on_vector(1, hidden, True, diagonal)
        share = backward._dx_vector_share(1, hidden, True, 2 if diagonal else 3, placement)
        for ins in stt:
            width = ins.writes[0].shape[-1]
            assert c.instruction_ns("vector", width, 0.5, reads_previous=True) == pytest.approx(
                compute_cost(ins, model).seconds * 1e9)
            maker = next(i for i in result.trace if i.writes and i.writes[0].alloc_id == ins.reads[2].alloc_id)
            assert c.instruction_ns("vector", width, c.vector_16bit_rate, reads_previous=True) == pytest.approx(
                compute_cost(maker, model).seconds * 1e9)
    tiling = _kernel_sources.load("tiling", "simulator")
    assert vector_cols == tiling.split_count(hidden, share) * rows // 128        # each row's VectorE cut
    assert (share > 0) == (target != "trn1")
    dx, dw, db = call.finish_outputs(result.outputs)
    leaves = [t.double().requires_grad_() for t in (x, w, b)]
    out = torch.nn.functional.layer_norm(leaves[0], (hidden,), leaves[1], leaves[2], 1e-5)
    ref_dx, ref_dw, ref_db = torch.autograd.grad(out, leaves, dy.double())
    # bf16: xhat, g, q and a (or a'') rounded to bf16 (kernels/layer_norm_backward.py
    # "Expected error"), dx once more: a few bf16 steps of the output scale
    for got, ref in ((dx, ref_dx), (dw, ref_dw), (db, ref_db)):
        torch.testing.assert_close(got.double(), ref, atol=2 ** -6 * ref.abs().max().item(), rtol=2 ** -6)


def test_layer_norm_backward_keeps_t_in_fp32_between_gpsimd_and_scalar():
    # kernels/norm_backward_dx.py split_dx, three-engine way: GpSimd's t = a + g is fp32 and
    # ScalarE's dx = t * r reads it, so dx is rounded once (module docstring). Mutation
    # testing found t in the input dtype (a second bf16 rounding) inside the numeric tests'
    # bf16 tolerance: the trace pins t's dtype.
    from nki_kernels import references

    rows, hidden = 130, 1000
    x, dy = torch.randn(rows, hidden).bfloat16(), torch.randn(rows, hidden).bfloat16()
    w, b = (1 + 0.5 * torch.randn(hidden)).bfloat16(), torch.randn(hidden).bfloat16()
    stats = references.layer_norm_stats(x, (hidden,), 1e-5)
    result = _run(norms.layer_norm_backward_kernel_call(dy, x, stats, (hidden,), w, b, 1e-5))
    sums = [i for i in result.trace if i.engine == "gpsimd" and i.op == "tensor_tensor"
            and i.attrs.get("op") == "add"]
    assert sums
    for t_maker in sums:
        assert [o.dtype for o in t_maker.reads] == ["bfloat16", "bfloat16"]
        assert t_maker.writes[0].dtype == "float32"
        # the ScalarE activation that reads this t writes dx in bf16
        readers = [i for i in result.trace if i.engine == "scalar" and i.op == "activation"
                   and any(o.alloc_id == t_maker.writes[0].alloc_id for o in i.reads)]
        assert readers and all(i.writes[0].dtype == "bfloat16" for i in readers)


def test_streamed_rms_norm_keeps_two_row_tiles_in_one_allocation_where_they_fit():
    # kernels/rms_norm.py _rms_norm_streamed: rows past 8192 columns kept in SBUF between
    # the two passes load their chunks into slots of one allocation, the row tiles taking
    # ROW_SLOTS slots in turn (_row_slots_fit), so a tile's loads need not wait for the
    # tile before to be normalised (per-chunk tiles of one allocation site rotated two
    # buffers: modeled trn2 LNC=2 bf16 [2048, 16384] 288.7 -> 214.0 us); bf16 rows of 32768
    # (two rows, the weight and the chunk scratch: 256 KiB) keep per-chunk tiles.
    def loads(rows, cols, fused):
        x, r = torch.randn(rows, cols).bfloat16(), torch.randn(rows, cols).bfloat16()
        w = torch.randn(cols).bfloat16()
        call = (norms.fused_add_rms_norm_kernel_call(x, r, w, 1e-6) if fused
                else norms.rms_norm_kernel_call(x, (cols,), w, 1e-6))
        result = _run(call)
        # pass 1's tiles of x (plain) or of s = x + residual (fused): what the squares read
        squares = [i for i in result.trace if i.engine == "scalar" and i.op == "activation"
                   and i.attrs["func"] == "square"]
        return result, [i.reads[0] for i in squares]

    for fused in (False, True):
        result, reads = loads(384, 16384, fused)       # 3 row tiles of 4 chunks
        assert len(reads) == 12
        assert len({o.alloc_id for o in reads}) == 1                    # one allocation
        slot = [o.offset // 16384 for o in reads]                       # which row slot (elements)
        assert slot == [0] * 4 + [1] * 4 + [0] * 4
        assert result.peak_sbuf_bytes_per_partition <= TRN2_SBUF
    _, reads = loads(256, 32768, False)
    assert len({o.alloc_id for o in reads}) == len(reads) == 16          # a tile per chunk


def test_rotary_vector_share_follows_the_active_generations_costs():
    # heads of at most a PSUM bank: the whole-head cut that evens out VectorE's and GpSimd's
    # estimated times for the group (kernels/engine_costs.py). Worked by hand for trn2, 16
    # heads of 128 (ns; VectorE 0.96 GHz, 150 cycles per instruction of which 70 overlap an
    # independent successor since the refit of 2026-12-06; GpSimd 1.2 GHz and 150): VectorE
    # for c heads: b's two halves 2 x (64c + 80) / 0.96, then per bank of up to 4 heads a,
    # (128w + 80) / 0.96, and a + b, which reads a, (128w + 150) / 0.96 (w heads). GpSimd for
    # n heads: 2 x (64n / 0.5 + 150) / 1.2 + 2 x (128n / 0.5 + 150) / 1.2. Cut 9: 4485 / 4980,
    # cut 10: 4885 / 4340, cut 11: 5285 / 3700: 10 (the least maximum). For 8 key heads:
    # 2006 / 3060 at 4 (b 700, a 617, a + b 690), 2646 / 2420 at 5, 3046 / 1780 at 6: 5 (the
    # same cuts at 100 / 60 cycles before the refit: 4521 / 4173 at 10, 2375 / 2253 at 5).
    # Wider heads (D > 512) keep the per-element share, rounded to the nearest head (SBUF
    # path, one instruction per pass for the group).
    from nki_kernels import _kernel_sources

    mod = _kernel_sources.load("rotary", "simulator")
    with simulator.activated(target="trn2"):
        trn2 = mod._vector_heads(16, 128)
        trn2_keys = mod._vector_heads(8, 128)
        wide = mod._vector_heads(4, 768)
    with simulator.activated(target="trn3"):
        trn3 = mod._vector_heads(16, 128)
    assert trn2[0] == 10 and trn2[1] == 4   # 10 of 16 heads, 4 heads (one PSUM bank) per step
    assert trn2_keys[0] == 5
    assert wide[0] == 3 and wide[1] == 4    # SBUF path: one instruction pair for the group
    assert trn3[0] == 11                    # trn3: VectorE at 1.2 GHz, as GpSimd


def test_rotary_vector_path_reads_cos_and_sin_from_psum_tables():
    # kernels/rotary.py: cos and the signed sin copied once per position tile to fp32 PSUM
    # (ScalarE), so each of VectorE's three products and sums has one input in PSUM (one
    # pass instead of two); GpSimd, which cannot read PSUM, reads SBUF only. The result is
    # the fp32 reference's, rounded once.
    q, k = torch.randn(1, 32, 256, 128).bfloat16(), torch.randn(1, 8, 256, 128).bfloat16()
    cos, sin = torch.randn(256, 128).bfloat16(), torch.randn(256, 128).bfloat16()
    result = _run(rotary.apply_rotary_pos_emb_kernel_call(q, k, cos, sin))
    tables = [i for i in result.trace if i.engine == "scalar" and i.writes[0].buffer == "psum"]
    assert len(tables) == 2 * 2 and all(i.writes[0].dtype == "float32" for i in tables)    # 2 position tiles
    vector = [i for i in result.trace if i.engine == "vector" and i.op == "tensor_tensor"]
    gpsimd = [i for i in result.trace if i.engine == "gpsimd" and i.op == "tensor_tensor"]
    assert vector and gpsimd
    assert all(sum(o.buffer == "psum" for o in i.reads) == 1 for i in vector)
    assert all(o.buffer == "sbuf" for i in gpsimd for o in i.reads + i.writes)
    # per position tile: q's two groups of 16 (10 heads on VectorE: banks of 4, 4, 2) and
    # k's 8 (5: 4, 1); b for the group's VectorE heads in two halves, a and a + b per bank
    assert len(vector) == 2 * ((2 + 2 * 3) * 2 + (2 + 2 * 2))
    for x, got in zip((q, k), result.outputs):
        c, s_ = cos.double(), sin.double()
        ref = x.double() * c + torch.cat((-x.double()[..., 64:], x.double()[..., :64]), -1) * s_
        torch.testing.assert_close(got.double(), ref.to(torch.bfloat16).double(), atol=0, rtol=2 ** -8)


def test_softmax_scaling_share_follows_the_active_generations_costs():
    # e * (1/sum) goes where it evens out VectorE and ScalarE: with ViT's short rows the
    # per-row exps' fixed cost (trn2 ScalarE) leaves all of it to VectorE; long rows split
    # near the per-element balance; the share always stays in [0, 1]
    from nki_kernels import _kernel_sources

    mod = _kernel_sources.load("softmax", "simulator")
    with simulator.activated(target="trn2"):
        short = mod._scaling_vector_share(10, 197, True)
        long = mod._scaling_vector_share(1, 2048, True)
        tiny = mod._scaling_vector_share(1, 1, False)
    with simulator.activated(target="trn1"):
        short_trn1 = mod._scaling_vector_share(10, 197, True)
    assert short == 1.0
    assert 0.5 < long < 0.75
    assert 0.0 <= tiny <= 1.0
    assert short_trn1 < short   # trn1's ScalarE fixed cost is 100 cycles, not 360


def test_softmax_takes_the_block_form_where_scalare_fixed_costs_dominate():
    # trn2's ScalarE pays 360 cycles per instruction: for ViT's 10 rows of 197 per partition
    # one exp per group of rows (after GpSimd subtracts each row's max) beats one exp per
    # row; on trn1 (100 cycles) the per-row form stays ahead; one row per partition never
    # takes the block form. Its scaling spreads over all three engines.
    from nki_kernels import _kernel_sources

    mod = _kernel_sources.load("softmax", "simulator")
    with simulator.activated(target="trn2"):
        assert mod._block_exp_time(10, 197, True) < mod._row_exp_time(10, 197, True)
        assert mod._block_exp_time(1, 2048, True) > mod._row_exp_time(1, 2048, True)
        engines, _ = mod._block_scaling(10, 197, True)
    with simulator.activated(target="trn1"):
        assert mod._block_exp_time(10, 197, True) > mod._row_exp_time(10, 197, True)
    assert len(engines) == 10 and set(engines) == {mod.VECTOR, mod.SCALAR, mod.GPSIMD}


def test_layer_norm_backward_places_its_row_sums_by_engine_time_and_chain():
    # where sum(g) and sum(q) go (VectorE: one tensor_reduce per block; ScalarE: one
    # accumulating copy per row), _row_sums_on_vector's estimate: (g, q) on VectorE. Rows of
    # 768 and 1024 (ViT; 2 and 1 per partition): both on ScalarE, whose per-row sums keep
    # the block's chain short and VectorE free; 128 and 256 columns (8 and 4 rows, ScalarE's
    # 360-cycle fixed cost per row against VectorE's 48 in a stream): both on VectorE (at
    # 256 columns sum(g) went to ScalarE from the refit of 2026-12-06, which made VectorE's
    # interval 80 cycles and an isolated instruction 150, until trn2's VectorE was read off
    # the v5 profile, 2026-12-08: 65 and 48); fp32 1000: both on
    # ScalarE. trn1 (ScalarE's fixed cost 100 cycles): ScalarE at 128 columns too.
    from nki_kernels import _kernel_sources

    mod = _kernel_sources.load("layer_norm_backward", "simulator")
    with simulator.activated(target="trn2"):
        assert mod._row_sums_on_vector(2, 768, True, True) == (False, False)
        assert mod._row_sums_on_vector(1, 1024, True, True) == (False, False)
        assert mod._row_sums_on_vector(4, 256, True, True) == (True, True)
        assert mod._row_sums_on_vector(8, 128, True, True) == (True, True)
        assert mod._row_sums_on_vector(1, 1000, False, True) == (False, False)
    with simulator.activated(target="trn1"):
        assert mod._row_sums_on_vector(8, 128, True, True) == (False, False)


def test_layer_norm_fp32_affine_split_follows_the_generations_clocks():
    # kernels/layer_norm.py _fp32_vector_share: VectorE (statistics pass + a two-input
    # pass per parameter) and GpSimd (a two-input pass per parameter) end together by the
    # active generation's clocks: trn2 (0.96 / 1.2 GHz) and trn1 (1.12 / 1.4) share the
    # ratio, trn3 (1.2 / 1.2) gives VectorE more
    from nki_kernels import _kernel_sources

    mod = _kernel_sources.load("layer_norm", "simulator")
    expected = {"trn2": (0.3056, 0.1667), "trn1": (0.3056, 0.1667), "trn3": (0.375, 0.25)}
    for target, (both, weight_only) in expected.items():
        with simulator.activated(target=target):
            assert mod._fp32_vector_share(2) == pytest.approx(both, abs=1e-4), target
            assert mod._fp32_vector_share(1) == pytest.approx(weight_only, abs=1e-4), target
            assert mod._fp32_vector_share(0) == 0.0


def _layer_norm_bf16_trace(rows, hidden, target, n_params):
    """The instruction trace of a bf16 layer_norm launch at LNC=1 on ``target`` with
    ``n_params`` of (weight, bias), fresh random inputs."""
    x = torch.randn(rows, hidden).to(torch.bfloat16)
    params = [torch.randn(hidden).to(torch.bfloat16) for _ in range(n_params)] + [None] * (2 - n_params)
    call = norms.layer_norm_kernel_call(x, (hidden,), *params)
    assert call.kernel == "layer_norm_kernel"
    with simulator.activated(target=target):
        kernel = _dispatch.simulator_kernel(call)
    return simulator.run(kernel[1], *[t.contiguous() for t in call.tensors], target=target, **call.static).trace


@pytest.mark.parametrize("target, gpsimd_cols", [("trn2", 385), ("trn3", 333), ("trn1", 556)])
def test_layer_norm_16bit_affine_split_follows_the_generations_clocks(target, gpsimd_cols):
    # kernels/layer_norm.py _vector_share_16: VectorE and GpSimd end the 16-bit affine step
    # together. A two-input 16-bit pass: VectorE one element per cycle with its 2x mode
    # (trn2 0.96 GHz, trn3 1.2), half without (trn1: 1.12 GHz -> 0.56), GpSimd half (1.2,
    # 1.2, 1.4 GHz -> 0.6, 0.6, 0.7): VectorE's share 0.96 / 1.56, 1.2 / 1.8, 0.56 / 1.26, so
    # of 1000 columns GpSimd takes 385, 333 and 556 (the constants before session 58: 450
    # with weight and bias, 700 with a weight only, on every generation)
    from nki_kernels import _kernel_sources

    mod = _kernel_sources.load("layer_norm", "simulator")
    with simulator.activated(target=target):
        assert 1000 - round(1000 * mod._vector_share_16()) == gpsimd_cols
    for n_params in (1, 2):
        trace = _layer_norm_bf16_trace(1000, 1000, target, n_params)
        widths = {e: {i.writes[0].shape[-1] for i in trace if i.op == "tensor_tensor" and i.engine == e}
                  for e in ("vector", "gpsimd")}
        assert widths == {"vector": {1000 - gpsimd_cols}, "gpsimd": {gpsimd_cols}}, n_params


def test_layer_norm_16bit_statistics_split_follows_the_engines_costs():
    # kernels/layer_norm.py _scalar_stats_share: the mean of two balances of a slot's
    # statistics between ScalarE (two passes and an rsqrt) and VectorE (bn_stats, bn_aggr;
    # then ScalarE's rsqrt). Worked by hand for trn2, 256 columns, 8 rows per partition, no
    # weight (ns; ScalarE 1.2 GHz and 360 cycles per instruction, VectorE 0.96 GHz and 65,
    # 17 of which overlap an independent successor since trn2's VectorE was read off the v5
    # profile, 2026-12-08; 150 and 70 from the refit of 2026-12-06, 100 and 60 before):
    # ScalarE pass (256 + 360) / 1.2 = 513.3, rsqrt (64 + 360) / 1.2 = 353.3, S = 1380.0;
    # VectorE bn_stats (256 + 48) / 0.96 = 316.7, bn_aggr (64 + 48) / 0.96 = 116.7, V =
    # 433.3; y (256 / 4 + 48) / 0.96 = 116.7. Latency (V - r) / (S - r + V) = 0.0548,
    # throughput (V + y - r) / (S - r + V) = 0.1347: 0.0947 (0.1452 at 150 / 70, 0.0814
    # at 100 / 60).
    from nki_kernels import _kernel_sources

    mod = _kernel_sources.load("layer_norm", "simulator")
    with simulator.activated(target="trn2"):
        assert mod._scalar_stats_share(8, 256, 0) == pytest.approx(0.0947, abs=1e-3)
        short, long_rows = mod._scalar_stats_share(8, 256, 2), mod._scalar_stats_share(1, 4096, 2)
        # ScalarE's 360-cycle fixed cost is most of a short row's pass: short rows mostly on VectorE
        assert short < 0.35 < long_rows
        # VectorE's affine share adds to its work per block: more slots to ScalarE with one
        assert mod._scalar_stats_share(8, 256, 2) > mod._scalar_stats_share(8, 256, 1) > \
            mod._scalar_stats_share(8, 256, 0)
    with simulator.activated(target="trn1"):
        # trn1: ScalarE's fixed cost is 100 cycles and VectorE has no 16-bit mode
        assert mod._scalar_stats_share(8, 256, 2) > 0.5 > short
    # the kernel follows it: slots whose statistics ScalarE takes square on ScalarE (one
    # square pass each), spread evenly over each part's row slots (4096 rows of 256: two
    # parts of 2048 rows = 16 row slots of 128 each per part)
    for target in ("trn2", "trn1"):
        with simulator.activated(target=target):
            share = mod._scalar_stats_share(8, 256, 2)
        trace = _layer_norm_bf16_trace(4096, 256, target, 2)
        squares = [i for i in trace if i.engine == "scalar" and i.op == "activation" and i.attrs["func"] == "square"]
        assert len(squares) == 2 * int(16 * share), (target, share)


def test_layer_norm_drain_block_output_has_a_buffer_of_its_own():
    # kernels/layer_norm.py: the program's last block (stored row slot by row slot) takes
    # its output tile from an allocation site of its own, so the compiler's rotation of two
    # buffers per site does not make its first y wait for the store of the block two back
    # (ViT-B at LNC=1: blocks of 3 rows per partition and one 40-row tail; the drain is the
    # program's last block)
    x = torch.randn(1576, 768).to(torch.bfloat16)
    call = norms.layer_norm_kernel_call(x, (768,), torch.randn(768).bfloat16(), torch.randn(768).bfloat16())
    with simulator.activated(target="trn2"):
        kernel = _dispatch.simulator_kernel(call)
    result = simulator.run(kernel[1], *[t.contiguous() for t in call.tensors], target="trn2", **call.static)
    site_of = {a.alloc_id: a.site for a in result.allocations}
    stores = [i for i in result.trace if i.op == "dma_copy" and i.writes[0].buffer == "hbm"]
    sources = {i.index: next(o for o in i.reads if o.buffer == "sbuf") for i in stores}
    block_sites = {site_of[o.alloc_id] for o in sources.values() if o.shape == (128, 3, 768)}
    slot_sites = {site_of[o.alloc_id] for o in sources.values() if o.shape == (128, 768)}
    assert len(block_sites) == 1 and len(slot_sites) == 1 and block_sites != slot_sites
    # one drain per program: the last part's last block, three slot stores
    assert sum(o.shape == (128, 768) for o in sources.values()) == 3


def test_path_segments_split_rows_or_columns_at_the_rounded_cumulative_shares():
    # the engine split of the row kernels (kernels/tiling.py): whole rows when a partition
    # holds several, else columns; cut points at round(n * (a)), round(n * (a + g)); empty
    # paths dropped; the two-path form is engine_segments
    from nki_kernels import _kernel_sources

    _kernel_sources.load("rms_norm", "simulator")
    tiling = sys.modules["nki_kernels._nki_src_simulator.tiling"]
    assert tiling.path_segments(1, 1000, (0.5, 0.3)) == [(0, 0, 500, 0), (0, 500, 800, 1), (0, 800, 1000, 2)]
    assert tiling.path_segments(5, 64, (0.5, 0.3)) == [(0, 0, 64, 0), (1, 0, 64, 0), (2, 0, 64, 1),
                                                      (3, 0, 64, 1), (4, 0, 64, 2)]
    assert tiling.path_segments(2, 64, (0.5, 0.3)) == [(0, 0, 64, 0), (1, 0, 64, 1)]     # no rest
    assert tiling.path_segments(1, 10, (0.0, 0.0)) == [(0, 0, 10, 2)]
    assert tiling.engine_segments(1, 1000, 0.55) == [(0, 0, 550, True), (0, 550, 1000, False)]
    assert tiling.engine_segments(3, 64, 0.5) == [(0, 0, 64, True), (1, 0, 64, True), (2, 0, 64, False)]


def test_drain_chunks_cut_rows_into_equal_chunks_of_at_least_the_given_transfer():
    # kernels/tiling.py drain_chunks (the norms' last block): each row slot in as many
    # equal column chunks of >= min_bytes per partition as it holds (the DMA guide's 2 KiB
    # recommended for the backwards, 4 KiB saturating for the forwards); rows shorter than
    # that are not cut (an empty plan: the block is stored whole)
    from nki_kernels import _kernel_sources

    _kernel_sources.load("rms_norm_backward", "simulator")
    tiling = sys.modules["nki_kernels._nki_src_simulator.tiling"]
    assert (tiling.DMA_RECOMMENDED_BYTES, tiling.DMA_SATURATING_BYTES) == (2048, 4096)
    assert tiling.drain_chunks(1, 4096, 2, 2048) == [(0, 0, 1024), (0, 1024, 2048), (0, 2048, 3072), (0, 3072, 4096)]
    assert tiling.drain_chunks(1, 3000, 4, 2048) == [(0, c, c + 600) for c in range(0, 3000, 600)]   # 2400 B each
    assert tiling.drain_chunks(2, 1100, 2, 2048) == [(0, 0, 1100), (1, 0, 1100)]                  # 2200 B: one per row
    assert tiling.drain_chunks(1, 1023, 2, 2048) == []                                            # 2046 B: not cut
    assert tiling.drain_chunks(3, 768, 2, 2048) == []
    assert tiling.drain_chunks(1, 4096, 2, 4096) == [(0, 0, 2048), (0, 2048, 4096)]
    assert tiling.drain_chunks(2, 1024, 2, 4096) == []

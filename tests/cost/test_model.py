"""The cost model's behaviour, pinned on hand-built instruction traces.

Every expected number is derived here from the documented rules (docs/cost-model.md) and
the trn2 table in simulator/hardware.py, never copied from the model's output.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from nki_kernels.simulator.cost import CostModelError, compute_cost, dma_cost, estimate_trace
from nki_kernels.simulator.cost.schedule import _dma_site_queues
from nki_kernels.simulator.trace import AllocationSite
from nki_kernels.simulator.hardware import TARGETS
from tests.cost._build import TraceBuilder, hbm, new_alloc, psum, sbuf

TRN2 = TARGETS["trn2"]
# trn2's DMA queues as trn1 still runs them (and trn2 did until 2026-12-08): one queue per
# engine, no descriptor-generator stage; the tests of the queue rules start from it
ONE_QUEUE = dataclasses.replace(TRN2, dma_site_queues=1, dma_descriptor_generation_s=0.0)
# TensorE at its steady rate: these tests pin the per-instruction rules; the throttle a
# burst starts under is a schedule rule of its own (tests/cost/test_tensor_throttle.py)
TRN2_STEADY = dataclasses.replace(TRN2, tensor_throttle_start_rate=None)
US = 1e6


def _matmul_trace(n_moving: int, dtype: str = "bfloat16", count: int = 1, m: int = 128, k: int = 128):
    b = TraceBuilder()
    st = sbuf("stationary", new_alloc(), (k, m), dtype)
    for _ in range(count):
        mv = sbuf("moving", new_alloc(), (k, n_moving), dtype)
        b.matmul(psum("dst", new_alloc(), (m, n_moving)), st, mv)
    return b.trace


# ----------------------------------------------------------------------------- TensorE

@pytest.mark.parametrize("n", [64, 128, 300, 512])
def test_matmul_time_is_moving_size_cycles(n):
    est = estimate_trace(_matmul_trace(n), TRN2_STEADY)
    assert est.latency_us == pytest.approx(n / TRN2.tensor_hz * US)
    assert est.engine_busy_us["tensor"] == pytest.approx(est.latency_us)
    assert est.bottleneck == "tensor"


def test_matmul_time_scales_with_moving_size():
    t = {n: estimate_trace(_matmul_trace(n, count=8), TRN2_STEADY).latency_us for n in (128, 256, 512)}
    assert t[256] == pytest.approx(2 * t[128])
    assert t[512] == pytest.approx(4 * t[128])


def test_small_matmul_is_floored_by_min_of_64_and_stationary_size():
    # max(min(64, M), N): a 16-column moving tile still costs 64 cycles with M=128 ...
    assert estimate_trace(_matmul_trace(16), TRN2_STEADY).latency_us == pytest.approx(64 / TRN2.tensor_hz * US)
    # ... but only M cycles when the stationary tile is narrower than 64.
    assert estimate_trace(_matmul_trace(16, m=32), TRN2_STEADY).latency_us == pytest.approx(32 / TRN2.tensor_hz * US)


def test_fp32_matmul_costs_four_times_bf16():
    bf16 = estimate_trace(_matmul_trace(512, "bfloat16", count=4), TRN2_STEADY).latency_us
    fp32 = estimate_trace(_matmul_trace(512, "float32", count=4), TRN2_STEADY).latency_us
    assert fp32 == pytest.approx(4 * bf16)


def test_matmul_peak_matches_the_documented_tflops():
    # 128x128x512 bf16 matmuls back to back run at 2*128*128*2.4 GHz = 78.6 TFLOPS (79 documented).
    est = estimate_trace(_matmul_trace(512, count=16), TRN2_STEADY)
    tflops = est.matmul_flops / (est.latency_us / US) / 1e12
    assert tflops == pytest.approx(2 * 128 * 128 * TRN2.tensor_hz / 1e12)
    assert tflops == pytest.approx(TRN2.tensor_peak_bf16_flops / 1e12, rel=0.01)


def test_tensor_engine_transpose_rule():
    b = TraceBuilder()
    data = sbuf("data", new_alloc(), (128, 40), "bfloat16")
    b._add("nc_transpose", "tensor", [data], [psum("dst", new_alloc(), (40, 128), "bfloat16")])
    data32 = sbuf("data", new_alloc(), (96, 100), "float32")
    b._add("nc_transpose", "tensor", [data32], [psum("dst", new_alloc(), (100, 96), "float32")])
    c_bf16 = compute_cost(b.trace[0], TRN2)
    c_fp32 = compute_cost(b.trace[1], TRN2)
    assert c_bf16.cycles == max(128, min(64, 40))
    assert c_fp32.cycles == max(96, min(64, 100)) * 2      # v3 transpose mode: fp32 x2
    assert compute_cost(b.trace[1], TARGETS["trn1"]).cycles == 96 * 4  # v2: no transpose mode


def test_a_matmul_with_one_fp32_operand_runs_at_the_fp32_rate():
    # read off the operands when the trace carries no fp32 attribute
    b = TraceBuilder()
    st = sbuf("stationary", new_alloc(), (128, 128), "float32")
    b._add("nc_matmul", "tensor", [st, sbuf("moving", new_alloc(), (128, 512), "bfloat16")],
           [psum("dst", new_alloc(), (128, 512))], K=128, M=128, N=512)
    assert compute_cost(b.trace[0], TRN2).cycles == 512 * TRN2.matmul_fp32_factor


def test_a_matmul_marked_is_transpose_is_priced_as_a_transpose():
    # nc_matmul(is_transpose=True) against the identity is TensorE's transpose: the
    # transpose rule max(P, min(64, F)), not a matmul's max(min(64, M), N)
    # (the two rules agree in bf16; an fp32 transpose takes transpose mode's factor, a
    # matmul fp32's four passes)
    b = TraceBuilder()
    data = sbuf("stationary", new_alloc(), (128, 40), "float32")
    b._add("nc_matmul", "tensor", [data, sbuf("moving", new_alloc(), (128, 128), "float32")],
           [psum("dst", new_alloc(), (40, 128), "float32")], is_transpose=True)
    assert TRN2.transpose_fp32_factor != TRN2.matmul_fp32_factor
    assert compute_cost(b.trace[0], TRN2).cycles == max(128, min(64, 40)) * TRN2.transpose_fp32_factor


# ------------------------------------------------------------------ Vector/Scalar/GpSimd

def _one(op_builder):
    b = TraceBuilder()
    op_builder(b)
    return compute_cost(b.trace[-1], TRN2)


S = TRN2.vector_static_cycles   # fixed cycles of a VectorE instruction
SA = TRN2.scalar_static_cycles  # ... of a ScalarE one
SG = TRN2.gpsimd_static_cycles  # ... of a GpSimd one


def test_activation_cost_is_max_64_n_plus_static_overhead():
    for n, expect in [(2048, 2048 + SA), (10, 64 + SA)]:
        cost = _one(lambda b: b.activation(sbuf("dst", new_alloc(), (128, n)), sbuf("data", new_alloc(), (128, n))))
        assert cost.cycles == expect
        assert cost.seconds == pytest.approx(expect / TRN2.scalar_hz)


def test_activation_accumulator_readout_adds_64_cycles():
    cost = _one(lambda b: b.activation(sbuf("dst", new_alloc(), (128, 512)), sbuf("data", new_alloc(), (128, 512)),
                                       reduce_res=sbuf("reduce_res", new_alloc(), (128, 1), "float32")))
    assert cost.cycles == 512 + 64 + SA


def test_partial_partition_tiles_cost_as_much_as_full_ones():
    full = _one(lambda b: b.activation(sbuf("dst", new_alloc(), (128, 700)), sbuf("data", new_alloc(), (128, 700))))
    part = _one(lambda b: b.activation(sbuf("dst", new_alloc(), (69, 700)), sbuf("data", new_alloc(), (69, 700))))
    assert part.cycles == full.cycles
    assert (part.lanes, full.lanes) == (69, 128)


def test_vector_two_inputs_cost_twice_one_input_in_fp32():
    tt = _one(lambda b: b.tensor_tensor(sbuf("dst", new_alloc(), (128, 1000), "float32"),
                                        sbuf("data1", new_alloc(), (128, 1000), "float32"),
                                        sbuf("data2", new_alloc(), (128, 1000), "float32")))
    cp = _one(lambda b: b.tensor_copy(sbuf("dst", new_alloc(), (128, 1000), "float32"),
                                      sbuf("src", new_alloc(), (128, 1000), "float32")))
    assert tt.cycles - S == 2 * 1000
    assert cp.cycles - S == 1000


def test_vector_performance_mode_on_trn2_only():
    def copy(b):
        b.tensor_copy(sbuf("dst", new_alloc(), (128, 1024)), sbuf("src", new_alloc(), (128, 1024)))

    b = TraceBuilder()
    copy(b)
    assert compute_cost(b.trace[0], TRN2).cycles == 1024 / 4 + S           # 4x: 16-bit, all SBUF
    s1 = TARGETS["trn1"].vector_static_cycles
    assert compute_cost(b.trace[0], TARGETS["trn1"]).cycles == 1024 + s1   # v2 has no perf mode
    from_psum = _one(lambda b: b.tensor_copy(sbuf("dst", new_alloc(), (128, 1024)),
                                             psum("src", new_alloc(), (128, 1024), "bfloat16")))
    assert from_psum.cycles == 1024 / 2 + S                                 # 2x: one side in PSUM
    tt = _one(lambda b: b.tensor_tensor(sbuf("dst", new_alloc(), (128, 1024)), sbuf("data1", new_alloc(), (128, 1024)),
                                        sbuf("data2", new_alloc(), (128, 1024))))
    assert tt.cycles == 2 * 1024 / 2 + S                                    # tensor_tensor 2x


def test_perf_mode_ignores_per_partition_scalar_operands():
    # tensor_scalar(bf16 -> bf16) with a (P, 1) fp32 operand still qualifies for the 4x mode
    cost = _one(lambda b: b._add("tensor_scalar", "vector",
                                 [sbuf("data", new_alloc(), (128, 1024)), sbuf("operand0", new_alloc(), (128, 1), "float32")],
                                 [sbuf("dst", new_alloc(), (128, 1024))]))
    assert cost.cycles == 1024 / 4 + S


def _quantize(data_dtype="bfloat16", data_buffer=sbuf, dst_dtype="float8_e4m3"):
    """tensor_scalar [128, 1024] data -> dst (x * scale, a (P, 1) fp32 operand), as a row
    quantization issues it."""
    return lambda b: b._add("tensor_scalar", "vector",
                            [data_buffer("data", new_alloc(), (128, 1024), data_dtype),
                             sbuf("operand0", new_alloc(), (128, 1), "float32")],
                            [sbuf("dst", new_alloc(), (128, 1024), dst_dtype)])


@pytest.mark.parametrize("dst_dtype", ["float8_e4m3", "float8_e4m3fn", "float8_e5m2"])
def test_perf_mode_takes_an_fp8_output_from_16bit_inputs(dst_dtype):
    # hardware.py vector_perf_mode_8bit_dst: bf16 -> fp8 runs at the 16-bit output's rate
    assert _one(_quantize(dst_dtype=dst_dtype)).cycles == 1024 / 4 + S
    assert _one(_quantize(data_buffer=psum, data_dtype="bfloat16", dst_dtype=dst_dtype)).cycles == 1024 / 2 + S
    off = dataclasses.replace(TRN2, vector_perf_mode_8bit_dst=False)
    b = TraceBuilder()
    _quantize(dst_dtype=dst_dtype)(b)
    assert compute_cost(b.trace[0], off).cycles == 1024 + S


def test_perf_mode_is_not_taken_by_fp8_or_fp32_inputs():
    assert _one(_quantize(data_dtype="float8_e4m3", dst_dtype="bfloat16")).cycles == 1024 + S
    assert _one(_quantize(data_dtype="float32")).cycles == 1024 + S


def test_tensor_tensor_with_one_psum_input_costs_n():
    tt = _one(lambda b: b.tensor_tensor(sbuf("dst", new_alloc(), (128, 512), "float32"),
                                        psum("data1", new_alloc(), (128, 512)),
                                        sbuf("data2", new_alloc(), (128, 512), "float32")))
    assert tt.cycles == 512 + S
    # performance mode needs both inputs in SBUF: 16-bit inputs both in PSUM run at the
    # rate of two SBUF inputs without it
    both = _one(lambda b: b.tensor_tensor(sbuf("dst", new_alloc(), (128, 512), "bfloat16"),
                                          psum("data1", new_alloc(), (128, 512), "bfloat16"),
                                          psum("data2", new_alloc(), (128, 512), "bfloat16")))
    sbuf16 = _one(lambda b: b.tensor_tensor(sbuf("dst", new_alloc(), (128, 512), "bfloat16"),
                                            sbuf("data1", new_alloc(), (128, 512), "bfloat16"),
                                            sbuf("data2", new_alloc(), (128, 512), "bfloat16")))
    assert both.cycles - S == (sbuf16.cycles - S) * TRN2.vector_perf_mode_half


def test_scalar_tensor_tensor_prices_its_inputs_like_tensor_tensor():
    # "approximately the same latency as a regular tensor_tensor instruction" (its NKI 0.7
    # docstring): N with one full-size input in PSUM and the other in SBUF, 2N with both in
    # SBUF; the (P, 1) scalar operand is not a full-size input
    def stt(b, data_buf):
        b._add("scalar_tensor_tensor", "vector",
               [data_buf("data", new_alloc(), (128, 512), "float32"),
                sbuf("operand0", new_alloc(), (128, 1), "float32"),
                sbuf("operand1", new_alloc(), (128, 512), "bfloat16")],
               [sbuf("dst", new_alloc(), (128, 512), "bfloat16")], op0="multiply", op1="multiply")

    assert _one(lambda b: stt(b, psum)).cycles == 512 + S
    assert _one(lambda b: stt(b, sbuf)).cycles == 2 * 512 + S

    # the 2x performance mode (every operand 16-bit, both inputs in SBUF) is tensor_tensor's
    # alone in the architecture guide's list
    def all_bf16(b, op):
        b._add(op, "vector", [sbuf("data", new_alloc(), (128, 512), "bfloat16"),
                              sbuf("operand1", new_alloc(), (128, 512), "bfloat16")],
               [sbuf("dst", new_alloc(), (128, 512), "bfloat16")], op0="multiply", op1="add", op="add")

    assert _one(lambda b: all_bf16(b, "tensor_tensor")).cycles == 512 + S
    assert _one(lambda b: all_bf16(b, "scalar_tensor_tensor")).cycles == 2 * 512 + S


def test_scalar_tensor_tensor_bf16_subtract_then_multiply_is_one_pass():
    # "N: data and operand1 are both bfloat16, op0=nl.subtract and op1=nl.multiply, and N is
    # even; 2*N otherwise" [S] scalar_tensor_tensor
    def stt(n=512, data_dtype="bfloat16", op1="multiply", op0="subtract"):
        return _one(lambda b: b._add(
            "scalar_tensor_tensor", "vector",
            [sbuf("data", new_alloc(), (128, n), data_dtype), sbuf("operand0", new_alloc(), (128, 1), "float32"),
             sbuf("operand1", new_alloc(), (128, n), "bfloat16")],
            [sbuf("dst", new_alloc(), (128, n), "bfloat16")], op0=op0, op1=op1)).cycles

    assert stt() == 512 + S
    assert stt(n=511) == 2 * 511 + S                   # N odd
    assert stt(data_dtype="float32") == 2 * 512 + S    # data not bf16
    assert stt(op1="add") == 2 * 512 + S
    assert stt(op0="add") == 2 * 512 + S


def test_tensor_copy_predicated_with_one_side_in_psum_is_one_pass():
    # "max(MIN_II, N): If src is from SBUF and predicate is from PSUM or the other way
    # around"; "max(MIN_II, 2N)" otherwise [S] tensor_copy_predicated
    def pred(src_buf, pred_buf):
        return _one(lambda b: b._add(
            "tensor_copy_predicated", "vector",
            [src_buf("src", new_alloc(), (128, 512), "float32"), pred_buf("predicate", new_alloc(), (128, 512), "uint8")],
            [sbuf("dst", new_alloc(), (128, 512), "float32")])).cycles

    assert pred(sbuf, psum) == 512 + S
    assert pred(psum, sbuf) == 512 + S
    assert pred(sbuf, sbuf) == 2 * 512 + S


def test_trn1_halves_an_instruction_whose_operand_strides_past_16_bytes():
    # NeuronCore-v2 "Access pattern" [A1]: "If the most-minor F dimension stride exceeds 16
    # bytes, the achievable bandwidth of each tensor read/write interface will be half of
    # the peak bandwidth ... roughly 50% performance hit"; a 16-byte stride (4 fp32 elements)
    # still runs at the peak; the v3/v4 guides state no such rule
    trn1 = TARGETS["trn1"]

    def copy(step, target, engine="vector", dtype="float32"):
        b = TraceBuilder()
        b._add("tensor_copy", engine, [sbuf("src", new_alloc(), (128, 256), dtype, strides=(4096, step))],
               [sbuf("dst", new_alloc(), (128, 256), dtype)])
        return compute_cost(b.trace[0], target).cycles - target.static_cycles(engine)

    assert copy(1, trn1) == copy(4, trn1) == 256                # 4 and 16 bytes
    assert copy(5, trn1) == 2 * 256                              # 20 bytes
    assert copy(9, trn1, dtype="bfloat16") == 2 * 256            # 18 bytes
    assert copy(8, trn1, dtype="bfloat16") == 256                # 16 bytes
    assert copy(5, trn1, engine="scalar") == 2 * 256
    assert copy(5, trn1, engine="gpsimd") == 2 * 256
    # a strided destination counts too (each read/write interface)
    b = TraceBuilder()
    b._add("tensor_copy", "vector", [sbuf("src", new_alloc(), (128, 256), "float32")],
           [sbuf("dst", new_alloc(), (128, 256), "float32", strides=(4096, 8))])
    assert compute_cost(b.trace[0], trn1).cycles == 2 * 256 + trn1.vector_static_cycles
    assert copy(5, TRN2) == 256          # trn2: no such rule (and fp32 has no performance mode)

    # the per-element work doubles, not the minimum (64), a read-out or GpSimd's startup
    def one(op, engine, n, reads_extra=(), writes_extra=(), **attrs):
        b = TraceBuilder()
        b._add(op, engine, [sbuf("data", new_alloc(), (128, n), "float32", strides=(4096, 5))] + list(reads_extra),
               [sbuf("dst", new_alloc(), (128, n), "float32")] + list(writes_extra), **attrs)
        own_start = op == "affine_select"
        return compute_cost(b.trace[0], trn1).cycles - (0 if own_start else trn1.static_cycles(engine))

    assert one("tensor_copy", "vector", 8) == 64                       # max(64, 2 x 8)
    assert one("activation", "scalar", 8) == 64                        # ScalarE's max(64, N) too
    assert one("activation", "scalar", 48, writes_extra=[sbuf("reduce_res", new_alloc(), (128, 1), "float32")]) \
        == 96 + trn1.activation_readout_cycles                         # the read-out is not doubled
    assert one("tensor_scalar_reduce", "vector", 100) == 200 + trn1.vector_reduce_readout_cycles
    assert one("affine_select", "gpsimd", 8) == 150 + 16               # the 150 startup once


def test_a_tfloat32_matmul_runs_at_the_bf16_rate():
    # "max(min(64, N_stationary), N_moving)" for "float8_e4m3/float8_e5m2/bfloat16/float16/
    # tfloat32", "4 * ..." for "float32" [S] nc_matmul: the simulator recorded tfloat32
    # operands as fp32 (four passes) until 2026-12-07; the trace is the simulator's own
    import torch

    from nki_kernels import simulator

    cycles = {}
    for dtype in ("bfloat16", "tfloat32", "float32"):
        with simulator.activated("trn2") as nki:
            nl, nisa = nki.language, nki.isa
            st = nl.ndarray((128, 128), dtype=getattr(nl, dtype), buffer=nl.sbuf)
            mv = nl.ndarray((128, 512), dtype=getattr(nl, dtype), buffer=nl.sbuf)
            nisa.memset(dst=st, value=0.5)
            nisa.memset(dst=mv, value=0.25)
            out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=out, stationary=st, moving=mv)
            matmul = simulator.current_trace()[-1]
            assert torch.equal(out.values(), torch.full((128, 512), 16.0))
        cycles[dtype] = compute_cost(matmul, TRN2_STEADY).cycles
    assert cycles["tfloat32"] == cycles["bfloat16"] == 512
    assert cycles["float32"] == 4 * 512


def _reduce(data_dtype, dst_dtype, op="add"):
    return _one(lambda b: b.tensor_reduce(sbuf("dst", new_alloc(), (128, 1), dst_dtype),
                                          sbuf("data", new_alloc(), (128, 2048), data_dtype), op=op))


def test_tensor_reduce_bf16_add_is_twice_as_fast():
    # [S] tensor_reduce: "N/2: both input and output data types are bfloat16 *and* the
    # reduction operator is add or maximum; N otherwise"
    assert _reduce("bfloat16", "bfloat16").cycles == 1024 + S
    assert _reduce("bfloat16", "bfloat16", op="maximum").cycles == 1024 + S
    assert _reduce("float32", "float32").cycles == 2048 + S


def test_tensor_reduce_into_fp32_from_bf16_is_not_the_fast_rate():
    # the norms' row sums: bf16 data, fp32 statistics; and a bf16 multiply-reduce
    assert _reduce("bfloat16", "float32").cycles == 2048 + S
    assert _reduce("float32", "bfloat16").cycles == 2048 + S
    assert _reduce("bfloat16", "bfloat16", op="multiply").cycles == 2048 + S


def _copy_cost(src_buffer, dst_buffer, src_strides=None, dst_strides=None, op="tensor_copy",
               shape=(128, 1024)):
    """A bf16 tensor_copy (or tensor_scalar) of 1024 elements per partition from
    ``src_buffer`` to ``dst_buffer``; strides lay one side out in a larger tile."""
    def build(b):
        src = src_buffer("src" if op == "tensor_copy" else "data", new_alloc(), shape, "bfloat16",
                         strides=src_strides)
        dst = dst_buffer("dst", new_alloc(), shape, "bfloat16", strides=dst_strides)
        b._add(op, "vector", [src], [dst])
    return _one(build).cycles


@pytest.mark.parametrize("op", ["tensor_copy", "tensor_scalar"])
def test_perf_mode_needs_a_contiguous_innermost_dimension_for_4x(op):
    # trn2 architecture guide, "Vector Engine Performance Mode": 4x needs (1a) SBUF, (1b)
    # 16-bit, (1c) "physically contiguous elements in the inner-most free dimension"; 2x
    # when 1a and 1b hold but not 1c
    strided = (2048, 2)   # every other element of a [128, 2048] tile
    assert _copy_cost(sbuf, sbuf, op=op) == 1024 / 4 + S
    assert _copy_cost(sbuf, sbuf, src_strides=strided, op=op) == 1024 / 2 + S
    assert _copy_cost(sbuf, sbuf, dst_strides=strided, op=op) == 1024 / 2 + S
    # a strided outer free dimension (4 rows of 256 out of rows of 512) with a contiguous
    # innermost one keeps 4x; size-1 dimensions do not count as the innermost
    assert _copy_cost(sbuf, sbuf, src_strides=(2048, 512, 1), op=op, shape=(128, 4, 256)) == 1024 / 4 + S
    assert _copy_cost(sbuf, sbuf, src_strides=(2048, 1, 7), op=op, shape=(128, 1024, 1)) == 1024 / 4 + S
    assert _copy_cost(sbuf, sbuf, src_strides=(4096, 4, 1), op=op, shape=(128, 1024, 1)) == 1024 / 2 + S


def test_perf_mode_from_psum_needs_contiguity_and_one_side_in_psum():
    # (2b) 2x "when both input/output tensors satisfy 1b and 1c, but one of input and
    # output tensors is in PSUM": strided with one side in PSUM, or both sides in PSUM,
    # match no listed condition
    psum16 = lambda role, alloc, shape, dtype="bfloat16", strides=None: psum(role, alloc, shape, dtype,
                                                                              strides=strides)
    assert _copy_cost(psum16, sbuf) == 1024 / 2 + S
    assert _copy_cost(psum16, sbuf, src_strides=(2048, 2)) == 1024 + S
    assert _copy_cost(sbuf, psum16, dst_strides=(2048, 2)) == 1024 + S
    assert _copy_cost(psum16, psum16) == 1024 + S


def _gather(n_valid, n_elem, dtype):
    """local_gather on GpSimd: ``n_valid`` indices per core, ``n_elem`` elements each."""
    return _one(lambda b: b._add("local_gather", "gpsimd",
                                 [sbuf("src_buffer", new_alloc(), (128, 4096), dtype),
                                  sbuf("index", new_alloc(), (128, 8), "uint16")],
                                 [sbuf("dst", new_alloc(), (128, n_valid * n_elem), dtype)],
                                 num_elem_per_idx=n_elem, num_valid_indices=n_valid))


def test_local_gather_pays_its_start_and_loop_cycles():
    # [S] local_gather: 150 + V x E x C, C = ((28 + 4E) / (4E)) / min(4 / dtype_size, E)
    # cycles per element: one element per index costs (28 + 4) / 4 = 8 cycles per index; the
    # 150 is the instruction's startup, so GpSimd's fixed cost is not added on top (it was
    # until 2026-12-07)
    assert _gather(128, 1, "float32").cycles == 150 + 128 * 8
    assert _gather(128, 1, "bfloat16").cycles == 150 + 128 * 8
    # 4 bf16 elements per index: a 4-byte word takes 2 of them, so C = (44 / 16) / 2
    assert _gather(16, 4, "bfloat16").cycles == pytest.approx(150 + 16 * 4 * (44 / 16) / 2)
    # 32 fp32 elements: one per word, C = 156 / 128
    assert _gather(8, 32, "float32").cycles == pytest.approx(150 + 8 * 32 * 156 / 128)


def test_local_gather_without_its_index_count_is_refused():
    with pytest.raises(CostModelError, match="num_valid_indices"):
        _one(lambda b: b._add("local_gather", "gpsimd",
                              [sbuf("src_buffer", new_alloc(), (128, 64), "float32")],
                              [sbuf("dst", new_alloc(), (128, 8), "float32")], num_elem_per_idx=1))


def test_memset_of_zero_into_16_bit_data_is_twice_as_fast():
    # [S] memset: "If the initialized value is zero and output data type is bfloat16/float16,
    # max(MIN_II, N/2) Vector Engine cycles; otherwise max(MIN_II, N)"
    def memset(b, dtype, value, engine="vector", n=1024):
        b._add("memset", engine, [], [sbuf("dst", new_alloc(), (128, n), dtype)], value=value)

    assert _one(lambda b: memset(b, "bfloat16", 0.0)).cycles == 512 + S
    assert _one(lambda b: memset(b, "float16", 0)).cycles == 512 + S
    assert _one(lambda b: memset(b, "bfloat16", -3.0)).cycles == 1024 + S
    assert _one(lambda b: memset(b, "float32", 0.0)).cycles == 1024 + S
    assert _one(lambda b: memset(b, "bfloat16", 0.0, n=100)).cycles == 64 + S   # MIN_II
    assert _one(lambda b: memset(b, "bfloat16", 0.0, engine="gpsimd")).cycles == 1024 + SG


def test_bn_aggr_costs_13_cycles_per_3_elements():
    # [S] bn_aggr: "max(MIN_II, 13*(N/3))": N is the bn_stats records read (6 per group)
    def aggr(b, n):
        b._add("bn_aggr", "vector", [sbuf("data", new_alloc(), (128, n), "float32")],
               [sbuf("dst", new_alloc(), (128, 2), "float32")])

    assert _one(lambda b: aggr(b, 48)).cycles == 13 * 16 + S
    assert _one(lambda b: aggr(b, 6)).cycles == 64 + S


def test_tensor_scalar_reduce_pays_the_accumulator_read_out():
    # [S] tensor_scalar_reduce: "max(MIN_II, N) + MIN_II" (activation_reduce's rule on ScalarE)
    def tsr(b, n):
        b._add("tensor_scalar_reduce", "vector",
               [sbuf("data", new_alloc(), (128, n), "bfloat16"), sbuf("operand0", new_alloc(), (128, 1), "float32")],
               [sbuf("dst", new_alloc(), (128, n), "bfloat16"), sbuf("reduce_res", new_alloc(), (128, 1), "float32")],
               op0="multiply", reduce_op="add")

    assert _one(lambda b: tsr(b, 512)).cycles == 512 + 64 + S
    assert _one(lambda b: tsr(b, 9)).cycles == 64 + 64 + S


def test_alu_power_rsqrt_reciprocal_are_iterative_on_vector_and_gpsimd():
    # exp via the ALU (e ** x with nl.power) is not a cheap pass: VectorE 8N like its
    # reciprocal, GpSimd ~4 cycles per element (4x ScalarE's rate)
    def ts(b, engine, op1):
        b._add("tensor_scalar", engine, [sbuf("data", new_alloc(), (128, 512), "float32")],
               [sbuf("dst", new_alloc(), (128, 512), "float32")], op0="subtract", op1=op1)

    assert _one(lambda b: ts(b, "gpsimd", "power")).cycles == 4 * 512 + SG
    assert _one(lambda b: ts(b, "vector", "rsqrt")).cycles == 8 * 512 + S
    assert _one(lambda b: ts(b, "gpsimd", "multiply")).cycles == 512 + SG


def test_vector_reciprocal_instruction_is_eight_n():
    # nisa.reciprocal on VectorE: "max(MIN_II, 8N)" [S] (hardware.py
    # vector_reciprocal_factor), plus VectorE's fixed cycles; mutation testing found the
    # rule doubled unnoticed (only the ALU ops that borrow it were pinned)
    def recip(b, n):
        b._add("reciprocal", "vector", [sbuf("data", new_alloc(), (128, n), "float32")],
               [sbuf("dst", new_alloc(), (128, n), "float32")])

    assert TRN2.vector_reciprocal_factor == 8
    assert _one(lambda b: recip(b, 512)).cycles == TRN2.vector_reciprocal_factor * 512 + S
    assert _one(lambda b: recip(b, 4)).cycles == TRN2.min_instruction_cycles + S     # 32 < MIN_II


def test_an_alu_power_with_one_psum_input_is_n_times_eight():
    # the two rules compose: one input in PSUM is N ([S] tensor_tensor), and the ALU power
    # op makes each element 8 cycles on VectorE: 8N, not 8 x 2N
    def tt(b, first):
        b._add("tensor_tensor", "vector", [first("data1", new_alloc(), (128, 512), "float32"),
                                           sbuf("data2", new_alloc(), (128, 512), "float32")],
               [sbuf("dst", new_alloc(), (128, 512), "float32")], op="power")

    assert _one(lambda b: tt(b, psum)).cycles == 8 * 512 + S
    assert _one(lambda b: tt(b, sbuf)).cycles == 8 * 2 * 512 + S


def test_gpsimd_iota_and_affine_select_are_150_plus_n_with_their_startup():
    # "GPSIMD_START + N ... GPSIMD_START is the instruction startup overhead on GpSimdE,
    # roughly 150 engine cycles" [S]: AWS's cost is the whole instruction's, so the engine's
    # fixed cost is not added on top (it was until 2026-12-07: 150 + N + 150 on trn2), at
    # any fixed cost
    cost = _one(lambda b: b.iota(sbuf("dst", new_alloc(), (128, 300), "float32")))
    assert cost.cycles == 150 + 300
    assert cost.seconds == pytest.approx((150 + 300) / TRN2.gpsimd_hz)
    b = TraceBuilder()
    b._add("affine_select", "gpsimd", [sbuf("on_true_tile", new_alloc(), (128, 200), "float32")],
           [sbuf("dst", new_alloc(), (128, 200), "float32")])
    for tgt in (TRN2, dataclasses.replace(TRN2, gpsimd_static_cycles=3000.0)):
        assert compute_cost(b.trace[0], tgt).cycles == 150 + 200


def test_each_engine_pays_its_own_fixed_cost():
    # the fixed cost is per engine and generation (hardware.py): distinct values must
    # reach the instruction of that engine and no other
    tgt = dataclasses.replace(TRN2, vector_static_cycles=1000.0, scalar_static_cycles=2000.0,
                              gpsimd_static_cycles=3000.0)

    def copy(engine):
        b = TraceBuilder()
        b._add("tensor_copy", engine, [sbuf("src", new_alloc(), (128, 512), "float32")],
               [sbuf("dst", new_alloc(), (128, 512), "float32")])
        return compute_cost(b.trace[0], tgt).cycles - compute_cost(b.trace[0], TRN2).cycles

    assert copy("vector") == 1000.0 - S
    assert copy("scalar") == 2000.0 - SA
    assert copy("gpsimd") == 3000.0 - SG


# ------------------------------------------------------------------------------- DMA

def _per_queue_bw(target=TRN2):
    return target.dma_bytes_per_s / target.dma_queues


def test_a_lone_dma_takes_latency_plus_bytes_over_bandwidth_spread_over_queues():
    b = TraceBuilder()
    b.dma(sbuf("dst", new_alloc(), (128, 4096)), hbm("src", new_alloc(), (128, 4096)))
    cost = dma_cost(b.trace[0], TRN2)
    assert cost.queues == 16
    assert cost.bytes == 128 * 4096 * 2
    assert cost.descriptors == 128                       # one contiguous row per partition
    data = (cost.bytes / 16 + 128 / 16 * TRN2.dma_descriptor_bytes) / _per_queue_bw()
    assert cost.data_seconds == pytest.approx(data)
    est = estimate_trace(b.trace)
    assert est.latency_us == pytest.approx((TRN2.dma_latency_s + data) * US)
    assert est.hbm_bytes == cost.bytes
    assert est.bottleneck == "dma"


def test_dma_with_few_partitions_uses_few_queues():
    # 8 SBUF partitions per DMA engine: an 8-partition tile goes through one queue, so the
    # same bytes take 16x the data time of a 128-partition tile.
    b = TraceBuilder()
    b.dma(sbuf("dst", new_alloc(), (8, 64 * 1024)), hbm("src", new_alloc(), (8, 64 * 1024)))
    b.dma(sbuf("dst", new_alloc(), (128, 4 * 1024)), hbm("src", new_alloc(), (128, 4 * 1024)))
    narrow, wide = dma_cost(b.trace[0], TRN2), dma_cost(b.trace[1], TRN2)
    assert (narrow.queues, wide.queues) == (1, 16)
    # a partial engine's partitions still take an engine: 12 partitions -> 2, 129 -> capped
    b.dma(sbuf("dst", new_alloc(), (12, 1024)), hbm("src", new_alloc(), (12, 1024)))
    b.dma(sbuf("dst", new_alloc(), (100, 1024)), hbm("src", new_alloc(), (100, 1024)))
    assert (dma_cost(b.trace[2], TRN2).queues, dma_cost(b.trace[3], TRN2).queues) == (2, 13)
    assert narrow.bytes == wide.bytes and narrow.descriptors == 8 and wide.descriptors == 128
    per_desc = TRN2.dma_descriptor_bytes / _per_queue_bw()
    # same bytes per queue x 16; the narrow tile's 8 long rows have fewer descriptors
    assert narrow.data_seconds - 8 * per_desc == pytest.approx(16 * (wide.data_seconds - 8 * per_desc))


def test_scattered_elements_cost_a_descriptor_each():
    # a [128, 64] bf16 tile loaded from a column of a row-major [64, 128*k] HBM tensor (a
    # transposing access): 2-byte chunks, each paying the per-descriptor overhead
    b = TraceBuilder()
    b.dma(sbuf("dst", new_alloc(), (128, 64)), hbm("src", new_alloc(), (128, 64), strides=(1, 128)))
    b.dma(sbuf("dst", new_alloc(), (128, 64)), hbm("src", new_alloc(), (128, 64)))
    scattered, rows = dma_cost(b.trace[0], TRN2), dma_cost(b.trace[1], TRN2)
    assert (scattered.descriptors, rows.descriptors) == (128 * 64, 128)
    extra = (128 * 64 - 128) / 16 * TRN2.dma_descriptor_bytes / _per_queue_bw()
    assert scattered.data_seconds - rows.data_seconds == pytest.approx(extra)


def test_a_casting_copy_moves_the_bytes_of_its_larger_side():
    b = TraceBuilder()
    b._add("dma_copy", "dma", [sbuf("src", new_alloc(), (128, 512), "float32")],
           [hbm("dst", new_alloc(), (128, 512), "bfloat16")], bytes=128 * 512 * 2, src_bytes=128 * 512 * 4)
    assert dma_cost(b.trace[0], TRN2).bytes == 128 * 512 * 4
    # and the other way: bf16 in, fp32 out (the written side is the larger)
    b._add("dma_copy", "dma", [hbm("src", new_alloc(), (128, 512), "bfloat16")],
           [sbuf("dst", new_alloc(), (128, 512), "float32")], bytes=128 * 512 * 4, src_bytes=128 * 512 * 2)
    assert dma_cost(b.trace[1], TRN2).bytes == 128 * 512 * 4
    # a trace without the byte counts: the operands' sizes, the larger side
    b._add("dma_copy", "dma", [hbm("src", new_alloc(), (128, 512), "bfloat16")],
           [sbuf("dst", new_alloc(), (128, 512), "float32")])
    assert dma_cost(b.trace[2], TRN2).bytes == 128 * 512 * 4


def test_a_dma_transpose_runs_at_the_documented_fraction_of_its_source_s_copy_rate():
    # [A2]: HBM -> SBUF up to 90 % of the copy throughput, SBUF -> SBUF up to 50 %
    b = TraceBuilder()
    for src in (hbm("src", new_alloc(), (64, 128)), sbuf("src", new_alloc(), (64, 128))):
        b._add("dma_transpose", "dma", [src], [sbuf("dst", new_alloc(), (128, 64))], bytes=128 * 64 * 2)
    from_hbm, from_sbuf = dma_cost(b.trace[0], TRN2), dma_cost(b.trace[1], TRN2)
    share = 128 * 64 * 2 / TRN2.dma_queues
    assert from_hbm.data_seconds == pytest.approx(share / (_per_queue_bw() * TRN2.dma_transpose_hbm_efficiency))
    assert from_sbuf.data_seconds == pytest.approx(share / (_per_queue_bw() * TRN2.dma_transpose_sbuf_efficiency))


def test_small_transfers_are_bound_by_the_transfer_gap_not_the_bandwidth():
    # 64 bytes per partition: far below the 2-4 KiB the DMA guide recommends. A stream of
    # such transfers starts one per gap per queue (the packet rate), whatever their bytes.
    b = TraceBuilder()
    src = new_alloc()
    count = 64
    for i in range(count):
        b.dma(sbuf("dst", new_alloc(), (128, 32)), hbm("src", src, (128, 32), offset=i * 128 * 32))
    est = estimate_trace(b.trace)
    bandwidth_time = count * 128 * 32 * 2 / TRN2.dma_bytes_per_s * US
    expected = (TRN2.dma_latency_s + (count - 1) * TRN2.dma_transfer_gap_s
                + dma_cost(b.trace[-1], TRN2).data_seconds) * US
    assert est.latency_us == pytest.approx(expected)
    assert est.latency_us > 20 * bandwidth_time


def _two_site_burst(per_site: int):
    """``per_site`` tiny loads into column slices of each of two SBUF tiles (two allocation
    sites; no transfer depends on another), site A's issued first."""
    b = TraceBuilder()
    src = new_alloc()
    tiles = [new_alloc(), new_alloc()]
    for t in tiles:
        for i in range(per_site):
            dst = sbuf("dst", t, (128, 16), offset=i * 16, strides=(16 * per_site, 1))
            b.dma(dst, hbm("src", src, (128, 16), offset=i * 128 * 16))
    allocs = [AllocationSite(t, "sbuf", (("k.py", 10 + k),), None) for k, t in enumerate(tiles)]
    return b.trace, allocs


def test_one_queue_per_engine_starts_every_transfer_a_gap_after_the_last():
    # dma_site_queues=1 (the Target default, trn1's rule): whatever their sites, the 64
    # transfers leave each engine one per transfer gap, in issue order
    trace, allocs = _two_site_burst(32)
    assert TARGETS["trn1"].dma_site_queues == 1
    est = estimate_trace(trace, ONE_QUEUE, allocations=allocs)
    data = dma_cost(trace[0], TRN2).data_seconds
    assert est.latency_us == pytest.approx((TRN2.dma_latency_s + 63 * TRN2.dma_transfer_gap_s + data) * US)


def test_queues_per_site_run_round_robin_each_in_order_one_per_gap():
    # two sites, two queues per engine: each queue still starts one transfer per gap, in
    # order ([D] "executed in order" within a queue), and the engine serves both ("round
    # robin" across queues): site B's k-th transfer follows site A's k-th by one data time
    trace, allocs = _two_site_burst(32)
    target = dataclasses.replace(ONE_QUEUE, dma_site_queues=2)
    est = estimate_trace(trace, target, allocations=allocs)
    data = dma_cost(trace[0], TRN2).data_seconds
    assert data < TRN2.dma_transfer_gap_s / 2
    assert est.latency_us == pytest.approx((TRN2.dma_latency_s + 31 * TRN2.dma_transfer_gap_s + 2 * data) * US)
    starts = sorted({s.start for s in est.schedule.slots if s.lane == "dma_q0"})
    assert starts[:3] == pytest.approx([TRN2.dma_latency_s, TRN2.dma_latency_s + data,
                                        TRN2.dma_latency_s + TRN2.dma_transfer_gap_s])
    # one site's transfers keep their issue order on every engine
    for lane in {s.lane for s in est.schedule.slots}:
        site_a = [s for s in est.schedule.slots if s.lane == lane and s.index < 32]
        assert [s.index for s in sorted(site_a, key=lambda s: s.start)] == sorted(s.index for s in site_a)


def _interleaved_burst(pairs: int, cores: int = 1):
    """``pairs`` tiny loads alternating between two SBUF tiles (two allocation sites, as the
    kernel-optimization tutorial's tiled matmul alternates its lhsT and rhs loads), on each
    of ``cores`` cores; no transfer depends on another."""
    b = TraceBuilder()
    src = new_alloc()
    allocs = []
    for core in range(cores):
        tiles = [new_alloc(), new_alloc()]
        allocs += [AllocationSite(t, "sbuf", (("k.py", 30 + 2 * core + k),), None) for k, t in enumerate(tiles)]
        for i in range(pairs):
            for t in tiles:
                dst = sbuf("dst", t, (128, 16), offset=i * 16, strides=(16 * pairs, 1))
                ins = b.dma(dst, hbm("src", src, (128, 16), offset=i * 128 * 16))
                ins.attrs["core"] = core
    return b.trace, allocs


def test_the_descriptor_generator_paces_interleaved_sites_and_leaves_one_stream_to_its_gap():
    # docs/cost-model.md "Both rules at once": one generator per core at 600 ns [A2] beside
    # a queue per site: trn2's and trn3's rule since 2026-12-08, not trn1's
    gen = 0.6e-6
    for name in ("trn2", "trn3"):
        assert (TARGETS[name].dma_descriptor_generation_s, TARGETS[name].dma_site_queues) == (gen, 16)
    assert (TARGETS["trn1"].dma_descriptor_generation_s, TARGETS["trn1"].dma_site_queues) == (0.0, 1)
    assert gen < TRN2.dma_transfer_gap_s < 2 * gen
    trace, allocs = _interleaved_burst(32)
    data = dma_cost(trace[0], TRN2).data_seconds
    sites = dataclasses.replace(ONE_QUEUE, dma_site_queues=2)
    both = dataclasses.replace(sites, dma_descriptor_generation_s=gen)
    # two queues alone: each site's queue starts one transfer per gap, the two side by side
    assert estimate_trace(trace, sites, allocations=allocs).latency_us == pytest.approx(
        (TRN2.dma_latency_s + 31 * TRN2.dma_transfer_gap_s + 2 * data) * US)
    # with the generator, transfers leave it one per 600 ns in release order (here issue
    # order: nothing depends on anything): the last of the 64
    # is ready at 64 x 600 ns, later than its queue's gaps and the 1.3 us latency allow
    est = estimate_trace(trace, both, allocations=allocs)
    assert est.latency_us == pytest.approx((64 * gen + data) * US)
    starts = sorted(s.start for s in est.schedule.slots if s.lane == "dma_q0")
    # the first transfers wait out the latency and their queue's gap; from then on the
    # engine starts one (of either site) per 600 ns
    assert [b - a for a, b in zip(starts[32:], starts[33:])] == pytest.approx([gen] * 31)
    # one queue per engine: the 0.85 us gap binds, the generator's 600 ns never does (the DMA
    # overview's single-stream curve is kept)
    one_queue = dataclasses.replace(ONE_QUEUE, dma_descriptor_generation_s=gen)
    assert estimate_trace(trace, one_queue, allocations=allocs).latency_us == pytest.approx(
        estimate_trace(trace, ONE_QUEUE, allocations=allocs).latency_us)
    # the shipped trn2 (16 queues: one per site here) is the two-queue case
    assert estimate_trace(trace, TRN2, allocations=allocs).latency_us == pytest.approx(est.latency_us)
    # each core has its own generator: two cores' bursts take as long as one core's (to the
    # last transfer's data, a little slower with the two cores sharing one HBM stack; one
    # generator for both would take 128 x 600 ns)
    trace2, allocs2 = _interleaved_burst(32, cores=2)
    assert estimate_trace(trace2, both, allocations=allocs2).latency_us == pytest.approx(est.latency_us, rel=1e-4)


def _store_and_prefetches(loads_first: bool, n_loads: int = 10):
    """A store of a ScalarE result and ``n_loads`` independent tiny loads (issued after the
    store, or before it): the loads are released at once, the store when ScalarE is done."""
    b = TraceBuilder()
    made, out, src, tile = new_alloc(), new_alloc(), new_alloc(), new_alloc()

    def loads():
        for i in range(n_loads):
            b.dma(sbuf("dst", tile, (128, 16), offset=i * 16, strides=(16 * n_loads, 1)),
                  hbm("src", src, (128, 16), offset=i * 128 * 16))

    if loads_first:
        loads()
    b.activation(sbuf("dst", made, (128, 2048)), sbuf("src", new_alloc(), (128, 2048)))
    store = b.dma(hbm("dst", out, (128, 2048)), sbuf("src", made, (128, 2048)))
    if not loads_first:
        loads()
    return b.trace, store.index


@pytest.mark.parametrize("loads_first", [False, True])
def test_the_descriptor_generator_takes_the_earliest_issued_released_transfer(loads_first):
    # schedule.py rule 3: a sequencer serves its stream in program order, so a store issued
    # before prefetches goes first once it is released; prefetches issued before it go first
    gen = 0.6e-6
    trace, store = _store_and_prefetches(loads_first)
    est = estimate_trace(trace, dataclasses.replace(TRN2, dma_descriptor_generation_s=gen))
    released = est.schedule.ready[store]
    assert 0 < released < 4 * gen   # the loads are released at 0, the store while they are made
    store_start = est.schedule.start[store]
    load_starts = [est.schedule.start[i] for i, ins in enumerate(trace) if ins.engine == "dma" and i != store]
    if loads_first:
        # all ten loads were issued first: the store's descriptor comes after theirs
        assert store_start >= 11 * gen - 1e-12 and store_start > max(load_starts)
    else:
        # made at the generator's first free moment after its release (no sooner), ahead of
        # the loads still waiting; in release order it would follow all ten (11 x 600 ns)
        first_free = math.ceil(released / gen - 1e-9) * gen
        assert store_start >= max(released + TRN2.dma_latency_s, first_free + gen) - 1e-12
        assert store_start < 11 * gen
        assert sum(t > store_start for t in load_starts) >= 5


def test_sites_beyond_the_queues_share_them_and_hbm_only_transfers_take_queue_zero():
    b = TraceBuilder()
    tiles = [new_alloc() for _ in range(3)]
    for t in tiles:
        b.dma(sbuf("dst", t, (128, 64)), hbm("src", new_alloc(), (128, 64)))
    b.dma(hbm("dst", new_alloc(), (128, 64)), hbm("src", new_alloc(), (128, 64)))
    b.dma(hbm("dst", new_alloc(), (128, 64)), sbuf("src", tiles[1], (128, 64)))   # a store of site 1
    allocs = [AllocationSite(t, "sbuf", (("k.py", 20 + k),), None) for k, t in enumerate(tiles)]
    two = dataclasses.replace(TRN2, dma_site_queues=2)
    assert _dma_site_queues(b.trace, allocs, two) == {0: 0, 1: 1, 2: 0, 3: 0, 4: 1}
    assert set(_dma_site_queues(b.trace, allocs, ONE_QUEUE).values()) == {0}
    # trn2's 16: each of the three sites its own queue, the HBM-only copy on queue 0
    assert _dma_site_queues(b.trace, allocs, TRN2) == {0: 0, 1: 1, 2: 2, 3: 0, 4: 1}


def test_a_stream_hides_the_latency_and_a_chain_pays_it_each_time():
    def trace(chained: bool):
        b = TraceBuilder()
        tile = new_alloc()
        for i in range(8):
            dst = tile if chained else new_alloc()   # chained: each load overwrites the last
            b.dma(sbuf("dst", dst, (128, 2048)), hbm("src", new_alloc(), (128, 2048)))
        return b.trace

    stream, chain = estimate_trace(trace(False)), estimate_trace(trace(True))
    data = dma_cost(trace(False)[0], TRN2).data_seconds
    occ = max(TRN2.dma_transfer_gap_s, data + TRN2.dma_transfer_handoff_s)
    assert stream.latency_us == pytest.approx((TRN2.dma_latency_s + 7 * occ + data) * US)
    assert chain.latency_us == pytest.approx(8 * (TRN2.dma_latency_s + data) * US)


def _streaming_kernel(chunks: int, cols: int, dtype: str = "bfloat16", prefetch: bool = True):
    """out = act(x) over ``chunks`` [128, cols] chunks: load, ScalarE, store."""
    b = TraceBuilder()
    x, out = new_alloc(), new_alloc()
    buf, res = new_alloc(), new_alloc()
    for i in range(chunks):
        off = i * 128 * cols
        tile = sbuf("dst", new_alloc() if prefetch else buf, (128, cols), dtype)
        b.dma(tile, hbm("src", x, (128, cols), dtype, offset=off))
        result = sbuf("dst", new_alloc() if prefetch else res, (128, cols), dtype)
        b.activation(result, _role(tile, "data"))
        b.dma(hbm("dst", out, (128, cols), dtype, offset=off), result)
    return b.trace


def _role(op, role):
    from dataclasses import replace
    return replace(op, role=role)


def test_doubling_the_bytes_of_a_dma_bound_kernel_doubles_its_time():
    small = estimate_trace(_streaming_kernel(32, 2048))
    large = estimate_trace(_streaming_kernel(64, 2048))
    assert small.bottleneck == large.bottleneck == "dma"
    assert large.hbm_bytes == 2 * small.hbm_bytes
    assert large.latency_us / small.latency_us == pytest.approx(2.0, rel=0.03)
    # and it runs close to the DMA bandwidth: 4 KiB per partition per transfer saturates
    bandwidth_time = large.hbm_bytes / TRN2.dma_bytes_per_s * US
    assert bandwidth_time / large.latency_us > 0.9


def test_a_kernel_that_waits_on_each_load_is_slower_than_one_that_prefetches():
    waits = estimate_trace(_streaming_kernel(16, 2048, prefetch=False))
    prefetches = estimate_trace(_streaming_kernel(16, 2048, prefetch=True))
    assert waits.hbm_bytes == prefetches.hbm_bytes
    assert waits.engine_busy_us == pytest.approx(prefetches.engine_busy_us)  # same work ...
    assert waits.latency_us > 1.5 * prefetches.latency_us                   # ... serialised


# ------------------------------------------------------------------------- schedule

def test_independent_work_on_two_engines_overlaps():
    b = TraceBuilder()
    b.activation(sbuf("dst", new_alloc(), (128, 4000)), sbuf("data", new_alloc(), (128, 4000)))
    b.tensor_copy(sbuf("dst", new_alloc(), (128, 4000), "float32"), sbuf("src", new_alloc(), (128, 4000), "float32"))
    est = estimate_trace(b.trace)
    scalar, vector = est.engine_busy_us["scalar"], est.engine_busy_us["vector"]
    assert est.latency_us == pytest.approx(max(scalar, vector))
    assert est.latency_us < 0.6 * (scalar + vector)


def test_dependent_work_on_two_engines_serialises_with_the_dependency_latency():
    b = TraceBuilder()
    mid = new_alloc()
    b.activation(sbuf("dst", mid, (128, 4000)), sbuf("data", new_alloc(), (128, 4000)))
    b.tensor_copy(sbuf("dst", new_alloc(), (128, 4000), "float32"), sbuf("src", mid, (128, 4000)))
    est = estimate_trace(b.trace)
    latency = TRN2.dependency_latency_cycles / TRN2.scalar_hz * US
    expected = est.engine_busy_us["scalar"] + latency + est.engine_busy_us["vector"]
    assert est.latency_us == pytest.approx(expected)


def test_small_dependent_instructions_pay_overheads_back_to_back():
    # The perf guide's example: 1-element dependent instructions issue every ~264 ScalarE
    # cycles (NC-v2); the model charges 64 (min) + static + 100 (dependency).
    b = TraceBuilder()
    tiles = [new_alloc() for _ in range(11)]
    for i in range(10):
        b.activation(sbuf("dst", tiles[i + 1], (128, 1)), sbuf("data", tiles[i], (128, 1)))
    est = estimate_trace(b.trace)
    per_instruction = (est.latency_us / US * TRN2.scalar_hz + 100) / 10
    assert per_instruction == pytest.approx(64 + SA + TRN2.dependency_latency_cycles)


def test_write_after_read_waits_for_the_reader():
    b = TraceBuilder()
    tile = new_alloc()
    b.activation(sbuf("dst", new_alloc(), (128, 2048)), sbuf("data", tile, (128, 2048)))
    b.dma(sbuf("dst", tile, (128, 2048)), hbm("src", new_alloc(), (128, 2048)))  # overwrites the input
    est = estimate_trace(b.trace)
    act_end = est.schedule.finish[0]
    dma_start = min(s.start for s in est.schedule.slots if s.index == 1) - TRN2.dma_latency_s
    assert dma_start == pytest.approx(act_end)


def test_disjoint_parts_of_one_tile_do_not_depend_on_each_other():
    b = TraceBuilder()
    tile = new_alloc()
    # two column halves of a [128, 1024] tile: written by ScalarE, then the first half read by VectorE
    left = dict(shape=(128, 512), dtype="float32", strides=(1024, 1))
    b.activation(sbuf("dst", tile, offset=0, **left), sbuf("data", new_alloc(), (128, 512), "float32"))
    b.activation(sbuf("dst", tile, offset=512, **left), sbuf("data", new_alloc(), (128, 512), "float32"))
    b.tensor_copy(sbuf("dst", new_alloc(), (128, 512), "float32"), sbuf("src", tile, offset=0, **left))
    est = estimate_trace(b.trace)
    copy_start = next(s.start for s in est.schedule.slots if s.index == 2)
    first_end = est.schedule.finish[0]
    from nki_kernels.simulator.trace import Operand
    # The trace records exact footprints (offset/strides); without them this test would
    # measure nothing, so their absence is a failure, not a skip.
    assert "strides" in Operand.__dataclass_fields__ and "offset" in Operand.__dataclass_fields__
    assert copy_start == pytest.approx(first_end + 100 / TRN2.scalar_hz)


# --------------------------------------------------------------------------- targets

def test_targets_differ_where_the_hardware_does():
    trace = _streaming_kernel(8, 2048)
    t = {name: estimate_trace(trace, name).latency_us for name in ("trn1", "trn2", "trn3")}
    assert t["trn3"] < t["trn2"] < t["trn1"]  # DMA bandwidth 528 > 368 > 272 GB/s
    assert estimate_trace(trace, "trn3").target == "trn3"


# ------------------------------------------------------------------------ bad input

def test_unknown_engine_is_an_error_naming_it():
    b = TraceBuilder()
    b._add("tensor_copy", "sync", [sbuf("src", new_alloc(), (128, 4))], [sbuf("dst", new_alloc(), (128, 4))])
    with pytest.raises(CostModelError, match="engine='sync'"):
        estimate_trace(b.trace)


def test_unpriced_tensor_engine_op_is_an_error():
    b = TraceBuilder()
    b._add("nc_gather", "tensor", [sbuf("src", new_alloc(), (128, 4))], [psum("dst", new_alloc(), (128, 4))])
    with pytest.raises(CostModelError, match="nc_gather"):
        estimate_trace(b.trace)


def test_unknown_target_is_an_error_naming_the_choices():
    with pytest.raises(ValueError, match="trn9"):
        estimate_trace([], "trn9")


def test_empty_trace_takes_no_time():
    est = estimate_trace([])
    assert est.latency_us == 0 and est.instructions == 0
    assert math.isfinite(sum(est.utilization.values()))

"""The cost of NeuronCore-v4 (trn3) instructions, on traces the simulator records.

Expected cycles come from the Trainium3 architecture guide (docs/hardware.md [A3]), never
from the model's output: an MX matmul takes a bf16 matmul's cycles for the same x4 tile
sizes ("Quad-MXFP8/MXFP4 Matmul Performance"), QuantizeMX quantizes "four input elements per
partition, per cycle", and exponential runs at VectorE's data-path width ("Compute Engine
Specifications": 512 16-bit or 256 other elements per cycle over 128 lanes)."""

from __future__ import annotations

import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator.cost import compute_cost, estimate_trace
from nki_kernels.simulator.hardware import TARGETS

TRN3 = TARGETS["trn3"]
VECTOR_FIXED = TRN3.vector_static_cycles


def _traced(body, **inputs):
    """The trace of ``body(nl, nisa, **inputs)`` run as a kernel on trn3."""
    def kernel(**tensors):
        import nki.isa as nisa
        import nki.language as nl
        return body(nl, nisa, **tensors)

    return simulator.run(kernel, target="trn3", **inputs).trace


def _only(trace, op):
    found = [i for i in trace if i.op == op]
    assert len(found) == 1, [i.op for i in trace]
    return found[0]


def _mx_and_bf16_matmuls(nl, nisa, a, b):
    """quantize_mx a [K, 4M] and b [K, 4N] (bf16), one nc_matmul_mx of the x4 tiles, and one
    bf16 nc_matmul of a [K, M] by b [K, N] slice: the same M and N."""
    K, M4 = a.shape
    N4 = b.shape[1]
    tiles = []
    for src, f in ((a, M4), (b, N4)):
        s = nl.ndarray((K, f), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(s, src)
        data = nl.ndarray((K, f // 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        scale = nl.ndarray((K, f // 4), dtype=nl.float8_e8m0fnu, buffer=nl.sbuf)
        nisa.quantize_mx(data, s, scale)
        tiles.append((s, data, scale))
    (sa, qa, ca), (sb, qb, cb) = tiles
    mx = nl.ndarray((M4 // 4, N4 // 4), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(mx, qa, qb, ca, cb)
    plain = nl.ndarray((M4 // 4, N4 // 4), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(plain, sa[:, 0:M4 // 4], sb[:, 0:N4 // 4])
    copied = nl.ndarray(mx.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(copied, mx)
    out = nl.ndarray(mx.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(out, copied, plain, nl.add)
    hbm = nl.ndarray(mx.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(hbm, out)
    return hbm


@pytest.mark.parametrize("m,n", [(128, 512), (64, 200), (128, 36)])
def test_an_mx_matmul_takes_a_bf16_matmuls_cycles_for_four_times_the_flops(m, n):
    trace = _traced(_mx_and_bf16_matmuls, a=torch.randn(128, 4 * m).bfloat16(),
                    b=torch.randn(128, 4 * n).bfloat16())
    mx, plain = _only(trace, "nc_matmul_mx"), _only(trace, "nc_matmul")
    assert compute_cost(mx, TRN3).cycles == compute_cost(plain, TRN3).cycles == max(min(64, m), n, m / 4)
    assert mx.flops == 4 * plain.flops
    assert "mx matmul" in compute_cost(mx, TRN3).rule
    # the whole trace prices: no instruction is left out of the model
    assert estimate_trace(trace, "trn3").engine_busy_us["tensor"] > 0


def _quantize_kernel(nl, nisa, x):
    s = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(s, x)
    data = nl.ndarray((x.shape[0], x.shape[1] // 4), dtype=nl.float8_e5m2_x4, buffer=nl.sbuf)
    scale = nl.ndarray(data.shape, dtype=nl.float8_e8m0fnu, buffer=nl.sbuf)
    nisa.quantize_mx(data, s, scale)
    hbm = nl.ndarray(data.shape, dtype=nl.uint8, buffer=nl.shared_hbm)
    nisa.dma_copy(hbm, scale.view(nl.uint8))
    return hbm


@pytest.mark.parametrize("parts,free", [(128, 2048), (64, 512), (32, 36)])
def test_quantize_mx_quantizes_four_elements_per_lane_per_cycle(parts, free):
    trace = _traced(_quantize_kernel, x=torch.randn(parts, free).bfloat16())
    cost = compute_cost(_only(trace, "quantize_mx"), TRN3)
    assert cost.cycles == max(TRN3.min_instruction_cycles, free / 4) + VECTOR_FIXED


def _exp_kernel(nl, nisa, x, out_dtype):
    s = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(s, x)
    e = nl.ndarray(x.shape, dtype=out_dtype, buffer=nl.sbuf)
    nisa.exponential(e, s)
    hbm = nl.ndarray(x.shape, dtype=out_dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(hbm, e)
    return hbm


@pytest.mark.parametrize("src,dst,per_lane", [(torch.bfloat16, "bfloat16", 4), (torch.float32, "float32", 2),
                                              (torch.float32, "bfloat16", 2),
                                              # "512 BF16/FP16/FP8": fp8 is narrow too
                                              (torch.bfloat16, "float8_e4m3", 4)])
@pytest.mark.parametrize("free", [2048, 300])
def test_exponential_runs_at_vectors_data_path_width(src, dst, per_lane, free):
    def body(nl, nisa, x):
        return _exp_kernel(nl, nisa, x, getattr(nl, dst))

    trace = _traced(body, x=(torch.randn(128, free) * 3).to(src))
    cost = compute_cost(_only(trace, "exponential"), TRN3)
    assert cost.cycles == max(TRN3.min_instruction_cycles, free / per_lane) + VECTOR_FIXED
    # against ScalarE's exp of the same bf16 tile: twice its rate (the data path caps the
    # guide's 4x, which is against ScalarE's 128-element fp32 path)
    if per_lane == 4:
        def on_scalar(nl, nisa, x):
            s = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(s, x)
            e = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.activation(e, nl.exp, s)
            hbm = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
            nisa.dma_copy(hbm, e)
            return hbm

        act = compute_cost(_only(_traced(on_scalar, x=torch.randn(128, free).bfloat16()), "activation"), TRN3)
        variable = act.cycles - TRN3.scalar_static_cycles
        assert variable == max(TRN3.min_instruction_cycles, free / 2)
        assert cost.cycles - VECTOR_FIXED == max(TRN3.min_instruction_cycles, variable / 2)


@pytest.mark.parametrize("dst, per_lane", [("bfloat16", 2), ("float8_e4m3", 2), ("float32", 1)])
def test_scalar_engine_takes_fp8_at_its_wide_rate(dst, per_lane):
    # [A3] ScalarE: "256 BF16/FP16/FP8 input/output" elements per cycle (2 per lane), 128 for
    # 32-bit types: a bf16 -> fp8 exp runs at the wide rate, bf16 -> fp32 does not
    free = 2048

    def body(nl, nisa, x):
        s = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(s, x)
        e = nl.ndarray(x.shape, dtype=getattr(nl, dst), buffer=nl.sbuf)
        nisa.activation(e, nl.exp, s)
        hbm = nl.ndarray(x.shape, dtype=getattr(nl, dst), buffer=nl.shared_hbm)
        nisa.dma_copy(hbm, e)
        return hbm

    act = compute_cost(_only(_traced(body, x=torch.randn(128, free).bfloat16()), "activation"), TRN3)
    assert act.cycles - TRN3.scalar_static_cycles == max(TRN3.min_instruction_cycles, free / per_lane)

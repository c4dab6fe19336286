"""TensorE's current (dI/dt) throttle on trn2/trn3 (hardware.py tensor_throttle_*,
cost/schedule.py throttled_seconds).

AWS's Neuron Explorer docs ("Understanding throttling"): the Tensor Engine "starts at
roughly 50% utilization of maximum utilization and ramps to full over about the first ~3
microseconds after work begins. If utilization drops below 50% over any ~3 microsecond
window ... the limit re-engages". So a burst's first 3 us of busy time run at an average
rate of 0.75 and do 2.25 us of full-rate work: a burst of W >= 2.25 us of matmuls takes
W + 0.75 us. Every expected figure below follows from those three numbers."""

from __future__ import annotations

import dataclasses
import math

import pytest

from nki_kernels.simulator.cost import estimate_trace
from nki_kernels.simulator.cost.model import tensor_utilization
from nki_kernels.simulator.cost.schedule import throttled_seconds
from nki_kernels.simulator.hardware import TARGETS
from tests.cost._build import TraceBuilder, new_alloc, psum, sbuf

TRN2 = TARGETS["trn2"]
RAMP_LOSS_S = 3e-6 - 2.25e-6          # a burst's first 3 us do 2.25 us of work
MATMUL_S = 512 / TRN2.tensor_hz        # one [128, 128] x [128, 512] bf16 matmul: 512 cycles


def test_the_ramp_starts_at_half_rate_and_reaches_full_rate_after_three_microseconds():
    assert throttled_seconds(2.25e-6, 0.0, TRN2) == pytest.approx(3e-6)
    # 1 us of work from the start: 0.5 t + t^2 / 12 = 1 (t in us)
    assert throttled_seconds(1e-6, 0.0, TRN2) == pytest.approx((-6 + math.sqrt(36 + 48)) / 2 * 1e-6)
    # the rest of the ramp, then the full rate
    assert throttled_seconds(10e-6, 0.0, TRN2) == pytest.approx(10e-6 + RAMP_LOSS_S)
    # halfway up the ramp the rate is 0.75: 0.75 t + t^2 / 12 = 1
    assert throttled_seconds(1e-6, 1.5e-6, TRN2) == pytest.approx((-0.75 + math.sqrt(0.75 ** 2 + 4 / 12)) * 6 * 1e-6)
    assert throttled_seconds(1e-6, 3e-6, TRN2) == 1e-6          # past the ramp
    # trn1 has no throttle figure: unchanged
    assert TARGETS["trn1"].tensor_throttle_start_rate is None
    assert throttled_seconds(1e-6, 0.0, TARGETS["trn1"]) == 1e-6


def _bursts(count: int, gap_elems: int | None):
    """``count`` independent matmuls, then (``gap_elems`` given) an exp of [128, gap_elems] on
    ScalarE reading the last matmul's result, whose output is the moving operand of
    ``count`` more: TensorE idles while ScalarE works."""
    b = TraceBuilder()
    st = sbuf("stationary", new_alloc(), (128, 128))
    last = None
    for _ in range(count):
        last = psum("dst", new_alloc(), (128, 512))
        b.matmul(last, st, sbuf("moving", new_alloc(), (128, 512)))
    if gap_elems is not None:
        act = sbuf("act", new_alloc(), (128, gap_elems))
        b.activation(act, psum("dst", last.alloc_id, (128, gap_elems)))
        for _ in range(count):
            b.matmul(psum("dst", new_alloc(), (128, 512)), st, act)
    return b.trace


def test_a_stream_of_matmuls_pays_the_ramp_once():
    count = 60                                              # 12.8 us of matmuls
    est = estimate_trace(_bursts(count, None), TRN2)
    assert est.latency_us == pytest.approx((count * MATMUL_S + RAMP_LOSS_S) * 1e6)
    assert est.schedule.tensor_throttle == {0: pytest.approx(RAMP_LOSS_S)}
    assert est.engine_busy_us["tensor"] == pytest.approx(est.latency_us)   # throttled time is active
    off = estimate_trace(_bursts(count, None), dataclasses.replace(TRN2, tensor_throttle_start_rate=None))
    assert off.latency_us == pytest.approx(count * MATMUL_S * 1e6)
    assert off.schedule.tensor_throttle == {0: 0.0}


@pytest.mark.parametrize("gap_elems, bursts", [(64, 1), (2048, 2)])
def test_an_idle_gap_of_more_than_half_the_window_restarts_the_ramp(gap_elems, bursts):
    # the exp keeps TensorE idle for (max(64, N) + 360) ScalarE cycles plus the matmul's
    # result latency: 64 elements ~0.5 us (busy 2.5 of the last 3 us: the burst goes on),
    # 2048 elements ~2.2 us (busy under half of the window: a new burst at half rate)
    count = 20                                              # 4.3 us of matmuls per burst
    est = estimate_trace(_bursts(count, gap_elems), TRN2)
    assert est.schedule.tensor_throttle[0] == pytest.approx(bursts * RAMP_LOSS_S)


# ---- utilization: the limit caps the peak's fraction of FLOPs an instruction uses -----------
# ("Active Throttled %: the percentage of the Tensor Engine's peak FLOPs (its BF16-adjusted
# hardware maximum) that throttling made unavailable", [X]); hardware.py tensor_throttle_by_flops

BY_BUSY_TIME = dataclasses.replace(TRN2, tensor_throttle_by_flops=False)


def test_an_instruction_under_the_limit_runs_at_its_own_rate():
    for utilization in (0.5, 0.25, 2 / 256):
        assert throttled_seconds(1e-6, 0.0, TRN2, utilization) == 1e-6
    # at 0.75 of the peak: the limit (0.5, rising 1/6 per us) reaches it after 1.5 us, when the
    # instruction has done 1.5 * (0.5 + 0.75) / 2 / 0.75 = 1.25 us of its work
    assert throttled_seconds(2e-6, 0.0, TRN2, 0.75) == pytest.approx(2.25e-6)
    # within that: 0.75 * work = 0.5 t + t^2 / 12 (t in us)
    assert throttled_seconds(0.5e-6, 0.0, TRN2, 0.75) == pytest.approx((-0.5 + math.sqrt(0.25 + 0.125)) * 6 * 1e-6)
    # at the whole peak: the ramp of the first test
    assert throttled_seconds(2.25e-6, 0.0, TRN2, 1.0) == pytest.approx(3e-6)


def _matmul(k, m, n, dtype="bfloat16"):
    b = TraceBuilder()
    b.matmul(psum("dst", new_alloc(), (m, n)), sbuf("stationary", new_alloc(), (k, m), dtype),
             sbuf("moving", new_alloc(), (k, n), dtype))
    return b.trace[-1]


@pytest.mark.parametrize("k, m, n, dtype, expected", [
    (128, 128, 512, "bfloat16", 1.0),        # the whole array, streaming: the peak
    (64, 128, 512, "bfloat16", 0.5),         # a contraction over 64 partitions (a head of 64)
    (128, 128, 512, "float32", 0.25),        # four passes: a quarter of the bf16 peak
    (128, 128, 2, "float32", 2 / 256),       # 2 columns in the 64-cycle floor, four passes
    (128, 64, 512, "bfloat16", 0.5),         # 64 output partitions
])
def test_utilization_is_the_share_of_the_peak_a_matmul_uses(k, m, n, dtype, expected):
    assert tensor_utilization(_matmul(k, m, n, dtype), TRN2) == pytest.approx(expected)


def test_a_transpose_is_a_matmul_by_the_identity():
    b = TraceBuilder()
    data = sbuf("data", new_alloc(), (128, 32))
    b._add("nc_transpose", "tensor", [data], [psum("dst", new_alloc(), (32, 128))], 0)
    # [128, 32]: 128 x 32 x 128 MACs in max(128, min(64, 32)) = 128 cycles
    assert tensor_utilization(b.trace[-1], TRN2) == pytest.approx(0.25)


def _stream(b, count, k, dtype="bfloat16"):
    st = sbuf("stationary", new_alloc(), (k, 128), dtype)
    for _ in range(count):
        b.matmul(psum("dst", new_alloc(), (128, 512)), st, sbuf("moving", new_alloc(), (k, 512), dtype))


@pytest.mark.parametrize("k, dtype", [(64, "bfloat16"), (128, "float32")])
def test_a_stream_under_the_limit_is_not_throttled(k, dtype):
    b = TraceBuilder()
    _stream(b, 30, k, dtype)
    assert estimate_trace(b.trace, TRN2).schedule.tensor_throttle == {0: 0.0}
    # read as busy time, the same stream (> 3 us of work) pays the whole ramp
    assert estimate_trace(b.trace, BY_BUSY_TIME).schedule.tensor_throttle[0] == pytest.approx(RAMP_LOSS_S)


def test_matmuls_under_half_the_peak_do_not_ramp_tensor_e_up_for_dense_ones():
    # 4.4 us of 32-partition contractions (a quarter of the peak, TensorE busy throughout),
    # then 20 dense matmuls: TensorE used a quarter of its peak over the window, so the first
    # dense matmul starts a burst at half rate and the dense ones pay the whole ramp
    b = TraceBuilder()
    _stream(b, 20, 32)
    _stream(b, 20, 128)
    est = estimate_trace(b.trace, TRN2)
    sch = est.schedule
    first_dense = 20
    assert sch.finish[first_dense - 1] - sch.start[first_dense - 1] == pytest.approx(MATMUL_S)
    assert sch.finish[first_dense] - sch.start[first_dense] > 1.5 * MATMUL_S
    assert sch.tensor_throttle[0] == pytest.approx(RAMP_LOSS_S)
    # read as busy time, the quarter-peak ones pay the ramp and the dense ones run at full rate
    busy = estimate_trace(b.trace, BY_BUSY_TIME).schedule
    assert busy.finish[first_dense] - busy.start[first_dense] == pytest.approx(MATMUL_S)
    assert busy.finish[0] - busy.start[0] > 1.5 * MATMUL_S

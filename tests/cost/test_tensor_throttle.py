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

"""estimate() on real kernels in the simulator, footprints, and the Chrome trace format."""

from __future__ import annotations

import dataclasses
import itertools
import json
from types import SimpleNamespace

import pytest
import torch

from nki_kernels import _dispatch, simulator
from nki_kernels.ops import activations
from nki_kernels.simulator.cost import estimate_trace
from nki_kernels.simulator.cost.regions import region_of
from nki_kernels.simulator.hardware import TARGETS
from tests.cost._build import TraceBuilder, hbm, new_alloc, sbuf

TRN2 = TARGETS["trn2"]


def _gelu_kernel():
    call = activations.gelu_kernel_call(torch.randn(4, 4))
    with simulator.activated():
        return _dispatch.simulator_kernel(call)


def test_the_launch_cost_is_carried_beside_the_latency_with_the_second_core_added_at_lnc2():
    tgt = dataclasses.replace(TRN2, launch_overhead_s=11e-6, second_core_launch_s=5e-6)
    x = torch.randn(300, 1000).to(torch.bfloat16)
    for lnc, launch_us in ((1, 11.0), (2, 16.0)):
        with simulator.activated():
            kernel = _gelu_kernel()
            res = simulator.run(kernel[lnc] if lnc > 1 else kernel, x, op="gelu_tanh")
        plain = estimate_trace(res.trace, dataclasses.replace(TRN2, launch_overhead_s=0.0, second_core_launch_s=0.0))
        est = estimate_trace(res.trace, tgt)
        assert est.cores == lnc
        assert est.latency_us == plain.latency_us          # not part of the instruction stream's time
        assert est.launch_us == pytest.approx(launch_us) and plain.launch_us == 0.0


def test_estimate_runs_the_kernel_and_models_its_trace():
    x = torch.randn(300, 1000).to(torch.bfloat16)
    est = simulator.estimate(_gelu_kernel(), target="trn2")(x, op="gelu_tanh")
    expected = torch.nn.functional.gelu(x.double(), approximate="tanh")
    torch.testing.assert_close(est.outputs.double(), expected, atol=2e-2, rtol=2e-2)
    assert est.target == "trn2"
    assert est.hbm_bytes == 2 * x.numel() * 2            # read once, written once
    assert est.instruction_counts["dma_copy"] == 2 * est.instruction_counts["activation"]
    assert est.engine_instruction_counts["scalar"] == est.instruction_counts["activation"]
    assert est.latency_us >= max(est.engine_busy_us.values())
    assert est.latency_us >= est.hbm_bytes / TRN2.dma_bytes_per_s * 1e6
    assert est.bottleneck == "dma"
    assert "modeled (trn2)" in est.summary()


def test_estimate_for_each_target_uses_its_numbers():
    x = torch.randn(128, 8192).to(torch.bfloat16)
    kernel = _gelu_kernel()
    t = {name: simulator.estimate(kernel, target=name)(x).latency_us for name in ("trn1", "trn2", "trn3")}
    assert t["trn3"] < t["trn2"] < t["trn1"]


def test_estimate_rejects_an_unknown_target():
    with pytest.raises(ValueError, match="trn5"):
        simulator.estimate(_gelu_kernel(), target="trn5")


def _chrome(tmp_path, trace):
    est = estimate_trace(trace)
    path = est.to_chrome_trace(tmp_path / "sub" / "trace.json")
    return est, json.loads(path.read_text())


def test_chrome_trace_has_one_lane_per_engine_and_dma_queue(tmp_path):
    b = TraceBuilder()
    x, y = new_alloc(), new_alloc()
    b.dma(sbuf("dst", x, (128, 2048)), hbm("src", new_alloc(), (128, 2048)))
    b.activation(sbuf("dst", y, (128, 2048)), sbuf("data", x, (128, 2048)))
    b.dma(hbm("dst", new_alloc(), (8, 2048)), sbuf("src", y, (8, 2048)))
    est, doc = _chrome(tmp_path, b.trace)
    assert doc["displayTimeUnit"] == "ns"
    assert "MODELED" in doc["otherData"]["what"] and doc["otherData"]["target"] == "trn2"
    events = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(names.values()) == sorted(["TensorE", "VectorE", "ScalarE", "GpSimdE"]
                                            + [f"DMA queue {k}" for k in range(16)])
    process = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert process and "modeled" in process[0]["args"]["name"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["name"] for e in spans} == {"dma_copy", "activation"}
    for e in spans:
        assert e["tid"] in names and e["pid"] == 1
        assert e["ts"] >= 0 and e["dur"] >= 0
        assert isinstance(e["args"]["instruction"], int)
    # the 128-partition load is spread over 16 queues, the 8-partition store over one
    loads = [e for e in spans if e["args"]["instruction"] == 0]
    stores = [e for e in spans if e["args"]["instruction"] == 2]
    assert len(loads) == 16 and len(stores) == 1
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(est.latency_us)


def test_chrome_trace_lanes_never_run_two_things_at_once(tmp_path):
    b = TraceBuilder()
    for _ in range(6):
        t = new_alloc()
        b.dma(sbuf("dst", t, (128, 1024)), hbm("src", new_alloc(), (128, 1024)))
        b.activation(sbuf("dst", new_alloc(), (128, 1024)), sbuf("data", t, (128, 1024)))
        b.tensor_copy(sbuf("dst", new_alloc(), (128, 1024)), sbuf("src", t, (128, 1024)))
    _, doc = _chrome(tmp_path, b.trace)
    by_lane: dict = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            by_lane.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_lane.values():
        spans.sort()
        for (s0, e0), (s1, _) in zip(spans, spans[1:]):
            assert s1 >= e0 - 1e-9


def test_chrome_trace_caps_the_number_of_events(tmp_path):
    b = TraceBuilder()
    for _ in range(10):
        b.activation(sbuf("dst", new_alloc(), (128, 64)), sbuf("data", new_alloc(), (128, 64)))
    est = estimate_trace(b.trace)
    doc = json.loads(est.to_chrome_trace(tmp_path / "t.json", max_events=4).read_text())
    assert sum(e["ph"] == "X" for e in doc["traceEvents"]) == 4
    assert doc["otherData"]["truncated"] is True


# ----------------------------------------------------------------------------- footprints

def _view(shape, strides, offset=0):
    hi = offset + 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    return SimpleNamespace(shape=shape, strides=strides, offset=offset, span=(offset, hi))


def test_column_slices_of_a_tile_do_not_overlap_but_their_hulls_do():
    left, right = _view((128, 512), (1024, 1)), _view((128, 512), (1024, 1), offset=512)
    assert not region_of(left).overlaps(region_of(right))
    assert region_of(left).overlaps(region_of(_view((128, 1), (1024, 1), offset=511)))
    hull_l = SimpleNamespace(shape=left.shape, span=left.span)   # no offset/strides: hull only
    hull_r = SimpleNamespace(shape=right.shape, span=right.span)
    assert region_of(hull_l).overlaps(region_of(hull_r))


def _elements(view):
    """Every element offset ``view`` touches (brute force, the reference for region_of)."""
    return {view.offset + sum(i * st for i, st in zip(index, view.strides))
            for index in itertools.product(*(range(s) for s in view.shape))}


@pytest.mark.parametrize("offset, meet", [(8, False), (7, True), (24, False), (20, True)])
def test_runs_of_two_strided_views_overlap_only_where_they_share_elements(offset, meet):
    # [4, 2, 8] with strides (64, 16, 1): 8 runs of 8 in two strided dimensions (the general
    # multi-run form, no closed-form pattern). At offsets 8 and 24 the other view's runs
    # start where this view's end (touching, no element shared); at 7 and 20 they share
    # elements. Mutation testing found touching runs counted as overlapping unnoticed.
    a, b = _view((4, 2, 8), (64, 16, 1)), _view((4, 2, 8), (64, 16, 1), offset=offset)
    assert region_of(a).pattern is None and not region_of(a).single
    assert bool(_elements(a) & _elements(b)) == meet
    assert region_of(a).overlaps(region_of(b)) == meet
    assert region_of(b).overlaps(region_of(a)) == meet


def test_contiguous_views_are_one_run_and_cover_their_parts():
    whole = region_of(_view((128, 1024), (1024, 1)))
    assert whole.single and (whole.lo, whole.hi) == (0, 128 * 1024)
    assert whole.covers(region_of(_view((4, 1024), (1024, 1), offset=2048)))
    strided = region_of(_view((128, 4), (1024, 1), offset=8))
    assert not strided.single and not strided.covers(whole)


def test_broadcast_views_fall_back_to_the_hull():
    reg = region_of(_view((128, 64), (0, 1), offset=64))
    assert reg.single and (reg.lo, reg.hi) == (64, 128)

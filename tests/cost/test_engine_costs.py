"""kernels/engine_costs.py holds the cost model's numbers for the kernels (which may not
import the model): every value must equal the Target field it mirrors, per generation,
and a kernel built for a target must get that target's figures."""

from __future__ import annotations

import pytest
import torch

from nki_kernels import _kernel_sources, simulator
from nki_kernels.simulator.hardware import TARGETS


@pytest.fixture(scope="module")
def engine_costs():
    return _kernel_sources.load("engine_costs", "simulator")


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_figure_equals_the_cost_model_target(engine_costs, name):
    target = TARGETS[name]
    with simulator.activated(target=name):
        costs = engine_costs.active()
    for attr, (field, factor) in engine_costs.MIRRORS.items():
        assert getattr(costs, attr) == pytest.approx(getattr(target, field) * factor), (
            f"engine_costs {attr} for {name} differs from Target.{field}: update kernels/engine_costs.py")


def test_every_figure_is_mirrored(engine_costs):
    # a figure added to EngineCosts without naming its Target field would escape the check
    with simulator.activated(target="trn2"):
        costs = engine_costs.active()
    attrs = {a for a in vars(costs) if not a.startswith("_")}
    assert attrs == set(engine_costs.MIRRORS) | set(engine_costs.DERIVED)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_planning_charges_vectors_fixed_cost_less_its_pipeline_overlap(engine_costs, name):
    target = TARGETS[name]
    with simulator.activated(target=name):
        c = engine_costs.active()
    # the overlap the kernels plan with: the model's own on every generation (trn1's
    # measured, trn2's and trn3's borrowed from it), at most the fixed cost
    hidden = min(target.vector_overlap_cycles, target.vector_static_cycles)
    assert 0 < hidden < target.vector_static_cycles
    assert c.vector_stream_cycles == pytest.approx(target.vector_static_cycles - hidden)
    assert c.instruction_ns("vector", 512) == pytest.approx((512 + c.vector_stream_cycles) / c.vector_ghz)
    # an instruction that reads its predecessor's result waits for the pipeline to drain
    assert c.instruction_ns("vector", 512, reads_previous=True) == pytest.approx((512 + c.vector_instr_cycles) / c.vector_ghz)
    assert c.instruction_ns("scalar", 512, reads_previous=True) == pytest.approx(c.instruction_ns("scalar", 512))
    assert c.instruction_ns("gpsimd", 512) == pytest.approx((512 + c.gpsimd_instr_cycles) / c.gpsimd_ghz)
    assert c.vector_stream_cycles < c.vector_instr_cycles


def test_the_active_generation_follows_the_target(engine_costs):
    seen = {}
    for name in TARGETS:
        with simulator.activated(target=name):
            seen[name] = engine_costs.active()
    assert seen["trn1"] is not seen["trn2"] and seen["trn2"] is not seen["trn3"]
    assert seen["trn1"].vector_ghz == pytest.approx(TARGETS["trn1"].vector_hz / 1e9)


def test_queue_occupancy_is_the_models_rule(engine_costs):
    with simulator.activated(target="trn2"):
        c = engine_costs.active()
    t = TARGETS["trn2"]
    assert c.dma_occupancy_ns(10.0) == pytest.approx(t.dma_transfer_gap_s * 1e9)
    big = 10 * t.dma_transfer_gap_s * 1e9
    assert c.dma_occupancy_ns(big) == pytest.approx(big + t.dma_transfer_handoff_s * 1e9)


def test_transpose_data_time_is_the_models(engine_costs):
    """dma_transpose_ns (the kernels' planning figure) equals the data time the cost model
    gives one SBUF->SBUF dma_transpose (bf16 [128, 4, 128] -> [128, 4, 128], 128 KiB)."""
    def kernel(x):
        import nki.isa as nisa      # the simulator's nki while it runs the kernel
        import nki.language as nl

        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        a = nl.ndarray((128, 4, 128), dtype=x.dtype, buffer=nl.sbuf)
        b = nl.ndarray((128, 4, 128), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=x)
        nisa.dma_transpose(dst=b, src=a, axes=(2, 1, 0))
        nisa.dma_copy(dst=out, src=b)
        return out

    with simulator.activated(target="trn2"):
        c = engine_costs.active()
    x = torch.randn(128, 4, 128).to(torch.bfloat16)
    est = simulator.estimate(kernel, "trn2")(x)
    i = next(i for i, ins in enumerate(est.trace) if ins.op == "dma_transpose")
    detail = est.schedule.detail(i)
    assert detail["bytes"] == 128 * 4 * 128 * 2
    assert c.dma_transpose_ns(detail["bytes"]) == pytest.approx(detail["data_us_per_queue"] * 1e3, rel=1e-9)


@pytest.mark.parametrize("name", sorted(TARGETS))
@pytest.mark.parametrize("cols", [16, 64, 768, 4096])
def test_queue_data_time_is_the_models(engine_costs, name, cols):
    """queue_data_ns (the kernels' planning figure for one queue's share of a [128, F]
    transfer) equals the data time the cost model gives a bf16 [128, cols] load, its
    128 descriptors included (8 per queue)."""
    from nki_kernels.simulator.cost import dma_cost
    from tests.cost._build import TraceBuilder, hbm, new_alloc, sbuf

    with simulator.activated(target=name):
        c = engine_costs.active()
    b = TraceBuilder()
    ins = b.dma(sbuf("dst", new_alloc(), (128, cols), dtype="bfloat16"),
                hbm("src", new_alloc(), (128, cols), dtype="bfloat16"))
    cost = dma_cost(ins, TARGETS[name])
    assert cost.descriptors == 128 and cost.queues == 16
    assert c.queue_data_ns(cols * 2) == pytest.approx(cost.data_seconds * 1e9, rel=1e-9)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_the_vector_gpsimd_share_evens_out_the_models_two_input_passes(engine_costs, name):
    """The share the elementwise kernels give VectorE (activation_and_mul, activation_backward)
    makes a two-input fp32 multiply over n elements per partition take as long on VectorE
    (the share) as on GpSimd (the rest), by the cost model's own estimates."""
    def kernel(a, b):
        import nki.isa as nisa
        import nki.language as nl

        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        z = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        nisa.dma_copy(dst=y, src=b)
        cut = int(round(a.shape[1] * share))
        nisa.tensor_tensor(dst=z[:, :cut], data1=x[:, :cut], data2=y[:, :cut], op=nl.multiply,
                           engine=nisa.engine.vector)
        nisa.tensor_tensor(dst=z[:, cut:], data1=x[:, cut:], data2=y[:, cut:], op=nl.multiply,
                           engine=nisa.engine.gpsimd)
        nisa.dma_copy(dst=out, src=z)
        return out

    target = TARGETS[name]
    with simulator.activated(target=name):
        share = engine_costs.active().vector_gpsimd_share()
    assert share == pytest.approx(target.vector_hz / (target.vector_hz + target.gpsimd_hz))
    with simulator.activated(target=name):
        # 16-bit tiles on VectorE: twice the rate where the generation has the 2x mode
        rate = target.vector_perf_mode_half / 2
        share_16 = engine_costs.active().vector_gpsimd_share(rate)
    assert share_16 == pytest.approx(target.vector_hz * rate / (target.vector_hz * rate + target.gpsimd_hz / 2))
    a, b = torch.randn(128, 8192), torch.randn(128, 8192)
    est = simulator.estimate(kernel, name)(a, b)
    busy = est.engine_busy_us
    # within the two instructions' different fixed costs
    fixed_us = abs(target.vector_static_cycles / target.vector_hz - target.gpsimd_static_cycles / target.gpsimd_hz) * 1e6
    assert abs(busy["vector"] - busy["gpsimd"]) <= fixed_us + 0.01 * busy["vector"], busy


@pytest.mark.parametrize("name", sorted(TARGETS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_two_input_rate_is_the_models_tensor_tensor(engine_costs, name, dtype):
    """engine_costs.vector_two_input_rate (what rms_norm's, the norm backwards' and softmax
    backward's planning charge a VectorE tensor_tensor in SBUF): the model's two input
    passes over its 16-bit performance mode where the generation has it (trn2, trn3: 2x;
    trn1: none; until session 62 the LayerNorm and softmax backwards assumed it on trn1 too),
    so the estimate equals the modeled instruction, fixed cost included."""
    def kernel(a, b):
        import nki.isa as nisa
        import nki.language as nl

        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        nisa.dma_copy(dst=y, src=b)
        nisa.tensor_tensor(dst=x, data1=x, data2=y, op=nl.multiply, engine=nisa.engine.vector)
        nisa.dma_copy(dst=out, src=x)
        return out

    from nki_kernels.simulator.cost import compute_cost

    target = TARGETS[name]
    a, b = torch.randn(128, 3000).to(dtype), torch.randn(128, 3000).to(dtype)
    result = simulator.run(kernel, a, b, target=name)
    ins = next(i for i in result.trace if i.op == "tensor_tensor")
    with simulator.activated(target=name):
        c = engine_costs.active()
        rate = c.vector_two_input_rate(dtype == torch.bfloat16)
        estimated = c.instruction_ns("vector", 3000, rate, reads_previous=True)
    assert estimated == pytest.approx(compute_cost(ins, target).seconds * 1e9)
    assert rate == (target.vector_perf_mode_half / 2 if dtype == torch.bfloat16 else 0.5)


@pytest.mark.parametrize("name", sorted(TARGETS))
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_psum_copy_rate_is_the_models_tensor_copy_out_of_psum(engine_costs, name, dtype):
    """engine_costs.vector_psum_copy_rate (what the attention forward and backward plans
    charge a VectorE copy of a transposed tile out of PSUM): the model's half performance
    mode for 16-bit data with one side in PSUM (trn2, trn3: 2x; trn1: none), 1 for fp32,
    so the estimate equals the modeled instruction, fixed cost included."""
    from nki_kernels.simulator.cost import compute_cost
    from tests.cost._build import TraceBuilder, new_alloc, psum, sbuf

    target = TARGETS[name]
    b = TraceBuilder()
    ins = b._add("tensor_copy", "vector", [psum("src", new_alloc(), (128, 3000), dtype)],
                 [sbuf("dst", new_alloc(), (128, 3000), dtype)])
    with simulator.activated(target=name):
        c = engine_costs.active()
        rate = c.vector_psum_copy_rate(dtype == "bfloat16")
        estimated = c.instruction_ns("vector", 3000, rate, reads_previous=True)
    assert estimated == pytest.approx(compute_cost(ins, target).seconds * 1e9)
    assert rate == (target.vector_perf_mode_half if dtype == "bfloat16" else 1)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_dependency_waits_and_fp32_transposes_follow_the_cost_model(engine_costs, name):
    # what kernels estimate for a chain of dependent steps (kernels/softmax.py's split form)
    # must be what the model charges: its dependency wait per producer engine, and its
    # transpose rule on a hand-built fp32 transpose of either orientation
    from nki_kernels.simulator.cost import compute_cost
    from nki_kernels.simulator.cost.model import dependency_latency_seconds
    from tests.cost._build import TraceBuilder, new_alloc, psum, sbuf

    target = TARGETS[name]
    with simulator.activated(target=name):
        c = engine_costs.active()
    for engine in ("tensor", "vector", "scalar", "gpsimd"):
        assert c.dependency_ns(engine) == pytest.approx(dependency_latency_seconds(engine, target) * 1e9)
    b = TraceBuilder()
    for p, f in ((128, 1), (1, 128), (32, 200)):
        b._add("nc_transpose", "tensor", [sbuf("data", new_alloc(), (p, f), "float32")],
               [psum("dst", new_alloc(), (f, p), "float32")])
    for ins, (p, f) in zip(b.trace, ((128, 1), (1, 128), (32, 200))):
        assert c.fp32_transpose_ns(p, f) == pytest.approx(compute_cost(ins, target).cycles / target.tensor_hz * 1e9)

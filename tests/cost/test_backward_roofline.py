"""Backward rows: the registry's ``Backward`` declarations, the backward limits and the
modeled eager-autograd baselines (``roofline.eager_autograd``), and the main job's rows."""

from __future__ import annotations

import pytest
import torch

from nki_kernels import _dispatch, _kernel_sources, registry
from nki_kernels import roofline as R
from nki_kernels.simulator.hardware import TARGETS

CASES = [(spec, w) for spec in registry.ops() if spec.backward is not None for w in spec.workloads
         if spec.backward.covers(*w.make(torch.Generator().manual_seed(0)))]


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_the_norms_declare_backward_kernels():
    assert {s.name for s in registry.ops() if s.backward is not None} >= {
        "rms_norm", "layer_norm", "fused_add_rms_norm", "gelu", "silu", "silu_and_mul", "gelu_and_mul", "softmax",
        "apply_rotary_pos_emb"}


# The S = 4096 attention workload's float32 reference backward alone takes ~25 s: behind the
# sweep marker (the other attention workloads take the same path in the default run)
PARAMS = [pytest.param(s, w, id=f"{s.name}-{w.name}", marks=[pytest.mark.sweep] if "long-S" in w.name else [])
          for s, w in CASES]


@pytest.mark.parametrize("spec, workload", PARAMS)
def test_backward_workloads_launch_a_kernel_and_model_eager_autograd(spec, workload):
    gen = torch.Generator().manual_seed(0)
    args, kwargs = spec.backward.inputs(gen, *workload.make(gen))
    call = spec.backward.kernel_call(*args, **kwargs)
    assert isinstance(call, _dispatch.KernelCall)
    assert callable(_dispatch.simulator_kernel(call))
    assert _kernel_sources.source_path(call.module).is_file()
    roof = spec.backward.roofline(*args, **kwargs, lnc=2)
    assert roof.limit_us > 0 and roof.bound in ("dma", "tensor", "scalar")
    # eager autograd is charged at each ATen op's own limit: never below the fused limit
    assert roof.eager_us >= roof.limit_us * (1 - 1e-9)
    # LNC=1 against 2: two cores' TensorE and ScalarE, their DMA up to the shared HBM stack
    one = spec.backward.roofline(*args, **kwargs, lnc=1)
    trn2 = TARGETS["trn2"]
    gain = {"dma": trn2.hbm_stack_bytes_per_s / trn2.dma_bytes_per_s, "tensor": 2, "scalar": 2}
    assert one.limit_us == pytest.approx(gain[one.bound] * roof.limit_us)
    for a, b in zip(one.eager_steps, roof.eager_steps, strict=True):
        assert a.us == pytest.approx(gain[a.bound] * b.us)
    # the main job checks the kernel against the declared reference on the same arguments
    grads = spec.backward.reference(*args, **kwargs, compute_dtype=torch.float32)
    grads = grads if isinstance(grads, tuple) else (grads,)
    assert grads and all(isinstance(g, torch.Tensor) and not g.isnan().any() for g in grads)


def test_rms_norm_backward_limit_is_its_compulsory_traffic():
    x, w = _meta(2048, 4096), _meta(4096)
    r = R.rms_norm_backward(x, x, (4096,), w, 1e-6, lnc=1, target="trn2")
    # reads dy, x, weight; writes dx, dweight (bf16)
    assert r.work.hbm_bytes == 3 * 2048 * 4096 * 2 + 2 * 4096 * 2
    assert r.limit_us == pytest.approx(r.work.hbm_bytes / 368e9 * 1e6)


def test_eager_autograd_records_what_autograd_dispatches():
    x, w = _meta(64, 32), _meta(32)
    # layer_norm's backward is one fused ATen op (it reads the forward's fp32 mean / rstd)
    steps = R.eager_autograd(lambda x_, w_: torch.nn.functional.layer_norm(x_, (32,), w_, None, 1e-5),
                             (x, w), (0, 1))
    assert [s.name for s in steps] == ["native_layer_norm_backward"]
    # F.rms_norm's decomposition: one ATen op per step, every intermediate through HBM
    steps = R.eager_autograd(lambda x_, w_: torch.nn.functional.rms_norm(x_, (32,), w_, 1e-6), (x, w), (0, 1))
    names = [s.name for s in steps]
    assert names.count("mul") >= 4 and "sum" in names and "pow" in names
    assert all(s.hbm_bytes > 0 for s in steps)
    # rms_norm's backward reuses the forward's rstd: its powers are integer ones (r^3, x^1),
    # multiplications, no transcendental
    assert sum(s.transcendentals for s in steps) == 0
    # a fractional power is a transcendental per element, an integer one is not
    frac = R.eager_autograd(lambda x_: x_.pow(1.5), (x,), (0,))
    whole = R.eager_autograd(lambda x_: x_.pow(3), (x,), (0,))
    assert sum(s.transcendentals for s in frac) == 64 * 32 and sum(s.transcendentals for s in whole) == 0


def test_eager_autograd_counts_matmul_flops():
    a, b = _meta(64, 32), _meta(32, 16)
    steps = R.eager_autograd(lambda a_, b_: a_ @ b_, (a, b), (0, 1))
    assert sum(s.matmul_flops for s in steps) == 2 * (2 * 64 * 16 * 32)   # d a and d b


def test_report_has_a_backward_row_after_each_forward_row(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import model_report

    cases = model_report.grid(quick=False)
    for i, case in enumerate(cases):
        if case.backward:
            assert cases[i - 1].spec is case.spec and cases[i - 1].workload is case.workload
            assert case.op == f"{case.spec.name} backward"
    # every covered workload but the token-generation ones (inference only) has its backward row
    assert sum(c.backward for c in cases) == len([w for _, w in CASES if not w.inference_only])
    assert not any(c.backward and c.workload.inference_only for c in cases)
    assert any(w.inference_only for _, w in CASES)      # the rule above is exercised

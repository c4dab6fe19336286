"""The RMSNorm backward kernels at their widest rows (16 KiB per partition: bf16 H = 8192,
fp32 H = 4096, the most the op gives them, kernels/limits.py) fit every generation's SBUF,
and kernels/rms_norm_backward.py's bound on what is live, by which it picks how many blocks
to load ahead, holds against the simulator's liveness sweep.

Until 2026-12-05 fused_add_rms_norm's backward loaded two blocks ahead up to H = 4096
whatever the dtype, and one beyond: fp32 rows of 4096 then needed 240 KiB per partition
(trn2 has 224) and bf16 rows of 8192 on trn1 192 KiB and a few bytes (trn1 has 192)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from nki_kernels import _dispatch, backward_references, simulator
from nki_kernels.ops import norms
from nki_kernels.simulator import hardware
from tests._helpers import rel_error

# (dtype, H): rows of 16 KiB per partition
WIDEST = [(torch.bfloat16, 8192), (torch.float32, 4096)]
# ||error|| / ||expected|| of dx, as tests/ops/test_norm_backward.py bounds it: bf16 rounds
# g, g * x, the centred term and the output (~2e-3 measured); fp32 computes in fp32
NORM_REL = {torch.bfloat16: 6e-3, torch.float32: 1e-6}
# (target, LNC): every generation at its launch degree
TARGETS = [("trn1", 1), ("trn2", 2), ("trn3", 2)]


def _call(fused, weight, dtype, hidden, rows):
    x, dy, dtotal = (torch.randn(rows, hidden).to(dtype) for _ in range(3))
    w = (1 + 0.1 * torch.randn(hidden)).to(dtype) if weight else None
    if fused:
        call = norms.fused_add_rms_norm_backward_kernel_call(dy, dtotal, x, w, 1e-6)
        reference = backward_references.fused_add_rms_norm_backward(
            dy.double(), dtotal.double(), x.double(), None if w is None else w.double(), 1e-6,
            compute_dtype=torch.float64)
    else:
        call = norms.rms_norm_backward_kernel_call(dy, x, (hidden,), w, 1e-6)
        reference = backward_references.rms_norm_backward(dy.double(), x.double(), [hidden],
                                                          None if w is None else w.double(), 1e-6,
                                                          compute_dtype=torch.float64)
    return call, reference[0]


def _run(call, target, lnc):
    with simulator.activated(target):
        kernel = _dispatch.simulator_kernel(call)
    return simulator.run(kernel[lnc], *[t.contiguous() for t in call.tensors], **call.static, target=target)


@pytest.mark.parametrize("target, lnc", TARGETS, ids=[t for t, _ in TARGETS])
@pytest.mark.parametrize("dtype, hidden", WIDEST, ids=["bf16-8192", "fp32-4096"])
@pytest.mark.parametrize("fused, weight", [(False, True), (True, True), (True, False)],
                         ids=["rms_norm", "fused_add", "fused_add-noweight"])
def test_widest_rows_fit_sbuf_and_give_the_gradient(target, lnc, dtype, hidden, fused, weight):
    # five 128-row blocks per core: the pipeline reaches its steady state (blocks in flight
    # on both sides of the one computed)
    call, expected = _call(fused, weight, dtype, hidden, rows=5 * 128 * lnc)
    result = _run(call, target, lnc)        # raises CapacityError where the tiles do not fit
    assert max(result.core_peak_sbuf_bytes_per_partition) <= hardware.TARGETS[target].sbuf_bytes_per_partition
    dx = call.finish_outputs(result.outputs)
    dx = dx[0] if isinstance(dx, tuple) else dx
    assert rel_error(dx, expected) < NORM_REL[dtype]


@pytest.mark.parametrize("ahead", [0, 1, 2])
@pytest.mark.parametrize("fused, weight", [(False, True), (False, False), (True, True), (True, False)],
                         ids=["rms_norm", "rms_norm-noweight", "fused_add", "fused_add-noweight"])
def test_the_prefetch_bound_covers_the_liveness_sweep(monkeypatch, ahead, fused, weight):
    # with the blocks ahead forced and SBUF unbounded, the simulator's peak stays within
    # _prefetch_ahead's bound: (inputs * (ahead + 2) + 3) blocks and SMALL_TILES [P, J] tiles
    monkeypatch.setitem(hardware.TARGETS, "trn2", dataclasses.replace(hardware.TARGETS["trn2"],
                                                                      sbuf_bytes_per_partition=4 << 20))
    # LNC=1: two parts of four 128-row blocks, enough for two blocks ahead to be in flight
    dtype, hidden = torch.bfloat16, 8192
    call, _ = _call(fused, weight, dtype, hidden, rows=8 * 128)
    with simulator.activated("trn2"):
        kernel = _dispatch.simulator_kernel(call)
    module = next(m for name, m in sys.modules.items()
                  if name.endswith(".rms_norm_backward") and hasattr(m, "_prefetch_ahead"))
    monkeypatch.setattr(module, "_prefetch_ahead", lambda *args: ahead)
    result = simulator.run(kernel[1], *[t.contiguous() for t in call.tensors], **call.static, target="trn2")
    inputs = 3 if fused else 2
    block = hidden * 2                                          # J = 1 row of bf16 per partition
    bound = (inputs * (ahead + 2) + 3) * block + module.SMALL_TILES * 4
    peak = max(result.core_peak_sbuf_bytes_per_partition)
    assert peak <= bound
    # and the bound is not loose by more than a block (weighted rows meet it exactly)
    assert peak > bound - block - module.SMALL_TILES * 4

"""Kernels whose prefetch depth follows the SBUF they are built for, at the widest rows the
ops give them (kernels/limits.py): they fit every generation's SBUF and give the right
result, and each kernel's bound on what is live, by which it picks how many blocks to load
ahead (``_prefetch_ahead``), holds against the simulator's liveness sweep.

Until 2026-12-05 these picked their depth by a row length fit to trn2, and overflowed SBUF
(a CapacityError in the simulator, a failed build on hardware) on:
  * fused_add_rms_norm's backward: fp32 H = 4096 on trn1 and trn2, bf16 H = 8192 on trn1,
    and with an fp32 weight on bf16 / fp16 rows of 8192 on trn3;
  * softmax's backward: fp32 rows of 8192 on every generation;
  * layer_norm: fp32 H = 8192 on trn1;
  * silu_and_mul's and gelu_and_mul's backward: fp32 rows of d = 4096 outputs on every
    generation (their widest chunk, kernels/activation_backward.py COL_CHUNK)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
import torch.nn.functional as F

from nki_kernels import _dispatch, backward_references, simulator
from nki_kernels.ops import activations, norms, softmax
from nki_kernels.simulator import hardware
from tests._helpers import rel_error

# (target, LNC): every generation at its launch degree
TARGETS = [("trn1", 1), ("trn2", 2), ("trn3", 2)]
# ||error|| / ||expected|| against float64: bf16 rounds a few intermediates to the input
# dtype and the output (~2e-3 measured; tests/ops/test_norm_backward.py's bound); fp32
# computes in fp32 (layer_norm's bn_stats variance: ~1e-6)
NORM_REL = {torch.bfloat16: 6e-3, torch.float32: 2e-6}


def _rows(n, hidden, dtype):
    return torch.randn(n, hidden).to(dtype)


def _rms_backward(fused, weight, weight_dtype=None):
    def make(dtype, hidden, rows):
        x, dy, dtotal = (_rows(rows, hidden, dtype) for _ in range(3))
        w = (1 + 0.1 * torch.randn(hidden)).to(weight_dtype or dtype) if weight else None
        w64 = None if w is None else w.double()
        if fused:
            call = norms.fused_add_rms_norm_backward_kernel_call(dy, dtotal, x, w, 1e-6)
            ref = backward_references.fused_add_rms_norm_backward(dy.double(), dtotal.double(), x.double(), w64, 1e-6,
                                                                  compute_dtype=torch.float64)[0]
        else:
            call = norms.rms_norm_backward_kernel_call(dy, x, (hidden,), w, 1e-6)
            ref = backward_references.rms_norm_backward(dy.double(), x.double(), [hidden], w64, 1e-6,
                                                        compute_dtype=torch.float64)[0]
        return call, ref
    return make


def _softmax_backward(dtype, hidden, rows):
    y = torch.softmax(torch.randn(rows, hidden) * 3, -1).to(dtype)
    dy = _rows(rows, hidden, dtype)
    y64 = y.double()
    ref = y64 * (dy.double() - (dy.double() * y64).sum(-1, keepdim=True))
    return softmax.softmax_backward_kernel_call(dy, y), ref


def _layer_norm(dtype, hidden, rows):
    x = (torch.randn(rows, hidden) * 2 + 0.5).to(dtype)
    w, b = (torch.randn(hidden) + 1).to(dtype), torch.randn(hidden).to(dtype)
    ref = F.layer_norm(x.double(), (hidden,), w.double(), b.double(), 1e-5)
    return norms.layer_norm_kernel_call(x, (hidden,), w, b, 1e-5), ref


def _rms_norm(dtype, hidden, rows):
    x, w = (torch.randn(rows, hidden) * 2).to(dtype), (torch.randn(hidden) + 1).to(dtype)
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    return norms.rms_norm_kernel_call(x, (hidden,), w, 1e-6), ref


def _fused_add_rms_norm(dtype, hidden, rows):
    x, r = (torch.randn(rows, hidden) * 2).to(dtype), torch.randn(rows, hidden).to(dtype)
    w = (torch.randn(hidden) + 1).to(dtype)
    s = (x + r).double()
    ref = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    return norms.fused_add_rms_norm_kernel_call(x, r, w, 1e-6), ref


def _silu_and_mul_backward(dtype, hidden, rows):
    # hidden = d, the output width: x = [g | u] is [rows, 2d]
    x, dy = (torch.randn(rows, 2 * hidden) * 2).to(dtype), _rows(rows, hidden, dtype)
    g, u = x.double()[:, :hidden], x.double()[:, hidden:]
    sig = torch.sigmoid(g)
    ref = torch.cat([dy.double() * u * sig * (1 + g * (1 - sig)), dy.double() * g * sig], dim=-1)
    return activations.silu_and_mul_backward_kernel_call(dy, x), ref


# (id, make(dtype, hidden, rows) -> (kernel call, float64 expected first output), the
# widest rows as (dtype, hidden)): rows of 16 KiB per partition for the RMSNorm backward
# (kernels/limits.py NORM_BACKWARD_MAX_ROW_BYTES), 8192 columns for softmax and layer_norm,
# one whole chunk of 4096 outputs for the gated backward
KERNELS = [
    ("rms_norm_backward", _rms_backward(False, True), [(torch.bfloat16, 8192), (torch.float32, 4096)]),
    ("fused_add_backward", _rms_backward(True, True), [(torch.bfloat16, 8192), (torch.float32, 4096)]),
    ("fused_add_backward-noweight", _rms_backward(True, False), [(torch.bfloat16, 8192), (torch.float32, 4096)]),
    # an fp32 weight on 16-bit rows: its broadcast row is twice a block (trn3 overflowed)
    ("fused_add_backward-fp32weight", _rms_backward(True, True, torch.float32), [(torch.bfloat16, 8192)]),
    ("softmax_backward", _softmax_backward, [(torch.bfloat16, 8192), (torch.float32, 8192)]),
    ("layer_norm", _layer_norm, [(torch.bfloat16, 8192), (torch.float32, 8192)]),
    # and streamed rows kept in SBUF between the passes: two row tiles' slots where they fit
    ("fused_add_rms_norm", _fused_add_rms_norm, [(torch.bfloat16, 8192), (torch.float32, 8192),
                                                 (torch.bfloat16, 16384), (torch.float32, 16384)]),
    ("rms_norm-streamed", _rms_norm, [(torch.bfloat16, 16384), (torch.bfloat16, 32768), (torch.float32, 16384)]),
    ("silu_and_mul_backward", _silu_and_mul_backward, [(torch.bfloat16, 4096), (torch.float32, 4096)]),
]
WIDEST = [(name, make, dtype, hidden) for name, make, widths in KERNELS for dtype, hidden in widths]


def _run(call, target, lnc):
    with simulator.activated(target):
        kernel = _dispatch.simulator_kernel(call)
    return simulator.run(kernel[lnc], *[t.contiguous() for t in call.tensors], **call.static, target=target)


@pytest.mark.parametrize("target, lnc", TARGETS, ids=[t for t, _ in TARGETS])
@pytest.mark.parametrize("name, make, dtype, hidden", WIDEST,
                         ids=[f"{n}-{str(d)[6:]}-{h}" for n, _, d, h in WIDEST])
def test_widest_rows_fit_sbuf_and_give_the_result(target, lnc, name, make, dtype, hidden):
    # five 128-row blocks per core: the pipeline reaches its steady state (blocks in flight
    # on both sides of the one computed)
    call, expected = make(dtype, hidden, 5 * 128 * lnc)
    result = _run(call, target, lnc)        # raises CapacityError where the tiles do not fit
    assert max(result.core_peak_sbuf_bytes_per_partition) <= hardware.TARGETS[target].sbuf_bytes_per_partition
    out = call.finish_outputs(result.outputs)
    out = out[0] if isinstance(out, tuple) else out
    assert rel_error(out, expected) < NORM_REL[dtype]


def _kernel_module(suffix):
    return next(m for name, m in sys.modules.items() if name.endswith(suffix) and hasattr(m, "_prefetch_ahead"))


# (id, make, dtype, hidden, kernel module suffix, bound(module, ahead, block bytes, row
# bytes)), each at J = 1 (one row per partition: a block is a row)
BOUNDS = [
    # rms_norm's backward with its ring of g (G_RING_DEPTH tiles where SBUF holds them, as
    # here: _g_ring_depth) in place of the two a tile per block rotates, and its a' tile
    ("rms_norm_backward", _rms_backward(False, True), torch.bfloat16, 8192, ".rms_norm_backward",
     lambda m, a, block, row: (2 * (a + 2) + m.G_RING_DEPTH) * block + row + m.SMALL_TILES * 4
     + m._a_prime_bytes(1, 8192, 2, "diagonal" if m.diag_fits(8192) else "columns")),
    ("fused_add_backward", _rms_backward(True, True), torch.bfloat16, 8192, ".rms_norm_backward",
     lambda m, a, block, row: (3 * (a + 2) + 2) * block + row + m.SMALL_TILES * 4),
    ("fused_add_backward-fp32weight", _rms_backward(True, True, torch.float32), torch.bfloat16, 8192,
     ".rms_norm_backward", lambda m, a, block, row: (3 * (a + 2) + 2) * block + 2 * row + m.SMALL_TILES * 4),
    ("fused_add_backward-noweight", _rms_backward(True, False), torch.bfloat16, 8192, ".rms_norm_backward",
     lambda m, a, block, row: (3 * (a + 2) + 2) * block + m.SMALL_TILES * 4),
    ("softmax_backward", _softmax_backward, torch.bfloat16, 8192, ".softmax_backward",
     lambda m, a, block, row: (2 * (a + 1) + 2) * block + row // 2 * 4),
    ("layer_norm", _layer_norm, torch.float32, 8192, ".layer_norm",
     lambda m, a, block, row: (a + 3) * block + 2 * row + row),
    # fused_add_rms_norm's forward: x and residual of ahead + 1 blocks, the sum and the
    # output of two blocks, the weight row
    ("fused_add_rms_norm", _fused_add_rms_norm, torch.bfloat16, 8192, ".rms_norm",
     lambda m, a, block, row: (2 * (a + 1) + 2) * block + row + m.FUSED_SMALL_TILES * 4),
    ("silu_and_mul_backward", _silu_and_mul_backward, torch.float32, 4096, ".activation_backward",
     lambda m, a, block, row: 3 * (a + 2) * block + 3 * row),
]


@pytest.mark.parametrize("ahead", [0, 1, 2])
@pytest.mark.parametrize("name, make, dtype, hidden, suffix, bound", BOUNDS, ids=[b[0] for b in BOUNDS])
def test_the_prefetch_bound_covers_the_liveness_sweep(monkeypatch, ahead, name, make, dtype, hidden, suffix, bound):
    # blocks ahead forced, SBUF unbounded: the simulator's peak stays within the kernel's
    # bound, and under it by at most a block (the bound is not a loose guess). LNC=1: two
    # parts of four 128-row blocks, enough for two blocks ahead to be in flight
    monkeypatch.setitem(hardware.TARGETS, "trn2", dataclasses.replace(hardware.TARGETS["trn2"],
                                                                      sbuf_bytes_per_partition=4 << 20))
    call, _ = make(dtype, hidden, 8 * 128)
    with simulator.activated("trn2"):
        kernel = _dispatch.simulator_kernel(call)
    module = _kernel_module(suffix)
    monkeypatch.setattr(module, "_prefetch_ahead", lambda *args: ahead)
    result = simulator.run(kernel[1], *[t.contiguous() for t in call.tensors], **call.static, target="trn2")
    row = hidden * torch.tensor([], dtype=dtype).element_size()
    limit = bound(module, ahead, row, row)
    peak = max(result.core_peak_sbuf_bytes_per_partition)
    assert peak <= limit
    assert peak > limit - row - 1024

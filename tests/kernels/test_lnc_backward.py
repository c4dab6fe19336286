"""The block ops' backward kernels at both logical-core degrees: the same outputs bit for bit
at LNC=1 and LNC=2 (weight-gradient partials included), the gradients right, and no race
between the two programs of an LNC=2 launch: no HBM element written by both cores, and no
core reading an output element the other core wrote (the weight gradients are per-part
partials, kernels/weight_grads.py; a shared accumulator would fail here)."""

from __future__ import annotations

import pytest
import torch

from nki_kernels import _dispatch, backward_references, references, simulator
from nki_kernels.ops import activations, norms, rotary, softmax
from tests._helpers import TOLERANCES, hbm_races

BF16, F32 = torch.bfloat16, torch.float32


def _x(*shape, dtype=BF16):
    return torch.randn(*shape).to(dtype)


def _rms(rows, hidden, weight=True, dtype=BF16):
    return lambda: norms.rms_norm_backward_kernel_call(_x(rows, hidden, dtype=dtype), _x(rows, hidden, dtype=dtype),
                                                        (hidden,), _x(hidden, dtype=dtype) if weight else None, 1e-6)


def _fused(rows, hidden, dtype=BF16):
    return lambda: norms.fused_add_rms_norm_backward_kernel_call(
        _x(rows, hidden, dtype=dtype), _x(rows, hidden, dtype=dtype), _x(rows, hidden, dtype=dtype),
        _x(hidden, dtype=dtype), 1e-6)


def _ln(rows, hidden, weight=True, bias=True, dtype=BF16):
    def make():
        x = _x(rows, hidden, dtype=dtype)
        return norms.layer_norm_backward_kernel_call(
            _x(rows, hidden, dtype=dtype), x, references.layer_norm_stats(x, (hidden,), LN_EPS), (hidden,),
            _x(hidden, dtype=dtype) if weight else None, _x(hidden, dtype=dtype) if bias else None, LN_EPS)
    return make


# the eps of the layer_norm cases (in the saved statistics; the float64 twin recomputes them)
LN_EPS = 1e-5


# (name, kernel call, float64 twin of the op's outputs); work counts of one 128-row tile
# (core 0 idle), odd tile counts, a tail, rows beyond a diagonal accumulator (column sums)
CASES = [
    ("rms-1row", _rms(1, 96), backward_references.rms_norm_backward),
    ("rms-3tiles+7", _rms(3 * 128 + 7, 200), backward_references.rms_norm_backward),
    ("rms-noweight-129", _rms(129, 64, weight=False), backward_references.rms_norm_backward),
    ("rms-columns-300", _rms(300, 4500), backward_references.rms_norm_backward),
    ("rms-fp32-257", _rms(257, 96, dtype=F32), backward_references.rms_norm_backward),
    ("fused-129", _fused(129, 64), backward_references.fused_add_rms_norm_backward),
    ("ln-1576x768", _ln(1576, 768), backward_references.layer_norm_backward),
    ("ln-bias-only-5", _ln(5, 40, weight=False), backward_references.layer_norm_backward),
    ("ln-columns-260", _ln(260, 4000), backward_references.layer_norm_backward),
    ("gelu-3x128+7", lambda: activations.gelu_backward_kernel_call(_x(3, 135), _x(3, 135)),
     backward_references.gelu_backward),
    ("silu-5", lambda: activations.silu_backward_kernel_call(_x(5), _x(5)), backward_references.silu_backward),
    ("silu_and_mul-3tiles+7", lambda: activations.silu_and_mul_backward_kernel_call(_x(391, 40), _x(391, 80)),
     backward_references.silu_and_mul_backward),
    ("gelu_and_mul-wide-130", lambda: activations.gelu_and_mul_backward_kernel_call(_x(130, 4100), _x(130, 8200)),
     backward_references.gelu_and_mul_backward),
    ("softmax-packed-300", lambda: softmax.softmax_backward_kernel_call(
        _x(300, 33), torch.softmax(torch.randn(300, 33), -1).to(BF16)), backward_references.softmax_backward),
    ("softmax-1row", lambda: softmax.softmax_backward_kernel_call(
        _x(1, 500), torch.softmax(torch.randn(1, 500), -1).to(BF16)), backward_references.softmax_backward),
    ("rotary-3units", lambda: rotary.apply_rotary_pos_emb_backward_kernel_call(
        _x(3, 2, 100, 32), _x(3, 2, 100, 32), _x(3, 100, 32), _x(3, 100, 32)),
     backward_references.apply_rotary_pos_emb_backward),
]


ONE_UNIT = {"silu-5", "softmax-1row"}


def test_every_one_unit_case_is_a_case():
    assert ONE_UNIT <= {c[0] for c in CASES}


def _run(call, lnc):
    kernel = _dispatch.simulator_kernel(call)[lnc]
    return simulator.run(kernel, *[t.contiguous() for t in call.tensors], **call.static)


@pytest.mark.parametrize("name, make_call, twin", CASES, ids=[c[0] for c in CASES])
def test_both_degrees_give_identical_outputs_without_races(name, make_call, twin):
    call = make_call()
    one, two = _run(call, 1), _run(call, 2)
    outs1 = one.outputs if isinstance(one.outputs, tuple) else (one.outputs,)
    outs2 = two.outputs if isinstance(two.outputs, tuple) else (two.outputs,)
    assert len(outs1) == len(outs2)
    for a, b in zip(outs1, outs2):
        assert not torch.isnan(b).any(), "an element no program wrote"
        assert torch.equal(a, b), "LNC=2 differs from LNC=1"
    assert hbm_races(two.trace) == []
    # the output is split as the work split says: one unit of work (one row tile without a
    # weight gradient) is stored by the last program; every other case by both cores (the
    # norms' weight-gradient partials are per core even for one row)
    stores = {ins.attrs.get("core") for ins in two.trace if ins.op == "dma_copy" and ins.writes[0].buffer == "hbm"}
    assert stores == ({1} if name in ONE_UNIT else {0, 1})
    # the finished gradients against the float64 twin of the same call
    finished = call.finish_outputs(two.outputs)
    finished = finished if isinstance(finished, tuple) else (finished,)
    expected = _twin_of(name, call, twin)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(finished) == len(expected), name
    for got, want in zip(finished, expected):
        if want.numel() == 0:
            assert got.numel() == 0
            continue
        # the gradient's dtype's tolerance, relative to its largest element (the per-element
        # bounds are tests/ops/test_norm_backward.py's)
        atol, _ = TOLERANCES[got.dtype]
        scale = float(want.double().abs().max())
        assert float((got.double() - want.double()).abs().max()) <= atol * scale, name


def _twin_of(name, call, twin):
    """The float64 twin's gradients for a kernel call (its tensors are the [N, H] views)."""
    t = [x.double() for x in call.tensors]
    if name.startswith(("gelu", "silu", "softmax")):
        return twin(t[0], t[1], compute_dtype=torch.float64)
    if name.startswith("rotary"):
        return twin(*t, compute_dtype=torch.float64)
    hidden = t[0].shape[-1]
    if name.startswith("ln"):      # [dy, x, stats (read by the kernel only), weight]
        weight = t[3] if len(t) > 3 else None
        bias = torch.zeros(hidden, dtype=torch.float64) if call.static["with_bias"] else None
        return twin(t[0], t[1], [hidden], weight, bias, LN_EPS, compute_dtype=torch.float64)
    eps = call.static["eps"]
    if name.startswith("fused"):
        return twin(t[0], t[1], t[2], t[3] if len(t) > 3 else None, eps, compute_dtype=torch.float64)
    return twin(t[0], t[1], [hidden], t[2] if len(t) > 2 else None, eps, compute_dtype=torch.float64)


def test_a_shared_accumulator_would_be_reported_as_a_race():
    # the race check itself: a trace whose two cores write the same HBM elements
    from types import SimpleNamespace

    op = SimpleNamespace(buffer="hbm", alloc_id=7, offset=0, shape=(4,), strides=(1,))
    trace = [SimpleNamespace(attrs={"core": c}, writes=(op,), reads=()) for c in (0, 1)]
    assert hbm_races(trace) == ["allocation 7: 4 elements written by both cores"]

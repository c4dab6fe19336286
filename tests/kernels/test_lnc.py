"""Every kernel at both logical-core degrees (LNC=1 and LNC=2): the same outputs, bit for
bit, on odd shapes — including work counts of 1 (one core has nothing to do) and odd
counts — and the work split between the two programs."""

from __future__ import annotations

import pytest
import torch

from nki_kernels import _dispatch, references, simulator
from nki_kernels.ops import activations, attention, norms, rotary, softmax
from tests._helpers import TOLERANCES, hbm_races

BF16, F32 = torch.bfloat16, torch.float32


def _x(*shape, dtype=BF16, scale=1.0):
    return (torch.randn(*shape) * scale).to(dtype)


def _rope(b, h, hk, s, d, dtype=BF16):
    ang = torch.randn(b, s, d // 2).repeat(1, 1, 2)
    return _x(b, h, s, d, dtype=dtype), _x(b, hk, s, d, dtype=dtype), ang.cos().to(dtype), ang.sin().to(dtype)


def _fused_add_reference(call, eps):
    """(normed, total): the sum is defined in the input dtype (an eager add's rounding), the
    norm of that sum in float64, unrounded."""
    x, residual = call.tensors[0], call.tensors[1]
    weight = call.tensors[2].double() if len(call.tensors) > 2 and call.tensors[2] is not None else None
    total = (x.double() + residual.double()).to(x.dtype)
    normed = references.rms_norm(total.double(), (total.shape[-1],), weight, eps, compute_dtype=torch.float64)
    return normed, total


def _softmax_reference(call):
    return references.softmax(call.tensors[0].double(), compute_dtype=torch.float64)


# (name, kernel call, float64 reference of the op's outputs)
CASES = [
    ("elementwise-5", lambda: activations.gelu_kernel_call(_x(5)),
     lambda c: references.gelu(c.tensors[0].double(), compute_dtype=torch.float64)),
    ("elementwise-3x128+7", lambda: activations.silu_kernel_call(_x(3, 128 + 7 // 3 + 2)),
     lambda c: references.silu(c.tensors[0].double(), compute_dtype=torch.float64)),
    ("rms_norm-1row", lambda: norms.rms_norm_kernel_call(_x(1, 96), (96,), _x(96), 1e-6),
     lambda c: references.rms_norm(*[t.double() for t in c.tensors[:1]], (96,), c.tensors[1].double(), 1e-6,
                                   compute_dtype=torch.float64)),
    ("rms_norm-3tiles+7", lambda: norms.rms_norm_kernel_call(_x(3 * 128 + 7, 200), (200,), None, 1e-6),
     lambda c: references.rms_norm(c.tensors[0].double(), (200,), None, 1e-6, compute_dtype=torch.float64)),
    ("rms_norm-narrow-1row", lambda: norms.rms_norm_kernel_call(_x(1, 256), (256,), _x(256), 1e-6),
     lambda c: references.rms_norm(c.tensors[0].double(), (256,), c.tensors[1].double(), 1e-6,
                                   compute_dtype=torch.float64)),
    ("layer_norm-narrow-5", lambda: norms.layer_norm_kernel_call(_x(5, 384), (384,), _x(384), _x(384), 1e-5),
     lambda c: references.layer_norm(c.tensors[0].double(), (384,), c.tensors[1].double(), c.tensors[2].double(),
                                     1e-5, compute_dtype=torch.float64)),
    # the decode path (H >= NORM_DECODE_MIN_HIDDEN, few rows): rows split over the cores
    ("rms_norm-decode-1x4096", lambda: norms.rms_norm_kernel_call(_x(1, 4096), (4096,), _x(4096), 1e-6),
     lambda c: references.rms_norm(c.tensors[0].double(), (4096,), c.tensors[1].double(), 1e-6,
                                   compute_dtype=torch.float64)),
    ("rms_norm-decode-5x1024", lambda: norms.rms_norm_kernel_call(_x(5, 1024), (1024,), None, 1e-6),
     lambda c: references.rms_norm(c.tensors[0].double(), (1024,), None, 1e-6, compute_dtype=torch.float64)),
    ("layer_norm-decode-37x768", lambda: norms.layer_norm_kernel_call(_x(37, 768), (768,), _x(768), _x(768), 1e-5),
     lambda c: references.layer_norm(c.tensors[0].double(), (768,), c.tensors[1].double(), c.tensors[2].double(),
                                     1e-5, compute_dtype=torch.float64)),
    ("fused_add-129", lambda: norms.fused_add_rms_norm_kernel_call(_x(129, 64), _x(129, 64), _x(64), 1e-6),
     lambda c: _fused_add_reference(c, 1e-6)),
    ("layer_norm-1576x768", lambda: norms.layer_norm_kernel_call(_x(1576, 768), (768,), _x(768), _x(768), 1e-5),
     lambda c: references.layer_norm(c.tensors[0].double(), (768,), c.tensors[1].double(), c.tensors[2].double(),
                                     1e-5, compute_dtype=torch.float64)),
    # the training forward: the output and each row's (mean, rstd), both split by row blocks
    ("layer_norm-train-1576x768", lambda: norms.layer_norm_train_kernel_call(_x(1576, 768), (768,), _x(768), _x(768),
                                                                              1e-5),
     lambda c: (references.layer_norm(c.tensors[0].double(), (768,), c.tensors[1].double(), c.tensors[2].double(),
                                      1e-5, compute_dtype=torch.float64),
                references.layer_norm_stats(c.tensors[0], (768,), 1e-5, compute_dtype=torch.float64))),
    ("layer_norm-train-fp32-257", lambda: norms.layer_norm_train_kernel_call(_x(257, 96, dtype=F32), (96,), None,
                                                                              None, 1e-5),
     lambda c: (references.layer_norm(c.tensors[0].double(), (96,), None, None, 1e-5, compute_dtype=torch.float64),
                references.layer_norm_stats(c.tensors[0], (96,), 1e-5, compute_dtype=torch.float64))),
    ("layer_norm-fp32-257", lambda: norms.layer_norm_kernel_call(_x(257, 96, dtype=F32), (96,), _x(96, dtype=F32),
                                                                  None, 1e-5),
     lambda c: references.layer_norm(c.tensors[0].double(), (96,), c.tensors[1].double(), None, 1e-5,
                                     compute_dtype=torch.float64)),
    ("rms_norm-out-ring-2100x1024", lambda: norms.rms_norm_kernel_call(_x(2100, 1024), (1024,), _x(1024), 1e-6),
     lambda c: references.rms_norm(c.tensors[0].double(), (1024,), c.tensors[1].double(), 1e-6,
                                   compute_dtype=torch.float64)),
    ("rms_norm-streamed-3tiles", lambda: norms.rms_norm_kernel_call(_x(300, 8200), (8200,), _x(8200), 1e-6),
     lambda c: references.rms_norm(c.tensors[0].double(), (8200,), c.tensors[1].double(), 1e-6,
                                   compute_dtype=torch.float64)),
    ("fused_add-streamed-1row", lambda: norms.fused_add_rms_norm_kernel_call(_x(1, 9000), _x(1, 9000), None, 1e-6),
     lambda c: _fused_add_reference(c, 1e-6)),
    ("layer_norm-streamed-130", lambda: norms.layer_norm_kernel_call(_x(130, 8200), (8200,), _x(8200, dtype=F32),
                                                                      _x(8200, dtype=F32), 1e-5),
     lambda c: references.layer_norm(c.tensors[0].double(), (8200,), c.tensors[1].double(), c.tensors[2].double(),
                                     1e-5, compute_dtype=torch.float64)),
    ("silu_and_mul-3", lambda: activations.silu_and_mul_kernel_call(_x(3, 2 * 40)),
     lambda c: references.silu_and_mul(c.tensors[0].double(), compute_dtype=torch.float64)),
    ("gelu_and_mul-wide-300", lambda: activations.gelu_and_mul_kernel_call(_x(300, 2 * 4100)),
     lambda c: references.gelu_and_mul(c.tensors[0].double(), compute_dtype=torch.float64)),
    ("softmax-one-pass-5", lambda: softmax.softmax_kernel_call(_x(5, 33, scale=3.0)),
     _softmax_reference),
    ("softmax-block-form-1500x77", lambda: softmax.softmax_kernel_call(_x(1500, 77, scale=3.0)),
     _softmax_reference),
    ("softmax-online-3tiles", lambda: softmax.softmax_kernel_call(_x(300, 700, scale=3.0), max_cols=256),
     _softmax_reference),
    ("softmax-split-exact-8x4096", lambda: softmax.softmax_kernel_call(_x(8, 4096, scale=3.0)),
     _softmax_reference),
    ("softmax-split-ragged-5x5001", lambda: softmax.softmax_kernel_call(_x(5, 5001, scale=3.0)),
     _softmax_reference),
    ("softmax-split-1row", lambda: softmax.softmax_kernel_call(_x(1, 3000, scale=3.0)),
     _softmax_reference),
    ("softmax-input-ring-1576x1024", lambda: softmax.softmax_kernel_call(_x(1576, 1024, scale=3.0)),
     _softmax_reference),
    ("softmax-split-ragged-groups-13x32001", lambda: softmax.softmax_kernel_call(_x(13, 32001, scale=3.0)),
     _softmax_reference),
    ("softmax-split-groups-97x4096", lambda: softmax.softmax_kernel_call(_x(97, 4096, scale=3.0)),
     _softmax_reference),
    ("softmax-split-chunks-ragged-8x128201", lambda: softmax.softmax_kernel_call(_x(8, 128201, scale=3.0)),
     _softmax_reference),
    ("rotary-1tile", lambda: rotary.apply_rotary_pos_emb_kernel_call(*_rope(1, 3, 1, 5, 16)),
     lambda c: references.apply_rotary_pos_emb(*[t.double() for t in c.tensors], compute_dtype=torch.float64)),
    ("rotary-3units", lambda: rotary.apply_rotary_pos_emb_kernel_call(*_rope(3, 2, 2, 100, 32)),
     lambda c: references.apply_rotary_pos_emb(*[t.double() for t in c.tensors], compute_dtype=torch.float64)),
]


def _attention_case(b, h, hkv, sq, sk, d, causal=False, mask=None, dtype=BF16, dv=None):
    def call():
        dv_ = dv or d
        q, k, v = _x(b, h, sq, d, dtype=dtype), _x(b, hkv, sk, d, dtype=dtype), _x(b, hkv, sk, dv_, dtype=dtype)
        return attention.attention_kernel_call(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=h != hkv)

    def ref(c):
        q, k, v = (t.double() for t in c.tensors[:3])
        return references.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=h != hkv,
                                                       scale=c.static["scale"], compute_dtype=torch.float64)
    return call, ref


CASES += [
    ("attention-pairs-even", *_attention_case(2, 4, 2, 197, 197, 64)),            # 4 (b, kv) pairs: 2 each
    ("attention-vit-b1", *_attention_case(1, 12, 12, 197, 197, 64)),               # batch 1, 12 heads: 6 each
    ("attention-pairs-odd", *_attention_case(1, 3, 3, 300, 300, 64)),              # 3 pairs: query tiles split
    ("attention-one-pair-causal", *_attention_case(1, 2, 1, 700, 700, 64, causal=True)),  # by key count
    ("attention-one-tile", *_attention_case(1, 1, 1, 5, 40, 32, causal=True)),    # one unit: core 1 idle
    ("attention-flash-odd", *_attention_case(1, 1, 1, 260, 2600, 64, dtype=F32)),   # flash, 3 tiles
    ("attention-d256-odd", *_attention_case(1, 3, 3, 200, 200, 256, dv=200)),        # two head-dim pieces
]


# Cases with one unit of work (one row tile, one decode row, one attention tile): only one
# program stores. The row-tiled kernels give the one (tail) tile to the last program, the
# attention kernel its one unit to the first. Every other case splits its output between
# both cores.
ONE_STORING_CORE = {
    "elementwise-5": 1, "rms_norm-1row": 1, "rms_norm-narrow-1row": 1, "layer_norm-narrow-5": 1,
    "rms_norm-decode-1x4096": 1, "fused_add-streamed-1row": 1, "silu_and_mul-3": 1,
    "softmax-one-pass-5": 1, "softmax-split-1row": 1, "rotary-1tile": 1, "attention-one-tile": 0,
}


def _run(call, lnc):
    kernel = _dispatch.simulator_kernel(call)[lnc]
    result = simulator.run(kernel, *[t.contiguous() for t in call.tensors], **call.static)
    return result


@pytest.mark.parametrize("name, make_call, reference", CASES, ids=[c[0] for c in CASES])
def test_both_degrees_give_identical_outputs(name, make_call, reference):
    call = make_call()
    one, two = _run(call, 1), _run(call, 2)
    outs1 = one.outputs if isinstance(one.outputs, tuple) else (one.outputs,)
    outs2 = two.outputs if isinstance(two.outputs, tuple) else (two.outputs,)
    for a, b in zip(outs1, outs2):
        assert not torch.isnan(b).any(), "an element no program wrote"
        assert torch.equal(a, b), "LNC=2 differs from LNC=1"
    expected = reference(call)
    expected = expected if isinstance(expected, tuple) else (expected,)
    finished = call.finish_outputs(two.outputs)
    finished = finished if isinstance(finished, tuple) else (finished,)
    for got, want in zip(finished, expected):
        atol, rtol = TOLERANCES[got.dtype]
        torch.testing.assert_close(got.double(), want.double(), atol=atol, rtol=rtol)
    # at LNC=2 the output is split as the kernel's work split says (trace records carry the
    # core), and neither core writes what the other writes or reads
    stores = {ins.attrs.get("core") for ins in two.trace if ins.op == "dma_copy" and ins.writes[0].buffer == "hbm"}
    assert stores == ({ONE_STORING_CORE[name]} if name in ONE_STORING_CORE else {0, 1})
    assert hbm_races(two.trace) == []


def test_every_one_core_case_is_a_case():
    assert set(ONE_STORING_CORE) <= {c[0] for c in CASES}


def test_a_single_unit_runs_on_one_core_only():
    call = CASES[[c[0] for c in CASES].index("rms_norm-1row")][1]()
    trace = _run(call, 2).trace
    busy = {ins.attrs.get("core") for ins in trace if ins.op == "dma_copy" and ins.writes[0].buffer == "hbm"}
    assert busy == {1}      # the last program takes the one (tail) tile


@pytest.mark.parametrize("name", ["attention-vit-b1", "attention-pairs-odd", "rms_norm-3tiles+7"])
def test_both_cores_get_work(name):
    call = CASES[[c[0] for c in CASES].index(name)][1]()
    trace = _run(call, 2).trace
    stores = [ins.attrs.get("core") for ins in trace if ins.op == "dma_copy" and ins.writes[0].buffer == "hbm"]
    assert set(stores) == {0, 1}
    # equal shares of the output: each core stores half of the bytes (+- one 128-row tile)
    per_core = {c: sum(ins.writes[0].nbytes for ins in trace if ins.op == "dma_copy"
                       and ins.writes[0].buffer == "hbm" and ins.attrs.get("core") == c) for c in (0, 1)}
    assert abs(per_core[0] - per_core[1]) <= max(per_core.values()) * 0.5


# ---------------------------------------------------------------------------- launch degree

def test_degree_follows_neuron_logical_nc_config(monkeypatch):
    monkeypatch.delenv(_dispatch.LNC_ENV, raising=False)
    assert _dispatch.logical_core_degree() == 2                    # Trn2/Trn3 compiler default
    assert _dispatch.logical_core_degree(default=1, maximum=1) == 1  # trn1
    monkeypatch.setenv(_dispatch.LNC_ENV, "1")
    assert _dispatch.logical_core_degree() == 1
    monkeypatch.setenv(_dispatch.LNC_ENV, "3")
    with pytest.raises(ValueError, match=r"NEURON_LOGICAL_NC_CONFIG='3' is not supported; expected 1 or 2"):
        _dispatch.logical_core_degree()
    monkeypatch.setenv(_dispatch.LNC_ENV, "2")
    with pytest.raises(ValueError, match=r"NEURON_LOGICAL_NC_CONFIG=2 exceeds 1.*Trainium1"):
        _dispatch.logical_core_degree(default=1, maximum=1)


def test_the_backend_variable_is_read_case_insensitively_and_other_devices_are_refused(monkeypatch):
    monkeypatch.setenv(_dispatch.CPU_BACKEND_ENV, " Simulator ")
    assert _dispatch.cpu_backend() == "simulator"
    # a device with no implementation (checked without one: the thunks never run)
    for device in ("cuda", "mps", "meta"):
        with pytest.raises(RuntimeError, match=f"no implementation for device {device}"):
            _dispatch.run(lambda: pytest.fail("kernel"), lambda: pytest.fail("reference"), torch.device(device))


# The neuron launch (call form, degree, arguments) is pinned in tests/neuron/test_launch.py.


@pytest.mark.parametrize("env, degree", [(None, 2), ("1", 1), ("2", 2)])
def test_simulator_backend_launch_degree(monkeypatch, env, degree):
    if env is None:
        monkeypatch.delenv(_dispatch.LNC_ENV, raising=False)
    else:
        monkeypatch.setenv(_dispatch.LNC_ENV, env)
    seen = []
    real = _dispatch.simulator_kernel

    class Spy:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, d):
            seen.append(d)
            return self.kernel[d]

    monkeypatch.setattr(_dispatch, "simulator_kernel", lambda call: Spy(real(call)))
    x = torch.randn(300, 7)
    out = _dispatch.run_simulated(activations.silu_kernel_call(x))
    assert seen == [degree]
    torch.testing.assert_close(out, torch.nn.functional.silu(x), atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------- attention work split

def _cut():
    from nki_kernels import _kernel_sources

    return _kernel_sources.load("attention_work", "simulator")._cut


@pytest.mark.parametrize("tile_work, pairs", [
    ([197], 96),                               # ViT-B/16 batch 8: 96 (b, kv head) pairs, one tile
    ([197], 12),                               # batch 1
    ([300, 300, 300], 3),                      # odd pairs: the middle pair is shared by tiles
    ([128 * (t + 1) for t in range(16)], 1),   # causal, one kv head: later tiles weigh more
    ([40], 1),                                 # one unit: the second program gets nothing
])
def test_attention_cut_covers_every_item_once_with_balanced_work(tile_work, pairs):
    cut = _cut()
    n = pairs * len(tile_work)
    (a0, a1), (b0, b1) = cut(tile_work, pairs, 0, 2), cut(tile_work, pairs, 1, 2)
    assert (a0, a1, b1) == (0, b0, n)                  # contiguous, everything exactly once
    assert cut(tile_work, pairs, 0, 1) == (0, n)       # LNC=1: one program takes all
    work = lambda lo, hi: sum(tile_work[i % len(tile_work)] for i in range(lo, hi))  # noqa: E731
    if n >= 2:
        assert abs(work(a0, a1) - work(b0, b1)) <= max(tile_work)

"""Limits and modeled eager baselines (nki_kernels/roofline.py), against hand arithmetic."""

from __future__ import annotations

import pytest
import torch

from nki_kernels import registry
from nki_kernels import roofline as R
from nki_kernels.simulator.hardware import TARGETS

TRN2 = TARGETS["trn2"]
BF16 = torch.bfloat16


def t(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_vit_b_attention_limit_is_its_hbm_traffic():
    q = t(8, 12, 197, 64)
    r = R.scaled_dot_product_attention(q, q, q)
    io = 4 * 8 * 12 * 197 * 64 * 2                      # q, k, v read; out written; bf16
    assert r.work.hbm_bytes == io
    assert r.limit_terms_us["dma"] == pytest.approx(io / TRN2.dma_bytes_per_s * 1e6)
    pairs = 8 * 12 * 197 * 197
    assert r.work.matmul_flops == 2 * pairs * (64 + 64)
    assert r.limit_terms_us["tensor"] == pytest.approx(r.work.matmul_flops / TRN2.tensor_peak_bf16_flops * 1e6)
    assert r.work.transcendentals == pairs + 8 * 12 * 197   # exp per score, reciprocal per row
    assert r.limit_terms_us["scalar"] == pytest.approx(r.work.transcendentals / (TRN2.scalar_hz * 128) * 1e6)
    assert r.bound == "dma" and r.limit_us == pytest.approx(r.limit_terms_us["dma"])


def test_attention_eager_is_the_sdpa_math_path_each_op_at_its_limit():
    q = t(8, 12, 197, 64)
    r = R.scaled_dot_product_attention(q, q, q)
    names = [s.work.name.split(" ")[0] for s in r.eager_steps]
    assert names == ["mul", "mul", "bmm", "softmax", "bmm"]
    scores = 8 * 12 * 197 * 197 * 2
    qk = r.eager_steps[2]
    assert qk.work.hbm_bytes == 2 * 8 * 12 * 197 * 64 * 2 + scores
    assert qk.us == pytest.approx(max(qk.work.hbm_bytes / TRN2.dma_bytes_per_s,
                                      qk.work.matmul_flops / TRN2.tensor_peak_bf16_flops) * 1e6)
    assert r.eager_us == pytest.approx(sum(s.us for s in r.eager_steps))
    assert r.eager_hbm_bytes > 3 * r.work.hbm_bytes     # intermediates through HBM


def test_attention_eager_adds_mask_gqa_and_causal_steps():
    q, kv = t(1, 8, 64, 64), t(1, 2, 64, 64)
    names = [s.work.name for s in R.scaled_dot_product_attention(q, kv, kv, is_causal=True).eager_steps]
    assert any(n.startswith("repeat_interleave") for n in names)
    assert any("causal" in n for n in names) and any(n.startswith("add") for n in names)
    mask = t(1, 1, 1, 64, dtype=torch.bool)
    names = [s.work.name for s in R.scaled_dot_product_attention(q, q, q, attn_mask=mask).eager_steps]
    assert any("bool mask" in n for n in names)


def test_causal_attention_counts_only_the_kept_pairs():
    assert R._causal_pairs(4, 4) == 10
    assert R._causal_pairs(6, 4) == 10 + 2 * 4      # queries past the last key see every key
    q = t(1, 1, 4, 8)
    assert R.scaled_dot_product_attention(q, q, q, is_causal=True).work.matmul_flops == 2 * 10 * (8 + 8)


def test_fp32_uses_the_fp32_tensor_peak():
    bf = R.scaled_dot_product_attention(t(1, 4, 256, 64), t(1, 4, 256, 64), t(1, 4, 256, 64))
    f32 = R.scaled_dot_product_attention(*(t(1, 4, 256, 64, dtype=torch.float32) for _ in range(3)))
    ratio = TRN2.tensor_peak_bf16_flops / TRN2.tensor_peak_fp32_flops
    assert f32.limit_terms_us["tensor"] == pytest.approx(ratio * bf.limit_terms_us["tensor"])


def test_rms_norm_eager_is_its_aten_decomposition():
    x, w = t(2048, 4096), t(4096)
    r = R.rms_norm(x, (4096,), w)
    names = [s.work.name.split(" ")[0] for s in r.eager_steps]
    assert names == ["_to_copy", "pow", "mean", "add", "rsqrt", "mul", "mul", "_to_copy"]
    assert r.work.hbm_bytes == 2 * 2048 * 4096 * 2 + 4096 * 2
    assert r.bound == "dma"
    f32 = R.rms_norm(t(2048, 4096, dtype=torch.float32), (4096,), t(4096, dtype=torch.float32))
    assert "_to_copy" not in [s.work.name.split(" ")[0] for s in f32.eager_steps]


def _aten_traffic(fn, *args):
    """(op name, bytes read + written) of each non-view ATen op ``fn`` runs: the eager
    baseline's steps, measured from torch's own dispatch, not from roofline.py."""
    from torch.utils._python_dispatch import TorchDispatchMode

    def nbytes(x):
        if isinstance(x, (list, tuple)):
            return sum(nbytes(y) for y in x)
        return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.steps = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view:
                self.steps.append((func.overloadpacket.__name__, nbytes(args) + nbytes(out)))
            return out

    with Record() as rec:
        fn(*args)
    return rec.steps


@pytest.mark.parametrize("dtype", [BF16, torch.float32], ids=["bf16", "fp32"])
def test_rotary_eager_is_transformers_rotate_half_aten_traffic(dtype):
    # transformers' apply_rotary_pos_emb per tensor: mul, neg, cat (rotate_half), mul, add,
    # each through HBM; mutation testing found a dropped step (the cat) unnoticed
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as eager_rope

    q, k, cos, sin = t(2, 8, 33, 64, dtype=dtype), t(2, 2, 33, 64, dtype=dtype), \
        t(2, 33, 64, dtype=dtype), t(2, 33, 64, dtype=dtype)
    r = R.apply_rotary_pos_emb(q, k, cos, sin)
    steps = [(s.work.name.split(" ")[0], s.work.hbm_bytes) for s in r.eager_steps]
    assert steps == _aten_traffic(eager_rope, q, k, cos, sin)
    assert [name for name, _ in steps] == ["mul", "neg", "cat", "mul", "add"] * 2


def test_single_aten_op_baselines_equal_the_limit():
    x = t(1576, 768)
    for r in (R.gelu(x), R.softmax(x)):
        assert r.eager_us == pytest.approx(r.limit_us)
    ln = R.layer_norm(x, (768,), t(768), t(768))
    assert ln.limit_us <= ln.eager_us < 1.01 * ln.limit_us   # + fp32 mean/rstd per row
    # native_layer_norm's bytes: x in, y out, weight and bias, and its fp32 mean and rstd
    assert ln.eager_steps[0].work.hbm_bytes == 2 * 1576 * 768 * 2 + 2 * 768 * 2 + 2 * 1576 * 4
    # softmax over another dim: one reciprocal per softmax row, rows = n / size of that dim
    y = t(6, 1000, 40)
    assert R.softmax(y, dim=1).work.transcendentals == 6 * 1000 * 40 + 6 * 40
    assert R.softmax(y, dim=-1).work.transcendentals == 6 * 1000 * 40 + 6 * 1000


CASES = [(spec, w) for spec in registry.ops() for w in spec.workloads]


@pytest.mark.parametrize("spec, workload", CASES, ids=[f"{s.name}-{w.name}" for s, w in CASES])
def test_eager_never_beats_the_limit(spec, workload):
    # every op's eager model, on every workload of the registry
    args, kwargs = workload.make(torch.Generator().manual_seed(0))
    r = spec.roofline(*args, **kwargs)
    assert r.limit_us > 0
    assert r.eager_us >= r.limit_us * (1 - 1e-12)
    assert r.efficiency(r.limit_us) == pytest.approx(1.0)
    assert r.speedup(r.eager_us) == pytest.approx(1.0)


def test_limits_follow_the_target():
    x = t(2048, 4096)
    assert R.rms_norm(x, (4096,), None, target="trn3").limit_us < R.rms_norm(x, (4096,), None).limit_us
    assert R.rms_norm(x, (4096,), None, target="trn3").target == "trn3"


@pytest.mark.parametrize("spec, workload", CASES[:1] + CASES[5:6], ids=lambda x: getattr(x, "name", ""))
def test_two_cores_halve_compute_and_share_one_hbm_stack_in_the_limit_and_eager(spec, workload):
    # LNC=2: the kernel and every eager ATen op (compiled at the same degree) get two
    # cores' TensorE and ScalarE, and their DMA engines up to the HBM stack the two share
    # (trn2: 725 GB/s against 2 x 368)
    from nki_kernels.simulator.hardware import TARGETS

    trn2 = TARGETS["trn2"]
    dma_gain = trn2.hbm_stack_bytes_per_s / trn2.dma_bytes_per_s
    assert 1.9 < dma_gain < 2
    args, kwargs = workload.make(torch.Generator().manual_seed(0))
    one, two = spec.roofline(*args, **kwargs, lnc=1), spec.roofline(*args, **kwargs, lnc=2)
    assert (one.lnc, two.lnc) == (1, 2)
    for term, us in one.limit_terms_us.items():
        assert two.limit_terms_us[term] == pytest.approx(us / (dma_gain if term == "dma" else 2))
    assert two.limit_us == pytest.approx(max(two.limit_terms_us.values()))
    for a, b in zip(one.eager_steps, two.eager_steps, strict=True):
        assert b.us == pytest.approx(a.us / (dma_gain if a.bound == "dma" else 2))
    assert two.bound == one.bound


def test_lnc_must_be_one_or_two_and_trn1_has_one():
    x = t(128, 1024)
    with pytest.raises(ValueError, match="lnc=3 is not supported on trn2; expected 1 or 2"):
        R.rms_norm(x, (1024,), None, lnc=3)
    with pytest.raises(ValueError, match="lnc=2 is not supported on trn1.*starts with Trainium2"):
        R.rms_norm(x, (1024,), None, lnc=2, target="trn1")

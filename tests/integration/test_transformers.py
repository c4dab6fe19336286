"""``nki_kernels.transformers``: ``register()`` makes ``attn_implementation="nki"`` right for
every model family (Llama, Qwen2/3, Mistral's sliding window, Gemma3, CLIP, SigLIP, ViT,
DINOv2), padded left or right, in inference, ``generate()`` and training, on both CPU
backends; ``nki_attention_forward`` takes every mask format transformers passes.

Every model is a tiny random-weight model built from its config (tests/integration/_models.py)
and is compared with the same weights under ``attn_implementation="sdpa"``. Tolerances
(fp32): the simulated kernel computes fp32 matmuls and an fp32 softmax in another order than
torch's SDPA (~1e-7 relative per op, ~2e-7 measured on these logits), so 1e-5 / 1e-4 through
two layers; the reference backend runs torch's SDPA itself.
"""

from __future__ import annotations

import types

import pytest
import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import nki_kernels
from nki_kernels import transformers as nkt
from nki_kernels.ops import attention as attention_op
from tests._helpers import attention_registries_restored, rel_error

from ._models import CAUSAL_LM, DUAL_ENCODER, VISION, build, padded_batch, perturb_norms, pixels

ATOL, RTOL = 1e-5, 1e-4
FLASH_NAME = "nki_fa2_format_test"     # our function with FlashAttention-2's 2-D mask function
BACKENDS = ["reference", "simulator"]


@pytest.fixture(autouse=True, scope="module")
def _registered():
    # every name this module registers (here and in its tests) is gone when it ends
    with attention_registries_restored():
        nkt.register()
        AttentionInterface.register(FLASH_NAME, nkt.nki_attention_forward)
        AttentionMaskInterface.register(FLASH_NAME, flash_attention_mask)
        yield


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", request.param)
    return request.param


def _pair(make, attn="nki"):
    """(sdpa model, the same weights under ``attn``)."""
    reference = build(make, "sdpa")
    perturb_norms(reference)
    model = build(make, "sdpa")
    model.load_state_dict(reference.state_dict())
    model.set_attn_implementation(attn)
    return reference, model


# ------------------------------------------------------------------------------ register

def test_register_installs_the_function_and_the_sdpa_mask():
    assert nkt.register() == "nki" == nkt.ATTENTION_NAME
    assert nkt.register() == "nki"                      # idempotent
    assert ALL_ATTENTION_FUNCTIONS["nki"] is nkt.nki_attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["nki"] is sdpa_mask
    assert nki_kernels.nki_attention_forward is nkt.nki_attention_forward
    assert nkt.register("nki_other") == "nki_other"


@pytest.mark.parametrize("name, match", [
    ("my_sdpa", "'sdpa'"), ("flash_nki", "'flash'"), ("flex_attention_nki", "'flex_attention'"),
    ("", "non-empty"), (FLASH_NAME, "flash_attention_mask"),
])
def test_register_rejects_names_transformers_treats_otherwise(name, match):
    with pytest.raises(ValueError, match=match):
        nkt.register(name)


def test_attention_only_registration_is_the_issue_14_bug():
    """What the old README did (AttentionInterface only): transformers passes
    attention_mask=None to a name without a mask function, so a left-padded batch is wrong.
    The same comparison passes with register() (test_causal_lm_matches_sdpa)."""
    AttentionInterface.register("nki_attention_only", nkt.nki_attention_forward)
    reference, model = _pair(CAUSAL_LM["llama"], "nki_attention_only")
    batch = padded_batch("left")
    with torch.no_grad():
        expected = reference(**batch.kwargs()).logits[batch.valid]
        got = model(**batch.kwargs()).logits[batch.valid]
    assert (got - expected).abs().max() > 1e-2


# ------------------------------------------------------------------------------ model families

@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", list(CAUSAL_LM))
def test_causal_lm_matches_sdpa(backend, kernel_calls, family, side):
    reference, model = _pair(CAUSAL_LM[family])
    batch = padded_batch(side)
    seen = []
    real = nkt.nki_attention_forward

    with torch.no_grad():
        expected = reference(**batch.kwargs()).logits
        ALL_ATTENTION_FUNCTIONS["nki"] = lambda m, q, k, v, mask, **kw: seen.append(mask) or real(m, q, k, v, mask, **kw)
        try:
            got = model(**batch.kwargs()).logits
        finally:
            del ALL_ATTENTION_FUNCTIONS["nki"]
    # padded rows get SDPA's 4-D bool mask in every layer (the issue-14 bug was None here)
    assert len(seen) == 2 and all(m is not None and m.dtype == torch.bool and m.dim() == 4 for m in seen)
    torch.testing.assert_close(got[batch.valid], expected[batch.valid], atol=ATOL, rtol=RTOL)
    if backend == "simulator":
        assert kernel_calls["attention_kernel"] == 2


@pytest.mark.parametrize("family", list(CAUSAL_LM))
def test_generate_is_token_identical(backend, family):
    """Greedy generate() of a left-padded batch (prefill with the padding mask, then one-token
    decode steps over the cache) gives sdpa's tokens, in fp32."""
    reference, model = _pair(CAUSAL_LM[family])
    batch = padded_batch("left")
    args = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = reference.generate(**batch.kwargs(), **args)
        got = model.generate(**batch.kwargs(), **args)
    assert got.shape == (3, 15)
    assert torch.equal(got, expected)


def test_static_cache_prefill_without_padding_is_top_left(reference_backend):
    """An unpadded prompt into a static cache: sdpa_mask gives attention_mask=None with the
    prompt's queries against the cache's whole length (its empty slots past the prompt), which
    SDPA's top-left is_causal masks (masking_utils._ignore_causal_mask_sdpa). A bottom-right
    reading, tried in a review of 2026-12-07 for Gemma4's sliced queries, attended the empty
    slots: other tokens than sdpa's."""
    reference, model = _pair(CAUSAL_LM["llama"])
    ids = torch.randint(3, 90, (2, 7))
    args = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, cache_implementation="static",
                output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        expected = reference.generate(input_ids=ids, **args)
        got = model.generate(input_ids=ids, **args)
    assert torch.equal(got.sequences, expected.sequences)
    for a, b in zip(got.scores, expected.scores):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", list(DUAL_ENCODER))
def test_dual_encoders_match_sdpa(backend, family, side):
    """CLIP (causal text tower, is_causal passed as a kwarg) and SigLIP (bidirectional text)
    with padded text, and their vision towers."""
    reference, model = _pair(DUAL_ENCODER[family])
    batch = padded_batch(side)
    images = pixels(3)
    with torch.no_grad():
        expected = reference(**batch.kwargs(), pixel_values=images)
        got = model(**batch.kwargs(), pixel_values=images)
    torch.testing.assert_close(got.text_embeds, expected.text_embeds, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(got.image_embeds, expected.image_embeds, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("family", list(VISION))
def test_vision_models_match_sdpa(backend, kernel_calls, family):
    reference, model = _pair(VISION[family])
    images = pixels()
    with torch.no_grad():
        expected = reference(pixel_values=images).last_hidden_state
        got = model(pixel_values=images).last_hidden_state
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)
    if backend == "simulator":
        assert kernel_calls == {"attention_kernel": 2}


def test_vit_bf16_matches_sdpa(simulator_backend, kernel_calls):
    reference, model = _pair(VISION["vit"])
    reference, model = reference.to(torch.bfloat16), model.to(torch.bfloat16)
    images = pixels().to(torch.bfloat16)
    with torch.no_grad():
        expected = reference(pixel_values=images).last_hidden_state
        got = model(pixel_values=images).last_hidden_state
    assert kernel_calls == {"attention_kernel": 2}
    # bf16 everywhere: both round activations to bf16 at every op; the kernel keeps softmax
    # statistics in fp32 as torch's SDPA does, so they differ by a few bf16 ulps that the
    # LayerNorms and MLPs carry along
    assert rel_error(got, expected) < 2e-2


@pytest.mark.parametrize("family", ["llama", "mistral", "vit"])
def test_training_loss_and_gradients_match_sdpa(backend, family):
    """A training step (train mode, autograd through the op's recompute backward): loss and
    every parameter gradient as with sdpa. Text: left-padded batch, pads labelled -100."""
    make = CAUSAL_LM.get(family) or VISION[family]
    reference, model = _pair(make)
    reference.train()
    model.train()
    if family == "vit":
        images = pixels()
        target = torch.randn(2, 26, 128)
        losses = [(m(pixel_values=images).last_hidden_state - target).square().mean() for m in (reference, model)]
    else:
        batch = padded_batch("left")
        labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
        losses = [m(**batch.kwargs(), labels=labels).loss for m in (reference, model)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0], atol=ATOL, rtol=RTOL)
    grads = dict(reference.named_parameters())
    compared = 0
    for name, param in model.named_parameters():
        if param.grad is None:
            assert grads[name].grad is None, name
            continue
        # gradients of O(1e-2..1): fp32 recompute in another order, through two layers
        torch.testing.assert_close(param.grad, grads[name].grad, atol=1e-5, rtol=1e-3, msg=name)
        compared += 1
    assert compared >= 10


def test_gemma_defaults_fail_clearly(reference_backend):
    """Gemma2's default logit soft-capping and a head dim above the kernel's limit raise
    with the reason instead of computing something else."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

    from ._models import TEXT

    model = build(lambda: Gemma2ForCausalLM(Gemma2Config(**TEXT, head_dim=16)), "nki")
    assert model.config.attn_logit_softcapping is not None        # 50.0 by default
    with pytest.raises(ValueError, match="softcap=50.0.*soft-capping"):
        model(input_ids=torch.randint(3, 97, (1, 5)))
    wide = attention_op.MAX_HEAD_DIM + 8                           # Gemma3's default is 256
    model = build(lambda: Gemma3ForCausalLM(Gemma3TextConfig(**TEXT, head_dim=wide)), "nki")
    with pytest.raises(ValueError, match=f"head_dim={wide} exceeds {attention_op.MAX_HEAD_DIM}"):
        model(input_ids=torch.randint(3, 97, (1, 5)))


# ------------------------------------------------------------------------------ FlashAttention-2 format

@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3"])
def test_flash_format_matches_sdpa(backend, family):
    """Registered with FlashAttention-2's mask function (what transformers registers for a Hub
    "<repo>:<function>"), the function gets None or a 2-D key-padding mask and a sliding_window
    kwarg, and still matches sdpa: both paddings, and generate()."""
    reference, model = _pair(CAUSAL_LM[family], FLASH_NAME)
    for side in ("left", "right"):
        batch = padded_batch(side)
        with torch.no_grad():
            expected = reference(**batch.kwargs()).logits
            got = model(**batch.kwargs()).logits
        torch.testing.assert_close(got[batch.valid], expected[batch.valid], atol=ATOL, rtol=RTOL)
    args = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(model.generate(**batch.kwargs(), **args), reference.generate(**batch.kwargs(), **args))


def test_flash_format_packed_sequences(reference_backend):
    """One row holding three sequences (position_ids restart, no mask, no cache): attention
    stays inside each sequence, as sdpa's packed mask and FlashAttention-2's varlen path do."""
    reference, model = _pair(CAUSAL_LM["llama"], FLASH_NAME)
    ids = torch.randint(3, 97, (1, 9))
    packed = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1]])
    with torch.no_grad():
        expected = reference(input_ids=ids, position_ids=packed, use_cache=False).logits
        got = model(input_ids=ids, position_ids=packed, use_cache=False).logits
        plain = reference(input_ids=ids, position_ids=torch.arange(9)[None], use_cache=False).logits
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)
    assert (plain - expected).abs().max() > 1e-2       # the packing matters on these inputs


def _qkv(b=2, h=4, hkv=2, sq=6, sk=6, d=16):
    def one(heads, s):
        return torch.randn(b, s, heads, d).transpose(1, 2)
    return one(h, sq), one(hkv, sk), one(hkv, sk)


def _sdpa(q, k, v, mask=None, causal=False):
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
    return out.transpose(1, 2)


def test_flash_format_semantics(reference_backend):
    """Direct calls: bottom-right causality for chunked prefill (Sq < Sk), keys past L ignored
    (static cache), the sliding window, 0/1 integer masks."""
    module = types.SimpleNamespace(is_causal=True)
    q, k, v = _qkv(sq=3, sk=7)
    pad = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])
    got, _ = nkt.nki_attention_forward(module, q, k, v, pad)
    # query i of 3 is position 4 + i: keys j <= 4 + i, and not row 1's two left pads
    keep = (torch.arange(7)[None, :] <= torch.arange(4, 7)[:, None])[None, None] & pad.bool()[:, None, None, :]
    torch.testing.assert_close(got, _sdpa(q, k, v, keep), atol=ATOL, rtol=RTOL)
    # bool mask of length L = 5 < Sk = 7: the last two keys are a static cache's unused slots
    got, _ = nkt.nki_attention_forward(module, q, k, v, pad[:, :5].bool())
    keep = (torch.arange(7)[None, :] <= torch.arange(2, 5)[:, None])[None, None] & (torch.arange(7) < 5)
    keep = keep & torch.nn.functional.pad(pad[:, :5].bool(), (0, 2))[:, None, None, :]
    torch.testing.assert_close(got, _sdpa(q, k, v, keep), atol=ATOL, rtol=RTOL)
    # sliding window 3 with no mask: keys q-2..q (bottom-right positions)
    got, _ = nkt.nki_attention_forward(module, q, k, v, pad.bool() | True, sliding_window=3)
    pos = torch.arange(4, 7)[:, None]
    keep = (torch.arange(7)[None, :] <= pos) & (torch.arange(7)[None, :] > pos - 3)
    torch.testing.assert_close(got, _sdpa(q, k, v, keep), atol=ATOL, rtol=RTOL)
    # no mask at all, the model's implementation registered with FlashAttention-2's mask
    # function (chunked prefill without padding): bottom-right causality too; SDPA's
    # top-left default would give query 0 one key instead of five (a review's mutant)
    flash_module = types.SimpleNamespace(is_causal=True, config=types.SimpleNamespace(_attn_implementation=FLASH_NAME))
    got, _ = nkt.nki_attention_forward(flash_module, q, k, v, None)
    keep = torch.arange(7)[None, :] <= torch.arange(4, 7)[:, None]
    torch.testing.assert_close(got, _sdpa(q, k, v, keep), atol=ATOL, rtol=RTOL)


def test_flash_format_non_causal_sliding_window(reference_backend):
    """A non-causal layer (is_causal False) with a window: FlashAttention-2's window (w-1, w-1)
    keeps the keys within w - 1 positions on either side of the query (every other window
    test is causal, where the keys after the query are masked anyway)."""
    module = types.SimpleNamespace(is_causal=False)
    q, k, v = _qkv(sq=6, sk=6)
    got, _ = nkt.nki_attention_forward(module, q, k, v, torch.ones(2, 6, dtype=torch.bool), sliding_window=3)
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    keep = (i - j).abs() <= 2
    torch.testing.assert_close(got, _sdpa(q, k, v, keep), atol=ATOL, rtol=RTOL)
    # the window matters on these inputs: full attention is far from it
    assert (_sdpa(q, k, v) - got).abs().max() > 1e-2


@pytest.mark.parametrize("mask, kwargs, error, match", [
    (torch.ones(2, 6, 6, dtype=torch.bool), {}, ValueError, r"shape \[2, 6, 6\].*4-D.*2-D"),
    (torch.ones(2, 6), {}, ValueError, "2-D float32 tensor.*bool or 0/1"),
    (torch.ones(3, 6, dtype=torch.bool), {}, ValueError, r"\[3, 6\].*B = 2"),
    (torch.ones(2, 9, dtype=torch.bool), {}, ValueError, r"\[2, 9\].*L <= 6"),
    (None, {"softcap": 30.0}, ValueError, "softcap=30.0"),
    (None, {"s_aux": torch.zeros(4)}, ValueError, "s_aux=tensor of shape \\[4\\].*sinks"),
    (None, {"position_bias": torch.zeros(1, 4, 6, 6)}, ValueError, "position_bias"),
    # sparse attention's selected keys: transformers folds them into the mask for "eager" and
    # "sdpa" only and passes them to any other name (modeling_deepseek_v32); ignored, the
    # layer ran dense (an audit of 2026-12-07)
    (None, {"indices": torch.zeros(2, 6, 4, dtype=torch.int64)}, ValueError, r"indices=tensor of shape \[2, 6, 4\].*sparse"),
    (None, {"block_indices": torch.zeros(2, 1, 2, dtype=torch.int64)}, ValueError, "block_indices=.*block-sparse"),
    (None, {"dropout": 0.1}, NotImplementedError, r"dropout=0\.1: .*eval mode"),
    (None, {"dropout": "0"}, TypeError, r"dropout must be a float, got '0' \(str\)"),
    (torch.tensor([[1, 0, 1, 1, 1, 1], [5, 0, -3, 1, 1, 1]]), {}, ValueError, r"values \[-3, 0, 1, 5\].*only 0.*and 1"),
    (torch.ones(2, 6, dtype=torch.bool), {"sliding_window": 0}, ValueError, "sliding_window=0 must be an int >= 1"),
    (torch.ones(2, 6, dtype=torch.bool), {"sliding_window": -2}, ValueError, "sliding_window=-2 must be an int >= 1"),
    (torch.ones(2, 6, dtype=torch.bool), {"sliding_window": 2.5}, TypeError, r"sliding_window must be an int, got 2\.5"),
    (None, {"is_causal": "no"}, TypeError, "is_causal must be a Python bool, got 'no'"),
    (None, {"dropout": -0.1}, ValueError, r"dropout=-0\.1 must be a float in \[0, 1\]"),
    (None, {"dropout": float("nan")}, ValueError, r"dropout=nan must be a float in \[0, 1\]"),
    (None, {"dropout": 1.5}, ValueError, r"dropout=1\.5 must be a float in \[0, 1\]"),
    # SDPA's format holds the window in its mask: None with a window shorter than the keys
    # would silently attend past it (review, session 68)
    (None, {"sliding_window": 3}, ValueError, r"sliding_window=3 with attention_mask=None in SDPA's format and 6 keys"),
    (torch.ones(2, 6, dtype=torch.bool, device="meta"), {}, ValueError, "attention_mask is on meta, query on cpu"),
    (torch.zeros(2, 1, 6, 6, dtype=torch.int64), {}, TypeError, "attn_mask has dtype int64"),
])
def test_rejects_what_it_cannot_compute(reference_backend, mask, kwargs, error, match):
    q, k, v = _qkv()
    with pytest.raises(error, match=match):
        nkt.nki_attention_forward(types.SimpleNamespace(is_causal=True), q, k, v, mask, **kwargs)


def test_output_attentions_warns_that_no_weights_come_back(reference_backend):
    # as transformers' sdpa_attention_forward warns; the review found "nki" silent about it
    q, k, v = _qkv()
    with pytest.warns(UserWarning, match="does not return attention weights"):
        out, weights = nkt.nki_attention_forward(types.SimpleNamespace(is_causal=True), q, k, v, None,
                                                 output_attentions=True)
    assert weights is None
    torch.testing.assert_close(out, _sdpa(q, k, v, causal=True), atol=ATOL, rtol=RTOL)


def test_a_window_covering_every_key_needs_no_mask(reference_backend):
    # transformers' sdpa_mask returns None exactly when the window covers every key
    q, k, v = _qkv()
    got, _ = nkt.nki_attention_forward(types.SimpleNamespace(is_causal=True), q, k, v, None, sliding_window=6)
    torch.testing.assert_close(got, _sdpa(q, k, v, causal=True), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("which, value, error, match", [
    ("query", "q", TypeError, "query must be a torch.Tensor, got str"),
    ("query", lambda q: q[0], ValueError, r"query has shape \[4, 6, 16\]; .*4-D"),
    ("key", lambda k: k[0], ValueError, r"key has shape \[2, 6, 16\]; .*4-D"),
    ("value", lambda v: v.unsqueeze(0), ValueError, r"value has shape \[1, 2, 2, 6, 16\]; .*4-D"),
])
def test_rejects_qkv_that_are_not_4d_tensors(reference_backend, which, value, error, match):
    # review, session 68: 3-D q/k/v ran and came back in the wrong layout ([H, D, S])
    args = dict(zip(("query", "key", "value"), _qkv()))
    args[which] = value(args[which]) if callable(value) else value
    with pytest.raises(error, match=match):
        nkt.nki_attention_forward(types.SimpleNamespace(is_causal=True), args["query"], args["key"], args["value"],
                                  None)


@pytest.mark.parametrize("cu, match", [
    (torch.tensor([0, 3, 4], dtype=torch.int32), r"\[0, 3, 4\]: must start at 0, never decrease and end at 7"),
    (torch.tensor([0, 5, 3, 7], dtype=torch.int32), r"\[0, 5, 3, 7\]: must start at 0, never decrease"),
    (torch.tensor([2, 4, 7], dtype=torch.int32), r"\[2, 4, 7\]: must start at 0"),
    (torch.tensor([0, 3, 7, 9], dtype=torch.int32), "end at 7"),
    (torch.tensor([0.0, 3.0, 7.0]), r"\[0\.0, 3\.0, 7\.0\]: must be a 1-D integer tensor"),
    (torch.tensor([[0, 3, 7]], dtype=torch.int32), r"tensor of shape \[1, 3\]: must be a 1-D integer tensor"),
    (torch.tensor([7], dtype=torch.int32), r"\[7\]: must be a 1-D integer tensor of at least 2"),
    (torch.tensor(7, dtype=torch.int32), r"tensor of shape \[\]: must be a 1-D integer tensor"),
    ([0, 3, 7], r"\[0, 3, 7\]: must be a 1-D integer tensor"),
])
def test_rejects_malformed_cu_seq_lens(reference_backend, cu, match):
    # review, session 68: these built wrong sequence boundaries without an error
    q, k, v = _qkv(b=1, sq=7, sk=7)
    with pytest.raises(ValueError, match=match):
        nkt.nki_attention_forward(types.SimpleNamespace(is_causal=True), q, k, v, None,
                                  cu_seq_lens_q=cu, cu_seq_lens_k=cu)


def test_packed_varlen_kwargs(reference_backend):
    module = types.SimpleNamespace(is_causal=True)
    q, k, v = _qkv(b=1, sq=7, sk=7)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    got, _ = nkt.nki_attention_forward(module, q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    seq = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    keep = torch.ones(7, 7, dtype=torch.bool).tril() & (seq[:, None] == seq[None, :])
    torch.testing.assert_close(got, _sdpa(q, k, v, keep), atol=ATOL, rtol=RTOL)
    with pytest.raises(ValueError, match=r"cu_seq_lens_q=\[0, 3, 7\], cu_seq_lens_k=\[0, 2, 7\]: .*equal"):
        nkt.nki_attention_forward(module, q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=torch.tensor([0, 2, 7]))
    with pytest.raises(ValueError, match=r"cu_seq_lens_q=\[0, 3, 7\], cu_seq_lens_k=None: .*both given"):
        nkt.nki_attention_forward(module, q, k, v, None, cu_seq_lens_q=cu)
    with pytest.raises(ValueError, match="B=2"):
        nkt.nki_attention_forward(module, *_qkv(b=2, sq=7, sk=7), None, cu_seq_lens_q=cu, cu_seq_lens_k=cu)


def test_sdpa_format_contract(simulator_backend):
    """Direct call with transformers' arguments: [B, H, S, D] in, ([B, S, H, D], None) out,
    contiguous, no copy for transposed views, causal only without a mask (top-left, as
    SDPA)."""
    module = types.SimpleNamespace(is_causal=True)
    q, k, v = _qkv(sq=10, sk=10, d=32)
    out, weights = nkt.nki_attention_forward(module, q, k, v, None, scaling=0.2)
    assert weights is None and out.shape == (2, 10, 4, 32) and out.is_contiguous()
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2, enable_gqa=True)
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=ATOL, rtol=RTOL)
    mask = torch.zeros(2, 1, 10, 10)
    mask[..., 7:] = torch.finfo(torch.float32).min
    out, _ = nkt.nki_attention_forward(module, q, k, v, mask, is_causal=True)   # the mask holds causality
    torch.testing.assert_close(out, _sdpa(q, k, v, mask), atol=ATOL, rtol=RTOL)
    # a module without is_causal is causal, as in transformers' sdpa_attention_forward
    out, _ = nkt.nki_attention_forward(torch.nn.Module(), q, k, v, None)
    torch.testing.assert_close(out, _sdpa(q, k, v, causal=True), atol=ATOL, rtol=RTOL)
    # one decode query: every key
    out, _ = nkt.nki_attention_forward(module, q[:, :, -1:], k, v, None)
    torch.testing.assert_close(out, _sdpa(q[:, :, -1:], k, v), atol=ATOL, rtol=RTOL)
    # contiguous [B, H, S, D] inputs (q after rotary, k/v from a cache): the output is
    # contiguous too, as transformers' attention functions return it (AFMoE, Dory and JetMoE
    # .view() it; an audit of 2026-12-07)
    qc, kc, vc = (t.contiguous() for t in (q, k, v))
    out, _ = nkt.nki_attention_forward(module, qc, kc, vc, None)
    assert out.is_contiguous() and out.shape == (2, 10, 4, 32)
    torch.testing.assert_close(out.view(2, 10, -1), _sdpa(q, k, v, causal=True).reshape(2, 10, -1),
                               atol=ATOL, rtol=RTOL)
    # fewer queries than keys with no mask: top-left, as SDPA's is_causal, which sdpa_mask
    # relies on when it returns None for a prefill into an empty static cache (the keys past
    # the prompt are unused slots): query i sees keys 0..i
    first = q[:, :, :4]
    out, _ = nkt.nki_attention_forward(module, first, k, v, None)
    torch.testing.assert_close(out, _sdpa(first, k[:, :, :4], v[:, :, :4], causal=True), atol=ATOL, rtol=RTOL)


# ------------------------------------------------------------------------------ Hub function path

HUB_NAME = "nki-kernels/nki-kernels:nki_attention_forward"


def test_hub_function_path_needs_kernels_0_18_2():
    """transformers 5.24 loads "<repo>:<function>" only with kernels >= 0.18.2 (this project
    pins 0.17.2, the newest on PyPI here): it says so."""
    model = build(CAUSAL_LM["llama"])
    with pytest.raises(ImportError, match=r"0\.18\.2"):
        model.set_attn_implementation(HUB_NAME)


def test_hub_function_path_gets_the_sdpa_mask(backend, monkeypatch, tmp_path, restored_attention_registries):
    # transformers registers the Hub name and remembers the loaded kernel process-wide: the
    # registries are restored after this test (the fixture), the loader state here
    from transformers import modeling_flash_attention_utils as flash_utils

    for name in ("_loaded_implementation", "_flash_fn", "_flash_varlen_fn", "_flash_with_kvcache_fn", "_pad_fn",
                 "_unpad_fn", "_process_flash_kwargs_fn", "_process_with_kvcache_kwargs_fn"):
        monkeypatch.setattr(flash_utils, name, None if name == "_loaded_implementation" else getattr(flash_utils, name))
    """With kernels >= 0.18.2 (mocked: the version check and get_kernel, which returns a
    local build of this package), the Hub path registers our function with the SDPA mask
    (package attributes flash_attn_forward + supports_flash_attn) and matches sdpa."""
    from kernels import get_local_kernel
    from transformers.integrations import hub_kernels

    from ._local_repo import build_local_repo

    root, _ = build_local_repo(tmp_path, "hubpath")
    package = get_local_kernel(root)
    requested = []

    def get_kernel(repo_id, revision=None, version=None, allow_all_kernels=False, **kwargs):
        requested.append(repo_id)
        return package

    monkeypatch.setattr(hub_kernels, "is_kernels_available", lambda *a, **k: True)
    monkeypatch.setattr(hub_kernels, "get_kernel", get_kernel)
    reference, model = _pair(CAUSAL_LM["mistral"], "sdpa")
    model.set_attn_implementation(HUB_NAME)
    assert requested == ["nki-kernels/nki-kernels"]
    assert ALL_ATTENTION_FUNCTIONS[HUB_NAME] is package.nki_attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS[HUB_NAME] is sdpa_mask
    batch = padded_batch("left")
    with torch.no_grad():
        expected = reference(**batch.kwargs()).logits
        got = model(**batch.kwargs()).logits
    torch.testing.assert_close(got[batch.valid], expected[batch.valid], atol=ATOL, rtol=RTOL)

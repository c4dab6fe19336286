"""``nki_kernels.transformers.kernelize``: one call replaces the layers of Llama / Qwen2 /
Qwen3 / Mistral (RMSNorm, SiLU-gated MLP, rotary) and ViT-style models (LayerNorm, GELU) with
the package's layers under the pinned kernels 0.17.2; the NKI kernels run (simulator) and
the model computes what it computed before. The README's snippet is run as written."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

import nki_kernels
from nki_kernels import layers
from nki_kernels import transformers as nkt
from tests._helpers import attention_registries_restored

from ._models import CAUSAL_LM, TEXT, VISION, build, padded_batch, perturb_norms, pixels

ROOT = Path(__file__).resolve().parents[2]

# kernels that run per forward of the two-layer models: a norm before attention and MLP per
# layer plus the final norm (Qwen3 adds q/k norms, 2 per layer); one rotary, one attention
# and one gated MLP per layer. Vision: two LayerNorms per layer plus the final one (SigLIP's
# pooling head adds one LayerNorm and one GELU); one GELU and one attention per layer.
TEXT_KERNELS = {"rms_norm_kernel": 5, "rotary_kernel": 2, "act_and_mul_kernel": 2, "attention_kernel": 2}
EXPECTED = {
    "llama": TEXT_KERNELS,
    "qwen2": TEXT_KERNELS,
    "qwen3": {**TEXT_KERNELS, "rms_norm_kernel": 9},
    "mistral": TEXT_KERNELS,
    "vit": {"layer_norm_kernel": 5, "elementwise_kernel": 2, "attention_kernel": 2},
    "dinov2": {"layer_norm_kernel": 5, "elementwise_kernel": 2, "attention_kernel": 2},
    "siglip_vision": {"layer_norm_kernel": 6, "elementwise_kernel": 3, "attention_kernel": 2},
}
FAMILIES = {**{f: CAUSAL_LM[f] for f in ("llama", "qwen2", "qwen3", "mistral")}, **VISION}


@pytest.fixture(autouse=True, scope="module")
def _registered():
    with attention_registries_restored():
        nkt.register()
        yield


def _inputs(family):
    if family in VISION:
        return {"pixel_values": pixels()}, None, lambda out: out.last_hidden_state
    batch = padded_batch("left")
    return batch.kwargs(), batch.valid, lambda out: out.logits


@pytest.mark.parametrize("family", list(FAMILIES))
def test_kernelize_runs_the_kernels_and_keeps_the_outputs(simulator_backend, kernel_calls, family):
    model = build(FAMILIES[family], "sdpa")
    perturb_norms(model)
    inputs, valid, result = _inputs(family)
    with torch.no_grad():
        expected = result(model(**inputs))
    model.set_attn_implementation("nki")
    assert nkt.kernelize(model) is model
    kernel_calls.clear()
    with torch.no_grad():
        got = result(model(**inputs))
    assert dict(kernel_calls) == EXPECTED[family]
    if valid is not None:
        got, expected = got[valid], expected[valid]
    # fp32 kernels against eager fp32 ops: rounding order only (~1e-7 relative per op)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_kernelized_llama_generates_the_same_tokens(simulator_backend):
    reference = build(CAUSAL_LM["llama"], "sdpa")
    perturb_norms(reference)
    batch = padded_batch("left")
    args = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = reference.generate(**batch.kwargs(), **args)
    model = build(CAUSAL_LM["llama"], "nki")
    model.load_state_dict(reference.state_dict())
    nkt.kernelize(model)
    with torch.no_grad():
        assert torch.equal(model.generate(**batch.kwargs(), **args), expected)


def test_what_kernelize_names_and_replaces(reference_backend):
    from transformers.models.llama import modeling_llama

    model = build(CAUSAL_LM["llama"], "nki")
    named = nkt.make_kernelizable(model)
    assert sorted(named) == ["LlamaMLP -> SiluGatedMLP", "LlamaRMSNorm -> RMSNorm", "SiLUActivation -> SiLU",
                             "transformers.models.llama.modeling_llama.apply_rotary_pos_emb -> rotary_pos_emb"]
    assert nkt.make_kernelizable(model) == []          # named once
    nkt.kernelize(model)
    layer0 = model.model.layers[0]
    assert layer0.input_layernorm.forward.__func__ is layers.RMSNorm.forward
    assert layer0.mlp.forward.__func__ is layers.SiluGatedMLP.forward
    assert modeling_llama.apply_rotary_pos_emb.forward.__func__ is layers.ApplyRotaryPosEmb.forward
    # a second kernelize is harmless (its own forwards are not "someone else's wrapper")
    nkt.kernelize(model)


def test_the_rotary_function_layer_is_shared_by_every_model_of_the_family(simulator_backend, kernel_calls):
    """README: the rotary is one function layer per family for the whole process, so a model
    that was never kernelized calls the rotary op once another model of its family was
    kernelized (its norms and MLP keep their own forwards: they are per instance)."""
    untouched = build(CAUSAL_LM["llama"], "sdpa")
    other = build(CAUSAL_LM["llama"], "sdpa")
    ids = torch.randint(1, untouched.config.vocab_size, (1, 5))
    with torch.no_grad():
        before = untouched(input_ids=ids).logits
    assert not kernel_calls
    nkt.kernelize(other)
    with torch.no_grad():
        after = untouched(input_ids=ids).logits
    assert set(kernel_calls) == {"rotary_kernel"}, dict(kernel_calls)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-4)   # fp32: rounding only


def test_gemma_norms_keep_their_own_forward(reference_backend):
    """Gemma's RMSNorm computes x * (1 + weight): it is not on the allow-list, so kernelize
    leaves it alone (the package's RMSNorm layer would compute x * weight)."""
    model = build(CAUSAL_LM["gemma3"], "nki")
    named = nkt.make_kernelizable(model)
    assert not any("RMSNorm" in n or "rotary" in n for n in named), named
    assert named == ["GELUTanh -> GeluTanh"]


def test_a_llama_mlp_with_another_activation_keeps_its_own_forward(reference_backend):
    """LlamaMLP is named SiluGatedMLP only for instances whose act_fn is SiLU: a Llama
    configured with hidden_act="gelu" keeps its MLP's forward (the package's layer would
    compute silu(gate) * up) and its logits; its norms are still replaced."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = build(lambda: LlamaForCausalLM(LlamaConfig(**{**TEXT, "hidden_act": "gelu"})))
    perturb_norms(model)
    ids = torch.randint(3, 97, (2, 9))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    nkt.kernelize(model)
    layer0 = model.model.layers[0]
    assert "forward" not in vars(layer0.mlp)
    assert layer0.input_layernorm.forward.__func__ is layers.RMSNorm.forward
    with torch.no_grad():
        # the reference backend's layers against eager fp32 ops: rounding order only
        torch.testing.assert_close(model(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-4)


def test_layer_norm_subclasses_keep_their_own_forward(reference_backend):
    """kernels reads the layer name off type(module), so every subclass of nn.LayerNorm
    inherits it. The review found Nemotron's LayerNorm1P (weight + 1) silently replaced by
    plain LayerNorm and ConvNext's channels-first LayerNorm crashing, once any model had
    named nn.LayerNorm; the name now holds for nn.LayerNorm itself only."""
    from transformers import ConvNextConfig, ConvNextModel, NemotronConfig, NemotronForCausalLM

    nkt.kernelize(build(VISION["vit"]))                  # names nn.LayerNorm process-wide
    convnext = ConvNextModel(ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[16, 32],
                                            depths=[1, 1], image_size=32)).eval()
    nemotron = build(lambda: NemotronForCausalLM(NemotronConfig(**{**TEXT, "hidden_act": "relu2"})))
    images, ids = torch.randn(2, 3, 32, 32), torch.randint(3, 97, (2, 9))
    for model, run in ((convnext, lambda m: m(images).last_hidden_state),
                       (nemotron, lambda m: m(input_ids=ids).logits)):
        perturb_norms(model)
        with torch.no_grad():
            expected = run(model)
        nkt.kernelize(model)
        replaced = {type(m).__name__ for m in model.modules() if "forward" in vars(m)}
        subclasses = {type(m).__name__ for m in model.modules()
                      if isinstance(m, torch.nn.LayerNorm) and type(m) is not torch.nn.LayerNorm}
        assert subclasses and not subclasses & replaced, (subclasses, replaced)
        with torch.no_grad():
            torch.testing.assert_close(run(model), expected, atol=1e-5, rtol=1e-4)
    assert "LayerNorm" in {type(m).__name__ for m in convnext.modules() if "forward" in vars(m)}


def test_kernelized_llama_under_autocast(simulator_backend, kernel_calls):
    """An fp32 Llama under torch.autocast(bf16): the rotary sees bf16 q/k from autocast's
    linears beside fp32 cos/sin (eager promotes to fp32) and attention then gets fp32 q/k
    beside a bf16 v (autocast casts SDPA's inputs to bf16). Both were refused as mixed
    dtypes once kernelized (the review's finding); now the model runs and its logits agree
    with eager's under autocast to bf16 rounding."""
    model = build(CAUSAL_LM["llama"], "sdpa")
    perturb_norms(model)
    batch = padded_batch("left")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(**batch.kwargs()).logits
    model.set_attn_implementation("nki")
    nkt.kernelize(model)
    kernel_calls.clear()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(**batch.kwargs()).logits
    assert {"rotary_kernel", "attention_kernel"} <= set(kernel_calls), dict(kernel_calls)
    assert got.dtype == expected.dtype == torch.bfloat16
    # eager rounds every op's result to bf16 and the kernels round theirs once, at other
    # places: the two differ by a few bf16 units (2**-8) of the logits' scale
    valid = batch.valid
    scale = expected[valid].float().abs().max()
    torch.testing.assert_close(got[valid].float(), expected[valid].float(), atol=8 * 2**-8 * scale, rtol=0)


def test_kernelize_for_training(simulator_backend, kernel_calls):
    """Mode.TRAINING (the default in train mode): the layers' backward runs the NKI backward
    kernels of the block ops (RMSNorm, the SiLU-gated MLP, rotary; attention's backward
    recomputes in fp32 on this branch); loss and gradients as the eager model's."""
    reference = build(CAUSAL_LM["qwen3"], "sdpa")
    perturb_norms(reference)
    model = build(CAUSAL_LM["qwen3"], "nki")
    model.load_state_dict(reference.state_dict())
    nkt.kernelize(model.train())
    reference.train()
    batch = padded_batch("left")
    labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
    losses = [m(**batch.kwargs(), labels=labels).loss for m in (reference, model)]
    assert kernel_calls["act_and_mul_kernel"] == 2
    forward_rotary = kernel_calls["rotary_kernel"]
    for loss in losses:
        loss.backward()
    # the backward kernels ran: every RMSNorm (two per layer, q/k norms two more, the final
    # one), the gated MLP per layer; rotary's backward is its forward kernel, transposed,
    # once per forward launch
    assert kernel_calls["rms_norm_backward_kernel"] == 9
    assert kernel_calls["act_and_mul_backward_kernel"] == 2
    assert kernel_calls["rotary_kernel"] == 2 * forward_rotary > 0
    torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=1e-4)
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-3, msg=name)


def test_kernelize_refuses_to_drop_a_forward_wrapper(reference_backend):
    """A sharding plan (or an accelerate hook) sets ``module.forward``; kernelize would
    replace it, so it raises and says to kernelize first."""
    model = build(CAUSAL_LM["llama"], "nki")
    norm = model.model.norm
    original = norm.forward
    norm.forward = lambda hidden_states: original(hidden_states)
    with pytest.raises(ValueError, match=r"model\.norm \(LlamaRMSNorm\).*before sharding"):
        nkt.kernelize(model)


def test_layer_mapping():
    mapping = nkt.layer_mapping("neuron")
    assert set(mapping) == set(nkt.LAYER_FOR_NAME)
    for name, devices in mapping.items():
        assert list(devices) == ["neuron"]
        assert devices["neuron"].load() is getattr(layers, nkt.LAYER_FOR_NAME[name])
    with pytest.raises(ValueError, match="device='cuda'"):
        nkt.layer_mapping("cuda")


def _readme_block(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_transformers_snippet_runs_as_written(simulator_backend, kernel_calls):
    """The README's transformers + kernelize block, run as written (≤ 10 lines), with a
    tiny config and a left-padded batch for its `config` and `batch`."""
    from transformers import LlamaConfig

    from ._models import TEXT

    code = _readme_block("### transformers")
    assert len(code.strip().splitlines()) <= 10
    batch = padded_batch("left")
    namespace = {"config": LlamaConfig(**TEXT), "batch": batch.kwargs()}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["model"].config._attn_implementation == "nki"
    assert namespace["out"].shape[0] == 3
    assert {"rms_norm_kernel", "rotary_kernel", "act_and_mul_kernel", "attention_kernel"} <= set(kernel_calls)
    assert "nki_kernels" in sys.modules

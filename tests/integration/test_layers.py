"""The ``layers`` submodule under ``kernels.kernelize``: a tiny Llama (RMSNorm, SiLU, rotary)
and a ViT-style block (LayerNorm, GELU, GeluTanh, SiluAndMul), kernelized from a local
kernel repository with the NKI kernels running in the simulator."""

from __future__ import annotations

import inspect
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ._local_repo import build_local_repo

# kernels and transformers are dev dependencies (pyproject.toml): a missing one fails, it
# never skips the module
from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

LAYER_NAMES = ["RMSNorm", "LayerNorm", "SiLU", "Gelu", "GeluTanh", "SiLUAndMul", "SiluAndMul",
               "GeluAndMul", "GeluTanhAndMul", "ApplyRotaryPosEmb"]


@pytest.fixture(scope="module")
def local_repo(tmp_path_factory):
    """(repo path, loaded package module) of a local repository built once for this module."""
    root, namespace = build_local_repo(tmp_path_factory.mktemp("layers-repo"), "layers")
    from kernels import get_local_kernel

    return root, get_local_kernel(root)


@pytest.fixture
def simulated_calls(local_repo, monkeypatch):
    """Run the loaded package's kernels in the simulator; count the kernel launches by name."""
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", "simulator")
    dispatch = sys.modules[local_repo[1].__name__ + "._dispatch"]
    calls: list[str] = []
    original = dispatch.run_simulated

    def counting(call):
        calls.append(call.kernel)
        return original(call)

    monkeypatch.setattr(dispatch, "run_simulated", counting)
    return calls


def _decorate(monkeypatch, cls, name):
    """What ``kernels.replace_kernel_forward_from_hub(cls, name)`` sets, undone by monkeypatch."""
    monkeypatch.setattr(cls, "kernel_layer_name", name, raising=False)
    monkeypatch.setattr(cls, "kernel_condition", staticmethod(lambda module: True), raising=False)


@pytest.fixture
def hub_decorated_llama(monkeypatch):
    """Make transformers' Llama layers kernelizable, as transformers does with kernels >= 0.18.2.

    transformers 5.24 turns ``use_kernel_forward_from_hub`` / ``use_kernelized_func`` into
    no-ops unless ``kernels>=0.18.2,<0.19`` is installed (``is_kernels_available``); this
    project pins kernels 0.17.2. So apply the same decoration here with kernels' own API:
    ``LlamaRMSNorm`` -> "RMSNorm", ``SiLUActivation`` -> "SiLU", and the module-level
    ``apply_rotary_pos_emb`` wrapped as kernels' function layer "rotary_pos_emb" (attached
    to each attention module by ``attach``). monkeypatch undoes all of it after the test.
    """
    from transformers.activations import SiLUActivation
    from transformers.models.llama import modeling_llama

    _decorate(monkeypatch, modeling_llama.LlamaRMSNorm, "RMSNorm")
    _decorate(monkeypatch, SiLUActivation, "SiLU")
    rope = use_kernel_forward_from_hub("rotary_pos_emb")(modeling_llama.apply_rotary_pos_emb)
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", rope)

    def attach(model):
        for module in model.modules():
            if isinstance(module, modeling_llama.LlamaAttention):
                module.__dict__.setdefault("_kernel_funcs", {})["apply_rotary_pos_emb"] = rope
        return model

    return attach


def test_layers_are_stateless_forward_only(local_repo):
    layers = local_repo[1].layers
    base = {name for name, _ in inspect.getmembers(nn.Module)}
    for name in LAYER_NAMES:
        cls = getattr(layers, name)
        assert cls.__init__ is nn.Module.__init__, name
        extra = {m for m, _ in inspect.getmembers(cls)} - base
        assert extra <= {"has_backward", "can_torch_compile"}, (name, extra)
        assert cls.has_backward is True and cls.can_torch_compile is True


def _tiny_llama(dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         rms_norm_eps=1e-6, hidden_act="silu")
    model = LlamaForCausalLM(config).to(dtype).eval()
    # transformers initialises RMSNorm weights to ones: perturb them so the weight matters
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "LlamaRMSNorm":
                module.weight.add_(torch.randn_like(module.weight) * 0.2)
    return model


@pytest.mark.parametrize("dtype, atol, rtol", [
    # fp32: each kernel differs from the eager op by fp32 rounding order only (~1e-7 relative);
    # through 2 layers and the LM head, logits of magnitude ~1 agree to 1e-5 -> 1e-4 / 1e-4.
    (torch.float32, 1e-4, 1e-4),
    # bf16: the kernels round each op's result once where eager rounds intermediates too
    # (Llama RMSNorm rounds x * rstd before the weight), so hidden states differ by about one
    # bf16 ulp per op (2**-8 relative); logits of magnitude < 1 then differ by a few 1e-3
    # (0.004 max measured) -> the bf16 peers' 2e-2 / 2e-2.
    (torch.bfloat16, 2e-2, 2e-2),
])
def test_tiny_llama_kernelized_same_logits(local_repo, simulated_calls, hub_decorated_llama, dtype, atol, rtol):
    root, package = local_repo
    model = hub_decorated_llama(_tiny_llama(dtype))
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        expected = model(ids).logits

    mapping = {
        "RMSNorm": {"cpu": LocalLayerRepository(root, layer_name="RMSNorm")},
        "SiLU": {"cpu": LocalLayerRepository(root, layer_name="SiLU")},
        "rotary_pos_emb": {"cpu": LocalLayerRepository(root, layer_name="ApplyRotaryPosEmb")},
    }
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE, device="cpu", use_fallback=False)
    norm = model.model.norm
    assert norm.forward.__func__ is package.layers.RMSNorm.forward

    with torch.no_grad():
        got = model(ids).logits
    # every RMSNorm (2 per layer + final), SiLU (1 per layer) and rotary (1 per layer) ran
    # its NKI kernel in the simulator
    assert sorted(set(simulated_calls)) == ["elementwise_kernel", "rms_norm_kernel", "rotary_kernel"]
    assert simulated_calls.count("rms_norm_kernel") == 5
    assert simulated_calls.count("elementwise_kernel") == 2
    assert simulated_calls.count("rotary_kernel") == 2
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)


class _VitBlock(nn.Module):
    """LayerNorm -> Linear -> GELU / GeluTanh -> SiluAndMul, as kernelize sees a ViT MLP."""

    def __init__(self, hidden):
        super().__init__()
        from transformers.activations import GELUActivation, GELUTanh

        @use_kernel_forward_from_hub("LayerNorm")
        class KernelLayerNorm(nn.LayerNorm):
            pass

        @use_kernel_forward_from_hub("SiluAndMul")
        class SiluAndMul(nn.Module):
            def forward(self, x):
                d = x.shape[-1] // 2
                return F.silu(x[..., :d]) * x[..., d:]

        self.norm = KernelLayerNorm(hidden, eps=1e-6)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.gelu = GELUActivation()
        self.gelu_tanh = GELUTanh()
        self.gate = SiluAndMul()

    def forward(self, x):
        h = self.fc(self.norm(x))
        return self.gate(self.gelu(h) + self.gelu_tanh(h))


def test_vit_style_block_kernelized(local_repo, simulated_calls, monkeypatch):
    # transformers' GELU layers carry their hub names only with kernels >= 0.18.2 (see
    # hub_decorated_llama); decorate them here as transformers would.
    from transformers.activations import GELUActivation, GELUTanh

    _decorate(monkeypatch, GELUActivation, "GeLU")
    _decorate(monkeypatch, GELUTanh, "GeluTanh")
    root, package = local_repo
    block = _VitBlock(96).eval()
    with torch.no_grad():
        block.norm.weight.add_(torch.randn(96) * 0.3)
        block.norm.bias.add_(torch.randn(96) * 0.3)
    x = torch.randn(2, 197, 96)
    with torch.no_grad():
        expected = block(x)
    mapping = {
        "LayerNorm": {"cpu": LocalLayerRepository(root, layer_name="LayerNorm")},
        "GeLU": {"cpu": LocalLayerRepository(root, layer_name="Gelu")},
        "GeluTanh": {"cpu": LocalLayerRepository(root, layer_name="GeluTanh")},
        "SiluAndMul": {"cpu": LocalLayerRepository(root, layer_name="SiluAndMul")},
    }
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernelize(block, mode=Mode.INFERENCE, device="cpu", use_fallback=False)
    with torch.no_grad():
        got = block(x)
    assert sorted(simulated_calls) == ["act_and_mul_kernel", "elementwise_kernel", "elementwise_kernel", "layer_norm_kernel"]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_kernelized_layers_train_and_compile(local_repo, simulated_calls):
    # has_backward / can_torch_compile are claimed: kernelize for training + torch.compile,
    # then run forward and backward through the compiled module for real.
    root, package = local_repo

    @use_kernel_forward_from_hub("RMSNorm")
    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(64) * 0.2 + 1)
            self.variance_epsilon = 1e-6

        def forward(self, hidden_states):
            v = hidden_states.float().pow(2).mean(-1, keepdim=True)
            return self.weight * (hidden_states * torch.rsqrt(v + self.variance_epsilon))

    model = nn.Sequential(nn.Linear(64, 64), Norm())
    x = torch.randn(5, 64)
    expected = model(x)
    expected.square().sum().backward()
    ref_grad = model[0].weight.grad.clone()
    model.zero_grad()

    mapping = {"RMSNorm": {"cpu": LocalLayerRepository(root, layer_name="RMSNorm")}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE, device="cpu", use_fallback=False)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    got = compiled(x)
    got.square().sum().backward()
    assert "rms_norm_kernel" in simulated_calls
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(model[0].weight.grad, ref_grad, atol=1e-4, rtol=1e-4)


def test_rotary_layer_takes_the_sequence_major_layout(local_repo, simulated_calls):
    """``unsqueeze_dim=2``: q/k as [B, S, H, D] (cos/sin [B, S, D] unsqueezed at dim 2), against
    transformers' own function in float64; an unsupported dim is refused by name."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_rope

    rope = local_repo[1].layers.ApplyRotaryPosEmb()
    b, s, hq, hk, d = 2, 37, 4, 2, 32
    q, k = torch.randn(b, s, hq, d), torch.randn(b, s, hk, d)
    ang = torch.randn(b, s, d // 2).repeat(1, 1, 2)
    cos, sin = ang.cos(), ang.sin()
    q_out, k_out = rope(q, k, cos, sin, unsqueeze_dim=2)
    assert simulated_calls, "the kernel did not run"
    q_ref, k_ref = hf_rope(q.double(), k.double(), cos.double(), sin.double(), unsqueeze_dim=2)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    torch.testing.assert_close(q_out.double(), q_ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(k_out.double(), k_ref, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match=r"unsqueeze_dim=3 is not supported; expected 1 or 2"):
        rope(q, k, cos, sin, unsqueeze_dim=3)


@pytest.mark.parametrize("make", [
    lambda: nn.RMSNorm(64, eps=1e-6, elementwise_affine=False),       # no weight
    lambda: nn.RMSNorm((4, 16), eps=None),                             # two normalised dims, torch's eps
], ids=["no-affine", "two-dims-default-eps"])
def test_rms_norm_layer_takes_torch_rmsnorm_modules(local_repo, simulated_calls, make):
    module = make()
    if module.weight is not None:
        with torch.no_grad():
            module.weight.copy_(torch.randn_like(module.weight))
    x = torch.randn(3, 5, 4, 16).reshape(3, 5, 64) if module.normalized_shape == (64,) else torch.randn(3, 5, 4, 16)
    want = module(x)
    layer = local_repo[1].layers.RMSNorm
    got = layer.forward(module, x)
    assert simulated_calls, "the kernel did not run"
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_rms_norm_layer_returns_llamas_dtype_for_a_bf16_input_and_fp32_weight(local_repo, simulated_calls):
    # LlamaRMSNorm returns weight * x.to(input_dtype): fp32 with an fp32 weight and bf16
    # hidden states (a mixed-precision checkpoint); the layer must too (a review's mutant
    # that returned the op's bf16 passed every other test)
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    module = LlamaRMSNorm(64, eps=1e-6)
    with torch.no_grad():
        module.weight.copy_(torch.randn(64) * 0.5 + 1.0)
    x = torch.randn(3, 5, 64).bfloat16()
    want = module(x)
    got = local_repo[1].layers.RMSNorm.forward(module, x)
    assert simulated_calls, "the kernel did not run"
    assert got.dtype == want.dtype == torch.float32
    # one rounding of the normalised value to bf16 in both (Llama rounds before the weight,
    # the kernel after): they differ by up to one bf16 unit of the result
    torch.testing.assert_close(got, want, atol=0, rtol=2 * 2**-8)

"""Layers for ``kernels.kernelize``: stateless ``nn.Module`` subclasses whose ``forward``
replaces the forward of the module they are mapped onto, reusing that module's attributes.

No ``__init__`` and no members other than ``forward``, ``has_backward`` and
``can_torch_compile`` (``kernels`` rejects anything else). Every forward calls a custom op of
this package, so on ``neuron`` tensors it runs the NKI kernel and on CPU the reference (or the
kernel in the simulator with ``NKI_KERNELS_CPU_BACKEND=simulator``).

Mapping names used by transformers 5.x:

| transformers layer name (``use_kernel_forward_from_hub``) | layer here |
|---|---|
| ``RMSNorm`` (Llama, Mistral, Qwen2, ... RMSNorm) | ``RMSNorm`` |
| ``SiLU`` (``ACT2FN["silu"]``) | ``SiLU`` |
| ``GeLU`` (``ACT2FN["gelu"]``) | ``Gelu`` |
| ``GeluTanh`` (``ACT2FN["gelu_pytorch_tanh"]``) | ``GeluTanh`` |
| ``rotary_pos_emb`` (Llama ``apply_rotary_pos_emb``) | ``ApplyRotaryPosEmb`` |
| ``nn.LayerNorm`` via ``replace_kernel_forward_from_hub(cls, "LayerNorm")`` | ``LayerNorm`` |
| kernels-community ``SiluAndMul`` / ``GeluAndMul`` / ``GeluTanhAndMul`` | same names |
| ``SiluGatedMLP`` (``nki_kernels.transformers``: Llama/Mistral/Qwen MLPs) | ``SiluGatedMLP`` |

``nki_kernels.transformers.kernelize`` names transformers' layers and maps them onto these.
"""

from __future__ import annotations

import torch
from torch import nn

from .ops.activations import gelu, gelu_and_mul, silu, silu_and_mul
from .ops.norms import layer_norm, rms_norm
from .ops.rotary import apply_rotary_pos_emb


class RMSNorm(nn.Module):
    """RMSNorm with the replaced module's ``weight`` (None without an affine) and
    ``variance_epsilon`` (transformers) or ``eps`` (``nn.RMSNorm``; None is torch's default),
    over its ``normalized_shape`` (``nn.RMSNorm``) or the last dimension (transformers).

    Shapes: hidden_states [..., *normalized_shape] -> same. With a weight the result has the
    dtype the Llama forward returns (``weight * x.to(input_dtype)``): the promotion of the
    input and weight dtypes; without one, the input's.
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        eps = getattr(self, "variance_epsilon", None)
        if eps is None:
            eps = getattr(self, "eps", None)
        shape = getattr(self, "normalized_shape", None) or (hidden_states.shape[-1],)
        weight = getattr(self, "weight", None)
        out = rms_norm(hidden_states, tuple(shape), weight, eps)
        if weight is None:
            return out
        result_dtype = torch.promote_types(hidden_states.dtype, weight.dtype)
        return out if out.dtype == result_dtype else out.to(result_dtype)


class LayerNorm(nn.Module):
    """``nn.LayerNorm`` forward with the replaced module's ``normalized_shape``, ``weight``,
    ``bias`` (either may be None) and ``eps``.

    Shapes: input [..., *normalized_shape] -> same shape and dtype.
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm(input, tuple(self.normalized_shape), self.weight, self.bias, self.eps)


class SiLU(nn.Module):
    """SiLU. Shapes: any -> same."""

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return silu(input)


class Gelu(nn.Module):
    """Exact (erf) GELU. Shapes: any -> same."""

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return gelu(input)


class GeluTanh(nn.Module):
    """Tanh-approximated GELU. Shapes: any -> same."""

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return gelu(input, "tanh")


class SiLUAndMul(nn.Module):
    """SwiGLU gate ``silu(x[..., :d]) * x[..., d:]``. Shapes: x [..., 2d] -> [..., d]."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)


class GeluAndMul(nn.Module):
    """GeGLU gate with exact GELU. Shapes: x [..., 2d] -> [..., d]."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_and_mul(x)


class GeluTanhAndMul(nn.Module):
    """GeGLU gate with tanh GELU. Shapes: x [..., 2d] -> [..., d]."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_and_mul(x, "tanh")


class SiluGatedMLP(nn.Module):
    """The gated MLP of Llama, Mistral, Qwen2/3: ``down_proj(silu(gate_proj(x)) * up_proj(x))``,
    with the replaced module's ``gate_proj``, ``up_proj`` and ``down_proj`` and the gate in one
    ``silu_and_mul`` op (one rounding; eager rounds after the SiLU and after the product).

    Shapes: x [..., hidden] -> [..., hidden]. The two projections are concatenated to
    [..., 2 * intermediate] for the op: one extra copy of the intermediate activations.
    Under tensor parallelism (gate/up column-sharded) each rank concatenates its own halves,
    which stay paired.
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = torch.cat((self.gate_proj(x), self.up_proj(x)), dim=-1)
        return self.down_proj(silu_and_mul(gate_up))


class ApplyRotaryPosEmb(nn.Module):
    """transformers' Llama ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``.

    Shapes: q [B, Hq, S, D], k [B, Hk, S, D], cos/sin [B, S, D] with ``unsqueeze_dim=1``;
    with ``unsqueeze_dim=2`` q/k are [B, S, H, D] (handled as a transposed view).
    Returns (q_embed, k_embed).
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        if unsqueeze_dim == 1:
            return apply_rotary_pos_emb(q, k, cos, sin)
        if unsqueeze_dim == 2:
            q_out, k_out = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            return q_out.transpose(1, 2), k_out.transpose(1, 2)
        raise ValueError(f"unsqueeze_dim={unsqueeze_dim} is not supported; expected 1 or 2")


# kernels-community spelling
SiluAndMul = SiLUAndMul

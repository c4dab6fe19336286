"""Hugging Face transformers integration: the package's ops in transformers models, in a few lines.

    import nki_kernels.transformers as nkt
    nkt.register()                      # attn_implementation="nki": attention AND its mask function
    model = AutoModelForCausalLM.from_config(config, attn_implementation="nki")
    nkt.kernelize(model)                # RMSNorm, SiLU-gated MLP, rotary / LayerNorm, GELU layers

* :func:`nki_attention_forward`: the attention-interface function (``scaled_dot_product_attention``
  underneath). It accepts every mask format transformers passes: SDPA's (None or 4-D bool /
  additive) and FlashAttention-2's (None or 2-D key padding, the Hub function path).
* :func:`register`: registers it under a name WITH the SDPA mask function. transformers 5.24
  builds the mask per implementation name (``AttentionMaskInterface``) and gives a name it has
  no mask function for ``attention_mask=None``: padded batches and sliding windows silently
  wrong (issue 14; ``masking_utils._preprocess_mask_arguments``).
* :func:`kernelize`: ``kernels.kernelize`` with this package's layers. transformers 5.24 names
  its layers for kernels only with ``kernels>=0.18.2`` (its decorators are stubs otherwise,
  ``integrations/hub_kernels.py``); with the pinned 0.17.2 this names them with kernels' public
  ``replace_kernel_forward_from_hub`` / ``use_kernel_forward_from_hub`` and maps every name to
  a layer of this package in-process (no Hub repository, no local build).

Loaded from the Hub (``kernels.get_kernel``), the same module is ``<kernel>.transformers`` and
uses that build's ops and layers. Only torch is needed to import this module; transformers and
kernels are imported by the functions that need them.
"""

from __future__ import annotations

import sys
import warnings
from typing import Optional

import torch
from torch import nn

from . import _checks
from . import layers as _layers
from .ops.attention import scaled_dot_product_attention

__all__ = ["ATTENTION_NAME", "kernelize", "layer_mapping", "make_kernelizable", "nki_attention_forward", "register"]

ATTENTION_NAME = "nki"

# ---------------------------------------------------------------------------- attention function

# Keyword arguments transformers passes that this function cannot honour: refuse them rather
# than compute something else.
_UNSUPPORTED = {
    "softcap": "logit soft-capping (Gemma2's attn_logit_softcapping); set config.attn_logit_softcapping=None "
               "to run without it, or use attn_implementation='eager'",
    "s_aux": "attention sinks (s_aux)",
    "position_bias": "an additive position bias (T5-style); use attn_implementation='sdpa'",
    "block_table": "a paged KV cache (continuous batching)",
    # transformers folds a sparse-attention indexer's top-k keys into the mask only for the
    # names "eager" and "sdpa"; any other implementation gets them as these kwargs
    # (modeling_deepseek_v32 and the models copied from it; minimax_m3_vl's block_indices)
    "indices": "sparse attention's selected keys (indices: DeepSeek-V3.2-style indexers); use "
               "attn_implementation='sdpa', which folds them into the mask",
    "block_indices": "block-sparse attention's selected key blocks (block_indices); use "
                     "attn_implementation='sdpa'",
}


def nki_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                          scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                          sliding_window: Optional[int] = None, **kwargs):
    """transformers attention-interface function backed by the NKI attention op.

    ``query [B, H, Sq, D]``, ``key/value [B, Hkv, Sk, D]`` (``H`` a multiple of ``Hkv``; no
    ``repeat_kv``); returns ``(attn_output [B, Sq, H, D], None)``. Use it through
    :func:`register` (``attn_implementation="nki"``).

    ``attention_mask`` in either format transformers builds:

    * SDPA / eager (``sdpa_mask`` / ``eager_mask``, what :func:`register` installs): None, or
      4-D ``[B|1, 1|H, Sq, Sk]`` bool (True = attend) or additive float (float32 or the query
      dtype). The mask already holds causality, padding, sliding window and packed sequences;
      None means causal (top-left, as SDPA) when ``Sq > 1`` and the layer is causal
      (``is_causal`` if given, else ``module.is_causal``), else full attention. Top-left is
      what ``sdpa_mask`` relies on when it returns None for fewer queries than keys: a
      prefill into an empty static cache, whose keys past the prompt are unused slots
      (``masking_utils._ignore_causal_mask_sdpa``). Model code that tests the name "sdpa"
      and assumes another alignment for other names is not followed: Gemma4's KV-shared
      layers under ``logits_to_keep > 1`` with no padding keep the last queries of a
      None-mask layer for every name but "sdpa" (README, "transformers").
    * FlashAttention-2 (``flash_attention_mask``, what transformers registers for a Hub
      ``"<repo>:<function>"``): None, or 2-D ``[B, L]`` key padding (bool or 0/1 ints, True = real
      token, ``L <= Sk``, keys from ``L`` on ignored). Causality is bottom-right aligned (the Sq
      queries are the last Sq of the L positions), ``sliding_window=w`` keeps keys ``> q - w``,
      and packed sequences come from ``position_ids`` (or ``cu_seq_lens_q/k``), as in
      ``modeling_flash_attention_utils._flash_attention_forward``. A None mask is read this way
      only when the model's implementation name is registered with ``flash_attention_mask``.

    Any other mask rank or dtype, ``softcap``, ``s_aux``, ``position_bias``, a paged cache,
    sparse attention's ``indices`` / ``block_indices``, ``dropout > 0``, q/k/v that are not 4-D tensors, malformed ``cu_seq_lens``, or a
    ``sliding_window`` shorter than the keys with no mask in SDPA's format (its masks hold
    the window; None would silently drop it) raises with the reason. Runs, like every op, the
    NKI kernel on ``neuron`` tensors and the reference (or the simulator) on CPU.
    """
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__qualname__}")
        if tensor.dim() != 4:
            raise ValueError(f"{name} has shape {list(tensor.shape)}; the attention interface passes 4-D "
                             "[B, heads, S, head_dim] tensors")
    for name, what in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise ValueError(f"nki_attention_forward got {name}={_short(kwargs[name])}: the NKI attention kernel "
                             f"does not support {what}")
    if kwargs.get("output_attentions", False):
        # as transformers' sdpa_attention_forward, which warns once: the kernel never forms
        # the [Sq, Sk] probabilities, so the model's attentions come back None
        warnings.warn("nki_attention_forward does not return attention weights (output_attentions=True "
                      "gives None); use attn_implementation='eager' for them", stacklevel=2)
    p = _checks.check_real("dropout", dropout)
    if not 0.0 <= p <= 1.0:          # (NaN fails both)
        raise ValueError(f"dropout={dropout!r} must be a float in [0, 1]")
    if p != 0.0:
        raise NotImplementedError(f"dropout={dropout!r}: the NKI attention kernel has no dropout; run the model "
                                  "in eval mode (transformers then passes dropout=0.0)")
    if sliding_window is not None and _checks.check_index("sliding_window", sliding_window) < 1:
        raise ValueError(f"sliding_window={sliding_window!r} must be an int >= 1 or None")
    sq, sk = query.shape[2], key.shape[2]
    if is_causal is not None:
        causal = _checks.check_bool("is_causal", is_causal)
    else:
        causal = bool(getattr(module, "is_causal", True))
    if _flash_format(module, attention_mask, kwargs):
        mask = _flash_mask(attention_mask, query, key, causal, sliding_window, kwargs)
    else:
        mask = attention_mask
        if mask is None and sliding_window is not None and sk > sliding_window:
            # transformers' SDPA masks hold the window (sdpa_mask returns None only where the
            # window covers every key); applying one here would be a guess at its alignment
            raise ValueError(f"sliding_window={sliding_window} with attention_mask=None in SDPA's format and "
                             f"{sk} keys: the window is not applied without a mask; pass the 4-D mask "
                             "transformers builds (it holds the window), or a 2-D key-padding mask for "
                             "FlashAttention-2's semantics")
    out = scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout,
                                       is_causal=causal and mask is None and sq > 1, scale=scaling,
                                       enable_gqa=query.shape[1] != key.shape[1])
    # [B, Sq, H, D] contiguous, as transformers' own attention functions return it (models
    # .view() it: AFMoE, Dory, JetMoE); no copy when q/k/v were transposed [B, S, H, D] views
    return out.transpose(1, 2).contiguous(), None


def _short(value) -> str:
    return f"tensor of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)


def _flash_format(module: nn.Module, mask: Optional[torch.Tensor], kwargs: dict) -> bool:
    """Whether ``mask`` is FlashAttention-2's format (else SDPA's)."""
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dim() not in (2, 4):
            raise ValueError(
                f"attention_mask is a {_short(mask)}; expected None, a 4-D [B, 1 or H, Sq, Sk] bool or "
                "additive mask (SDPA/eager format) or a 2-D [B, L] key-padding mask (FlashAttention-2 format)")
        return mask.dim() == 2
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        return True          # a packed batch described FlashAttention-2's way (SDPA's has a 4-D mask)
    # None: both formats mean "no padding", but differ for chunked prefill (Sq > 1 below Sk),
    # sliding windows and packed sequences; the mask function registered for this model's
    # implementation name says which one transformers built.
    name = getattr(getattr(module, "config", None), "_attn_implementation", None)
    masking = sys.modules.get("transformers.masking_utils")
    if name is None or masking is None:
        return False
    return masking.ALL_MASK_ATTENTION_FUNCTIONS.get(name) is masking.flash_attention_mask


def _flash_mask(padding: Optional[torch.Tensor], query: torch.Tensor, key: torch.Tensor, causal: bool,
                window: Optional[int], kwargs: dict) -> Optional[torch.Tensor]:
    """FlashAttention-2's semantics as a bool ``[B or 1, 1, Sq, Sk]`` mask (True = attend), or
    None when plain SDPA ``is_causal`` (top-left) computes the same thing."""
    b, sq, sk = query.shape[0], query.shape[2], key.shape[2]
    if padding is not None:
        if padding.device != query.device:
            raise ValueError(f"attention_mask is on {padding.device}, query on {query.device}: a 2-D key-padding "
                             "mask must be on the query's device")
        if padding.is_floating_point() or padding.is_complex():
            raise ValueError(f"attention_mask is a 2-D {str(padding.dtype).removeprefix('torch.')} tensor; a 2-D mask "
                             "is FlashAttention-2's key padding [B, L] and must be bool or 0/1 integers")
        if padding.shape[0] != b or padding.shape[1] > sk:
            raise ValueError(f"attention_mask has shape {list(padding.shape)}; a 2-D key-padding mask must be "
                             f"[B, L] with B = {b} (the query batch) and L <= {sk} (the keys)")
        # (one reduction and one read back per call, as transformers' own FlashAttention-2 path
        # reads the mask back to unpad; the values are gathered only for the error)
        if padding.dtype != torch.bool and bool(((padding != 0) & (padding != 1)).any()):
            values = padding.unique().tolist()
            raise ValueError(f"attention_mask (2-D key padding) holds the values {values[:8]}; a 0/1 integer "
                             "mask may hold only 0 (padding) and 1 (a real token)")
    length = sk if padding is None else padding.shape[1]
    segments = _packed_segments(kwargs, b, sq, sk) if padding is None else None
    windowed = window is not None and sk > window     # FA2 applies a window only to longer keys
    if padding is None and segments is None and not windowed and (not causal or sq in (1, sk)):
        return None
    device = query.device
    kv = torch.arange(sk, device=device)[None, :]
    q = (torch.arange(sq, device=device) + (length - sq))[:, None]   # bottom-right: the last Sq of L positions
    keep = kv < length                                                # keys past L are a static cache's unused tail
    if causal:
        keep = keep & (kv <= q)
    if windowed:                                                      # FA2 window (w-1, w-1), + causal when causal
        keep = keep & (kv > q - window) & (kv < q + window)
    keep = keep[None, None]
    if padding is not None:
        keys = torch.zeros(b, sk, dtype=torch.bool, device=device)
        keys[:, :length] = padding.bool()
        keep = keep & keys[:, None, None, :]
    if segments is not None:
        keep = keep & (segments[:, None, :, None] == segments[:, None, None, :])
    return keep


def _shown_offsets(cu) -> str:
    """A cu_seq_lens argument as an error shows it: its first 16 offsets, or what it is."""
    if isinstance(cu, torch.Tensor) and cu.dim() == 1:
        return str(cu.tolist()[:16])
    return _short(cu)


def _check_cu_seq_lens(cu: torch.Tensor, sk: int) -> None:
    """FlashAttention-2's cumulative sequence lengths: a 1-D integer tensor from 0 to the
    total length, never decreasing (varlen's cu_seqlens); anything else would cut the
    packed row at wrong boundaries without an error. One read back of a bool."""
    if (not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2 or cu.is_floating_point()
            or cu.is_complex() or cu.dtype == torch.bool):
        raise ValueError(f"cu_seq_lens_q/k={_shown_offsets(cu)}: must be a 1-D integer tensor of at least 2 "
                         "offsets (0, then each sequence's end)")
    if bool((cu[0] != 0) | (cu[-1] != sk) | (cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seq_lens_q/k={_shown_offsets(cu)}: must start at 0, never decrease and end at "
                         f"{sk} (the packed row's length)")


def _packed_segments(kwargs: dict, b: int, sq: int, sk: int) -> Optional[torch.Tensor]:
    """``[1, S]`` sequence index of each position of a packed batch (one row holding several
    sequences), from ``cu_seq_lens_q/k`` or from ``position_ids`` restarting; None if not packed."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None or cu_k is not None:
        for cu in (cu_q, cu_k):
            if cu is not None:
                _check_cu_seq_lens(cu, sk)
        if cu_q is None or cu_k is None or not torch.equal(cu_q, cu_k) or b != 1 or sq != sk:
            def shown(cu):
                return None if cu is None else cu.tolist()[:16]
            raise ValueError(f"cu_seq_lens_q={shown(cu_q)}, cu_seq_lens_k={shown(cu_k)}: the NKI attention takes "
                             "a packed batch only with both given and equal, in one row (B = 1) of as many "
                             f"queries as keys (got B={b}, Sq={sq}, Sk={sk})")
        return torch.bucketize(torch.arange(sk, device=cu_k.device), cu_k[1:], right=True)[None]
    position_ids = kwargs.get("position_ids")
    # transformers' _is_packed_sequence: one row whose positions restart from their minimum
    if position_ids is None or b != 1 or sq == 1 or sq != sk or position_ids.shape[-1] != sk:
        return None
    starts = position_ids.reshape(1, -1) == position_ids.min()
    if int(starts.sum()) <= 1:
        return None
    return torch.cumsum(starts.to(torch.int32), dim=-1)


# ---------------------------------------------------------------------------- register

# transformers treats implementation names containing these specially (modeling_utils.
# get_correct_attn_implementation: "sdpa", "flex_attention"; utils.generic.
# is_flash_attention_requested: "flash"), so a name with them would not reach this function.
_RESERVED_PARTS = ("sdpa", "flash", "flex_attention")


def register(name: str = ATTENTION_NAME) -> str:
    """Register :func:`nki_attention_forward` as ``attn_implementation=name`` in transformers,
    with the SDPA mask function under the same name, and return ``name``.

    Then ``model.set_attn_implementation(name)`` or ``from_pretrained(..., attn_implementation=name)``
    runs every attention layer with the NKI op, with exactly the masks SDPA gets: None or a
    4-D bool mask holding padding (left or right), sliding windows and packed sequences.
    Idempotent; process-wide (transformers' registries are).
    """
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if not isinstance(name, str) or not name:
        raise ValueError(f"name={name!r} must be a non-empty string")
    for part in _RESERVED_PARTS:
        if part in name:
            raise ValueError(f"name={name!r} contains {part!r}, which transformers reserves for its own "
                             "implementations; choose another name (default 'nki')")
    current = ALL_MASK_ATTENTION_FUNCTIONS.get(name)
    if current is not None and current is not sdpa_mask:
        raise ValueError(f"name={name!r} is already registered with the mask function {current.__name__}; "
                         "choose another name")
    AttentionInterface.register(name, nki_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    _register_sharding_rules()
    return name


# ---------------------------------------------------------------------------- kernelize

class _PackageLayer:
    """A ``kernels`` repository (``RepositoryProtocol``: ``load()`` returns the layer class)
    serving a layer of this very package: no Hub repository or build directory needed.
    Hashable, as kernels caches loaded layers per repository."""

    def __init__(self, layer_name: str):
        self.layer_name = layer_name

    def load(self) -> type:
        return getattr(_layers, self.layer_name)

    def __eq__(self, other) -> bool:
        return isinstance(other, _PackageLayer) and other.layer_name == self.layer_name

    def __hash__(self) -> int:
        return hash((__name__, self.layer_name))

    def __repr__(self) -> str:
        return f"{_layers.__name__}.{self.layer_name}"


# kernel-layer name -> layer of layers.py. The first five are the names transformers gives
# its layers (with kernels >= 0.18.2); "SiluGatedMLP" and "LayerNorm" are this module's.
LAYER_FOR_NAME = {
    "RMSNorm": "RMSNorm",
    "rotary_pos_emb": "ApplyRotaryPosEmb",
    "SiLU": "SiLU",
    "GeLU": "Gelu",
    "GeluTanh": "GeluTanh",
    "SiluGatedMLP": "SiluGatedMLP",
    "LayerNorm": "LayerNorm",
}

# Model families whose RMSNorm is ``weight * x.to(dtype)`` with ``variance_epsilon`` (the
# RMSNorm layer's contract), whose MLP is ``down(act(gate(x)) * up(x))`` and whose
# ``apply_rotary_pos_emb`` is Llama's rotate-half. An allow-list: Gemma's RMSNorm, for
# one, computes ``x * (1 + weight)`` and must keep its own forward.
FAMILIES = {
    "llama": ("LlamaRMSNorm", "LlamaMLP"),
    "mistral": ("MistralRMSNorm", "MistralMLP"),
    "qwen2": ("Qwen2RMSNorm", "Qwen2MLP"),
    "qwen3": ("Qwen3RMSNorm", "Qwen3MLP"),
}


def _family(cls: type) -> Optional[str]:
    module = cls.__module__
    prefix = "transformers.models."
    if not module.startswith(prefix):
        return None
    family = module[len(prefix):].split(".")[0]
    return family if family in FAMILIES and module.endswith(f".modeling_{family}") else None


def _silu_gated(module: nn.Module) -> bool:
    from transformers.activations import SiLUActivation

    return isinstance(getattr(module, "act_fn", None), (SiLUActivation, nn.SiLU))


def _exactly(cls: type, condition=None):
    """kernels' condition for a class named here: instances of ``cls`` itself (and
    ``condition``). kernels reads the name and the condition off ``type(module)``, so a
    subclass inherits both; transformers subclasses ``nn.LayerNorm`` with other forwards
    (Nemotron's weight + 1, ConvNext's channels-first permute), which the package's
    LayerNorm layer would silently replace."""
    def condition_for(module: nn.Module) -> bool:
        return type(module) is cls and (condition is None or condition(module))
    return condition_for


def make_kernelizable(model: nn.Module) -> list[str]:
    """Give the classes of ``model`` the kernel-layer names :func:`layer_mapping` maps, and
    wrap its family's ``apply_rotary_pos_emb`` as a kernels function layer; return what was
    named (``"LlamaRMSNorm -> RMSNorm"``, ...).

    Uses kernels' public ``replace_kernel_forward_from_hub`` (for third-party layers) and
    ``use_kernel_forward_from_hub`` (functions); classes already named (transformers with
    kernels >= 0.18.2) are left as they are. Process-wide, as transformers' own decorators
    are: the names sit on the classes (``nn.LayerNorm`` included), and the wrapped rotary
    function replaces ``modeling_<family>.apply_rotary_pos_emb``; a named layer that is never
    kernelized, or has no mapping, keeps its own forward. The rotary function layer is one
    object per family: kernelizing one model of the family sets its forward for every model
    of that family in the process (the attention modules call the module-level function).
    """
    from kernels import replace_kernel_forward_from_hub, use_kernel_forward_from_hub
    from transformers.activations import GELUActivation, GELUTanh, SiLUActivation

    generic = {SiLUActivation: "SiLU", GELUActivation: "GeLU", GELUTanh: "GeluTanh", nn.LayerNorm: "LayerNorm"}
    named: list[str] = []
    for cls in dict.fromkeys(type(m) for m in model.modules()):   # each class once, in model order
        family = _family(cls)
        name, condition = generic.get(cls), None
        if family is not None and cls.__name__ == FAMILIES[family][0]:
            name = "RMSNorm"
        elif family is not None and cls.__name__ == FAMILIES[family][1]:
            name, condition = "SiluGatedMLP", _silu_gated
        if name is not None and "kernel_layer_name" not in vars(cls):
            replace_kernel_forward_from_hub(cls, name, _exactly(cls, condition))
            named.append(f"{cls.__name__} -> {name}")
        modeling = sys.modules[cls.__module__]
        rope = getattr(modeling, "apply_rotary_pos_emb", None)
        if family is not None and rope is not None and not hasattr(rope, "kernel_layer_name"):
            modeling.apply_rotary_pos_emb = use_kernel_forward_from_hub("rotary_pos_emb")(rope)
            named.append(f"{modeling.__name__}.apply_rotary_pos_emb -> rotary_pos_emb")
    return named


def layer_mapping(device: str = "cpu") -> dict:
    """The mapping for ``kernels.use_kernel_mapping``: every name of :data:`LAYER_FOR_NAME` to
    this package's layer on ``device`` ("cpu" or "neuron")."""
    if device not in ("cpu", "neuron"):
        raise ValueError(f"device={device!r}: the package's layers run on 'cpu' or 'neuron'")
    return {name: {device: _PackageLayer(layer)} for name, layer in LAYER_FOR_NAME.items()}


def kernelize(model: nn.Module, mode=None, device: Optional[str] = None) -> nn.Module:
    """Replace the forwards of ``model``'s layers with this package's layers (``kernels.kernelize``)
    and return ``model``.

    Llama, Mistral, Qwen2, Qwen3: RMSNorm -> ``rms_norm``, the SiLU-gated MLP -> ``silu_and_mul``
    (gate and up projections concatenated), ``apply_rotary_pos_emb`` -> the rotary op. ViT,
    DINOv2, CLIP, SigLIP and any model: ``nn.LayerNorm`` -> ``layer_norm``, GELU (erf / tanh)
    and SiLU activations -> ``gelu`` / ``silu``. Pair it with :func:`register` for attention.

    ``mode``: a ``kernels.Mode`` (default: ``TRAINING`` if ``model.training`` else ``INFERENCE``;
    every layer has a backward). ``device``: "cpu" or "neuron" (default: the parameters').

    Kernelize BEFORE sharding the model (tensor parallel): ``kernels`` sets ``module.forward``,
    which would drop a forward wrapper a sharding plan put there; such a module raises here.
    """
    import kernels

    if mode is None:
        mode = kernels.Mode.TRAINING if model.training else kernels.Mode.INFERENCE
    if device is None:
        device = next(iter(model.parameters()), torch.empty(0)).device.type
    make_kernelizable(model)
    _check_no_wrapped_forward(model)
    targets = [model]
    for cls in dict.fromkeys(type(m) for m in model.modules()):
        rope = getattr(sys.modules[cls.__module__], "apply_rotary_pos_emb", None)
        if isinstance(rope, nn.Module) and _family(cls) is not None and rope not in targets:
            targets.append(rope)   # module-level function layer: kernelize it on its own
    with kernels.use_kernel_mapping(layer_mapping(device)):
        for target in targets:
            kernels.kernelize(target, mode=mode, device=device)
    _register_sharding_rules()
    return model


def _check_no_wrapped_forward(model: nn.Module) -> None:
    own = {getattr(getattr(_layers, layer), "forward") for layer in LAYER_FOR_NAME.values()}
    for path, module in model.named_modules():
        wrapped = vars(module).get("forward")
        if (wrapped is not None and hasattr(type(module), "kernel_layer_name")
                and getattr(wrapped, "__func__", None) not in own):
            raise ValueError(
                f"module {path or '<model>'} ({type(module).__name__}) has an instance forward set by someone "
                "else (a tensor-parallel plan or an accelerate hook?); kernelize would drop it. Kernelize the "
                "model before sharding or dispatching it")


def _register_sharding_rules() -> None:
    """DTensor sharding rules for the ops (``sharding.py``), once torch.distributed is in use."""
    from . import sharding

    sharding.register_rules_if_in_use()

"""nki-kernels: NKI kernels for AWS Trainium as torch ops, with a bundled NKI simulator.

On ``neuron`` tensors every op runs its NKI kernel through AWS's toolchain (written as
TorchNeuron documents it; not yet run on hardware). On CPU tensors it runs the PyTorch
reference, or the NKI kernel in the bundled simulator when the environment variable
``NKI_KERNELS_CPU_BACKEND=simulator`` is set.

The ops are listed, with their kernels, twins and workloads, in ``registry.ops()``.
``nki_kernels.transformers`` plugs them into Hugging Face transformers (``register()`` for
``attn_implementation="nki"``, ``kernelize(model)`` for the layers).
"""

from . import layers, ops, registry, sharding, simulator, transformers
from ._dispatch import CPU_BACKEND_ENV, KernelCall, cpu_backend
from .ops.activations import gelu, gelu_and_mul, silu, silu_and_mul
from .ops.attention import scaled_dot_product_attention
from .ops.norms import fused_add_rms_norm, layer_norm, rms_norm
from .ops.rotary import apply_rotary_pos_emb
from .ops.softmax import softmax
from .transformers import nki_attention_forward

# transformers (5.24) loading this package from the Hub as attn_implementation="<repo>" or
# "<repo>:nki_attention_forward" (kernels>=0.18.2) registers ``flash_attn_forward`` with the
# SDPA mask function when the module also has ``supports_flash_attn``
# (integrations/hub_kernels.py, load_and_register_attn_kernel); without them it registers the
# function with FlashAttention-2's 2-D mask and then fails looking for flash_attn_varlen_func
# (modeling_flash_attention_utils.py, _lazy_imports). Upstream: huggingface/transformers
# issue #44679 ("Allow kernel modules to declare their preferred mask function").
flash_attn_forward = nki_attention_forward
supports_flash_attn = True

sharding.register_rules_if_in_use()   # DTensor sharding rules, if torch.distributed.tensor is in use

__all__ = [
    "CPU_BACKEND_ENV",
    "KernelCall",
    "apply_rotary_pos_emb",
    "cpu_backend",
    "fused_add_rms_norm",
    "gelu",
    "gelu_and_mul",
    "layer_norm",
    "layers",
    "nki_attention_forward",
    "ops",
    "registry",
    "rms_norm",
    "scaled_dot_product_attention",
    "sharding",
    "silu",
    "silu_and_mul",
    "simulator",
    "softmax",
    "transformers",
]

"""nki-kernels: NKI kernels for AWS Trainium as torch ops, with a bundled NKI simulator.

On ``neuron`` tensors every op runs its NKI kernel through AWS's toolchain (written as
TorchNeuron documents it; not yet run on hardware). On CPU tensors it runs the PyTorch
reference, or the NKI kernel in the bundled simulator when the environment variable
``NKI_KERNELS_CPU_BACKEND=simulator`` is set.

The ops are listed, with their kernels, twins and workloads, in ``registry.ops()``.
"""

from . import layers, ops, registry, simulator
from ._dispatch import CPU_BACKEND_ENV, KernelCall, cpu_backend
from .ops.activations import gelu, gelu_and_mul, silu, silu_and_mul
from .ops.attention import nki_attention_forward, scaled_dot_product_attention
from .ops.norms import fused_add_rms_norm, layer_norm, rms_norm
from .ops.rotary import apply_rotary_pos_emb
from .ops.softmax import softmax

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
    "silu",
    "silu_and_mul",
    "simulator",
    "softmax",
]

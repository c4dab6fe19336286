"""nki-kernels: NKI kernels for AWS Trainium as torch ops, with a bundled NKI simulator.

On ``neuron`` tensors every op runs its NKI kernel through AWS's toolchain (written as
TorchNeuron documents it; not yet run on hardware). On CPU tensors it runs the PyTorch
reference, or the NKI kernel in the bundled simulator when the environment variable
``NKI_KERNELS_CPU_BACKEND=simulator`` is set.
"""

from . import simulator
from ._dispatch import CPU_BACKEND_ENV, KernelCall, cpu_backend
from .activations import gelu

__all__ = [
    "CPU_BACKEND_ENV",
    "KernelCall",
    "cpu_backend",
    "gelu",
    "simulator",
]

# blockops: norms, gated activations, softmax, rotary embedding, kernelize layers
from . import layers
from .activations import gelu_and_mul, silu, silu_and_mul
from .norms import fused_add_rms_norm, layer_norm, rms_norm
from .rotary import apply_rotary_pos_emb
from .softmax import softmax

__all__ += [
    "apply_rotary_pos_emb",
    "fused_add_rms_norm",
    "gelu_and_mul",
    "layer_norm",
    "layers",
    "rms_norm",
    "silu",
    "silu_and_mul",
    "softmax",
]

# attention: SDPA as a custom op (single-pass and flash NKI kernels), transformers backend
from .attention import nki_attention_forward, scaled_dot_product_attention

__all__ += ["nki_attention_forward", "scaled_dot_product_attention"]

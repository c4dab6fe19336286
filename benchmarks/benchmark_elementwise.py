"""`kernels benchmark` workloads for the elementwise activations, against eager torch:
gelu (erf and tanh) against ``F.gelu``, silu against ``F.silu``.

Shapes on Trainium: the ViT-B/16 and ViT-L/16 MLP activations at 224 px, batch 8 (1576
tokens x 3072 / 4096), and a Llama-7B MLP gate (1024 tokens x 11008) for silu. bf16 inputs are scaled by
0.5 so |y| < 2 (1 bf16 ulp <= 2**-7 is inside the runner's fixed atol=1e-2).
These are the Trainium workloads, where the op runs the NKI kernel. A CPU host runs
CPU_WORKLOADS (below) and times the op's reference path (PyTorch ops behind the custom op's
dispatch; the bundled simulator with NKI_KERNELS_CPU_BACKEND=simulator), not a Trainium
kernel: a CPU measurement of that path against eager, on that CPU.
"""

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark


def _synchronized(result):
    """Wait for the device before the runner stops its clock: `kernels benchmark`
    synchronizes CUDA/XPU/MPS only, and neuron ops run asynchronously (the neuron
    path is written per TorchNeuron's docs, not yet run on hardware). No-op on CPU."""
    if torch.accelerator.is_available():
        torch.accelerator.synchronize()
    return result


def _on_trainium() -> bool:
    """Whether `kernels benchmark` runs on Trainium: it picks "neuron" when torch has a
    ``neuron`` module (kernels 0.17.2, ``backends._backend``); anywhere else it runs on CPU,
    where the Trainium-sized shapes would take minutes per workload (x 100+ calls)."""
    return hasattr(torch, "neuron")


# name: (op, rows, cols, dtype, approximate); op "gelu" or "silu"
TRAINIUM_WORKLOADS = {
    "vit_b16_mlp_fp32": ("gelu", 1576, 3072, torch.float32, "none"),
    "vit_b16_mlp_bf16": ("gelu", 1576, 3072, torch.bfloat16, "none"),
    "vit_l16_mlp_tanh_bf16": ("gelu", 1576, 4096, torch.bfloat16, "tanh"),
    "llama7b_mlp_gate_t1024_bf16": ("silu", 1024, 11008, torch.bfloat16, None),
}

# CPU (the reference path against eager torch): ViT-B/16 and ViT-L/16 at batch 4, the Llama
# gate at 128 tokens
CPU_WORKLOADS = {
    "vit_b16_mlp_b4_fp32": ("gelu", 788, 3072, torch.float32, "none"),
    "vit_b16_mlp_b4_bf16": ("gelu", 788, 3072, torch.bfloat16, "none"),
    "vit_l16_mlp_tanh_b4_bf16": ("gelu", 788, 4096, torch.bfloat16, "tanh"),
    "llama7b_mlp_gate_t128_bf16": ("silu", 128, 11008, torch.bfloat16, None),
}

WORKLOADS = TRAINIUM_WORKLOADS if _on_trainium() else CPU_WORKLOADS


class GeluBenchmark(Benchmark):
    seed = 0

    def _setup(self, rows, cols, dtype, approximate):
        scale = 1.0 if dtype == torch.float32 else 0.5
        self.x = (torch.randn(rows, cols, device=self.device) * scale).to(dtype)
        self.approximate = approximate
        self.out = torch.empty_like(self.x)

    def _run(self):
        self.out = self.kernel.gelu(self.x, self.approximate)

    def _eager(self):
        return F.gelu(self.x, approximate=self.approximate)


class SiluBenchmark(Benchmark):
    seed = 0

    def _setup(self, rows, cols, dtype, approximate=None):
        scale = 1.0 if dtype == torch.float32 else 0.5
        self.x = (torch.randn(rows, cols, device=self.device) * scale).to(dtype)
        self.out = torch.empty_like(self.x)

    def _run(self):
        self.out = self.kernel.silu(self.x)

    def _eager(self):
        return F.silu(self.x)


def _add(cls, name, shape):
    setattr(cls, f"setup_{name}", lambda self: self._setup(*shape))
    setattr(cls, f"benchmark_{name}", lambda self: _synchronized(self._run()))
    setattr(cls, f"verify_{name}", lambda self: _synchronized(self._eager()))


for _name, (_op, *_shape) in WORKLOADS.items():
    _add(GeluBenchmark if _op == "gelu" else SiluBenchmark, _name, _shape)

del _name, _op, _shape  # keep loop names out of the module (the runner scans it)

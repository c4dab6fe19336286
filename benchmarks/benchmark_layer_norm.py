"""`kernels benchmark` workloads for layer_norm, against eager ``F.layer_norm``.

Shapes: ViT-B/16 and ViT-L/16 at 224 px, batch 8 (197 * 8 = 1576 tokens), and wide rows
(4096, 8192). bf16 workloads use a 0.1-scaled weight so outputs stay within |y| < 1: eager bf16 may
round an intermediate the kernel keeps in fp32, and the differences (<= 2 ulp, 2**-7)
must stay inside the runner's fixed atol=1e-2.
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


# Trainium: the models' shapes (docs/workloads.md).
TRAINIUM_WORKLOADS = {
    # name: (rows, hidden, dtype)
    "vit_b16_b8_fp32": (1576, 768, torch.float32),
    "vit_b16_b8_bf16": (1576, 768, torch.bfloat16),
    "vit_l16_b8_bf16": (1576, 1024, torch.bfloat16),
    "h4096_t2048_bf16": (2048, 4096, torch.bfloat16),
    "h8192_t1024_fp32": (1024, 8192, torch.float32),
}

# CPU (the reference path against eager torch): ViT at batch 32, since a batch-8 LayerNorm
# takes under 1 ms on CPU and the op's fixed dispatch cost (~0.1 ms) would dominate it.
CPU_WORKLOADS = {
    "vit_b16_b32_fp32": (6304, 768, torch.float32),
    "vit_b16_b32_bf16": (6304, 768, torch.bfloat16),
    "vit_l16_b32_bf16": (6304, 1024, torch.bfloat16),
    "h4096_t2048_bf16": (2048, 4096, torch.bfloat16),
    "h8192_t1024_fp32": (1024, 8192, torch.float32),
}

WORKLOADS = TRAINIUM_WORKLOADS if _on_trainium() else CPU_WORKLOADS


class LayerNormBenchmark(Benchmark):
    seed = 0
    eps = 1e-6

    def _setup(self, rows, hidden, dtype):
        self.hidden = hidden
        self.x = torch.randn(rows, hidden, device=self.device).to(dtype)
        scale = 1.0 if dtype == torch.float32 else 0.1
        self.weight = (torch.rand(hidden, device=self.device) * scale + 0.1 * scale).to(dtype)
        self.bias = (torch.randn(hidden, device=self.device) * 0.1).to(dtype)
        self.out = torch.empty_like(self.x)

    def _run(self):
        self.out = self.kernel.layer_norm(self.x, (self.hidden,), self.weight, self.bias, self.eps)

    def _eager(self):
        return F.layer_norm(self.x, (self.hidden,), self.weight, self.bias, self.eps)


def _add(name, shape):
    setattr(LayerNormBenchmark, f"setup_{name}", lambda self: self._setup(*shape))
    setattr(LayerNormBenchmark, f"benchmark_{name}", lambda self: _synchronized(self._run()))
    setattr(LayerNormBenchmark, f"verify_{name}", lambda self: _synchronized(self._eager()))


for _name, _shape in WORKLOADS.items():
    _add(_name, _shape)

del _name, _shape  # keep loop names out of the module (the runner scans it)

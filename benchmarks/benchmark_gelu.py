"""`kernels benchmark` workloads for gelu (erf and tanh), against eager ``F.gelu``.

Shapes: the ViT-B/16 and ViT-L/16 MLP activations at 224 px, batch 8 (1576 tokens x 3072 /
4096). bf16 inputs are scaled by 0.5 so |y| < 2 (1 bf16 ulp <= 2**-7 is inside the
runner's fixed atol=1e-2).
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

WORKLOADS = {
    # name: (rows, cols, dtype, approximate)
    "vit_b16_mlp_fp32": (1576, 3072, torch.float32, "none"),
    "vit_b16_mlp_bf16": (1576, 3072, torch.bfloat16, "none"),
    "vit_l16_mlp_tanh_bf16": (1576, 4096, torch.bfloat16, "tanh"),
}


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


def _add(name, shape):
    setattr(GeluBenchmark, f"setup_{name}", lambda self: self._setup(*shape))
    setattr(GeluBenchmark, f"benchmark_{name}", lambda self: _synchronized(self._run()))
    setattr(GeluBenchmark, f"verify_{name}", lambda self: _synchronized(self._eager()))


for _name, _shape in WORKLOADS.items():
    _add(_name, _shape)

del _name, _shape  # keep loop names out of the module (the runner scans it)

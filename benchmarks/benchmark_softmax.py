"""`kernels benchmark` workloads for softmax, against eager ``torch.softmax``.

Shapes: ViT-B/16 attention scores at 224 px, batch 8 (8 x 12 heads x 197 rows of 197),
square 4096-long rows, rows of 32768 (longer than 8192: the kernel's online form) and Llama 3
sampling at decode batch 8 (8 rows of the 128256-word vocabulary: the split form).
Outputs are in [0, 1], so bf16 rounding stays inside the runner's fixed atol=1e-2.
These are the Trainium workloads, where the op runs the NKI kernel. A CPU host runs
CPU_WORKLOADS (below) and times the op's reference path (PyTorch ops behind the custom op's
dispatch; the bundled simulator with NKI_KERNELS_CPU_BACKEND=simulator), not a Trainium
kernel: a CPU measurement of that path against eager, on that CPU.
"""

import torch

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
    # name: (rows, cols, dtype)
    "vit_b16_scores_fp32": (8 * 12 * 197, 197, torch.float32),
    "vit_b16_scores_bf16": (8 * 12 * 197, 197, torch.bfloat16),
    "rows4096_bf16": (4096, 4096, torch.bfloat16),
    "long_rows32768_fp32": (256, 32768, torch.float32),
    "llama3_sampling_decode8_bf16": (8, 128256, torch.bfloat16),   # a few long rows: the split form
}

# CPU (the reference path against eager torch): 2x fewer of the long rows; 4096-wide rows 4x fewer;
# no vocabulary rows (a Trainium shape only: its split form is what they exercise).
CPU_WORKLOADS = {
    "vit_b16_scores_fp32": (8 * 12 * 197, 197, torch.float32),
    "vit_b16_scores_bf16": (8 * 12 * 197, 197, torch.bfloat16),
    "rows1024_bf16": (1024, 4096, torch.bfloat16),
    "long_rows32768_r128_fp32": (128, 32768, torch.float32),
}

WORKLOADS = TRAINIUM_WORKLOADS if _on_trainium() else CPU_WORKLOADS


class SoftmaxBenchmark(Benchmark):
    seed = 0

    def _setup(self, rows, cols, dtype):
        self.x = (torch.randn(rows, cols, device=self.device) * 4).to(dtype)
        self.out = torch.empty_like(self.x)

    def _run(self):
        self.out = self.kernel.softmax(self.x, -1)

    def _eager(self):
        return torch.softmax(self.x, -1)


def _add(name, shape):
    setattr(SoftmaxBenchmark, f"setup_{name}", lambda self: self._setup(*shape))
    setattr(SoftmaxBenchmark, f"benchmark_{name}", lambda self: _synchronized(self._run()))
    setattr(SoftmaxBenchmark, f"verify_{name}", lambda self: _synchronized(self._eager()))


for _name, _shape in WORKLOADS.items():
    _add(_name, _shape)

del _name, _shape  # keep loop names out of the module (the runner scans it)

"""`kernels benchmark` workloads for silu_and_mul / gelu_and_mul (SwiGLU / GeGLU gates),
against eager ``F.silu(x[..., :d]) * x[..., d:]``.

Shapes: a Llama-3-8B MLP gate (d = 14336) for a 1024-token chunk and a 768-wide model's
(d = 3072) for 1576 tokens. bf16 inputs are scaled by 0.15 so |y| < 1:
eager bf16 rounds act(gate) before the product (the kernel rounds once), and the
differences must stay inside the runner's fixed atol=1e-2.
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
    # name: (rows, d, dtype)
    "t1576_d3072_fp32": (1576, 3072, torch.float32),
    "t1576_d3072_bf16": (1576, 3072, torch.bfloat16),
    "llama8b_t1024_bf16": (1024, 14336, torch.bfloat16),
}

# CPU (the reference path against eager torch): ViT-B/16 at batch 4 and the Llama MLP at 128 tokens. In bf16 the
# reference computes in fp32 and rounds once (the kernels' contract; eager rounds twice),
# which costs 2-4x eager's time on CPU: see the README's CPU section.
CPU_WORKLOADS = {
    "t788_d3072_fp32": (788, 3072, torch.float32),
    "t788_d3072_bf16": (788, 3072, torch.bfloat16),
    "llama8b_t128_bf16": (128, 14336, torch.bfloat16),
}

WORKLOADS = TRAINIUM_WORKLOADS if _on_trainium() else CPU_WORKLOADS


class _GateSetup:
    seed = 0

    def _setup(self, rows, d, dtype):
        scale = 1.0 if dtype == torch.float32 else 0.15
        self.x = (torch.randn(rows, 2 * d, device=self.device) * scale).to(dtype)
        self.d = d
        self.out = torch.empty(rows, d, device=self.device, dtype=dtype)


class SiluAndMulBenchmark(_GateSetup, Benchmark):
    def _run(self):
        self.out = self.kernel.silu_and_mul(self.x)

    def _eager(self):
        return F.silu(self.x[..., :self.d]) * self.x[..., self.d:]


class GeluAndMulBenchmark(_GateSetup, Benchmark):
    def _run(self):
        self.out = self.kernel.gelu_and_mul(self.x)

    def _eager(self):
        return F.gelu(self.x[..., :self.d]) * self.x[..., self.d:]


def _add(cls, name, shape):
    setattr(cls, f"setup_{name}", lambda self: self._setup(*shape))
    setattr(cls, f"benchmark_{name}", lambda self: _synchronized(self._run()))
    setattr(cls, f"verify_{name}", lambda self: _synchronized(self._eager()))


for _cls in (SiluAndMulBenchmark, GeluAndMulBenchmark):
    for _name, _shape in WORKLOADS.items():
        _add(_cls, _name, _shape)

del _cls, _name, _shape  # keep loop names out of the module (the runner scans it)

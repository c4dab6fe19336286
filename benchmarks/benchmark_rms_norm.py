"""`kernels benchmark` workloads for rms_norm and fused_add_rms_norm, against eager
``F.rms_norm`` (and ``x + residual`` followed by it).

Shapes: Llama-3-8B (hidden 4096) and -70B (8192) prefill chunks, and a 768-wide batch of
1576 tokens. bf16 workloads use a 0.1-scaled weight so |y| < 1: eager bf16 rounds
x * rstd before the weight product (the kernel rounds once), and those differences must
stay inside the runner's fixed atol=1e-2.
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
    "t1576_h768_fp32": (1576, 768, torch.float32),
    "llama8b_t2048_bf16": (2048, 4096, torch.bfloat16),
    "llama70b_t1024_bf16": (1024, 8192, torch.bfloat16),
    "llama70b_t1024_fp32": (1024, 8192, torch.float32),
}

# CPU (the reference path against eager torch): 4x fewer Llama tokens (torch's CPU rms_norm is
# a composition of ops, 10-30 ms at the Trainium sizes) and 4x more 768-wide rows, so every
# call takes a few ms and the op's ~0.1 ms of custom-op dispatch stays a few percent.
CPU_WORKLOADS = {
    "t6304_h768_fp32": (6304, 768, torch.float32),
    "llama8b_t512_bf16": (512, 4096, torch.bfloat16),
    "llama70b_t256_bf16": (256, 8192, torch.bfloat16),
    "llama70b_t256_fp32": (256, 8192, torch.float32),
}

WORKLOADS = TRAINIUM_WORKLOADS if _on_trainium() else CPU_WORKLOADS


class _NormSetup:
    seed = 0
    eps = 1e-6

    def _setup(self, rows, hidden, dtype):
        self.hidden = hidden
        self.x = torch.randn(rows, hidden, device=self.device).to(dtype)
        self.residual = torch.randn(rows, hidden, device=self.device).to(dtype)
        scale = 1.0 if dtype == torch.float32 else 0.1
        self.weight = (torch.rand(hidden, device=self.device) * scale + 0.1 * scale).to(dtype)
        self.out = torch.empty_like(self.x)


class RMSNormBenchmark(_NormSetup, Benchmark):
    def _run(self):
        self.out = self.kernel.rms_norm(self.x, (self.hidden,), self.weight, self.eps)

    def _eager(self):
        return F.rms_norm(self.x, (self.hidden,), self.weight, self.eps)


class FusedAddRMSNormBenchmark(_NormSetup, Benchmark):
    # out = normed output; the residual sum is returned too (checked by the tests)
    def _run(self):
        self.out, _ = self.kernel.fused_add_rms_norm(self.x, self.residual, self.weight, self.eps)

    def _eager(self):
        return F.rms_norm(self.x + self.residual, (self.hidden,), self.weight, self.eps)


def _add(cls, name, shape):
    setattr(cls, f"setup_{name}", lambda self: self._setup(*shape))
    setattr(cls, f"benchmark_{name}", lambda self: _synchronized(self._run()))
    setattr(cls, f"verify_{name}", lambda self: _synchronized(self._eager()))


for _cls in (RMSNormBenchmark, FusedAddRMSNormBenchmark):
    for _name, _shape in WORKLOADS.items():
        _add(_cls, _name, _shape)

del _cls, _name, _shape  # keep loop names out of the module (the runner scans it)

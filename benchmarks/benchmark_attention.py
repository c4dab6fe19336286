"""`kernels benchmark` workloads for attention, against eager
``torch.nn.functional.scaled_dot_product_attention`` on the same device.

On a Trainium host the op runs the NKI kernels; on a CPU host its reference path, which is
torch's own SDPA (or the kernel in the bundled simulator with NKI_KERNELS_CPU_BACKEND=simulator,
which measures the simulator, not Trainium). Shapes (docs/workloads.md): vision
transformers at batch 8 with q/k/v as transformers lays them out (transposed views of
[B, S, H, D]), SigLIP so400m at 384 px (D=72), and a long causal grouped-query sequence
(the online-softmax kernel); on a CPU host, smaller SigLIP and causal workloads (CPU_WORKLOADS).
q/k are unit normals and v is 0.2 x unit normal: an output row
is a convex combination of value rows (causal row 0 is v_0 itself), so |out| stays below
~1 and one bf16 rounding (<= 2**-9 relative) stays inside the runner's fixed atol=1e-2.
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
    # name: (B, H, Hkv, S, D, causal, dtype)
    "vit_b16_b8_bf16": (8, 12, 12, 197, 64, False, torch.bfloat16),
    "vit_b16_b8_fp32": (8, 12, 12, 197, 64, False, torch.float32),
    "vit_l16_b8_bf16": (8, 16, 16, 197, 64, False, torch.bfloat16),
    "siglip_so400m_384_b2_bf16": (2, 16, 16, 729, 72, False, torch.bfloat16),
    "gqa_causal_s4096_bf16": (1, 8, 2, 4096, 128, True, torch.bfloat16),
}

# CPU (the reference path against eager torch): the same models, SigLIP at batch 1 and the
# causal grouped-query sequence at 1024 tokens, so the 100+ timed calls of each take seconds.
CPU_WORKLOADS = {
    "vit_b16_b8_bf16": (8, 12, 12, 197, 64, False, torch.bfloat16),
    "vit_b16_b8_fp32": (8, 12, 12, 197, 64, False, torch.float32),
    "vit_l16_b8_bf16": (8, 16, 16, 197, 64, False, torch.bfloat16),
    "siglip_so400m_384_b1_bf16": (1, 16, 16, 729, 72, False, torch.bfloat16),
    "gqa_causal_s1024_bf16": (1, 8, 2, 1024, 128, True, torch.bfloat16),
}

WORKLOADS = TRAINIUM_WORKLOADS if _on_trainium() else CPU_WORKLOADS


class AttentionBenchmark(Benchmark):
    seed = 0

    def _setup(self, b, h, hkv, s, d, causal, dtype):
        def bshd(heads, std=1.0):
            return (torch.randn(b, s, heads, d, device=self.device) * std).to(dtype).transpose(1, 2)

        self.q, self.k, self.v = bshd(h), bshd(hkv), bshd(hkv, std=0.2)
        self.causal, self.gqa = causal, h != hkv
        self.out = torch.empty_like(self.q)

    def _run(self):
        self.out = self.kernel.scaled_dot_product_attention(
            self.q, self.k, self.v, is_causal=self.causal, enable_gqa=self.gqa)

    def _eager(self):
        return F.scaled_dot_product_attention(self.q, self.k, self.v, is_causal=self.causal,
                                              enable_gqa=self.gqa)


def _add(name, shape):
    setattr(AttentionBenchmark, f"setup_{name}", lambda self: self._setup(*shape))
    setattr(AttentionBenchmark, f"benchmark_{name}", lambda self: _synchronized(self._run()))
    setattr(AttentionBenchmark, f"verify_{name}", lambda self: _synchronized(self._eager()))


for _name, _shape in WORKLOADS.items():
    _add(_name, _shape)

del _name, _shape  # keep loop names out of the module (the runner scans it)

"""`kernels benchmark` workloads for apply_rotary_pos_emb, against eager transformers-style
``q * cos + rotate_half(q) * sin`` (the same for k).

Shapes: Llama-3-8B prefill (32 query / 8 key heads, D = 128, 2048 positions) and a
768-wide model (12 heads, D = 64) at 197 positions, batch 8. The runner checks the q
output (``self.out``); bf16 q/k are scaled by 0.1 so |q_embed| < 1:
eager bf16 rounds each product and the sum (the kernel rounds once), and the differences
must stay inside the runner's fixed atol=1e-2.
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
    # name: (batch, q heads, k heads, positions, head dim, dtype)
    "llama8b_s2048_bf16": (1, 32, 8, 2048, 128, torch.bfloat16),
    "llama8b_s2048_fp32": (1, 32, 8, 2048, 128, torch.float32),
    "b8_s197_h12_d64_bf16": (8, 12, 12, 197, 64, torch.bfloat16),
}

# CPU (the reference path against eager torch): the Llama prefill at 256 positions. In bf16 the reference rounds
# once from fp32 (the kernels' contract; eager rounds three times): 2-3x eager's CPU time.
CPU_WORKLOADS = {
    "llama8b_s256_bf16": (1, 32, 8, 256, 128, torch.bfloat16),
    "llama8b_s256_fp32": (1, 32, 8, 256, 128, torch.float32),
    "b8_s197_h12_d64_bf16": (8, 12, 12, 197, 64, torch.bfloat16),
}

WORKLOADS = TRAINIUM_WORKLOADS if _on_trainium() else CPU_WORKLOADS


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryBenchmark(Benchmark):
    seed = 0

    def _setup(self, batch, q_heads, k_heads, seq, dim, dtype):
        scale = 1.0 if dtype == torch.float32 else 0.1
        self.q = (torch.randn(batch, q_heads, seq, dim, device=self.device) * scale).to(dtype)
        self.k = (torch.randn(batch, k_heads, seq, dim, device=self.device) * scale).to(dtype)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=self.device).float() / dim))
        freqs = torch.arange(seq, device=self.device).float()[:, None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[None].expand(batch, seq, dim)
        self.cos, self.sin = emb.cos().to(dtype).contiguous(), emb.sin().to(dtype).contiguous()
        self.out = torch.empty_like(self.q)

    def _run(self):
        self.out, self.k_out = self.kernel.apply_rotary_pos_emb(self.q, self.k, self.cos, self.sin)

    def _eager(self):
        cos, sin = self.cos.unsqueeze(1), self.sin.unsqueeze(1)
        _ = self.k * cos + _rotate_half(self.k) * sin
        return self.q * cos + _rotate_half(self.q) * sin


def _add(name, shape):
    setattr(RotaryBenchmark, f"setup_{name}", lambda self: self._setup(*shape))
    setattr(RotaryBenchmark, f"benchmark_{name}", lambda self: _synchronized(self._run()))
    setattr(RotaryBenchmark, f"verify_{name}", lambda self: _synchronized(self._eager()))


for _name, _shape in WORKLOADS.items():
    _add(_name, _shape)

del _name, _shape  # keep loop names out of the module (the runner scans it)

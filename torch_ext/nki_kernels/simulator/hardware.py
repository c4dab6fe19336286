"""Every hardware number the simulator and the cost model use, in one table.

Sources (public AWS Neuron documentation, gathered in ../shared/docs/nki-spec.md):
* architecture guides `about-neuron/arch/neuron-hardware/trainium{,2,3}.rst` and
  `nki/guides/architecture/*.rst` of aws-neuron/aws-neuron-sdk: engine clocks, peak FLOPS,
  SBUF/PSUM sizes, HBM bandwidth;
* `nki/deep-dives/nki-dma-bandwidth-guide.rst`: practical DMA bandwidth per core, DMA
  fixed cost and queue count;
* NKI performance guide (per-instruction cycle rules, applied in cost/model.py).

All figures are per NeuronCore. Numbers not documented per generation (e.g. the vector
engine's bf16 fast mode width on trn1/trn3) reuse the trn2 value and say so.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class Target:
    """One NeuronCore generation."""

    name: str                     # "trn1" | "trn2" | "trn3"
    neuron_core: str              # "v2" | "v3" | "v4"
    # on-chip memory
    partitions: int               # SBUF/PSUM partitions (lanes)
    sbuf_bytes_per_partition: int
    psum_banks: int               # PSUM banks per partition
    psum_bank_bytes: int          # bytes per bank per partition (512 fp32)
    # engine clocks (Hz)
    tensor_hz: float
    vector_hz: float
    scalar_hz: float
    gpsimd_hz: float
    # throughput
    tensor_peak_bf16_flops: float  # per core, dense bf16/fp16
    tensor_peak_fp32_flops: float
    vector_elems_per_cycle_fast: int   # bf16 fast mode (elements per cycle across partitions)
    vector_elems_per_cycle: int        # otherwise
    scalar_elems_per_cycle: int
    # memory system
    hbm_bytes_per_s_chip: float
    dma_bytes_per_s: float        # practical DMA bandwidth per core
    dma_queues: int               # DMA engines a transfer is spread over
    dma_fixed_s: float            # fixed cost per DMA transfer (descriptor-generated on v3+)
    cores_per_chip: int

    # ---- per-instruction cost rules of cost/model.py (added by the cost model) -----------
    # Cycles are cycles of the engine running the instruction. Sources:
    # [S] ../shared/docs/nki-spec.md "Hardware numbers for the cost model", which condenses
    #     the "Estimated instruction cost" sections of the NKI ISA reference (nki.isa.*);
    # [P] nki/deep-dives/nki_perf_guide.rst (Opt #5a: static instruction overhead ~100
    #     cycles; dependent 1-element back-to-back instructions at ~266 ScalarE cycles);
    # [A2] nki/guides/architecture/trainium2_arch.rst; [A3] .../trainium3_arch.rst;
    # [D] nki/about/nki-dma-overview.rst (8 partitions per DMA engine, 16 engines);
    # [H] AWS's neuron-agentic-development profiling rules (rule `rsqrt-engine-tradeoff-
    #     and-psum`: GpSimd rsqrt ~4x slower than ScalarE), via a public NKI heuristics digest.
    min_instruction_cycles: int = 64        # [S] MIN_II of VectorE/ScalarE (applied to GpSimd too)
    static_overhead_cycles: int = 60        # [S] static SBUF access overhead, Vector/Scalar/GpSimd
    dependency_latency_cycles: int = 100    # [S][P] extra wait of a consumer of a Vector/Scalar/GpSimd result
    matmul_min_cycles: int = 64             # [S] matmul max(min(64, M), N) cycles
    matmul_fp32_factor: int = 4             # [S] fp32 operands: 4 passes (79 vs 20 TFLOPS)
    transpose_fp32_factor: int = 2          # [A2] TensorE transpose mode: fp32 2x faster than fp32 matmul
    activation_readout_cycles: int = 64     # [S] ScalarE: +64 cycles to read the accumulator out
    gpsimd_pattern_cycles: int = 150        # [S] GpSimd iota/affine_select: 150 + N
    vector_reciprocal_factor: int = 8       # [S] VectorE reciprocal ~8N
    reduce_bf16_speedup: int = 2            # [S] tensor_reduce N/2 for bf16 add/max
    vector_perf_mode_full: int = 4          # [A2] 4x: tensor_copy/tensor_scalar, 16-bit, all SBUF
    vector_perf_mode_half: int = 2          # [A2] 2x: same with one side in PSUM; tensor_tensor 16-bit SBUF
    scalar_elems_per_cycle_fp32: int = 128  # [A3] ScalarE 128 elem/cycle for 32-bit types on every generation
    # ALU "transcendental" ops (power, rsqrt, reciprocal) in tensor_scalar/tensor_tensor/...
    # are iterative on VectorE/GpSimd, unlike ScalarE's activation tables:
    alu_transcendental_factor_vector: int = 8  # [S] VectorE reciprocal ~8N, applied to each such op
    alu_transcendental_factor_gpsimd: int = 4  # [H] GpSimd ~4 cycles per element (4x ScalarE's rate)
    dma_transpose_hbm_efficiency: float = 0.9   # [A2] HBM->SBUF DMA transpose: up to 90% of DMA throughput
    dma_transpose_sbuf_efficiency: float = 0.5  # [A2] SBUF->SBUF DMA transpose: up to 50%

    @property
    def psum_bytes_per_partition(self) -> int:
        return self.psum_banks * self.psum_bank_bytes


TARGETS: dict[str, Target] = {
    "trn1": Target(
        name="trn1", neuron_core="v2",
        partitions=128, sbuf_bytes_per_partition=192 * KIB,
        psum_banks=8, psum_bank_bytes=2 * KIB,
        tensor_hz=2.8e9, vector_hz=1.12e9, scalar_hz=1.4e9, gpsimd_hz=1.4e9,
        tensor_peak_bf16_flops=92e12, tensor_peak_fp32_flops=23e12,
        # v2 fast-mode width not documented separately: trn2's figures reused.
        vector_elems_per_cycle_fast=512, vector_elems_per_cycle=256, scalar_elems_per_cycle=128,
        hbm_bytes_per_s_chip=820e9, dma_bytes_per_s=272e9, dma_queues=16,
        dma_fixed_s=1.3e-6, cores_per_chip=2,
        # [A2] transpose mode and VectorE performance mode are new in NeuronCore-v3.
        transpose_fp32_factor=4, vector_perf_mode_full=1, vector_perf_mode_half=1,
    ),
    "trn2": Target(
        name="trn2", neuron_core="v3",
        partitions=128, sbuf_bytes_per_partition=224 * KIB,
        psum_banks=8, psum_bank_bytes=2 * KIB,
        tensor_hz=2.4e9, vector_hz=0.96e9, scalar_hz=1.2e9, gpsimd_hz=1.2e9,
        tensor_peak_bf16_flops=79e12, tensor_peak_fp32_flops=20e12,
        vector_elems_per_cycle_fast=512, vector_elems_per_cycle=256, scalar_elems_per_cycle=128,
        hbm_bytes_per_s_chip=2.9e12, dma_bytes_per_s=368e9, dma_queues=16,
        dma_fixed_s=0.6e-6, cores_per_chip=8,
    ),
    "trn3": Target(
        name="trn3", neuron_core="v4",
        partitions=128, sbuf_bytes_per_partition=256 * KIB,
        psum_banks=8, psum_bank_bytes=2 * KIB,
        tensor_hz=2.4e9, vector_hz=1.2e9, scalar_hz=1.2e9, gpsimd_hz=1.2e9,
        # fp32 peak not documented for v4: trn2's reused.
        tensor_peak_bf16_flops=79e12, tensor_peak_fp32_flops=20e12,
        vector_elems_per_cycle_fast=512, vector_elems_per_cycle=256, scalar_elems_per_cycle=256,
        hbm_bytes_per_s_chip=4.7e12, dma_bytes_per_s=528e9, dma_queues=16,
        dma_fixed_s=0.6e-6, cores_per_chip=8,
    ),
}

DEFAULT_TARGET = "trn2"


def get_target(name: str | Target) -> Target:
    """Look up a target by name ("trn1", "trn2", "trn3"); a Target passes through."""
    if isinstance(name, Target):
        return name
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"target={name!r} is not supported; expected one of {tuple(TARGETS)}") from None

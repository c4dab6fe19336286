"""The cost model's engine and DMA figures, per NeuronCore generation, for the kernels'
engine-balance planning (attention_plan.py, the norms, softmax, rotary and the backwards).

Kernel sources import only nki, nki.language, nki.isa and sibling modules, so they cannot
import the cost model. This module is the one place in kernels/ that holds its numbers,
keyed by NeuronCore generation (``nisa.get_nc_version()``, the generation the kernel is
compiled for); tests/cost/test_engine_costs.py checks that every value equals the field
of the cost model's ``Target`` it names (torch_ext/nki_kernels/simulator/hardware.py,
where each number's AWS source is cited), so a change to the model fails that test until
this table follows. The numbers steer speed (which engine copies a PSUM tile, how much of
Pᵀ the DMA queues transpose), never results.
"""

import nki.isa as nisa
import nki.language as nl


class EngineCosts(nl.NKIObject):
    """Figures of one NeuronCore generation (names: the Target field each one mirrors)."""

    def __init__(self, vector_ghz, scalar_ghz, gpsimd_ghz, vector_psum_copy_16bit_rate, vector_instr_cycles,
                 scalar_instr_cycles, gpsimd_instr_cycles, vector_overlap_cycles, min_instruction_cycles,
                 vector_reduce_readout_cycles, dma_bytes_per_s, dma_transfer_gap_ns, dma_transfer_handoff_ns,
                 dma_descriptor_generation_ns, dma_descriptor_bytes, dma_transpose_efficiency,
                 sbuf_bytes_per_partition, gpsimd_pattern_cycles, tensor_ghz,
                 matmul_min_cycles, transpose_fp32_factor, matmul_latency_cycles, dependency_latency_cycles,
                 vector_16bit_rate, scalar_16bit_rate, vector_reduce_bf16_rate, vector_reciprocal_factor):
        # VectorE, ScalarE and GpSimd clocks (GHz): estimated cycles / clock = ns
        self.vector_ghz = vector_ghz
        self.scalar_ghz = scalar_ghz
        self.gpsimd_ghz = gpsimd_ghz
        # VectorE performance mode: elements per lane and cycle of a 16-bit copy with one
        # side in PSUM, both sides' innermost free dimension contiguous (ScalarE: 1)
        self.vector_psum_copy_16bit_rate = vector_psum_copy_16bit_rate
        # VectorE performance mode: elements per lane and cycle of a tensor_scalar /
        # tensor_copy with 16-bit input and output, all in SBUF, contiguous
        self.vector_16bit_rate = vector_16bit_rate
        # VectorE: elements per lane and cycle of a tensor_reduce (add or max) whose input
        # and output are both bf16 (else 1)
        self.vector_reduce_bf16_rate = vector_reduce_bf16_rate
        # VectorE reciprocal: cycles per element (an iterative instruction)
        self.vector_reciprocal_factor = vector_reciprocal_factor
        # ScalarE: elements per lane and cycle of an activation whose data is 16-bit (trn3:
        # 256 bf16 elements per cycle over 128 lanes; 32-bit data: 1 on every generation)
        self.scalar_16bit_rate = scalar_16bit_rate
        # fixed cost of one VectorE / ScalarE / GpSimd instruction (in that engine's cycles),
        # and the shortest instruction (MIN_II)
        self.vector_instr_cycles = vector_instr_cycles
        self.scalar_instr_cycles = scalar_instr_cycles
        self.gpsimd_instr_cycles = gpsimd_instr_cycles
        # GpSimd iota / affine_select: this many cycles plus one per element, the whole
        # instruction (the 150 is its startup, "GPSIMD_START": no gpsimd_instr_cycles on top)
        self.gpsimd_pattern_cycles = gpsimd_pattern_cycles
        # cycles of a VectorE instruction's fixed cost that overlap the next one when the
        # next does not depend on it (VectorE's pipeline): the model's figure (trn1 and trn2
        # measured, trn3 takes trn2's; hardware.py). The attention
        # kernels plan with the whole fixed cost instead (attention_plan.py says why).
        self.vector_overlap_cycles = vector_overlap_cycles
        # what a VectorE instruction's fixed cost adds to the engine's time in a stream of
        # independent instructions (what planning charges)
        self.vector_stream_cycles = vector_instr_cycles - min(vector_overlap_cycles, vector_instr_cycles)
        self.min_instruction_cycles = min_instruction_cycles
        # what a VectorE instruction that also reduces into a (P, 1) result
        # (tensor_scalar_reduce) pays on top of its pass to read the accumulator out
        self.vector_reduce_readout_cycles = vector_reduce_readout_cycles
        # DMA: bandwidth of a core's 16 queues; per transfer and queue the occupancy is
        # max(gap, data + hand-over); each DMA instruction also holds the core's descriptor
        # generator this long (0: no such stage; trn2 and trn3: AWS's ~600 ns per hardware-DGE
        # instruction); SBUF->SBUF dma_transpose efficiency
        self.dma_bytes_per_s = dma_bytes_per_s
        self.dma_transfer_gap_ns = dma_transfer_gap_ns
        self.dma_transfer_handoff_ns = dma_transfer_handoff_ns
        self.dma_descriptor_generation_ns = dma_descriptor_generation_ns
        # bytes of data time each contiguous chunk (DMA descriptor) of a transfer adds
        self.dma_descriptor_bytes = dma_descriptor_bytes
        self.dma_transpose_efficiency = dma_transpose_efficiency
        # SBUF bytes per partition (what a kernel may keep on chip at once)
        self.sbuf_bytes_per_partition = sbuf_bytes_per_partition
        # TensorE: clock (GHz), the shortest matmul (cycles), what fp32 data multiplies a
        # transpose's cycles by, and how long after a matmul or transpose its PSUM result
        # can be read (cycles)
        self.tensor_ghz = tensor_ghz
        self.matmul_min_cycles = matmul_min_cycles
        self.transpose_fp32_factor = transpose_fp32_factor
        self.matmul_latency_cycles = matmul_latency_cycles
        # how long after a VectorE / ScalarE / GpSimd instruction ends its result can be
        # read (cycles of the producer's clock)
        self.dependency_latency_cycles = dependency_latency_cycles

    def instruction_ns(self, engine, elements, rate=1, reads_previous=False):
        """Estimated ns one ``engine`` ("vector", "scalar" or "gpsimd") instruction over
        ``elements`` per partition at ``rate`` elements per cycle holds the engine in a
        stream of independent instructions (the cost model's rule: max(MIN_II,
        elements / rate) + the engine's fixed cost, in its own cycles, less VectorE's
        pipeline overlap). ``reads_previous``: it reads the result of the instruction
        before it on the engine, so VectorE's pipeline drains first and it pays its whole
        fixed cost."""
        vector_fixed = self.vector_instr_cycles if reads_previous else self.vector_stream_cycles
        ghz, fixed = {"vector": (self.vector_ghz, vector_fixed),
                      "scalar": (self.scalar_ghz, self.scalar_instr_cycles),
                      "gpsimd": (self.gpsimd_ghz, self.gpsimd_instr_cycles)}[engine]
        return (max(self.min_instruction_cycles, elements / rate) + fixed) / ghz

    def vector_psum_copy_rate(self, sixteen):
        """Elements per cycle of a VectorE copy with one side in PSUM: the performance
        mode's half factor when the data is 16-bit (vector_psum_copy_16bit_rate: 2 on trn2
        and trn3, 1 on trn1), else 1."""
        return self.vector_psum_copy_16bit_rate if sixteen else 1

    def vector_two_input_rate(self, sixteen):
        """Elements per cycle of a VectorE tensor_tensor (or other instruction reading two
        full inputs) with both inputs in SBUF, by the cost model's rule: two input passes,
        over the performance mode's factor when every operand is 16-bit (the model's
        vector_perf_mode_half, which this table carries as vector_psum_copy_16bit_rate:
        2 on trn2 and trn3, 1 on trn1). Not for scalar_tensor_tensor, which has no such
        mode (0.5 on every generation)."""
        return self.vector_psum_copy_rate(sixteen) / 2

    def vector_stt_rate(self):
        """Elements per cycle of a VectorE scalar_tensor_tensor: two full inputs, and no
        performance mode for it on any generation (the cost model's rule): 0.5."""
        return 0.5

    def gpsimd_two_input_rate(self):
        """Elements per cycle of a GpSimd instruction reading two full inputs (tensor_tensor,
        scalar_tensor_tensor): the model prices GpSimd as VectorE without its performance
        mode, two passes per element: 0.5."""
        return 0.5

    def vector_one_input_rate(self, sixteen):
        """Elements per cycle of a VectorE tensor_scalar or tensor_copy reading one input in
        SBUF: the full performance mode's factor when its data is 16-bit (vector_16bit_rate:
        4 on trn2 and trn3, 1 on trn1), else 1."""
        return self.vector_16bit_rate if sixteen else 1

    def scalar_rate(self, sixteen):
        """Elements per cycle of a ScalarE instruction over its data: scalar_16bit_rate
        when the data is 16-bit (2 on trn3, 1 elsewhere), else 1."""
        return self.scalar_16bit_rate if sixteen else 1

    def dependency_ns(self, engine):
        """How long a consumer waits after an ``engine`` ("tensor", "vector", "scalar" or
        "gpsimd") instruction ends before it can read the result (the cost model's rule)."""
        if engine == "tensor":
            return self.matmul_latency_cycles / self.tensor_ghz
        ghz = {"vector": self.vector_ghz, "scalar": self.scalar_ghz, "gpsimd": self.gpsimd_ghz}[engine]
        return self.dependency_latency_cycles / ghz

    def fp32_transpose_ns(self, partitions, columns):
        """Estimated ns of a TensorE transpose of a [``partitions``, ``columns``] fp32 tile
        (the cost model's rule: max(P, min(64, F)) cycles, times the fp32 factor; a read of
        the result waits dependency_ns("tensor") more)."""
        cycles = max(partitions, min(self.matmul_min_cycles, columns))
        return cycles * self.transpose_fp32_factor / self.tensor_ghz

    def vector_gpsimd_share(self, vector_rate=0.5):
        """Share of a stream of two-input elementwise passes to give VectorE so that it and
        GpSimd finish together (the rest to GpSimd): GpSimd reads two inputs per element
        (half an element per cycle), VectorE ``vector_rate`` elements per cycle. The
        default, 0.5, is VectorE without its 16-bit mode (an fp32 operand): the share is
        then VectorE's clock over the sum of the two (trn2: 0.96 / (0.96 + 1.2) = 0.44);
        16-bit tiles in SBUF pass at twice that where the generation has the mode (trn2:
        0.62)."""
        vector = self.vector_ghz * vector_rate
        gpsimd = self.gpsimd_ghz * self.gpsimd_two_input_rate()
        return vector / (vector + gpsimd)

    def dma_transpose_ns(self, nbytes):
        """Data time (ns) of an SBUF->SBUF dma_transpose of ``nbytes`` over a core's 16
        queues (the copy bandwidth at dma_transpose_efficiency)."""
        return nbytes / (self.dma_bytes_per_s * self.dma_transpose_efficiency) * 1e9

    def queue_data_ns(self, bytes_per_partition):
        """Data time (ns) of one DMA queue's share of a transfer over all 128 partitions
        moving ``bytes_per_partition`` each (one contiguous run per partition): a core's 16
        queues, 8 partitions apiece, each partition's run a descriptor that adds
        dma_descriptor_bytes (the model's data time; until 2026-12-06 the descriptors were
        left out, 13 % of a [128, 64] bf16 transfer's data time)."""
        return 8 * (bytes_per_partition + self.dma_descriptor_bytes) / (self.dma_bytes_per_s / 16 / 1e9)

    def dma_occupancy_ns(self, data_ns):
        """How long one transfer of a stream from one allocation site holds the DMA path when
        its share of data on a queue takes ``data_ns``: its queue at least the transfer gap
        (the site's queue starts its transfers in order), the core's descriptor generator
        its generation time, the engine its data plus the hand-over (the cost model's rule,
        cost/schedule.py). The model gives other sites' transfers queues of their own, whose
        gaps overlap these (only the generator is shared), so a stream that interleaves
        several sites' transfers is charged here up to gap / generation (0.85 / 0.6 on trn2)
        too long: planning treats every stream as one site's."""
        return max(self.dma_transfer_gap_ns, self.dma_descriptor_generation_ns,
                   data_ns + self.dma_transfer_handoff_ns)


# Target field (and unit factor) each attribute mirrors; the test compares them.
MIRRORS = {
    "vector_ghz": ("vector_hz", 1e-9),
    "scalar_ghz": ("scalar_hz", 1e-9),
    "gpsimd_ghz": ("gpsimd_hz", 1e-9),
    "vector_psum_copy_16bit_rate": ("vector_perf_mode_half", 1),
    "vector_16bit_rate": ("vector_perf_mode_full", 1),
    "scalar_16bit_rate": ("scalar_elems_per_cycle", 1 / 128),
    "vector_reduce_bf16_rate": ("reduce_bf16_speedup", 1),
    "vector_reciprocal_factor": ("vector_reciprocal_factor", 1),
    "vector_instr_cycles": ("vector_static_cycles", 1),
    "scalar_instr_cycles": ("scalar_static_cycles", 1),
    "gpsimd_instr_cycles": ("gpsimd_static_cycles", 1),
    "gpsimd_pattern_cycles": ("gpsimd_pattern_cycles", 1),
    "vector_overlap_cycles": ("vector_overlap_cycles", 1),
    "min_instruction_cycles": ("min_instruction_cycles", 1),
    "vector_reduce_readout_cycles": ("vector_reduce_readout_cycles", 1),
    "dma_bytes_per_s": ("dma_bytes_per_s", 1),
    "dma_transfer_gap_ns": ("dma_transfer_gap_s", 1e9),
    "dma_transfer_handoff_ns": ("dma_transfer_handoff_s", 1e9),
    "dma_descriptor_generation_ns": ("dma_descriptor_generation_s", 1e9),
    "dma_descriptor_bytes": ("dma_descriptor_bytes", 1),
    "dma_transpose_efficiency": ("dma_transpose_sbuf_efficiency", 1),
    "sbuf_bytes_per_partition": ("sbuf_bytes_per_partition", 1),
    "tensor_ghz": ("tensor_hz", 1e-9),
    "matmul_min_cycles": ("matmul_min_cycles", 1),
    "transpose_fp32_factor": ("transpose_fp32_factor", 1),
    "matmul_latency_cycles": ("matmul_latency_cycles", 1),
    "dependency_latency_cycles": ("dependency_latency_cycles", 1),
}

# attributes computed from the mirrored ones (not Target fields)
DERIVED = ("vector_stream_cycles",)

# NeuronCore-v2 (trn1), -v3 (trn2), -v4 (trn3)
_GEN2 = EngineCosts(vector_ghz=1.12, scalar_ghz=1.4, gpsimd_ghz=1.4, vector_psum_copy_16bit_rate=1,
                    vector_instr_cycles=400.0, scalar_instr_cycles=100.0,
                    gpsimd_instr_cycles=400.0, vector_overlap_cycles=320.0, min_instruction_cycles=64,
                    vector_reduce_readout_cycles=64, dma_bytes_per_s=272e9,
                    dma_transfer_gap_ns=850.0, dma_transfer_handoff_ns=0.0, dma_descriptor_generation_ns=0.0,
                    dma_descriptor_bytes=20.0,
                    dma_transpose_efficiency=0.5,
                    sbuf_bytes_per_partition=192 * 1024, gpsimd_pattern_cycles=150, tensor_ghz=2.8,
                    matmul_min_cycles=64, transpose_fp32_factor=4, matmul_latency_cycles=400,
                    dependency_latency_cycles=100,
                    vector_16bit_rate=1, scalar_16bit_rate=1, vector_reduce_bf16_rate=2,
                    vector_reciprocal_factor=8)
_GEN3 = EngineCosts(vector_ghz=0.96, scalar_ghz=1.2, gpsimd_ghz=1.2, vector_psum_copy_16bit_rate=2,
                    vector_instr_cycles=65.0, scalar_instr_cycles=360.0,
                    gpsimd_instr_cycles=150.0, vector_overlap_cycles=17.0, min_instruction_cycles=64,
                    vector_reduce_readout_cycles=64, dma_bytes_per_s=368e9,
                    dma_transfer_gap_ns=850.0, dma_transfer_handoff_ns=0.0, dma_descriptor_generation_ns=600.0,
                    dma_descriptor_bytes=20.0,
                    dma_transpose_efficiency=0.5,
                    sbuf_bytes_per_partition=224 * 1024, gpsimd_pattern_cycles=150, tensor_ghz=2.4,
                    matmul_min_cycles=64, transpose_fp32_factor=2, matmul_latency_cycles=400,
                    dependency_latency_cycles=100,
                    vector_16bit_rate=4, scalar_16bit_rate=1, vector_reduce_bf16_rate=2,
                    vector_reciprocal_factor=8)
_GEN4 = EngineCosts(vector_ghz=1.2, scalar_ghz=1.2, gpsimd_ghz=1.2, vector_psum_copy_16bit_rate=2,
                    vector_instr_cycles=65.0, scalar_instr_cycles=360.0,
                    gpsimd_instr_cycles=150.0, vector_overlap_cycles=17.0, min_instruction_cycles=64,
                    vector_reduce_readout_cycles=64, dma_bytes_per_s=528e9,
                    dma_transfer_gap_ns=850.0, dma_transfer_handoff_ns=0.0, dma_descriptor_generation_ns=600.0,
                    dma_descriptor_bytes=20.0,
                    dma_transpose_efficiency=0.5,
                    sbuf_bytes_per_partition=256 * 1024, gpsimd_pattern_cycles=150, tensor_ghz=2.4,
                    matmul_min_cycles=64, transpose_fp32_factor=2, matmul_latency_cycles=400,
                    dependency_latency_cycles=100,
                    vector_16bit_rate=4, scalar_16bit_rate=2, vector_reduce_bf16_rate=2,
                    vector_reciprocal_factor=8)


def by_generation():
    """{nisa.nc_version member: EngineCosts} (for the test and for planning code)."""
    return {nisa.nc_version.gen2: _GEN2, nisa.nc_version.gen3: _GEN3, nisa.nc_version.gen4: _GEN4}


def active():
    """The figures of the NeuronCore generation the kernel is being built for."""
    version = nisa.get_nc_version()
    table = by_generation()
    assert version in table, f"no engine costs for NeuronCore version {version}"
    return table[version]

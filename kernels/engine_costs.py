"""Engine clocks and DMA figures the attention kernel plans its engine balance with.

These numbers MIRROR the cost model's trn2 table (``Target`` ``TARGETS["trn2"]`` in
torch_ext/nki_kernels/simulator/hardware.py, where each one's AWS source is cited):
copied, not imported, because kernel sources import only nki and sibling kernel modules.
They steer choices (which engine copies a PSUM tile, how much of Pᵀ the DMA queues
transpose), never correctness: a different value changes speed, not results. Keep them
equal to that table; the kernels will read the active target's numbers in a later step.
"""

# VectorE and ScalarE clocks (GHz): work estimated in cycles is divided by these to give ns.
VECTOR_GHZ = 0.96                 # hardware.py trn2 vector_hz = 0.96e9
SCALAR_GHZ = 1.2                  # hardware.py trn2 scalar_hz = 1.2e9

# VectorE performance mode: a 16-bit copy with one side in PSUM moves 2 elements per lane
# and cycle (hardware.py vector_perf_mode_half); ScalarE moves 1.
VECTOR_PSUM_COPY_16BIT_RATE = 2.0

# Fixed cost of one VectorE/ScalarE/GpSimd instruction (static SBUF access overhead).
INSTR_CYCLES = 60                 # hardware.py static_overhead_cycles
# Shortest VectorE/ScalarE instruction (MIN_II): tiny instructions still cost this much.
MIN_INSTRUCTION_CYCLES = 64       # hardware.py min_instruction_cycles

# DMA: practical bandwidth per NeuronCore, fixed cost of one transfer (descriptor
# generation), and the share of that bandwidth an SBUF->SBUF dma_transpose reaches.
DMA_BYTES_PER_S = 368e9           # hardware.py trn2 dma_bytes_per_s
DMA_FIXED_NS = 600.0              # hardware.py trn2 dma_fixed_s = 0.6e-6
DMA_TRANSPOSE_EFFICIENCY = 0.5    # hardware.py dma_transpose_sbuf_efficiency

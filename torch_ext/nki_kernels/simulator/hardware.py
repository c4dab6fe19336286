"""Every hardware number and per-generation ISA limit of the simulator and the cost model,
in one table: one ``Target`` per NeuronCore generation.

The simulator's rules (isa/, memory.py, language/) and the cost model (cost/) read the
numbers from the active target; nothing else in the package spells them. The facts and
their public AWS sources are listed in docs/hardware.md. In short (all in the repository
aws-neuron/aws-neuron-sdk, NKI API docstrings at commit a3247f5b):

* architecture guides ``about-neuron/arch/neuron-hardware/trainium{,2,3}.rst`` and
  ``nki/guides/architecture/*_arch.rst``: engine clocks, peak FLOPS, SBUF/PSUM sizes,
  start-partition rules, Logical NeuronCores;
* ``nki/get-started/about/nki-dma-overview.rst`` and
  ``nki/deep-dives/nki-dma-bandwidth-guide.rst``: DMA bandwidth per core, queue count,
  latency per transfer;
* public hardware measurements (benchmarks/calibration/measurements.toml): the few cost
  numbers the documents do not give are fitted on them (marked [F]);
* the beta-2 instruction docstrings ``nki/api/nki/isa/__init__.py``: per-instruction
  limits (matmul tile sizes, transpose sizes, bn_stats, max8, ...) and their cost texts.

All figures are per NeuronCore. A number not documented for a generation reuses trn2's
and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024


# Uncertain numbers whose range is the same on every generation: (field, optimistic,
# pessimistic); a name ending in _scale multiplies the field (cost/uncertainty.py).
SHARED_COST_RANGES: tuple[tuple[str, float, float], ...] = (
    ("dma_latency_s", 0.6e-6, 1.3e-6),          # [A2] DGE ~600 ns .. [DB] ~1300 ns
    ("dma_transfer_gap_s", 0.3e-6, 1.3e-6),     # [A2] 600 ns over 2 DGE instances .. [DB] 1.3 us
    ("dma_descriptor_bytes", 0.0, 166.0),       # [F] none .. the whole curve tail charged to chunks
    ("dma_bytes_per_s_scale", 1.05, 0.9),       # [M] 18.1 vs 17 B/ns (trn1 fig30) .. 10 % short
    ("matmul_latency_cycles", 200.0, 600.0),    # [M] fig18/20/21 spread
    ("buffer_rotation_depth", 4.0, 2.0),        # compiler's choice: undocumented (within SBUF/PSUM: schedule.family_depths)
    # the whole fixed cost (capped at it; 380 is the largest any row shows, [M] fig17) ..
    # none: trn1's Mamba profiles measure the overlap [M], trn2's v5 profile bounds it
    ("vector_overlap_cycles", 380.0, 0.0),
)
# Cycles an independent VectorE instruction adds behind another beyond its streaming:
# vector_static_cycles - vector_overlap_cycles, measured on trn1 (400 - 320, [F] the Mamba
# v1 profile pair); trn1's only since 2026-12-08 (trn2 and trn3 carried it until then; they
# take the v5 profile's figures below).
# 40 (360 - 320) until the refit of 2026-12-06 that followed the port audit's fix of the v1
# port (its three loads in buffers of their own; docs/cost-model.md "The port audit of
# 2026-12-06 and the refit it asked for").
VECTOR_ISSUE_CYCLES = 80.0
# trn2's (and trn3's) VectorE fixed cost per instruction and the part of it an independent
# successor overlaps, [M] read off the one public trn2 profile of VectorE instructions: the
# kernel-optimization tutorial's v5 matmul (aws-neuron-sdk @81ce03ae nki/img/how-to/v5-vec.png;
# rows optimization_guide.matmul_v5.vector_durations / .vector_busy, split "train" since
# they set these). Its source issues 5,120 VectorE instructions of one size, [128, 512] fp32
# (4,096 PSUM + SBUF adds, 512 memsets, 512 copies: 512 cycles of data each at 0.96 GHz);
# their durations add up to 3.08 ms, so each holds 3.08 ms x 0.96 GHz / 5,120 - 512 = 65.5
# cycles beyond its data (+-0.9 for the figure's 3 digits). The profile counts 5,403
# instructions: were the 283 the source does not issue as long as the rest, the fixed cost
# would be 35 cycles, so the profile places it in 35-65 and 65 is the end where those 283
# take no time (the range's optimistic end is the other). [A1] gives a static overhead of
# ~60 cycles (for NeuronCore-v2). The engine is active 2.99 ms, 0.09 ms less than the
# durations: (3.08 - 2.99) ms x 0.96 GHz / 5,120 = 17 cycles per instruction (+-2), an
# average over all of them. The model overlaps only an independent instruction issued back
# to back with the one before, ~118 in its schedule of v5 (VectorE mostly waits on TensorE
# there), so its v5 active time stays 3 % above the profile's; spread over those pairs the
# profile's 0.09 ms would exceed the fixed cost, which the model's rule cannot give. 17 is
# the least per-pair overlap the profile allows, and what the model takes.
# Until 2026-12-08 (session 87) this was [F], fitted on nki-library's QoR train rows:
# 100 cycles, 150 from the refit of 2026-12-06, with the overlap tied to trn1's issue
# interval (150 - 80 = 70); those rows' loss is flat from 100 to 500 cycles (0.0361-0.0365
# under trn2's DMA rule C), so they never placed it (docs/cost-model.md "trn2's VectorE
# read off the v5 profile").
TRN2_VECTOR_STATIC_CYCLES = 65.0
TRN2_VECTOR_OVERLAP_CYCLES = 17.0
# trn2's (and trn3's) GpSimd fixed cost per instruction: [S] GPSIMD_START, "the instruction
# startup overhead on GpSimdE, roughly 150 engine cycles" (affine_select, iota docstrings).
# No profile measures it. Until 2026-12-08 it took VectorE's fitted number (150 since the
# refit of 2026-12-06, 100 before).
TRN2_GPSIMD_STATIC_CYCLES = 150.0
# trn1's fixed costs per instruction (optimistic, pessimistic)
TRN1_STATIC_RANGES: tuple[tuple[str, float, float], ...] = (
    ("scalar_static_cycles", 60.0, 160.0),   # [A1] ~60 .. perf guide fig16 (hw-measurements.md: 1-element ACTIVATE 159 ns = 223 cycles = 64 + 159)
    # [P] ~100 .. the fitted value, 400 ([F] since the refit of 2026-12-06; until then perf
    # guide fig17's tensor_tensor 2N + ~380, hw-measurements.md, the largest figure)
    ("vector_static_cycles", 100.0, 400.0),
    ("gpsimd_static_cycles", 100.0, 400.0),  # as VectorE (no GpSimd measurement)
)


@dataclass(frozen=True)
class Target:
    """One NeuronCore generation (values and sources: docs/hardware.md)."""

    name: str                     # "trn1" | "trn2" | "trn3"
    neuron_core: str              # "v2" | "v3" | "v4"
    # on-chip memory [A1][A2][A3]
    partitions: int               # SBUF/PSUM partitions (lanes)
    sbuf_bytes_per_partition: int
    psum_banks: int               # PSUM banks per partition
    psum_bank_bytes: int          # bytes per bank per partition (512 fp32)
    # engine clocks (Hz) [A1][A2][A3]
    tensor_hz: float
    vector_hz: float
    scalar_hz: float
    gpsimd_hz: float
    # throughput [A1][A2][A3]
    tensor_peak_bf16_flops: float  # per core, dense bf16/fp16
    tensor_peak_fp32_flops: float
    scalar_elems_per_cycle: int   # 16-bit data (trn3: 256 for bf16/fp16/fp8)
    # memory system [D][DB][A2]
    # DMA bandwidth per core: [D]'s table ("theoretical peak DMA bandwidth": 17 / 23 / 33 B/ns,
    # 272 / 368 / 528 GB/s), also [DB]'s "peak"; the same [D] page elsewhere says 27.2 GB/s per
    # engine for v2/v3 (38.4 for v4), [A1] 27 GiB/s: the documents disagree, the model takes
    # the table (the error bar's pessimistic end is 10 % short of it)
    dma_bytes_per_s: float
    dma_queues: int               # DMA engines a transfer is spread over

    # ---- per-instruction cost rules of cost/model.py ------------------------------------
    # Cycles are cycles of the engine running the instruction. Source keys as in
    # docs/hardware.md: [S] the "Estimated instruction cost" texts of the nki.isa
    # docstrings (Neuron 2.20-2.26); [P] the NKI performance guide (static instruction
    # overhead ~100 cycles; dependent 1-element instructions "around 189 ns (264 ScalarE
    # cycles on NC-v2)" apart);
    # [A1]/[A2]/[A3] the Trainium/Inferentia2, Trainium2, Trainium3 architecture guides;
    # [D] the DMA overview (16 DMA engines, 8 partitions each); [H] AWS's
    # neuron-agentic-development profiling rule rsqrt-engine-tradeoff-and-psum; [X] Neuron
    # Explorer's "Understanding throttling" (tools/neuron-explorer/overview-summary-page.rst);
    # [M] a public hardware measurement (benchmarks/calibration/measurements.toml, row id
    # named); [F] FITTED by benchmarks/calibrate.py on the training rows of that file
    # (docs/cost-model.md "Calibration").
    min_instruction_cycles: int = 64        # [S] MIN_II of VectorE/ScalarE (applied to GpSimd too)
    # Fixed engine occupancy of every Vector/Scalar/GpSimd instruction on top of
    # max(MIN_II, N), per engine and per generation. [A1] says ~60 cycles ("a static
    # overhead approximately 60 cycles on NeuronCore-v2", its tensor access overhead) and
    # [P] "~100 cycles"; the profiles measure more, and differently per engine and
    # generation: a 1-element ACTIVATE occupies trn1's ScalarE 223 cycles (perf-guide
    # fig16) and NKIBench's trn1 ScalarE busy times want ~100, while trn2's ScalarE exp
    # measures N + ~350 at two sizes (DMA overview figures, rows scalar.exp_*); VectorE
    # tensor_tensor measures 2N + ~380 on trn1 (fig17) and NKIBench's VectorE busy times
    # sit lower. One shared number cannot fit both generations (docs/cost-model.md
    # "Calibration"), so each engine of each generation has its own: [F] trn1's VectorE
    # and ScalarE on the trn1 busy-time and instruction rows of measurements.toml, trn2's
    # ScalarE on its exp rows; [M] trn2's VectorE, read off the v5 profile
    # (TRN2_VECTOR_STATIC_CYCLES above; fitted on nki-library's QoR train rows until
    # 2026-12-08, which never placed it). GpSimd has no measurement on any generation:
    # trn1's takes VectorE's number, trn2's AWS's GPSIMD_START [S]. Defaults: trn2's.
    vector_static_cycles: float = TRN2_VECTOR_STATIC_CYCLES
    scalar_static_cycles: float = 360.0
    gpsimd_static_cycles: float = TRN2_GPSIMD_STATIC_CYCLES
    # VectorE "streams data ... in a deeply pipelined fashion" [A1]: the last of an
    # instruction's fixed cycles are its pipeline draining, and the next instruction can
    # start streaming then if it does not read what this one writes. The profiles of the
    # fused-Mamba tutorial [M] (general/nki/img/mamba_v1_profile_zoomed.png, mamba_v2.png
    # @72825d50) show it: VectorE is active 1.19x-1.50x shorter than its instructions'
    # durations added up. This many cycles (at most the engine's fixed cost) of a VectorE
    # instruction overlap an independent successor's. [F] on trn1 (rows mamba.v1.c256_s512.*,
    # the one profile pair in the train split): 320 of 400, so an independent instruction
    # issued behind another adds VECTOR_ISSUE_CYCLES (80) cycles beyond its streaming.
    # trn2's from the v5 profile's durations against its active time: 17 of 65, the least
    # the profile allows per overlapping pair, an issue interval of 48
    # (TRN2_VECTOR_OVERLAP_CYCLES says why a bound; until 2026-12-08 it took trn1's interval,
    # 150 - 80 = 70). trn3 has no figure and takes trn2's.
    vector_overlap_cycles: float = TRN2_VECTOR_OVERLAP_CYCLES
    # The kernels plan with this figure on every generation (kernels/engine_costs.py), the
    # attention kernels with the whole fixed cost (kernels/attention_plan.py says why). Until
    # session 59 they planned with it only where measured (trn1), with none on trn2 and trn3;
    # docs/cost-model.md "What the kernels plan with" has what the change moved.
    # extra wait of a consumer of a Vector/Scalar/GpSimd result: [M] scalar.chain_1elem_fp32_trn1
    # (a dependent 1-element ACTIVATE every 264 cycles = 64 + trn1's 100 fixed + 100); the [S]
    # cost texts give no such latency and [P]'s "~100 cycles" is the static overhead
    dependency_latency_cycles: int = 100
    matmul_min_cycles: int = 64             # [S] matmul max(min(64, M), N) cycles
    # [S] fp32 operands: 4 passes (79 vs 20 TFLOPS). [M] on trn2: the kernel-optimization
    # tutorial's fp32 matmuls (32,768 of [128,128] x [128,512]) show 28.16 ms of TensorE
    # active time, 27.96 ms at this factor (rows optimization_guide.matmul_v3/v5.tensor_busy)
    matmul_fp32_factor: int = 4
    # nc_matmul_mx (v4): MX pairs each PE multiplies per cycle, [A3] "Quad-MXFP8/MXFP4 Matmul
    # Performance" (4x the FLOPs of a bf16 matmul of the same tile sizes)
    matmul_mx_pairs_per_pe: int = 4
    # TensorE pipeline latency: a matmul's PSUM result is readable this many TensorE cycles
    # after its initiation interval ends. [M] perf-guide fig18/fig20-21 (trn1): a 128-column
    # MultiplyMoving lasts 188-219 ns = 526-613 cycles at 2.8 GHz against its 128-cycle
    # initiation interval [S]; ~400 more. Back-to-back matmuls (accumulation into one bank
    # or independent ones) do not wait for it [A1] (background LoadStationary).
    matmul_latency_cycles: int = 400
    # [A1] "Fast LoadStationary": loading a stationary tile is up to 4x faster than a
    # matmul of the same free size, and happens in the background; a matmul's initiation
    # interval is at least M / 4 (never binding above the 64-cycle floor for M <= 128).
    load_stationary_speedup: int = 4
    transpose_fp32_factor: int = 2          # [A2] TensorE transpose mode: fp32 2x faster than fp32 matmul
    activation_readout_cycles: int = 64     # [S] ScalarE: +64 cycles to read the accumulator out
    # [S] tensor_scalar_reduce: "max(MIN_II, N) + MIN_II" VectorE cycles (the same read-out)
    vector_reduce_readout_cycles: int = 64
    memset_zero_16bit_speedup: int = 2      # [S] memset: "N/2" for a zero into bf16/fp16, else N
    bn_aggr_cycles_per_3_elems: int = 13    # [S] bn_aggr: "max(MIN_II, 13*(N/3))" VectorE cycles
    gpsimd_pattern_cycles: int = 150        # [S] GpSimd iota/affine_select: 150 + N
    # [S] local_gather: "150 + (num_valid_indices * num_elem_per_idx)/C" with
    # C = ((28 + t * num_elem_per_idx)/(t * num_elem_per_idx)) / min(4/dtype_size,
    # num_elem_per_idx), "t is a constant 4" (cost/model.py: C read as cycles per element)
    local_gather_start_cycles: int = 150
    local_gather_loop_cycles: int = 28
    local_gather_indices_per_loop: int = 4
    vector_reciprocal_factor: int = 8       # [S] VectorE reciprocal ~8N
    reduce_bf16_speedup: int = 2            # [S] tensor_reduce N/2: add/max, bf16 input and output
    vector_perf_mode_full: int = 4          # [A2] 4x: tensor_copy/tensor_scalar, 16-bit, all SBUF, contiguous
    vector_perf_mode_half: int = 2          # [A2] 2x: same strided, or with one side in PSUM; tensor_tensor 16-bit SBUF
    # [A1] NeuronCore-v2 "Access pattern": "When the most-minor F dimension stride is less
    # than 16 bytes, SBUF/PSUM ... can supply a peak bandwidth of 128 elements/cycle ... If
    # the most-minor F dimension stride exceeds 16 bytes, the achievable bandwidth of each
    # tensor read/write interface will be half of the peak bandwidth, which translates to
    # roughly 50% performance hit on the instructions": a Vector/Scalar/GpSimd instruction
    # with an on-chip operand strided past strided_access_max_bytes runs this many times
    # longer. trn1 only: the v3/v4 guides state no such rule (1: none)
    strided_access_factor: float = 1.0
    strided_access_max_bytes: int = 16
    # tensor_copy/tensor_scalar writing an 8-bit float (fp8) from 16-bit inputs take the mode
    # too. [A2] names BF16/FP16 ("input and output data types do not need to match"); an fp8
    # output is narrower than either, and AWS's fp8 quantization kernel measures it: nki-library's
    # rmsnorm_quant QoR rows and its design doc's profile (docs/cost-model.md "fp8 outputs").
    # False: only 16-bit outputs (the reading before session 44).
    vector_perf_mode_8bit_dst: bool = True
    scalar_elems_per_cycle_fp32: int = 128  # [A3] ScalarE 128 elem/cycle for 32-bit types on every generation
    # ALU "transcendental" ops (power, rsqrt, reciprocal) in tensor_scalar/tensor_tensor/...
    # are iterative on VectorE/GpSimd, unlike ScalarE's activation tables:
    # [S] gives max(MIN_II, 8N) for VectorE's `reciprocal` instruction only; applying it to
    # every such ALU op (power, rsqrt, reciprocal inside tensor_scalar / tensor_tensor) is our
    # extrapolation: no cost text prices them
    alu_transcendental_factor_vector: int = 8
    # [H] GpSimd ~4 cycles per element (4x ScalarE's rate); second-hand: the rule's text is
    # quoted by a digest of AWS's agent rules, not read here (docs/hardware.md [H])
    alu_transcendental_factor_gpsimd: int = 4

    # ---- DMA rules of cost/model.py (docs/cost-model.md "DMA") -------------------------
    # A transfer is spread over ceil(P / 8) of the dma_queues engines [D]; each engine
    # processes one transfer at a time [A1] "Data movement". Per transfer and engine:
    # * latency: trigger to first byte, overlapped with other transfers in flight. [DB]
    #   "descriptor setup, synchronization, and semaphore-to-start latency (~1300 ns
    #   cross-engine)"; hardware DGE instructions take ~600 ns [A2].
    dma_latency_s: float = 1.3e-6
    # * data time: (bytes + descriptors x dma_descriptor_bytes) / (dma_bytes_per_s / 16).
    #   Every contiguous chunk (DMA buffer) costs extra [A1] ("some performance overhead
    #   at both DMA buffer and transfer levels"); its size is [F]: 2 KiB in 8 chunks of
    #   256 B take 97 ns on one engine, 32 KiB in 4 chunks 1416 ns [D] (rows dma.single_*).
    dma_descriptor_bytes: float = 20.0     # [F]
    # * occupancy: an engine starts its next transfer no sooner than this after the
    #   previous one started ("the DMA packet rate, not HBM bandwidth, becomes the
    #   limiting factor" [DB]): the figure of [D] is linear in bytes up to 2 KiB per
    #   partition (one [128, B] transfer per ~0.85 us). [F]
    dma_transfer_gap_s: float = 0.85e-6   # [F]
    # * hand-over: after a transfer's data an engine needs this before the next one's: a
    #   lone transfer's profiled duration is its data time (rows dma.single_*), but a stream
    #   of 4 KiB-per-partition transfers reaches 96.7 % of the 32 KiB throughput, not 100 %
    #   (rows dma.curve.*). [F]: the curve alone fits 25 ns; with trn1's rows and VectorE's
    #   overlap the joint fit lands at 0 (train loss 0.00598 against 0.00604 at 25 ns; the
    #   4 KiB point models 99.6 % instead of 98.1 %).
    dma_transfer_handoff_s: float = 0.0   # [F]
    # * queues: each DMA engine serves 16 queues; transfers within a queue run in order,
    #   transfers of different queues are "scheduled in a round robin fashion (for
    #   NeuronCore-v2 and v3)" [D] ("DMA Queues"; on v4 "based on the queue QoS configured",
    #   which no document details: trn3 takes the same rule). The transfer gap is a queue's (a stream of one queue's transfers is what
    #   the curve of [D] measured); the engine's bandwidth is shared. Which queue a transfer
    #   takes is the compiler's choice ("typically tied to the trigger engine" [D]); the model
    #   gives every SBUF allocation site its own queue (a loop's transfers of one site stay
    #   in order), sites beyond dma_site_queues sharing them; the site rule is our
    #   assumption. 1 (the default, trn1's): one queue per engine. trn2 and trn3 take 16 with
    #   the descriptor generator below since 2026-12-08 (docs/cost-model.md "DMA", Queues,
    #   and "Both rules at once": the two together, not either alone, fit both the DMA
    #   overview's single-stream curve and the kernels that interleave several sites).
    dma_site_queues: int = 1
    # * descriptor generation: every DMA instruction's descriptors are made by one generator
    #   per core, one instruction at a time, before its data may move: "Each hardware-DGE DMA
    #   instruction takes approximately 600 ns to execute" [A2] (aws-neuron-sdk @81ce03ae
    #   nki/deep-dives/nki-dge.rst; two DGE instances per trn2 core; the kernel-optimization
    #   tutorial's software-DGE transfers show GpSimd at the same cadence). 0 (the default):
    #   no such stage. With a queue per site beside the per-queue gap, 600 ns fits both the DMA
    #   overview's single-stream curve and the kernel-optimization tutorial's two interleaved
    #   streams (docs/cost-model.md "Both rules at once"). 0 (the default) on trn1, whose
    #   NeuronCore-v2 the DGE page does not cover; trn2 and trn3 take 600 ns since 2026-12-08
    #   (kernels/engine_costs.py dma_occupancy_ns mirrors it for the planners; below the gap,
    #   it changes no plan today).
    dma_descriptor_generation_s: float = 0.0
    dma_transpose_hbm_efficiency: float = 0.9   # [A2] HBM->SBUF DMA transpose: up to 90% of DMA throughput
    dma_transpose_sbuf_efficiency: float = 0.5  # [A2] SBUF->SBUF DMA transpose: up to 50%
    # The two physical cores of a logical core have their own 16 DMA engines each [D] but
    # share one HBM stack ("Each bank is shared by two physical NeuronCore-v3": aws-neuron-sdk
    # about-neuron/arch/neuron-features/logical-neuroncore-config.rst, which also gives "four
    # 24GB HBM banks"; [I] core_barrier: "two NeuronCores that share the same HBM stack");
    # per-stack bandwidth = chip HBM bandwidth [C] / the stacks [A2][A3] ("4 HBM stacks"):
    # trn2 2.9 TB/s / 4 ([A2] says 3 TB/s).
    # Both cores streaming get min(1, stack / (2 x dma_bytes_per_s)) of their DMA bandwidth.
    hbm_stack_bytes_per_s: float = 725e9
    # ---- TensorE's current (dI/dt) throttle (cost/schedule.py; docs/cost-model.md) ------
    # [X] "On Trn2 and Trn3 the Tensor Engine starts at roughly 50% utilization of maximum
    # utilization and ramps to full over about the first ~3 microseconds after work begins.
    # If utilization drops below 50% over any ~3 microsecond window -- for example during an
    # idle gap -- the limit re-engages, so the next burst again runs at roughly 50% of maximum
    # Tensor Engine utilization until it ramps back up." The schedule caps TensorE's
    # utilization at this fraction of its peak when a burst begins, rising linearly to 1 over
    # the burst's first tensor_throttle_ramp_s of TensorE busy time; a burst ends when
    # TensorE's utilization over the last tensor_throttle_window_s was under
    # tensor_throttle_release_utilization. None: no throttle (trn1: the page gives no trn1
    # figure). Utilization is the peak's fraction of FLOPs, as the page's profile reports it
    # ("Active Throttled %: the percentage of the Tensor Engine's peak FLOPs (its
    # BF16-adjusted hardware maximum) that throttling made unavailable"), so a matmul that
    # uses less than the limit at its own rate (fp32's four passes, a contraction over 64
    # partitions, a few columns in the 64-cycle floor) is not slowed, and counts for its
    # share towards the release (cost/model.py tensor_utilization). False: every TensorE
    # instruction counts as the whole peak (the limit scales every duration; busy time
    # decides the release), the reading of 2026-12-03 (session 42), kept for comparison
    # (docs/cost-model.md "TensorE's current throttle").
    tensor_throttle_start_rate: float | None = 0.5
    tensor_throttle_ramp_s: float = 3e-6
    tensor_throttle_window_s: float = 3e-6
    tensor_throttle_release_utilization: float = 0.5
    tensor_throttle_by_flops: bool = True
    # ---- fixed cost of one launch (docs/cost-model.md "Launch cost") --------------------
    # Whole-kernel measurements include time no instruction of the kernel accounts for:
    # nki-library's QoR CycleCount (per physical core, max over cores) of its smallest
    # kernels sits tens of us above any instruction schedule, more at LNC=2 (mlp_cte
    # 578x1408x352 measures 1.01x faster at LNC=2). No AWS document gives the figure; both
    # numbers are [F], fitted by `calibrate.py --fit --nkilib PATH` on the train rows of
    # calibration/nkilib_qor.toml (its header says which) and checked on the rest. They
    # are NOT in Estimate.latency_us (the instruction stream: what a kernel costs inside a
    # larger compiled graph, and what the main job compares); Estimate.launch_us carries
    # them for comparisons with whole-launch measurements. nki-library's collector counts
    # "setup/teardown opcodes" in the CycleCount it reports, and a device-side time of a
    # whole tiny NEFF (nrtpy's tutorial: the NKI quickstart's add kernel, 3.2 us; row
    # device.quickstart_add_4x3_fp16) holds none of the 26 us.
    # 26 + 2 us until the refit of 2026-12-06 (trn2 VectorE 100 -> 150 cycles beside them),
    # 24 + 4 us until the refit of 2026-12-08 (trn2's DMA rule C), 26 + 5 us until the refit
    # that followed trn2's VectorE read off the v5 profile (the same day)
    launch_overhead_s: float = 27e-6       # [F] every launch
    second_core_launch_s: float = 4e-6     # [F] added when the launch runs on two physical cores
    # ---- finite buffering (cost/schedule.py "Buffers") ----------------------------------
    # Tiles allocated at the same place of a kernel (the same source line and call path) in
    # successive loop iterations share their site's physical buffers, rotated: as many as the
    # program keeps alive at once plus depth - 1 iterations' fills (a loop's single tile:
    # depth buffers, tile k waits for tile k - depth; until 2026-12-07 a site that fills
    # several tiles per iteration had only what it kept alive). The NKI migration guide
    # (nki/migration/index.rst): "the compiler could choose to allocate 2 physical tiles";
    # nki-library's allocator double-buffers ("interleave_degree=2").
    buffer_rotation_depth: int = 2
    # ---- the compiler that built a measured kernel ---------------------------------------
    # True only for ports of beta-1 kernels (calibrate.py, rows with compiler = "beta1"): their
    # nl.sequential_range loops are not software-pipelined (cost/schedule.py
    # beta1_sequential_edges). NKI 0.7's sequential_range is an alias of range: False.
    beta1_sequential_loops: bool = False
    # ---- uncertain cost parameters: (optimistic, pessimistic) --------------------------
    # The error bars of every modeled figure: cost.uncertainty re-runs the schedule with
    # all of these at their optimistic and at their pessimistic end (docs/cost-model.md
    # "Error bars"). Ranges: the spread of the public measurements behind each value.
    # Defaults are trn2's; trn1 has its own fixed-cost ranges (TRN1_STATIC_RANGES).
    cost_ranges: tuple[tuple[str, float, float], ...] = (
        # [M] the reading precision (+-2 %) of the two trn2 exp figures: 128x128 -> 342,
        # 4x4096 -> up to 445 cycles
        ("scalar_static_cycles", 340.0, 450.0),
        # [M] the v5 profile read with its own instruction count (5,403: 35) .. [P]'s "~100
        # cycles" (TRN2_VECTOR_STATIC_CYCLES says how; (100, 300) while it was fitted)
        ("vector_static_cycles", 35.0, 100.0),
        # [S] "roughly 150" GPSIMD_START, no measurement: the range VectorE's had (100, 300)
        ("gpsimd_static_cycles", 100.0, 300.0),
    ) + SHARED_COST_RANGES
    # The error the parameter ranges do not explain: the error bar's optimistic end is
    # multiplied by the first factor and its pessimistic end by the second
    # (cost.uncertainty.time_range). [F] benchmarks/calibrate.py fit_band: the factors that
    # put 90 % of nki-library's QoR train rows (whole-launch latencies measured on trn2)
    # inside their bar, 5 % falling out at each end (the parameter ranges alone hold 32 of
    # the 68 measured ones since trn2's VectorE range narrowed on 2026-12-08, more before); the
    # same band serves every generation (no other generation has
    # whole-kernel train rows). (0.90, 1.17) until the refit of 2026-12-06, (0.92, 1.14)
    # until the refit of 2026-12-08 (trn2's DMA rule C), (0.88, 1.14) until trn2's VectorE
    # was read off the v5 profile (its range narrowed from (100, 300) to (35, 100) cycles, so
    # the parameter ranges alone hold fewer rows). docs/cost-model.md "Error bars".
    model_error_band: tuple[float, float] = (0.88, 1.17)

    # ---- ISA limits the simulator's rules check (isa/, language/) ------------------------
    # Defaults are trn2's; each generation overrides what its docs say differs. Sources
    # (docs/hardware.md "ISA limits"): [I] the instruction's beta-2 docstring in
    # nki/api/nki/isa/__init__.py; [A1] the Trainium/Inferentia2 architecture guide, "Data
    # streaming"; [L] "Using Logical Neuron Cores (LNC)" and the Trainium2 chip page.
    # Start partition of an on-chip access [A1]: more than two quadrants start at 0, more
    # than one at 0 or at two quadrants, otherwise at a quadrant boundary and within it.
    partition_quadrant: int = 32
    # nc_matmul [I]: the 128x128 PE array bounds the contraction (partition) dim and the
    # stationary free size unless tiling mode (tile_position/tile_size) picks a smaller tile.
    matmul_rows: int = 128
    matmul_columns: int = 128
    matmul_tile_sizes: tuple[int, ...] = (32, 64, 128)   # 2x64 tiles from v2, 4x32 from v3
    # Tiling mode lets "multiple nc_matmul instructions with a stationary tile size smaller
    # than [128, 128] ... run in parallel" (v2.33 nki.isa.nc_matmul, "Tiling mode"): with it
    # on, the schedule runs TensorE instructions on disjoint PE tiles (the array in cells of
    # the smallest tile size) at the same time (cost/schedule.py).
    matmul_tiles_parallel: bool = True
    matmul_moving_fmax: int = 512          # moving free size with an fp32 dst (one PSUM bank)
    matmul_moving_fmax_bf16_dst: int = 512  # with a bf16 dst (v4 only allows that dst)
    matmul_dst_dtypes: tuple[str, ...] = ("float32",)
    matmul_dtypes: tuple[str, ...] = ("float8_e4m3", "float8_e5m2", "bfloat16", "float16",
                                      "tfloat32", "float32")
    # is_transpose=True also moves these (the simulator's reading of nc_transpose's "any
    # dtype" for the matmul form nki-library uses with uint8/int8/bf16 identities):
    matmul_transpose_dtypes: tuple[str, ...] = ("uint8", "int8", "bfloat16")
    matmul_double_row: bool = True         # fp8 perf_mode double_row, from v3
    # accumulate=True onto PSUM a memset/copy initialised: undefined on v2/v3, allowed on v4
    matmul_accumulate_onto_copies: bool = False
    transpose_tensor_max: int = 128        # [I] nc_transpose: TensorE [128, 128] or smaller
    transpose_vector_max: int = 32         # [I] nc_transpose: VectorE [32, 32] or smaller
    # [I] dma_transpose: the permutation of a 2-D, 3-D and 4-D source
    dma_transpose_axes: tuple[tuple[int, ...], ...] = ((1, 0), (2, 1, 0), (3, 1, 2, 0))
    dma_compute_max_sources: int = 16      # [I] dma_compute: "max number of source tensors"
    bn_stats_fmax: int = 512               # [I] bn_stats: elements per partition
    max8_min_elems: int = 8                # [I] max8: elements per partition read,
    max8_max_elems: int = 16384            #     between 8 and 16,384 inclusive
    scalar_engine_copy: bool = True        # [I] tensor_copy on ScalarE: not on v2
    activation_scalar_bias: bool = True    # [I] activation: a scalar bias from v3 (v2: (P, 1) tile)
    has_range_select: bool = True          # [I] range_select: v3 and newer
    max_logical_cores: int = 2             # [L] LNC=2 from Trainium2; trn1 runs LNC=1 only
    # [I] quantize_mx / nc_matmul_mx: "Available only on NeuronCore-v4 and newer"
    has_mx: bool = False
    mx_group_partitions: int = 8           # [I] quantize_mx: groups of "8 partitions x 4 elements"
    # MX deep dive "Packing Scale Values": "Quantize-MX and Matmul-MX support writing/reading
    # scales at an offset of 0, 4, 8, or 12 within each [quadrant]" (its example slices the
    # scale tile from partition 4)
    mx_scale_quadrant_offsets: tuple[int, ...] = (0, 4, 8, 12)
    # [A3] "MX data-type Quantization": QuantizeMX "can quantize four input elements per
    # partition, per cycle (i.e., 4x Vector performance mode)"
    quantize_mx_elems_per_lane: int = 4
    # [A2] [A3] "Compute Engine Specifications": VectorE moves 512 BF16/FP16(/FP8 on v4)
    # elements per cycle (vector_perf_mode_full per lane) and "256 input/output for other data
    # types" (2 per lane). v4's exponential runs at that width (cost/model.py)
    vector_other_elems_per_lane: int = 2

    def static_cycles(self, engine: str) -> float:
        """Fixed cycles of one ``engine`` ("vector" | "scalar" | "gpsimd") instruction."""
        return {"vector": self.vector_static_cycles, "scalar": self.scalar_static_cycles,
                "gpsimd": self.gpsimd_static_cycles}[engine]

    def hbm_share(self, cores: int) -> float:
        """Share of its DMA bandwidth each of ``cores`` physical cores streaming together gets
        from the HBM stack they share: min(1, stack / (cores x dma_bytes_per_s)); 1 for one
        core (cost/schedule.py charges every HBM transfer of a launch at it; roofline.py
        caps the limits with it)."""
        if cores <= 1:
            return 1.0
        return min(1.0, self.hbm_stack_bytes_per_s / (cores * self.dma_bytes_per_s))

    @property
    def generation(self) -> int:
        """NeuronCore version number: 2 (trn1), 3 (trn2), 4 (trn3)."""
        return int(self.neuron_core[1:])


TARGETS: dict[str, Target] = {
    "trn1": Target(
        name="trn1", neuron_core="v2",
        partitions=128, sbuf_bytes_per_partition=192 * KIB,
        psum_banks=8, psum_bank_bytes=2 * KIB,
        tensor_hz=2.8e9, vector_hz=1.12e9, scalar_hz=1.4e9, gpsimd_hz=1.4e9,
        tensor_peak_bf16_flops=92e12, tensor_peak_fp32_flops=23e12,
        scalar_elems_per_cycle=128,
        dma_bytes_per_s=272e9, dma_queues=16,
        # [A1] "2 HBM stacks ... 820 GB/s": the chip's total for its two cores, not a stack's
        # ([C] says "820 GiB/sec"); no LNC=2 on trn1, so it never binds
        hbm_stack_bytes_per_s=820e9,
        # [A2] transpose mode and VectorE performance mode are new in NeuronCore-v3.
        transpose_fp32_factor=4, vector_perf_mode_full=1, vector_perf_mode_half=1,
        strided_access_factor=2.0,
        # [X] gives the TensorE current throttle for Trn2 and Trn3 only
        tensor_throttle_start_rate=None,
        vector_static_cycles=400.0, scalar_static_cycles=100.0, gpsimd_static_cycles=400.0,
        vector_overlap_cycles=320.0,
        cost_ranges=TRN1_STATIC_RANGES + SHARED_COST_RANGES,
        # [I] NeuronCore-v2: no 32-row matmul tiles, no fp8 double_row, no ScalarE copy,
        # no scalar activation bias, no range_select; [L] no LNC=2.
        matmul_tile_sizes=(64, 128), matmul_double_row=False, scalar_engine_copy=False,
        activation_scalar_bias=False, has_range_select=False, max_logical_cores=1,
    ),
    "trn2": Target(
        name="trn2", neuron_core="v3",
        partitions=128, sbuf_bytes_per_partition=224 * KIB,
        psum_banks=8, psum_bank_bytes=2 * KIB,
        tensor_hz=2.4e9, vector_hz=0.96e9, scalar_hz=1.2e9, gpsimd_hz=1.2e9,
        tensor_peak_bf16_flops=79e12, tensor_peak_fp32_flops=20e12,
        scalar_elems_per_cycle=128,
        dma_bytes_per_s=368e9, dma_queues=16,
        # [D] round robin across queues, a queue per allocation site; [A2] ~600 ns per
        # hardware-DGE instruction, one generator per core (docs/cost-model.md "DMA")
        dma_site_queues=16, dma_descriptor_generation_s=6e-7,
    ),
    "trn3": Target(
        name="trn3", neuron_core="v4",
        partitions=128, sbuf_bytes_per_partition=256 * KIB,
        psum_banks=8, psum_bank_bytes=2 * KIB,
        tensor_hz=2.4e9, vector_hz=1.2e9, scalar_hz=1.2e9, gpsimd_hz=1.2e9,
        # [A3] "79 BF16/FP16/TF32 and 20 FP32 TFLOPS" (the trn3 guide), as trn2's
        tensor_peak_bf16_flops=79e12, tensor_peak_fp32_flops=20e12,
        scalar_elems_per_cycle=256,
        dma_bytes_per_s=528e9, dma_queues=16,
        # as trn2's ([A2]'s DGE page covers NeuronCore-v3 and later)
        dma_site_queues=16, dma_descriptor_generation_s=6e-7,
        # [C] 4.9 TB/s over the 4 stacks of [A3] (which says 4.7 TB/s: 1.18 TB/s per stack)
        hbm_stack_bytes_per_s=1.225e12,
        # [I] NeuronCore-v4: the moving tile may fill all 8 PSUM banks (4096 fp32 / 8192
        # bf16 elements), dst may be bf16, OCP float8_e4m3fn operands, accumulate onto
        # value-initialised PSUM.
        matmul_moving_fmax=4096, matmul_moving_fmax_bf16_dst=8192,
        matmul_dst_dtypes=("float32", "bfloat16"),
        matmul_dtypes=("float8_e4m3", "float8_e5m2", "bfloat16", "float16", "tfloat32",
                       "float32", "float8_e4m3fn"),
        matmul_accumulate_onto_copies=True, has_mx=True,
        # no trn3 measurement: trn2's fixed costs and their ranges (the defaults)
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

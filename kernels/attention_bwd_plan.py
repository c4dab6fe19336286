"""What one attention-backward launch is and how it is cut (``BwdPlan``), and the running
VectorE / ScalarE load estimate that places its PSUM copies (``BwdBalance``).

Nothing here issues instructions. See attention_bwd.py for the loops these drive. Like the
forward's planner (attention_plan.py, which says why), the estimates charge every VectorE
instruction its whole fixed cost (``vector_instr_cycles``).

* key blocks of ``kb`` keys: S and dP of one (query tile, head) sit in PSUM tiles of
  their own ([128, kb] fp32 each: half a bank at kb = 256, a bank at 512) and the block's dK | dV
  accumulators ([128, kb / 128, D + Dv] fp32) stay in PSUM while the chunk's query tiles
  stream past. 512 keys when D + Dv <= 256 (the accumulators take 2 banks), else 256:
  with the dSᵀ and dQ tiles and one of each in flight the launch stays within 8 banks.
* query chunks of ``q_chunk`` tiles: the query side of a chunk (Qᵀ, dOᵀ, Q, dO, O rows,
  D_i, -lse and the fp32 dQ accumulators of every query head of the kv head) stays in
  SBUF while the key blocks stream (budget Q_SIDE_BUDGET); several chunks only for long
  sequences, whose dK | dV partial sums then go through an fp32 HBM scratch.
"""

from dataclasses import dataclass

import nki.language as nl

from .attention_launch import FP32_BYTES, P, PSUM_BANK_BYTES
from .engine_balance import VectorScalarBalance
from .engine_costs import active as active_engine_costs
from .tiling import cdiv

# Keys per block: S and dP of one (query tile, head) in PSUM tiles of their own ([128, kb]
# fp32 each: half a bank at 256 keys, a bank at 512). 512 when D + Dv <= 256 (then the dK | dV
# accumulators of one kv head, [128, 4, D + Dv] fp32, fit KV_ACC_BANKS), else 256: longer
# instructions spread each one's fixed cost, and dQ is summed over fewer blocks.
KV_BLOCK = 256
KV_BLOCK_WIDE = 512
WIDE_MAX_DK_DV = 256
# PSUM banks of the dK | dV accumulators of a kv batch (the kv heads accumulated together).
# With S | dP (1), the dSᵀ tile (1), the dQ tile (1) and an fp32 transpose bank of the
# loads (1) the launch's peak stays at 6 of the 8 banks, 2 left for the allocation
# rotation to overlap consecutive heads.
KV_ACC_BANKS = 2
# Query tiles per load group of a long chunk (16-bit, head dims <= 128): ~0.5 MB per
# transfer at 4 heads x 128 dims (data-bound, well past the 0.85 us DMA gap), and the first
# group's compute starts after a quarter of a 16-tile chunk's loads.
LOAD_GROUP_TILES = 4
# PSUM banks of a head batch's dSᵀ tile outside folded mode (S | dP 2, dK | dV 2, dQ 1):
# more heads per PSUM copy.
DST_BANKS = 2
# Share of the head batches whose dSᵀ is made by SBUF->SBUF DMA transposes instead of
# TensorE transposes + a PSUM copy (16-bit data, not folded), by the size of the
# transposes. A DMA transfer holds each of the 16 queues at least the DMA gap
# (engine_costs.py: occupancy max(gap, data + hand-over)), so transposes whose data takes
# less than the gap pay for time they move nothing in, on the queues that also bring the
# query and key sides in.
# - one head batch over a full key block data-bound (query-head groups, e.g. Llama's 4
#   heads x 512 keys): every batch by DMA. Modeled Llama S=2048 causal GQA bf16 backward
#   (trn2, LNC=2): 239.9 us at 1, 287.7 at 0.75, 292.9 at 0 (a TensorE dSᵀ tile of 2 PSUM
#   banks leaves S and dP one buffer each);
# - else (one query head per batch: multi-head attention with 512-key blocks), half of
#   the batches whose transposes hold the queues at most twice their data time
#   (BwdBalance.use_dma), none of the others (tail key blocks, short query tiles).
#   Modeled (same target), all-DMA -> this rule: SigLIP B=2 H=16 S=729 D=72 369.4 ->
#   273.0 us; B=4 H=16 S=577 D=80 499.2 -> 408.2; B=2 H=8 S=512 D=128 92.3 -> 89.8;
#   B=2 H=16 S=1024 D=96 causal 359.8 -> 311.7. Half of those batches rather than a
#   quarter or three quarters: 273.0 / 408.2 / 89.8 against 276.1 / 421.1 / 94.9 and
#   280.5 / 414.8 / 89.8. (One share for every batch, before the filter: 290.1 / 432.3 /
#   89.8 at 0.5.)
# Folded mode (bf16, no mask, not causal; kb = 256) follows the same rule with two or more
# key blocks; with one it keeps TensorE (_dst_dma_share). Modeled, TensorE -> this rule:
# B=1 H=16 S=1024 D=64 211.9 -> 188.1 us; S=257 75.2 -> 69.2; S=512 99.3 -> 89.0;
# S=577 141.6 -> 124.6; S=1500 219.0 -> 198.0; D=96 S=577 185.5 -> 180.8. One block with
# the rule instead: ViT-B/16 B=8 81.6 -> 105.3 (DMA 57 -> 98 us busy), ViT-L 102.7 ->
# 136.1, ViT-B batch 1 25.8 -> 27.5, S=256 71.4 -> 74.8.
DST_DMA_SHARE = 1.0
DST_DMA_SHARE_GAP_BOUND = 0.5
# Per-partition SBUF budgets (trn2: 224 KiB per partition usable by kernels; trn1: 192): the query
# side of a unit's chunk (resident while the key blocks stream), and the key side of one
# block of the unit's kv heads (Kᵀ, Vᵀ, K rows); the rest holds the per-head scratch (P,
# dS, dP - D_i, dSᵀ, the masked-score tile: < 8 KiB) and the allocation rotation's next
# block.
Q_SIDE_BUDGET = 112 * 1024
# Folded mode (bf16, no mask, not causal, D and Dv multiples of 32 with 3 rows to spare):
# -lse / scale and -D_i ride as 3 extra contraction rows of Qᵀ / dOᵀ (an exact bf16
# hi + mid + lo triple; Kᵀ / Vᵀ get 3 rows of ones), so S - lse/scale and dP - D_i come
# out of TensorE and the exp / dS of FOLD_PAIR heads are one instruction each. A tile of
# <= 32 partitions starts at partition 0, 32, 64 or 96 (NKI tile rules), hence D % 32 == 0.
FOLD_ROWS = 3
FOLD_QUADRANT = 32
FOLD_PAIR = 4            # heads per S'' / dP'' PSUM tile: [128, 4, 256] fp32 (2 banks)
FOLD_RING = 2            # extended Kᵀ / Vᵀ tile pairs the key blocks rotate through
KV_SIDE_BUDGET = 32 * 1024
# At most this many kv heads per unit: a unit's first compute waits for its whole query
# side, and the next unit's loads overlap this one's compute, so smaller units pipeline
# better; larger ones move more per DMA transfer (a transfer holds each of its queues
# >= 0.85 us, the DMA gap of engine_costs.py: a [128, heads, 64] bf16 row tile needs ~20
# heads to be data-bound). Modeled ViT-B/16 batch 8 bf16 backward (trn2, LNC=2, units
# cdiv(48, n) per core): 85 us at 12, 76 at 16, 88 at 24.
UNIT_MAX_KV_HEADS = 16


@dataclass(frozen=True)
class BwdPlan(nl.NKIObject):
    """Static cut of one backward launch (module docstring), from the launch's facts."""

    kb: int                  # keys per block
    n_kb: int                # key blocks
    kt: int                  # 128-key tiles per block (kb / 128)
    kv_group: int            # kv heads per unit (loads and stores move all of them at once)
    q_chunk: int             # query tiles per chunk
    n_chunks: int            # chunks per unit
    kv_batch: int            # kv heads whose dK | dV accumulate in one PSUM tile
    kv_slot: int             # fp32 columns of one (key tile, kv head) dK | dV slot (kv_slot_width)
    head_batch: int          # query heads whose dSᵀ and dQ share one PSUM tile each
    folded: bool             # -lse and -D_i folded into the matmuls (FOLD_ROWS)
    dst_dma_share: float     # share of the head batches whose dSᵀ the DMA transposes


def kv_slot_width(width):
    """fp32 columns a (key tile, kv head) slot of the dK | dV accumulator takes for
    ``width`` = D + Dv <= 512 columns: ``width`` rounded up to a power of two, so the slots
    tile each PSUM bank (512 fp32) exactly and none straddles two. Each dK or dV matmul
    writes into one slot, and "each nc_matmul can only write to a single PSUM bank"
    (aws-neuron-sdk nki/guides/architecture/trainium_inferentia2_arch.rst); until session 69
    the slots were packed at D + Dv, and head dims such as 72 (144 columns) had slots across
    a bank boundary, which the simulator did not refuse then. D = Dv = 64 or 128 (128 or 256
    columns) keep their packing."""
    return 1 << (width - 1).bit_length()


def q_side_bytes(facts):
    """SBUF bytes per partition of one (query head, query tile) of a chunk: Qᵀ and dOᵀ (one
    row of 128 per head-dim piece), Q, dO and O rows, the fp32 dQ accumulator, the fp32
    dO ⊙ O product (D_i), D_i, -D_i and -lse."""
    f = facts
    isz = f.itemsize
    return ((cdiv(f.D, P) + cdiv(f.Dv, P)) * P * isz + (f.D + 2 * f.Dv) * isz
            + (f.D + f.Dv) * FP32_BYTES + 3 * FP32_BYTES)


def bwd_plan(facts, q_chunk=0):
    """The ``BwdPlan`` of a launch (``facts``: attention_launch.LaunchFacts); ``q_chunk`` > 0
    forces the query tiles per chunk (and one kv head per unit)."""
    f = facts
    folded = (str(f.dtype) == "bfloat16" and f.mask_kind is None and not f.causal and f.scale != 0
              and f.D % FOLD_QUADRANT == 0 and f.D + FOLD_ROWS <= P
              and f.Dv % FOLD_QUADRANT == 0 and f.Dv + FOLD_ROWS <= P)
    kb = KV_BLOCK_WIDE if f.D + f.Dv <= WIDE_MAX_DK_DV and not folded else KV_BLOCK
    kb = min(kb, max(1, cdiv(f.Sk, P) * P))
    kt = cdiv(kb, P)
    n_kb = cdiv(f.Sk, kb)
    per_head_tile = q_side_bytes(f)
    per_kv_head = f.G * f.n_q_tiles * per_head_tile
    kv_bytes = (cdiv(f.D, P) + cdiv(f.Dv, P)) * kb * f.itemsize + kt * f.D * f.itemsize
    if q_chunk > 0 or per_kv_head > Q_SIDE_BUDGET:
        kv_group = 1
        chunk = q_chunk if q_chunk > 0 else max(1, Q_SIDE_BUDGET // (f.G * per_head_tile))
    else:
        kv_group = max(1, min(f.Hkv, Q_SIDE_BUDGET // per_kv_head, KV_SIDE_BUDGET // kv_bytes, UNIT_MAX_KV_HEADS))
        chunk = f.n_q_tiles
    chunk = max(1, min(f.n_q_tiles, chunk))
    slot = kv_slot_width(f.D + f.Dv)
    kv_batch = max(1, min(kv_group, KV_ACC_BANKS * PSUM_BANK_BYTES // (kt * slot * FP32_BYTES)))
    # the dSᵀ tile of a head batch takes up to 2 banks where PSUM has room (not in folded
    # mode, whose S'' | dP'' tiles take 4), the dQ tile one
    tp_banks = 1 if folded else DST_BANKS
    # (at most the query heads of a kv batch: a larger dSᵀ tile would hold PSUM banks no
    # head uses; multi-head attention with one kv head per batch has one head per batch)
    head_batch = max(1, min(tp_banks * PSUM_BANK_BYTES // (kt * P * f.itemsize),
                            PSUM_BANK_BYTES // (f.D * FP32_BYTES), kv_batch * f.G))
    return BwdPlan(kb=kb, n_kb=n_kb, kt=kt, kv_group=kv_group, q_chunk=chunk,
                   n_chunks=cdiv(f.n_q_tiles, chunk), kv_batch=kv_batch, kv_slot=slot, head_batch=head_batch,
                   folded=folded, dst_dma_share=_dst_dma_share(f, kb, n_kb, head_batch, folded))


def _dst_dma_share(facts, kb, n_kb, head_batch, folded):
    """DST_DMA_SHARE if one head batch's dSᵀ transposes over a full key block are
    data-bound on the DMA queues (their data outlasts the transfer gap and the descriptor
    generation: EngineCosts.dma_occupancy_ns), else
    DST_DMA_SHARE_GAP_BOUND; 0 where dSᵀ never goes by DMA: fp32, and folded mode with one
    key block. Folded mode halves the VectorE/ScalarE work per score, so with one key
    block (Sk <= 256: ViT) the query and key sides' loads alone keep the DMA queues the
    busiest engine, and the transposes would only lengthen them; every further key block
    adds compute for the same query side."""
    if not facts.dma_transpose or (folded and n_kb == 1):
        return 0.0
    c = active_engine_costs()
    data_ns = c.dma_transpose_ns(head_batch * P * min(kb, facts.Sk) * facts.itemsize)
    data_bound = c.dma_occupancy_ns(data_ns) <= data_ns + c.dma_transfer_handoff_ns
    return DST_DMA_SHARE if data_bound else DST_DMA_SHARE_GAP_BOUND


class BwdBalance(nl.NKIObject):
    """Running VectorE / ScalarE (``loads``: engine_balance.VectorScalarBalance) and GpSimd
    busy-time estimates of one backward program (ns), in issue order, and the engines work
    either can do goes to: those that keep the estimates most even (greedy list schedule)."""

    def __init__(self, facts, plan):
        self.costs = active_engine_costs()
        # spreading the share of the head batches whose dSᵀ the DMA transposes
        # (plan.dst_dma_share)
        self.loads = VectorScalarBalance(plan.dst_dma_share)
        self.gpsimd_ns = 0.0
        self.slot = -1
        self.itemsize = facts.itemsize

    def use_dma(self, nu, r, m):
        """Whether the next head batch's dSᵀ (nu heads, r rows, m keys) is made by DMA
        transposes (dma_share, spread). Below an all-DMA share, a batch whose transposes
        would hold the queues more than twice as long as their data takes goes to TensorE."""
        if 0 < self.loads.dma_share < 1:
            data = occ = 0.0
            for keys in (m // P * P, m % P):
                if keys:
                    d = self.costs.dma_transpose_ns(nu * r * keys * self.itemsize)
                    data += d
                    occ += self.costs.dma_occupancy_ns(d)
            if 2 * data < occ:
                return False
        return self.loads.spread_share()

    def next_slot(self):
        """Index of the next extended Kᵀ / Vᵀ ring slot (folded mode)."""
        self.slot = (self.slot + 1) % FOLD_RING
        return self.slot

    def charge(self, vector_cycles=0.0, scalar_cycles=0.0):
        """Account work that must run on VectorE / ScalarE (estimated cycles)."""
        self.loads.charge(vector_cycles, scalar_cycles)

    def pick(self, vector_cycles, scalar_cycles):
        """Engine for a PSUM -> SBUF copy either can do (VectorScalarBalance.pick)."""
        return self.loads.pick(vector_cycles, scalar_cycles)

    def copy_cycles(self, elems, sixteen):
        """(VectorE, ScalarE) cycles of a PSUM -> SBUF copy (VectorScalarBalance.copy_cycles)."""
        return self.loads.copy_cycles(elems, sixteen)

    def charge_gpsimd(self, cycles):
        """Account GpSimd work (estimated cycles, at GpSimd's clock)."""
        self.gpsimd_ns += cycles / self.costs.gpsimd_ghz

    def pick_ds(self, m):
        """How dS = (dP - D_i) ⊙ P of m columns is made (attention_bwd._ds): 0 VectorE alone
        (one scalar_tensor_tensor with dP in PSUM: one pass, the cost model's rule for one
        input in PSUM), 1 ScalarE dP - D_i out of PSUM then GpSimd multiplies (2 input
        passes, both in SBUF); the way whose busier engine ends earlier. (Until session 61
        the VectorE way was charged 2 passes, the model's rule before 2026-12-02, so the
        ScalarE way was taken more often than the model's figures say it pays.)"""
        c, loads = self.costs, self.loads
        vector = loads.vector_ns + (m + c.vector_instr_cycles) / c.vector_ghz
        scalar = loads.scalar_ns + (m + c.scalar_instr_cycles) / c.scalar_ghz
        gpsimd = self.gpsimd_ns + (m / c.gpsimd_two_input_rate() + c.gpsimd_instr_cycles) / c.gpsimd_ghz
        if vector <= max(scalar, gpsimd):
            loads.vector_ns = vector
            return 0
        loads.scalar_ns, self.gpsimd_ns = scalar, gpsimd
        return 1

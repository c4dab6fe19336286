"""What one attention launch is, fixed before its first instruction: ``LaunchFacts``
(shapes, layout, dtype, mask kind, head grouping, query chunking, which path runs) and
``LaunchTensors`` (the HBM arguments and the SBUF tiles that live for the whole launch).

Nothing here issues instructions.
"""

from dataclasses import dataclass

import nki.language as nl

from .limits import ATTENTION_MAX_HEAD_DIM as MAX_HEAD_DIM
from .tiling import PARTITIONS, cdiv, itemsize

P = PARTITIONS
# One PSUM bank per partition: 2 KiB, i.e. 512 fp32 (one matmul output at most).
PSUM_BANK_BYTES = nl.tile_size.psum_bank_fmax_bytes
PSUM_BANK_FP32 = nl.tile_size.psum_bank_fmax
PSUM_BANKS = nl.tile_size.psum_num_banks    # PSUM banks per partition (16 KiB / 2 KiB on trn1-trn3)
MATMUL_MAX_N = nl.tile_size.gemm_moving_fmax   # moving free size of one nc_matmul (512)
# flash: keys per block. A [128, 2048] fp32 score row takes 4 of the 8 PSUM banks (two
# rotating 2-bank pieces, attention_blocks.S_PIECE_KEYS), the same budget as the single pass
# (limits.ATTENTION_SINGLE_PASS_MAX_KEYS).
KEY_BLOCK = 2048
# Unmasked head batches (single pass): PSUM banks for the scores of the batch's heads side
# by side, and for their outputs O | rowsum; with up to 2 banks of Pᵀ blocks in flight the
# batch uses at most the 8 banks.
S_BANKS = 4
O_BANKS = 2
# Per-partition SBUF budgets for what stays resident while a head group is processed
# (224 KiB per partition on trn2; the rest holds per-tile scratch and the next group's
# prefetch): the group's Kᵀ and V (KV_BUDGET), its query chunk's Qᵀ and outputs (Q_BUDGET).
KV_BUDGET = 48 * 1024
Q_BUDGET = 48 * 1024
FP32_BYTES = 4
# Per (query head, query tile) and partition, besides Qᵀ and the output: fp32 O | rowsum of
# the flash accumulator, and 8 bytes of row statistics (the running -max takes 4).
ROW_STATS_BYTES = 8
# Transposed-scores path (attention_transposed.py): rows D..D+2 of Qᵀ/Kᵀ carry the row max
# split into three bf16 terms hi + mid + lo (exactly the fp32 max: 3 x 8 significant bits),
# so D + 3 <= 128. Only DMAs write those rows (a tile of <= 32 partitions that an engine
# writes must start at partition 0, 32, 64 or 96, NKI tile rules; DMAs may start anywhere),
# so D need not be a multiple of 32 (until session 61 it had to be: D in {32, 64, 96}).
# Up to TS_SHORT_KEY_TILES key tiles (384 keys: ViT, DeiT, DINOv2, CLIP at 224) always; up
# to TS_MAX_KEY_TILES (768 keys: CLIP-L/14 at 336, SigLIP so400m at 384) only where each
# core has at least TS_LONG_MIN_HEADS query heads: the row max's hi + mid + lo reach Qᵀ
# through an SBUF->SBUF DMA (a DMA latency) per query tile, which a batch of heads' exps
# covers and one or two heads' do not. Modeled trn2, bf16 (session 61), us, single pass ->
# transposed: LNC=2 B=2 H=16 S=729 D=72 (SigLIP so400m at 384) 149.4 -> 127.0, B=8 H=16
# S=577 D=64 375.9 -> 292.2, B=2 H=8 S=640 D=32 58.9 -> 49.9 (trn3: 126.4 -> 118.7, 331.1 ->
# 284.5, 50.8 -> 47.3); but B=1 H=2 S=729 D=72 (one head per core) 17.0 -> 23.0, B=1 H=4
# (two) 24.2 -> 28.0, B=1 H=8 (four) 42.6 -> 38.4; at LNC=1 B=1 H=4 (four per core) 42.5 ->
# 38.4, B=1 H=2 24.2 -> 28.0. At 1024 keys (8 key tiles, Sᵀ one key tile per exp) trn2
# gains but trn3 loses: B=2 H=16 S=1024 D=72 trn2 263.6 -> 235.6, trn3 206.9 -> 225.2;
# B=2 H=6 S=1024 D=125 trn2 116.3 -> 101.1, trn3 91.2 -> 97.6; so the path stops at 768.
TS_EXTRA_ROWS = 3
# Up to this many key tiles one PSUM tile holds a batch's Sᵀ of every key tile (one exp per
# batch); longer rows take Sᵀ in groups of key tiles (attention_transposed._ts_st_group) and
# split the row max into hi + mid + lo per batch of heads on every query tile
# (attention_plan.EngineBalance.hilo_per_batch).
TS_ONE_ST_KEY_TILES = 2
TS_SHORT_KEY_TILES = 3
TS_MAX_KEY_TILES = 6
TS_LONG_MIN_HEADS = 4
NEG_INF = float("-inf")       # additive mask value of a masked key
# Decode path (attention_decode.py: keys on partitions): at most this many query rows per
# (batch, head). Modeled trn2 LNC=2, bf16, d = 128, B=4 kv heads 1, S=2048, no mask: 32 rows
# (G=4, Sq=8) 18.2 -> 16.9 us on this path; 64 rows (G=8, Sq=8) 18.5 -> 21.5, so unmasked
# launches of 64 rows stay on the row-tile paths.
DECODE_MAX_ROWS = 32
# Masked launches (key padding, or per-row masks such as speculative decoding's causal
# active tokens) take the decode path up to DECODE_MASKED_MAX_ROWS rows as long as a pair's
# scores hold at most DECODE_MASKED_WIDE_SCORES rows x 128-key tiles (past 32 rows): under a
# mask the row-tile paths' rows take two more VectorE passes and lose their head batches,
# and the decode path's per-lane work (rows x key tiles per pass) stays below theirs (Sk per
# pass on the query rows' lanes). Modeled trn2 LNC=2, bf16, causal active mask, central
# (error bar) us, row-tile -> decode: B=4 H=8/1kv s=7 S=3072 D=64 (56 rows) 28.1 (23.4-38.2)
# -> 23.4 (16.3-33.6), B=4 H=10/1kv s=5 S=5376 D=64 (50 rows) 39.9 (32.9-52.7) -> 32.1
# (26.1-46.3) (attention_tkg: 27.6 (21.5-40.7), 37.5 (30.6-54.6)), B=4 H=8/1kv s=8 S=3072
# D=128 (64 rows) 30.1 (25.4-40.4) -> 25.6 (20.4-39.7). Beyond the budget the decode path's
# passes catch up: 56 rows at 16384 keys, D = 64, 89.8 (78.2-117.2) -> 89.9 (73.2-128.6); 64
# rows at 8192 keys 52.5 (44.8-68.9) -> 54.2 (42.6-77.8).
# Unmasked launches keep 32 rows: the row-tile paths batch unmasked heads in one pass
# (B=4 H=8/1kv s=8 S=2048 D=64 15.7 against 17.9). Of 112 masked grid shapes with 40-64
# rows the rule moved 84: 77 faster at the central value and both ends, 7 faster at the
# central value only (docs/attention.md "Decode path" names them).
DECODE_MASKED_MAX_ROWS = 64
DECODE_MASKED_WIDE_SCORES = 56 * 48
# Up to DECODE_RESIDENT_KEYS keys, Kᵀ and V of a batch of pairs stay in SBUF (several pairs
# share the fixed costs); beyond, one pair at a time with Kᵀ streamed in blocks, one pair
# ahead, and V, the scores and Pᵀ resident, as long as those take at most
# DECODE_STREAM_BYTES per partition (two pairs in flight: 160 KiB of trn2's 224; bf16
# Dv = 128 and 5 rows: 36608 keys, decode_streamed_bytes). Modeled trn2 LNC=2, key padding, central / optimistic
# us with the limit at 8192 -> 2048: B=4 H=1/1kv s=5 S=7168 30.3 / 28.3 -> 27.4 / 25.0;
# S=3072 17.0 / 15.1 -> 15.9 / 12.7; B=8 H=4/1kv S=4096 31.2 / 28.0 -> 31.0 / 27.9. At
# 1024 the 2048-key rows lose (B=1 H=4/1kv 9.6 -> 11.3).
DECODE_RESIDENT_KEYS = 2048
DECODE_STREAM_BYTES = 80 * 1024
# A streamed pair's Kᵀ comes in DMA transposes of DECODE_STREAM_BLOCK_BYTES where the caps
# allow (at most DECODE_STREAM_MAX_KEYS keys, 8 KiB per partition in 16 bits, and one PSUM
# bank of the block's scores, 512 // rows key tiles: past 16 rows a D = 64 block is 256 KiB
# still, and at D <= 32 the key cap holds it below): each transfer holds its queues for the
# transfer gap at least (0.85 us, 1.3 at the error bar's pessimistic end: docs/cost-model.md
# "DMA"), so smaller ones are gap-bound. 2048 keys at D = 128 (until 2026-12-07 every D),
# 4096 at D = 64. Modeled trn2 LNC=2, central (error bar) us, 2048 -> 4096 keys at D = 64:
# B=4 H=3/1kv s=7 S=16384 51.3 (45.1-74.6) -> 51.4 (45.1-68.6), B=4 H=1/1kv s=5 S=10240 24.8
# (20.0-38.1) -> 24.4 (20.0-34.9). At D = 128 4096 keys were mixed (B=1 H=4/1kv S=8192 17.2 -> 17.7, B=1 H=8/1kv
# S=24576 31.1 -> 29.3), so D = 128 keeps 2048.
DECODE_STREAM_BLOCK_BYTES = 512 * 1024
DECODE_STREAM_MAX_KEYS = 4096


def decode_stream_key_tiles(D, isz, n):
    """128-key tiles per streamed Kᵀ block of a decode pair with ``n`` score columns per key
    tile (DECODE_STREAM_BLOCK_BYTES, DECODE_STREAM_MAX_KEYS, one PSUM bank of scores)."""
    by_bytes = cdiv(DECODE_STREAM_BLOCK_BYTES, P * D * isz)
    return max(1, min(by_bytes, DECODE_STREAM_MAX_KEYS // P, PSUM_BANK_FP32 // n))


@dataclass(frozen=True)
class LaunchFacts(nl.NKIObject):
    """Static facts of one launch, derived from the HBM arguments (see ``launch_facts``).

    A frozen NKI object (NKI language guide, "Class Support": classes used in a kernel
    inherit from ``nl.NKIObject`` and nothing else; frozen as nki-library's configuration
    objects are). Field names follow the kernel docstring's dimensions.
    """

    B: int
    H: int
    Hkv: int
    G: int                   # query heads per kv head (H // Hkv)
    Sq: int
    Sk: int
    D: int
    Dv: int
    layout: str              # "bhsd" | "bshd"
    dtype: object            # q/k/v dtype: matmul operands and P use it
    itemsize: int            # bytes per element of dtype
    scale: float
    causal: bool
    mask_kind: object        # None | "key" ([Bm, Sk]) | "full" ([Bm, Hm, Sq, Sk])
    mask_batches: int        # Bm (0 without a mask)
    mask_heads: int          # Hm of a full mask (1 otherwise)
    mask_per_head: bool      # a full mask with Hm = H: one bias tile per head
    causal_only: bool        # causal without a user mask (diagonal: LaunchTensors.causal_base)
    guard_empty_rows: bool   # a user mask can mask a whole row: divide by max(rowsum, TINY)
    biased: bool             # an additive bias (user mask or causal) applies to the scores
    dma_transpose: bool      # 16-bit data: dma_transpose moves 2-byte elements only
    n_q_tiles: int           # ceil(Sq / 128)
    key_block: int           # keys per block (single pass: Sk)
    kv_group: int            # kv heads loaded and processed together
    q_chunk: int             # query tiles whose Qᵀ and outputs are resident together
    transposed_scores: bool  # qualifies for the transposed-scores path (attention_kernel
                             # takes it: attention_transposed.py)
    decode: bool = False     # qualifies for the decode path (attention_decode.py; taken
                             # unless the launch returns the lse)
    mask_rows: int = 0       # Sm, the distinct rows of a full mask: Sq, or the launch's
                             # mask_period (query row s has mask row s % Sm: the op's fold
                             # of a kv head's G query heads, whose positions share one mask)

    def rows(self, t, b, h0, h1, s0, s1):
        """HBM view [s1-s0, h1-h0, d] of q/k/v/out for batch b, heads h0:h1, rows s0:s1."""
        if self.layout == "bshd":
            return t[b, s0:s1, h0:h1, :]
        return t[b, h0:h1, s0:s1, :].permute((1, 0, 2))

    def tiles(self, t, b, h0, h1, s0, s1):
        """HBM view [128, n_tiles, h1-h0, d] of the full 128-row tiles in rows s0:s1."""
        n = (s1 - s0) // P
        return self.rows(t, b, h0, h1, s0, s0 + n * P).reshape(
            (n, P, h1 - h0, t.shape[-1])).permute((1, 0, 2, 3))

    def out_shape(self):
        """Shape of the HBM output in the launch's layout."""
        if self.layout == "bhsd":
            return (self.B, self.H, self.Sq, self.Dv)
        return (self.B, self.Sq, self.H, self.Dv)


def launch_facts(q, k, v, mask, scale, causal, layout, key_block, mask_period=0):
    """The ``LaunchFacts`` of a launch; checks the shape contract of the kernel docstring.
    ``mask_period``: 0, or the period Sm of a full mask's rows (row s equals row s % Sm),
    which only the decode path uses (it loads the Sm distinct rows of each pair)."""
    assert layout in ("bhsd", "bshd"), f"layout={layout!r}: expected 'bhsd' or 'bshd'"
    if layout == "bhsd":
        B, H, Sq, D = q.shape
        _, Hkv, Sk, _ = k.shape
    else:
        B, Sq, H, D = q.shape
        _, Sk, Hkv, _ = k.shape
    Dv = v.shape[3]
    assert tuple(k.shape[:3]) == tuple(v.shape[:3]), f"k {k.shape} and v {v.shape} differ"
    assert 1 <= D <= MAX_HEAD_DIM, f"head_dim={D} outside [1, {MAX_HEAD_DIM}]"
    assert 1 <= Dv <= MAX_HEAD_DIM, f"value head_dim={Dv} outside [1, {MAX_HEAD_DIM}]"
    assert H % Hkv == 0, f"query heads {H} not a multiple of kv heads {Hkv}"
    assert str(q.dtype) == str(k.dtype) == str(v.dtype), \
        f"q, k, v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}"
    mask_kind, mask_batches, mask_heads = _mask_kind(mask, B, H, Sq, Sk)
    assert isinstance(mask_period, int) and (mask_period == 0 or (
        mask_period > 0 and mask_kind == "full" and Sq % mask_period == 0)), \
        f"mask_period={mask_period!r}: expected 0 or a positive int dividing Sq={Sq} with a [Bm, Hm, Sq, Sk] mask"
    mask_rows = (mask_period or Sq) if mask_kind == "full" else 0
    isz = itemsize(q.dtype)
    G = H // Hkv
    n_q_tiles = cdiv(Sq, P)
    kv_group, q_chunk = _grouping(isz, Hkv, G, cdiv(D, P), Dv, n_q_tiles, key_block)
    biased = mask is not None or bool(causal)
    transposed_scores = (str(q.dtype) == "bfloat16" and not biased and D + TS_EXTRA_ROWS <= P
                         and Dv <= P and key_block >= Sk and _transposed_keys_fit(Sk, B * H))
    decode = (isz == 2 and G == 1 and _decode_rows(Sq, Sk, mask_kind) and not causal and D <= P
              and (Sk <= DECODE_RESIDENT_KEYS
                   or decode_streamed_bytes(isz, Sq, Sk, Dv, mask_rows) <= DECODE_STREAM_BYTES))
    return LaunchFacts(
        B=B, H=H, Hkv=Hkv, G=G, Sq=Sq, Sk=Sk, D=D, Dv=Dv, layout=layout, dtype=q.dtype,
        itemsize=isz, scale=float(scale), causal=bool(causal), mask_kind=mask_kind,
        mask_batches=mask_batches, mask_heads=mask_heads,
        mask_per_head=mask_kind == "full" and mask_heads > 1,
        causal_only=bool(causal) and mask is None, guard_empty_rows=mask is not None,
        biased=biased, dma_transpose=isz == 2, n_q_tiles=n_q_tiles, key_block=key_block,
        kv_group=kv_group, q_chunk=q_chunk, transposed_scores=transposed_scores, decode=decode,
        mask_rows=mask_rows)


def grouped_st_rows(keys):
    """Whether transposed-scores rows of ``keys`` keys take Sᵀ in groups of key tiles (more
    than TS_ONE_ST_KEY_TILES key tiles; the PSUM budget, the exps and the row max's split
    follow from it)."""
    return cdiv(keys, P) > TS_ONE_ST_KEY_TILES


def _transposed_keys_fit(Sk, heads):
    """Whether the transposed-scores path takes Sk keys for a launch of ``heads`` (batch x
    query head) pairs: up to TS_SHORT_KEY_TILES key tiles always, up to TS_MAX_KEY_TILES where
    each program (physical core) has at least TS_LONG_MIN_HEADS of the pairs."""
    tiles = cdiv(Sk, P)
    if tiles <= TS_SHORT_KEY_TILES:
        return True
    return tiles <= TS_MAX_KEY_TILES and heads >= TS_LONG_MIN_HEADS * nl.num_programs()


def _decode_rows(Sq, Sk, mask_kind):
    """Whether Sq query rows per pair of Sk keys suit the decode path: up to DECODE_MAX_ROWS,
    or masked, up to DECODE_MASKED_MAX_ROWS within DECODE_MASKED_WIDE_SCORES."""
    if Sq <= DECODE_MAX_ROWS:
        return True
    return (mask_kind is not None and Sq <= DECODE_MASKED_MAX_ROWS
            and Sq * cdiv(Sk, P) <= DECODE_MASKED_WIDE_SCORES)


def decode_streamed_bytes(isz, Sq, Sk, Dv, mask_rows=0):
    """SBUF bytes per partition of one pair of the decode path's streamed keys: V (16-bit),
    the fp32 scores and Pᵀ, for cdiv(Sk, 128) key tiles of Sq rows (and the ``mask_rows``
    fp32 rows of a per-row mask)."""
    T = cdiv(Sk, P)
    return T * (Dv * isz + Sq * (FP32_BYTES + isz) + mask_rows * FP32_BYTES)


def _mask_kind(mask, B, H, Sq, Sk):
    """(kind, Bm, Hm) of the optional mask, its shape checked against the kernel contract."""
    if mask is None:
        return None, 0, 1
    if len(mask.shape) == 2:
        assert mask.shape[0] in (1, B) and mask.shape[1] == Sk, \
            f"key mask {mask.shape}: expected [1 or {B}, {Sk}]"
        return "key", mask.shape[0], 1
    assert len(mask.shape) == 4 and mask.shape[0] in (1, B) and \
        mask.shape[1] in (1, H) and tuple(mask.shape[2:]) == (Sq, Sk), \
        f"mask {mask.shape}: expected [1 or {B}, 1 or {H}, {Sq}, {Sk}]"
    return "full", mask.shape[0], mask.shape[1]


def _grouping(isz, Hkv, G, d_pieces, Dv, n_q_tiles, key_block):
    """(kv heads per group, query tiles per chunk) within KV_BUDGET and Q_BUDGET.
    d_pieces: the head dim's pieces of <= 128 partitions (Qᵀ and Kᵀ take one row of
    partitions per piece)."""
    # per kv head and partition: Kᵀ of one key block (per head-dim piece), V with its ones column
    per_kv = (d_pieces * key_block + cdiv(key_block, P) * (Dv + 1)) * isz
    kv_group = max(1, min(Hkv, KV_BUDGET // per_kv))
    # per query tile and partition, for every query head of a group: Qᵀ (per head-dim
    # piece), the output tile, the flash accumulator O | rowsum and the row statistics (the
    # single pass, which has no accumulator, reserves the same)
    per_qt = G * kv_group * (d_pieces * P * isz + Dv * isz + (Dv + 1) * FP32_BYTES + ROW_STATS_BYTES)
    q_chunk = max(1, min(n_q_tiles, Q_BUDGET // per_qt))
    return kv_group, q_chunk


def unbiased_heads_per_batch(facts, n):
    """Heads per unmasked batch (single pass, n keys): as many [128, n] fp32 score tiles as
    fit S_BANKS PSUM banks and outputs [128, Dv + 1] fp32 as fit O_BANKS banks; a score
    row longer than one bank (n > 512) makes batches of one head."""
    if n > PSUM_BANK_FP32:
        return 1
    return max(1, min((PSUM_BANK_FP32 // n) * S_BANKS, (PSUM_BANK_FP32 // (facts.Dv + 1)) * O_BANKS))


@dataclass(frozen=True)
class LaunchTensors(nl.NKIObject):
    """The tensors every head group of a launch uses: the HBM arguments and output, and the
    SBUF tiles allocated once per launch."""

    q: object                # HBM, layout of facts
    k: object
    v: object
    mask: object             # HBM fp32 additive mask or None
    out: object              # HBM (shared_hbm) output
    causal_base: object      # [128, 128] fp32 SBUF causal tile (causal, no mask) or None
    ts_keys: object          # TransposedKeys ring (transposed-scores path) or None
    lse: object = None       # HBM [B, H, Sq] fp32 log-sum-exp output (return_lse) or None



"""Scaled dot-product attention, ``softmax(Q·Kᵀ·scale + mask)·V``, for AWS Trainium (NKI beta 2).

Two entry points share the helpers below:

* ``attention_kernel`` (single pass, ``Sk <= SINGLE_PASS_MAX_KEYS``): for each 128-query
  tile the whole score row ``[128, Sk]`` stays in PSUM; one max, one exp, one P·V.
* ``flash_attention_kernel`` (online softmax, any ``Sk``): keys stream through in blocks
  of ``KEY_BLOCK``; the running max, the running sum and the unnormalised output are
  rescaled per block (FlashAttention-2), so SBUF/PSUM use does not grow with ``Sk``.

Dimensions:
    B: batch (>= 1).  H: query heads.  Hkv: key/value heads, H % Hkv == 0 (GQA: query head
    h reads kv head h // (H // Hkv)).  Sq, Sk: query / key lengths (any >= 1; tails of
    128-row tiles are handled, nothing needs padding).  D: q/k head dim <= 128.
    Dv: v head dim <= 128.
Layouts (static ``layout``):
    "bhsd": q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv], out [B, H, Sq, Dv].
    "bshd": q [B, Sq, H, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv], out [B, Sq, H, Dv]
            (how transformers' projections lay tensors out: read and written with no copy).
Args:
    q, k, v: HBM, all float32 or all bfloat16 or all float16.
    mask: optional HBM float32, additive (0 = attend, -inf = masked, any finite value is
        added): [Bm, Sk] (key padding, Bm in {1, B}) or [Bm, Hm, Sq, Sk] (Hm in {1, H}).
    scale: softmax scale (any finite float).  causal: keep key j <= query i (top-left).
Returns:
    out: HBM (shared_hbm), dtype of q, layout above.
Engines, per 128-query tile and head.  Only VectorE and ScalarE can read PSUM, and every
softmax needs one pass over the scores for the row max (VectorE: ScalarE's accumulators can
only add) and one for the exp (ScalarE); the copies out of PSUM are placed to keep the two
equally busy, and the DMA queues take part of the Pᵀ work when they have room:
    TensorE  S = Q·Kᵀ into PSUM (fp32); O = P·[V | 1] into PSUM (the ones column of V gives
             the row sum of the same rounded P that multiplies V); Pᵀ by 128x128 transposes.
    VectorE  row max straight from PSUM, the scale folded in (either sign works); without
             a mask one reduce covers a batch of heads whose scores sit side by side in
             PSUM; masked columns: scale·S + mask into SBUF first.
    ScalarE  P = exp(scale·S - scale·max) straight from PSUM into SBUF (matmul dtype).
    VectorE or ScalarE (whichever the launch's running estimate says is less loaded,
             _Shapes.pick): each PSUM bank of Pᵀ blocks copied to SBUF; each PSUM bank of
             outputs either normalised by VectorE (reciprocal + multiply) or copied by
             ScalarE and divided per head by GpSimd (FlashAttention-2: one normalisation,
             after P·V).
    GpSimd   the exp biases, divisions, the causal tile (affine_select), constants.
    DMA      Qᵀ and Kᵀ arrive transposed (dma_transpose, 16-bit dtypes) or are transposed
             on TensorE (fp32); V and the output move as [128 rows, heads, D] blocks
             covering every head of a group in one transfer; for 16-bit data a share of
             Pᵀ is made by DMA transposes instead of TensorE + a PSUM copy
             (_plan_dma_share levels the DMA queues with VectorE/ScalarE).
Transposed scores (bf16, no mask, not causal, Sk <= 384, D in {32, 64, 96}; _ts_tile): P is
    made directly as Pᵀ, with no Pᵀ transposes or PSUM copies.  VectorE takes the row max m
    from S as above; GpSimd splits m into bf16 hi + lo and one DMA transpose per tile puts
    them on partitions D, D+1 of Qᵀ; TensorE computes Sᵀ = [Kᵀ; -1; -1]ᵀ·[Qᵀ; hi; lo] =
    (S - m)ᵀ per 128-key tile (fp32 accumulation), and ScalarE Pᵀ = exp(scale·Sᵀ) with no
    per-partition bias, so one exp covers 4 heads and every key tile.  The max is still
    subtracted (to ~2^-16 relative, a per-row constant softmax ignores).
Causal: key blocks above the diagonal are skipped; only the ≤128 keys of the diagonal
    block take the masked path, the keys before it are read like unmasked ones.
Numerics:
    matmul operands in the input dtype (bf16 stays bf16, fp32 stays fp32), accumulation,
    softmax statistics and normalisation in fp32, one rounding into the output dtype.
    A query row whose keys are all masked (-inf) returns 0 (as torch's SDPA).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .engine_costs import (DMA_BYTES_PER_S, DMA_FIXED_NS, DMA_TRANSPOSE_EFFICIENCY, INSTR_CYCLES,
                           MIN_INSTRUCTION_CYCLES, SCALAR_GHZ, VECTOR_GHZ, VECTOR_PSUM_COPY_16BIT_RATE)
from .limits import ATTENTION_SINGLE_PASS_MAX_KEYS as SINGLE_PASS_MAX_KEYS
from .tiling import PARTITIONS, cdiv, itemsize

P = PARTITIONS              # partitions (SBUF/PSUM lanes); also the TensorE contraction limit
PSUM_BANK_BYTES = 2048      # one PSUM bank per partition: 512 fp32, the matmul output limit
MM_N = 512                  # moving free size limit of one nc_matmul (one PSUM bank of fp32)
KEY_BLOCK = 2048            # flash: keys per block (same PSUM budget as the single pass)
S_BANKS = 4                 # PSUM banks of scores per unmasked head batch
O_BANKS = 2                 # PSUM banks of outputs per unmasked head batch
# Engine balance: VectorE and ScalarE are the only engines that read PSUM; the Pᵀ copies
# out of PSUM go to whichever keeps both busy for the same time (see _Shapes.pick). Pᵀ can
# also be made by the DMA engines (dma_transpose SBUF->SBUF, 16-bit data): worth it when
# the DMA queues, busy with q/k/v/out, have room; _plan_dma_share picks the share of the
# launch's Pᵀ. The trn2 clocks and DMA figures these use are in engine_costs.py.
# Per-partition SBUF budgets for the tensors resident while a head group is processed
# (224 KiB per partition on trn2; the rest holds per-tile scratch and the next group's
# prefetch).
KV_BUDGET = 48 * 1024
Q_BUDGET = 48 * 1024
FLT_MAX = 3.4028234663852886e38
TINY = 1e-30                # guard for all-masked rows: 0 / max(0, TINY) = 0
NEG_INF = float("-inf")      # additive mask value of a masked key

_SIXTEEN_BIT = ("bfloat16", "float16")


class _Shapes:
    """Static facts of one launch (shapes, layout, grouping) derived from the HBM args."""

    def __init__(self, q, k, v, mask, scale, causal, layout, key_block):
        assert layout in ("bhsd", "bshd"), f"layout={layout!r}: expected 'bhsd' or 'bshd'"
        if layout == "bhsd":
            self.B, self.H, self.Sq, self.D = q.shape
            _, self.Hkv, self.Sk, _ = k.shape
        else:
            self.B, self.Sq, self.H, self.D = q.shape
            _, self.Sk, self.Hkv, _ = k.shape
        self.Dv = v.shape[3]
        assert tuple(k.shape[:3]) == tuple(v.shape[:3]), f"k {k.shape} and v {v.shape} differ"
        assert self.D <= P, f"head_dim={self.D} exceeds {P} (the TensorE contraction limit)"
        assert self.Dv <= P, f"value head_dim={self.Dv} exceeds {P}"
        assert self.H % self.Hkv == 0, f"query heads {self.H} not a multiple of kv heads {self.Hkv}"
        assert str(q.dtype) == str(k.dtype) == str(v.dtype), "q, k, v must share one dtype"
        self.G = self.H // self.Hkv
        self.layout = layout
        self.scale = float(scale)
        self.causal = bool(causal)
        self.dtype = q.dtype           # matmul operands and P use the input dtype
        self.isz = itemsize(q.dtype)
        self.mask = mask
        self.mask_kind = None
        if mask is not None:
            if len(mask.shape) == 2:
                self.mask_kind = "key"
                assert mask.shape[0] in (1, self.B) and mask.shape[1] == self.Sk, \
                    f"key mask {mask.shape}: expected [1 or {self.B}, {self.Sk}]"
            else:
                self.mask_kind = "full"
                assert len(mask.shape) == 4 and mask.shape[0] in (1, self.B) and \
                    mask.shape[1] in (1, self.H) and tuple(mask.shape[2:]) == (self.Sq, self.Sk), \
                    f"mask {mask.shape}: expected [1 or {self.B}, 1 or {self.H}, {self.Sq}, {self.Sk}]"
        self.guard = mask is not None      # only a user mask can mask a whole row
        self.biased = mask is not None or self.causal
        self.dma_t = str(q.dtype) in _SIXTEEN_BIT   # dma_transpose moves 2-byte elements only
        self.nqt = cdiv(self.Sq, P)
        self.key_block = key_block
        # kv heads per group: K^T, V (+ones column) of the group's kv heads for one key block
        per_kv = (key_block + cdiv(key_block, P) * (self.Dv + 1)) * self.isz
        self.kv_group = max(1, min(self.Hkv, KV_BUDGET // per_kv))
        # query tiles per chunk: Q^T and the output tile of every query head of a group
        per_qt = self.G * self.kv_group * (P * self.isz + self.Dv * self.isz + (self.Dv + 1) * 4 + 8)
        self.q_chunk = max(1, min(self.nqt, Q_BUDGET // per_qt))
        self.load_v = self.load_s = 0.0
        self.dma_credit = 0.0
        self.dma_share = _plan_dma_share(self) if self.dma_t else 0.0

    def charge(self, vector_cycles=0.0, scalar_cycles=0.0):
        """Account work that must run on VectorE / ScalarE (estimated cycles)."""
        self.load_v += vector_cycles / VECTOR_GHZ
        self.load_s += scalar_cycles / SCALAR_GHZ

    def pick(self, vector_cycles, scalar_cycles):
        """Engine for a piece of work either can do (a PSUM->SBUF copy): the one that keeps
        the launch's estimated VectorE and ScalarE loads most even (greedy list schedule)."""
        tv = self.load_v + vector_cycles / VECTOR_GHZ
        ts = self.load_s + scalar_cycles / SCALAR_GHZ
        if max(tv, self.load_s) <= max(self.load_v, ts):
            self.load_v = tv
            return nisa.engine.vector
        self.load_s = ts
        return nisa.engine.scalar

    def copy_cycles(self, elems):
        """(VectorE, ScalarE) cycles to copy ``elems`` per partition of Pᵀ out of PSUM."""
        return (elems / (VECTOR_PSUM_COPY_16BIT_RATE if self.isz == 2 else 1.0) + INSTR_CYCLES,
                elems + INSTR_CYCLES)

    def use_dma(self):
        """True for a share ``dma_share`` of the successive Pᵀ transposes of this launch."""
        self.dma_credit += self.dma_share
        if self.dma_credit >= 0.5:
            self.dma_credit -= 1.0
            return True
        return False

    def rows(self, t, b, h0, h1, s0, s1):
        """HBM view [s1-s0, h1-h0, d] of q/k/v/out for batch b, heads h0:h1, rows s0:s1."""
        if self.layout == "bshd":
            return t[b, s0:s1, h0:h1, :]
        return t[b, h0:h1, s0:s1, :].permute(1, 0, 2)

    def tiles(self, t, b, h0, h1, s0, s1):
        """HBM view [128, n_tiles, h1-h0, d] of the full 128-row tiles in rows s0:s1."""
        n = (s1 - s0) // P
        return self.rows(t, b, h0, h1, s0, s0 + n * P).reshape(
            (n, P, h1 - h0, t.shape[-1])).permute(1, 0, 2, 3)


def _plan_dma_share(sh):
    """Share of Pᵀ to transpose with the DMA engines rather than TensorE + a PSUM copy.

    A first-order estimate of where the time goes, from the shapes alone: DMA busy with
    q/k/v/out (+ mask) at DMA_BYTES_PER_S; VectorE (row max) and ScalarE (exp, O copy)
    busy per (head, 128-query tile) for its number of keys; the Pᵀ copies split between the
    two so they finish together.  The share moved to the DMA is the one that levels DMA
    with VectorE/ScalarE (searched in steps of 1/20)."""
    io = (sh.B * sh.Sq * sh.H * (sh.D + sh.Dv) + sh.B * sh.Sk * sh.Hkv * (sh.D + sh.Dv)) * sh.isz
    if sh.mask is not None:
        io += 4 * (sh.mask.shape[0] * sh.Sk if sh.mask_kind == "key" else
                   sh.mask.shape[0] * sh.mask.shape[1] * sh.Sq * sh.Sk)
    t_io = io / DMA_BYTES_PER_S * 1e9
    vec = sca = pt_v = pt_s = pt_d = 0.0
    for t in range(sh.nqt):
        r = min(P, sh.Sq - t * P)
        n = min(sh.Sk, t * P + r) if sh.causal else sh.Sk
        masked = n if sh.mask is not None else (min(n, r) if sh.causal else 0)
        units = sh.B * sh.H
        vec += units * (n + 2 * masked + INSTR_CYCLES) / VECTOR_GHZ
        sca += units * (n + 2 * INSTR_CYCLES + sh.Dv + 1) / SCALAR_GHZ
        e = cdiv(n, P) * r
        pt_v += units * e / (VECTOR_PSUM_COPY_16BIT_RATE if sh.isz == 2 else 1.0) / VECTOR_GHZ
        pt_s += units * e / SCALAR_GHZ
        # DMA: one transfer for the full 128-key chunks and one for the tail chunk of a batch
        # of heads, each spread over the 16 queues and costing at least the fixed latency
        nb = _batch_heads(sh, n) if not sh.biased else 1
        batches = cdiv(units, nb)
        for keys in (n // P * P, n % P):
            if keys:
                data = nb * r * keys * sh.isz / (DMA_BYTES_PER_S * DMA_TRANSPOSE_EFFICIENCY) * 1e9
                pt_d += batches * max(DMA_FIXED_NS, data)
    best, best_t = 0.0, None
    for i in range(21):
        d = i / 20
        rest = 1.0 - d
        # balanced VectorE/ScalarE time with the remaining copies split between them
        x = (sca + rest * pt_s - vec) / (pt_v + pt_s)          # share of the copies on VectorE
        x = min(rest, max(0.0, x))
        t_vs = max(vec + x * pt_v, sca + (rest - x) * pt_s)
        t = max(t_io + d * pt_d, t_vs)
        if best_t is None or t < best_t - 1e-9:
            best, best_t = d, t
    return best


# ------------------------------------------------------------------------------ loads/stores

def _load_transposed(sh, src, b, h0, h1, s0, s1, out=None):
    """[d, h1-h0, s1-s0] SBUF tile (matmul dtype) holding src[b, rows s0:s1, heads h0:h1]ᵀ
    (``out``: an SBUF view of that shape to load into, 16-bit data only)."""
    d = src.shape[-1]
    nh, n = h1 - h0, s1 - s0
    if out is not None:
        nisa.dma_transpose(dst=out, src=sh.rows(src, b, h0, h1, s0, s1), axes=(2, 1, 0))
        return out
    out = nl.ndarray((d, nh, n), dtype=sh.dtype, buffer=nl.sbuf)
    if sh.dma_t:
        # DMA engines transpose 2-byte elements on the way in: [n, nh, d] -> [d, nh, n].
        nisa.dma_transpose(dst=out, src=sh.rows(src, b, h0, h1, s0, s1), axes=(2, 1, 0))
        return out
    # fp32: load [rows, heads, d] blocks and transpose each head on TensorE (PSUM), a PSUM
    # bank of fp32 holding 4 heads x 128 rows, evacuated by one copy.
    per_bank = PSUM_BANK_BYTES // (P * 4)
    for r0 in range(s0, s1, P):
        r = min(P, s1 - r0)
        nat = nl.ndarray((P, nh, d), dtype=sh.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=nat[:r], src=sh.rows(src, b, h0, h1, r0, r0 + r))
        for g0 in range(0, nh, per_bank):
            g = min(per_bank, nh - g0)
            tp = nl.ndarray((d, per_bank, P), dtype=sh.dtype, buffer=nl.psum)
            for j in range(g):
                nisa.nc_transpose(dst=tp[:, j, :r], data=nat[:r, g0 + j, :])
            nisa.tensor_copy(dst=out[:, g0:g0 + g, r0 - s0:r0 - s0 + r], src=tp[:, :g, :r],
                             engine=nisa.engine.scalar)
    return out


def _load_values(sh, v, b, h0, h1, k0, k1):
    """[128, n_tiles, h1-h0, Dv+1] SBUF tile: V rows k0:k1 (128 keys per tile) with a ones
    column appended, so P·[V | 1] also yields the row sum of P."""
    nh, n = h1 - h0, k1 - k0
    nt = cdiv(n, P)
    out = nl.ndarray((P, nt, nh, sh.Dv + 1), dtype=sh.dtype, buffer=nl.sbuf)
    nisa.memset(dst=out[:, :, :, sh.Dv:sh.Dv + 1], value=1.0, engine=nisa.engine.gpsimd)
    full = n // P
    if full:
        nisa.dma_copy(dst=out[:, 0:full, :, 0:sh.Dv], src=sh.tiles(v, b, h0, h1, k0, k0 + full * P))
    tail = n - full * P
    if tail:
        nisa.dma_copy(dst=out[:tail, full, :, 0:sh.Dv], src=sh.rows(v, b, h0, h1, k0 + full * P, k1))
    return out


def _store_rows(sh, out, tile, b, h0, h1, s0, s1):
    """out[b, rows s0:s1, heads h0:h1] <- tile [128, n_tiles, h1-h0, Dv]."""
    n = s1 - s0
    full = n // P
    if full:
        nisa.dma_copy(dst=sh.tiles(out, b, h0, h1, s0, s0 + full * P), src=tile[:, 0:full])
    tail = n - full * P
    if tail:
        nisa.dma_copy(dst=sh.rows(out, b, h0, h1, s0 + full * P, s1), src=tile[:tail, full])


def _key_bias(sh, b):
    """[128, Sk] fp32: the key-padding row of batch b on every partition (or None)."""
    if sh.mask_kind != "key":
        return None
    m = sh.mask
    row = m[(b if m.shape[0] > 1 else 0):(b if m.shape[0] > 1 else 0) + 1, :]
    kb = nl.ndarray((P, sh.Sk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=kb, src=row.broadcast(0, P))   # one HBM row read onto 128 partitions
    return kb


def _tile_bias(sh, b, h, q0, r, k0, k1, key_bias):
    """[128, k1-k0] fp32 additive bias of query rows q0:q0+r, keys k0:k1 (rows :r valid):
    user mask (key row or full tile) plus, if causal, -inf above the diagonal. None without
    a user mask (causal alone is handled by _diag)."""
    if sh.mask is None:
        return None
    n = k1 - k0
    bias = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    if sh.mask_kind == "full":
        m = sh.mask
        nisa.dma_copy(dst=bias[:r], src=m[b if m.shape[0] > 1 else 0, h if m.shape[1] > 1 else 0,
                                          q0:q0 + r, k0:k1])
        base = bias
    else:
        base = key_bias[:, k0:k1]
    if sh.causal:
        # keep where (q0 + p) - (k0 + j) >= 0, i.e. key <= query (top-left aligned)
        nisa.affine_select(dst=bias[:r], pattern=[[-1, n]], channel_multiplier=1,
                           on_true_tile=base[:r], on_false_value=NEG_INF,
                           cmp_op=nl.greater_equal, offset=q0 - k0)
    elif sh.mask_kind == "key":
        return base
    return bias


# ------------------------------------------------------------------------------ one block

def _scores(sh, qT, kT, r, n):
    """S = Q·Kᵀ for r query rows and n keys: [128, n] fp32 PSUM (rows :r), 512 keys per matmul."""
    s = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.psum)
    for c0 in range(0, n, MM_N):
        c1 = min(n, c0 + MM_N)
        nisa.nc_matmul(dst=s[:r, c0:c1], stationary=qT, moving=kT[:, c0:c1])
    return s


def _row_max(sh, s, r, n, bias=None, diag=None):
    """-rowmax of scale·S + mask, in fp32 (scaled units), for the exp that follows.

    s: [128, n] fp32 PSUM scores (rows :r).  Masking, one of:
      bias: [128, n] fp32 SBUF additive tile (user mask, causal folded in);
      diag: (c, cb) for causal without a user mask: columns [0, c) are visible to every
            row, columns [c, n) get the additive causal tile cb ([128, n - c] SBUF view);
      neither: no mask.
    VectorE reads PSUM once for the max, fused with the scale (it reduces min(-scale·S), so
    either sign of scale works); only masked columns take the extra VectorE pass that adds
    the mask into z = -(scale·S + mask) in SBUF fp32.
    Returns (p, neg_max, z, c): p a [128, n] SBUF tile for P (used as scratch here), neg_max
    [128, 1] fp32 clamped <= FLT_MAX (a row masked everywhere then gives exp(-inf) = 0),
    z ([128, n - c] or None) and c, the number of leading unmasked columns."""
    p = nl.ndarray((P, n), dtype=sh.dtype, buffer=nl.sbuf)
    neg_max = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    if bias is None and diag is None:
        nisa.tensor_scalar_reduce(dst=p[:r], data=s[:r, 0:n], op0=nl.multiply, operand0=-sh.scale,
                                  reduce_op=nl.minimum, reduce_res=neg_max[:r])
        return p, neg_max, None, n
    c, cb = (0, bias) if diag is None else diag
    parts = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.sbuf)
    z = None
    if c:
        nisa.tensor_scalar_reduce(dst=p[:r, 0:c], data=s[:r, 0:c], op0=nl.multiply, operand0=-sh.scale,
                                  reduce_op=nl.minimum, reduce_res=parts[:r, 0:1])
    if c < n:
        z = nl.ndarray((P, n - c), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=z[:r], data=s[:r, c:n], op0=nl.multiply, operand0=sh.scale,
                                  op1=nl.add, operand1=cb[:r, 0:n - c])
        nisa.tensor_scalar_reduce(dst=z[:r], data=z[:r], op0=nl.multiply, operand0=-1.0,
                                  reduce_op=nl.minimum, reduce_res=parts[:r, 1:2])
    if c and c < n:
        nisa.tensor_tensor(dst=neg_max[:r], data1=parts[:r, 0:1], data2=parts[:r, 1:2], op=nl.minimum,
                           engine=nisa.engine.gpsimd)
        src = neg_max
    else:
        src = parts[:, 0:1] if c else parts[:, 1:2]
    nisa.tensor_scalar(dst=neg_max[:r], data=src[:r], op0=nl.minimum, operand0=FLT_MAX,
                       engine=nisa.engine.gpsimd)
    return p, neg_max, z, c


def _row_exp(sh, p, s, z, c, r, n, neg_max):
    """p[:r] = exp(scale·S + mask + neg_max) on ScalarE: unmasked columns straight from PSUM,
    masked ones from z = -(scale·S + mask)."""
    if c:
        nisa.activation(dst=p[:r, 0:c], op=nl.exp, data=s[:r, 0:c], bias=neg_max[:r], scale=sh.scale)
    if c < n:
        nisa.activation(dst=p[:r, c:n], op=nl.exp, data=z[:r], bias=neg_max[:r], scale=-1.0)


def _diag(sh, base, q0, r, k0, n):
    """(c, cb) of a causal tile without user mask: query rows q0:q0+r, keys k0:k0+n (n already
    clipped to key < q0 + r).  Keys <= q0 are visible to every row; key q0 + 1 + x is
    visible to row p iff x <= p - 1, i.e. base[p, x] (0 or -inf)."""
    a = max(k0, q0 + 1)
    c = min(n, a - k0)
    if c == n:
        return n, None
    return c, base[:, a - q0 - 1:k0 + n - q0 - 1]


def _dma_transpose_p(p, pT, r, n):
    """pT[:kc, j, c, :r] = (p[:r, j, 128c : 128c + kc])ᵀ for every head j and 128-key chunk c,
    on the DMA engines: one 4-D transpose for the full chunks of every head, one 3-D for
    the tail chunk.  p: [r, heads, >= n] SBUF; pT: [128, heads, chunks, 128] SBUF."""
    nu = p.shape[1]
    full = n // P
    if full:
        nisa.dma_transpose(dst=pT[:, :, 0:full, :r], src=p[:r, :, 0:full * P].reshape((r, nu, full, P)),
                           axes=(3, 1, 2, 0))
    if n > full * P:
        kc = n - full * P
        nisa.dma_transpose(dst=pT[:kc, :, full, :r], src=p[:r, :, full * P:n], axes=(2, 1, 0))


def _pv(sh, p, vals, kv, r, n):
    """O = P·[V | 1] for r rows and n keys: [128, Dv+1] fp32 PSUM, column Dv = row sum of P.
    Pᵀ: DMA transposes (a share of the launch, see _plan_dma_share), or 128x128 TensorE
    transposes into PSUM copied to SBUF one bank at a time by VectorE or ScalarE."""
    nkc = cdiv(n, P)
    per_bank = PSUM_BANK_BYTES // (P * sh.isz)      # 128x128 Pᵀ blocks per PSUM bank
    pT = nl.ndarray((P, nkc, P), dtype=sh.dtype, buffer=nl.sbuf)
    if sh.dma_t and sh.use_dma():
        _dma_transpose_p(p[:, 0:n].reshape((P, 1, n)), pT.reshape((P, 1, nkc, P)), r, n)
    else:
        for g0 in range(0, nkc, per_bank):
            g = min(per_bank, nkc - g0)
            tp = nl.ndarray((P, per_bank, P), dtype=sh.dtype, buffer=nl.psum)
            for j in range(g):
                c0 = (g0 + j) * P
                kc = min(P, n - c0)
                nisa.nc_transpose(dst=tp[:kc, j, :r], data=p[:r, c0:c0 + kc])
            # rows kc..127 of a tail block are never written nor read by the P·V matmul below
            nisa.tensor_copy(dst=pT[:, g0:g0 + g, :r], src=tp[:, 0:g, :r],
                             engine=sh.pick(*sh.copy_cycles(g * r)))
    o = nl.ndarray((P, sh.Dv + 1), dtype=nl.float32, buffer=nl.psum)
    for c in range(nkc):
        kc = min(P, n - c * P)
        nisa.nc_matmul(dst=o[:r], stationary=pT[:kc, c, :r], moving=vals[:kc, c, kv, :],
                       accumulate=(c > 0))
    return o


def _normalize(sh, dst, o, r):
    """dst[:r] = O / rowsum (FlashAttention-2: normalise once, after P·V).  ScalarE moves
    O | rowsum from PSUM to SBUF, GpSimd divides (an all-masked row has rowsum 0 and O 0:
    with a user mask the divisor is max(rowsum, TINY), so the row is 0)."""
    raw = nl.ndarray((P, sh.Dv + 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=raw[:r], op=nl.copy, data=o[:r])
    _divide(sh, dst, raw[:r], r)


def _divide(sh, dst, raw, r):
    """dst = raw[:, :Dv] / raw[:, Dv] on GpSimd (raw: [r, Dv + 1] fp32 SBUF)."""
    denom = raw[:, sh.Dv:sh.Dv + 1]
    if sh.guard:
        d = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=d[:r], data=denom, op0=nl.maximum, operand0=TINY, engine=nisa.engine.gpsimd)
        denom = d[:r]
    nisa.tensor_scalar(dst=dst, data=raw[:, 0:sh.Dv], op0=nl.divide, operand0=denom,
                       engine=nisa.engine.gpsimd)


def _softmax_cycles(sh, n, bias, diag):
    """(VectorE, ScalarE) cycles of _row_max + _row_exp for one unit (for _Shapes.charge)."""
    masked = n if bias is not None else (n - diag[0] if diag is not None else 0)
    vector = (n - masked) + 3 * masked + INSTR_CYCLES * (1 + 2 * (masked > 0))
    scalar = n + INSTR_CYCLES * (1 + (0 < masked < n))
    return vector, scalar


# ------------------------------------------------------------------------------ kernels

def _single_pass_unit(sh, qT, kT, vals, kv, out_tile, bias, diag, r, n):
    s = _scores(sh, qT, kT[:, 0:n], r, n)
    p, neg_max, z, c = _row_max(sh, s, r, n, bias, diag)
    _row_exp(sh, p, s, z, c, r, n, neg_max)
    v_cyc, s_cyc = _softmax_cycles(sh, n, bias, diag)
    sh.charge(v_cyc, s_cyc + sh.Dv + 1 + INSTR_CYCLES)
    o = _pv(sh, p, vals, kv, r, n)
    _normalize(sh, out_tile, o, r)


def _single_pass_group(sh, q, k, v, mask, out, b, hk0, hk1, key_bias, base):
    h0, h1 = hk0 * sh.G, hk1 * sh.G
    if sh.ts:
        # transposed-scores path (_ts_tile): K^T with two rows of -1 appended, in one of two
        # persistent tiles (the -1 rows are written on a tile's first use, after the loads
        # the first scores wait for); Q^T of the first chunk loaded before V
        slot = sh.ts_rot % len(sh.ts_k)
        kx = sh.ts_k[slot]
        kT = kx[:, 0:hk1 - hk0, :]
        sh.ts_rot += 1
        _load_transposed(sh, k, b, hk0, hk1, 0, sh.Sk, out=kT[0:sh.D])
        s1 = min(sh.Sq, sh.q_chunk * P)
        qT_first = nl.ndarray((sh.D + 2, h1 - h0, s1), dtype=sh.dtype, buffer=nl.sbuf)
        _load_transposed(sh, q, b, h0, h1, 0, s1, out=qT_first[0:sh.D])
        if sh.ts_rot <= len(sh.ts_k):
            nisa.dma_copy(dst=kx[sh.D:sh.D + 2], src=sh.ts_ones[sh.D:sh.D + 2].broadcast(1, sh.kv_group))
    else:
        kT = _load_transposed(sh, k, b, hk0, hk1, 0, sh.Sk)      # [D, kv heads, Sk]
    vals = _load_values(sh, v, b, hk0, hk1, 0, sh.Sk)           # [128, key tiles, kv heads, Dv+1]
    for t0 in range(0, sh.nqt, sh.q_chunk):
        t1 = min(sh.nqt, t0 + sh.q_chunk)
        s0, s1 = t0 * P, min(sh.Sq, t1 * P)
        if sh.ts and t0 == 0:
            qT = qT_first
        elif sh.ts:
            qT = nl.ndarray((sh.D + 2, h1 - h0, s1 - s0), dtype=sh.dtype, buffer=nl.sbuf)
            _load_transposed(sh, q, b, h0, h1, s0, s1, out=qT[0:sh.D])
        else:
            qT = _load_transposed(sh, q, b, h0, h1, s0, s1)     # [D, q heads, rows]
        o_sb = nl.ndarray((P, t1 - t0, h1 - h0, sh.Dv), dtype=out.dtype, buffer=nl.sbuf)
        for t in range(t0, t1):
            q0 = t * P
            r = min(P, sh.Sq - q0)
            n = min(sh.Sk, q0 + r) if sh.causal else sh.Sk    # causal: later keys never attend

            def unit(hq):
                return (qT[:, hq - h0, q0 - s0:q0 - s0 + r], kT[:, hq // sh.G - hk0, 0:n],
                        hq // sh.G - hk0, o_sb[:r, t - t0, hq - h0, :])

            if sh.ts:
                last = b == sh.B - 1 and hk1 == sh.Hkv and t == sh.nqt - 1

                def store(j0, j1, t=t, q0=q0, r=r):
                    # the launch's last tile: each batch of heads stored as soon as it is done
                    nisa.dma_copy(dst=sh.rows(out, b, h0 + j0, h0 + j1, q0, q0 + r),
                                  src=o_sb[:r, t - t0, j0:j1, :])

                # the launch's last batch: outputs normalised on VectorE, which runs out of
                # work first (ScalarE still has the exps), so the tail is short
                sh.ts_vec = b == sh.B - 1 and hk1 == sh.Hkv
                _ts_tile(sh, qT[:, :, q0 - s0:q0 - s0 + r], h0, h1, hk0, kT, vals,
                         o_sb[:r, t - t0, :, :], r, n, last=last, store=store if last else None)
                if last:
                    s1 = q0                        # rows q0.. already stored
                continue
            if not sh.biased:
                nb = _batch_heads(sh, n)
                for hb in range(h0, h1, nb):
                    he = min(h1, hb + nb)
                    _unbiased_batch(sh, [unit(hq)[:3] for hq in range(hb, he)], vals,
                                    o_sb[:r, t - t0, hb - h0:he - h0, :], r, n)
                continue
            per_head = sh.mask_kind == "full" and mask.shape[1] > 1
            shared = None if per_head else _tile_bias(sh, b, 0, q0, r, 0, n, key_bias)
            diag = _diag(sh, base, q0, r, 0, n) if sh.causal and sh.mask is None else None
            for hq in range(h0, h1):
                bias = _tile_bias(sh, b, hq, q0, r, 0, n, key_bias) if per_head else shared
                qv, kv_view, kv, ov = unit(hq)
                _single_pass_unit(sh, qv, kv_view, vals, kv, ov, bias, diag, r, n)
        if s1 > s0:
            _store_rows(sh, out, o_sb, b, h0, h1, s0, s1)


def _batch_heads(sh, n):
    """Heads per unmasked batch: as many [128, n] fp32 score tiles as fit S_BANKS PSUM
    banks, and outputs [128, Dv + 1] fp32 that fit O_BANKS banks (with up to 2 banks of Pᵀ
    blocks in flight: at most 8 banks)."""
    if n > MM_N:
        return 1
    return max(1, min((MM_N // n) * S_BANKS, (MM_N // (sh.Dv + 1)) * O_BANKS))


TS_MAX_HEADS = 4            # heads per transposed-scores batch (PSUM: S, Sᵀ, O, hi/lo banks)


def _ts_plan(sh):
    """Set up the transposed-scores path (sh.ts) for unmasked, non-causal bf16 launches with
    Sk <= 384 and D in {32, 64, 96} (rows D, D+1 must start a partition quadrant): persistent Kᵀ tiles with two rows of -1 (rotated, so one
    group's load overlaps the previous group's work) and hi/lo staging tiles."""
    sh.ts = (str(sh.dtype) == "bfloat16" and not sh.biased and sh.Sk <= 3 * P
             and sh.D % 32 == 0 and sh.D + 2 <= P and sh.key_block >= sh.Sk)
    if not sh.ts:
        return
    sh.ts_rot = 0
    sh.ts_k = []
    # rows D, D+1 = -1: one small memset, spread over the kv heads by an SBUF->SBUF DMA (a
    # memset of every head would cost GpSimd kv_group x Sk cycles on 2 lanes at the start)
    ones = nl.ndarray((sh.D + 2, 1, sh.Sk), dtype=sh.dtype, buffer=nl.sbuf)
    nisa.memset(dst=ones[sh.D:sh.D + 2], value=-1.0, engine=nisa.engine.gpsimd)
    sh.ts_ones = ones
    for _ in range(2):
        sh.ts_k.append(nl.ndarray((sh.D + 2, sh.kv_group, sh.Sk), dtype=sh.dtype, buffer=nl.sbuf))
    sh.ts_first = True


def _ts_heads(sh, n, r=P):
    """Heads per transposed-scores batch: Sᵀ of one key tile for all of them fits a PSUM bank
    (at most TS_MAX_HEADS; more heads for short tail tiles measured slower: a coarser
    pipeline), and S of all of them, two Sᵀ tiles (the previous batch's may still be live)
    and one bank of outputs fit the 8 PSUM banks (hence Sk <= 384 on this path)."""
    per_bank = max(1, MM_N // n)
    return max(1, min(TS_MAX_HEADS, MM_N // r, per_bank * (7 - 2 * cdiv(n, P))))


def _ts_hilo(sh, ext, qx, j0, j1, r):
    """Rows D, D+1 of qx[:, j0:j1, :r] = hi, lo with hi + lo = ext (hi = bf16(ext), lo =
    bf16(ext - hi), on GpSimd), transposed onto those partitions by one DMA transpose."""
    nj, D = j1 - j0, sh.D
    hl = nl.ndarray((P, nj, 2), dtype=sh.dtype, buffer=nl.sbuf)
    hi = hl[:r, :, 0:1].reshape((r, nj))
    nisa.tensor_copy(dst=hi, src=ext[:r, j0:j1], engine=nisa.engine.gpsimd)
    nisa.tensor_tensor(dst=hl[:r, :, 1:2].reshape((r, nj)), data1=ext[:r, j0:j1], data2=hi,
                       op=nl.subtract, engine=nisa.engine.gpsimd)
    nisa.dma_transpose(dst=qx[D:D + 2, j0:j1, :], src=hl[:r], axes=(2, 1, 0))


def _ts_tile(sh, qx, h0, h1, hk0, kx, vals, out, r, n, last=False, store=None):
    """Attention of every head of a group for one query tile without a mask, with P made
    directly in transposed form (no Pᵀ transposes or PSUM copies of P):

    1. per batch of heads, S = Q·Kᵀ side by side in PSUM and one VectorE reduce for the row
       maxes m (raw units); then for all heads at once m is split into two bf16 values
       hi + lo (GpSimd) and one DMA transpose writes them onto partitions D, D+1 of Qᵀ;
    2. per batch of heads, Sᵀ = [Kᵀ; -1; -1]ᵀ·[Qᵀ; hi; lo] = (S - m)ᵀ comes out of TensorE
       with the max already subtracted (fp32 accumulation; hi + lo = m to ~2^-16 relative,
       and any error is a per-row constant, which softmax ignores), and ScalarE computes
       Pᵀ = exp(scale·Sᵀ) with no per-partition bias, so one instruction covers every head
       of the batch per 128-key tile; Pᵀ is the stationary operand of P·[V | 1].
    ``qx``: [D+2, heads, r] view of Qᵀ (rows D, D+1 written here); ``kx``: [D+2, kv heads,
    Sk] with rows D, D+1 = -1; ``out``: [r, heads, Dv] output rows."""
    nh = h1 - h0
    D = sh.D
    nb = _ts_heads(sh, n, r)
    per_bank = max(1, MM_N // n)
    nkc = cdiv(n, P)
    kvs = [hq // sh.G - hk0 for hq in range(h0, h1)]
    red = nl.maximum if sh.scale >= 0 else nl.minimum
    ext = nl.ndarray((P, nh), dtype=nl.float32, buffer=nl.sbuf)
    for b0 in range(0, nh, nb):
        m = min(nb, nh - b0)
        s = nl.ndarray((P, cdiv(m, per_bank), max(MM_N, n) if m == 1 else MM_N),
                       dtype=nl.float32, buffer=nl.psum)
        for j in range(m):
            c = (j % per_bank) * n
            nisa.nc_matmul(dst=s[:r, j // per_bank, c:c + n], stationary=qx[0:D, b0 + j, :],
                           moving=kx[0:D, kvs[b0 + j], 0:n])
        full_banks = m // per_bank
        if full_banks:
            nisa.tensor_reduce(dst=ext[:r, b0:b0 + full_banks * per_bank].reshape((r, full_banks, per_bank)),
                               op=red, axis=3,
                               data=s[:r, 0:full_banks, 0:per_bank * n].reshape((r, full_banks, per_bank, n)))
        rest = m - full_banks * per_bank
        if rest:
            nisa.tensor_reduce(dst=ext[:r, b0 + full_banks * per_bank:b0 + m], op=red, axis=2,
                               data=s[:r, full_banks, 0:rest * n].reshape((r, rest, n)))
        sh.charge(m * n + INSTR_CYCLES * cdiv(m, per_bank), 0)
        if sh.ts_first or last:
            # the launch's first and last tiles: per batch, so that ScalarE starts early
            # and the tail is short
            _ts_hilo(sh, ext, qx, b0, b0 + m, r)
    if not (sh.ts_first or last):
        _ts_hilo(sh, ext, qx, 0, nh, r)
    sh.ts_first = False
    w = sh.Dv + 1
    per_o = MM_N // w
    for b0 in range(0, nh, nb):
        m = min(nb, nh - b0)
        st = nl.ndarray((P, nkc, MM_N), dtype=nl.float32, buffer=nl.psum)
        pT = nl.ndarray((P, nkc, m, P), dtype=sh.dtype, buffer=nl.sbuf)
        for c in range(nkc):
            kc = min(P, n - c * P)
            for j in range(m):
                nisa.nc_matmul(dst=st[:kc, c, j * r:(j + 1) * r], stationary=kx[:, kvs[b0 + j], c * P:c * P + kc],
                               moving=qx[:, b0 + j, :])
        # one exp over every key tile (lanes kc..127 of a tail key tile hold stale PSUM
        # values: exp runs on them, and P·V never reads those lanes of Pᵀ)
        nisa.activation(dst=pT[:, :, :, :r], op=nl.exp,
                        data=st[:, 0:nkc, 0:m * r].reshape((P, nkc, m, r)), scale=sh.scale)
        sh.charge(0, nkc * m * r + INSTR_CYCLES)
        o = nl.ndarray((P, cdiv(m, per_o), MM_N), dtype=nl.float32, buffer=nl.psum)
        for j in range(m):
            ov = o[:r, j // per_o, (j % per_o) * w:(j % per_o + 1) * w]
            for c in range(nkc):
                kc = min(P, n - c * P)
                nisa.nc_matmul(dst=ov, stationary=pT[:kc, c, j, :r], moving=vals[:kc, c, kvs[b0 + j], :],
                               accumulate=(c > 0))
        _evict(sh, o, out[:, b0:b0 + m, :], m, r, vector=last or sh.ts_vec)
        if store is not None:
            store(b0, b0 + m)


def _evict(sh, o, out, nb, r, vector=False):
    """out[:, j, :] = O_j / rowsum_j for nb heads in PSUM o (per_o heads per bank)."""
    w = sh.Dv + 1
    per_o = MM_N // w
    o_raw = nl.ndarray((P, nb, w), dtype=nl.float32, buffer=nl.sbuf)
    recip = nl.ndarray((P, nb, 1), dtype=nl.float32, buffer=nl.sbuf)
    for g0 in range(0, nb, per_o):
        g = min(per_o, nb - g0)
        bank = o[:r, g0 // per_o, 0:g * w].reshape((r, g, w))
        if vector:
            eng = nisa.engine.vector
        else:
            eng = sh.pick(2 * INSTR_CYCLES + MIN_INSTRUCTION_CYCLES + g * sh.Dv, g * w + INSTR_CYCLES)
        if eng == nisa.engine.vector:
            nisa.reciprocal(dst=recip[:r, g0:g0 + g, :], data=bank[:, :, sh.Dv:w])
            nisa.tensor_tensor(dst=out[:, g0:g0 + g, :], data1=bank[:, :, 0:sh.Dv],
                               data2=recip[:r, g0:g0 + g, :].broadcast(2, sh.Dv), op=nl.multiply)
            continue
        nisa.activation(dst=o_raw[:r, g0:g0 + g, :], op=nl.copy, data=bank)
        for j in range(g0, g0 + g):
            _divide(sh, out[:, j, :], o_raw[:r, j, :], r)


def _unbiased_batch(sh, units, vals, out, r, n):
    """Attention of several heads for one 128-query tile, no mask.

    Only VectorE and ScalarE can read PSUM, and each softmax needs a pass over the scores
    for the row max (VectorE: ScalarE's accumulators only add) and one for the exp
    (ScalarE), plus the Pᵀ and output copies out of PSUM; fixed costs per instruction are
    amortised by batching heads:

    * S = Q·Kᵀ for every head side by side in PSUM (a bank holds 512 // n heads); one
      VectorE reduce takes all row maxes, one GpSimd op makes the biases -scale·max, and
      ScalarE computes P = exp(scale·S - scale·max) per head straight from PSUM.
    * Pᵀ: TensorE transposes 128x128 blocks into PSUM; each PSUM bank of blocks is copied
      to SBUF by VectorE (2x bf16 mode) or ScalarE, in the share that balances the two.
    * O | rowsum = P·[V | 1] (ones column in V).  Normalisation after P·V (FlashAttention-2):
      ScalarE copies each PSUM bank of outputs to SBUF, GpSimd divides per head.

    ``units``: (qᵀ [D, r], kᵀ [D, n], kv index) per head; ``out``: [r, heads, Dv] SBUF
    output rows of those (adjacent) heads."""
    nb = len(units)
    # ---- S = Q·Kᵀ: head j at bank j // per_bank, column (j % per_bank) * n
    per_bank = max(1, MM_N // n)
    s = nl.ndarray((P, cdiv(nb, per_bank), max(MM_N, n) if nb == 1 else MM_N),
                   dtype=nl.float32, buffer=nl.psum)
    views = []
    for j, (qv, kv_view, _) in enumerate(units):
        c = (j % per_bank) * n
        view = s[:, j // per_bank, c:c + n]
        for c0 in range(0, n, MM_N):
            c1 = min(n, c0 + MM_N)
            nisa.nc_matmul(dst=view[:r, c0:c1], stationary=qv, moving=kv_view[:, c0:c1])
        views.append(view)
    # ---- row maxes in one VectorE pass over PSUM (min when scale < 0: max(scale·S) = scale·min(S))
    ext = nl.ndarray((P, nb), dtype=nl.float32, buffer=nl.sbuf)
    red = nl.maximum if sh.scale >= 0 else nl.minimum
    full_banks = nb // per_bank
    if full_banks:
        nisa.tensor_reduce(dst=ext[:r, 0:full_banks * per_bank].reshape((r, full_banks, per_bank)),
                           op=red, axis=3,
                           data=s[:r, 0:full_banks, 0:per_bank * n].reshape((r, full_banks, per_bank, n)))
    rest = nb - full_banks * per_bank
    if rest:
        nisa.tensor_reduce(dst=ext[:r, full_banks * per_bank:nb], op=red, axis=2,
                           data=s[:r, full_banks, 0:rest * n].reshape((r, rest, n)))
    # ---- exp biases -scale·max (GpSimd), then P = exp(scale·S - scale·max) on ScalarE
    neg_max = nl.ndarray((P, nb), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg_max[:r], data=ext[:r], op0=nl.multiply, operand0=-sh.scale,
                       engine=nisa.engine.gpsimd)
    nkc = cdiv(n, P)
    p = nl.ndarray((P, nb, nkc * P), dtype=sh.dtype, buffer=nl.sbuf)
    for j in range(nb):
        nisa.activation(dst=p[:r, j, 0:n], op=nl.exp, data=views[j][:r], bias=neg_max[:r, j:j + 1],
                        scale=sh.scale)
    # ---- Pᵀ in 128x128 blocks on TensorE; one PSUM->SBUF copy per PSUM bank of blocks
    blocks = [(j, c) for j in range(nb) for c in range(nkc)]
    pT = nl.ndarray((P, nb * nkc, P), dtype=sh.dtype, buffer=nl.sbuf)
    per_tp = PSUM_BANK_BYTES // (P * sh.isz)
    w = sh.Dv + 1
    per_o = MM_N // w
    sh.charge(nb * n + INSTR_CYCLES * cdiv(nb, per_bank), nb * (n + INSTR_CYCLES))
    if sh.dma_t and sh.use_dma():
        _dma_transpose_p(p, pT.reshape((P, nb, nkc, P)), r, n)
        blocks = []
    for i0 in range(0, len(blocks), per_tp):
        chunk = blocks[i0:i0 + per_tp]
        tp = nl.ndarray((P, per_tp, P), dtype=sh.dtype, buffer=nl.psum)
        for i, (j, c) in enumerate(chunk):
            kc = min(P, n - c * P)
            nisa.nc_transpose(dst=tp[:kc, i, :r], data=p[:r, j, c * P:c * P + kc])
        # rows kc..127 of a tail block are never written nor read by the P·V matmul below
        nisa.tensor_copy(dst=pT[:, i0:i0 + len(chunk), :r], src=tp[:, 0:len(chunk), :r],
                         engine=sh.pick(*sh.copy_cycles(len(chunk) * r)))
    # ---- O | rowsum = P·[V | 1]: head j at bank j // per_o, column (j % per_o) * (Dv + 1)
    o = nl.ndarray((P, cdiv(nb, per_o), MM_N), dtype=nl.float32, buffer=nl.psum)
    for j, (_, _, kv) in enumerate(units):
        ov = o[:r, j // per_o, (j % per_o) * w:(j % per_o + 1) * w]
        for c in range(nkc):
            kc = min(P, n - c * P)
            nisa.nc_matmul(dst=ov, stationary=pT[:kc, j * nkc + c, :r], moving=vals[:kc, c, kv, :],
                           accumulate=(c > 0))
    # ---- out = O / rowsum, one PSUM bank of outputs at a time, on the less loaded of:
    #      VectorE (one reciprocal of the rowsums, one multiply), or ScalarE (one copy to
    #      SBUF) + GpSimd (one divide per head)
    _evict(sh, o, out, nb, r)


def _launch(q, k, v, mask, scale, causal, layout, key_block, group_fn):
    sh = _Shapes(q, k, v, mask, scale, causal, layout, key_block)
    _ts_plan(sh)
    if layout == "bhsd":
        out = nl.ndarray((sh.B, sh.H, sh.Sq, sh.Dv), dtype=q.dtype, buffer=nl.shared_hbm)
    else:
        out = nl.ndarray((sh.B, sh.Sq, sh.H, sh.Dv), dtype=q.dtype, buffer=nl.shared_hbm)
    base = None
    if sh.causal and sh.mask is None:
        # base[p, x] = 0 where x <= p - 1 else -inf: every causal diagonal tile is a view of it
        zeros = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=zeros, value=0.0, engine=nisa.engine.gpsimd)
        base = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
        nisa.affine_select(dst=base, pattern=[[-1, P]], channel_multiplier=1, on_true_tile=zeros,
                           on_false_value=NEG_INF, cmp_op=nl.greater_equal, offset=-1)
    for b in range(sh.B):
        key_bias = _key_bias(sh, b)
        for hk0 in range(0, sh.Hkv, sh.kv_group):
            group_fn(sh, q, k, v, mask, out, b, hk0, min(sh.Hkv, hk0 + sh.kv_group), key_bias, base)
    return out


@nki.jit
def attention_kernel(q, k, v, mask=None, scale=1.0, causal=False, layout="bhsd"):
    """Single-pass attention for Sk <= SINGLE_PASS_MAX_KEYS (see the module docstring)."""
    sk = k.shape[2] if layout == "bhsd" else k.shape[1]
    assert sk <= SINGLE_PASS_MAX_KEYS, \
        f"attention_kernel: Sk={sk} exceeds {SINGLE_PASS_MAX_KEYS}; use flash_attention_kernel"
    return _launch(q, k, v, mask, scale, causal, layout, max(1, sk), _single_pass_group)


# ------------------------------------------------------------------------------ flash

def _flash_group(sh, q, k, v, mask, out, b, hk0, hk1, key_bias, base):
    h0, h1 = hk0 * sh.G, hk1 * sh.G
    nh = h1 - h0
    for t0 in range(0, sh.nqt, sh.q_chunk):
        t1 = min(sh.nqt, t0 + sh.q_chunk)
        s0, s1 = t0 * P, min(sh.Sq, t1 * P)
        nt = t1 - t0
        qT = _load_transposed(sh, q, b, h0, h1, s0, s1)
        acc = nl.ndarray((P, nt, nh, sh.Dv + 1), dtype=nl.float32, buffer=nl.sbuf)   # O | rowsum
        neg_max = nl.ndarray((P, nt, nh), dtype=nl.float32, buffer=nl.sbuf)          # running -max
        last_key = min(sh.Sk, s1) if sh.causal else sh.Sk
        for k0 in range(0, last_key, sh.key_block):
            k1 = min(sh.Sk, k0 + sh.key_block)
            kT = _load_transposed(sh, k, b, hk0, hk1, k0, k1)
            vals = _load_values(sh, v, b, hk0, hk1, k0, k1)
            for t in range(t0, t1):
                q0 = t * P
                r = min(P, sh.Sq - q0)
                if sh.causal and k0 > q0 + r - 1:
                    continue                      # block entirely above the diagonal
                n = min(k1, q0 + r) - k0 if sh.causal else k1 - k0
                per_head = sh.mask_kind == "full" and mask.shape[1] > 1
                shared = None if per_head else _tile_bias(sh, b, 0, q0, r, k0, k0 + n, key_bias)
                diag = _diag(sh, base, q0, r, k0, n) if sh.causal and sh.mask is None else None
                for hq in range(h0, h1):
                    bias = _tile_bias(sh, b, hq, q0, r, k0, k0 + n, key_bias) if per_head else shared
                    _flash_unit(sh, qT[:, hq - h0, q0 - s0:q0 - s0 + r], kT[:, hq // sh.G - hk0, :],
                                vals, hq // sh.G - hk0, acc[:, t - t0, hq - h0, :],
                                neg_max[:, t - t0, hq - h0:hq - h0 + 1], bias, diag, r, n, first=(k0 == 0))
        o_sb = nl.ndarray((P, nt, nh, sh.Dv), dtype=out.dtype, buffer=nl.sbuf)
        for t in range(t0, t1):
            r = min(P, sh.Sq - t * P)
            for j in range(nh):
                _divide(sh, o_sb[:r, t - t0, j, :], acc[:r, t - t0, j, :], r)
        _store_rows(sh, out, o_sb, b, h0, h1, s0, s1)


def _flash_unit(sh, qT, kT, vals, kv, acc, run_neg_max, bias, diag, r, n, first):
    """One key block of one (head, query tile): online-softmax update of acc (O | rowsum,
    SBUF fp32) and run_neg_max (-running max, scaled units)."""
    s = _scores(sh, qT, kT[:, 0:n], r, n)
    p, blk, z, c = _row_max(sh, s, r, n, bias, diag)
    v_cyc, s_cyc = _softmax_cycles(sh, n, bias, diag)
    if first:
        _row_exp(sh, p, s, z, c, r, n, blk)
        nisa.tensor_copy(dst=run_neg_max[:r], src=blk[:r], engine=nisa.engine.gpsimd)
        sh.charge(v_cyc, s_cyc + sh.Dv + 1 + INSTR_CYCLES)
        o = _pv(sh, p, vals, kv, r, n)
        nisa.tensor_copy(dst=acc[:r], src=o[:r], engine=nisa.engine.scalar)
        return
    # new running -max = min(old, block); alpha = exp(old max - new max) rescales acc
    new = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=new[:r], data1=run_neg_max[:r], data2=blk[:r], op=nl.minimum,
                       engine=nisa.engine.gpsimd)
    alpha = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=alpha[:r], op=nl.exp, data=run_neg_max[:r], bias=new[:r], scale=-1.0)
    _row_exp(sh, p, s, z, c, r, n, new)
    nisa.tensor_copy(dst=run_neg_max[:r], src=new[:r], engine=nisa.engine.gpsimd)
    sh.charge(v_cyc + 2 * (sh.Dv + 1) + INSTR_CYCLES, s_cyc + 2 * INSTR_CYCLES)
    o = _pv(sh, p, vals, kv, r, n)
    # acc = acc·alpha + O (acc in SBUF, O in PSUM)
    nisa.scalar_tensor_tensor(dst=acc[:r], data=acc[:r], op0=nl.multiply, operand0=alpha[:r],
                              op1=nl.add, operand1=o[:r])


@nki.jit
def flash_attention_kernel(q, k, v, mask=None, scale=1.0, causal=False, layout="bhsd",
                           key_block=KEY_BLOCK):
    """Online-softmax (flash) attention for any Sk (see the module docstring)."""
    assert 1 <= key_block <= KEY_BLOCK, f"key_block={key_block} must be in [1, {KEY_BLOCK}]"
    return _launch(q, k, v, mask, scale, causal, layout, key_block, _flash_group)

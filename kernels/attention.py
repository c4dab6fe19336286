"""Scaled dot-product attention, ``softmax(Q·Kᵀ·scale + mask)·V``, for AWS Trainium (NKI beta 2).

Two entry points share the building blocks of attention_blocks.py:

* ``attention_kernel`` (single pass, ``Sk <= SINGLE_PASS_MAX_KEYS``): for each 128-query
  tile the whole score row ``[128, Sk]`` stays in PSUM; one max, one exp, one P·V.
* ``flash_attention_kernel`` (online softmax, any ``Sk``): keys stream through in blocks
  of ``KEY_BLOCK``; the running max, the running sum and the unnormalised output are
  rescaled per block (FlashAttention-2), so SBUF/PSUM use does not grow with ``Sk``.

Dimensions:
    B: batch (>= 1).  H: query heads.  Hkv: key/value heads, H % Hkv == 0 (GQA: query head
    h reads kv head h // (H // Hkv)).  Sq, Sk: query / key lengths (any >= 1; tails of
    128-row tiles are handled, nothing needs padding).  D: q/k head dim <= 256 (Q·Kᵀ
    accumulates one matmul per 128 of D).  Dv: v head dim <= 256.
Layouts (static ``layout``):
    "bhsd": q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv], out [B, H, Sq, Dv].
    "bshd": q [B, Sq, H, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv], out [B, Sq, H, Dv]
            (how transformers' projections lay tensors out: read and written with no copy).
Args:
    q, k, v: HBM, all float32 or all bfloat16 or all float16.
    mask: optional HBM float32, additive (0 = attend, -inf = masked, any finite value is
        added): [Bm, Sk] (key padding, Bm in {1, B}) or [Bm, Hm, Sq, Sk] (Hm in {1, H}).
    scale: softmax scale (any finite float).  causal: keep key j <= query i (top-left).
    mask_period: 0, or a positive Sm dividing Sq where a [Bm, Hm, Sq, Sk] mask's row s
        equals its row s % Sm (the op folds a kv head's G query heads into G·Sm rows that
        share one mask): the decode path then loads Sm rows per (batch, head), not Sq. A
        promise the kernel does not check against the mask's values (only the decode path
        uses it: a wrong period gives wrong output there).
Returns:
    out: HBM (shared_hbm), dtype of q, layout above.
Engines, per 128-query tile and head.  Only VectorE and ScalarE can read PSUM, and every
softmax needs one pass over the scores for the row max (VectorE: ScalarE's accumulators can
only add) and one for the exp (ScalarE); the copies out of PSUM are placed to keep the two
equally busy, and the DMA queues take part of the Pᵀ work when they have room:
    TensorE  S = Q·Kᵀ into PSUM (fp32); O = P·[V | 1] into PSUM (the ones column of V gives
             the row sum of the same rounded P that multiplies V); Pᵀ by 128x128 transposes.
    VectorE  z = -scale·S straight from PSUM into SBUF with the row max in the same
             instruction (tensor_scalar_reduce, one per head); masked columns: -(scale·S
             + mask) first, then the reduce. Rows past 1024 keys without a user mask
             come in PSUM pieces of <= 1024 keys (S_PIECE_KEYS), one reduce each.
    ScalarE  P = exp(scale·S - scale·max), read as -z from SBUF (matmul dtype).
    VectorE or ScalarE (whichever the launch's running estimate says is less loaded,
             EngineBalance.pick in attention_plan.py): each PSUM bank of Pᵀ blocks copied
             to SBUF; each PSUM bank of outputs either normalised by VectorE (the row
             sums' reciprocals, then one multiply) or copied by ScalarE and scaled by
             GpSimd, all its heads at once (the sums' power of -1, then one multiply: NKI's
             ISA has no divide) (FlashAttention-2: one normalisation, after P·V). Masked
             and causal units always take the ScalarE + GpSimd path, except that the
             program's last unit (and every bank of the transposed path's last unit and of
             the decode path) is normalised by VectorE: it ends the launch, and the other
             path chains two engines. The flash path normalises its SBUF accumulators on
             GpSimd (divide).
    GpSimd   the exp biases (the min of a row's pieces' parts; the clamp where a row can
             be masked everywhere), that normalisation, the causal tile (affine_select),
             constants.
    DMA      Qᵀ and Kᵀ arrive transposed (dma_transpose, 16-bit dtypes) or are transposed
             on TensorE (fp32); V and the output move as [128 rows, heads, D] blocks
             covering every head of a group in one transfer; for 16-bit data a share of
             Pᵀ is made by DMA transposes instead of TensorE + a PSUM copy
             (EngineBalance.loads.dma_share levels the DMA queues with VectorE/ScalarE).
Transposed scores (attention_kernel with bf16, no mask, not causal, D <= 125, Dv <= 128,
    Sk <= 384, or Sk <= 768 with at least 4 query heads per core; attention_transposed.py):
    P is made directly as Pᵀ, with no Pᵀ
    transposes or PSUM copies.  VectorE takes the row max m
    from S as above; GpSimd splits m into bf16 hi + mid + lo (summing exactly to m) and one
    DMA transpose per tile puts them on partitions D..D+2 of Qᵀ; TensorE computes
    Sᵀ = [Kᵀ; -1; -1; -1]ᵀ·[Qᵀ; hi; mid; lo] = (S - m)ᵀ per 128-key tile (fp32
    accumulation), and ScalarE Pᵀ = exp(scale·Sᵀ) with no per-partition bias, so one exp
    covers 4 heads and every key tile.  The max element of a row gives exactly exp(0), so
    no exp overflows, whatever the logits' size.
Decode (16-bit, one query head per kv head, <= 32 query rows (<= 64 with a mask, within
    DECODE_MASKED_WIDE_SCORES), no causal flag (any mask), D <= 128, keys within the decode
    path's SBUF budget; not with return_lse):
    attention_decode.py puts the keys on the partitions, so a few query rows still use all
    128 lanes.
Causal: key blocks above the diagonal are skipped; only the ≤128 keys of the diagonal
    block take the masked path, the keys before it are read like unmasked ones.
Numerics:
    matmul operands in the input dtype (bf16 stays bf16, fp32 stays fp32), accumulation,
    softmax statistics and normalisation in fp32, one rounding into the output dtype.
    A query row whose keys are all masked (-inf) returns 0 (as torch's SDPA).
"""

import nki
import nki.language as nl

from .attention_blocks import causal_base, key_bias_rows
from .attention_decode import decode_attention
from .attention_flash import flash_group
from .attention_launch import KEY_BLOCK, LaunchTensors, launch_facts
from .attention_plan import EngineBalance
from .attention_single_pass import single_pass_group
from .attention_transposed import TransposedKeys, transposed_scores_group
from .attention_work import program_units
from .limits import ATTENTION_SINGLE_PASS_MAX_KEYS as SINGLE_PASS_MAX_KEYS

# The kernel's modules: attention_launch.py (LaunchFacts: what a launch is, frozen),
# attention_plan.py (EngineBalance: the running engine-load estimates and the choices made
# from them) with engine_costs.py (the cost model's figures per generation), attention_blocks.py (loads,
# masks, scores, row max, exp, Pᵀ, P·V, eviction), and one module per path:
# attention_single_pass.py, attention_transposed.py, attention_flash.py.


@nki.jit
def attention_kernel(q, k, v, mask=None, scale=1.0, causal=False, layout="bhsd", return_lse=False,
                     mask_period=0):
    """Single-pass attention for Sk <= SINGLE_PASS_MAX_KEYS (see the module docstring).
    ``return_lse``: also return lse [B, H, Sq] fp32 for the backward (attention_lse.py)."""
    sk = k.shape[2] if layout == "bhsd" else k.shape[1]
    assert sk <= SINGLE_PASS_MAX_KEYS, \
        f"attention_kernel: Sk={sk} exceeds {SINGLE_PASS_MAX_KEYS}; use flash_attention_kernel"
    return _launch(q, k, v, mask, scale, causal, layout, max(1, sk), flash=False, return_lse=return_lse,
                   mask_period=mask_period)


@nki.jit
def flash_attention_kernel(q, k, v, mask=None, scale=1.0, causal=False, layout="bhsd",
                           key_block=KEY_BLOCK, return_lse=False, mask_period=0):
    """Online-softmax (flash) attention for any Sk (see the module docstring).
    ``return_lse``: also return lse [B, H, Sq] fp32 for the backward (attention_lse.py)."""
    assert 1 <= key_block <= KEY_BLOCK, f"key_block={key_block} must be in [1, {KEY_BLOCK}]"
    return _launch(q, k, v, mask, scale, causal, layout, key_block, flash=True, return_lse=return_lse,
                   mask_period=mask_period)


def _launch(q, k, v, mask, scale, causal, layout, key_block, flash, return_lse=False, mask_period=0):
    """Set up the launch (facts, planner, launch-wide tiles, HBM output), then run the
    path's group function for each of this program's work units (attention_work.py: at
    LNC=2 each physical core takes half of the (batch, kv head) pairs or query tiles).
    Returns out, or (out, lse) with ``return_lse``."""
    facts = launch_facts(q, k, v, mask, scale, causal, layout, key_block, mask_period)
    plan = EngineBalance(facts)
    if facts.decode and not return_lse:
        out = nl.ndarray(facts.out_shape(), dtype=q.dtype, buffer=nl.shared_hbm)
        tensors = LaunchTensors(q=q, k=k, v=v, mask=mask, out=out, causal_base=None, ts_keys=None)
        decode_attention(facts, plan, tensors, program_units(facts))
        return out
    # Set up whenever the launch qualifies, also for flash_attention_kernel, which never
    # uses it (kept: removing it changes the instruction trace; see docs/attention.md).
    ts_keys = TransposedKeys(facts) if facts.transposed_scores else None
    out = nl.ndarray(facts.out_shape(), dtype=q.dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((facts.B, facts.H, facts.Sq), dtype=nl.float32, buffer=nl.shared_hbm) if return_lse else None
    base = causal_base() if facts.causal_only else None
    tensors = LaunchTensors(q=q, k=k, v=v, mask=mask, out=out, causal_base=base, ts_keys=ts_keys, lse=lse)
    if flash:
        group = flash_group
    elif facts.transposed_scores:
        group = transposed_scores_group
    else:
        group = single_pass_group
    units = program_units(facts)
    key_bias, bias_batch = None, None
    for i, (b, hk0, hk1, t0, t1) in enumerate(units):
        if b != bias_batch:
            key_bias, bias_batch = key_bias_rows(facts, mask, b), b   # [128, Sk] fp32 SBUF or None
        group(facts, plan, tensors, b, hk0, hk1, (t0, t1), key_bias, last=i == len(units) - 1)
    if return_lse:
        return out, lse
    return out

"""The per-row log-sum-exp the attention forward saves for the backward (``return_lse``).

For query row i of head h, ``lse = log(sum_j exp(scale * S_ij + mask_ij))`` in fp32, i.e.
``-neg_max + log(rowsum)`` with the forward's running statistics: ``neg_max`` the negated
row max (scaled units, <= FLT_MAX: clamped where a row can be masked everywhere) and
``rowsum`` the sum of the row's P (the ones column of P·[V | 1]). The backward recomputes
``P = exp(scale * S + mask - lse)`` (FlashAttention-2), so no [Sq, Sk] tensor is kept.

A row whose keys are all masked (-inf) has rowsum 0: the log is taken of rowsum + TINY
(exact for every other row, whose rowsum is >= 1: its max element contributes exp(0)), so
its lse is about -FLT_MAX, finite, and the backward's exp(-inf - lse) is 0 there.

HBM layout: ``lse[B, H, Sq]`` fp32 whatever the attention layout (FlashAttention's
``softmax_lse`` layout). The forward paths write the statistics of a unit's query tiles
into an :class:`LseStage` (SBUF, [128, tiles, heads] fp32) as they are made; ``store``
turns them into lse (one ScalarE log, one GpSimd subtraction) and writes them with one
DMA per full-tile block and one for a tail tile.
"""

import nki.isa as nisa
import nki.language as nl

from .attention_launch import P

# Added to the row sum before the log: below every non-empty row's sum (>= 1), so only
# all-masked rows (sum 0) see it.
TINY = 1e-30


class LseStage(nl.NKIObject):
    """Row statistics of ``tiles`` query tiles x ``heads`` heads: [128, tiles, heads] fp32
    SBUF tiles ``neg_max`` and ``rowsum`` (written by the forward paths, GpSimd copies),
    or views of the flash path's own statistics (``views``: (neg_max, rowsum))."""

    def __init__(self, tiles, heads, views=None):
        if views is None:
            self.neg_max = nl.ndarray((P, tiles, heads), dtype=nl.float32, buffer=nl.sbuf)
            self.rowsum = nl.ndarray((P, tiles, heads), dtype=nl.float32, buffer=nl.sbuf)
        else:
            self.neg_max, self.rowsum = views
        self.tiles = tiles
        self.heads = heads

    def put_neg_max(self, t, j0, src, r):
        """neg_max of tile t, heads j0.. from ``src`` [r, heads] fp32 SBUF (GpSimd copy)."""
        nj = src.shape[-1]
        nisa.tensor_copy(dst=self.neg_max[:r, t, j0:j0 + nj], src=src, engine=nisa.engine.gpsimd)

    def put_scaled_max(self, t, j0, ext, r, scale):
        """neg_max = -scale * ext of tile t, heads j0.. (``ext`` [r, heads]: the raw row max,
        or the min for scale < 0: the transposed-scores path's extrema)."""
        nj = ext.shape[-1]
        nisa.tensor_scalar(dst=self.neg_max[:r, t, j0:j0 + nj], data=ext, op0=nl.multiply,
                           operand0=-scale, engine=nisa.engine.gpsimd)

    def rowsum_view(self, t, j0, nj, r):
        """[r, nj] view of the row sums of tile t, heads j0:j0+nj (for evict / normalize)."""
        return self.rowsum[:r, t, j0:j0 + nj]

    def store(self, lse, b, h0, s0, s1):
        """lse[b, h0:h0+heads, s0:s1] (HBM fp32) <- log(rowsum + TINY) - neg_max."""
        tiny = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=tiny, value=TINY, engine=nisa.engine.gpsimd)
        out = nl.ndarray((P, self.tiles, self.heads), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=out, op=nl.log, data=self.rowsum, bias=tiny)
        nisa.tensor_tensor(dst=out, data1=out, data2=self.neg_max, op=nl.subtract,
                           engine=nisa.engine.gpsimd)
        store_lse(lse, out, b, h0, h0 + self.heads, s0, s1)


def lse_rows(lse, b, h0, h1, s0, s1):
    """HBM view [s1-s0, h1-h0] of lse[b, h0:h1, s0:s1] (rows on the first axis)."""
    return lse[b, h0:h1, s0:s1].permute((1, 0))


def store_lse(lse, tile, b, h0, h1, s0, s1):
    """lse[b, h0:h1, s0:s1] (HBM) <- tile [128, tiles, h1-h0] fp32 SBUF (row s0 + 128 t + p
    at partition p of tile t): one DMA for the full tiles, one for a tail."""
    n = s1 - s0
    full = n // P
    if full:
        view = lse_rows(lse, b, h0, h1, s0, s0 + full * P).reshape((full, P, h1 - h0)).permute((1, 0, 2))
        nisa.dma_copy(dst=view, src=tile[:, 0:full, :])
    tail = n - full * P
    if tail:
        nisa.dma_copy(dst=lse_rows(lse, b, h0, h1, s0 + full * P, s1), src=tile[:tail, full, :])


def load_lse(lse, tile, b, h0, h1, s0, s1):
    """tile [128, tiles, h1-h0] fp32 SBUF <- lse[b, h0:h1, s0:s1] (the layout of store_lse)."""
    n = s1 - s0
    full = n // P
    if full:
        view = lse_rows(lse, b, h0, h1, s0, s0 + full * P).reshape((full, P, h1 - h0)).permute((1, 0, 2))
        nisa.dma_copy(dst=tile[:, 0:full, :], src=view)
    tail = n - full * P
    if tail:
        nisa.dma_copy(dst=tile[:tail, full, :], src=lse_rows(lse, b, h0, h1, s0 + full * P, s1))

"""Weight gradients of the row kernels' backward: column sums over rows, on TensorE, one
partial per work part, without a race between the programs of an LNC=2 launch.

Two forms, both on TensorE (otherwise idle in these kernels):

* **column sums** (``accumulate_columns``): ``sum_rows t[row, h] * f[row]`` of a product
  tile ``t`` the kernel computed anyway (or of ``dy`` itself for a bias), described below;
* **diagonal sums** (``accumulate_diag``): ``sum_rows a[row, h] * b[row, h]`` of two tiles
  WITHOUT computing their product: per 128-column chunk one matmul ``a_chunk^T b_chunk``
  ([128, 128] in PSUM, accumulated over the part's rows), whose diagonal is the chunk's
  sums; the diagonal is taken once per part at the end (``store_diag_partial``: VectorE
  mask with the identity and row-reduce). It saves the kernel a two-input VectorE/GpSimd
  pass per element for 128 TensorE cycles per 128 columns (max(min(64, M), N, M/4) with
  M = N = 128), at the price of C * 512 bytes of PSUM per partition (C 128-column chunks:
  all 8 banks at H = 4096, ``diag_fits``).

A norm's weight gradient is a sum over rows, ``dweight[h] = sum_rows t[row, h]`` (rms_norm:
``t = dy * x * rstd``). Rows sit on partitions, so the sum over rows is TensorE's
contraction: for each 128-column chunk c of a row slot, one matmul with the [rows, w]
chunk of the products as the *stationary* operand and a [rows, 1] column (the per-row
factor, e.g. rstd, or ones) as the *moving* one writes ``[w, 1]`` = the chunk's column sums
onto w partitions, accumulated in PSUM over every row of the part. The accumulator is one
PSUM tile ``[128, C]`` fp32, C = ceil(H / 128) <= 64 (one 2 KiB bank for H <= 8192):
column ``h = c * 128 + p`` sits at ``[p, c]``. Each matmul costs max(64, M/4) = 64 TensorE
cycles for 128 x 128 products (cost model: ``max(min(64, M), N, M / 4)``, M = 128, N = 1),
half a cycle per element: TensorE is otherwise idle in these kernels. The products are
16-bit for 16-bit inputs (bf16: fp32 range), fp32 for fp32 inputs (x4 cycles); PSUM
accumulates in fp32.

No race: each WORK_PARTS part (tiling.program_row_parts; at LNC=2 one per program) has
its own accumulator and writes its own slice ``partials[part]`` of an HBM
``[WORK_PARTS, 128, C]`` fp32 output; no two programs write the same bytes, and no
program reads another's. The op wrapper sums the WORK_PARTS partials in fp32 in a fixed
order and un-permutes ``[p, c]`` to ``h`` (a [2, H] sum: a second kernel launch would
cost more than the adds, and summing on chip across cores would need a barrier between
the programs). At LNC=1 the one program fills both slices in turn: the same partials, so
the result is bit-identical at both degrees.
"""

import nki.isa as nisa
import nki.language as nl

from .tiling import PARTITIONS, cdiv

# PSUM per partition: 8 banks of 2 KiB on trn1-trn3 (nl.tile_size; AWS NKI architecture
# guide, "PSUM"). A diagonal accumulator takes 128 fp32 = 512 bytes per 128-column chunk.
PSUM_BANKS = nl.tile_size.psum_num_banks
PSUM_BANK_BYTES = nl.tile_size.psum_bank_fmax_bytes
DIAG_CHUNK_BYTES = PARTITIONS * 4


def partial_columns(cols):
    """C: the accumulator's columns (128-column chunks of a row of ``cols``)."""
    return cdiv(cols, PARTITIONS)


def new_partials(cols, count):
    """HBM [count, 128, C] fp32 output for ``count`` column-sum partials (shared_hbm)."""
    return nl.ndarray((count, PARTITIONS, partial_columns(cols)), dtype=nl.float32, buffer=nl.shared_hbm)


def new_accumulator(cols):
    """A PSUM [128, C] fp32 accumulator of one part's column sums."""
    return nl.ndarray((PARTITIONS, partial_columns(cols)), dtype=nl.float32, buffer=nl.psum)


def accumulate_columns(acc, products, factor, first):
    """acc[p, c] (+)= sum_rows products[row, c * 128 + p] * factor[row] for one row slot.

    ``products``: SBUF [rows, cols] (16-bit or fp32); ``factor``: SBUF [rows, 1] of the
    same dtype class; ``first``: this is the part's first slot (overwrite, else add)."""
    cols = products.shape[-1]
    for c in range(partial_columns(cols)):
        c0 = c * PARTITIONS
        width = min(cols, c0 + PARTITIONS) - c0
        nisa.nc_matmul(dst=acc[0:width, c:c + 1], stationary=products[:, c0:c0 + width], moving=factor,
                       accumulate=not first)


def store_partial(partials, part, acc, cols, started):
    """Write one part's accumulator to ``partials[part]`` (zeros for a part with no rows):
    PSUM -> SBUF on VectorE, then one DMA. Only the accumulator entries the matmuls wrote
    are read (the last chunk of a row whose ``cols`` is not a multiple of 128 fills
    ``cols % 128`` partitions); the rest of the tile is zeroed."""
    n_chunks = partial_columns(cols)
    last = cols - (n_chunks - 1) * PARTITIONS
    tile = nl.ndarray((PARTITIONS, n_chunks), dtype=nl.float32, buffer=nl.sbuf)
    if not started or last < PARTITIONS:
        nisa.memset(dst=tile, value=0.0)
    if started:
        if n_chunks > 1:
            nisa.tensor_copy(dst=tile[:, 0:n_chunks - 1], src=acc[:, 0:n_chunks - 1])
        nisa.tensor_copy(dst=tile[0:last, n_chunks - 1:n_chunks], src=acc[0:last, n_chunks - 1:n_chunks])
    nisa.dma_copy(dst=partials[part], src=tile)


def diag_fits(cols, other_banks=0):
    """Whether a diagonal accumulator for rows of ``cols`` fits PSUM beside ``other_banks``
    banks of other accumulators."""
    return partial_columns(cols) * DIAG_CHUNK_BYTES <= (PSUM_BANKS - other_banks) * PSUM_BANK_BYTES


def new_diag_accumulator(cols):
    """A PSUM [128, C, 128] fp32 accumulator of one part's diagonal sums."""
    return nl.ndarray((PARTITIONS, partial_columns(cols), PARTITIONS), dtype=nl.float32, buffer=nl.psum)


def accumulate_diag(acc, a, b, first):
    """acc[:, c, :] (+)= a_chunk^T b_chunk for each 128-column chunk c of [rows, cols]
    SBUF tiles ``a`` (stationary) and ``b`` (moving) of one row slot: its diagonal
    acc[p, c, p] gains sum_rows a[row, c * 128 + p] * b[row, c * 128 + p]."""
    cols = a.shape[-1]
    for c in range(partial_columns(cols)):
        c0 = c * PARTITIONS
        width = min(cols, c0 + PARTITIONS) - c0
        nisa.nc_matmul(dst=acc[0:width, c, 0:width], stationary=a[:, c0:c0 + width], moving=b[:, c0:c0 + width],
                       accumulate=not first)


def identity():
    """[128, 128] fp32 identity in SBUF (GpSimd affine_select: 1 where p - j == 0)."""
    ones = nl.ndarray((PARTITIONS, PARTITIONS), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    eye = nl.ndarray((PARTITIONS, PARTITIONS), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=eye, pattern=[[-1, PARTITIONS]], channel_multiplier=1, on_true_tile=ones,
                       on_false_value=0.0, cmp_op=nl.equal)
    return eye


def store_diag_partial(partials, part, acc, cols, started, eye):
    """Write the diagonal of one part's accumulator to ``partials[part]`` (zeros for a part
    with no rows): VectorE multiplies the PSUM chunks by the identity and row-reduces them
    (the full chunks in one pass each, the last partial chunk on its written corner)."""
    n_chunks = partial_columns(cols)
    last = cols - (n_chunks - 1) * PARTITIONS
    tile = nl.ndarray((PARTITIONS, n_chunks), dtype=nl.float32, buffer=nl.sbuf)
    if not started or last < PARTITIONS:
        nisa.memset(dst=tile, value=0.0)
    if started:
        for c0, c1, w in ((0, n_chunks - 1, PARTITIONS), (n_chunks - 1, n_chunks, last)):
            if c1 <= c0:
                continue
            masked = nl.ndarray((w, c1 - c0, w), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=masked, data1=acc[0:w, c0:c1, 0:w], op=nl.multiply,
                               data2=eye[0:w, 0:w].expand_dim(1).broadcast_to((w, c1 - c0, w)))
            nisa.tensor_reduce(dst=tile[0:w, c0:c1], op=nl.add, data=masked, axis=2)
    nisa.dma_copy(dst=partials[part], src=tile)

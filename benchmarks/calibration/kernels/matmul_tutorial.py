"""The NKI matrix-multiplication tutorial's optimized kernels, measured on trn1.32xlarge in
bf16 (aws-neuron-sdk @72825d50 general/nki/tutorials/matrix_multiplication.rst, its table of
latency and HFU; kernels general/nki/examples/matrix_multiplication/
matrix_multiplication_nki_kernels.py at the same commit, benchmarked there with
``nki.benchmark(warmup=5, iters=10)``, P99).

    result[M, N] = lhsT[K, M].T @ rhs[K, N]      K = 8192, M = 4096, N = 8192

Our own beta-2 code (NKI 0.7) issuing each beta-1 kernel's instruction stream; the tutorial's
first kernel ("Original Tiled") is Autocomp's first GEMM kernel, whose port
(``autocomp_gemm:gemm``, variant s20_99) its row runs. The porting rules are the other beta-1
ports' (kernels/autocomp_gemm.py, kernels/autocomp_attention.py): an ``nl.zeros`` PSUM
accumulator that matmuls add into is no memset (the first matmul writes the fresh tile);
``nl.copy`` out of PSUM or SBUF is a ScalarE copy; ``nl.zeros`` in SBUF is a VectorE memset
and ``+=`` of two tiles a VectorE tensor_tensor; the beta-1 affine loops are plain loops and
``nl.sequential_range`` stays (the row's ``compiler = "beta1"``). A beta-1 tile with a block
dimension before its partitions (``nl.par_dim``) is one tile here, partitions first, the
block dimension next: the same bytes per partition, one allocation. fully_optimized's
``nl.zeros`` of its whole [2, 16, 2, 128, 512] result block is one memset of the tile here;
the compiler may have issued it in pieces (no profile says).

    version      per block of output                          tiles kept in SBUF
    hoist_load   one 128-row M tile: its 64 lhsT tiles once;  lhsT [128, 64, 512] (the source
                 per 512-column N tile its 64 rhs tiles       allocates 512 columns, loads 128),
                                                              rhs [128, 64, 512]
    block_free   2 M tiles x 2 N tiles: 128 lhsT and 128 rhs  lhsT [128, 2, 64, 128],
                 tiles per block pair                         rhs [128, 2, 64, 512]
    fully_opt    per 1024 columns of N: a bf16 SBUF result    result [128, 2, 16, 2, 512] zeroed;
                 block; per 1024 rows of K (sequential):      rhs [128, 8, 1024] per K block,
                 8 rhs rows [128, 1024], then per 2048 rows   lhsT [128, 8, 2048] per K and M
                 of M 8 lhsT rows [128, 2048] and 2 x 16      block; [128, 1024] packed output
                 output tiles of 8 matmuls each, added into
                 the result block on VectorE; then each
                 128-row strip packed by two copies, stored
"""

import nki
import nki.isa as nisa
import nki.language as nl

P = 128          # K tile (partitions) and M tile (the stationary's free size)
TILE_N = 512     # the moving free size (one PSUM bank of fp32)

# fully_optimized's meta-parameters, as the tutorial benchmarks it
FULL_TILES_M, FULL_TILES_N, FULL_TILES_K = 16, 2, 8
VERSIONS = ("hoist_load", "block_free", "fully_optimized")


def _check(lhsT, rhs, version):
    K, M = lhsT.shape
    K2, N = rhs.shape
    if version not in VERSIONS:
        raise ValueError(f"matmul: version={version!r}; expected one of {VERSIONS}")
    if K2 != K:
        raise ValueError(f"matmul: rhs.shape[0]={K2} must equal lhsT.shape[0]={K} (the contraction)")
    blocks = {"hoist_load": (P, P, TILE_N), "block_free": (P, 2 * P, 2 * TILE_N),
              "fully_optimized": (FULL_TILES_K * P, FULL_TILES_M * P, FULL_TILES_N * TILE_N)}[version]
    for what, value, block in zip(("lhsT.shape[0] (K)", "lhsT.shape[1] (M)", "rhs.shape[1] (N)"), (K, M, N), blocks):
        if value % block:
            raise ValueError(f"matmul {version}: {what}={value} must be a multiple of {block} (the tutorial's "
                             "kernels issue no tail tiles)")
    return K, M, N


def _copy_out(out, acc, row0, col0):
    """A PSUM accumulator [128, 512] copied to SBUF in out's dtype (ScalarE) and stored."""
    t = nl.ndarray((P, TILE_N), dtype=out.dtype, buffer=nl.sbuf)
    nisa.activation(dst=t, op=nl.copy, data=acc)
    nisa.dma_copy(dst=out[row0:row0 + P, col0:col0 + TILE_N], src=t)


def _hoist_load(lhsT, rhs, out, K, M, N):
    kt = K // P
    for m in range(M // P):
        lhs_tiles = nl.ndarray((P, kt, TILE_N), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in range(kt):
            nisa.dma_copy(dst=lhs_tiles[:, k, 0:P], src=lhsT[k * P:(k + 1) * P, m * P:(m + 1) * P])
        for n in range(N // TILE_N):
            rhs_tiles = nl.ndarray((P, kt, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in range(kt):
                nisa.dma_copy(dst=rhs_tiles[:, k, :], src=rhs[k * P:(k + 1) * P, n * TILE_N:(n + 1) * TILE_N])
            acc = nl.ndarray((P, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for k in range(kt):
                nisa.nc_matmul(dst=acc, stationary=lhs_tiles[:, k, 0:P], moving=rhs_tiles[:, k, :])
            _copy_out(out, acc, m * P, n * TILE_N)


def _block_free(lhsT, rhs, out, K, M, N):
    kt, bm_tiles, bn_tiles = K // P, 2, 2
    for m in range(M // (bm_tiles * P)):
        lhs_tiles = nl.ndarray((P, bm_tiles, kt, P), dtype=lhsT.dtype, buffer=nl.sbuf)
        for bm in range(bm_tiles):
            for k in range(kt):
                c0 = (m * bm_tiles + bm) * P
                nisa.dma_copy(dst=lhs_tiles[:, bm, k, :], src=lhsT[k * P:(k + 1) * P, c0:c0 + P])
        for n in range(N // (bn_tiles * TILE_N)):
            rhs_tiles = nl.ndarray((P, bn_tiles, kt, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
            for bn in range(bn_tiles):
                for k in range(kt):
                    c0 = (n * bn_tiles + bn) * TILE_N
                    nisa.dma_copy(dst=rhs_tiles[:, bn, k, :], src=rhs[k * P:(k + 1) * P, c0:c0 + TILE_N])
            for bm in range(bm_tiles):
                for bn in range(bn_tiles):
                    acc = nl.ndarray((P, TILE_N), dtype=nl.float32, buffer=nl.psum)
                    for k in range(kt):
                        nisa.nc_matmul(dst=acc, stationary=lhs_tiles[:, bm, k, :], moving=rhs_tiles[:, bn, k, :])
                    _copy_out(out, acc, (m * bm_tiles + bm) * P, (n * bn_tiles + bn) * TILE_N)


def _fully_optimized(lhsT, rhs, out, K, M, N):
    tm, tn, tk = FULL_TILES_M, FULL_TILES_N, FULL_TILES_K
    block_m, block_n, block_k = tm * P, tn * TILE_N, tk * P
    blocks_m = M // block_m
    for n in range(N // block_n):
        # nl.zeros in SBUF, in lhsT's dtype as the source declares it: a VectorE memset
        result = nl.ndarray((P, blocks_m, tm, tn, TILE_N), dtype=lhsT.dtype, buffer=nl.sbuf)
        nisa.memset(dst=result, value=0.0, engine=nisa.engine.vector)
        for k in nl.sequential_range(K // block_k):
            rhs_tiles = nl.ndarray((P, tk, block_n), dtype=rhs.dtype, buffer=nl.sbuf)
            for bk in range(tk):
                r0 = (tk * k + bk) * P
                nisa.dma_copy(dst=rhs_tiles[:, bk, :], src=rhs[r0:r0 + P, block_n * n:block_n * (n + 1)])
            for m in range(blocks_m):
                lhs_tiles = nl.ndarray((P, tk, block_m), dtype=lhsT.dtype, buffer=nl.sbuf)
                for bk in range(tk):
                    r0 = (tk * k + bk) * P
                    nisa.dma_copy(dst=lhs_tiles[:, bk, :], src=lhsT[r0:r0 + P, block_m * m:block_m * (m + 1)])
                for bn in range(tn):
                    for bm in range(tm):
                        acc = nl.ndarray((P, TILE_N), dtype=nl.float32, buffer=nl.psum)
                        for bk in range(tk):
                            nisa.nc_matmul(dst=acc, stationary=lhs_tiles[:, bk, bm * P:(bm + 1) * P],
                                           moving=rhs_tiles[:, bk, bn * TILE_N:(bn + 1) * TILE_N])
                        # the source's result_tiles[...] += res_tile: VectorE, one input in PSUM
                        nisa.tensor_tensor(dst=result[:, m, bm, bn, :], data1=result[:, m, bm, bn, :], data2=acc,
                                           op=nl.add, engine=nisa.engine.vector)
        for m in range(blocks_m):
            for bm in range(tm):
                packed = nl.ndarray((P, block_n), dtype=result.dtype, buffer=nl.sbuf)
                for bn in range(tn):
                    nisa.activation(dst=packed[:, bn * TILE_N:(bn + 1) * TILE_N], op=nl.copy,
                                    data=result[:, m, bm, bn, :])
                r0 = (tm * m + bm) * P
                nisa.dma_copy(dst=out[r0:r0 + P, block_n * n:block_n * (n + 1)], src=packed)


@nki.jit
def matmul(lhsT, rhs, version):
    """lhsT [K, M] @ rhs [K, N] -> [M, N] in lhsT's dtype, as the tutorial's ``version``
    (hoist_load, block_free or fully_optimized) issues it."""
    K, M, N = _check(lhsT, rhs, version)
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    {"hoist_load": _hoist_load, "block_free": _block_free, "fully_optimized": _fully_optimized}[version](
        lhsT, rhs, out, K, M, N)
    return out

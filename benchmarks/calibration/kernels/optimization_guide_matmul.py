"""The four matmul kernels of AWS's "Introduction to NKI Kernel Optimization", profiled on
trn2 (aws-neuron/aws-neuron-sdk @81ce03ae nki/guides/tutorials/kernel-optimization.rst; the
profiles nki/img/how-to/v2-*.png .. v5-*.png; in the repository since 38480a9f, April 2026).

    result[M, N] = lhsT[K, M].T @ rhs[K, N]     K = 8192, M = 4096, N = 8192, fp32

The tutorial's driver builds its inputs with ``rng.random(..., dtype=np.float32)`` (lhs
[4096, 8192], rhs [8192, 8192]) and passes ``lhs.T``; its kernels are NKI 0.7 code already,
so this module issues each one's instruction stream in the same order with the same tiles
(our own code, one function per version). The profiles name the kernels only by their
images: v2 is the tiled kernel, v3 hoists the loads, v4 blocks M and N, v5 blocks K too.

    version   loads                                                   PSUM -> SBUF
    v2        one lhsT [128, 128] and one rhs [128, 512] per matmul   tensor_copy
    v3        lhsT: K/128 tiles once per 128 rows of M;               tensor_copy
              rhs: K/128 tiles per (M tile, N tile)
    v5        [128, 1024] rhs and [128, 2048] lhsT rows per K tile    tensor_tensor add into
              of a block of 16 x 2 output tiles and 8 K tiles         SBUF accumulators

v4 (v3 for blocks of 2 x 2 output tiles; 28.41 ms) is not ported: as written it loads a
block's 2 x 64 rhs tiles [128, 512] fp32 and 2 x 64 lhsT tiles [128, 128] fp32 before its
first matmul, 320 KiB per partition live, more than a trn2 core's SBUF (224 KiB per
partition, 28 MiB; the simulator refuses it). What ran must have loaded or freed
them in another order (the compiler schedules affine_range bodies), and neither the
tutorial nor its profiles show which; any order chosen here would be ours, not AWS's.

Where the tutorial leaves an engine to the compiler (``tensor_copy``, ``memset`` without
``engine``), the simulator's default for an instruction without an engine applies, as for
every NKI 0.7 kernel it runs.
"""

import nki
import nki.isa as nisa
import nki.language as nl

P = 128          # K tile (partitions) and M tile (the stationary's free size)
TILE_N = 512     # the moving free size (one PSUM bank of fp32)

VERSIONS = ("v2", "v3", "v5")


def _check(name, lhsT, rhs, block_m, block_n, block_k):
    K, M = lhsT.shape
    K2, N = rhs.shape
    if K2 != K:
        raise ValueError(f"{name}: rhs.shape[0]={K2} must equal lhsT.shape[0]={K} (the contraction)")
    for what, value, block in (("lhsT.shape[0] (K)", K, block_k), ("lhsT.shape[1] (M)", M, block_m),
                               ("rhs.shape[1] (N)", N, block_n)):
        if value % block:
            raise ValueError(f"{name}: {what}={value} must be a multiple of {block} (the tutorial's "
                             "kernels issue no tail tiles)")
    return K, M, N


def _tiled(lhsT, rhs, result):
    """v2: per output tile, per K tile, load both operand tiles and multiply."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    for m in nl.affine_range(M // P):
        for n in nl.affine_range(N // TILE_N):
            acc = nl.ndarray((P, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // P):
                lt = nl.ndarray((P, P), dtype=lhsT.dtype, buffer=nl.sbuf)
                rt = nl.ndarray((P, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=lt, src=lhsT[k * P:(k + 1) * P, m * P:(m + 1) * P])
                nisa.dma_copy(dst=rt, src=rhs[k * P:(k + 1) * P, n * TILE_N:(n + 1) * TILE_N])
                nisa.nc_matmul(dst=acc, stationary=lt, moving=rt)
            out = nl.ndarray((P, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=out, src=acc)
            nisa.dma_copy(dst=result[m * P:(m + 1) * P, n * TILE_N:(n + 1) * TILE_N], src=out)


def _k_tiles(src, col0, cols):
    """v3's loads: every K tile [128, cols] of src's columns col0.. into SBUF, one transfer
    each. Each caller's tiles are an allocation site of their own (the site is the call path),
    so lhsT's and rhs's tiles rotate their own buffers as when written inline."""
    tiles = []
    for k in nl.affine_range(src.shape[0] // P):
        t = nl.ndarray((P, cols), dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src[k * P:(k + 1) * P, col0:col0 + cols])
        tiles.append(t)
    return tiles


def _hoisted(lhsT, rhs, result):
    """v3: per 128 rows of M, all their lhsT K tiles; per 512 columns of N, all their rhs K
    tiles; then the output tile's K matmuls, its copy to SBUF and its store."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    kt = K // P
    for m in nl.affine_range(M // P):
        lts = _k_tiles(lhsT, m * P, P)
        for n in nl.affine_range(N // TILE_N):
            rts = _k_tiles(rhs, n * TILE_N, TILE_N)
            acc = nl.ndarray((P, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(kt):
                nisa.nc_matmul(dst=acc, stationary=lts[k], moving=rts[k])
            out = nl.ndarray((P, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=out, src=acc)
            nisa.dma_copy(dst=result[m * P:(m + 1) * P, n * TILE_N:(n + 1) * TILE_N], src=out)


def _blocked_k(lhsT, rhs, result, tiles_m, tiles_n, tiles_k):
    """v5: per block of N, SBUF accumulators (zeroed, in lhsT's dtype) for every output tile
    of the column block; per block of K (sequential), its rhs rows [128, BLOCK_N], then per
    block of M its lhsT rows [128, BLOCK_M] and every output tile's tiles_k matmuls into PSUM,
    added into its SBUF accumulator on VectorE; then the column block packed row by row into
    [128, BLOCK_N] fp32 and stored."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    block_m, block_n, block_k = P * tiles_m, TILE_N * tiles_n, P * tiles_k
    for n in nl.affine_range(N // block_n):
        accs = []
        for m in range(M // block_m):
            per_m = []
            for bm in range(tiles_m):
                per_bm = []
                for bn in range(tiles_n):
                    t = nl.ndarray((P, TILE_N), dtype=lhsT.dtype, buffer=nl.sbuf)
                    nisa.memset(dst=t, value=0.0)
                    per_bm.append(t)
                per_m.append(per_bm)
            accs.append(per_m)
        for k in nl.sequential_range(K // block_k):
            rts = []
            for bk in range(tiles_k):
                rt = nl.ndarray((P, block_n), dtype=rhs.dtype, buffer=nl.sbuf)
                r0 = (tiles_k * k + bk) * P
                nisa.dma_copy(dst=rt, src=rhs[r0:r0 + P, block_n * n:block_n * (n + 1)])
                rts.append(rt)
            for m in nl.affine_range(M // block_m):
                lts = []
                for bk in nl.affine_range(tiles_k):
                    lt = nl.ndarray((P, block_m), dtype=lhsT.dtype, buffer=nl.sbuf)
                    r0 = (tiles_k * k + bk) * P
                    nisa.dma_copy(dst=lt, src=lhsT[r0:r0 + P, block_m * m:block_m * (m + 1)])
                    lts.append(lt)
                for bn in nl.affine_range(tiles_n):
                    for bm in nl.affine_range(tiles_m):
                        acc = nl.ndarray((P, TILE_N), dtype=nl.float32, buffer=nl.psum)
                        for bk in nl.affine_range(tiles_k):
                            nisa.nc_matmul(dst=acc, stationary=lts[bk][:, bm * P:(bm + 1) * P],
                                           moving=rts[bk][:, bn * TILE_N:(bn + 1) * TILE_N])
                        nisa.tensor_tensor(dst=accs[m][bm][bn], data1=accs[m][bm][bn], data2=acc, op=nl.add)
        for m in nl.affine_range(M // block_m):
            for bm in nl.affine_range(tiles_m):
                packed = nl.ndarray((P, block_n), dtype=nl.float32, buffer=nl.sbuf)
                for bn in nl.affine_range(tiles_n):
                    nisa.tensor_copy(dst=packed[:, bn * TILE_N:(bn + 1) * TILE_N], src=accs[m][bm][bn])
                r0 = (tiles_m * m + bm) * P
                nisa.dma_copy(dst=result[r0:r0 + P, block_n * n:block_n * (n + 1)], src=packed)


def v5_vector_instructions(K, M, N):
    """VectorE instructions v5 issues for lhsT [K, M] @ rhs [K, N]: per [128, 512] output tile
    one memset, one add per block of 8 K tiles and one packing copy, each [128, 512] fp32
    (simulator/hardware.py reads trn2's VectorE fixed cost off their profiled durations)."""
    return (M // P) * (N // TILE_N) * (K // (8 * P) + 2)


@nki.jit
def matmul(lhsT, rhs, version):
    """lhsT [K, M] @ rhs [K, N] -> [M, N] as the tutorial's kernel ``version`` (v2..v5)
    issues it. The result's dtype is each version's: fp32 for v3 and v5, lhsT's for v2 (fp32
    in the profiled runs either way)."""
    if version not in VERSIONS:
        raise ValueError(f"matmul: version={version!r} is not one of {VERSIONS}")
    blocks = {"v2": (P, TILE_N, P), "v3": (P, TILE_N, P), "v5": (16 * P, 2 * TILE_N, 8 * P)}[version]
    K, M, N = _check("matmul", lhsT, rhs, *blocks)
    out_dtype = nl.float32 if version in ("v3", "v5") else lhsT.dtype
    result = nl.ndarray((M, N), dtype=out_dtype, buffer=nl.shared_hbm)
    if version == "v2":
        _tiled(lhsT, rhs, result)
    elif version == "v3":
        _hoisted(lhsT, rhs, result)
    else:
        _blocked_k(lhsT, rhs, result, 16, 2, 8)
    return result

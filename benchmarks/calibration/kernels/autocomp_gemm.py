"""The six GEMM kernels of Autocomp's NKI tutorial trace, measured on trn1.2xlarge in bf16
(ucb-bar/autocomp @dd26a565 examples/trn-tutorial/2_gemm_trace.py; the harness
harnesses/trn-tutorial-nki1/2_gemm_test.py: lhsT [8192, 4096], rhs [8192, 8192] bf16,
``nki.benchmark(warmup=2, iters=10)``, p99 latency).

    result[M, N] = lhsT[K, M].T @ rhs[K, N]      K = 8192, M = 4096, N = 8192

Our own beta-2 code (NKI 0.7) that issues each beta-1 kernel's instruction stream. All six
share one structure, so one function serves them: for each block of ``group_m`` 128-row
tiles of M and ``group_n`` 512-column tiles of N, ``group_m x group_n`` PSUM accumulators
[128, 512] fp32 (one 2 KiB bank each); per 128-row K tile, the block's rhs tiles
[128, 512] and lhsT tiles [128, 128] are loaded (``rhs_tiles_per_load`` /
``lhs_tiles_per_load`` of them in one transfer: the later kernels' "fused loads") and every
(m, n) pair is multiplied on TensorE (stationary lhsT, moving rhs); then each accumulator
is copied to SBUF as bf16 and stored.

    trace score   group_m x group_n   lhs / rhs tiles per load   PSUM -> SBUF copy
    20.99 ms      1 x 1               1 / 1                      nl.copy
    28.68 ms      1 x 2               1 / 1                      nisa.tensor_copy
    11.8 ms       2 x 2               1 / 1                      nisa.tensor_copy
    8.07 ms       4 x 2               1 / 1                      nisa.tensor_copy
    7.62 ms       4 x 2               2 / 1                      nisa.tensor_copy
    6.96 ms       4 x 2               4 / 2                      tensor_copy on VectorE

Porting choices, each from the source or a profile of the same compiler:

* ``nl.zeros(..., buffer=nl.psum)`` then ``psum += matmul``: no memset. The beta-1 compiler
  initializes a PSUM accumulator lazily, the first matmul overwriting it: NKIBench's traced
  beta-1 matmul declares its accumulators ``nl.zeros(..., buffer=nl.psum,
  lazy_initialization=True)`` (zhang677/AccelOpt NKIBench/kernels/matmul_M4096_N12288_K5120_0.py).
  Here the first matmul of each accumulator overwrites its fresh allocation (the simulator's
  ``accumulate=None``), the others add.
* The PSUM -> SBUF copies the first five kernels leave to the compiler (``nl.copy``,
  ``nisa.tensor_copy`` without ``engine``) run on ScalarE (``activation(copy)``): the one
  profile of the beta-1 compiler's PSUM -> SBUF copies on trn1 (NKIBench's matmul, ScalarE
  6.8 % active, VectorE 0 %) put them there. They are 512 [128, 512] copies per kernel (about
  0.2 ms of one engine against 7-29 ms), hidden behind TensorE and DMA either way.
* The sixth kernel's tail loops are elided in its source ("# ..."); at this shape no block
  has a tail (32 M tiles in groups of 4, 16 N tiles in pairs), so none is issued by any port.
"""

import nki
import nki.isa as nisa
import nki.language as nl

P = 128          # K tile (partitions) and M tile (the stationary's free size)
TILE_N = 512     # the moving free size (one PSUM bank of fp32)

# trace score (ms) -> the kernel's structure (see the table above)
VARIANTS = {
    "s20_99": dict(group_m=1, group_n=1, lhs_tiles_per_load=1, rhs_tiles_per_load=1, copy_engine="scalar",
                   lhs_first=True),
    "s28_68": dict(group_m=1, group_n=2, lhs_tiles_per_load=1, rhs_tiles_per_load=1, copy_engine="scalar",
                   lhs_first=True),
    "s11_8": dict(group_m=2, group_n=2, lhs_tiles_per_load=1, rhs_tiles_per_load=1, copy_engine="scalar"),
    "s8_07": dict(group_m=4, group_n=2, lhs_tiles_per_load=1, rhs_tiles_per_load=1, copy_engine="scalar"),
    "s7_62": dict(group_m=4, group_n=2, lhs_tiles_per_load=2, rhs_tiles_per_load=1, copy_engine="scalar"),
    "s6_96": dict(group_m=4, group_n=2, lhs_tiles_per_load=4, rhs_tiles_per_load=2, copy_engine="vector"),
}


def _store_tile(out, acc, row0, col0, copy_engine):
    """The PSUM accumulator [128, 512] copied to SBUF in out's dtype (``copy_engine``
    "scalar": activation(copy); "vector": tensor_copy) and stored at out[row0:, col0:]."""
    ot = nl.ndarray((P, TILE_N), dtype=out.dtype, buffer=nl.sbuf)
    if copy_engine == "vector":
        nisa.tensor_copy(dst=ot, src=acc, engine=nisa.engine.vector)
    else:
        nisa.activation(dst=ot, op=nl.copy, data=acc)
    nisa.dma_copy(dst=out[row0:row0 + P, col0:col0 + TILE_N], src=ot)


@nki.jit
def gemm(lhsT, rhs, variant):
    """lhsT [K, M] @ rhs [K, N] -> [M, N] in lhsT's dtype, as Autocomp's kernel ``variant``
    (a key of VARIANTS) issues it."""
    if variant not in VARIANTS:
        raise ValueError(f"gemm: variant={variant!r} is not one of {sorted(VARIANTS)}")
    v = VARIANTS[variant]
    gm, gn = v["group_m"], v["group_n"]
    lhs_per, rhs_per = v["lhs_tiles_per_load"], v["rhs_tiles_per_load"]
    K, M = lhsT.shape
    K2, N = rhs.shape
    if K2 != K:
        raise ValueError(f"gemm: rhs.shape[0]={K2} must equal lhsT.shape[0]={K} (the contraction)")
    for name, value, block in (("lhsT.shape[0] (K)", K, P), ("lhsT.shape[1] (M)", M, P * gm),
                               ("rhs.shape[1] (N)", N, TILE_N * gn)):
        if value % block:
            raise ValueError(f"gemm: {name}={value} must be a multiple of {block} (variant {variant}'s "
                             "block; the port issues no tail blocks)")
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for mb in range(M // (P * gm)):
        m0 = mb * P * gm
        for nb in range(N // (TILE_N * gn)):
            n0 = nb * TILE_N * gn
            # [i][j]: the accumulator of M tile i and N tile j of the block, one PSUM bank each
            accs = [[nl.ndarray((P, TILE_N), dtype=nl.float32, buffer=nl.psum) for _ in range(gn)]
                    for _ in range(gm)]
            for k in range(K // P):
                ks = slice(k * P, (k + 1) * P)
                # One allocation per K tile for the block's rhs tiles and one for its lhsT
                # tiles: the source's separate variables (rhs0, rhs1, lhs0, ...) each rotate
                # their own buffers, so, as here, every K tile's loads may run one K tile
                # ahead of the matmuls (the model's two buffers per site).
                rhs_k = nl.ndarray((P, gn * TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                lhs_k = nl.ndarray((P, gm * P), dtype=lhsT.dtype, buffer=nl.sbuf)
                if v.get("lhs_first"):
                    # the first two kernels (one M tile per block): load lhsT, then per N
                    # tile load rhs and multiply (their source's order)
                    nisa.dma_copy(dst=lhs_k, src=lhsT[ks, m0:m0 + P])
                    for j in range(gn):
                        cols = slice(j * TILE_N, (j + 1) * TILE_N)
                        nisa.dma_copy(dst=rhs_k[:, cols], src=rhs[ks, n0 + j * TILE_N:n0 + (j + 1) * TILE_N])
                        nisa.nc_matmul(dst=accs[0][j], stationary=lhs_k, moving=rhs_k[:, cols])
                    continue
                # the others: the block's rhs tiles first (rhs_per per transfer), then each
                # lhsT transfer (lhs_per tiles) and the matmuls of its tiles
                for j0 in range(0, gn, rhs_per):
                    nisa.dma_copy(dst=rhs_k[:, j0 * TILE_N:(j0 + rhs_per) * TILE_N],
                                  src=rhs[ks, n0 + j0 * TILE_N:n0 + (j0 + rhs_per) * TILE_N])
                for i0 in range(0, gm, lhs_per):
                    nisa.dma_copy(dst=lhs_k[:, i0 * P:(i0 + lhs_per) * P],
                                  src=lhsT[ks, m0 + i0 * P:m0 + (i0 + lhs_per) * P])
                    for i in range(i0, i0 + lhs_per):
                        for j in range(gn):
                            nisa.nc_matmul(dst=accs[i][j], stationary=lhs_k[:, i * P:(i + 1) * P],
                                           moving=rhs_k[:, j * TILE_N:(j + 1) * TILE_N])
            for i in range(gm):
                for j in range(gn):
                    _store_tile(out, accs[i][j], m0 + i * P, n0 + j * TILE_N, v["copy_engine"])
    return out


@nki.jit
def gemm_k_coalesced(lhsT, rhs, group_n):
    """A what-if, not a port (no row runs it): Autocomp's first (``group_n`` = 1) or second
    (2) GEMM kernel with each block's affine K loop of loads coalesced into one transfer per
    operand, as the beta-1 compiler would if it vectorized that loop (docs/cost-model.md,
    "Autocomp's traces as rows", GEMM). lhsT [K, M] and rhs [K, N] are read as [128, K/128,
    128] and [128, K/128, 512] views (partition = k mod 128): one lhsT and ``group_n`` rhs
    transfers per block instead of K/128 each; the matmuls, copies (ScalarE) and stores are
    the port's.

    Modeled at the measured shape (2026-12-03): 20.8 ms for the first (measured 20.99) and
    18.7 ms for the second (measured 28.68). Reproduce with
    ``estimate_trace(simulator.run(gemm_k_coalesced, target="trn1", lhsT=..., rhs=...,
    group_n=1).trace, calibrate.target_with("trn1", None, "beta1"))`` (latency_us +
    launch_us)."""
    K, M = lhsT.shape
    K2, N = rhs.shape
    if K2 != K:
        raise ValueError(f"gemm_k_coalesced: rhs.shape[0]={K2} must equal lhsT.shape[0]={K} (the contraction)")
    if group_n not in (1, 2):
        raise ValueError(f"gemm_k_coalesced: group_n={group_n!r}; expected 1 or 2 (Autocomp's first two kernels)")
    for name, value, block in (("lhsT.shape[0] (K)", K, P), ("lhsT.shape[1] (M)", M, P),
                               ("rhs.shape[1] (N)", N, TILE_N * group_n)):
        if value % block:
            raise ValueError(f"gemm_k_coalesced: {name}={value} must be a multiple of {block}")
    kt = K // P
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in range(M // P):
        for nb in range(N // (TILE_N * group_n)):
            accs = [nl.ndarray((P, TILE_N), dtype=nl.float32, buffer=nl.psum) for _ in range(group_n)]
            lt = nl.ndarray((P, kt, P), dtype=lhsT.dtype, buffer=nl.sbuf)          # [k, K tile, m]
            nisa.dma_copy(dst=lt, src=lhsT[:, m * P:(m + 1) * P].reshape((kt, P, P)).permute((1, 0, 2)))
            rts = []
            for j in range(group_n):
                n0 = (nb * group_n + j) * TILE_N
                rt = nl.ndarray((P, kt, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)   # [k, K tile, n]
                nisa.dma_copy(dst=rt, src=rhs[:, n0:n0 + TILE_N].reshape((kt, P, TILE_N)).permute((1, 0, 2)))
                rts.append(rt)
            for k in range(kt):
                for j in range(group_n):
                    nisa.nc_matmul(dst=accs[j], stationary=lt[:, k, :], moving=rts[j][:, k, :])
            for j in range(group_n):
                _store_tile(out, accs[j], m * P, (nb * group_n + j) * TILE_N, "scalar")
    return out

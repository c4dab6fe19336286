"""Ports of the two hand-written matmul kernels of awslabs/nki-autotune's kernel library,
measured on trn2 (awslabs/nki-autotune @d57bcc3 kernel_library/README.md: "All runs below
are at 2048³ bf16 shapes"; kernel_library/matmul/lhsT_rhs/kernel_hand_90.92mfu.py and
kernel_library/matmul/lhs_rhs/kernel_handtuned_89.26mfu.py, unchanged since 0b6f309).

    lhsT_rhs: output[M, N] = lhs_T[K, M].T @ rhs[K, N]
    lhs_rhs:  output[M, N] = lhs[M, K] @ rhs[K, N]      (lhs transposed by DMA on the way in)

Our own code, issuing each kernel's instruction stream: the same tiles, loop order,
instructions, default engines and allocation sites. Both kernels build their SBUF tiles as
explicit sets of leaves (``allocate_buffers``: ``p_ring x f_ring`` copies of a list of
``count`` leaves [128, width], indexed ``[i % p_ring][j % f_ring]`` at the use site), and
multiply through one routine (``matmul_block``): per output tile [128, 512], a PSUM tile is
zeroed (memset), the K tiles of the block accumulate into it (nc_matmul), VectorE-default
``tensor_copy`` moves it to an SBUF tile of the output's dtype, and ``tensor_tensor`` adds
that into the SBUF accumulator leaf (which each kernel zeroes once per output block).

    kernel    loads                                            loops, outer to inner (the sources' names)
    lhsT_rhs  lhs_T and rhs by dma_copy, 8 [128, 512] leaves   d2: 4 x 512 columns of N > d0: 2 x 1024
              per block; lhs_T sets 2 x 4, rhs sets 2          rows of K > d1: 4 x 512 rows of M
    lhs_rhs   lhs by dma_transpose, 8 [128, 1024] leaves per   d0: 2 x 1024 rows of M > d2: 4 x 512
              block (sets 4 x 4); rhs by dma_copy (sets 8)     columns of N > d1: 2 x 1024 rows of K

The measured figures are the README's: lhs_rhs "10-rep mean 89.26%, sd 0.05pp; best single
89.47% (0.2442 ms)", lhsT_rhs 90.92 % MFU. MFU there is neuron-profile's
``mfu_estimated_percent`` (autotune/src/autotune/runner/output.py); 89.47 % at 0.2442 ms puts
its peak at 2 x 2048³ / (0.8947 x 244.2 us) = 78.6 TFLOP/s, 2.4 GHz x 32,768 FLOP per cycle,
so 90.92 % is 240.3 us. The kernels need the compiler's
``enable-linear-scan-allocation=false`` and ``enable-instruction-scheduling=false`` (README):
the program's order is what ran.
"""

import nki
import nki.isa as nisa
import nki.language as nl

P = 128          # partitions: the K tile and the M tile
TILE_N = 512     # the moving free size (one PSUM bank of fp32)
SIZE = 2048      # the kernels assert 2048 x 2048 operands


def _leaf_sets(width, count, dtype, p_ring, f_ring):
    """``allocate_buffers``' layout: ``p_ring`` x ``f_ring`` sets (None: that level absent) of
    ``count`` SBUF leaves [P, width], allocated in that nesting order from one site."""
    sets = [[[nl.ndarray((P, width), dtype=dtype, buffer=nl.sbuf) for _ in range(count)]
             for _ in range(f_ring or 1)] for _ in range(p_ring or 1)]
    if f_ring is None:
        sets = [row[0] for row in sets]
    if p_ring is None:
        sets = sets[0]
    return sets


def _zero(leaves):
    for leaf in leaves:
        nisa.memset(leaf[0:P, 0:leaf.shape[1]], 0.0)


def _load(leaves, src):
    """src [len(leaves) * P, width] HBM -> the leaves, one dma_copy per leaf."""
    width = leaves[0].shape[1]
    for i, leaf in enumerate(leaves):
        nisa.dma_copy(leaf[0:P, 0:width], src[i * P:(i + 1) * P, 0:width])


def _store(dst, leaves):
    width = leaves[0].shape[1]
    for i, leaf in enumerate(leaves):
        nisa.dma_copy(dst[i * P:(i + 1) * P, 0:width], leaf[0:P, 0:width])


def _multiply_accumulate(out, stationary, moving):
    """out[m] += stationary[:, m tile].T @ moving over the K leaves: per output tile a zeroed
    PSUM tile, the K matmuls, a copy to SBUF in out's dtype and a tensor_tensor add."""
    k_tiles = len(stationary)
    width = moving[0].shape[1]
    tile_n = min(width, TILE_N)
    for m, acc_leaf in enumerate(out):
        for n in range(width // tile_n):
            cols = slice(n * tile_n, (n + 1) * tile_n)
            psum = nl.ndarray((P, tile_n), dtype=nl.float32, buffer=nl.psum)
            part = nl.ndarray((P, tile_n), dtype=acc_leaf.dtype, buffer=nl.sbuf)
            nisa.memset(psum[0:P, 0:tile_n], 0.0)
            for k in range(k_tiles):
                nisa.nc_matmul(dst=psum[0:P, 0:tile_n], stationary=stationary[k][0:P, m * P:(m + 1) * P],
                               moving=moving[k][0:P, cols])
            nisa.tensor_copy(part[0:P, 0:tile_n], psum[0:P, 0:tile_n])
            nisa.tensor_tensor(acc_leaf[0:P, cols], acc_leaf[0:P, cols], part[0:P, 0:tile_n], op=nl.add)


def _check(**operands):
    for name, t in operands.items():
        if tuple(t.shape) != (SIZE, SIZE):
            raise ValueError(f"{name}.shape={tuple(t.shape)}; the kernel is written for ({SIZE}, {SIZE}) only")


@nki.jit
def matmul_lhsT_rhs(lhs_T, rhs):
    """kernel_hand_90.92mfu.py: [2048, 2048] lhs_T.T @ rhs -> [2048, 2048] bf16."""
    _check(lhs_T=lhs_T, rhs=rhs)
    out = nl.ndarray((SIZE, SIZE), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    accumulators = _leaf_sets(TILE_N, 16, nl.bfloat16, None, 4)      # 4 sets of 16 [128, 512]
    for d2 in range(4):                                               # 512 output columns
        lhs_sets = _leaf_sets(4 * P, 8, nl.bfloat16, 2, 4)          # [2][4] sets of 8 [128, 512]
        rhs_sets = _leaf_sets(TILE_N, 8, nl.bfloat16, 2, None)      # [2] sets of 8 [128, 512]
        acc = accumulators[d2 % 4]
        _zero(acc)
        for d0 in range(2):                                           # 1024 rows of K
            rhs_block = rhs_sets[d0 % 2]
            _load(rhs_block, rhs[d0 * 1024:(d0 + 1) * 1024, d2 * TILE_N:(d2 + 1) * TILE_N])
            for d1 in range(4):                                       # 512 output rows
                lhs_block = lhs_sets[d0 % 2][d1 % 4]
                _load(lhs_block, lhs_T[d0 * 1024:(d0 + 1) * 1024, d1 * 512:(d1 + 1) * 512])
                _multiply_accumulate(acc[d1 * 4:(d1 + 1) * 4], lhs_block, rhs_block)
        _store(out[0:SIZE, d2 * TILE_N:(d2 + 1) * TILE_N], acc)
    return out


@nki.jit
def matmul_lhs_rhs(lhs, rhs):
    """kernel_handtuned_89.26mfu.py: [2048, 2048] lhs @ rhs -> [2048, 2048] bf16, lhs
    transposed block by block with dma_transpose."""
    _check(lhs=lhs, rhs=rhs)
    out = nl.ndarray((SIZE, SIZE), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    lhs_sets = _leaf_sets(8 * P, 8, nl.bfloat16, 4, 4)              # [4][4] sets of 8 [128, 1024]
    for d0 in range(2):                                               # 1024 output rows
        acc = _leaf_sets(4 * TILE_N, 8, nl.bfloat16, None, None)     # 8 [128, 2048]
        _zero(acc)
        for d2 in range(4):                                           # 512 output columns
            rhs_sets = _leaf_sets(TILE_N, 8, nl.bfloat16, 8, None)   # [8] sets of 8 [128, 512]
            for d1 in range(2):                                       # 1024 rows of K
                lhs_block = lhs_sets[d1 % 4][d0 % 4]
                src = lhs[d0 * 1024:(d0 + 1) * 1024, d1 * 1024:(d1 + 1) * 1024]
                for k, leaf in enumerate(lhs_block):                  # leaf k = src[:, k tile].T
                    nisa.dma_transpose(leaf[0:P, 0:1024], src[0:1024, k * P:(k + 1) * P])
                rhs_block = rhs_sets[d1 % 8]
                _load(rhs_block, rhs[d1 * 1024:(d1 + 1) * 1024, d2 * TILE_N:(d2 + 1) * TILE_N])
                _multiply_accumulate([leaf[:, d2 * TILE_N:(d2 + 1) * TILE_N] for leaf in acc], lhs_block,
                                     rhs_block)
            _store(out[d0 * 1024:(d0 + 1) * 1024, d2 * TILE_N:(d2 + 1) * TILE_N],
                   [leaf[:, d2 * TILE_N:(d2 + 1) * TILE_N] for leaf in acc])
    return out

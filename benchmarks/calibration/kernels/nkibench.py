"""Ports of NKIBench kernels (zhang677/AccelOpt @2dbeab40, NKIBench/kernels/*_0.py and
samples/nki/*_optimized.py), measured on trn1.32xlarge in fp32 (hw-measurements.md 10).

Our own beta-2 code (NKI 0.7) that issues the instruction sequence of each beta-1 kernel:
the same tiles, loop order, instructions and engines. Where the beta-1 code left a
choice to the compiler (``nl.copy``, ``engine=unknown``, block-dimension buffering) the
port takes the engine the published profile shows busy (VectorE / ScalarE active %), and
allocates each block's tile inside its loop (the compiler's buffering is then the cost
model's finite buffering). What the compiler did beyond that (spills, reordering) is not
reproduced; the rows' notes say where that matters.
"""

import nki
import nki.isa as nisa
import nki.language as nl

P = 128


@nki.jit
def silu(x):
    """NKIBench silu_M4096_N7168: x [128, 32, 7168] fp32 -> x * sigmoid(x).

    Per [128, 1024] block (loaded and stored once), per 512-column half: ScalarE exp(-x),
    VectorE 1 + e, ScalarE reciprocal (the profile: ScalarE 31.5 %, VectorE 73.9 % busy),
    VectorE x * r."""
    parts, rows, cols = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    zero = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)
    block, half = 1024, 512
    for r in range(rows):
        for c in range(cols // block):
            xt = nl.ndarray((parts, block), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xt, src=x[:, r, c * block:(c + 1) * block])
            yt = nl.ndarray((parts, block), dtype=x.dtype, buffer=nl.sbuf)
            for h in range(block // half):
                xs = xt[:, h * half:(h + 1) * half]
                e = nl.ndarray((parts, half), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=e, op=nl.exp, data=xs, bias=zero, scale=-1.0)
                d = nl.ndarray((parts, half), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=d, data=e, op0=nl.add, operand0=1.0, engine=nisa.engine.vector)
                rcp = nl.ndarray((parts, half), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=rcp, op=nl.reciprocal, data=d)
                nisa.tensor_tensor(dst=yt[:, h * half:(h + 1) * half], data1=xs, data2=rcp,
                                   op=nl.multiply, engine=nisa.engine.vector)
            nisa.dma_copy(dst=out[:, r, c * block:(c + 1) * block], src=yt)
    return out


@nki.jit
def rope_baseline(x_in, cos, sin):
    """NKIBench rope_single_freq_apply_B1_H64_N4096_D128_0: x [128, S], cos/sin [64, S],
    fp32, S in 512-column tiles.

    Per tile: load x [128, 512], cos and sin [64, 512]; copy the lower half of x to
    partitions 0-63 (ScalarE: the profile shows ScalarE 14 % busy); four VectorE products
    and a subtract/add into the two halves of the output tile; one store."""
    d_head, seq = x_in.shape
    half = d_head // 2
    out = nl.ndarray((d_head, seq), dtype=x_in.dtype, buffer=nl.shared_hbm)
    ts = 512
    for s0 in range(0, seq, ts):
        xt = nl.ndarray((d_head, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x_in[:, s0:s0 + ts])
        ct = nl.ndarray((half, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ct, src=cos[:, s0:s0 + ts])
        st = nl.ndarray((half, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=st, src=sin[:, s0:s0 + ts])
        odd = nl.ndarray((half, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        nisa.activation(dst=odd, op=nl.copy, data=xt[half:d_head, :])
        even = xt[0:half, :]
        e_cos = nl.ndarray((half, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        o_cos = nl.ndarray((half, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        e_sin = nl.ndarray((half, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        o_sin = nl.ndarray((half, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=e_cos, data1=even, data2=ct, op=nl.multiply, engine=nisa.engine.vector)
        nisa.tensor_tensor(dst=o_cos, data1=odd, data2=ct, op=nl.multiply, engine=nisa.engine.vector)
        nisa.tensor_tensor(dst=e_sin, data1=even, data2=st, op=nl.multiply, engine=nisa.engine.vector)
        nisa.tensor_tensor(dst=o_sin, data1=odd, data2=st, op=nl.multiply, engine=nisa.engine.vector)
        ot = nl.ndarray((d_head, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=ot[0:half, :], data1=e_cos, data2=o_sin, op=nl.subtract,
                           engine=nisa.engine.vector)
        nisa.tensor_tensor(dst=ot[half:d_head, :], data1=o_cos, data2=e_sin, op=nl.add,
                           engine=nisa.engine.vector)
        nisa.dma_copy(dst=out[:, s0:s0 + ts], src=ot)
    return out


@nki.jit
def rope_optimized(x_in, cos, sin):
    """AccelOpt samples/nki/rope_optimized.py: the same rotation in 2048-column tiles, every
    operand loaded straight to partitions 0-63 (x's halves, cos and sin twice each: eight
    [64, 2048] loads), four products, subtract/add, two [64, 2048] stores; no copy."""
    d_head, seq = x_in.shape
    half = d_head // 2
    out = nl.ndarray((d_head, seq), dtype=x_in.dtype, buffer=nl.shared_hbm)
    ts = 2048

    def load(src):
        t = nl.ndarray((half, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src)
        return t

    def product(a, b, op):
        t = nl.ndarray((half, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=t, data1=a, data2=b, op=op, engine=nisa.engine.vector)
        return t

    for s0 in range(0, seq, ts):
        cols = slice(s0, s0 + ts)
        e_cos = product(load(x_in[0:half, cols]), load(cos[:, cols]), nl.multiply)
        o_sin = product(load(x_in[half:d_head, cols]), load(sin[:, cols]), nl.multiply)
        e_sin = product(load(x_in[0:half, cols]), load(sin[:, cols]), nl.multiply)
        o_cos = product(load(x_in[half:d_head, cols]), load(cos[:, cols]), nl.multiply)
        nisa.dma_copy(dst=out[0:half, cols], src=product(e_cos, o_sin, nl.subtract))
        nisa.dma_copy(dst=out[half:d_head, cols], src=product(o_cos, e_sin, nl.add))
    return out


@nki.jit
def matmul_add_rmsnorm(x_tensor, w_tensor, eps, z_tensor, g_tensor):
    """NKIBench matmul_add_rmsnorm_M4096_N2048_K2048: y = x @ w + z, out = y * g / rms(y)
    over each row of y (rms = sqrt(mean(y ** 2) + eps)); x [M, K], w [K, N], z [M, N],
    g [N], fp32.

    Per 128-row block of x (loaded [128, K] once): per 512-column chunk of N, per 128-row
    tile of K: the beta-1 ``nl.matmul(x_tile, w_tile)`` takes x with M on partitions, so the
    compiler inserts a TensorE transpose of the [128, 128] x slice into PSUM and a copy to
    SBUF before the matmul, one per matmul (the profile's transpose_flops, 2048 transposes,
    say it did not hoist them out of the N loop); the copies and the PSUM -> SBUF result
    copies go to ScalarE (``nl.copy`` leaves the engine to the compiler: 2048 + 128 copies
    fit ScalarE's 16.8 % active, not VectorE's 12.4 %). Then per block: load z, VectorE add,
    ScalarE square, VectorE sum over the row, / N and + eps (VectorE), ScalarE rsqrt,
    VectorE multiply by the [128, 1] reciprocal and by g, one store.

    w is loaded ONCE, tile by tile ([128, 512] per (n, k)), before the row loop: the beta-1
    code loads each w tile inside the row loop, but the loads do not depend on the row
    block and the profile's HBM reads (98.1 MB: x, z and w about twice, not the 571 MB of
    32 passes over w) show the compiler kept w on chip. w takes 128 KiB per partition
    (K / 128 x N fp32), which bounds K x N. g is loaded once, broadcast onto the 128
    partitions by the DMA (beta-1 ``g_tile.broadcast_to``; where the compiler broadcast it
    is not in the profile, and it is one 8 KiB-per-partition transfer)."""
    M, K = x_tensor.shape
    N = w_tensor.shape[1]
    tm, tk, tn = P, P, 512   # beta-1 TILE_M, TILE_K, TILE_N (gemm moving fmax)
    for name, value, tile in (("x_tensor.shape[0] (M)", M, tm), ("x_tensor.shape[1] (K)", K, tk),
                              ("w_tensor.shape[1] (N)", N, tn)):
        if value % tile:
            raise ValueError(f"matmul_add_rmsnorm: {name}={value} must be a multiple of {tile} "
                             "(beta-1's tiles, no remainder handling)")
    out = nl.ndarray((M, N), dtype=x_tensor.dtype, buffer=nl.shared_hbm)
    g_t = nl.ndarray((tm, N), dtype=g_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=g_t, src=g_tensor.reshape((1, N)).broadcast(0, tm))
    w_t = nl.ndarray((tk, K // tk, N), dtype=w_tensor.dtype, buffer=nl.sbuf)
    for n in range(N // tn):
        for k in range(K // tk):
            nisa.dma_copy(dst=w_t[:, k, n * tn:(n + 1) * tn],
                          src=w_tensor[k * tk:(k + 1) * tk, n * tn:(n + 1) * tn])
    for i in range(M // tm):
        rows = slice(i * tm, (i + 1) * tm)
        y_t = nl.ndarray((tm, N), dtype=nl.float32, buffer=nl.sbuf)   # rmsnorm_in_tile
        x_t = nl.ndarray((tm, K), dtype=x_tensor.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_t, src=x_tensor[rows, :])
        for n in range(N // tn):
            acc = nl.ndarray((tm, tn), dtype=nl.float32, buffer=nl.psum)
            for k in range(K // tk):
                xT_ps = nl.ndarray((tk, tm), dtype=x_tensor.dtype, buffer=nl.psum)
                nisa.nc_transpose(dst=xT_ps, data=x_t[:, k * tk:(k + 1) * tk], engine=nisa.engine.tensor)
                xT = nl.ndarray((tk, tm), dtype=x_tensor.dtype, buffer=nl.sbuf)
                nisa.activation(dst=xT, op=nl.copy, data=xT_ps)
                nisa.nc_matmul(dst=acc, stationary=xT, moving=w_t[:, k, n * tn:(n + 1) * tn])
            nisa.activation(dst=y_t[:, n * tn:(n + 1) * tn], op=nl.copy, data=acc)
        z_t = nl.ndarray((tm, N), dtype=z_tensor.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=z_t, src=z_tensor[rows, :])
        a_t = nl.ndarray((tm, N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=a_t, data1=y_t, data2=z_t, op=nl.add, engine=nisa.engine.vector)
        sq = nl.ndarray((tm, N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sq, op=nl.square, data=a_t)
        ssum = nl.ndarray((tm, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=ssum, op=nl.add, data=sq, axis=1)
        mean = nl.ndarray((tm, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=mean, data=ssum, op0=nl.divide, operand0=float(N), engine=nisa.engine.vector)
        mean_eps = nl.ndarray((tm, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=mean_eps, data=mean, op0=nl.add, operand0=float(eps), engine=nisa.engine.vector)
        rr = nl.ndarray((tm, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=rr, op=nl.rsqrt, data=mean_eps)
        o_t = nl.ndarray((tm, N), dtype=x_tensor.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=o_t, data=a_t, op0=nl.multiply, operand0=rr, engine=nisa.engine.vector)
        nisa.tensor_tensor(dst=o_t, data1=o_t, data2=g_t, op=nl.multiply, engine=nisa.engine.vector)
        nisa.dma_copy(dst=out[rows, :], src=o_t)
    return out


@nki.jit
def transpose_matmul(lhs, rhs):
    """NKIBench transpose_matmul_M4096_K2048_N10944: lhs.T @ rhs, fp32, with NKIBench's
    layouts: lhs [128, K/128, M] and rhs [128, K/128, N] (the [K, M] and [K, N] matrices,
    K = p * K/128 + k), output [M/128, 128, N] (the [M, N] product).

    Per 1024-column block of M: load the [128, 1024] lhs slice of every K tile (K/128
    loads). Per 1024-column block of N (the last one partial: 10944 = 10 x 1024 + 704,
    beta-1's masks): load the rhs slices of every K tile; per 128-row tile of M, per
    512-column half of the block: K/128 matmuls accumulating into one PSUM bank, a copy to
    SBUF; one [128, block] store per M tile. rhs is re-read per M block (4 x 89.7 MB: the
    profile's 392 MB of HBM reads). The PSUM -> SBUF copies (beta-1 ``nl.copy``) go to
    ScalarE: the profile shows ScalarE 3.8 % and VectorE 0 % active.

    beta-1 allocates each array for the whole problem (e.g. lhs as (4, 16, par_dim(128),
    1024)); here each block's tile is allocated inside its loop."""
    _, KT, M = lhs.shape
    N = rhs.shape[2]
    if M % P:
        raise ValueError(f"transpose_matmul: lhs.shape[2] (M)={M} must be a multiple of {P} "
                         "(the output's [M/128, 128, N] layout)")
    mb_max, nb_max, half = 1024, 1024, 512
    out = nl.ndarray((M // P, P, N), dtype=lhs.dtype, buffer=nl.shared_hbm)
    for m0 in range(0, M, mb_max):
        mb = min(mb_max, M - m0)
        lt = nl.ndarray((P, KT, mb), dtype=lhs.dtype, buffer=nl.sbuf)
        for k in range(KT):
            nisa.dma_copy(dst=lt[:, k, :], src=lhs[:, k, m0:m0 + mb])
        for n0 in range(0, N, nb_max):
            nb = min(nb_max, N - n0)
            rt = nl.ndarray((P, KT, nb), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in range(KT):
                nisa.dma_copy(dst=rt[:, k, :], src=rhs[:, k, n0:n0 + nb])
            for mi in range(mb // P):
                ot = nl.ndarray((P, nb), dtype=lhs.dtype, buffer=nl.sbuf)
                for h0 in range(0, nb, half):
                    hn = min(half, nb - h0)
                    acc = nl.ndarray((P, half), dtype=nl.float32, buffer=nl.psum)
                    for k in range(KT):
                        nisa.nc_matmul(dst=acc[:, 0:hn], stationary=lt[:, k, mi * P:(mi + 1) * P],
                                       moving=rt[:, k, h0:h0 + hn])
                    nisa.activation(dst=ot[:, h0:h0 + hn], op=nl.copy, data=acc[:, 0:hn])
                nisa.dma_copy(dst=out[m0 // P + mi, :, n0:n0 + nb], src=ot)
    return out

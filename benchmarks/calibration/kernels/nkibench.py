"""Ports of NKIBench kernels (zhang677/AccelOpt @2dbeab40, NKIBench/kernels/*_0.py, and
samples/nki/rope_optimized.py @8b58afd, a later commit: 2dbeab40 holds its profile),
measured on trn1.32xlarge in fp32 (hw-measurements.md 10).

Our own beta-2 code (NKI 0.7) that issues the instruction sequence of each beta-1 kernel:
the same tiles, loop order, instructions and engines. Where the beta-1 code left a
choice to the compiler (``nl.copy``, ``engine=unknown``, block-dimension buffering) the
port takes the engine the published profile shows busy (VectorE / ScalarE active %), and
allocates each block's tile inside its loop (the compiler's buffering is then the cost
model's finite buffering). Beta-1 ``nisa.reciprocal`` left its engine to the compiler
(Neuron 2.21 docstring: ScalarE or VectorE, VectorE "about 8x lower" throughput); every port
runs it on ScalarE (``activation(reciprocal)``): with it on VectorE, silu's and adamw's
modeled VectorE time would exceed their profiles' whole VectorE busy time. What the compiler did beyond that (spills, reordering) is not
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
    block, half = 1024, 512
    if cols % block:
        raise ValueError(f"silu: x.shape[2]={cols} must be a multiple of {block} (the beta-1 kernel's "
                         "column block, no remainder handling)")
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    zero = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)
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
    partitions 0-63 (VectorE, see below); four VectorE products and a subtract/add into the
    two halves of the output tile; one store.

    The beta-1 ``nl.copy`` leaves the copy's engine to the compiler. Until 2026-12-02 the
    port put it on ScalarE because the profile shows ScalarE 14.1 % active (611 us). But
    AccelOpt's optimized kernel (rope_optimized), which issues no ScalarE instruction at
    all, shows ScalarE active for the same time: 18.4 % of 3.33 ms = 612 us (both kernels
    move the same HBM bytes). That ScalarE time is work the compiler adds, not the copy;
    had the compiler added as much to the baseline, the copies on ScalarE (~224 us) would
    have made it ~835 us. GpSimd's 0.7 % (32 us) has no room for them either, so the copy
    runs on VectorE (modeled 3266 us then, 3005 with it on ScalarE; VectorE busy 3235 against
    the measured 3104, was 2974; at the refitted overlap, docs/cost-model.md, 3202 and
    3171; these figures predate the sequential-loop rule below, under which the row models
    5252 us: docs/cost-model.md "Beta-1 sequential loops").

    The source loops over tiles with a plain Python ``range``, which the beta-1 compiler
    replaced with ``sequential_range`` ("much more conservative loop-level optimizations
    compared to affine_range", NKI beta-1 API), so the port loops with
    ``nl.sequential_range`` (in NKI 0.7 an alias of range): the row's ``compiler = "beta1"``
    has the model not pipeline the tiles (docs/cost-model.md "Beta-1 sequential loops")."""
    d_head, seq = x_in.shape
    half = d_head // 2
    ts = 512
    if seq % ts:
        raise ValueError(f"rope_baseline: x_in.shape[1]={seq} must be a multiple of {ts} (the beta-1 "
                         "kernel's column tile, no remainder handling)")
    out = nl.ndarray((d_head, seq), dtype=x_in.dtype, buffer=nl.shared_hbm)
    for s0 in nl.sequential_range(0, seq, ts):   # the source's Python range (see above)
        xt = nl.ndarray((d_head, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x_in[:, s0:s0 + ts])
        ct = nl.ndarray((half, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ct, src=cos[:, s0:s0 + ts])
        st = nl.ndarray((half, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=st, src=sin[:, s0:s0 + ts])
        odd = nl.ndarray((half, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=odd, src=xt[half:d_head, :], engine=nisa.engine.vector)
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
    operand loaded straight to partitions 0-63, four products, subtract/add, two [64, 2048]
    stores; no copy.

    The source writes eight loads per tile (x's halves, cos and sin, each twice, once per
    product that reads it); the profile's HBM reads (268,435,456 B = x, cos and sin once)
    show the compiler merged the identical ones, so the port loads each of the four
    [64, 2048] operands once (until 2026-12-02 it issued all eight; VectorE bounds the
    kernel either way: modeled 2887 us both, before the sequential-loop rule; 3620 us under
    it). Its tile loop is a plain Python ``range``, as in rope_baseline: a beta-1 sequential
    loop."""
    d_head, seq = x_in.shape
    half = d_head // 2
    ts = 2048
    if seq % ts:
        raise ValueError(f"rope_optimized: x_in.shape[1]={seq} must be a multiple of {ts} (AccelOpt's "
                         "column tile, no remainder handling)")
    out = nl.ndarray((d_head, seq), dtype=x_in.dtype, buffer=nl.shared_hbm)

    def load(src):
        t = nl.ndarray((half, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src)
        return t

    def product(a, b, op):
        t = nl.ndarray((half, ts), dtype=x_in.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=t, data1=a, data2=b, op=op, engine=nisa.engine.vector)
        return t

    for s0 in nl.sequential_range(0, seq, ts):   # the source's Python range (rope_baseline)
        cols = slice(s0, s0 + ts)
        # in the order the source's products first read them
        even, c = load(x_in[0:half, cols]), load(cos[:, cols])
        e_cos = product(even, c, nl.multiply)
        odd, sn = load(x_in[half:d_head, cols]), load(sin[:, cols])
        o_sin = product(odd, sn, nl.multiply)
        e_sin = product(even, sn, nl.multiply)
        o_cos = product(odd, c, nl.multiply)
        nisa.dma_copy(dst=out[0:half, cols], src=product(e_cos, o_sin, nl.subtract))
        nisa.dma_copy(dst=out[half:d_head, cols], src=product(o_cos, e_sin, nl.add))
    return out


@nki.jit
def adamw(theta, g, m, v):
    """NKIBench adamw_M10944_N2048: one AdamW step with the reference's constants, fp32
    [M, N] arrays (M any size, N a multiple of 1024) -> the new theta:

        theta - 1e-5 theta - 0.01 (0.9 m + 0.1 g) / (sqrt(1000 (0.999 v + 0.001 g g)) + 1e-8)

    Per [128, 1024] block (the last row tile holds M % 128 rows: the beta-1 kernel's row
    mask), in row-tile-major order: four loads (theta, m, v, g, in the beta-1 order); per
    512-column half fifteen instructions in the beta-1 order; one store. The beta-1 kernel
    leaves the engine of its seven tensor_scalar products/sums to the compiler: they run on
    ScalarE here, because the profile's ScalarE 61.6 % busy (1.23 ms, 3.6 us per half) is
    about eight ~0.45 us ScalarE instructions per half (silu's profile: 0.47 us per
    512-column activation), not the single sqrt (the port issues nine there: the seven, the
    sqrt and the reciprocal). The element-wise tensor-tensor ops (nl.add/subtract/
    multiply) run on VectorE (the profile: VectorE 90 %, GpSimd 0.6 %); nisa.reciprocal runs
    on ScalarE, as in every port (module docstring)."""
    rows_total, cols = theta.shape
    block, half = 1024, 512
    if cols % block:
        raise ValueError(f"adamw: theta.shape[1]={cols} must be a multiple of {block} (the beta-1 "
                         "kernel's column block)")
    out = nl.ndarray(theta.shape, dtype=theta.dtype, buffer=nl.shared_hbm)
    zero = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)   # the sqrt's bias
    nisa.memset(dst=zero, value=0.0)
    f32, sbuf = nl.float32, nl.sbuf
    scalar, vector = nisa.engine.scalar, nisa.engine.vector
    # Every tile is allocated on its own line or call path: the cost model's buffer rotation
    # groups tiles by allocation site, and each beta-1 array is its own buffer family.

    def scaled(src, c):
        """c * src on ScalarE (beta-1's tensor_scalar, reverse0=True)."""
        t = nl.ndarray(tuple(src.shape), dtype=f32, buffer=sbuf)
        nisa.tensor_scalar(dst=t, data=src, op0=nl.multiply, operand0=c, reverse0=True, engine=scalar)
        return t

    def combined(a, b, op):
        """a op b on VectorE (beta-1's nl.add / subtract / multiply of two tiles)."""
        t = nl.ndarray(tuple(a.shape), dtype=f32, buffer=sbuf)
        nisa.tensor_tensor(dst=t, data1=a, data2=b, op=op, engine=vector)
        return t

    for r0 in range(0, rows_total, P):
        n = min(P, rows_total - r0)   # the last row tile holds M % 128 rows (beta-1's mask)
        for c0 in range(0, cols, block):
            rs, cb = slice(r0, r0 + n), slice(c0, c0 + block)
            theta_t = nl.ndarray((n, block), dtype=f32, buffer=sbuf)
            nisa.dma_copy(dst=theta_t, src=theta[rs, cb])
            m_t = nl.ndarray((n, block), dtype=f32, buffer=sbuf)
            nisa.dma_copy(dst=m_t, src=m[rs, cb])
            v_t = nl.ndarray((n, block), dtype=f32, buffer=sbuf)
            nisa.dma_copy(dst=v_t, src=v[rs, cb])
            g_t = nl.ndarray((n, block), dtype=f32, buffer=sbuf)
            nisa.dma_copy(dst=g_t, src=g[rs, cb])
            new_theta = nl.ndarray((n, block), dtype=f32, buffer=sbuf)
            for h0 in range(0, block, half):
                cs = slice(h0, h0 + half)
                th, mh, vh, gh = theta_t[:, cs], m_t[:, cs], v_t[:, cs], g_t[:, cs]
                # theta - 1e-5 theta
                wd = scaled(th, 1e-5)
                decayed = combined(th, wd, nl.subtract)
                # 0.01 (0.9 m + 0.1 g)
                m_part = scaled(mh, 0.9)
                g_part = scaled(gh, 0.1)
                m_new = combined(m_part, g_part, nl.add)
                step = scaled(m_new, 0.01)
                # 0.999 v + 0.001 g g
                v_part = scaled(vh, 0.999)
                g_scaled = scaled(gh, 0.001)
                g2 = combined(g_scaled, gh, nl.multiply)
                v_new = combined(v_part, g2, nl.add)
                # 1 / (sqrt(1000 v_new) + 1e-8)
                root = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.activation(dst=root, op=nl.sqrt, data=v_new, bias=zero[0:n, :], scale=1000.0)
                denom = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.tensor_scalar(dst=denom, data=root, op0=nl.add, operand0=1e-8, engine=scalar)
                inv = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.activation(dst=inv, op=nl.reciprocal, data=denom)
                update = combined(step, inv, nl.multiply)
                nisa.tensor_tensor(dst=new_theta[:, cs], data1=decayed, data2=update, op=nl.subtract,
                                   engine=vector)
            nisa.dma_copy(dst=out[rs, cb], src=new_theta)
    return out



@nki.jit
def rmsnorm_matmul(x, w, rows_per_block=8):
    """NKIBench rmsnorm_matmul_M4096_N2048_K1024: x [T, 128, K] (row tiles), w [K/128, 128, N],
    fp32 -> (x / sqrt(mean(x^2, axis=-1))) @ w as [T, 128, N]; the profiled shape is
    T = 32, K = 1024, N = 2048 (rows_per_block = 8, as the beta-1 code's i0/i1 loops).

    Per block of ``rows_per_block`` row tiles, per row tile: load x [128, K]; per 512-column
    part: ScalarE square (zero bias tile), multiply by 1/K, VectorE tensor_reduce, and the
    beta-1 loop_reduce as a VectorE [128, 1] copy (first part) or add (later parts); ScalarE
    rsqrt; per 512-column part: multiply by the rsqrt column, then per 128-column piece a
    TensorE transpose (nc_matmul is_transpose against the identity) and its PSUM -> SBUF
    copy. Then per 1024-column part of N: load the K/128 weight tiles [128, 1024] of the
    block, and per row tile, per 512 columns, accumulate the K/128 matmuls in one PSUM
    tile, copy it out and store [128, 1024].

    Engines the beta-1 code left to the compiler (the two tensor_scalar multiplies, the
    loop_reduce and the nl.copy PSUM -> SBUF copies): the profile shows VectorE 3.9 %
    (41 us, about the 64 [128, 512] tensor_reduces alone) and ScalarE 17.8 % busy, so every
    full-size one goes to ScalarE (the copies as activation(copy): NeuronCore-v2's ScalarE
    has no tensor_copy) and the [128, 1] loop_reduce to VectorE.

    x is loaded once per row tile, not twice as the beta-1 code writes it: the profile's HBM
    reads (39,387,136 B) are below x twice (33,554,432 B) plus one w (8,388,608 B), so the
    compiler merged the two identical loads. w is loaded once per block as written (32 MiB
    in all; the profile's 21.5 MiB says the compiler kept part of it resident across
    blocks, which the port does not reproduce)."""
    tiles, parts, k_size = x.shape
    k_tiles, _, n_size = w.shape
    part, n_part = 512, 1024        # the beta-1 code's column tiles of x and of w/out
    if parts != P or w.shape[1] != P:
        raise ValueError(f"x.shape[1]={parts} and w.shape[1]={w.shape[1]} must be {P} (partitions)")
    if k_size % part or k_tiles * P != k_size:
        raise ValueError(f"x.shape[2]={k_size} must be a multiple of {part} and equal w.shape[0] x {P} "
                         f"= {k_tiles * P}")
    if n_size % n_part:
        raise ValueError(f"w.shape[2]={n_size} must be a multiple of {n_part}")
    if tiles % rows_per_block:
        raise ValueError(f"x.shape[0]={tiles} must be a multiple of rows_per_block={rows_per_block}")
    pieces = part // P
    out = nl.ndarray((tiles, P, n_size), dtype=x.dtype, buffer=nl.shared_hbm)
    zero = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)
    ident = nl.shared_identity_matrix(P, dtype=nl.float32)
    for b in range(tiles // rows_per_block):
        xT = {}                     # (row tile, k tile) -> x^T [128 (k), 128 (rows)]
        for r in range(rows_per_block):
            xt = nl.ndarray((P, k_size), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xt, src=x[b * rows_per_block + r])
            ssum = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            for h in range(k_size // part):
                cols = slice(h * part, (h + 1) * part)
                sq = nl.ndarray((P, part), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=sq, op=nl.square, data=xt[:, cols], bias=zero, scale=1.0)
                sc = nl.ndarray((P, part), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=sc, data=sq, op0=nl.multiply, operand0=1.0 / k_size,
                                   engine=nisa.engine.scalar)
                part_sum = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_reduce(dst=part_sum, op=nl.add, data=sc, axis=1)
                if h == 0:
                    nisa.tensor_copy(dst=ssum, src=part_sum, engine=nisa.engine.vector)
                else:
                    nisa.tensor_tensor(dst=ssum, data1=ssum, data2=part_sum, op=nl.add,
                                       engine=nisa.engine.vector)
            rinv = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=rinv, op=nl.rsqrt, data=ssum, bias=zero, scale=1.0)
            for h in range(k_size // part):
                xn = nl.ndarray((P, part), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=xn, data=xt[:, h * part:(h + 1) * part], op0=nl.multiply,
                                   operand0=rinv, engine=nisa.engine.scalar)
                for q in range(pieces):
                    tp = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
                    nisa.nc_matmul(dst=tp, stationary=xn[:, q * P:(q + 1) * P], moving=ident,
                                   is_transpose=True)
                    t = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.activation(dst=t, op=nl.copy, data=tp)
                    xT[r, h * pieces + q] = t
        for c in range(n_size // n_part):
            wt = []
            for k in range(k_tiles):
                t = nl.ndarray((P, n_part), dtype=w.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=t, src=w[k, :, c * n_part:(c + 1) * n_part])
                wt.append(t)
            for r in range(rows_per_block):
                ot = nl.ndarray((P, n_part), dtype=x.dtype, buffer=nl.sbuf)
                for j in range(n_part // part):
                    cols = slice(j * part, (j + 1) * part)
                    acc = nl.ndarray((P, part), dtype=nl.float32, buffer=nl.psum)
                    for k in range(k_tiles):
                        nisa.nc_matmul(dst=acc, stationary=xT[r, k], moving=wt[k][:, cols])
                    nisa.activation(dst=ot[:, cols], op=nl.copy, data=acc)
                nisa.dma_copy(dst=out[b * rows_per_block + r, :, c * n_part:(c + 1) * n_part], src=ot)
    return out


def _inverse_rms(a, eps):
    """1 / sqrt(mean(a**2, axis=1) + eps) as a (P, 1) tile, the beta-1 steps of both
    add/matmul + rmsnorm kernels: ScalarE square, VectorE row sum, / N and + eps (VectorE
    tensor_scalar, [P, 1]; / N as * (1 / N): NKI 0.7's ISA has no divide operator), ScalarE
    rsqrt."""
    parts, n = a.shape
    sq = nl.ndarray((parts, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq, op=nl.square, data=a)
    ssum = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=ssum, op=nl.add, data=sq, axis=1)
    mean = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=mean, data=ssum, op0=nl.multiply, operand0=1.0 / n, engine=nisa.engine.vector)
    mean_eps = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=mean_eps, data=mean, op0=nl.add, operand0=float(eps), engine=nisa.engine.vector)
    rms_inv = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rms_inv, op=nl.rsqrt, data=mean_eps)
    return rms_inv


def _broadcast_on_tensore(vec):
    """[128, n] SBUF copy of an HBM vector [n], as the beta-1 compiler lowers
    ``broadcast_to`` onto the partitions: the vector on one partition, ones^T @ it on TensorE
    into PSUM per 512 columns (a bank of fp32), copied out on ScalarE (``nl.copy``'s
    engine in these ports). fused_mamba.rst @72825d50 ("a partition-dimension broadcast ...
    using a separate instruction on TensorE"); the add_rmsnorm_matmul and
    matmul_add_rmsnorm profiles' hardware FLOPs exceed their matmuls' and transposes' by
    exactly 2 x 128 x n, one such outer product."""
    n = vec.shape[0]
    row = nl.ndarray((1, n), dtype=vec.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=row, src=vec.reshape((1, n)))
    ones = nl.ndarray((1, P), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    out = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    for c0 in range(0, n, 512):
        cols = slice(c0, min(c0 + 512, n))
        part = nl.ndarray((P, cols.stop - c0), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=part, stationary=ones, moving=row[:, cols])
        nisa.activation(dst=out[:, cols], op=nl.copy, data=part)
    return out


@nki.jit
def add_rmsnorm_matmul(x_tensor, w_tensor, eps, z_tensor, g_tensor):
    """NKIBench add_rmsnorm_matmul_M4096_N2048_K1024: x, z [M, K], w [K, N], g [K], fp32 ->
    (y / sqrt(mean(y^2, axis=-1) + eps) * g) @ w with y = x + z, [M, N].

    Per 128-row tile: load x and z [128, K]; VectorE add; ScalarE square; VectorE sum
    (tensor_reduce); [128, 1] divide by K and add eps (VectorE); ScalarE rsqrt; multiply by
    it (ScalarE) and by the broadcast g (VectorE, in place); then per 512 columns of N, per
    128 rows of K: TensorE transpose of the [128, 128] piece (nc_matmul is_transpose
    against the identity), its PSUM -> SBUF copy and the matmul accumulating in one PSUM
    tile [128, 512]; copy that out and store it.

    What the compiler did to the beta-1 code, read off the profile: its HBM reads
    (42,012,672 B) are exactly x + z + w + g + a 128 x 128 fp32 identity, so the w tiles
    the code loads inside the row loop were hoisted out of it (loaded once, before the
    loop, here) and each nl.matmul's stationary operand was transposed on TensorE with the
    identity (the profile's transpose FLOPs are 4x rmsnorm_matmul's 256 transposes: one per
    (row tile, 512 columns, 128 rows of K)); g's broadcast to 128 partitions is a TensorE
    outer product with a ones row (the profile's hardware FLOPs exceed 2x the matmuls' plus
    the transposes' by 262,144), done once. nl.add / nl.multiply of two tiles and nl.sum go
    to VectorE (tensor_tensor's and tensor_reduce's default engine), as do the [128, 1]
    scalar steps (tensor_scalar's default); nl.square and nl.rsqrt are ScalarE activations;
    the rest (the multiply by the rsqrt column and every
    nl.copy / PSUM -> SBUF copy) goes to ScalarE, as the profile's VectorE 14.8 % (181 us,
    about the add, the g multiply and the sums alone) leaves them no room on VectorE."""
    m_size, k_size = x_tensor.shape
    n_size = w_tensor.shape[1]
    tile_n = 512                    # the beta-1 code's TILE_N (a PSUM bank of fp32)
    if z_tensor.shape != x_tensor.shape:
        raise ValueError(f"z_tensor.shape={tuple(z_tensor.shape)} must equal x_tensor.shape={tuple(x_tensor.shape)}")
    if w_tensor.shape[0] != k_size or tuple(g_tensor.shape) != (k_size,):
        raise ValueError(f"w_tensor.shape[0]={w_tensor.shape[0]} and g_tensor.shape={tuple(g_tensor.shape)} "
                         f"must match K=x_tensor.shape[1]={k_size}")
    if m_size % P or k_size % P:
        raise ValueError(f"x_tensor.shape={tuple(x_tensor.shape)}: M and K must be multiples of {P}")
    if n_size % tile_n:
        raise ValueError(f"w_tensor.shape[1]={n_size} must be a multiple of {tile_n}")
    k_tiles = k_size // P
    result = nl.ndarray((m_size, n_size), dtype=x_tensor.dtype, buffer=nl.shared_hbm)
    ident = nl.shared_identity_matrix(P, dtype=nl.float32)
    g_bcast = _broadcast_on_tensore(g_tensor)
    w_tiles = {}                    # (n, k) -> w [128 (k), 512 (n)], hoisted out of the row loop
    for n in range(n_size // tile_n):
        for k in range(k_tiles):
            t = nl.ndarray((P, tile_n), dtype=w_tensor.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=w_tensor[k * P:(k + 1) * P, n * tile_n:(n + 1) * tile_n])
            w_tiles[n, k] = t
    for i in range(m_size // P):
        rows = slice(i * P, (i + 1) * P)
        xt = nl.ndarray((P, k_size), dtype=x_tensor.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x_tensor[rows, :])
        zt = nl.ndarray((P, k_size), dtype=z_tensor.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=zt, src=z_tensor[rows, :])
        a = nl.ndarray((P, k_size), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=a, data1=xt, data2=zt, op=nl.add, engine=nisa.engine.vector)
        rms_inv = _inverse_rms(a, eps)
        y = nl.ndarray((P, k_size), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=a, op0=nl.multiply, operand0=rms_inv, engine=nisa.engine.scalar)
        nisa.tensor_tensor(dst=y, data1=y, data2=g_bcast, op=nl.multiply, engine=nisa.engine.vector)
        for n in range(n_size // tile_n):
            acc = nl.ndarray((P, tile_n), dtype=nl.float32, buffer=nl.psum)
            for k in range(k_tiles):
                tp = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=tp, stationary=y[:, k * P:(k + 1) * P], moving=ident, is_transpose=True)
                yT = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=yT, op=nl.copy, data=tp)
                nisa.nc_matmul(dst=acc, stationary=yT, moving=w_tiles[n, k])
            res = nl.ndarray((P, tile_n), dtype=result.dtype, buffer=nl.sbuf)
            nisa.activation(dst=res, op=nl.copy, data=acc)
            nisa.dma_copy(dst=result[rows, n * tile_n:(n + 1) * tile_n], src=res)
    return result



@nki.jit
def matmul_add_rmsnorm(x_tensor, w_tensor, eps, z_tensor, g_tensor):
    """NKIBench matmul_add_rmsnorm_M4096_N2048_K2048: y = x @ w + z, out = y * g / rms(y)
    over each row of y (rms = sqrt(mean(y ** 2) + eps)); x [M, K], w [K, N], z [M, N],
    g [N], fp32.

    Per 128-row block of x (loaded [128, K] once): per 512-column chunk of N, per 128-row
    tile of K: the beta-1 ``nl.matmul(x_tile, w_tile)`` takes x with M on partitions, so the
    compiler inserts a TensorE transpose of the [128, 128] x slice into PSUM and a copy to
    SBUF before the matmul, one per matmul (the profile's transpose_flops, 2048 transposes,
    say it did not hoist them out of the N loop). The transposes are matmuls against an fp32
    identity loaded once from HBM (nc_matmul is_transpose), as in add_rmsnorm_matmul, whose
    profile's HBM reads count that identity for the same compiler-inserted transposes (until
    2026-12-06 this port used nc_transpose, which loads none); the copies and the PSUM ->
    SBUF result copies go to ScalarE (``nl.copy`` leaves the engine to the compiler: 2048 +
    128 copies fit ScalarE's 16.8 % active, not VectorE's 12.4 %). Then per block: load z, VectorE add,
    ScalarE square, VectorE sum over the row, / N and + eps (VectorE), ScalarE rsqrt,
    VectorE multiply by the [128, 1] reciprocal and by g, one store.

    w is loaded ONCE, tile by tile ([128, 512] per (n, k)), before the row loop: the beta-1
    code loads each w tile inside the row loop, but the loads do not depend on the row
    block and the profile's HBM reads (98.1 MB: x, z and w about twice, not the 571 MB of
    32 passes over w) show the compiler kept w on chip. w takes 128 KiB per partition
    (K / 128 x N fp32), which bounds K x N. g is loaded once and broadcast onto the 128
    partitions on TensorE (beta-1 ``g_tile.broadcast_to``): the profile's hardware FLOPs
    (85,899,870,208) are twice the matmuls' plus the transposes' plus 524,288 = 2 x 128 x N,
    one outer product with a ones row (_broadcast_on_tensore; until 2026-12-02 a stride-0
    DMA, which read g 128 times)."""
    M, K = x_tensor.shape
    N = w_tensor.shape[1]
    tm, tk, tn = P, P, 512   # beta-1 TILE_M, TILE_K, TILE_N (gemm moving fmax)
    for name, value, tile in (("x_tensor.shape[0] (M)", M, tm), ("x_tensor.shape[1] (K)", K, tk),
                              ("w_tensor.shape[1] (N)", N, tn)):
        if value % tile:
            raise ValueError(f"matmul_add_rmsnorm: {name}={value} must be a multiple of {tile} "
                             "(beta-1's tiles, no remainder handling)")
    out = nl.ndarray((M, N), dtype=x_tensor.dtype, buffer=nl.shared_hbm)
    ident = nl.shared_identity_matrix(P, dtype=nl.float32)
    g_t = _broadcast_on_tensore(g_tensor)
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
                xT_ps = nl.ndarray((tk, tm), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=xT_ps, stationary=x_t[:, k * tk:(k + 1) * tk], moving=ident,
                               is_transpose=True)
                xT = nl.ndarray((tk, tm), dtype=x_tensor.dtype, buffer=nl.sbuf)
                nisa.activation(dst=xT, op=nl.copy, data=xT_ps)
                nisa.nc_matmul(dst=acc, stationary=xT, moving=w_t[:, k, n * tn:(n + 1) * tn])
            nisa.activation(dst=y_t[:, n * tn:(n + 1) * tn], op=nl.copy, data=acc)
        z_t = nl.ndarray((tm, N), dtype=z_tensor.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=z_t, src=z_tensor[rows, :])
        a_t = nl.ndarray((tm, N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=a_t, data1=y_t, data2=z_t, op=nl.add, engine=nisa.engine.vector)
        rr = _inverse_rms(a_t, eps)
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


@nki.jit
def matmul(lhs, rhs):
    """NKIBench matmul_M4096_N12288_K5120: lhs @ rhs, fp32, with NKIBench's layouts: lhs
    [M/128, 128, K/128, 128] (the [M, K] matrix in row tiles, each row's K split in 128-wide
    tiles), rhs [K/128, 128, N], output [M/128, 128, N].

    Per 1024-column block of N, per 128-row tile of M: load the row tile as [128, 8, 128]
    pieces (eight K tiles each); per K tile a TensorE transpose against the identity
    (nc_matmul is_transpose) and its PSUM -> SBUF copy, giving lhsᵀ [128 (k), 128 (m)]; per
    K tile, load the block's rhs tile [128, 1024] and accumulate both 512-column halves in
    two PSUM banks; copy them out and store [128, 1024].

    What the compiler did, read from the profile's HBM bytes (9,059,762,176 read = lhs 12x
    + rhs 32x + the identity): lhs is re-read per N block as written, and rhs per row tile
    of M (the beta-1 code loads the block's rhs once per N block into a [5, 8, 128, 1024]
    array, 160 KiB per partition: with the row tile's buffers it does not fit trn1's 192
    KiB, and the compiler streamed it). Read once per row tile, each rhs tile serves both
    halves, so the port runs the K tiles outside the halves (beta-1's i6 loop), two PSUM
    accumulators live. The PSUM -> SBUF copies (beta-1 ``nl.copy``) go to ScalarE: the
    profile shows ScalarE 6.8 % and VectorE 0 % active."""
    mt, parts, kt, kp = lhs.shape
    k_tiles, _, N = rhs.shape
    nb, half, per_load = 1024, 512, 8
    if parts != P or kp != P or rhs.shape[1] != P:
        raise ValueError(f"lhs.shape[1]={parts}, lhs.shape[3]={kp} and rhs.shape[1]={rhs.shape[1]} must be "
                         f"{P} (partitions)")
    if kt != k_tiles or kt % per_load:
        raise ValueError(f"lhs.shape[2]={kt} (K tiles) must equal rhs.shape[0]={k_tiles} and be a multiple "
                         f"of {per_load} (the beta-1 code's [128, 8, 128] lhs loads)")
    if N % nb:
        raise ValueError(f"rhs.shape[2] (N)={N} must be a multiple of {nb} (the beta-1 code's column "
                         "block, no remainder handling)")
    out = nl.ndarray((mt, P, N), dtype=lhs.dtype, buffer=nl.shared_hbm)
    ident = nl.shared_identity_matrix(P, dtype=nl.float32)
    for n0 in range(0, N, nb):
        for m in range(mt):
            lT = nl.ndarray((P, kt, P), dtype=nl.float32, buffer=nl.sbuf)      # [k, K tile, m]
            for g in range(kt // per_load):
                lt = nl.ndarray((P, per_load, P), dtype=lhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=lt, src=lhs[m, :, g * per_load:(g + 1) * per_load, :])
                for j in range(per_load):
                    tp = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
                    nisa.nc_matmul(dst=tp, stationary=lt[:, j, :], moving=ident, is_transpose=True)
                    nisa.activation(dst=lT[:, g * per_load + j, :], op=nl.copy, data=tp)
            accs = [nl.ndarray((P, half), dtype=nl.float32, buffer=nl.psum) for _ in range(nb // half)]
            for k in range(kt):
                rt = nl.ndarray((P, nb), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=rt, src=rhs[k, :, n0:n0 + nb])
                for h, acc in enumerate(accs):
                    nisa.nc_matmul(dst=acc, stationary=lT[:, k, :], moving=rt[:, h * half:(h + 1) * half])
            ot = nl.ndarray((P, nb), dtype=lhs.dtype, buffer=nl.sbuf)
            for h, acc in enumerate(accs):
                nisa.activation(dst=ot[:, h * half:(h + 1) * half], op=nl.copy, data=acc)
            nisa.dma_copy(dst=out[m, :, n0:n0 + nb], src=ot)
    return out

"""Ports of NKIBench kernels (zhang677/AccelOpt @2dbeab40, NKIBench/kernels/*_0.py and
samples/nki/*_optimized.py), measured on trn1.32xlarge in fp32 (hw-measurements.md 10).

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
def adamw(theta, g, m, v):
    """NKIBench adamw_M10944_N2048: one AdamW step with the reference's constants, fp32
    [M, N] arrays (M any size, N a multiple of 1024) -> the new theta:

        theta - 1e-5 theta - 0.01 (0.9 m + 0.1 g) / (sqrt(1000 (0.999 v + 0.001 g g)) + 1e-8)

    Per [128, 1024] block (the last row tile holds M % 128 rows: the beta-1 kernel's row
    mask), in row-tile-major order: four loads (theta, m, v, g, in the beta-1 order); per
    512-column half fifteen instructions in the beta-1 order; one store. The beta-1 kernel
    leaves the engine of its seven tensor_scalar products/sums to the compiler: they run on
    ScalarE here, because the profile's ScalarE 61.6 % busy (1.23 ms, 3.6 us per half) is
    eight ~0.45 us ScalarE instructions per half (silu's profile: 0.47 us per 512-column
    activation), not the single sqrt. The element-wise tensor-tensor ops (nl.add/subtract/
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
    # Every tile is allocated on its own line: the cost model's buffer rotation groups tiles
    # by allocation site, and each beta-1 array is its own buffer family.
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
                wd = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.tensor_scalar(dst=wd, data=th, op0=nl.multiply, operand0=1e-5, reverse0=True,
                                   engine=scalar)
                decayed = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.tensor_tensor(dst=decayed, data1=th, data2=wd, op=nl.subtract, engine=vector)
                # 0.01 (0.9 m + 0.1 g)
                m_part = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.tensor_scalar(dst=m_part, data=mh, op0=nl.multiply, operand0=0.9, reverse0=True,
                                   engine=scalar)
                g_part = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.tensor_scalar(dst=g_part, data=gh, op0=nl.multiply, operand0=0.1, reverse0=True,
                                   engine=scalar)
                m_new = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.tensor_tensor(dst=m_new, data1=m_part, data2=g_part, op=nl.add, engine=vector)
                step = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.tensor_scalar(dst=step, data=m_new, op0=nl.multiply, operand0=0.01, reverse0=True,
                                   engine=scalar)
                # 0.999 v + 0.001 g g
                v_part = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.tensor_scalar(dst=v_part, data=vh, op0=nl.multiply, operand0=0.999, reverse0=True,
                                   engine=scalar)
                g_scaled = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.tensor_scalar(dst=g_scaled, data=gh, op0=nl.multiply, operand0=0.001, reverse0=True,
                                   engine=scalar)
                g2 = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.tensor_tensor(dst=g2, data1=g_scaled, data2=gh, op=nl.multiply, engine=vector)
                v_new = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.tensor_tensor(dst=v_new, data1=v_part, data2=g2, op=nl.add, engine=vector)
                # 1 / (sqrt(1000 v_new) + 1e-8)
                root = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.activation(dst=root, op=nl.sqrt, data=v_new, bias=zero[0:n, :], scale=1000.0)
                denom = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.tensor_scalar(dst=denom, data=root, op0=nl.add, operand0=1e-8, engine=scalar)
                inv = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.activation(dst=inv, op=nl.reciprocal, data=denom)
                update = nl.ndarray((n, half), dtype=f32, buffer=sbuf)
                nisa.tensor_tensor(dst=update, data1=step, data2=inv, op=nl.multiply, engine=vector)
                nisa.tensor_tensor(dst=new_theta[:, cs], data1=decayed, data2=update, op=nl.subtract,
                                   engine=vector)
            nisa.dma_copy(dst=out[rs, cb], src=new_theta)
    return out

"""Ports of the two kernels of AWS's LayerNorm tutorial (aws-neuron-sdk @72825d50
general/nki/tutorials/layernorm.rst, kernels in general/nki/examples/layernorm/
layernorm_nki_kernel.py: ``nki_layernorm_kernel_v1`` / ``_v2``), measured on trn1 in fp32
with ``nki.benchmark`` (hw-measurements.md 6).

Our own beta-2 code (NKI 0.7) issuing each beta-1 kernel's instructions, by the porting
rules of nkibench.py: per tile of 128 rows (the last tile holds num_rows % 128, beta-1's
mask), loaded and stored once, all columns of a row in one tile:

    v1  VectorE  sum(x) (tensor_reduce), / H                            mean
        ScalarE  x^2 (activation square); VectorE sum, / H, - mean^2    variance
        VectorE  x - mean (tensor_scalar)
        VectorE  + eps; ScalarE rsqrt                                   rstd
        VectorE  * rstd (a second tensor_scalar pass)
    v2  VectorE  bn_stats per 512 columns, bn_aggr                      mean, variance
        VectorE  + eps; ScalarE rsqrt                                   rstd
        VectorE  (x - mean) * rstd (one tensor_scalar, two ALU ops)
    both, then   VectorE  * gamma, + beta (tensor_tensor, fp32 SBUF x SBUF)

which is the tutorial's own account of the two versions ("Performance in Version 1 and
Version 2": v1's mean N VectorE cycles, its variance N ScalarE cycles plus VectorE work,
its shift and scale two N-element instructions; v2's statistics "roughly N Vector Engine
cycles" and one tensor_scalar of N). The beta-1 ``nl.mean(nl.square(x))`` is lowered as in
nkibench.py's ``_inverse_rms`` (ScalarE square, VectorE row sum). gamma and beta are
broadcast onto the partitions once, before the row loop, as the beta-1 ``broadcast_to`` is
compiled in every port here: the [1, H] row times a ones row on TensorE into PSUM, 512
columns per matmul, copied to SBUF on ScalarE (nkibench.py ``_broadcast_on_tensore``).
"""

import nki
import nki.isa as nisa
import nki.language as nl

P = 128
BANK_FP32 = 512     # fp32 columns of one PSUM bank
BN_STATS_FMAX = 512  # bn_stats: elements per partition per instruction
BN_STATS_WIDTH = 6   # bn_stats: fp32 values per partition it writes


def _on_partitions(vec, ones):
    """[128, H] fp32 SBUF copy of an HBM vector [H]: ones^T @ row on TensorE per PSUM bank,
    copied out on ScalarE (module docstring)."""
    n = vec.shape[0]
    row = nl.ndarray((1, n), dtype=vec.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=row, src=vec.reshape((1, n)))
    out = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    for c0 in range(0, n, BANK_FP32):
        cols = slice(c0, min(c0 + BANK_FP32, n))
        part = nl.ndarray((P, cols.stop - c0), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=part, stationary=ones, moving=row[:, cols])
        nisa.activation(dst=out[:, cols], op=nl.copy, data=part)
    return out


def _small(parts):
    """A [parts, 1] fp32 tile: one statistic per row."""
    return nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)


def _row_mean(data, n):
    """sum over the free axis / n on VectorE: the beta-1 nl.mean(., axis=1) (the division
    by the constant n as a multiply by 1 / n: NKI 0.7's ISA has no divide operator)."""
    parts = data.shape[0]
    total = _small(parts)
    nisa.tensor_reduce(dst=total, op=nl.add, data=data, axis=1)
    mean = _small(parts)
    nisa.tensor_scalar(dst=mean, data=total, op0=nl.multiply, operand0=1.0 / n, engine=nisa.engine.vector)
    return mean


def _rstd(var, eps):
    """rsqrt(var + eps): VectorE add, ScalarE rsqrt (beta-1 nl.rsqrt(var + epsilon))."""
    parts = var.shape[0]
    var_eps = _small(parts)
    nisa.tensor_scalar(dst=var_eps, data=var, op0=nl.add, operand0=float(eps), engine=nisa.engine.vector)
    rstd = _small(parts)
    nisa.activation(dst=rstd, op=nl.rsqrt, data=var_eps)
    return rstd


def _stats_v1(x, n):
    """(mean, var) of v1: nl.mean(x), nl.mean(nl.square(x)) - mean * mean (rstd comes after
    the shift: the source's (x - mean) * nl.rsqrt(var + epsilon) evaluates x - mean first)."""
    parts = x.shape[0]
    mean = _row_mean(x, n)
    sq = nl.ndarray((parts, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq, op=nl.square, data=x)
    mean_sq = _row_mean(sq, n)
    mean2 = _small(parts)
    nisa.tensor_tensor(dst=mean2, data1=mean, data2=mean, op=nl.multiply, engine=nisa.engine.vector)
    var = _small(parts)
    nisa.tensor_tensor(dst=var, data1=mean_sq, data2=mean2, op=nl.subtract, engine=nisa.engine.vector)
    return mean, var


def _stats_v2(x, n, eps):
    """(mean, rstd) of v2: bn_stats per 512 columns, bn_aggr, nl.rsqrt."""
    parts = x.shape[0]
    chunks = (n + BN_STATS_FMAX - 1) // BN_STATS_FMAX
    stats = nl.ndarray((parts, BN_STATS_WIDTH * chunks), dtype=nl.float32, buffer=nl.sbuf)
    for j in range(chunks):
        c0, c1 = j * BN_STATS_FMAX, min(n, (j + 1) * BN_STATS_FMAX)
        nisa.bn_stats(dst=stats[:, j * BN_STATS_WIDTH:(j + 1) * BN_STATS_WIDTH], data=x[:, c0:c1])
    mean_var = nl.ndarray((parts, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.bn_aggr(dst=mean_var, data=stats)
    return mean_var[:, 0:1], _rstd(mean_var[:, 1:2], eps)


@nki.jit
def layernorm(x, gamma, beta, version, eps=1e-5):
    """x [rows, H] fp32 (any rows, H <= the SBUF row), gamma and beta [H] -> [rows, H]."""
    if version not in ("v1", "v2"):
        raise ValueError(f"version={version!r}; expected 'v1' or 'v2'")
    rows, n = x.shape
    if tuple(gamma.shape) != (n,) or tuple(beta.shape) != (n,):
        raise ValueError(f"gamma {tuple(gamma.shape)} and beta {tuple(beta.shape)} must both be ({n},), "
                         f"x.shape[1]")
    out = nl.ndarray((rows, n), dtype=x.dtype, buffer=nl.shared_hbm)
    ones = nl.ndarray((1, P), dtype=nl.float32, buffer=nl.sbuf)   # the broadcasts' stationary row
    nisa.memset(dst=ones, value=1.0)
    gamma_b = _on_partitions(gamma, ones)
    beta_b = _on_partitions(beta, ones)
    for r0 in range(0, rows, P):
        parts = min(P, rows - r0)     # beta-1's row mask on the last tile
        xt = nl.ndarray((parts, n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[r0:r0 + parts, :])
        if version == "v1":
            mean, var = _stats_v1(xt, n)
            shifted = nl.ndarray((parts, n), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=shifted, data=xt, op0=nl.subtract, operand0=mean, engine=nisa.engine.vector)
            rstd = _rstd(var, eps)
            normed = nl.ndarray((parts, n), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=normed, data=shifted, op0=nl.multiply, operand0=rstd,
                               engine=nisa.engine.vector)
        else:
            mean, rstd = _stats_v2(xt, n, eps)
            normed = nl.ndarray((parts, n), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=normed, data=xt, op0=nl.subtract, operand0=mean, op1=nl.multiply,
                               operand1=rstd, engine=nisa.engine.vector)
        scaled = nl.ndarray((parts, n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=scaled, data1=normed, data2=gamma_b[0:parts, :], op=nl.multiply,
                           engine=nisa.engine.vector)
        yt = nl.ndarray((parts, n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=yt, data1=scaled, data2=beta_b[0:parts, :], op=nl.add, engine=nisa.engine.vector)
        nisa.dma_copy(dst=out[r0:r0 + parts, :], src=yt)
    return out

"""Micro-benchmarks behind the instruction-level rows of measurements.toml.

Each kernel reproduces the setup of one published profile or figure (named in the row):
a few DMA transfers, one engine instruction, a dependent chain. Our own beta-2 code
(NKI 0.7), written from the documents' descriptions of the setups.
"""

import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def dma_stream(src, count, cols):
    """``count`` HBM->SBUF copies of ``[P, cols]`` blocks of ``src`` ([count * P, cols]),
    each into its own column slice of one SBUF tile (no transfer waits for another).

    The DMA overview's throughput-vs-bytes-per-partition figure and its single-transfer
    profiles: a stream of independent transfers of one size."""
    rows, width = src.shape
    if count < 1:
        raise ValueError(f"dma_stream: count={count} must be at least 1")
    if rows % count:
        # block i is rows [i * rows/count, (i + 1) * rows/count): a remainder would be left unread
        raise ValueError(f"dma_stream: src.shape[0]={rows} must be a multiple of count={count} "
                         "(count equal row blocks, no remainder)")
    if width != cols:
        raise ValueError(f"dma_stream: src.shape[1]={width} must equal cols={cols} (each copy moves a "
                         "whole [rows/count, cols] block)")
    parts = rows // count
    tile = nl.ndarray((parts, count * cols), dtype=src.dtype, buffer=nl.sbuf)
    for i in range(count):
        nisa.dma_copy(dst=tile[:, i * cols:(i + 1) * cols], src=src[i * parts:(i + 1) * parts, :])
    # the kernel needs an output: one column of the first block back to HBM (not measured)
    out = nl.ndarray((parts, 1), dtype=src.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=tile[:, 0:1])
    return out


@nki.jit
def activation(x, func):
    """One ScalarE activation over an SBUF copy of ``x`` ([P, N])."""
    t = nl.load(x)
    y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.activation(dst=y, op={"exp": nl.exp, "copy": nl.copy}[func], data=t)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, y)
    return out


@nki.jit
def activation_chain(x, length):
    """``length`` dependent 1-element ACTIVATE (identity with scale and bias) instructions on
    [P, 1]: each reads the previous one's result (perf guide, fig16)."""
    t = nl.load(x)
    bias = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=bias, value=0.0)      # NeuronCore-v2 takes the bias as a (P, 1) tile
    for _ in range(length):
        nxt = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=nxt, op=nl.copy, data=t, scale=1.0, bias=bias)
        t = nxt
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


@nki.jit
def tensor_tensor_add(a, b):
    """One VectorE tensor_tensor add of two SBUF tiles ([P, N] each) (perf guide, fig17)."""
    ta = nl.load(a)
    tb = nl.load(b)
    y = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=y, data1=ta, data2=tb, op=nl.add, engine=nisa.engine.vector)
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, y)
    return out


@nki.jit
def matmul_then_copy(stationary, moving):
    """One nc_matmul (stationary [K, M], moving [K, N]) and the VectorE copy of its PSUM
    result: the copy starts when the result is readable (perf guide, fig20-21)."""
    st = nl.load(stationary)
    mv = nl.load(moving)
    acc = nl.ndarray((stationary.shape[1], moving.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=st, moving=mv)
    res = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc, engine=nisa.engine.vector)
    out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, res)
    return out

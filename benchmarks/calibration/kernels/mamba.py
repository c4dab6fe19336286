"""The selective-scan (Mamba SSM) kernel variants of AWS's fused-Mamba tutorial and of
AccelOpt, measured on trn1 in fp32 (hw-measurements.md 5, 10, 11).

    out[c, t] = sum_s C[s, t] * h_s[c, t],  h_s[c, t] = exp(delta[c, t] * A[c, s]) * h_s[c, t-1]
                                                        + delta[c, t] * u[c, t] * B[s, t]

Our own beta-2 code, written from the tutorial's description of each version (aws-neuron-sdk
nki/guides/tutorials/fused_mamba.rst) and AccelOpt's description of its kernel; every version
issues per (channel tile, state[, sequence chunk]) the same instructions:

    ScalarE  deltaA = exp(delta * A[:, s])                  (activation, A as the scale)
    VectorE  deltaU = delta * u; deltaBu = deltaU * B[s]    (tensor_tensor x 2)
    VectorE  h = scan(deltaA, deltaBu)                      (tensor_tensor_scan: h = a*h + b)
    VectorE  scanC = h * C[s]; acc += scanC                 (tensor_tensor x 2)

with acc zeroed (``nl.zeros``: a VectorE memset) before the state loop, as in every source.

B[s] and C[s] reach all 128 partitions the way the beta-1 code's ``broadcast_to`` on the
partition dimension is compiled: "a partition-dimension broadcast ... using a separate
instruction on TensorE" (fused_mamba.rst @72825d50, "Option 2"). The [1, n] row is loaded to
one partition and multiplied by a [1, 128] row of ones into PSUM, where VectorE reads it
(tensor_tensor with one input in PSUM: N cycles, not 2N). The profiles agree: TensorE is
active and PSUM in use in kernels whose source issues no matmul, and v1's PSUM usage steps
once per state, when B[s] and C[s] change (img/mamba_v1_profile_4k_chan.png, mamba_v2.png).
VectorE reads them in PSUM rather than from a copy in SBUF: with SBUF inputs it is charged
2N, and v2's profiled VectorE duration sum (2350 us) sits below either figure but nearer the
PSUM read's (modeled 2656 us against 3124). Until 2026-12-02 the port broadcast B and C by a
stride-0 DMA into SBUF (Mamba v2 at 4096 channels modeled +51 %). Versions differ in loop
order, reuse and tiling:

* v1: states outer, channel tiles inner; every operand loaded per (state, tile), delta, A
  and u each from a line of its own (its own allocation site, as the source's three tiles;
  until the port audit of 2026-12-06 one line loaded all three, one rotating buffer family:
  177.7 us modeled at 256 channels, 157.8 us since) and in the source's order (delta, A, exp, u, B);
* v2: channel tiles outer; delta and u loaded once per tile, reused across states;
* v3: v2 with the sequence in 512-column chunks, the scan carried between chunks;
* autocomp_v2: v2 with delta * u computed once per channel tile (Autocomp's second kernel,
  ucb-bar/autocomp examples/trn-tutorial/3_mamba_trace.py, score 0.539 ms; its first,
  0.636 ms, is the tutorial's v1);
* autocomp_v3: autocomp_v2 with A loaded once per channel tile as a [128, states] block
  (Autocomp's fourth kernel, score 0.538 ms);
* autocomp_v4, autocomp_v5: Autocomp's fifth (0.435 ms) and sixth (0.43 ms) kernels: per
  channel tile, 512-column chunks in the source's ``nl.sequential_range``, states inner, the
  accumulator in PSUM (``_autocomp_chunked``); v5 double-buffers the B and C rows and runs its
  state loop in ``nl.sequential_range``;
* accelopt: sequence chunks outer (the source's ``nl.sequential_range``), then tiles, then
  states; delta/u per (chunk, tile).

Autocomp's trace (examples/trn-tutorial/3_mamba_trace.py @dd26a565, eight candidates) beyond
these: the second (0.636 ms) is v1 with B and C loaded once per state rather than per (state,
tile), an unported near-copy of the first (same score). The seventh (0.362 ms) and eighth
(0.359 ms) are not ported: they replace the sixth's ``nl.broadcast_to`` of B and C with
``nl.multiply(tile, row)``, the row [1, chunk] broadcast implicitly on the partitions, and
no document says how the beta-1 compiler lowers that; under the ``broadcast_to`` rule above
the seventh's stream would be the sixth's exactly, while the measurement has it 16 % faster.
"""

import nki
import nki.isa as nisa
import nki.language as nl

P = 128
CHUNK = 512
BANK_FP32 = 512   # fp32 columns of one PSUM bank (2 KiB per partition)


def _load(src):
    t = nl.ndarray(tuple(src.shape), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    return t


def _broadcast(row, ones):
    """[P, n] PSUM broadcast of a [1, n] SBUF row: ones^T @ row on TensorE, one matmul per
    PSUM bank (512 fp32 columns)."""
    n = row.shape[1]
    t = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.psum)
    for k0 in range(0, n, BANK_FP32):
        k1 = min(n, k0 + BANK_FP32)
        nisa.nc_matmul(dst=t[:, k0:k1], stationary=ones, moving=row[:, k0:k1])
    return t


def _delta_u(delta_t, u_t):
    """deltaU = delta * u on VectorE."""
    dU = nl.ndarray(tuple(delta_t.shape), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dU, data1=delta_t, data2=u_t, op=nl.multiply, engine=nisa.engine.vector)
    return dU


def _state_step(acc, delta_t, u_t, a_col, b_row, c_row, init, ones, dU=None, u_src=None, carry=None):
    """One (tile, state[, chunk]) step in the tutorial source's order (exp; [u's load;] B's
    load; delta * u; B's broadcast; deltaBu; the scan; C's load and broadcast; scanC; acc +=);
    returns the scan result (for a carried state). ``dU``: delta * u computed once per tile by
    the caller (autocomp_v2/v3), else here. ``u_src``: v1's u, loaded here, after the exp, as
    the source loads it (``u_t`` is then None). ``carry``: v3's and AccelOpt's carried state, a
    [P, 1] column the scan's last column is copied into (VectorE) right after the scan, where
    the sources copy it (before C's load and scanC)."""
    n = delta_t.shape[1]
    dA = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=dA, op=nl.exp, data=delta_t, scale=a_col)
    if u_src is not None:
        u_t = _load(u_src)
    b_sb = _load(b_row)
    if dU is None:
        dU = _delta_u(delta_t, u_t)
    b_t = _broadcast(b_sb, ones)
    dBu = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dBu, data1=dU, data2=b_t, op=nl.multiply, engine=nisa.engine.vector)
    h = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor_scan(dst=h, data0=dA, data1=dBu, initial=init, op0=nl.multiply, op1=nl.add)
    if carry is not None:
        nisa.tensor_copy(dst=carry, src=h[:, n - 1:n], engine=nisa.engine.vector)
    c_t = _broadcast(_load(c_row), ones)
    sc = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=sc, data1=h, data2=c_t, op=nl.multiply, engine=nisa.engine.vector)
    nisa.tensor_tensor(dst=acc, data1=acc, data2=sc, op=nl.add, engine=nisa.engine.vector)
    return h


def _zeroed(shape):
    """The accumulator as every source makes it: ``nl.zeros`` (a memset, on VectorE: the
    beta-1 code leaves the engine to the compiler), then ``acc += scanC`` at every state,
    the first included."""
    acc = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0, engine=nisa.engine.vector)
    return acc


@nki.jit
def mamba(delta, u, a, b, c, version):
    """delta, u: [channels, seq]; a: [channels, states]; b, c: [states, seq]; fp32."""
    channels, seq = delta.shape
    states = a.shape[1]
    if channels % P:
        raise ValueError(f"mamba: delta.shape[0] (channels)={channels} must be a multiple of {P} "
                         "(one partition tile per 128 channels, no remainder handling)")
    if version in ("v3", "accelopt") and seq % CHUNK:
        raise ValueError(f"mamba {version}: delta.shape[1] (seq)={seq} must be a multiple of {CHUNK} "
                         "(the version's sequence chunk, no remainder handling)")
    tiles = channels // P
    out = nl.ndarray((channels, seq), dtype=delta.dtype, buffer=nl.shared_hbm)
    ones = nl.ndarray((1, P), dtype=nl.float32, buffer=nl.sbuf)   # the broadcasts' stationary row
    nisa.memset(dst=ones, value=1.0)

    if version == "v1":
        accs = [_zeroed((P, seq)) for _ in range(tiles)]
        for s in range(states):
            for t in range(tiles):
                rows = slice(t * P, (t + 1) * P)
                # delta, A and u each from a line of its own: a tile's allocation site is its
                # line (the buffer rotation), and the source loads them into three variables
                delta_t = _load(delta[rows, :])
                a_col = _load(a[rows, s:s + 1])
                _state_step(accs[t], delta_t, None, a_col, b[s:s + 1, :], c[s:s + 1, :], 0.0, ones,
                            u_src=u[rows, :])
        for t in range(tiles):
            nisa.dma_copy(dst=out[t * P:(t + 1) * P, :], src=accs[t])
    elif version in ("v2", "v3", "autocomp_v2", "autocomp_v3"):
        for t in range(tiles):
            rows = slice(t * P, (t + 1) * P)
            autocomp = version.startswith("autocomp")
            # the accumulator's nl.zeros where each source has it: before the loads (the tutorial),
            # after delta * u and (autocomp_v3) A's load (Autocomp's kernels)
            acc = None if autocomp else _zeroed((P, seq))
            delta_t = _load(delta[rows, :])
            u_t = _load(u[rows, :])
            dU = _delta_u(delta_t, u_t) if autocomp else None
            a_block = _load(a[rows, :]) if version == "autocomp_v3" else None   # A once per tile
            if acc is None:
                acc = _zeroed((P, seq))
            for s in range(states):
                a_col = a_block[:, s:s + 1] if a_block is not None else _load(a[rows, s:s + 1])
                if version != "v3":     # v2, autocomp_v2/v3 (dU given): the whole sequence per step
                    _state_step(acc, delta_t, u_t, a_col, b[s:s + 1, :], c[s:s + 1, :], 0.0, ones, dU)
                    continue
                carry = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.memset(dst=carry, value=0.0)
                for k in range(seq // CHUNK):
                    cols = slice(k * CHUNK, (k + 1) * CHUNK)
                    _state_step(acc[:, cols], delta_t[:, cols], u_t[:, cols], a_col, b[s:s + 1, cols],
                                c[s:s + 1, cols], carry, ones, carry=carry)
            nisa.dma_copy(dst=out[rows, :], src=acc)
    elif version == "accelopt":
        carries = [nl.ndarray((P, states), dtype=nl.float32, buffer=nl.sbuf) for _ in range(tiles)]
        for carry in carries:
            nisa.memset(dst=carry, value=0.0)
        # the source's nl.sequential_range (the carried state): kept, for the beta-1 compiler's
        # meaning of it (docs/cost-model.md "Beta-1 sequential loops")
        for k in nl.sequential_range(seq // CHUNK):
            cols = slice(k * CHUNK, (k + 1) * CHUNK)
            accs = [_zeroed((P, CHUNK)) for _ in range(tiles)]
            for t in range(tiles):
                rows = slice(t * P, (t + 1) * P)
                delta_t = _load(delta[rows, cols])
                u_t = _load(u[rows, cols])
                for s in range(states):
                    _state_step(accs[t], delta_t, u_t, _load(a[rows, s:s + 1]), b[s:s + 1, cols],
                                c[s:s + 1, cols], carries[t][:, s:s + 1], ones, carry=carries[t][:, s:s + 1])
            for t in range(tiles):
                nisa.dma_copy(dst=out[t * P:(t + 1) * P, cols], src=accs[t])
    elif version in ("autocomp_v4", "autocomp_v5"):
        _autocomp_chunked(delta, u, a, b, c, out, ones, double_buffered=version == "autocomp_v5")
    else:
        raise ValueError(f"version={version!r}; expected v1, v2, v3, autocomp_v2, autocomp_v3, autocomp_v4, "
                         "autocomp_v5 or accelopt")
    return out


def _autocomp_chunked(delta, u, a, b, c, out, ones, double_buffered):
    """Autocomp's fifth (autocomp_v4, score 0.435 ms) and sixth (autocomp_v5, 0.43 ms)
    kernels. Per channel tile: delta and u loaded whole, deltaU = delta * u (VectorE), A as one
    [P, states] block, the carry ``nl.zeros((P, states))`` (VectorE memset); then per
    512-column chunk (the source's ``nl.sequential_range``; a shorter tail chunk after the
    loop, as the source's ``if tail > 0`` block): a PSUM accumulator ``nl.zeros(...,
    buffer=nl.psum)`` and per state exp (ScalarE), B and C rows broadcast on TensorE into PSUM,
    deltaBu, the scan from the state's carry column, the carry column's update (a [P, 1]
    copy, VectorE as in v3/accelopt), scanC, ``acc_psum += scanC`` (VectorE, its result in
    PSUM); the accumulator copied to SBUF by the source's ``nisa.tensor_copy(...,
    engine=nisa.vector_engine)`` and stored.

    The PSUM accumulator is zeroed by a VectorE memset: the rule that a PSUM ``nl.zeros``
    costs nothing (kernels/autocomp_gemm.py) rests on the first matmul overwriting it, and
    here VectorE adds into it (``tensor_tensor`` reads it), so its zeros must be written.

    autocomp_v4: B and C rows loaded per (chunk, state) as they are used, the state loop
    ``affine_range``. autocomp_v5: two [1, chunk] SBUF buffers each for B and C per chunk,
    state 0's rows loaded before the state loop and state s + 1's DMAed into the other buffer
    at state s before its compute (the source's double buffering), the state loop
    ``nl.sequential_range`` (kept: the beta-1 meaning, docs/cost-model.md)."""
    channels, seq = delta.shape
    states = a.shape[1]
    f_tile = min(seq, BANK_FP32)      # the source's min(seq_len, nl.tile_size.psum_fmax)
    n_full = seq // f_tile
    tail = seq - n_full * f_tile
    state_loop = nl.sequential_range if double_buffered else range
    for t in range(channels // P):
        rows = slice(t * P, (t + 1) * P)
        delta_t = _load(delta[rows, :])
        u_t = _load(u[rows, :])
        dU = _delta_u(delta_t, u_t)
        a_block = _load(a[rows, :])
        carry = _zeroed((P, states))

        def chunk(f0, f1):
            n = f1 - f0
            acc = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.psum)
            nisa.memset(dst=acc, value=0.0, engine=nisa.engine.vector)
            if double_buffered:
                # four lines, four allocation sites, as the source's B_buf0, B_buf1, C_buf0, C_buf1
                b_buf0 = nl.ndarray((1, n), dtype=b.dtype, buffer=nl.sbuf)
                b_buf1 = nl.ndarray((1, n), dtype=b.dtype, buffer=nl.sbuf)
                c_buf0 = nl.ndarray((1, n), dtype=c.dtype, buffer=nl.sbuf)
                c_buf1 = nl.ndarray((1, n), dtype=c.dtype, buffer=nl.sbuf)
                bufs = [(b_buf0, c_buf0), (b_buf1, c_buf1)]
                nisa.dma_copy(dst=bufs[0][0], src=b[0:1, f0:f1])
                nisa.dma_copy(dst=bufs[0][1], src=c[0:1, f0:f1])
            for s in state_loop(states):
                dA = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=dA, op=nl.exp, data=delta_t[:, f0:f1], scale=a_block[:, s:s + 1])
                if double_buffered:
                    b_row, c_row = bufs[s % 2]
                    if s + 1 < states:
                        nisa.dma_copy(dst=bufs[(s + 1) % 2][0], src=b[s + 1:s + 2, f0:f1])
                        nisa.dma_copy(dst=bufs[(s + 1) % 2][1], src=c[s + 1:s + 2, f0:f1])
                else:
                    # a line each: a tile's allocation site is its line, and the source's B_i
                    # and C_i are two tiles (one line made them one rotating buffer family)
                    b_row = _load(b[s:s + 1, f0:f1])
                    c_row = _load(c[s:s + 1, f0:f1])
                b_t = _broadcast(b_row, ones)
                c_t = _broadcast(c_row, ones)
                dBu = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=dBu, data1=dU[:, f0:f1], data2=b_t, op=nl.multiply,
                                   engine=nisa.engine.vector)
                h = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor_scan(dst=h, data0=dA, data1=dBu, initial=carry[:, s:s + 1], op0=nl.multiply,
                                        op1=nl.add)
                nisa.tensor_copy(dst=carry[:, s:s + 1], src=h[:, n - 1:n], engine=nisa.engine.vector)
                sc = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=sc, data1=h, data2=c_t, op=nl.multiply, engine=nisa.engine.vector)
                nisa.tensor_tensor(dst=acc, data1=acc, data2=sc, op=nl.add, engine=nisa.engine.vector)
            acc_sbuf = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=acc_sbuf, src=acc, engine=nisa.engine.vector)
            nisa.dma_copy(dst=out[rows, f0:f1], src=acc_sbuf)

        for k in nl.sequential_range(n_full):
            chunk(k * f_tile, (k + 1) * f_tile)
        if tail:
            chunk(n_full * f_tile, seq)

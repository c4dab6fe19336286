"""What the calibration kernels COMPUTE (benchmarks/calibration/kernels/).

tests/cost/test_calibration.py checks the modeled timing of every measurements.toml row; a
port whose instruction stream computes the wrong thing would prove nothing about that timing.
Here every kernel a row uses runs in the simulator at a small shape it supports (a few
tiles, odd tile counts where the kernel tiles), on fresh random inputs (conftest seeds per
test), and its output is compared with a float64 torch reference of the math its docstring
states. The micro-benchmarks that only time one instruction or transfer are checked on the
output they do define.

Adding a kernel: write a section below (a comment naming the kernel, its reference, one test
or a parametrized table, run through ``simulate``) and name its test in ``COVERED``.
"""

from __future__ import annotations

import collections

import pytest
import torch

from tests._helpers import TOLERANCES

U32 = 2.0 ** -24   # fp32 unit roundoff


def simulate(calibrate, kernel: str, target: str, **kwargs):
    """Run calibration kernel ``module:function`` as calibrate.run_row does (imported by
    calibrate._kernel with nki bound to the simulator; simulator.run on ``target``): the
    SimResult, whose outputs start as NaN poison (params.py), so an element the kernel never
    writes fails any comparison."""
    from nki_kernels import simulator

    return simulator.run(calibrate._kernel(kernel), target=target, **kwargs)


def _assert_matmul(out, lhsT, rhs, roundings, relative):
    """Every element of ``out`` within its bound of the float64 lhsT.T @ rhs: ``roundings``
    fp32 unit roundoffs of sum |lhsT||rhs| (the accumulation) plus ``relative`` of |ref| (the
    output's rounding). NaN poison fails."""
    ref = lhsT.double().T @ rhs.double()
    tol = roundings * U32 * (lhsT.double().abs().T @ rhs.double().abs()) + relative * ref.abs()
    bad = ~((out.double() - ref).abs() <= tol)
    assert not bool(bad.any()), f"{int(bad.sum())} elements off; max error {(out.double() - ref).abs().max():.3g}"


def row_key(row) -> str:
    """A row's kernel and the string and boolean arguments that choose its code path (mamba's
    version, activation's func, selective_scan's a_block): what one test here has to cover."""
    modes = "".join(f"[{k}={v}]" for k, v in sorted(row.args.items()) if isinstance(v, (str, bool)))
    return row.kernel + modes


# Every kernel (and code path) a measurements.toml row runs -> the test that checks its output.
COVERED = {
    "micro:dma_stream": "test_dma_stream_copies_each_block_into_its_own_column_slice",
    "micro:activation[func=exp]": "test_activation_applies_the_function",
    "micro:activation_chain": "test_activation_chain_is_a_dependent_identity_chain",
    "micro:tensor_tensor_add": "test_tensor_tensor_add_adds",
    "micro:matmul_then_copy": "test_matmul_then_copy_is_stationary_transposed_times_moving",
    "nkibench:silu": "test_silu_is_x_times_sigmoid_x",
    "nkibench:rope_baseline": "test_rope_rotates_as_nkibench_reference",
    "nkibench:rope_optimized": "test_rope_rotates_as_nkibench_reference",
    "mamba:mamba[version=v1]": "test_mamba_follows_the_selective_scan_recurrence",
    "mamba:mamba[version=v2]": "test_mamba_follows_the_selective_scan_recurrence",
    "mamba:mamba[version=v3]": "test_mamba_follows_the_selective_scan_recurrence",
    "mamba:mamba[version=autocomp_v2]": "test_mamba_follows_the_selective_scan_recurrence",
    "mamba:mamba[version=autocomp_v3]": "test_mamba_follows_the_selective_scan_recurrence",
    "mamba:mamba[version=autocomp_v4]": "test_mamba_follows_the_selective_scan_recurrence",
    "mamba:mamba[version=autocomp_v5]": "test_mamba_follows_the_selective_scan_recurrence",
    "mamba:mamba[version=accelopt]": "test_mamba_follows_the_selective_scan_recurrence",
    "nkibench:adamw": "test_adamw_port_computes_the_nkibench_reference",
    "nkibench:rmsnorm_matmul": "test_rmsnorm_matmul_matches_the_numpy_reference",
    "nkibench:add_rmsnorm_matmul": "test_add_rmsnorm_matmul_matches_the_numpy_reference",
    "nkibench:matmul_add_rmsnorm": "test_matmul_add_rmsnorm_matches_the_reference",
    "nkibench:transpose_matmul": "test_transpose_matmul_matches_the_reference",
    "nkibench:matmul": "test_matmul_matches_the_reference",
    "layernorm_tutorial:layernorm[version=v1]": "test_layernorm_tutorial_normalises_and_applies_gamma_beta",
    "layernorm_tutorial:layernorm[version=v2]": "test_layernorm_tutorial_normalises_and_applies_gamma_beta",
    **{f"autocomp_gemm:gemm[variant={v}]": "test_autocomp_gemm_variants_multiply"
       for v in ("s20_99", "s28_68", "s11_8", "s8_07", "s7_62", "s6_96")},
    **{f"autocomp_attention:{k}[copy_engine=scalar][version={v}]": "test_autocomp_attention_is_softmax_qk_times_v"
       for k, vs in (("three_pass", ("c3", "c4", "c5")), ("fused", ("c8", "c9", "c10"))) for v in vs},
    **{f"autocomp_sd_attention:sd_attention[copy_engine=scalar][version={v}]":
       "test_autocomp_sd_attention_is_softmax_scaled_qk_times_v"
       for v in ("tutorial", "c1", "c2", "c3", "c4", "c5", "best")},
    **{f"optimization_guide_matmul:matmul[version={v}]": "test_optimization_guide_matmuls_multiply"
       for v in ("v2", "v3", "v5")},
    **{f"nkilib_scan:selective_scan[a_block={v}]": "test_selective_scan_port_follows_the_recurrence"
       for v in (True, False)},
    **{f"matmul_tutorial:matmul[version={v}]": "test_matmul_tutorial_kernels_multiply"
       for v in ("hoist_load", "block_free", "fully_optimized")},
    "nki_autotune_matmul:matmul_lhs_rhs": "test_nki_autotune_matmuls_multiply",
    "nki_autotune_matmul:matmul_lhsT_rhs": "test_nki_autotune_matmuls_multiply",
    **{f"nki_autotune_matmul:{k}": "test_nki_autotune_matmuls_multiply"
       for k in ("matmul_lhsT_rhs_blocked", "matmul_lhsT_rhs_resident", "matmul_lhs_rhs_streamed",
                 "matmul_lhs_rhsT_resident", "matmul_lhsT_rhsT_resident")},
    "nki_autotune_matmul:double_matmul": "test_nki_autotune_double_matmul_is_qk_times_v",
}


def test_every_kernel_a_measurement_runs_has_an_output_test(calibrate):
    keys = {row_key(r) for r in calibrate.load_rows()}
    assert keys - set(COVERED) == set(), "rows whose kernel has no output test here"
    assert all(callable(globals().get(name)) for name in COVERED.values()), "COVERED names a missing test"


# ----------------------------------------------------------------------------- micro:dma_stream
# Output: column 0 of the first block (the transfers themselves are what the rows time).
# Beyond that value the kernel's claim is about which bytes move where, so the trace is
# checked too: copy i reads src's i-th [parts, cols] row block and writes the i-th column
# slice of ONE SBUF tile, and the output is read back from that tile. DMA moves bits: exact.

@pytest.mark.parametrize("rows, count, cols, dtype, target", [
    (3 * 128, 3, 5, torch.bfloat16, "trn2"),     # 3 full-partition blocks, odd width
    (128, 1, 128, torch.bfloat16, "trn2"),       # the single-transfer profile's shape
    (4, 1, 33, torch.bfloat16, "trn2"),          # 4 partitions (the [4, 4096] row), odd width
    (3 * 96, 3, 7, torch.float32, "trn1"),       # fp32 like the trn1 row, 96 partitions
])
def test_dma_stream_copies_each_block_into_its_own_column_slice(calibrate, rows, count, cols, dtype, target):
    src = torch.randn(rows, cols).to(dtype)
    res = simulate(calibrate, "micro:dma_stream", target, src=src, count=count, cols=cols)
    parts = rows // count
    assert torch.equal(res.outputs, src[:parts, 0:1])
    loads = [i for i in res.trace if i.op == "dma_copy" and i.reads[0].buffer == "hbm"]
    assert len(loads) == count
    tile = loads[0].writes[0].alloc_id
    for i, ld in enumerate(loads):
        (r,), (w,) = ld.reads, ld.writes
        assert (r.shape, r.offset, r.strides) == ((parts, cols), i * parts * cols, (cols, 1)), i
        assert (w.alloc_id, w.buffer, w.shape, w.offset, w.strides) == (tile, "sbuf", (parts, cols), i * cols,
                                                                       (count * cols, 1)), i
    (back,) = [i for i in res.trace if i.op == "dma_copy" and i.writes[0].buffer == "hbm"]
    assert back.reads[0].alloc_id == tile


# Each copy moves a whole [rows/count, cols] block: rows left over by the division, a width
# other than cols, or no copies at all are refused before any transfer.

@pytest.mark.parametrize("rows, width, count, cols, match", [
    (257, 8, 2, 8, r"src.shape\[0\]=257 must be a multiple of count=2"),     # one row left unread
    (3 * 128 + 64, 8, 3, 8, r"src.shape\[0\]=448 must be a multiple of count=3"),
    (256, 8, 2, 16, r"src.shape\[1\]=8 must equal cols=16"),
    (256, 8, 0, 8, r"count=0 must be at least 1"),
])
def test_dma_stream_rejects_rows_that_are_not_whole_blocks(calibrate, rows, width, count, cols, match):
    with pytest.raises(ValueError, match=match):
        simulate(calibrate, "micro:dma_stream", "trn2", src=torch.randn(rows, width).bfloat16(), count=count,
                 cols=cols)


# ----------------------------------------------------------------------------- micro:activation
# out = func(x). Tolerances: tests/_helpers.py TOLERANCES (bf16: one final rounding to 8
# significant bits plus the ScalarE function's error; fp32: a few ulp). copy is exact.

@pytest.mark.parametrize("shape, dtype, func", [
    ((128, 128), torch.bfloat16, "exp"),     # the rows' dtype, full partitions
    ((5, 333), torch.bfloat16, "exp"),       # few partitions (the [4, 4096] row), odd width
    ((7, 65), torch.float32, "exp"),
    ((7, 65), torch.bfloat16, "copy"),
])
def test_activation_applies_the_function(calibrate, shape, dtype, func):
    x = torch.randn(shape).to(dtype)
    out = simulate(calibrate, "micro:activation", "trn2", x=x, func=func).outputs
    assert out.dtype == dtype and out.shape == x.shape
    if func == "copy":
        assert torch.equal(out, x)
    else:
        atol, rtol = TOLERANCES[dtype]
        torch.testing.assert_close(out.double(), x.double().exp(), atol=atol, rtol=rtol)


# ----------------------------------------------------------------------------- micro:activation_chain
# Each ACTIVATE is copy(1.0 * t + 0.0): exact in fp32, so the output equals x bit for bit.
# The row times the chain's interval, so the trace must show each instruction reading the
# previous one's result (a chain that re-read x would compute the same value).

@pytest.mark.parametrize("parts, length", [(128, 5), (3, 1)])
def test_activation_chain_is_a_dependent_identity_chain(calibrate, parts, length):
    x = torch.randn(parts, 1)
    res = simulate(calibrate, "micro:activation_chain", "trn1", x=x, length=length)
    assert torch.equal(res.outputs, x)
    acts = [i for i in res.trace if i.op == "activation"]
    assert len(acts) == length
    for prev, nxt in zip(acts, acts[1:]):
        assert nxt.reads[0].role == "data" and nxt.reads[0].alloc_id == prev.writes[0].alloc_id


# ----------------------------------------------------------------------------- micro:tensor_tensor_add
# out = a + b: one fp32 rounding of the exact sum (TOLERANCES[float32] is a wide margin).

@pytest.mark.parametrize("shape", [(64, 8192 // 64), (3, 77)])
def test_tensor_tensor_add_adds(calibrate, shape):
    a, b = torch.randn(shape), torch.randn(shape)
    out = simulate(calibrate, "micro:tensor_tensor_add", "trn1", a=a, b=b).outputs
    atol, rtol = TOLERANCES[torch.float32]
    torch.testing.assert_close(out.double(), a.double() + b.double(), atol=atol, rtol=rtol)


# ----------------------------------------------------------------------------- micro:matmul_then_copy
# out[M, N] = stationary[K, M]^T @ moving[K, N] in fp32 (PSUM), copied out unchanged. bf16
# products are exact in fp32; only the fp32 accumulation rounds: the recursive-summation
# bound |err| <= K * 2^-24 * (|S|^T |M|) elementwise, in any order of accumulation.

@pytest.mark.parametrize("k, m, n", [(128, 128, 128), (97, 83, 111)])
def test_matmul_then_copy_is_stationary_transposed_times_moving(calibrate, k, m, n):
    st, mv = torch.randn(k, m).bfloat16(), torch.randn(k, n).bfloat16()
    out = simulate(calibrate, "micro:matmul_then_copy", "trn1", stationary=st, moving=mv).outputs
    assert out.dtype == torch.float32 and out.shape == (m, n)
    s, v = st.double(), mv.double()
    bound = k * 2.0 ** -24 * (s.abs().T @ v.abs())
    err = (out.double() - s.T @ v).abs()
    assert bool((err <= bound).all()), f"max error {float(err.max()):.3g} over the fp32 accumulation bound"


# ----------------------------------------------------------------------------- nkibench:silu
# NKIBench silu_M4096_N7168 (AccelOpt NKIBench/reference/silu_M4096_N7168_numpy_0.py):
# x / (1 + exp(-x)) = x * sigmoid(x). fp32 through ScalarE exp and reciprocal and two VectorE
# ops: a few ulp -> TOLERANCES[float32]. Inputs of scale 4 reach sigmoid's flat tails.
# The kernel works in [parts, 1024] blocks: shapes with 3 row blocks and with 3 column blocks.

@pytest.mark.parametrize("shape", [(128, 3, 1024), (96, 1, 3 * 1024)])
def test_silu_is_x_times_sigmoid_x(calibrate, shape):
    x = torch.randn(shape) * 4
    out = simulate(calibrate, "nkibench:silu", "trn1", x=x).outputs
    xd = x.double()
    atol, rtol = TOLERANCES[torch.float32]
    torch.testing.assert_close(out.double(), xd * torch.sigmoid(xd), atol=atol, rtol=rtol)


# Columns that are not whole 1024-column blocks (a partial last block, or less than one)
# were left unwritten: refused.

@pytest.mark.parametrize("cols", [1024 + 476, 512])
def test_silu_rejects_columns_that_are_not_whole_blocks(calibrate, cols):
    with pytest.raises(ValueError, match=rf"silu: x.shape\[2\]={cols} must be a multiple of 1024"):
        simulate(calibrate, "nkibench:silu", "trn1", x=torch.randn(128, 2, cols))


# ----------------------------------------------------------------------------- nkibench:rope_baseline, rope_optimized
# NKIBench rope_single_freq_apply (AccelOpt NKIBench/reference/
# rope_single_freq_apply_B1_H64_N4096_D128_numpy_1.py): x's first half x0 (partitions 0-63)
# and second half x1 rotate as [x0 cos - x1 sin; x0 sin + x1 cos]. Two fp32 products and one
# add per element: TOLERANCES[float32]. Three column tiles of each kernel (512 and 2048).

def rope_reference(x, cos, sin):
    x, cos, sin = x.double(), cos.double(), sin.double()
    x0, x1 = x[: x.shape[0] // 2], x[x.shape[0] // 2:]
    return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos])


@pytest.mark.parametrize("kernel, tile", [("nkibench:rope_baseline", 512), ("nkibench:rope_optimized", 2048)])
def test_rope_rotates_as_nkibench_reference(calibrate, kernel, tile):
    seq = 3 * tile
    x, cos, sin = torch.randn(128, seq), torch.randn(64, seq), torch.randn(64, seq)
    out = simulate(calibrate, kernel, "trn1", x_in=x, cos=cos, sin=sin).outputs
    atol, rtol = TOLERANCES[torch.float32]
    torch.testing.assert_close(out.double(), rope_reference(x, cos, sin), atol=atol, rtol=rtol)
    # the inputs tell the rotation from its inverse (the convention the reference fixes)
    assert not torch.allclose(out.double(), rope_reference(x, cos, -sin), atol=atol, rtol=rtol)


# A sequence that is not whole column tiles is refused (it ran a tile past the end).

@pytest.mark.parametrize("kernel, seq, tile", [
    ("nkibench:rope_baseline", 2 * 512 + 188, 512),
    ("nkibench:rope_baseline", 256, 512),               # less than one tile
    ("nkibench:rope_optimized", 2048 + 452, 2048),
    ("nkibench:rope_optimized", 3 * 512, 2048),         # whole tiles for the baseline, not here
])
def test_rope_rejects_a_sequence_that_is_not_whole_tiles(calibrate, kernel, seq, tile):
    name = kernel.partition(":")[2]
    x, cos, sin = torch.randn(128, seq), torch.randn(64, seq), torch.randn(64, seq)
    with pytest.raises(ValueError, match=rf"{name}: x_in.shape\[1\]={seq} must be a multiple of {tile}"):
        simulate(calibrate, kernel, "trn1", x_in=x, cos=cos, sin=sin)


# ----------------------------------------------------------------------------- mamba:mamba (v1, v2, v3, autocomp_v2-v5, accelopt)
# The module docstring's selective scan (= AccelOpt NKIBench/reference/mamba_M7168_C256_S16):
#   h_s[c, t] = exp(delta[c, t] A[c, s]) h_s[c, t-1] + delta[c, t] u[c, t] B[s, t], h_s[c, -1] = 0
#   out[c, t] = sum_s C[s, t] h_s[c, t]
# Inputs as in Mamba: step sizes delta > 0, A < 0, so exp(delta A) in [0.82, 0.995]: h
# remembers up to ~200 steps, and v3/accelopt's carry across 512-column chunks matters (the
# test checks that a scan restarted per chunk would fail). fp32 tolerance: each scan step
# rounds twice, and an error decays with h, so h's relative error stays within ~200 * 2 *
# 2^-24 = 2.4e-5; out sums states whose terms can cancel, so atol is taken relative to the
# output's scale: atol = rtol = 1e-4 * max |out|.
# Shapes: 3 channel tiles, 3 states; v3/accelopt at 3 chunks, v1/v2 (no chunking) at 200.

MAMBA_CHUNK = 512


def mamba_reference(delta, u, a, b, c, restart_every: int | None = None):
    """float64 selective scan; ``restart_every``: zero h every that many steps (a wrong
    variant, to show the inputs tell a carried scan from a restarted one)."""
    delta, u, a, b, c = (t.double() for t in (delta, u, a, b, c))
    decay = torch.exp(delta[:, None, :] * a[:, :, None])          # [C, S, T]
    drive = delta[:, None, :] * u[:, None, :] * b[None, :, :]     # [C, S, T]
    h = torch.zeros(decay.shape[:2], dtype=torch.float64)
    out = torch.empty_like(delta)
    for t in range(delta.shape[1]):
        if restart_every and t % restart_every == 0:
            h = torch.zeros_like(h)
        h = decay[:, :, t] * h + drive[:, :, t]
        out[:, t] = (h * c[None, :, t]).sum(1)
    return out


@pytest.mark.parametrize("version, seq", [("v1", 200), ("v2", 200), ("autocomp_v2", 200), ("autocomp_v3", 200),
                                          ("v3", 3 * MAMBA_CHUNK), ("accelopt", 3 * MAMBA_CHUNK),
                                          ("autocomp_v4", 3 * MAMBA_CHUNK), ("autocomp_v5", 3 * MAMBA_CHUNK),
                                          ("autocomp_v4", 2 * MAMBA_CHUNK + 188), ("autocomp_v5", 2 * MAMBA_CHUNK + 188),
                                          ("autocomp_v4", 200)])
def test_mamba_follows_the_selective_scan_recurrence(calibrate, version, seq):
    channels, states = 3 * 128, 3
    delta = torch.rand(channels, seq) * 0.09 + 0.01
    u = torch.randn(channels, seq)
    a = -(torch.rand(channels, states) * 1.5 + 0.5)
    b, c = torch.randn(states, seq), torch.randn(states, seq)
    out = simulate(calibrate, "mamba:mamba", "trn1", delta=delta, u=u, a=a, b=b, c=c, version=version).outputs
    want = mamba_reference(delta, u, a, b, c)
    tol = 1e-4 * float(want.abs().max())
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=1e-4)
    # a scan that dropped its state (across chunks; v1/v2: at every step) would fail
    wrong = mamba_reference(delta, u, a, b, c, restart_every=MAMBA_CHUNK if seq > MAMBA_CHUNK else 1)
    assert float((out.double() - wrong).abs().max()) > 100 * tol


@pytest.mark.parametrize("version, seq", [("v1", 200), ("v2", 700), ("autocomp_v2", 700), ("autocomp_v3", 700),
                                          ("v3", 2 * MAMBA_CHUNK)])
def test_mamba_broadcasts_b_and_c_on_tensore_into_psum_where_vectore_reads_them(calibrate, version, seq):
    """The port's porting rule (kernels/mamba.py docstring): the beta-1 ``broadcast_to`` of a
    [1, n] row onto 128 partitions is a TensorE instruction (fused_mamba.rst), so B[s] and
    C[s] are ones^T @ row matmuls into PSUM, one per 512-column bank, and the two
    tensor_tensors that use them read one input in PSUM (priced N, not 2N). A port that
    went back to a stride-0 DMA into SBUF fails here."""
    channels, states = 2 * 128, 2
    delta, u = torch.rand(channels, seq) * 0.09 + 0.01, torch.randn(channels, seq)
    a = -(torch.rand(channels, states) + 0.5)
    b, c = torch.randn(states, seq), torch.randn(states, seq)
    trace = simulate(calibrate, "mamba:mamba", "trn1", delta=delta, u=u, a=a, b=b, c=c, version=version).trace
    steps = (channels // 128) * states * (seq // MAMBA_CHUNK if version == "v3" else 1)
    banks = 1 if version == "v3" else -(-seq // MAMBA_CHUNK)
    matmuls = [i for i in trace if i.op == "nc_matmul"]
    assert len(matmuls) == 2 * steps * banks
    assert all(o.buffer == "psum" for i in matmuls for o in i.writes)
    psum_reads = [i for i in trace if i.op == "tensor_tensor" and sorted(o.buffer for o in i.reads) == ["psum", "sbuf"]]
    assert len(psum_reads) == 2 * steps        # deltaU * B[s] and h * C[s]
    # each row is loaded onto one partition: no stride-0 DMA fills 128 partitions with it
    row_loads = [i for i in trace if i.engine == "dma" and any(o.buffer == "sbuf" and o.partitions == 1
                                                               for o in i.writes)]
    assert len(row_loads) == 2 * steps
    assert all(o.strides[0] != 0 for i in trace if i.engine == "dma" for o in i.reads if o.buffer == "hbm"
               and o.strides)


@pytest.mark.parametrize("version, seq", [("v1", 200), ("v2", 700), ("autocomp_v2", 700), ("autocomp_v3", 700),
                                          ("v3", 2 * MAMBA_CHUNK), ("accelopt", 2 * MAMBA_CHUNK)])
def test_mamba_zeroes_the_accumulator_and_adds_every_state_as_the_sources_do(calibrate, version, seq):
    """Every source (the tutorial's v1-v3, Autocomp's, AccelOpt's) makes the accumulator with
    ``nl.zeros`` and adds scanC into it at every state, the first included. Until 2026-12-02
    the port wrote the first state's scanC straight into it: one add and one memset per
    accumulator fewer than the measured kernels ran. A port that skips them again fails."""
    channels, states = 2 * 128, 3
    delta, u = torch.rand(channels, seq) * 0.09 + 0.01, torch.randn(channels, seq)
    a = -(torch.rand(channels, states) + 0.5)
    b, c = torch.randn(states, seq), torch.randn(states, seq)
    trace = simulate(calibrate, "mamba:mamba", "trn1", delta=delta, u=u, a=a, b=b, c=c, version=version).trace
    tiles = channels // 128
    chunks = seq // MAMBA_CHUNK if version in ("v3", "accelopt") else 1
    adds = [i for i in trace if i.op == "tensor_tensor" and i.attrs.get("op") == "add"]
    assert len(adds) == tiles * states * chunks
    # one accumulator per tile (per sequence chunk for accelopt), zeroed over its whole extent
    accumulators = tiles * (chunks if version == "accelopt" else 1)
    zeroed = [i for i in trace if i.op == "memset" and i.attrs.get("value") == 0.0 and i.writes[0].partitions == 128
              and i.writes[0].free_elems == (MAMBA_CHUNK if version == "accelopt" else seq)]
    assert len(zeroed) == accumulators


@pytest.mark.parametrize("version", ["autocomp_v2", "autocomp_v3"])
def test_mamba_autocomp_v3_loads_a_once_per_channel_tile(calibrate, version):
    """Autocomp's fourth kernel differs from its third only in loading A as one [128, states]
    block per channel tile (the third: a [128, 1] column per state)."""
    channels, seq, states = 2 * 128, 200, 3
    delta, u = torch.rand(channels, seq) * 0.09 + 0.01, torch.randn(channels, seq)
    a = -(torch.rand(channels, states) + 0.5)
    b, c = torch.randn(states, seq), torch.randn(states, seq)
    trace = simulate(calibrate, "mamba:mamba", "trn1", delta=delta, u=u, a=a, b=b, c=c, version=version).trace
    a_loads = [i for i in trace if i.engine == "dma" and i.writes[0].buffer == "sbuf"
               and i.writes[0].partitions == 128 and i.writes[0].free_elems in (1, states)]
    tiles = channels // 128
    assert len(a_loads) == (tiles if version == "autocomp_v3" else tiles * states)


@pytest.mark.parametrize("version", ["autocomp_v4", "autocomp_v5"])
def test_mamba_autocomp_chunked_accumulates_in_psum_and_carries_the_scan(calibrate, version):
    """Autocomp's fifth and sixth kernels (kernels/mamba.py ``_autocomp_chunked``): per
    channel tile, 512-column chunks (a 188-column tail here) in a sequential loop; per chunk a
    PSUM accumulator zeroed by a VectorE memset, every state's scanC added into it in PSUM on
    VectorE, then copied to SBUF on VectorE (the source's engine=) and stored; B and C rows
    broadcast on TensorE; the scan's carry one [128, states] tile per channel tile. autocomp_v5
    also runs its state loop as the source's nl.sequential_range."""
    channels, states = 2 * 128, 3
    seq = 2 * MAMBA_CHUNK + 188
    delta, u = torch.rand(channels, seq) * 0.09 + 0.01, torch.randn(channels, seq)
    a = -(torch.rand(channels, states) + 0.5)
    b, c = torch.randn(states, seq), torch.randn(states, seq)
    trace = simulate(calibrate, "mamba:mamba", "trn1", delta=delta, u=u, a=a, b=b, c=c, version=version).trace
    tiles, chunks = channels // 128, 3
    adds = [i for i in trace if i.op == "tensor_tensor" and i.attrs.get("op") == "add"]
    assert len(adds) == tiles * states * chunks and all(i.writes[0].buffer == "psum" for i in adds)
    psum_zeroed = [i for i in trace if i.op == "memset" and i.writes[0].buffer == "psum"]
    assert len(psum_zeroed) == tiles * chunks and all(i.engine == "vector" for i in psum_zeroed)
    carries = [i for i in trace if i.op == "memset" and i.writes[0].buffer == "sbuf" and i.writes[0].partitions == 128
               and i.writes[0].free_elems == states]
    assert len(carries) == tiles
    out_copies = [i for i in trace if i.op == "tensor_copy" and i.reads[0].buffer == "psum"]
    assert len(out_copies) == tiles * chunks and all(i.engine == "vector" for i in out_copies)
    assert sorted({i.writes[0].free_elems for i in out_copies}) == [188, MAMBA_CHUNK]
    matmuls = [i for i in trace if i.op == "nc_matmul"]
    assert len(matmuls) == 2 * tiles * states * chunks
    row_loads = [i for i in trace if i.engine == "dma" and i.writes[0].buffer == "sbuf" and i.writes[0].partitions == 1]
    assert len(row_loads) == 2 * tiles * states * chunks
    # the scans: marked sequential in the chunk loop (full chunks) and, for v5, the state loop
    scans = [i for i in trace if i.op == "tensor_tensor_scan"]
    depth = [len(i.attrs.get("sequential") or ()) for i in scans]
    full, tail = tiles * states * 2, tiles * states
    if version == "autocomp_v4":
        assert sorted(depth) == [0] * tail + [1] * full
    else:
        assert sorted(depth) == [1] * tail + [2] * full

# Channels that are not whole 128-partition tiles (every version) and, for the chunked
# versions, a sequence that is not whole 512-column chunks were silently dropped: refused.
# (v1, v2 and autocomp_v2-v5 take any sequence length: v4 and v5 run a shorter tail chunk.)

@pytest.mark.parametrize("version, channels, seq, match", [
    ("v1", 200, 64, r"mamba: delta.shape\[0\] \(channels\)=200 must be a multiple of 128"),
    ("v2", 64, 64, r"mamba: delta.shape\[0\] \(channels\)=64 must be a multiple of 128"),
    ("v3", 3 * 128 + 1, 512, r"mamba: delta.shape\[0\] \(channels\)=385 must be a multiple of 128"),
    ("accelopt", 130, 512, r"mamba: delta.shape\[0\] \(channels\)=130 must be a multiple of 128"),
    ("autocomp_v3", 130, 512, r"mamba: delta.shape\[0\] \(channels\)=130 must be a multiple of 128"),
    ("autocomp_v5", 64, 512, r"mamba: delta.shape\[0\] \(channels\)=64 must be a multiple of 128"),
    ("v3", 128, 512 + 188, r"mamba v3: delta.shape\[1\] \(seq\)=700 must be a multiple of 512"),
    ("accelopt", 128, 200, r"mamba accelopt: delta.shape\[1\] \(seq\)=200 must be a multiple of 512"),
])
def test_mamba_rejects_shapes_that_are_not_whole_tiles(calibrate, version, channels, seq, match):
    states = 2
    with pytest.raises(ValueError, match=match):
        simulate(calibrate, "mamba:mamba", "trn1", delta=torch.rand(channels, seq), u=torch.randn(channels, seq),
                 a=-torch.rand(channels, states), b=torch.randn(states, seq), c=torch.randn(states, seq),
                 version=version)


def test_mamba_rejects_an_unknown_version(calibrate):
    x = torch.randn(128, 4)
    with pytest.raises(ValueError, match="version='v4'"):
        simulate(calibrate, "mamba:mamba", "trn1", delta=x, u=x, a=torch.randn(128, 2), b=torch.randn(2, 4),
                 c=torch.randn(2, 4), version="v4")


# ---------------------------------------------------------------------------------------
# nkibench.adamw (NKIBench adamw_M10944_N2048; reference NKIBench/reference/
# adamw_M10944_N2048_numpy_1.py: theta, g, m ~ N(0, 1), v = |N(0, 1)|)

def _adamw_reference(theta, g, m, v):
    """The numpy reference's step in float64; also the update term, whose size bounds the
    rounding error of the fp32 result."""
    theta, g, m, v = (t.double() for t in (theta, g, m, v))
    decayed = theta - 1e-5 * theta
    m_t = 0.9 * m + 0.1 * g
    v_t = 0.999 * v + 0.001 * g * g
    update = 0.01 * m_t / (torch.sqrt(v_t * 1000) + 1e-8)
    return decayed - update, update


def _adamw_inputs(rows, cols, seed):
    gen = torch.Generator().manual_seed(seed)
    theta, g, m, v = (torch.randn(rows, cols, generator=gen) for _ in range(4))
    return {"theta": theta, "g": g, "m": m, "v": v.abs()}


@pytest.mark.parametrize("rows, cols", [(320, 3072), (384, 1024)])
def test_adamw_port_computes_the_nkibench_reference(calibrate, rows, cols):
    # 320 rows: two full row tiles and a 64-row one (the beta-1 kernel's row mask, as at
    # M = 10944); 3072 columns: three 1024-column blocks. 384 x 1024: tile-exact.
    args = _adamw_inputs(rows, cols, seed=rows + cols)
    out = simulate(calibrate, "nkibench:adamw", "trn1", **args).outputs
    ref, update = _adamw_reference(**args)
    assert out.shape == (rows, cols) and out.dtype == torch.float32
    assert torch.isfinite(out).all()   # the output is NaN-poisoned: every element was stored
    # fp32 chain: ~10 roundings (each <= 2^-24 relative) on the decayed theta and on the
    # update, whose sqrt and reciprocal can make it larger than theta where v and g are
    # small; 1e-6 of |decayed| + |update| is ~16 roundings' worth.
    bound = 1e-6 * (ref.abs() + 2 * update.abs()) + 1e-12
    err = (out.double() - ref).abs()
    assert (err <= bound).all(), f"max error {err.max():.3g}, worst ratio {(err / bound).max():.3g}"


def test_adamw_port_rejects_columns_that_are_not_whole_blocks(calibrate):
    args = _adamw_inputs(128, 1536, seed=1)
    with pytest.raises(ValueError, match=r"theta.shape\[1\]=1536 must be a multiple of 1024"):
        simulate(calibrate, "nkibench:adamw", "trn1", **args)


# ---------------------------------------------------------------------------------------
# shared by the NKIBench matmul ports

def _fp32_matmul_bound(y: torch.Tensor, w: torch.Tensor, k: int) -> torch.Tensor:
    """Elementwise error bound of an fp32 y @ w with y itself computed in fp32 from a
    K-term sum of squares: gamma_K (K roundings of the dot product's accumulation) plus the
    normalisation's relative error (the sum of squares' K roundings, halved by the rsqrt,
    and a few roundings of rsqrt and the multiplies), both times |y| @ |w|. u = 2^-24."""
    return (2 * k + 16) * U32 * (y.abs() @ w.abs())


# ---------------------------------------------------------------------------- rmsnorm_matmul
# NKIBench rmsnorm_matmul_M4096_N2048_K1024 (reference rmsnorm_matmul_..._numpy_1.py):
# x / sqrt(sum(x^2 / K, axis=1)) @ w, on x [T, 128, K] and w [K/128, 128, N].

def _rmsnorm_matmul_ref(x, w):
    xd = x.double().reshape(-1, x.shape[2])
    y = xd / torch.sqrt((xd.square() / x.shape[2]).sum(dim=1, keepdim=True))
    wd = w.double().reshape(-1, w.shape[2])
    return y, wd, (y @ wd).reshape(x.shape[0], x.shape[1], w.shape[2])


def test_rmsnorm_matmul_matches_the_numpy_reference(calibrate):
    # 6 row tiles in 2 blocks of 3, K = 3 x 512 (12 K tiles), N = one 1024-column part
    x = torch.randn(6, 128, 1536)
    w = torch.randn(12, 128, 1024)
    out = simulate(calibrate, "nkibench:rmsnorm_matmul", "trn1", x=x, w=w,
                        rows_per_block=3).outputs
    y, wd, ref = _rmsnorm_matmul_ref(x, w)
    bound = _fp32_matmul_bound(y, wd, 1536).reshape(ref.shape)
    err = (torch.as_tensor(out).double() - ref).abs()
    assert out.shape == (6, 128, 1024) and bool((err <= bound).all()), float((err / bound).max())


@pytest.mark.parametrize("x_shape, w_shape, block, match", [
    ((3, 64, 512), (4, 64, 1024), 3, r"x.shape\[1\]=64"),
    ((3, 128, 640), (5, 128, 1024), 3, r"x.shape\[2\]=640 must be a multiple of 512"),
    ((3, 128, 512), (8, 128, 1024), 3, r"equal w.shape\[0\] x 128 = 1024"),
    ((3, 128, 512), (4, 128, 512), 3, r"w.shape\[2\]=512 must be a multiple of 1024"),
    ((3, 128, 512), (4, 128, 1024), 2, r"x.shape\[0\]=3 must be a multiple of rows_per_block=2"),
])
def test_rmsnorm_matmul_rejects_shapes_it_does_not_tile(calibrate, x_shape, w_shape, block, match):
    with pytest.raises(ValueError, match=match):
        simulate(calibrate, "nkibench:rmsnorm_matmul", "trn1", x=torch.randn(x_shape),
                      w=torch.randn(w_shape), rows_per_block=block)


# ------------------------------------------------------------------------ add_rmsnorm_matmul
# NKIBench add_rmsnorm_matmul_M4096_N2048_K1024 (reference add_rmsnorm_matmul_..._numpy_1.py):
# y = x + z; y / sqrt(sum(y^2 / K) + eps) * g @ w.

def _add_rmsnorm_matmul_ref(x, w, eps, z, g):
    y = x.double() + z.double()
    t = (y.square() / y.shape[-1]).sum(dim=-1, keepdim=True) + eps
    y = y / torch.sqrt(t) * g.double()
    return y, w.double(), y @ w.double()


def test_add_rmsnorm_matmul_matches_the_numpy_reference(calibrate):
    # M, K = 3 tiles of 128 (K < 512: g's broadcast takes one partial 512-column piece),
    # N = 3 x 512; eps = 0.5 is large against mean(y^2) ~ 2, so a lost eps shows (~12 %)
    m, k, n, eps = 384, 384, 1536, 0.5
    x, z, w, g = torch.randn(m, k), torch.randn(m, k), torch.randn(k, n), torch.randn(k)
    out = simulate(calibrate, "nkibench:add_rmsnorm_matmul", "trn1", x_tensor=x,
                        w_tensor=w, eps=eps, z_tensor=z, g_tensor=g).outputs
    y, wd, ref = _add_rmsnorm_matmul_ref(x, w, eps, z, g)
    err = (torch.as_tensor(out).double() - ref).abs()
    bound = _fp32_matmul_bound(y, wd, k)
    assert out.shape == (m, n) and bool((err <= bound).all()), float((err / bound).max())


@pytest.mark.parametrize("shapes, match", [
    (((256, 128), (128, 512), (256, 256), (128,)), r"z_tensor.shape=\(256, 256\) must equal"),
    (((256, 128), (256, 512), (256, 128), (128,)), r"w_tensor.shape\[0\]=256"),
    (((256, 128), (128, 512), (256, 128), (64,)), r"g_tensor.shape=\(64,\)"),
    (((200, 128), (128, 512), (200, 128), (128,)), r"M and K must be multiples of 128"),
    (((256, 128), (128, 640), (256, 128), (128,)), r"w_tensor.shape\[1\]=640 must be a multiple of 512"),
])
def test_add_rmsnorm_matmul_rejects_shapes_it_does_not_tile(calibrate, shapes, match):
    x, w, z, g = (torch.randn(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        simulate(calibrate, "nkibench:add_rmsnorm_matmul", "trn1", x_tensor=x,
                      w_tensor=w, eps=1e-5, z_tensor=z, g_tensor=g)


def _output(result):
    return result.outputs[0] if isinstance(result.outputs, (list, tuple)) else result.outputs


# --------------------------------------------------------------------- matmul_add_rmsnorm

def _matmul_add_rmsnorm_reference(x, w, eps, z, g):
    """NKIBench's numpy forward in float64: y = x @ w + z; y * g / sqrt(mean(y ** 2) + eps)."""
    y = x.double() @ w.double() + z.double()
    rms = torch.sqrt((y * y).mean(-1, keepdim=True) + eps)
    return y * g.double() / rms, y, rms


def test_matmul_add_rmsnorm_matches_the_reference(calibrate):
    # 3 row blocks, 3 K tiles, 3 N chunks of 512 (odd counts of every tile).
    M, K, N = 3 * 128, 3 * 128, 3 * 512
    gen = torch.Generator().manual_seed(11)
    # x scaled so that mean(y ** 2) ~ 2 and eps = 0.25 visibly shifts the rms
    x = torch.randn(M, K, generator=gen) / K ** 0.5
    w = torch.randn(K, N, generator=gen)
    z = torch.randn(M, N, generator=gen)
    g = torch.randn(N, generator=gen)
    eps = 0.25
    out = _output(simulate(calibrate, "nkibench:matmul_add_rmsnorm", "trn1", x_tensor=x, w_tensor=w, eps=eps,
                                z_tensor=z, g_tensor=g)).double()
    ref, y, rms = _matmul_add_rmsnorm_reference(x, w, eps, z, g)
    # Forward error bound of fp32: y's K products summed plus z, (K + 2) u (|x| @ |w| + |z|)
    # per element; the rms's relative error is at most mean(|y| E) / mean(y^2) (squares),
    # N u (the row sum) and a few ulp for the divide, add and rsqrt; out = y g / rms.
    err_y = (K + 2) * U32 * (x.double().abs() @ w.double().abs() + z.double().abs())
    rel_rms = (y.abs() * err_y).mean(-1, keepdim=True) / (y * y).mean(-1, keepdim=True) + (N + 8) * U32
    tol = g.double().abs() / rms * err_y + ref.abs() * (rel_rms + 4 * U32)
    assert out.shape == (M, N)
    bad = ~((out - ref).abs() <= tol)   # NaN (an element never written) counts as off
    assert not bool(bad.any()), f"{int(bad.sum())} elements off; max error {(out - ref).abs().max():.3g}"


def test_matmul_add_rmsnorm_rejects_shapes_off_its_tiles(calibrate):
    gen = torch.Generator().manual_seed(12)
    x, w = torch.randn(128, 128, generator=gen), torch.randn(128, 640, generator=gen)
    z, g = torch.randn(128, 640, generator=gen), torch.randn(640, generator=gen)
    with pytest.raises(ValueError, match=r"w_tensor.shape\[1\] \(N\)=640 must be a multiple of 512"):
        simulate(calibrate, "nkibench:matmul_add_rmsnorm", "trn1", x_tensor=x, w_tensor=w, eps=1e-5, z_tensor=z,
                      g_tensor=g)


# ------------------------------------------------------------------------ transpose_matmul

def test_transpose_matmul_matches_the_reference(calibrate):
    # NKIBench's layouts: lhs [K, M] as [128, K/128, M], rhs [K, N] as [128, K/128, N]. M = 9
    # tiles (a full 1024-column block and a 128-column one), 3 K tiles, N = 1224: a full
    # 1024-column block and a partial one of 200 (beta-1's masked tail, here < 512).
    M, KT, N = 9 * 128, 3, 1224
    K = 128 * KT
    gen = torch.Generator().manual_seed(13)
    lhs = torch.randn(K, M, generator=gen)
    rhs = torch.randn(K, N, generator=gen)
    out = _output(simulate(calibrate, "nkibench:transpose_matmul", "trn1", lhs=lhs.reshape(128, KT, M),
                                rhs=rhs.reshape(128, KT, N)))
    assert out.shape == (M // 128, 128, N)
    out = out.reshape(M, N).double()
    ref = lhs.double().T @ rhs.double()
    # fp32 dot products of K terms: |error| <= K u sum_k |lhs_km| |rhs_kn|
    tol = K * U32 * (lhs.double().abs().T @ rhs.double().abs())
    bad = ~((out - ref).abs() <= tol)   # NaN (an element never written) counts as off
    assert not bool(bad.any()), f"{int(bad.sum())} elements off; max error {(out - ref).abs().max():.3g}"


def test_transpose_matmul_rejects_m_off_the_partition_tile(calibrate):
    gen = torch.Generator().manual_seed(14)
    with pytest.raises(ValueError, match=r"lhs.shape\[2\] \(M\)=200 must be a multiple of 128"):
        simulate(calibrate, "nkibench:transpose_matmul", "trn1", lhs=torch.randn(128, 1, 200, generator=gen),
                      rhs=torch.randn(128, 1, 256, generator=gen))


# ---------------------------------------------------------------------------------- matmul

def test_matmul_matches_the_reference(calibrate):
    # NKIBench's layouts: lhs [M, K] as [M/128, 128, K/128, 128], rhs [K, N] as [K/128, 128,
    # N]. 3 row tiles, 16 K tiles (two [128, 8, 128] loads each), N = 2048: two column blocks.
    MT, KT, N = 3, 16, 2048
    M, K = 128 * MT, 128 * KT
    gen = torch.Generator().manual_seed(15)
    lhs = torch.randn(M, K, generator=gen)
    rhs = torch.randn(K, N, generator=gen)
    out = _output(simulate(calibrate, "nkibench:matmul", "trn1", lhs=lhs.reshape(MT, 128, KT, 128),
                           rhs=rhs.reshape(KT, 128, N)))
    assert out.shape == (MT, 128, N)
    out = out.reshape(M, N).double()
    ref = lhs.double() @ rhs.double()
    # the transposes move fp32 exactly; fp32 dot products of K terms:
    # |error| <= K u sum_k |lhs_mk| |rhs_kn|
    tol = K * U32 * (lhs.double().abs() @ rhs.double().abs())
    bad = ~((out - ref).abs() <= tol)   # NaN (an element never written) counts as off
    assert not bool(bad.any()), f"{int(bad.sum())} elements off; max error {(out - ref).abs().max():.3g}"


@pytest.mark.parametrize("lhs_shape, rhs_shape, message", [
    ((1, 128, 8, 128), (8, 128, 1000), r"rhs.shape\[2\] \(N\)=1000 must be a multiple of 1024"),
    ((1, 128, 4, 128), (4, 128, 1024), r"lhs.shape\[2\]=4 \(K tiles\) must equal rhs.shape\[0\]=4 and be a multiple of 8"),
    ((1, 128, 8, 128), (16, 128, 1024), r"lhs.shape\[2\]=8 \(K tiles\) must equal rhs.shape\[0\]=16"),
    ((1, 64, 8, 128), (8, 128, 1024), r"lhs.shape\[1\]=64, lhs.shape\[3\]=128 and rhs.shape\[1\]=128 must be 128"),
])
def test_matmul_rejects_shapes_off_its_tiles(calibrate, lhs_shape, rhs_shape, message):
    gen = torch.Generator().manual_seed(16)
    with pytest.raises(ValueError, match=message):
        simulate(calibrate, "nkibench:matmul", "trn1", lhs=torch.randn(*lhs_shape, generator=gen),
                 rhs=torch.randn(*rhs_shape, generator=gen))


# ----------------------------------------------------------------------------- layernorm_tutorial:layernorm
# The LayerNorm tutorial's two kernels (aws-neuron-sdk general/nki/examples/layernorm/
# layernorm_torch.py: torch.nn.functional.layer_norm with gamma, beta, eps 1e-5). fp32 all
# through; v1's variance is E[x^2] - E[x]^2, which loses relative precision when the mean is
# large against the spread: inputs of mean ~0.5 and spread ~0.3 (the tutorial's np.random.rand)
# keep it at a few ulp of E[x^2] -> 1e-4 absolute / relative on outputs of order 1. Shapes:
# a partial last row tile (3 tiles, 44 rows in the last), columns off the 512-column bn_stats
# chunk and the PSUM bank (1000), and an exact one (2 tiles x 1024).

@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("rows, cols", [(300, 1000), (256, 1024)])
def test_layernorm_tutorial_normalises_and_applies_gamma_beta(calibrate, version, rows, cols):
    x, gamma, beta = torch.rand(rows, cols), torch.rand(cols), torch.rand(cols)
    out = simulate(calibrate, "layernorm_tutorial:layernorm", "trn1", x=x, gamma=gamma, beta=beta,
                   version=version).outputs
    ref = torch.nn.functional.layer_norm(x.double(), (cols,), gamma.double(), beta.double(), eps=1e-5)
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("version, gamma_len, beta_len, message", [
    ("v3", 64, 64, r"version='v3'; expected 'v1' or 'v2'"),
    ("v1", 63, 64, r"gamma \(63,\) and beta \(64,\) must both be \(64,\)"),
    ("v2", 64, 65, r"gamma \(64,\) and beta \(65,\) must both be \(64,\)"),
])
def test_layernorm_tutorial_rejects_a_bad_version_or_parameter_length(calibrate, version, gamma_len, beta_len,
                                                                      message):
    with pytest.raises(ValueError, match=message):
        simulate(calibrate, "layernorm_tutorial:layernorm", "trn1", x=torch.rand(128, 64),
                 gamma=torch.rand(gamma_len), beta=torch.rand(beta_len), version=version)


# ----------------------------------------------------------------------------- autocomp_gemm:gemm
# lhsT.T @ rhs in bf16 (the harness's dtype): bf16 products are exact in fp32, the fp32 sums
# of K terms are off by at most K u32 sum|a||b|, and the bf16 result adds one rounding,
# 2**-8 of |result|. Shape: 2 K tiles, 4 M tiles (one block of the 4 x 2 variants), 4 N tiles.

@pytest.mark.parametrize("variant", ["s20_99", "s28_68", "s11_8", "s8_07", "s7_62", "s6_96"])
def test_autocomp_gemm_variants_multiply(calibrate, variant):
    K, M, N = 256, 512, 2048
    a = (torch.randn(K, M) / 16).to(torch.bfloat16)
    b = (torch.randn(K, N) / 16).to(torch.bfloat16)
    out = simulate(calibrate, "autocomp_gemm:gemm", "trn1", lhsT=a, rhs=b, variant=variant).outputs
    assert out.dtype == torch.bfloat16 and out.shape == (M, N)
    _assert_matmul(out, a, b, K, 2.0 ** -8)


@pytest.mark.parametrize("variant, k, m, n, message", [
    ("s9_99", 128, 512, 1024, r"variant='s9_99' is not one of"),
    ("s20_99", 128, 512, 1000, r"rhs.shape\[1\] \(N\)=1000 must be a multiple of 512"),
    ("s8_07", 128, 256, 1024, r"lhsT.shape\[1\] \(M\)=256 must be a multiple of 512"),
    ("s11_8", 200, 256, 1024, r"lhsT.shape\[0\] \(K\)=200 must be a multiple of 128"),
])
def test_autocomp_gemm_rejects_an_unknown_variant_or_shapes_off_its_blocks(calibrate, variant, k, m, n, message):
    with pytest.raises(ValueError, match=message):
        simulate(calibrate, "autocomp_gemm:gemm", "trn1", lhsT=torch.rand(k, m).to(torch.bfloat16),
                 rhs=torch.rand(k, n).to(torch.bfloat16), variant=variant)


def test_autocomp_gemm_rejects_a_contraction_mismatch(calibrate):
    with pytest.raises(ValueError, match=r"rhs.shape\[0\]=256 must equal lhsT.shape\[0\]=128"):
        simulate(calibrate, "autocomp_gemm:gemm", "trn1", lhsT=torch.rand(128, 512).to(torch.bfloat16),
                 rhs=torch.rand(256, 1024).to(torch.bfloat16), variant="s20_99")


@pytest.mark.parametrize("group_n", [1, 2])
def test_autocomp_gemm_k_coalesced_what_if_multiplies(calibrate, group_n):
    # the what-if of docs/cost-model.md (no row runs it): the same product, K loads coalesced;
    # 3 K tiles (an odd count), 2 M tiles, 2 N blocks; tolerance as for the ports above
    K, M, N = 384, 256, 1024 * group_n
    a = (torch.randn(K, M) / 16).to(torch.bfloat16)
    b = (torch.randn(K, N) / 16).to(torch.bfloat16)
    out = simulate(calibrate, "autocomp_gemm:gemm_k_coalesced", "trn1", lhsT=a, rhs=b, group_n=group_n).outputs
    _assert_matmul(out, a, b, K, 2.0 ** -8)


@pytest.mark.parametrize("group_n, k, m, n, message", [
    (3, 128, 128, 1536, r"group_n=3; expected 1 or 2"),
    (2, 128, 128, 512, r"rhs.shape\[1\] \(N\)=512 must be a multiple of 1024"),
    (1, 100, 128, 512, r"lhsT.shape\[0\] \(K\)=100 must be a multiple of 128"),
])
def test_autocomp_gemm_k_coalesced_rejects_bad_arguments(calibrate, group_n, k, m, n, message):
    with pytest.raises(ValueError, match=message):
        simulate(calibrate, "autocomp_gemm:gemm_k_coalesced", "trn1", lhsT=torch.rand(k, m).to(torch.bfloat16),
                 rhs=torch.rand(k, n).to(torch.bfloat16), group_n=group_n)


# ----------------------------------------------------------------- optimization_guide_matmul:matmul
# lhsT.T @ rhs in fp32 (the tutorial's driver): fp32 products summed in fp32 PSUM are off by
# at most K u32 sum|a||b|; v5 adds each block of 8 K tiles into an fp32 SBUF accumulator
# (K / 1024 more roundings, within the same bound plus one) and every version rounds once
# more into its fp32 result. Shapes: 3 tiles of K, M and N for v2 / v3 (odd tile counts); for
# v5 its smallest blocks twice over (2 K blocks, so the SBUF accumulation runs).

@pytest.mark.parametrize("version, k, m, n", [("v2", 384, 384, 1536), ("v3", 384, 384, 1536),
                                              ("v5", 2048, 2048, 2048)])
def test_optimization_guide_matmuls_multiply(calibrate, version, k, m, n):
    a, b = torch.randn(k, m), torch.randn(k, n)
    out = simulate(calibrate, "optimization_guide_matmul:matmul", "trn2", lhsT=a, rhs=b, version=version).outputs
    assert out.dtype == torch.float32 and out.shape == (m, n)
    _assert_matmul(out, a, b, k + 2, U32)


@pytest.mark.parametrize("version, k, m, n, message", [
    ("v4", 384, 384, 1536, r"version='v4' is not one of \('v2', 'v3', 'v5'\)"),
    ("v2", 384, 384, 1000, r"rhs.shape\[1\] \(N\)=1000 must be a multiple of 512"),
    ("v3", 200, 384, 512, r"lhsT.shape\[0\] \(K\)=200 must be a multiple of 128"),
    ("v5", 2048, 1024, 2048, r"lhsT.shape\[1\] \(M\)=1024 must be a multiple of 2048"),
    ("v5", 1536, 2048, 2048, r"lhsT.shape\[0\] \(K\)=1536 must be a multiple of 1024"),
])
def test_optimization_guide_matmul_rejects_an_unknown_version_or_shapes_off_its_blocks(calibrate, version, k, m, n,
                                                                                       message):
    with pytest.raises(ValueError, match=message):
        simulate(calibrate, "optimization_guide_matmul:matmul", "trn2", lhsT=torch.rand(k, m), rhs=torch.rand(k, n),
                 version=version)


def test_optimization_guide_v5_issues_one_vector_instruction_size_the_fixed_cost_is_read_from(calibrate):
    # hardware.py reads trn2's VectorE fixed cost off v5's profile assuming the port's
    # VectorE stream: per output tile [128, 512] one memset, one add per block of 8 K tiles
    # and one copy, every one [128, 512] fp32 (v5_vector_instructions: 5,120 at the profiled
    # shape, K 8192, M 4096, N 8192). Checked on the smallest shape with two K blocks.
    k, m, n = 2048, 2048, 2048
    trace = simulate(calibrate, "optimization_guide_matmul:matmul", "trn2", lhsT=torch.randn(k, m),
                     rhs=torch.randn(k, n), version="v5").trace
    vector = [i for i in trace if i.engine == "vector"]
    tiles = (m // 128) * (n // 512)
    assert collections.Counter(i.op for i in vector) == {"memset": tiles, "tensor_tensor": tiles * k // 1024,
                                                         "tensor_copy": tiles}
    assert {(w.shape, str(w.dtype)) for i in vector for w in i.writes} == {((128, 512), "float32")}
    # the count the hardware.py derivation takes (test_calibration.py, at the profiled shape)
    assert calibrate._kernel("optimization_guide_matmul:v5_vector_instructions")(k, m, n) == len(vector)


def test_optimization_guide_matmul_rejects_a_contraction_mismatch(calibrate):
    with pytest.raises(ValueError, match=r"rhs.shape\[0\]=256 must equal lhsT.shape\[0\]=128"):
        simulate(calibrate, "optimization_guide_matmul:matmul", "trn2", lhsT=torch.rand(128, 128),
                 rhs=torch.rand(256, 512), version="v2")


# ----------------------------------------------------------------------------- autocomp_attention
# out [S, 128] = softmax(q^T k) v^T with q, k, v [128, S] bf16 in [-1, 1] (the harness's
# inputs). The probabilities and the V^T tiles pass through bf16 (8 bits: 2**-8 relative),
# so each output, a convex combination of |v| <= 1, is off by a few 2**-8: the harness's
# own atol, 1e-2. Candidate 8 caches QK^T in bf16 before the exp (scores up to ~40 here:
# absolute rounding up to 0.16 in the exponent), so its reference rounds QK^T the same way.
# seq 1024: two 512-key blocks and 8 query tiles; both copy placements.

def _attention_reference(q, k, v, round_scores_to_bf16=False):
    s = q.double().T @ k.double()
    if round_scores_to_bf16:
        s = s.float().to(torch.bfloat16).double()
    p = torch.softmax(s, dim=1)
    return p @ v.double().T


@pytest.mark.parametrize("copy_engine", ["scalar", "vector"])
@pytest.mark.parametrize("kernel, version", [("three_pass", "c3"), ("three_pass", "c4"), ("three_pass", "c5"),
                                             ("fused", "c8"), ("fused", "c9"), ("fused", "c10")])
def test_autocomp_attention_is_softmax_qk_times_v(calibrate, kernel, version, copy_engine):
    seq = 1024
    q, k, v = ((torch.rand(128, seq) * 2 - 1).to(torch.bfloat16) for _ in range(3))
    out = simulate(calibrate, f"autocomp_attention:{kernel}", "trn1", q=q, k=k, v=v, version=version,
                   copy_engine=copy_engine).outputs
    assert out.shape == (seq, 128) and out.dtype == torch.bfloat16
    ref = _attention_reference(q, k, v, round_scores_to_bf16=(version == "c8"))
    torch.testing.assert_close(out.double(), ref, atol=1e-2, rtol=0)


@pytest.mark.parametrize("kernel, version, shape, copy_engine, message", [
    ("three_pass", "c6", (128, 512), "scalar", r"version='c6'; expected 'c3', 'c4' or 'c5'"),
    ("fused", "c5", (128, 512), "scalar", r"version='c5'; expected 'c8', 'c9' or 'c10'"),
    ("fused", "c9", (128, 500), "scalar", r"q.shape\[1\] \(seq\)=500 must be a multiple of 512"),
    ("three_pass", "c4", (64, 512), "scalar", r"q.shape\[0\] \(d_head\)=64 must be 128"),
    ("fused", "c10", (128, 512), "gpsimd", r"copy_engine='gpsimd'; expected 'scalar', 'vector' or 'alt'"),
])
def test_autocomp_attention_rejects_bad_versions_shapes_and_engines(calibrate, kernel, version, shape,
                                                                   copy_engine, message):
    q, k, v = (torch.rand(*shape).to(torch.bfloat16) for _ in range(3))
    with pytest.raises(ValueError, match=message):
        simulate(calibrate, f"autocomp_attention:{kernel}", "trn1", q=q, k=k, v=v, version=version,
                 copy_engine=copy_engine)


# ----------------------------------------------------------------------------- autocomp_sd_attention
# out [S, 64] = softmax((q * 0.125) @ k^T) @ v, q, k, v [S, 64] fp32 in [0, 1) (the harness's
# inputs, np.random.rand). The reference is float64 with the casts the harness's
# mixed_precision=True path declares: q, k, v and the probabilities in bf16 (pe_in_dt), and
# for candidates 4-6 ("c4", "c5", "best") the QK^T row buffer too; the row sum taken before
# the probabilities' cast (every candidate: a VectorE sum of the fp32 exp, or ScalarE's
# reduce registers, which add the exp before its output cast). What
# is left: fp32 accumulation (64-term scores, S-term sums: ~1e-6 relative) and the rare
# element where fp32 and float64 round to neighbouring bf16 values. One such flip moves an
# output by at most 2**-8 x p_j (a probability) or (e**(2**-7 |s_j|) - 1) x p_j (a score,
# |s_j| < 8 here: 6.5 % x p_j) times |v_j - out| < 1; at these flat rows p_j < 0.01, so a
# flip costs < 7e-4 x |v_j - out| <~ 4e-4 and a few coincide rarely: atol 5e-4 (observed
# <= 3e-5), 20x below the error of the plain average of v (~1e-2). seq 384: three tiles;
# both copy placements.

def _sd_attention_reference(q, k, v, bf16_scores):
    bf = lambda x: x.to(torch.bfloat16).double()
    s = (bf(q) * 0.125) @ bf(k).T
    if bf16_scores:
        s = bf(s)
    e = torch.exp(s - s.max(dim=1, keepdim=True).values)
    return (bf(e) @ bf(v)) / e.sum(dim=1, keepdim=True)


@pytest.mark.parametrize("copy_engine", ["scalar", "vector"])
@pytest.mark.parametrize("version", ["tutorial", "c1", "c2", "c3", "c4", "c5", "best"])
def test_autocomp_sd_attention_is_softmax_scaled_qk_times_v(calibrate, version, copy_engine):
    seq, d_head = 384, 64
    q, k, v = (torch.rand(seq, d_head) for _ in range(3))
    out = simulate(calibrate, "autocomp_sd_attention:sd_attention", "trn1", q=q, k=k, v=v, version=version,
                   copy_engine=copy_engine).outputs
    assert out.shape == (seq, d_head) and out.dtype == torch.float32
    ref = _sd_attention_reference(q, k, v, bf16_scores=version in ("c4", "c5", "best"))
    torch.testing.assert_close(out.double(), ref, atol=5e-4, rtol=0)


def _sd_stream(calibrate, version):
    """(op, engine, first write's dtype, shape, buffer) of each instruction version issues at
    seq 384 (three query tiles), copies on ScalarE, in issue order."""
    q, k, v = (torch.rand(384, 64) for _ in range(3))
    res = simulate(calibrate, "autocomp_sd_attention:sd_attention", "trn1", q=q, k=k, v=v, version=version,
                   copy_engine="scalar")
    return [(i.op, i.engine, i.writes[0].dtype, i.writes[0].shape, i.writes[0].buffer) for i in res.trace]


def _sd_diff(a, b):
    """What stream b issues more (+n) and fewer (-n) of than stream a."""
    ca, cb = collections.Counter(a), collections.Counter(b)
    return {**dict(cb - ca), **{x: -n for x, n in (ca - cb).items()}}


def test_autocomp_sd_attention_candidates_are_their_parents_streams_with_one_step_each(calibrate):
    # the module docstring's steps 1-6, on the issued streams (per query tile: x 3 here)
    s = {v: _sd_stream(calibrate, v) for v in ("tutorial", "c1", "c2", "c3", "c4", "c5", "best")}
    exp_f32 = ("activation", "scalar", "float32", (128, 384), "sbuf")       # tutorial's exp, c3's
    row_sum = ("tensor_reduce", "vector", "float32", (128, 1), "sbuf")
    # 1: exp (fp32) + VectorE row sum + cast copy -> one exp writing bf16 with the sum in
    # ScalarE's reduce registers, zeroed by a VectorE memset (the cast copy's key is the exp's)
    assert _sd_diff(s["tutorial"], s["c1"]) == {exp_f32: -3, row_sum: -3,
                                                 ("memset", "vector", "float32", (128, 1), "sbuf"): 3}
    # 2: the same instructions in another order; 3: the exp writes fp32 again, the cast copy back
    assert _sd_diff(s["c1"], s["c2"]) == {} and s["c1"] != s["c2"]
    assert _sd_diff(s["c2"], s["c3"]) == {exp_f32: 3}
    # 4: the 9 QK^T copies write bf16; the exp writes bf16, no cast copy
    assert _sd_diff(s["c3"], s["c4"]) == {exp_f32: -3,
                                           ("activation", "scalar", "float32", (128, 128), "sbuf"): -9,
                                           ("activation", "scalar", "bfloat16", (128, 128), "sbuf"): 9}
    # 5: P stationary ([128 q, d] matmuls); broadcast copy, PSUM copy, divisor transpose,
    # multiply and transposing store -> one VectorE tensor_scalar and a plain store
    assert _sd_diff(s["c4"], s["c5"]) == {
        ("nc_matmul", "tensor", "float32", (128, 64), "psum"): 9, ("nc_matmul", "tensor", "float32", (64, 128), "psum"): -9,
        ("tensor_scalar", "vector", "float32", (128, 64), "sbuf"): 3,
        ("activation", "scalar", "float32", (128, 64), "sbuf"): -3,
        ("activation", "scalar", "float32", (64, 128), "sbuf"): -3,
        ("nc_transpose", "tensor", "float32", (64, 128), "psum"): -3,
        ("tensor_tensor", "vector", "float32", (64, 128), "sbuf"): -3,
        ("dma_copy", "dma", "float32", (128, 64), "hbm"): 3, ("dma_copy", "dma", "float32", (64, 128), "hbm"): -3}
    # 6: the causal-mask path only
    assert s["c5"] == s["best"]
    # the load loops: V, Q, K (0-1); V, then Q and K interleaved (2); V, Q, K per tile (3-6).
    # V: one casting DMA; Q: DMA transpose, cast copy, x 0.125; K: DMA transpose, cast copy
    V, Q, K = ["dma_copy"], ["dma_transpose", "activation", "tensor_scalar"], ["dma_transpose", "activation"]
    loads = {v: [x[0] for x in st[:st.index(next(x for x in st if x[0] == "nc_matmul"))]] for v, st in s.items()}
    assert loads["tutorial"] == loads["c1"] == V * 3 + Q * 3 + K * 3
    assert loads["c2"] == V * 3 + (Q + K) * 3
    assert loads["c3"] == loads["c4"] == loads["c5"] == loads["best"] == (V + Q + K) * 3


@pytest.mark.parametrize("version, shapes, dtype, copy_engine, message", [
    ("c6", [(256, 64)] * 3, torch.float32, "scalar",
     r"version='c6'; expected 'tutorial', 'c1', 'c2', 'c3', 'c4', 'c5' or 'best'"),
    ("best", [(256, 64)] * 3, torch.float32, "gpsimd", r"copy_engine='gpsimd'; expected 'scalar' or 'vector'"),
    ("tutorial", [(300, 64)] * 3, torch.float32, "scalar", r"q.shape\[0\] \(seq\)=300 must be a positive multiple of 128"),
    ("best", [(256, 192)] * 3, torch.float32, "scalar", r"q.shape\[1\] \(d_head\)=192 must be at most 128"),
    ("tutorial", [(256, 64), (256, 64), (128, 64)], torch.float32, "scalar", r"must have one shape"),
    ("best", [(256, 64)] * 3, torch.bfloat16, "scalar", r"q.dtype=bfloat16 must be float32"),
])
def test_autocomp_sd_attention_rejects_bad_versions_shapes_dtypes_and_engines(calibrate, version, shapes, dtype,
                                                                             copy_engine, message):
    q, k, v = (torch.rand(*s).to(dtype) for s in shapes)
    with pytest.raises(ValueError, match=message):
        simulate(calibrate, "autocomp_sd_attention:sd_attention", "trn1", q=q, k=k, v=v, version=version,
                 copy_engine=copy_engine)


# ----------------------------------------------------------------------------- nkilib_scan:selective_scan
# nki-library's selective scan (pull request #1): y = sum_n C_n * h_n (+ D x), h_n the scan of
# exp(dt A_n) and dt x B_n carried across 512-column tiles through final_state in HBM, which
# the kernel also returns. Reference: float64 on the same (rounded) inputs.

def selective_scan_reference(x, dt, A, B, C, D=None, initial_state=None, carry=True):
    """float64 (y, final_state); ``carry=False`` restarts the state at every 512-column tile
    (a wrong variant: the inputs must tell it from the carried scan)."""
    x, dt, A, B, C = (t.double() for t in (x, dt, A, B, C))
    batch, channels, length = x.shape
    h = (initial_state.double().clone() if initial_state is not None
         else torch.zeros(batch, channels, A.shape[1], dtype=torch.float64))
    h0 = h.clone()
    y = torch.zeros(batch, channels, length, dtype=torch.float64)
    for t in range(length):
        if not carry and t and t % 512 == 0:
            h = h0.clone()
        decay = torch.exp(dt[:, :, t, None] * A[None])                       # [b, c, n]
        h = decay * h + (dt[:, :, t] * x[:, :, t])[:, :, None] * B[:, None, :, t]
        y[:, :, t] = (h * C[:, None, :, t]).sum(-1)
    if D is not None:
        y = y + D.double()[None, :, None] * x
    return y, h


@pytest.mark.parametrize("batch, channels, length, states, with_d, with_init", [
    (1, 128, 256, 16, True, False),      # the profiled call
    (2, 200, 700, 3, True, True),        # a partial channel tile, a partial column tile
    (1, 97, 1024, 5, False, True),       # two whole column tiles
])
@pytest.mark.parametrize("a_block", [True, False])
def test_selective_scan_port_follows_the_recurrence(calibrate, batch, channels, length, states, with_d,
                                                    with_init, a_block):
    # fp32 only: the profiled dtype (the source's bf16 path: the test below)
    x = torch.randn(batch, channels, length)
    dt = torch.rand(batch, channels, length) * 0.09 + 0.01
    A = -(torch.rand(channels, states) * 1.5 + 0.5)
    B, C = (torch.randn(batch, states, length) for _ in range(2))
    kw = dict(x=x, dt=dt, A=A, B=B, C=C)
    if with_d:
        kw["D"] = torch.randn(channels)
    if with_init:
        kw["initial_state"] = torch.randn(batch, channels, states)
    y, final_state = simulate(calibrate, "nkilib_scan:selective_scan", "trn1", a_block=a_block, **kw).outputs
    want_y, want_state = selective_scan_reference(**kw)
    assert y.dtype == torch.float32 and final_state.dtype == torch.float32
    # fp32 throughout; the state sums ~1 / (dt |A|) <= 200 steps of fp32 roundings, so 1e-4 of
    # the largest value covers it
    torch.testing.assert_close(y.double(), want_y, atol=1e-4 * float(want_y.abs().max()), rtol=1e-5)
    torch.testing.assert_close(final_state.double(), want_state, atol=1e-4 * float(want_state.abs().max()), rtol=1e-5)
    if length > 512:   # a scan that dropped its carry between column tiles would fail
        wrong, _ = selective_scan_reference(**kw, carry=False)
        assert float((y.double() - wrong).abs().max()) > 1e-2 * float(want_y.abs().max())


@pytest.mark.parametrize("shapes, message", [
    (dict(dt=(1, 128, 200)), r"dt.shape=\(1, 128, 200\); expected \(1, 128, 256\)"),
    (dict(A=(64, 4)), r"A.shape=\(64, 4\); expected \(128, 4\)"),
    (dict(C=(1, 4, 128)), r"C.shape=\(1, 4, 128\); expected \(1, 4, 256\)"),
    (dict(D=(64,)), r"D.shape=\(64,\); expected \(128,\)"),
    (dict(initial_state=(1, 128, 5)), r"initial_state.shape=\(1, 128, 5\); expected \(1, 128, 4\)"),
])
def test_selective_scan_port_rejects_mismatched_shapes(calibrate, shapes, message):
    dims = {"x": (1, 128, 256), "dt": (1, 128, 256), "A": (128, 4), "B": (1, 4, 256), "C": (1, 4, 256), **shapes}
    kw = {k: torch.rand(*v) for k, v in dims.items()}
    with pytest.raises(ValueError, match=message):
        simulate(calibrate, "nkilib_scan:selective_scan", "trn1", **kw)


def test_selective_scan_port_keeps_the_sources_bf16_shuffle_which_the_simulator_refuses(calibrate):
    # the source shuffles B's row in B's dtype into an fp32 tile; the simulator follows
    # nc_stream_shuffle's NKI 0.7 docstring, "dst must have same data type as src", so with
    # bf16 B and C (a dtype the source's own tests sweep, and which the compiler it ran with
    # may have accepted) the stream does not build here: only fp32 is profiled
    from nki_kernels.simulator.errors import NkiValidationError

    kw = {"x": torch.rand(1, 128, 256), "dt": torch.rand(1, 128, 256), "A": -torch.rand(128, 4),
          "B": torch.rand(1, 4, 256).to(torch.bfloat16), "C": torch.rand(1, 4, 256).to(torch.bfloat16)}
    with pytest.raises(NkiValidationError, match="nc_stream_shuffle: dst dtype float32 must equal src dtype bfloat16"):
        simulate(calibrate, "nkilib_scan:selective_scan", "trn1", **kw)


# ----------------------------------------------------------------------------- nki_autotune_matmul
# awslabs/nki-autotune's 2048^3 bf16 matmuls. In the hand-written and the blocked kernels each
# K block of 1024 accumulates in fp32 PSUM, is rounded to bf16 and added into a bf16 SBUF
# accumulator (two blocks), so an element carries at most three bf16 roundings of |partials|
# <= sum_k |a_k b_k|: bounded by 3 * 2^-8 of that sum (fp32's accumulation error is far
# below). The generated kernels accumulate all of K in PSUM and round once.

def _assert_bf16_blocks_matmul(out, lhs, rhs, roundings):
    """Every element of ``out`` within ``roundings`` bf16 unit roundoffs (2^-8, a safe
    margin over half an ulp) of sum |lhs||rhs| from the float64 lhs @ rhs, and a product
    without the last 128 of K (a dropped K tile or block) outside that bound somewhere."""
    lhs, rhs = lhs.double(), rhs.double()
    ref = lhs @ rhs
    bound = roundings * 2.0 ** -8 * (lhs.abs() @ rhs.abs())
    assert out.dtype == torch.bfloat16
    bad = ~((out.double() - ref).abs() <= bound)
    assert not bool(bad.any()), f"{int(bad.sum())} elements off; max error {(out.double() - ref).abs().max():.3g}"
    short = lhs[:, :-128] @ rhs[:-128]
    assert float((out.double() - short).abs().max()) > float(bound.max())


# (kernel, operand names, DMA and VectorE instructions, bf16 roundings of the result, the
# allocation sites as sorted (buffer, tiles) pairs): the stream's shape and its buffer
# families, as the library's file gives them run in the simulator (the rotation rule
# groups tiles by site, so a port that merged or split sites would be modeled otherwise)
RESIDENT_SITES = [("psum", 1), ("sbuf", 64), ("sbuf", 64), ("sbuf", 256)]


@pytest.mark.parametrize("kernel, names, dma, vector, roundings, sites", [
    ("matmul_lhsT_rhs", ("lhs_T", "rhs"), 384, 448, 3,
     [("psum", 128), ("sbuf", 64), ("sbuf", 64), ("sbuf", 128), ("sbuf", 256)]),
    ("matmul_lhs_rhs", ("lhs", "rhs"), 320, 400, 3,
     [("psum", 128), ("sbuf", 16), ("sbuf", 32), ("sbuf", 128), ("sbuf", 128)]),
    ("matmul_lhsT_rhs_blocked", ("lhs_T", "rhs"), 384, 512, 3,
     [("psum", 32), ("sbuf", 32), ("sbuf", 64), ("sbuf", 64), ("sbuf", 64), ("sbuf", 256)]),
    ("matmul_lhsT_rhs_resident", ("lhs_T", "rhs"), 384, 128, 1, RESIDENT_SITES),
    ("matmul_lhs_rhs_streamed", ("lhs", "rhs"), 384, 128, 1, [("psum", 1), ("sbuf", 32), ("sbuf", 64), ("sbuf", 64)]),
    ("matmul_lhs_rhsT_resident", ("lhs", "rhs_T"), 384, 128, 1, RESIDENT_SITES),
    ("matmul_lhsT_rhsT_resident", ("lhs_T", "rhs_T"), 384, 128, 1, RESIDENT_SITES),
])
def test_nki_autotune_matmuls_multiply(calibrate, kernel, names, dma, vector, roundings, sites):
    from nki_kernels.simulator.cost.schedule import buffer_families

    a, b = (torch.randn(2048, 2048).to(torch.bfloat16) for _ in range(2))
    res = simulate(calibrate, f"nki_autotune_matmul:{kernel}", "trn2", **dict(zip(names, (a, b))))
    lhs = a.T if names[0] == "lhs_T" else a
    rhs = b.T if names[1] == "rhs_T" else b
    _assert_bf16_blocks_matmul(res.outputs, lhs, rhs, roundings)
    # loads, transposes and stores; matmuls; memsets, PSUM copies and adds
    assert collections.Counter(i.engine for i in res.trace) == {"dma": dma, "tensor": 1024, "vector": vector}
    _, families = buffer_families(res.trace, res.allocations)
    assert sorted((key[1], len(tiles)) for key, tiles in families.items()) == sites


@pytest.mark.parametrize("kernel, shapes, message", [
    ("matmul_lhsT_rhs", dict(lhs_T=(2048, 1024), rhs=(2048, 2048)), r"lhs_T.shape=\(2048, 1024\); the kernel is written"),
    ("matmul_lhs_rhs", dict(lhs=(2048, 2048), rhs=(1024, 2048)), r"rhs.shape=\(1024, 2048\); the kernel is written"),
    ("matmul_lhsT_rhs_blocked", dict(lhs_T=(1024, 2048), rhs=(2048, 2048)), r"lhs_T.shape=\(1024, 2048\)"),
    ("matmul_lhsT_rhsT_resident", dict(lhs_T=(2048, 2048), rhs_T=(2048, 512)), r"rhs_T.shape=\(2048, 512\)"),
    ("double_matmul", dict(Q=(2048, 2048), K=(2048, 2048), V=(2048, 1024)),
     r"V.shape=\(2048, 1024\); the kernel is written"),
])
def test_nki_autotune_matmuls_take_only_their_shape(calibrate, kernel, shapes, message):
    kw = {k: torch.randn(*v).to(torch.bfloat16) for k, v in shapes.items()}
    with pytest.raises(ValueError, match=message):
        simulate(calibrate, f"nki_autotune_matmul:{kernel}", "trn2", **kw)


def test_nki_autotune_double_matmul_is_qk_times_v(calibrate):
    """(Q @ K.T) @ V against float64. S accumulates over d in fp32 PSUM (at most n u of
    sum |q||k|, n = 2048, u = 2^-24), is rounded to bf16 once (2^-8 of |S|, a safe margin
    over half an ulp) and transposed exactly; the output accumulates in fp32 and is rounded
    to bf16 once: within 3 x 2^-8 of |S| @ |V| plus the accumulation term carried through V.
    Dropping the last 128 keys or the last 128 of d leaves that bound somewhere."""
    from nki_kernels.simulator.cost.schedule import buffer_families

    q, k, v = (torch.randn(2048, 2048).to(torch.bfloat16) for _ in range(3))
    res = simulate(calibrate, "nki_autotune_matmul:double_matmul", "trn2", Q=q, K=k, V=v)
    Q, K, V = q.double(), k.double(), v.double()
    scores = Q @ K.T
    bound = 3 * 2.0 ** -8 * (scores.abs() @ V.abs()) + 2048 * 2.0 ** -24 * ((Q.abs() @ K.abs().T) @ V.abs())
    out = res.outputs.double()
    assert res.outputs.dtype == torch.bfloat16
    assert bool(((out - scores @ V).abs() <= bound).all())
    assert bool(((out - scores[:, :-128] @ V[:-128]).abs() > bound).any())
    assert bool(((out - (Q[:, :-128] @ K[:, :-128].T) @ V).abs() > bound).any())
    # 64 K and 1024 Q dma_transposes, 64 V loads, 64 stores; 2048 matmuls and 256 transposes
    # of S; memsets and PSUM copies
    assert collections.Counter(i.engine for i in res.trace) == {"dma": 1216, "tensor": 2304, "vector": 512}
    assert collections.Counter(i.op for i in res.trace if i.engine == "dma") == {"dma_transpose": 1088,
                                                                                  "dma_copy": 128}
    _, families = buffer_families(res.trace, res.allocations)
    assert sorted((key[1], len(tiles)) for key, tiles in families.items()) == [
        ("psum", 1), ("psum", 1), ("psum", 1), ("sbuf", 1), ("sbuf", 8), ("sbuf", 16), ("sbuf", 32),
        ("sbuf", 64), ("sbuf", 256)]


# ----------------------------------------------------------------------------- matmul_tutorial:matmul
# The NKI matmul tutorial's optimized kernels (@72825d50), at small shapes of whole blocks
# (fully_optimized: 2 K blocks, 2 M blocks, 2 N blocks). fp32 PSUM accumulation, one bf16
# rounding of the output (hoist_load, block_free); fully_optimized adds each K block's fp32
# sum into a bf16 SBUF block, so one bf16 rounding per K block plus the final copy.

@pytest.mark.parametrize("version, K, M, N, roundings, counts", [
    # loads and stores; matmuls; ScalarE copies; VectorE memsets and adds
    ("hoist_load", 384, 256, 1024, 1, {"dma": 2 * 3 + 2 * 2 * 3 + 2 * 2, "tensor": 2 * 2 * 3, "scalar": 2 * 2}),
    ("block_free", 256, 512, 2048, 1, {"dma": 2 * 4 + 2 * 8 + 16, "tensor": 32, "scalar": 16}),
    ("fully_optimized", 2048, 4096, 2048, 2,
     {"dma": 2 * 2 * (8 + 2 * 8) + 2 * 32, "tensor": 2 * 2 * 2 * 2 * 16 * 8, "scalar": 2 * 64,
      "vector": 2 + 2 * 2 * 2 * 32}),
])
def test_matmul_tutorial_kernels_multiply(calibrate, version, K, M, N, roundings, counts):
    # one bf16 rounding of the output (hoist_load, block_free); fully_optimized adds each K
    # block's fp32 sum into a bf16 SBUF block: one rounding per K block (two here)
    a, b = torch.randn(K, M).to(torch.bfloat16), torch.randn(K, N).to(torch.bfloat16)
    res = simulate(calibrate, "matmul_tutorial:matmul", "trn1", lhsT=a, rhs=b, version=version)
    _assert_bf16_blocks_matmul(res.outputs, a.T, b, roundings)
    assert collections.Counter(i.engine for i in res.trace) == counts


@pytest.mark.parametrize("version, K, M, N, message", [
    ("tiled", 256, 256, 1024, r"version='tiled'; expected one of \('hoist_load', 'block_free', 'fully_optimized'\)"),
    ("hoist_load", 200, 256, 1024, r"lhsT.shape\[0\] \(K\)=200 must be a multiple of 128"),
    ("block_free", 256, 384, 2048, r"lhsT.shape\[1\] \(M\)=384 must be a multiple of 256"),
    ("fully_optimized", 1024, 2048, 1536, r"rhs.shape\[1\] \(N\)=1536 must be a multiple of 1024"),
])
def test_matmul_tutorial_rejects_versions_and_shapes_it_does_not_tile(calibrate, version, K, M, N, message):
    a, b = torch.randn(K, M).to(torch.bfloat16), torch.randn(K, N).to(torch.bfloat16)
    with pytest.raises(ValueError, match=message):
        simulate(calibrate, "matmul_tutorial:matmul", "trn1", lhsT=a, rhs=b, version=version)


def test_matmul_tutorial_rejects_a_contraction_mismatch(calibrate):
    a, b = torch.randn(256, 256).to(torch.bfloat16), torch.randn(384, 1024).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"rhs.shape\[0\]=384 must equal lhsT.shape\[0\]=256"):
        simulate(calibrate, "matmul_tutorial:matmul", "trn1", lhsT=a, rhs=b, version="hoist_load")

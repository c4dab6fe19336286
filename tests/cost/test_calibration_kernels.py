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

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from tests._helpers import TOLERANCES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def calibrate():
    spec = importlib.util.spec_from_file_location("calibrate", ROOT / "benchmarks" / "calibrate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["calibrate"] = mod   # its dataclasses look their module up
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("calibrate", None)


def simulate(calibrate, kernel: str, target: str, **kwargs):
    """Run calibration kernel ``module:function`` as calibrate.run_row does (imported by
    calibrate._kernel with nki bound to the simulator; simulator.run on ``target``): the
    SimResult, whose outputs start as NaN poison (params.py), so an element the kernel never
    writes fails any comparison."""
    from nki_kernels import simulator

    return simulator.run(calibrate._kernel(kernel), target=target, **kwargs)


def row_key(row) -> str:
    """A row's kernel and the string arguments that choose its code path (mamba's version,
    activation's func): what one test here has to cover."""
    modes = "".join(f"[{k}={v}]" for k, v in sorted(row.args.items()) if isinstance(v, str))
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
    "mamba:mamba[version=accelopt]": "test_mamba_follows_the_selective_scan_recurrence",
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


# ----------------------------------------------------------------------------- mamba:mamba (v1, v2, v3, accelopt)
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


@pytest.mark.parametrize("version, seq", [("v1", 200), ("v2", 200), ("v3", 3 * MAMBA_CHUNK),
                                          ("accelopt", 3 * MAMBA_CHUNK)])
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


def test_mamba_rejects_an_unknown_version(calibrate):
    x = torch.randn(128, 4)
    with pytest.raises(ValueError, match="version='v4'"):
        simulate(calibrate, "mamba:mamba", "trn1", delta=x, u=x, a=torch.randn(128, 2), b=torch.randn(2, 4),
                 c=torch.randn(2, 4), version="v4")

"""Every rejected input: the error type, and that the message names the argument and numbers."""

from __future__ import annotations

import pytest
import torch

import nki_kernels
from nki_kernels.ops.softmax import softmax_kernel_call

f32 = torch.float32
x768 = lambda *s: torch.randn(*s)  # noqa: E731


def _q(*shape):
    return torch.randn(*shape)


CASES = [
    # ---- layer_norm
    ("ln-integer", lambda: nki_kernels.layer_norm(torch.arange(12).reshape(3, 4), (4,)),
     TypeError, ["input", "int64"]),
    ("ln-shape-mismatch", lambda: nki_kernels.layer_norm(x768(3, 8), (4,)),
     ValueError, ["normalized_shape=[4]", "[3, 8]"]),
    ("ln-shape-too-long", lambda: nki_kernels.layer_norm(x768(8), (2, 8)),
     ValueError, ["normalized_shape=[2, 8]", "[8]"]),
    ("rms-eps-bool", lambda: nki_kernels.rms_norm(x768(3, 8), (8,), None, True),
     TypeError, ["eps", "True", "bool"]),
    ("gelu-float64", lambda: nki_kernels.gelu(torch.randn(3, 8, dtype=torch.float64)),
     TypeError, ["float64"]),
    ("ln-shape-empty", lambda: nki_kernels.layer_norm(x768(3, 8), ()),
     ValueError, ["normalized_shape=()"]),
    ("ln-weight-size", lambda: nki_kernels.layer_norm(x768(3, 8), (8,), torch.ones(7)),
     ValueError, ["weight", "[7]", "[8]"]),
    ("ln-bias-size", lambda: nki_kernels.layer_norm(x768(3, 8), (8,), torch.ones(8), torch.ones(9)),
     ValueError, ["bias", "[9]", "[8]"]),
    ("ln-weight-integer", lambda: nki_kernels.layer_norm(x768(3, 8), (8,), torch.ones(8, dtype=torch.int32)),
     TypeError, ["weight", "int32"]),
    ("ln-eps-negative", lambda: nki_kernels.layer_norm(x768(3, 8), (8,), eps=-1.0),
     ValueError, ["eps=-1.0", ">= 0"]),
    ("ln-eps-nan", lambda: nki_kernels.layer_norm(x768(3, 8), (8,), eps=float("nan")),
     ValueError, ["eps=nan", "finite"]),
    ("rms-eps-inf", lambda: nki_kernels.rms_norm(x768(3, 8), (8,), None, float("inf")),
     ValueError, ["eps=inf", "finite"]),
    # finite as a Python float, infinite in fp32, where the kernels add it (review, session 68)
    ("ln-eps-past-fp32", lambda: nki_kernels.layer_norm(x768(3, 8), (8,), eps=1e300),
     ValueError, ["eps=1e+300", "float32", "3.40282e+38"]),
    ("rms-eps-past-fp32", lambda: nki_kernels.rms_norm(x768(3, 8), (8,), None, 3.5e38),
     ValueError, ["eps=3.5e+38", "float32"]),
    ("ln-shape-float", lambda: nki_kernels.layer_norm(x768(3, 4), 4.0),
     TypeError, ["normalized_shape", "4.0"]),
    # a float size is refused, never truncated to the int it would round to (4.7 -> 4)
    ("ln-shape-float-element", lambda: nki_kernels.layer_norm(x768(3, 4), (4.7,)),
     TypeError, ["normalized_shape", "4.7"]),
    # a bool size is refused too (torch refuses (True, 4) but reads (4, True) as [4, 1])
    ("ln-shape-bool", lambda: nki_kernels.layer_norm(x768(3, 4), (4, True)),
     TypeError, ["normalized_shape", "True"]),
    ("ln-eps-none", lambda: nki_kernels.layer_norm(x768(3, 8), (8,), eps=None),
     TypeError, ["eps=None", "float"]),
    ("ln-not-a-tensor", lambda: nki_kernels.layer_norm([1.0, 2.0], (2,)),
     TypeError, ["input", "list"]),
    # ---- rms_norm
    ("rms-integer", lambda: nki_kernels.rms_norm(torch.ones(3, 4, dtype=torch.int16), (4,)),
     TypeError, ["input", "int16"]),
    ("rms-shape-mismatch", lambda: nki_kernels.rms_norm(x768(2, 5, 6), (5,)),
     ValueError, ["normalized_shape=[5]", "[2, 5, 6]"]),
    ("rms-shape-none", lambda: nki_kernels.rms_norm(x768(2, 6), None),
     TypeError, ["normalized_shape", "None"]),
    ("rms-weight-size", lambda: nki_kernels.rms_norm(x768(2, 6), (6,), torch.ones(3, 2)),
     ValueError, ["weight", "[3, 2]", "[6]"]),
    ("rms-eps-type", lambda: nki_kernels.rms_norm(x768(2, 6), (6,), None, "1e-6"),
     TypeError, ["eps", "str"]),
    # ---- fused_add_rms_norm
    ("fused-residual-shape", lambda: nki_kernels.fused_add_rms_norm(x768(4, 8), x768(4, 9), None, 1e-6),
     ValueError, ["residual", "[4, 9]", "[4, 8]"]),
    ("fused-residual-dtype", lambda: nki_kernels.fused_add_rms_norm(
        x768(4, 8), x768(4, 8).bfloat16(), None, 1e-6), TypeError, ["residual", "bfloat16", "float32"]),
    ("fused-0d", lambda: nki_kernels.fused_add_rms_norm(torch.tensor(1.5), torch.tensor(0.5), None, 1e-6),
     ValueError, ["input", "0-dimensional"]),
    # (fused_add_rms_norm has no normalized_shape: the message names what it compares with)
    ("fused-weight-size", lambda: nki_kernels.fused_add_rms_norm(x768(4, 8), x768(4, 8), torch.ones(4), 1e-6),
     ValueError, ["weight has shape [4]", "[input.shape[-1]] is [8]"]),
    ("fused-integer", lambda: nki_kernels.fused_add_rms_norm(torch.ones(2, 2, dtype=torch.int64),
                                                             torch.ones(2, 2), None, 1e-6),
     TypeError, ["input", "int64"]),
    # ---- gated activations
    ("silu-and-mul-odd", lambda: nki_kernels.silu_and_mul(x768(3, 7)),
     ValueError, ["last dimension 7", "[3, 7]", "even"]),
    ("gelu-and-mul-odd", lambda: nki_kernels.gelu_and_mul(x768(2, 4, 9)),
     ValueError, ["last dimension 9", "[2, 4, 9]"]),
    ("silu-and-mul-0d", lambda: nki_kernels.silu_and_mul(torch.tensor(1.0)),
     ValueError, ["0-dimensional"]),
    ("silu-and-mul-integer", lambda: nki_kernels.silu_and_mul(torch.ones(2, 4, dtype=torch.int8)),
     TypeError, ["input", "int8"]),
    ("gelu-and-mul-approximate", lambda: nki_kernels.gelu_and_mul(x768(2, 4), approximate="fast"),
     ValueError, ["approximate", "'fast'"]),
    ("silu-integer", lambda: nki_kernels.silu(torch.arange(5)),
     TypeError, ["input", "int64"]),
    # ---- softmax
    ("softmax-integer", lambda: nki_kernels.softmax(torch.arange(5)),
     TypeError, ["input", "int64"]),
    ("softmax-dim-range", lambda: nki_kernels.softmax(x768(3, 4), dim=2),
     IndexError, ["dim=2", "2 dimension"]),
    ("softmax-dim-type", lambda: nki_kernels.softmax(x768(3, 4), dim=1.0),
     TypeError, ["dim", "float"]),
    ("softmax-max-cols", lambda: softmax_kernel_call(x768(3, 4), max_cols=10000),
     ValueError, ["max_cols=10000", "8192"]),
    ("softmax-split-rows", lambda: softmax_kernel_call(x768(3, 4), split_rows=1),
     TypeError, ["split_rows", "Python bool", "1", "int"]),
    # a float limit is refused, never truncated (100.7 -> 100)
    ("softmax-max-cols-float", lambda: softmax_kernel_call(x768(3, 4), max_cols=100.7),
     TypeError, ["max_cols", "int", "100.7"]),
    ("softmax-resident-bytes-bool", lambda: softmax_kernel_call(x768(3, 4), resident_bytes=True),
     TypeError, ["resident_bytes", "int", "True"]),
    ("softmax-resident-bytes", lambda: softmax_kernel_call(x768(3, 4), resident_bytes=-1),
     ValueError, ["resident_bytes=-1", "131072"]),
    # ---- rotary
    ("rope-q-3d", lambda: nki_kernels.apply_rotary_pos_emb(_q(2, 5, 8), _q(2, 1, 5, 8), _q(5, 8), _q(5, 8)),
     ValueError, ["q", "[2, 5, 8]", "4 dimensions"]),
    ("rope-k-seq", lambda: nki_kernels.apply_rotary_pos_emb(_q(2, 4, 5, 8), _q(2, 1, 6, 8), _q(5, 8), _q(5, 8)),
     ValueError, ["k", "[2, 1, 6, 8]", "[2, 4, 5, 8]"]),
    ("rope-odd-dim", lambda: nki_kernels.apply_rotary_pos_emb(_q(1, 2, 5, 7), _q(1, 2, 5, 7), _q(5, 7), _q(5, 7)),
     ValueError, ["D=7", "even"]),
    ("rope-cos-seq", lambda: nki_kernels.apply_rotary_pos_emb(_q(2, 4, 5, 8), _q(2, 1, 5, 8), _q(6, 8), _q(6, 8)),
     ValueError, ["cos/sin", "[6, 8]", "S=5", "D=8"]),
    ("rope-cos-batch", lambda: nki_kernels.apply_rotary_pos_emb(_q(2, 4, 5, 8), _q(2, 1, 5, 8), _q(3, 5, 8),
                                                               _q(3, 5, 8)),
     ValueError, ["cos/sin", "[3, 5, 8]", "B=2"]),
    ("rope-cos-4d", lambda: nki_kernels.apply_rotary_pos_emb(_q(2, 4, 5, 8), _q(2, 1, 5, 8), _q(2, 1, 5, 8),
                                                            _q(2, 1, 5, 8)),
     ValueError, ["cos/sin", "[2, 1, 5, 8]"]),
    ("rope-cos-vs-sin", lambda: nki_kernels.apply_rotary_pos_emb(_q(1, 2, 5, 8), _q(1, 2, 5, 8), _q(5, 8), _q(1, 5, 8)),
     ValueError, ["cos", "[5, 8]", "sin", "[1, 5, 8]"]),
    ("rope-integer", lambda: nki_kernels.apply_rotary_pos_emb(torch.ones(1, 2, 5, 8, dtype=torch.int32),
                                                             _q(1, 2, 5, 8), _q(5, 8), _q(5, 8)),
     TypeError, ["q", "int32"]),
    # ---- layouts: the kernels read strided memory (a sparse input failed inside the
    # simulator naming no argument; audit of 2026-12-07)
    ("gelu-sparse", lambda: nki_kernels.gelu(_q(3, 8).to_sparse()),
     TypeError, ["input", "torch.sparse_coo", "torch.strided"]),
    ("softmax-nested", lambda: nki_kernels.softmax(torch.nested.nested_tensor([_q(2, 8), _q(3, 8)]), dim=-1),
     TypeError, ["input", "nested tensor"]),
    ("ln-weight-sparse", lambda: nki_kernels.layer_norm(x768(3, 8), (8,), torch.ones(8).to_sparse()),
     TypeError, ["weight", "torch.sparse_coo"]),
    ("sdpa-key-sparse", lambda: nki_kernels.scaled_dot_product_attention(_q(1, 2, 3, 8), _q(1, 2, 5, 8).to_sparse(),
                                                                         _q(1, 2, 5, 8)),
     TypeError, ["key", "torch.sparse_coo"]),
    ("sdpa-mask-sparse", lambda: nki_kernels.scaled_dot_product_attention(
        _q(1, 2, 3, 8), _q(1, 2, 5, 8), _q(1, 2, 5, 8), attn_mask=torch.ones(3, 5, dtype=torch.bool).to_sparse()),
     TypeError, ["attn_mask", "torch.sparse_coo"]),
]


@pytest.mark.parametrize("name, call, error, words", CASES, ids=[c[0] for c in CASES])
def test_bad_input(name, call, error, words):
    with pytest.raises(error) as info:
        call()
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "fused_add_rms_norm"])
def test_norm_hidden_limit_on_kernel_path(simulator_backend, op):
    # The kernels take rows up to 65536 (streamed beyond 8192); beyond that the kernel path
    # refuses clearly, before any kernel runs.
    x = torch.randn(1, 65537)
    with pytest.raises(ValueError) as info:
        if op == "layer_norm":
            nki_kernels.layer_norm(x, (65537,))
        elif op == "rms_norm":
            nki_kernels.rms_norm(x, (65537,))
        else:
            nki_kernels.fused_add_rms_norm(x, x, None, 1e-6)
    assert "65537" in str(info.value) and "65536" in str(info.value)
    # the size is named by what the op takes: fused_add_rms_norm has no normalized_shape
    assert ("input.shape[-1]" if op == "fused_add_rms_norm" else "prod(normalized_shape)") in str(info.value)


def test_norm_hidden_limit_is_inclusive():
    # 65536 itself is the kernels' largest row (its run is in the sweep tier): the launch is
    # built, not refused
    from nki_kernels.ops import norms

    x = torch.randn(1, 65536)
    for call in (lambda: norms.layer_norm_kernel_call(x, (65536,)),
                 lambda: norms.rms_norm_kernel_call(x, (65536,), None, 1e-6),
                 lambda: norms.fused_add_rms_norm_kernel_call(x, x, None, 1e-6)):
        assert call().kernel


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_edges_torch_accepts(simulator_backend, op):
    # eps=0.0 (torch takes it) and a 1-D input that normalized_shape covers whole
    x = torch.randn(8) * 2 + 0.5
    fn = getattr(nki_kernels, op)
    expected = getattr(torch.nn.functional, op)(x.double(), (8,), None, eps=0.0) if op == "rms_norm" \
        else torch.nn.functional.layer_norm(x.double(), (8,), None, None, eps=0.0)
    out = fn(x, (8,), eps=0.0)
    assert out.shape == x.shape
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=2e-6)


def test_norm_hidden_limit_not_applied_to_reference(reference_backend):
    x = torch.randn(2, 65537)
    torch.testing.assert_close(nki_kernels.rms_norm(x, (65537,), None, 1e-6),
                               torch.nn.functional.rms_norm(x, (65537,), None, 1e-6))


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "silu_and_mul", "softmax", "silu"])
def test_empty_inputs(simulator_backend, op):
    x = torch.randn(0, 8)
    fn = {
        "layer_norm": lambda: nki_kernels.layer_norm(x, (8,)),
        "rms_norm": lambda: nki_kernels.rms_norm(x, (8,)),
        "silu_and_mul": lambda: nki_kernels.silu_and_mul(x),
        "softmax": lambda: nki_kernels.softmax(x),
        "silu": lambda: nki_kernels.silu(x),
    }[op]
    out = fn()
    expected_shape = (0, 4) if op == "silu_and_mul" else (0, 8)
    assert out.numel() == 0 and tuple(out.shape) == expected_shape and out.dtype == x.dtype


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "fused_add_rms_norm", "rotary"])
def test_mixed_devices(op):
    x = torch.randn(3, 8)
    meta = torch.empty(8, device="meta")
    with pytest.raises(RuntimeError) as info:
        if op == "layer_norm":
            nki_kernels.layer_norm(x, (8,), meta)
        elif op == "rms_norm":
            nki_kernels.rms_norm(x, (8,), meta)
        elif op == "fused_add_rms_norm":
            nki_kernels.fused_add_rms_norm(x, torch.empty(3, 8, device="meta"), None, 1e-6)
        else:
            nki_kernels.apply_rotary_pos_emb(_q(1, 2, 5, 8), _q(1, 2, 5, 8), _q(5, 8),
                                             torch.empty(5, 8, device="meta"))
    assert "meta" in str(info.value) and "cpu" in str(info.value)


def test_numpy_scalars_are_taken_as_torch_takes_them():
    # eps / scale / dim as numpy scalars (what a config loaded with numpy gives): torch takes
    # them, so they are not refused; the values match torch's with the same Python numbers
    import numpy as np
    import torch.nn.functional as F

    x = torch.randn(4, 8)
    torch.testing.assert_close(nki_kernels.layer_norm(x, 8, eps=np.float32(1e-3)), F.layer_norm(x, (8,), eps=1e-3))
    torch.testing.assert_close(nki_kernels.rms_norm(x, (8,), None, np.float64(1e-3)), F.rms_norm(x, (8,), eps=1e-3))
    torch.testing.assert_close(nki_kernels.softmax(x, np.int64(0)), torch.softmax(x, 0))
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    torch.testing.assert_close(nki_kernels.scaled_dot_product_attention(q, k, v, scale=np.float32(0.5)),
                               F.scaled_dot_product_attention(q, k, v, scale=0.5))

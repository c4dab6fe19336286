"""NKI dtypes: names, conversions, and rounding pinned against independent references."""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch

from nki_kernels.simulator import dtypes as dt


def _rne_ieee(x: float, mant: int, emin: int, maxval: float) -> float:
    """Independent slow reference: RNE of x to an IEEE-like format (exact rationals)."""
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    a = Fraction(abs(x))
    e = max(math.floor(math.log2(abs(x))), emin)
    # fix floor(log2) for exact powers near float error
    while Fraction(2) ** e > a and e > emin:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    q = Fraction(2) ** (e - mant)
    n = a / q
    fl = math.floor(n)
    rem = n - fl
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2 == 1):
        fl += 1
    r = float(fl * q)
    if r > maxval:
        r = math.inf
    return math.copysign(r, x)


def _random_floats(n, scale):
    return (torch.randn(n) * scale).tolist()


def test_names_and_equality():
    assert dt.float32 == "float32" and dt.bfloat16 == "bfloat16"
    assert repr(dt.bfloat16) == "nl.bfloat16"
    assert dt.bfloat16.itemsize == 2 and dt.float8_e4m3.itemsize == 1 and dt.tfloat32.itemsize == 4
    assert dt.float32.is_float and not dt.int32.is_float and dt.int32.is_int
    assert dt.float32.min == pytest.approx(-3.4028235e38)


@pytest.mark.parametrize("src, expected", [
    (torch.float32, "float32"), (torch.bfloat16, "bfloat16"), (torch.float16, "float16"),
    (torch.int8, "int8"), (torch.uint8, "uint8"), (torch.int32, "int32"), (torch.bool, "bool_"),
    (np.float32, "float32"), (np.dtype("float16"), "float16"), (np.int16, "int16"),
    ("bfloat16", "bfloat16"), ("fp32", "float32"),
])
def test_to_nki_accepts_torch_numpy_and_names(src, expected):
    assert dt.to_nki(src) == expected


@pytest.mark.parametrize("bad, message", [
    (torch.float64, "torch dtype torch.float64 has no NKI equivalent"),
    (torch.int64, "torch dtype torch.int64 has no NKI equivalent"),
    (np.float64, "dtype float64 is not an NKI dtype \\(NKI has no 64-bit types\\)"),
    ("float64", "dtype 'float64' is not an NKI dtype; expected one of"),
    ("complex", "dtype 'complex' is not an NKI dtype; expected one of"),
])
def test_to_nki_rejects_unsupported(bad, message):
    with pytest.raises(TypeError, match=message):
        dt.to_nki(bad)


@pytest.mark.parametrize("name, tdtype", [
    ("bfloat16", torch.bfloat16), ("float16", torch.float16),
    ("float8_e5m2", torch.float8_e5m2), ("float8_e4m3fn", torch.float8_e4m3fn),
])
def test_torch_backed_formats_round_like_torch(name, tdtype):
    x = torch.randn(4096) * 3
    got = dt.from_name(name).round(x)
    assert got.dtype == torch.float32
    assert torch.equal(got, x.to(tdtype).to(torch.float32))


def test_bf16_rounds_half_to_even():
    # 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to even (1.0)
    x = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8)])
    assert dt.bfloat16.round(x).tolist() == [1.0, 1 + 2 ** -6, -1.0]


def test_float8_e4m3_matches_exact_reference():
    vals = _random_floats(3000, 20) + _random_floats(500, 0.01) + \
        [240.0, 247.9, 248.0, 250.0, 2 ** -9, 2 ** -10, 3 * 2 ** -10, -0.0, 1e-30, 1000.0]
    got = dt.float8_e4m3.round(torch.tensor(vals, dtype=torch.float32)).tolist()
    for v, g in zip(vals, got):
        v32 = struct.unpack("f", struct.pack("f", v))[0]
        assert g == _rne_ieee(v32, 3, -6, 240.0), v


def test_float8_e4m3_range_and_specials():
    r = dt.float8_e4m3.round(torch.tensor([240.0, 248.0, float("inf"), float("nan"), -300.0]))
    assert r[0] == 240.0 and math.isinf(r[1]) and math.isinf(r[2]) and math.isnan(r[3])
    assert r[4] == -math.inf


def test_tfloat32_matches_exact_reference():
    vals = _random_floats(3000, 1000) + [1 + 2 ** -11, 1 + 3 * 2 ** -11, 3.4028235e38, 1e-40]
    got = dt.tfloat32.round(torch.tensor(vals, dtype=torch.float32)).tolist()
    for v, g in zip(vals, got):
        v32 = struct.unpack("f", struct.pack("f", v))[0]
        assert g == _rne_ieee(v32, 10, -126, (2 - 2 ** -10) * 2.0 ** 127), v


def test_float_to_int_rounds_even_and_saturates():
    x = torch.tensor([2.5, 3.5, -2.5, 300.0, -300.0, float("nan"), 127.4])
    assert dt.int8.round(x).tolist() == [2, 4, -2, 127, -128, 0, 127]
    assert dt.uint8.round(torch.tensor([-5.0, 255.6, 17.5])).tolist() == [0, 255, 18]


def test_int_to_int_wraps():
    x = torch.tensor([200, -129, 65535, 70000], dtype=torch.int64)
    assert dt.int8.round(x).tolist() == [-56, 127, -1, 112]
    assert dt.uint16.round(x).tolist() == [200, 65407, 65535, 4464]


def test_bool_is_nonzero():
    assert dt.bool_.round(torch.tensor([0.0, -2.0, 0.5])).tolist() == [0, 1, 1]

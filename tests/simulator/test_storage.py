"""Values are stored as their hardware bits: reinterpreting views (``view(dtype)``,
``ap(dtype=)``) see exactly the bits the other dtype wrote, and same-dtype copies move bits."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import NkiValidationError
from nki_kernels.simulator import dtypes as dt


def _e4m3_reference(code: int) -> float:
    """float8_e4m3 (IEEE-like, bias 7, max 240, inf at 0x78) decoded from first principles."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 7
    if e == 15:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * m / 8 * 2.0 ** -6
    return sign * (1 + m / 8) * 2.0 ** (e - 7)


def test_float8_e4m3_codes_decode_like_the_format_definition():
    codes = torch.arange(256, dtype=torch.uint8)
    got = dt.float8_e4m3.from_bits(codes).tolist()
    for c, g in enumerate(got):
        ref = _e4m3_reference(c)
        assert (math.isnan(ref) and math.isnan(g)) or g == ref, hex(c)


def test_float8_e4m3_encoding_round_trips_every_finite_code():
    codes = torch.tensor([c for c in range(256) if not math.isnan(_e4m3_reference(c))],
                         dtype=torch.uint8)
    values = dt.float8_e4m3.from_bits(codes)
    assert torch.equal(dt.float8_e4m3.to_bits(values), codes)


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16", "float8_e4m3fn",
                                  "float8_e5m2", "int8", "int16", "int32", "uint8", "uint16",
                                  "uint32", "bool_", "tfloat32", "float8_e4m3"])
def test_storage_is_the_dtypes_bits(name):
    d = dt.from_name(name)
    x = torch.randn(64) * 10 if d.is_float else torch.randint(-300, 300, (64,))
    bits = d.to_bits(x)
    assert bits.dtype == d.storage and bits.element_size() == d.itemsize
    assert torch.equal(d.from_bits(bits), d.round(x))


def test_view_reinterprets_fp32_bits_as_bytes_and_back(sim):
    _, nl, nisa = sim
    x = torch.randn(4, 8)
    t = nl.ndarray((4, 8), dtype=nl.float32)
    t.dtype.assign(t._data, x)
    b = t.view(nl.uint8)
    assert b.shape == (4, 32) and b.dtype == nl.uint8
    ref = torch.tensor(list(struct.pack("<32f", *x.reshape(-1).tolist())), dtype=torch.int64)
    assert torch.equal(b.values().reshape(-1), ref)
    back = b.view(nl.float32)
    assert back.shape == (4, 8) and torch.equal(back.values(), x)


def test_writes_through_one_dtype_are_read_bit_exactly_through_another(sim):
    _, nl, nisa = sim
    t = nl.ndarray((2, 4), dtype=nl.int32)
    as_f = t.view(nl.float32)
    nisa.memset(as_f, 1.5)  # the int32 view must see 1.5's IEEE bits
    assert (t.values() == 0x3FC00000).all()
    bf = t.view(nl.bfloat16)  # each int32 = two bf16 halves (little endian): 0x0000, 0x3FC0
    assert bf.shape == (2, 8)
    assert bf.values()[:, 1::2].eq(1.5).all() and bf.values()[:, 0::2].eq(0.0).all()


def test_same_dtype_copies_move_nan_payloads_unchanged(sim):
    _, nl, nisa = sim
    src = nl.ndarray((2, 4), dtype=nl.bfloat16)
    raw = torch.tensor([[0x7FC1, 0x7F81, -0x7F, 0x0001]] * 2, dtype=torch.int16)
    src._data.copy_(raw.view(torch.bfloat16))
    dst = nl.ndarray((2, 4), dtype=nl.bfloat16)
    nisa.tensor_copy(dst, src)
    assert torch.equal(dst._data.view(torch.int16), raw)
    hbm = nl.ndarray((2, 4), dtype=nl.bfloat16, buffer=nl.hbm)
    nisa.dma_copy(hbm, dst)
    assert torch.equal(hbm._data.view(torch.int16), raw)


def test_ap_dtype_reinterprets_as_the_deep_dive_example(sim):
    # nki-aps deep dive: int32 (128, 256) seen as bf16 through [[512, 128], [1, 512]]
    _, nl, nisa = sim
    t = nl.ndarray((128, 256), dtype=nl.int32)
    ints = torch.randint(-2 ** 31, 2 ** 31 - 1, (128, 256), dtype=torch.int64)
    t.dtype.assign(t._data, ints)
    v = t.ap(pattern=[[512, 128], [1, 512]], offset=0, dtype=nl.bfloat16)
    assert v.shape == (128, 512) and v.dtype == nl.bfloat16
    ref = ints.to(torch.int32).view(torch.int16)  # random bits: NaNs too, so compare bits
    assert torch.equal(v._data.contiguous().view(torch.int16), ref)


@pytest.mark.parametrize("shape, strides_key, new, message", [
    ((4, 6), "col", "float32", "must be contiguous"),
    ((4, 3), None, "float32", "not a multiple of 4"),
])
def test_view_rules(sim, shape, strides_key, new, message):
    _, nl, _ = sim
    t = nl.ndarray(shape, dtype=nl.bfloat16)
    if strides_key == "col":
        t = t[:, 0:6:2]
    with pytest.raises(NkiValidationError, match=message):
        t.view(getattr(nl, new))


def test_packed_mx_types_move_as_bits_and_refuse_values(sim):
    _, nl, nisa = sim
    u = nl.ndarray((4, 8), dtype=nl.uint8)
    u.dtype.assign(u._data, torch.arange(32).reshape(4, 8))
    x4 = u.view(nl.float8_e4m3fn_x4)
    assert x4.shape == (4, 2)
    copy = nl.ndarray((4, 2), dtype=nl.float8_e4m3fn_x4)
    nisa.tensor_copy(copy, x4)
    assert torch.equal(copy.view(nl.uint8).values(), u.values())
    with pytest.raises(simulator.UnsupportedError, match="packs four values"):
        nisa.tensor_scalar(copy, x4, nl.add, 1.0)
    # dropout keeps the bits of what it keeps, but a packed word is four values, not one
    with pytest.raises(simulator.UnsupportedError, match="packs four values"):
        nisa.dropout(copy, x4, 0.0)


def test_host_outputs_keep_the_bits():
    def kernel(x):
        import nki.isa as nisa
        import nki.language as nl

        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype)
        nisa.dma_copy(t, x)
        nisa.dma_copy(out, t)
        return out

    x = (torch.randn(8, 16) * 100).to(torch.float8_e5m2)
    out = simulator.run(kernel, x).outputs
    assert out.dtype == torch.float8_e5m2
    assert torch.equal(out.view(torch.uint8), x.view(torch.uint8))

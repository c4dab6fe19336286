"""NKI data types (beta 2: ``nl.float32``, ``nl.bfloat16``, ...) and their rounding.

A dtype is a ``str`` subclass (beta-2 dtypes are names: ``nl.float32 == "float32"``)
carrying what the simulator needs: ``itemsize``, ``is_float``, value range, and
``round(t)``: a torch tensor of exact values (fp32 or int64) -> the values this dtype can
hold, in the simulator's storage format.

Storage format: every float dtype is stored as torch.float32 holding values already
rounded to the dtype; every integer dtype and ``bool_`` as torch.int64 holding values
already in range.

Rounding rules (the hardware's are not all documented; what is assumed is said here):
* floats: round-to-nearest-even. bf16/fp16/float8_e5m2/float8_e4m3fn through torch casts
  (so overflow gives inf for bf16/fp16/e5m2 and saturates to +-448 for e4m3fn, as
  torch's casts do);
  float8_e4m3 (IEEE-like, bias 7, max 240, has inf) and tfloat32 (8-bit exponent,
  10-bit mantissa) by our own RNE arithmetic.
* float -> integer: round-to-nearest-even, then SATURATE to the integer range, NaN -> 0
  (the docs say only "cast"; saturation is the assumption, the official numpy simulator
  would wrap). bool_: nonzero -> 1.
* integer -> narrower integer: WRAP (two's complement bit truncation), since the docs say
  integer/bitvec operations treat elements "as bit patterns without any data type casting".
"""

from __future__ import annotations

import math

import torch

_NAN = float("nan")


class NkiDType(str):
    """One NKI dtype. Compares equal to its beta-2 name (``nl.float32 == "float32"``)."""

    itemsize: int
    is_float: bool
    is_int: bool
    signed: bool
    bits: int
    min: float
    max: float
    torch_dtype: torch.dtype | None  # the native torch equivalent, if any
    storage: torch.dtype  # the simulator's storage dtype (float32 or int64)

    def __new__(cls, name, itemsize, kind, signed, minimum, maximum, torch_dtype, rounder):
        self = str.__new__(cls, name)
        self.itemsize = itemsize
        self.is_float = kind == "f"
        self.is_int = kind in ("i", "b")
        self.is_bool = kind == "b"
        self.signed = signed
        self.bits = itemsize * 8
        self.min = minimum
        self.max = maximum
        self.torch_dtype = torch_dtype
        self.storage = torch.float32 if self.is_float else torch.int64
        self._round = rounder
        return self

    @property
    def name(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"nl.{str.__str__(self)}"

    def __reduce__(self):
        return (from_name, (str.__str__(self),))

    def round(self, t: torch.Tensor) -> torch.Tensor:
        """Values of ``t`` (fp32/fp64 or integer) as this dtype holds them, in storage format."""
        return self._round(t)

    # str subclasses hash/compare by value, which is what we want: nl.float32 == "float32".
    __hash__ = str.__hash__


# ----------------------------------------------------------------------------- rounding


def _as_f32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.to(torch.float32)


def _round_f32(t):
    return _as_f32(t)


def _via(torch_dtype):
    def rounder(t):
        return _as_f32(t).to(torch_dtype).to(torch.float32)
    return rounder


def _round_tf32(t):
    # RNE on the bit pattern: keep 10 of fp32's 23 mantissa bits. Carries propagate into
    # the exponent, so the largest values round to inf exactly as IEEE RNE does.
    x = _as_f32(t).contiguous()
    bits = x.view(torch.int32)
    lsb = (bits >> 13) & 1
    rounded = (bits + (0xFFF + lsb)) & ~0x1FFF
    out = rounded.view(torch.float32)
    return torch.where(torch.isfinite(x), out, x)


def _make_ieee_rounder(mant_bits: int, emin: int, maxval: float):
    """RNE to a small IEEE-like format (subnormals below 2**emin, overflow -> inf)."""

    def rounder(t):
        x = _as_f32(t)
        a = x.abs()
        _, e = torch.frexp(a)  # a = m * 2**e, m in [0.5, 1)  ->  floor(log2 a) = e - 1
        e = torch.clamp(e - 1, min=emin)
        q = torch.ldexp(torch.ones_like(a), e - mant_bits)  # the quantum at a's binade
        r = torch.round(a / q) * q  # torch.round is half-to-even
        r = torch.where(r > maxval, torch.full_like(r, math.inf), r)
        out = torch.copysign(r, x)
        return torch.where(torch.isfinite(x), out, x)

    return rounder


def _make_int_rounder(bits: int, signed: bool):
    lo = -(1 << (bits - 1)) if signed else 0
    hi = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
    mask = (1 << bits) - 1
    off = 1 << (bits - 1)

    def rounder(t):
        if t.is_floating_point():
            # float -> int: RNE, saturate, NaN -> 0 (see module docstring).
            r = torch.round(t.to(torch.float64))
            r = torch.nan_to_num(r, nan=0.0).clamp_(lo, hi)
            return r.to(torch.int64)
        x = t.to(torch.int64)
        if bits >= 64:
            return x
        if signed:  # int -> int: wrap (bit truncation)
            return ((x + off) & mask) - off
        return x & mask

    return rounder


def _round_bool(t):
    return (t != 0).to(torch.int64)


_F32_MAX = 3.4028234663852886e38

# name: (itemsize, kind, signed, min, max, torch dtype, rounder)
_TABLE = {
    "float32": (4, "f", True, -_F32_MAX, _F32_MAX, torch.float32, _round_f32),
    "tfloat32": (4, "f", True, -_F32_MAX, _F32_MAX, None, _round_tf32),
    "bfloat16": (2, "f", True, -3.3895313892515355e38, 3.3895313892515355e38, torch.bfloat16,
                 _via(torch.bfloat16)),
    "float16": (2, "f", True, -65504.0, 65504.0, torch.float16, _via(torch.float16)),
    "float8_e4m3": (1, "f", True, -240.0, 240.0, None, _make_ieee_rounder(3, -6, 240.0)),
    "float8_e4m3fn": (1, "f", True, -448.0, 448.0, torch.float8_e4m3fn, _via(torch.float8_e4m3fn)),
    "float8_e5m2": (1, "f", True, -57344.0, 57344.0, torch.float8_e5m2, _via(torch.float8_e5m2)),
    "int8": (1, "i", True, -128, 127, torch.int8, _make_int_rounder(8, True)),
    "int16": (2, "i", True, -(1 << 15), (1 << 15) - 1, torch.int16, _make_int_rounder(16, True)),
    "int32": (4, "i", True, -(1 << 31), (1 << 31) - 1, torch.int32, _make_int_rounder(32, True)),
    "uint8": (1, "i", False, 0, 255, torch.uint8, _make_int_rounder(8, False)),
    "uint16": (2, "i", False, 0, (1 << 16) - 1, torch.uint16, _make_int_rounder(16, False)),
    "uint32": (4, "i", False, 0, (1 << 32) - 1, torch.uint32, _make_int_rounder(32, False)),
    "bool_": (1, "b", False, 0, 1, torch.bool, _round_bool),
}

_BY_NAME: dict[str, NkiDType] = {
    name: NkiDType(name, *spec) for name, spec in _TABLE.items()
}

float32 = _BY_NAME["float32"]
tfloat32 = _BY_NAME["tfloat32"]
bfloat16 = _BY_NAME["bfloat16"]
float16 = _BY_NAME["float16"]
float8_e4m3 = _BY_NAME["float8_e4m3"]
float8_e4m3fn = _BY_NAME["float8_e4m3fn"]
float8_e5m2 = _BY_NAME["float8_e5m2"]
int8 = _BY_NAME["int8"]
int16 = _BY_NAME["int16"]
int32 = _BY_NAME["int32"]
uint8 = _BY_NAME["uint8"]
uint16 = _BY_NAME["uint16"]
uint32 = _BY_NAME["uint32"]
bool_ = _BY_NAME["bool_"]

ALL = tuple(_BY_NAME.values())

# Aliases accepted by name (numpy/torch spellings).
_ALIASES = {
    "float": "float32", "fp32": "float32", "f32": "float32",
    "bf16": "bfloat16", "half": "float16", "fp16": "float16", "f16": "float16",
    "tf32": "tfloat32", "bool": "bool_",
    "float8_e4m3fnuz": None, "float8_e5m2fnuz": None,
}

_FROM_TORCH = {
    torch.float32: float32, torch.bfloat16: bfloat16, torch.float16: float16,
    torch.float8_e4m3fn: float8_e4m3fn, torch.float8_e5m2: float8_e5m2,
    torch.int8: int8, torch.int16: int16, torch.int32: int32,
    torch.uint8: uint8, torch.uint16: uint16, torch.uint32: uint32, torch.bool: bool_,
}

# Converting outputs: dtypes torch/numpy cannot hold natively come back as float32.
_TO_NUMPY_NAME = {
    "float32": "float32", "float16": "float16", "int8": "int8", "int16": "int16",
    "int32": "int32", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "bool_": "bool",
}


def from_name(name: str) -> NkiDType:
    return _BY_NAME[name]


def to_nki(dtype) -> NkiDType:
    """Accept an NKI dtype, a torch dtype, a numpy dtype/type, or a dtype name."""
    if isinstance(dtype, NkiDType):
        return dtype
    if isinstance(dtype, torch.dtype):
        try:
            return _FROM_TORCH[dtype]
        except KeyError:
            raise TypeError(f"torch dtype {dtype} has no NKI equivalent; supported: "
                            f"{', '.join(str(d) for d in _FROM_TORCH)}") from None
    if isinstance(dtype, str):
        name = _ALIASES.get(dtype, dtype)
        if name in _BY_NAME:
            return _BY_NAME[name]
        raise TypeError(f"dtype {dtype!r} is not an NKI dtype; expected one of "
                        f"{', '.join(_BY_NAME)}")
    # numpy dtypes / scalar types (np.float32, np.dtype('float16'), ml_dtypes.bfloat16, ...)
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None)
    if name is None and hasattr(dtype, "dtype"):
        name = getattr(dtype.dtype, "name", None)
    if isinstance(name, str):
        if name == "float64":
            raise TypeError("dtype float64 is not an NKI dtype (NKI has no 64-bit types)")
        name = _ALIASES.get(name, name)
        if name in _BY_NAME:
            return _BY_NAME[name]
    raise TypeError(f"dtype {dtype!r} is not an NKI dtype; expected one of {', '.join(_BY_NAME)}")


def torch_output_dtype(dt: NkiDType) -> torch.dtype:
    """The torch dtype a kernel output of NKI dtype ``dt`` is returned in."""
    return dt.torch_dtype if dt.torch_dtype is not None else torch.float32


def numpy_output_dtype(dt: NkiDType):
    """The numpy dtype for an output (bf16/fp8/tf32 come back as float32; numpy lacks them)."""
    import numpy as np  # lazy: only when the caller passed numpy arrays

    return np.dtype(_TO_NUMPY_NAME.get(dt.name, "float32"))

"""NKI data types (beta 2: ``nl.float32``, ``nl.bfloat16``, ...) and their rounding.

A dtype is a ``str`` subclass (beta-2 dtypes are names: ``nl.float32 == "float32"``)
carrying what the simulator needs: ``itemsize``, ``is_float``, value range, and the
conversions between values and bits.

Storage: simulator memory holds every tensor as its hardware BITS, in a torch tensor of
the dtype's ``storage`` type (float32, bfloat16, float16, float8_e4m3fn, float8_e5m2,
float8_e8m0fnu and the integers natively; float8_e4m3 and bool_ as uint8 codes;
tfloat32 as the float32 whose low 13 mantissa bits are zero; the packed MX x4 types as
uint32/uint16 words). So a reinterpreting view (``t.view(dtype)``, ``t.ap(dtype=)``) and
two tensors placed at one address see each other's bits exactly, as on hardware.
Instructions compute on decoded values: ``from_bits`` gives float32 for floats and int64
for integers; ``to_bits`` encodes values; ``assign`` rounds values once into a bits view;
``round`` = from_bits(to_bits). (Not ``encode``/``decode``: a dtype is a ``str``, and those
names are ``str``'s.)

Rounding rules (the hardware's are not all documented; what is assumed is said here):
* floats: round-to-nearest-even. bf16/fp16/float8_e5m2/float8_e4m3fn through torch casts
  (so overflow gives inf for bf16/fp16/e5m2 and saturates to +-448 for e4m3fn, as
  torch's casts do);
  float8_e4m3 (IEEE-like, bias 7, max 240, has inf) and tfloat32 (8-bit exponent,
  10-bit mantissa) by our own RNE arithmetic.
* float -> integer: round-to-nearest-even, then SATURATE to the integer range, NaN -> 0
  (the docs say only "cast"; saturation is the assumption, the official numpy simulator
  would wrap). bool_: nonzero -> 1.
* integer -> narrower integer, when ``to_bits`` encodes an integer instruction's result:
  WRAP (two's complement bit truncation), since the docs say integer/bitvec operations
  treat elements "as bit patterns without any data type casting". A copy from one dtype to
  another (dma_copy, tensor_copy, an indirect DMA) goes through fp32 instead
  (operands.convert_bits), so an integer narrowed by a copy SATURATES (int32 300 -> int8
  127; docs/simulator.md "Casts").
"""

from __future__ import annotations

import math

import torch

from .errors import UnsupportedError

_NAN = float("nan")


class NkiDType(str):
    """One NKI dtype. Compares equal to its beta-2 name (``nl.float32 == "float32"``)."""

    itemsize: int
    is_float: bool
    is_int: bool
    is_packed: bool  # the MX x4 types: bits only, an element has no single value
    signed: bool
    bits: int
    min: float
    max: float
    torch_dtype: torch.dtype | None  # the native torch equivalent, if any
    storage: torch.dtype  # torch dtype of the bits held in simulator memory
    compute: torch.dtype  # decoded values: float32 (floats) or int64 (integers, bool_)

    def __new__(cls, name, itemsize, kind, signed, minimum, maximum, torch_dtype, rounder,
                storage=None):
        self = str.__new__(cls, name)
        self.itemsize = itemsize
        self.is_float = kind == "f"
        self.is_int = kind in ("i", "b")
        self.is_bool = kind == "b"
        self.is_packed = kind == "x"
        self.signed = signed
        self.bits = itemsize * 8
        self.min = minimum
        self.max = maximum
        self.torch_dtype = torch_dtype
        self.storage = storage or torch_dtype
        self.compute = torch.float32 if kind in ("f", "x") else torch.int64
        self._round = rounder
        # the cast torch's copy_ makes from fp32 into the storage IS this dtype's rounding
        self._copy_rounds = kind == "f" and self.storage == torch_dtype
        return self

    @property
    def name(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"nl.{str.__str__(self)}"

    def __reduce__(self):
        return (from_name, (str.__str__(self),))

    def round(self, t: torch.Tensor) -> torch.Tensor:
        """Values of ``t`` (fp32/fp64 or integer) as this dtype holds them, decoded
        (float32 for floats, int64 for integers)."""
        return self.from_bits(self.to_bits(t))

    def to_bits(self, t: torch.Tensor) -> torch.Tensor:
        """Values (fp32/fp64 or integer) -> this dtype's bits, as a ``storage`` tensor."""
        if self.is_packed:
            raise UnsupportedError(f"{self.name} packs four values per element; it has no "
                                   "element value to encode (write it by bits: a same-dtype "
                                   "copy, or quantize_mx)")
        return _ENCODERS.get(self.name, _encode_plain)(self, t)

    def from_bits(self, raw: torch.Tensor) -> torch.Tensor:
        """This dtype's bits (a ``storage`` tensor) -> values: float32 or int64."""
        if self.is_packed:
            raise UnsupportedError(f"{self.name} packs four values per element; an "
                                   "instruction cannot read it as values (only nc_matmul_mx "
                                   "and same-dtype copies take it)")
        if raw.dtype == self.compute:
            return raw
        dec = _DECODERS.get(self.name)
        return dec(raw) if dec is not None else raw.to(self.compute)

    def assign(self, dst: torch.Tensor, values: torch.Tensor) -> None:
        """Write ``values`` (fp32/fp64 or integer; broadcastable) into ``dst``, a view of
        this dtype's bits, rounding once."""
        if self._copy_rounds:
            dst.copy_(_as_f32(values))
        else:
            dst.copy_(self.to_bits(values))

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


def invalid_bits(dt, bits: torch.Tensor) -> str:
    """What in ``bits`` (a ``dt.storage`` tensor) is not a bit pattern of ``dt``, or "". Only
    dtypes stored in a wider code than they use have such patterns: tfloat32 (fp32 with the
    low 13 mantissa bits zero) and bool_ (uint8 codes 0 and 1)."""
    if dt.name == "tfloat32":
        n = int(((bits.view(torch.int32) & 0x1FFF) != 0).sum())
        return f"{n} float32 values with low mantissa bits set: not tfloat32 values" if n else ""
    if dt.name == "bool_":
        n = int((bits > 1).sum())
        return f"{n} uint8 codes other than 0 and 1: not bool_ values" if n else ""
    return ""


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
_E8M0_MAX = 2.0 ** 127

# name: (itemsize, kind, signed, min, max, torch dtype, rounder[, storage])
# kind: f float, i integer, b bool, x packed (four MX values per element: bits only).
# storage: the torch dtype holding the bits, when the dtype has no torch equivalent.
_TABLE = {
    "float32": (4, "f", True, -_F32_MAX, _F32_MAX, torch.float32, _round_f32),
    "tfloat32": (4, "f", True, -_F32_MAX, _F32_MAX, None, _round_tf32, torch.float32),
    "bfloat16": (2, "f", True, -3.3895313892515355e38, 3.3895313892515355e38, torch.bfloat16,
                 _via(torch.bfloat16)),
    "float16": (2, "f", True, -65504.0, 65504.0, torch.float16, _via(torch.float16)),
    "float8_e4m3": (1, "f", True, -240.0, 240.0, None, _make_ieee_rounder(3, -6, 240.0),
                    torch.uint8),
    "float8_e4m3fn": (1, "f", True, -448.0, 448.0, torch.float8_e4m3fn, _via(torch.float8_e4m3fn)),
    "float8_e5m2": (1, "f", True, -57344.0, 57344.0, torch.float8_e5m2, _via(torch.float8_e5m2)),
    # MX scale (OCP MX v1.0): an unsigned power of two 2^-127..2^127, NaN = 0xFF
    "float8_e8m0fnu": (1, "f", False, 2.0 ** -127, _E8M0_MAX, torch.float8_e8m0fnu,
                       _via(torch.float8_e8m0fnu)),
    "int8": (1, "i", True, -128, 127, torch.int8, _make_int_rounder(8, True)),
    "int16": (2, "i", True, -(1 << 15), (1 << 15) - 1, torch.int16, _make_int_rounder(16, True)),
    "int32": (4, "i", True, -(1 << 31), (1 << 31) - 1, torch.int32, _make_int_rounder(32, True)),
    "uint8": (1, "i", False, 0, 255, torch.uint8, _make_int_rounder(8, False)),
    "uint16": (2, "i", False, 0, (1 << 16) - 1, torch.uint16, _make_int_rounder(16, False)),
    "uint32": (4, "i", False, 0, (1 << 32) - 1, torch.uint32, _make_int_rounder(32, False)),
    "bool_": (1, "b", False, 0, 1, torch.bool, _round_bool, torch.uint8),
    # MX packed types (nki.language docs: "4x packed float8_e5m2 elements ..."; the MX
    # deep dive: "The float8_*_x4 types are 32-bits wide ... The float4_*_x4 type is 16-bits
    # wide and physically contains four float4 elements").
    "float8_e5m2_x4": (4, "x", True, 0, 0, None, None, torch.uint32),
    "float8_e4m3fn_x4": (4, "x", True, 0, 0, None, None, torch.uint32),
    "float4_e2m1fn_x4": (2, "x", True, 0, 0, None, None, torch.uint16),
}

_BY_NAME: dict[str, NkiDType] = {
    name: NkiDType(name, *spec) for name, spec in _TABLE.items()
}


# ----------------------------------------------------------------------------- bits
def _encode_plain(dt: NkiDType, t: torch.Tensor) -> torch.Tensor:
    if dt.is_float and dt.storage == dt.torch_dtype:
        return _as_f32(t).to(dt.storage)  # torch's cast is the rounding (see _via)
    return dt._round(t).to(dt.storage)


def _e4m3_table() -> torch.Tensor:
    """The 256 float8_e4m3 codes decoded (IEEE-like: bias 7, subnormals, 0x78 = inf,
    0x79..0x7F NaN; the sign is bit 7)."""
    vals = []
    for code in range(128):
        e, m = code >> 3, code & 7
        if e == 15:
            vals.append(math.inf if m == 0 else _NAN)
        elif e == 0:
            vals.append(m / 8 * 2.0 ** -6)
        else:
            vals.append((1 + m / 8) * 2.0 ** (e - 7))
    pos = torch.tensor(vals, dtype=torch.float32)
    return torch.cat([pos, -pos])


_E4M3_DECODE = _e4m3_table()
_E4M3_POS = _E4M3_DECODE[:0x79]  # 0 .. 240, inf: ascending, searchable


def _encode_e4m3(dt: NkiDType, t: torch.Tensor) -> torch.Tensor:
    r = dt._round(t)  # exact e4m3 values (or +-inf / NaN)
    a = r.abs()
    code = torch.searchsorted(_E4M3_POS, a.contiguous()).clamp_(max=0x78)
    code = torch.where(torch.isnan(r), torch.full_like(code, 0x7F), code)
    code = code | (torch.signbit(r).to(torch.int64) << 7)
    return code.to(torch.uint8)


def _decode_e4m3(raw: torch.Tensor) -> torch.Tensor:
    return _E4M3_DECODE[raw.to(torch.int64)]


_ENCODERS = {"float8_e4m3": _encode_e4m3}
_DECODERS = {"float8_e4m3": _decode_e4m3}

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
float8_e8m0fnu = _BY_NAME["float8_e8m0fnu"]
float8_e5m2_x4 = _BY_NAME["float8_e5m2_x4"]
float8_e4m3fn_x4 = _BY_NAME["float8_e4m3fn_x4"]
float4_e2m1fn_x4 = _BY_NAME["float4_e2m1fn_x4"]

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
    torch.float8_e8m0fnu: float8_e8m0fnu,
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

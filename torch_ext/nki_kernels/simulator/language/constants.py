"""``nki.language`` dtypes, buffers, buffer predicates, ``NKIObject`` and ``tile_size``."""

from __future__ import annotations

from .. import dtypes as _dt
from ..context import current
from ..memory import MemoryRegion, kind_of, to_region

# ------------------------------------------------------------------ dtypes
bool_ = _dt.bool_
int8, int16, int32 = _dt.int8, _dt.int16, _dt.int32
uint8, uint16, uint32 = _dt.uint8, _dt.uint16, _dt.uint32
float16, float32, bfloat16, tfloat32 = _dt.float16, _dt.float32, _dt.bfloat16, _dt.tfloat32
float8_e4m3, float8_e4m3fn, float8_e5m2 = _dt.float8_e4m3, _dt.float8_e4m3fn, _dt.float8_e5m2
fp32, fp16, bf16 = float32, float16, bfloat16  # short aliases; nl.fp32.min == -3.4028235e38
DType = str
# Packed / MX dtypes: the names exist, the simulator cannot allocate them.
float8_e5m2_x4 = "float8_e5m2_x4"
float8_e4m3fn_x4 = "float8_e4m3fn_x4"
float8_e8m0fnu = "float8_e8m0fnu"
float4_e2m1fn_x4 = "float4_e2m1fn_x4"

# ------------------------------------------------------------------ buffers
sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
shared_hbm = MemoryRegion.shared_hbm
hbm = private_hbm  # "HBM - Alias of private_hbm"


class NKIObject:
    """Base class for NKI kernel dataclasses and configuration objects.

    NKI classes behave like data classes with or without ``@dataclass`` (NKI language guide,
    "Class Support": "The @dataclass decorator is optional ... The compiler will create the
    initializer functions __init__ and __post_init__, if they are not provided by the
    user", e.g. ``def __init__(self, x = None, y = False)``). So a subclass that neither
    defines ``__init__`` nor inherits one from another NKI class gets that initializer over
    its fields: annotated names and plain (non-callable) class attributes, base classes
    first; a field without a default defaults to None; positional or keyword arguments;
    then ``__post_init__`` if defined. Keyword arguments that name no field become
    attributes (``NKIObject.__init__(**kwargs)``). Equality follows standard Python (NKI
    0.7: "Kernels that use == on user-defined classes can behave differently").
    """

    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            setattr(self, k, v)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            return
        for klass in cls.__mro__[1:]:
            if klass is NKIObject:
                break
            init = klass.__dict__.get("__init__")
            if init is not None and not getattr(init, "_nki_default", False):
                return  # a user __init__ up the hierarchy: inherited, as in Python
        cls.__init__ = _nki_default_init


def _nki_fields(cls) -> list[str]:
    import dataclasses

    names: list[str] = []
    for klass in reversed(cls.__mro__):
        if klass is object or klass is NKIObject:
            continue
        annotated = list((klass.__dict__.get("__annotations__") or {}).keys())
        plain = [n for n, v in klass.__dict__.items()
                 if not n.startswith("__") and n not in annotated
                 and (isinstance(v, dataclasses.Field) or not (
                     callable(v) or isinstance(v, (property, staticmethod, classmethod))))]
        for n in annotated + plain:
            if n not in names and not n.startswith("__"):
                names.append(n)
    return names


def _field_default(cls, name):
    import dataclasses

    value = getattr(cls, name, None)
    if isinstance(value, dataclasses.Field):
        if value.default_factory is not dataclasses.MISSING:
            return value.default_factory()
        return None if value.default is dataclasses.MISSING else value.default
    dc_fields = getattr(cls, "__dataclass_fields__", {})
    f = dc_fields.get(name)
    if f is not None and f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return value


def _nki_default_init(self, *args, **kwargs):
    cls = type(self)
    fields = _nki_fields(cls)
    if len(args) > len(fields):
        raise TypeError(f"{cls.__name__}() takes {len(fields)} positional arguments (its fields "
                        f"{', '.join(fields)}) but {len(args)} were given")
    put = object.__setattr__  # also for frozen dataclasses
    for name, value in zip(fields, args):
        if name in kwargs:
            raise TypeError(f"{cls.__name__}() got multiple values for argument {name!r}")
        put(self, name, value)
    for name in fields[len(args):]:
        put(self, name, kwargs.pop(name) if name in kwargs else _field_default(cls, name))
    for name, value in kwargs.items():
        put(self, name, value)
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


_nki_default_init._nki_default = True


def is_hbm(buffer):
    return kind_of(to_region(buffer)) == "hbm"


def is_on_chip(buffer):
    return kind_of(to_region(buffer)) != "hbm"


def is_psum(buffer):
    return to_region(buffer) is MemoryRegion.psum


def is_sbuf(buffer):
    return to_region(buffer) is MemoryRegion.sbuf


_FP32_BYTES = 4  # the "_fmax" sizes count fp32 elements


class _TileSize(NKIObject):
    """Hardware tile size constants of the active target (hardware.py)."""

    @property
    def pmax(self) -> int:
        return current().target.partitions

    @property
    def psum_bank_fmax(self) -> int:
        return current().target.psum_bank_bytes // _FP32_BYTES

    @property
    def psum_bank_fmax_bytes(self) -> int:
        return current().target.psum_bank_bytes

    @property
    def psum_fmax(self) -> int:
        # Deprecated name of psum_bank_fmax (NKI docs: "Maximum free dimension per PSUM bank
        # per partition, in FP32 elements"): one bank, 512 fp32; nki-library asserts that it
        # equals gemm_moving_fmax.
        return current().target.psum_bank_bytes // _FP32_BYTES

    @property
    def gemm_stationary_fmax(self) -> int:
        return current().target.matmul_columns

    @property
    def gemm_moving_fmax(self) -> int:
        # One PSUM bank of fp32, the moving limit of nc_matmul up to NeuronCore-v3 (trn3's
        # nc_matmul accepts more: Target.matmul_moving_fmax).
        return current().target.psum_bank_bytes // _FP32_BYTES

    @property
    def bn_stats_fmax(self) -> int:
        return current().target.bn_stats_fmax

    @property
    def psum_num_banks(self) -> int:
        return current().target.psum_banks

    @property
    def sbuf_size_bytes(self) -> int:
        t = current().target
        return t.partitions * t.sbuf_bytes_per_partition

    @property
    def sbuf_fmax_bytes(self) -> int:
        return current().target.sbuf_bytes_per_partition

    @property
    def sbuf_fmax(self) -> int:
        return current().target.sbuf_bytes_per_partition // _FP32_BYTES

    @property
    def total_available_sbuf_size(self) -> int:
        return current().target.sbuf_bytes_per_partition


tile_size = _TileSize()

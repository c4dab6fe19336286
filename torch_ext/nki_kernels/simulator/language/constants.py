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
    """Base class for NKI kernel dataclasses and configuration objects."""

    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            setattr(self, k, v)


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
        # deprecated name; see Target.tile_size_psum_fmax for the value's status
        return current().target.tile_size_psum_fmax

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

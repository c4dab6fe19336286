"""``nki.language`` (beta 2): dtypes, buffers, allocation, DMA helpers, loops, grid queries
and the convenience ops (``nl.add``, ``nl.exp``, ``nl.sum``, ``nl.matmul``...).

Every convenience op returns a NEW tile (SBUF unless said otherwise) and is executed as
the ISA instruction(s) it lowers to (recorded in the trace as such): elementwise unary
math -> ``activation`` (ScalarE), binary ops -> ``tensor_tensor`` or ``tensor_scalar``
(VectorE), reductions -> ``tensor_reduce``, ``nl.matmul`` -> ``nc_matmul`` (PSUM result),
``nl.load``/``nl.store`` -> ``dma_copy``. Beta 2 has no ``mask=`` argument.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import operator

import torch

from . import dtypes as _dt
from . import isa as _isa
from . import ops as _ops
from .isa import operands as _engine
from .isa.alu import reduce_axes
from .isa.operands import f32, free_elems, record
from .context import current
from .errors import NkiValidationError, UnsupportedError
from .host import numpy_to_torch
from .memory import MemoryRegion, kind_of, to_region
from .ops import (Op, abs, abs_max, abs_min, add, all, arctan, average, bitwise_and,  # noqa: F401,A004
                  bitwise_or, bitwise_xor, bypass, ceil, copy, cos, divide, equal, erf, erf_dx,
                  exp, floor, fmod, gelu, gelu_apprx_sigmoid, gelu_apprx_sigmoid_dx,
                  gelu_apprx_tanh, gelu_dx, greater, greater_equal, invert, left_shift, less,
                  less_equal, log, logical_and, logical_not, logical_or, logical_xor, max,
                  maximum, mean, min, minimum, mish, mod, multiply, negative, not_equal, power,
                  prelu, prod, reciprocal, relu, right_shift, rsqrt, sigmoid, sign, silu,
                  silu_dx, sin, softplus, sqrt, square, subtract, sum, tan, tanh, trunc, var)
from .tensor import DynamicSlice, NkiTensor, allocate, from_torch

# The nki.language surface (modules.py builds the module from this list).
__all__ = [
    "DType", "MemoryRegion", "NKIObject", "NkiTensor", "abs", "abs_max", "abs_min", "add",
    "affine_range", "all", "arctan", "average", "bf16", "bfloat16", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bool_", "broadcast_to", "bypass", "ceil", "copy", "cos",
    "device_print", "divide", "dropout", "ds", "dynamic_range", "empty_like", "equal",
    "erf", "erf_dx", "exp", "expand_dims", "float16", "float32", "float4_e2m1fn_x4",
    "float8_e4m3", "float8_e4m3fn", "float8_e4m3fn_x4", "float8_e5m2", "float8_e5m2_x4",
    "float8_e8m0fnu", "floor", "fmod", "fori_loop", "fp16", "fp32", "full",
    "gather_flattened", "gelu", "gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx",
    "gelu_apprx_tanh", "gelu_dx", "greater", "greater_equal", "hbm", "int16", "int32",
    "int8", "invert", "is_hbm", "is_on_chip", "is_psum", "is_sbuf", "left_shift", "less",
    "less_equal", "load", "load_transpose2d", "log", "logical_and", "logical_not",
    "logical_or", "logical_xor", "matmul", "max", "maximum", "mean", "min", "minimum",
    "mish", "mod", "multiply", "ndarray", "negative", "no_reorder", "not_equal",
    "num_programs", "ones", "power", "prelu", "private_hbm", "prod", "program_id",
    "program_ndim", "psum", "rand", "random_seed", "reciprocal", "relu", "right_shift",
    "rms_norm", "rsqrt", "sbuf", "sequential_range", "shared_constant", "shared_hbm",
    "shared_identity_matrix", "sigmoid", "sign", "silu", "silu_dx", "sin", "softmax",
    "softplus", "sqrt", "square", "static_range", "store", "subtract", "sum", "tan", "tanh",
    "tfloat32", "tile_size", "transpose", "trunc", "uint16", "uint32", "uint8", "var",
    "where", "while_loop", "zeros", "zeros_like",
]

_store = _engine.store  # the engine's round-once write (nl.store is the DMA helper)

# ------------------------------------------------------------------ dtypes
bool_ = _dt.bool_
int8, int16, int32 = _dt.int8, _dt.int16, _dt.int32
uint8, uint16, uint32 = _dt.uint8, _dt.uint16, _dt.uint32
float16, float32, bfloat16, tfloat32 = _dt.float16, _dt.float32, _dt.bfloat16, _dt.tfloat32
float8_e4m3, float8_e4m3fn, float8_e5m2 = _dt.float8_e4m3, _dt.float8_e4m3fn, _dt.float8_e5m2
fp32, fp16, bf16 = float32, float16, bfloat16  # short aliases; nl.fp32.min == -3.4028235e38
DType = str

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


class _TileSize(NKIObject):
    """Hardware tile size constants of the current target."""

    pmax = 128
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    psum_fmax = 2048  # deprecated name; the whole PSUM partition in fp32 elements
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512

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
        return current().target.sbuf_bytes_per_partition // 4

    @property
    def total_available_sbuf_size(self) -> int:
        return current().target.sbuf_bytes_per_partition


tile_size = _TileSize()


# ------------------------------------------------------------------ allocation


def ndarray(shape, dtype, buffer=sbuf, name="", address=None):
    """A new, uninitialised tensor (NaN / 4 poisoned) of ``shape`` on ``buffer``."""
    return allocate(_shape(shape), dtype, buffer, name)


def _shape(shape):
    if isinstance(shape, int):
        return (shape,)
    return tuple(operator.index(s) for s in shape)


def _filled(shape, value, dtype, buffer, name):
    t = allocate(_shape(shape), dtype, buffer, name)
    if t.on_chip:
        _isa.memset(t, value)
    else:  # HBM constants: filled directly, no instruction recorded
        t._data.fill_(value if t.dtype.is_float else int(value))
    return t


def zeros(shape, dtype, buffer=sbuf, name=""):
    return _filled(shape, 0, dtype, buffer, name)


def ones(shape, dtype, buffer=sbuf, name=""):
    return _filled(shape, 1, dtype, buffer, name)


def full(shape, fill_value, dtype, buffer=sbuf, name=""):
    return _filled(shape, fill_value, dtype, buffer, name)


def zeros_like(x, dtype=None, buffer=None, name=""):
    return zeros(x.shape, dtype or x.dtype, sbuf if buffer is None else buffer, name)


def empty_like(x, dtype=None, buffer=None, name=""):
    return ndarray(x.shape, dtype or x.dtype, x.buffer if buffer is None else buffer, name)


def rand(shape, dtype, buffer=sbuf, name=""):
    """Uniform [0, 1) values (from the run's generator; see nl.random_seed)."""
    t = allocate(_shape(shape), dtype, buffer, name)
    u = torch.rand(t._data.shape, generator=current().generator)
    _store("rand", t, u)
    if t.on_chip:
        record("rng", "vector", [], [("dst", t)], t._data.numel(), {})
    return t


def random_seed(seed):
    _isa.set_rng_seed(seed)


def shared_constant(constant):
    """A shared_hbm tensor holding ``constant`` (numpy array, torch tensor or .npy path)."""
    if isinstance(constant, str):
        import numpy as np  # lazy

        constant = np.load(constant)
    if isinstance(constant, torch.Tensor):
        data = constant.detach().cpu()
        dt = _dt.to_nki(data.dtype)
    else:
        dt = _dt.to_nki(constant.dtype)
        data = numpy_to_torch(constant)
    return from_torch(data, dt, shared_hbm, "shared_constant")


def shared_identity_matrix(n, dtype=uint8, dst=None):
    """An n x n identity matrix in SBUF."""
    n = operator.index(n)
    out = dst if dst is not None else allocate((n, n), dtype, sbuf, "identity")
    _store("shared_identity_matrix", out, torch.eye(n, dtype=torch.float32).reshape(out._data.shape))
    record("dma_copy", "dma", [], [("dst", out)], 0,
           {"bytes": n * n * out.dtype.itemsize, "src_bytes": n * n * out.dtype.itemsize,
            "direction": "hbm_to_sbuf", "constant": True})
    return out


# ------------------------------------------------------------------ indexing helpers


def ds(start, size):
    """Dynamic slice ``start:start+size`` for indexing."""
    return DynamicSlice(start, size)


# ------------------------------------------------------------------ loops (aliases of range)


def _range(start, stop=None, step=1):
    if stop is None:
        return range(operator.index(start))
    return range(operator.index(start), operator.index(stop), operator.index(step))


affine_range = _range
sequential_range = _range
static_range = _range
dynamic_range = _range


def fori_loop(lower, upper, body_fun, step=1):
    for i in range(operator.index(lower), operator.index(upper), operator.index(step)):
        body_fun(_isa.VirtualRegister(i))


def while_loop(init, body_fun):
    r = init
    while int(r) != 0:
        r = body_fun(r)


@contextlib.contextmanager
def no_reorder():
    yield  # the simulator executes in program order anyway


# ------------------------------------------------------------------ grid


def program_id(axis=0):
    if axis != 0:
        raise NkiValidationError(f"program_id: axis {axis}; beta-2 grids have only axis 0")
    return current().program_id


def num_programs(axes=0):
    if axes not in (0, None, (0,), [0]):
        raise NkiValidationError(f"num_programs: axes {axes}; beta-2 grids have only axis 0")
    return current().grid


def program_ndim():
    return 1 if current().bracketed else 0


def device_print(print_prefix, tensor):
    print(print_prefix, tensor._data.clone() if isinstance(tensor, NkiTensor) else tensor)


# ------------------------------------------------------------------ data movement


def load(src, dtype=None):
    """HBM -> new SBUF tile (one dma_copy)."""
    if not isinstance(src, NkiTensor) or src.on_chip:
        raise NkiValidationError(
            f"load: src must be an HBM tensor, got {src!r}; on-chip tiles are copied with nl.copy")
    shape = src.shape
    if len(shape) < 2:
        raise NkiValidationError(
            f"load: src shape {shape} would make a {len(shape)}-D SBUF tile; SBUF tiles need "
            "2 dims (partition, free): index or reshape the HBM tensor first")
    if shape[0] > current().target.partitions:
        raise NkiValidationError(
            f"load: src partition dim {shape[0]} exceeds maximum {current().target.partitions}")
    out = allocate(shape, dtype or src.dtype, sbuf, "load")
    _isa.dma_copy(out, src)
    return out


def store(dst, value):
    """SBUF tile -> HBM (one dma_copy)."""
    if not isinstance(dst, NkiTensor) or dst.on_chip:
        raise NkiValidationError(f"store: dst must be an HBM tensor, got {dst!r}")
    if not isinstance(value, NkiTensor):
        raise NkiValidationError(f"store: value must be an SBUF tile, got {type(value).__name__}")
    _isa.dma_copy(dst, value)


def load_transpose2d(src, dtype=None):
    """HBM [A, B] -> new SBUF tile [B, A] (one DMA transpose)."""
    if not isinstance(src, NkiTensor) or src.on_chip or src.ndim != 2:
        raise NkiValidationError(f"load_transpose2d: src must be a 2-D HBM tensor, got {src!r}")
    a, b = src.shape
    if b > current().target.partitions:
        raise NkiValidationError(
            f"load_transpose2d: transposed partition dim {b} exceeds maximum "
            f"{current().target.partitions}")
    out = allocate((b, a), src.dtype, sbuf, "load_transpose2d")
    _isa.dma_transpose(out, src)
    if dtype is not None and _dt.to_nki(dtype) != src.dtype:
        cast = allocate((b, a), dtype, sbuf, "load_transpose2d")
        _isa.tensor_copy(cast, out)
        return cast
    return out


# ------------------------------------------------------------------ elementwise convenience


def _tile(fn, x, role="x"):
    if not isinstance(x, NkiTensor):
        raise NkiValidationError(f"nl.{fn}: {role} must be a tile, got {type(x).__name__}")
    if not x.on_chip:
        raise NkiValidationError(
            f"nl.{fn}: {role} is in HBM; load it into SBUF first (nl.load / nisa.dma_copy)")
    return x


def _new(shape, dtype, name):
    return allocate(shape, dtype, sbuf, name)


def _unary(op: Op):
    if op.act is not None:
        def fn(x, dtype=None):
            _tile(op.name, x)
            out = _new(x.shape, dtype or x.dtype, op.name)
            _isa.activation(out, op, x)
            return out
    else:  # ALU-only unary ops run as a VectorE tensor_scalar
        def fn(x, dtype=None):
            _tile(op.name, x)
            out = _new(x.shape, dtype or x.dtype, op.name)
            _isa.tensor_scalar(out, x, op, None)
            return out
    fn.__name__ = op.name
    return fn


def _as_f32_column(name, t):
    if t.dtype.name == "float32":
        return t
    c = _new(t.shape, float32, name + "_operand")
    _isa.tensor_copy(c, t)
    return c


def _binary(op: Op):
    def fn(x, y, dtype=None):
        xt, yt = isinstance(x, NkiTensor), isinstance(y, NkiTensor)
        if not (xt or yt):
            raise NkiValidationError(f"nl.{op.name}: at least one of x, y must be a tile")
        if xt:
            _tile(op.name, x, "x")
        if yt:
            _tile(op.name, y, "y")
        if xt and yt:
            px, py = x.shape[0], y.shape[0]
            fx, fy = free_elems(x), free_elems(y)
            if px == py and fx == fy:
                out = _new(x.shape, dtype or x.dtype, op.name)
                _isa.tensor_tensor(out, x, y, op)
                return out
            if px == py and fy == 1:
                out = _new(x.shape, dtype or x.dtype, op.name)
                yv = y if op.bitvec else _as_f32_column(op.name, y)
                _isa.tensor_scalar(out, x, op, yv)
                return out
            if px == py and fx == 1:
                out = _new(y.shape, dtype or x.dtype, op.name)
                xv = x if op.bitvec else _as_f32_column(op.name, x)
                _isa.tensor_scalar(out, y, op, xv, reverse0=True)
                return out
            raise NkiValidationError(
                f"nl.{op.name}: shapes {x.shape} and {y.shape} are incompatible; tiles must "
                "have the same partitions and elements per partition, or one must be (P, 1) "
                "(broadcast along the free axes); partitions never broadcast")
        if xt:
            out = _new(x.shape, dtype or x.dtype, op.name)
            _isa.tensor_scalar(out, x, op, y)
        else:
            out = _new(y.shape, dtype or y.dtype, op.name)
            _isa.tensor_scalar(out, y, op, x, reverse0=True)
        return out
    fn.__name__ = op.name
    return fn


for _name in ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "equal",
              "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and",
              "logical_or", "logical_xor", "abs_max", "abs_min", "fmod", "mod", "bitwise_and",
              "bitwise_or", "bitwise_xor", "left_shift", "right_shift"):
    _ops.by_name(_name)._impl = _binary(_ops.by_name(_name))

for _name in ("abs", "square", "relu", "rsqrt", "reciprocal", "sigmoid", "tanh", "exp", "log",
              "sqrt", "sin", "arctan", "sign", "erf", "erf_dx", "gelu", "gelu_dx",
              "gelu_apprx_tanh", "gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx", "silu",
              "silu_dx", "softplus", "mish", "negative", "ceil", "floor", "trunc", "cos",
              "tan", "logical_not", "invert"):
    _ops.by_name(_name)._impl = _unary(_ops.by_name(_name))


def _copy(x, dtype=None):
    """A new SBUF tile with x's values (tensor_copy; x in SBUF or PSUM)."""
    _tile("copy", x)
    out = _new(x.shape, dtype or x.dtype, "copy")
    _isa.tensor_copy(out, x)
    return out


copy._impl = _copy


# ------------------------------------------------------------------ reductions


def _reduced_shape(fn, x, axis, keepdims):
    nd = x.ndim
    axes = reduce_axes(f"nl.{fn}", [axis] if isinstance(axis, int) else list(axis), nd)
    if keepdims:
        shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    else:
        shape = tuple(s for d, s in enumerate(x.shape) if d not in axes)
        if len(shape) < 2:
            shape = shape + (1,) * (2 - len(shape))
    return axes, shape


def _reduction(op_name, fn_name):
    def fn(x, axis, dtype=None, keepdims=False):
        _tile(fn_name, x)
        axes, shape = _reduced_shape(fn_name, x, axis, keepdims)
        out = _new(shape, dtype or x.dtype, fn_name)
        _isa.tensor_reduce(out, _ops.by_name(op_name), x, axes, keepdims=keepdims)
        return out
    fn.__name__ = fn_name
    return fn


sum._impl = _reduction("add", "sum")
max._impl = _reduction("maximum", "max")
min._impl = _reduction("minimum", "min")
prod._impl = _reduction("multiply", "prod")


def _all(x, axis, dtype=None):
    return _reduction("logical_and", "all")(x, axis, dtype)


all._impl = _all


def _mean(x, axis, dtype=None, keepdims=False):
    _tile("mean", x)
    axes, shape = _reduced_shape("mean", x, axis, keepdims)
    n = math.prod(x.shape[a] for a in axes)
    acc = _new(shape, float32, "mean_sum")  # fp32 intermediate, as documented
    _isa.tensor_reduce(acc, add, x, axes, keepdims=keepdims)
    out = _new(shape, dtype or x.dtype, "mean")
    _isa.tensor_scalar(out, acc, multiply, 1.0 / n)
    return out


mean._impl = _mean


def _all_free(fn, x, axis):
    axes = reduce_axes(f"nl.{fn}", [axis] if isinstance(axis, int) else list(axis), x.ndim)
    if axes != list(range(1, x.ndim)):
        raise UnsupportedError(
            f"nl.{fn}: the simulator supports reducing all free axes only (axis "
            f"{tuple(range(1, x.ndim))} for shape {x.shape}), got {tuple(axes)}")
    return axes


def _var(x, axis, dtype=None, keepdims=False):
    """Population variance over the free axes (bn_stats per 512 elements, then bn_aggr)."""
    _tile("var", x)
    axes = _all_free("var", x, axis)
    P, F = x.shape[0], free_elems(x)
    flat = x.reshape((P, F)) if x.ndim != 2 else x
    chunks = -(-F // 512)
    stats = _new((P, 6 * chunks), float32, "var_stats")
    for c in range(chunks):
        lo, hi = c * 512, builtins.min(F, (c + 1) * 512)
        _isa.bn_stats(stats[:, 6 * c:6 * c + 6], flat[:, lo:hi])
    mv = _new((P, 2), float32, "var_aggr")
    _isa.bn_aggr(mv, stats)
    shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    out = _new(shape, dtype or x.dtype, "var")
    _isa.tensor_copy(out, mv[:, 1:2])
    return out


var._impl = _var


def softmax(x, axis=-1, dtype=None):
    """exp(x - max) / sum(exp(x - max)) over the free axes (4 instructions)."""
    _tile("softmax", x)
    _all_free("softmax", x, axis)
    P = x.shape[0]
    neg_max = _new((P, 1), float32, "softmax_negmax")
    _isa.tensor_reduce(neg_max, maximum, x, list(range(1, x.ndim)), negate=True)
    e = _new(x.shape, float32, "softmax_exp")
    s = _new((P, 1), float32, "softmax_sum")
    _isa.activation(e, exp, x, bias=neg_max, reduce_op=add, reduce_res=s,
                    reduce_cmd=_isa.reduce_cmd.reset_reduce)
    r = _new((P, 1), float32, "softmax_rsum")
    _isa.reciprocal(r, s)
    out = _new(x.shape, dtype or x.dtype, "softmax")
    _isa.tensor_scalar(out, e, multiply, r)
    return out


def rms_norm(x, w, axis, n, epsilon=1e-06, dtype=None, compute_dtype=None):
    """x / sqrt(mean(x^2) + eps) * w (5 instructions)."""
    _tile("rms_norm", x)
    _tile("rms_norm", w, "w")
    _all_free("rms_norm", x, axis)
    P = x.shape[0]
    sq = _new(x.shape, float32, "rms_sq")
    ss = _new((P, 1), float32, "rms_ss")
    _isa.activation(sq, square, x, reduce_op=add, reduce_res=ss,
                    reduce_cmd=_isa.reduce_cmd.reset_reduce)
    rstd = _new((P, 1), float32, "rms_rstd")
    _isa.tensor_scalar(rstd, ss, multiply, 1.0 / n, op1=add, operand1=float(epsilon))
    _isa.activation(rstd, rsqrt, rstd)
    normed = _new(x.shape, float32, "rms_normed")
    _isa.tensor_scalar(normed, x, multiply, rstd)
    out = _new(x.shape, dtype or x.dtype, "rms_norm")
    _isa.tensor_tensor(out, normed, w, multiply)
    return out


def where(condition, x, y, dtype=None):
    """Elements of x where condition (1.0) else y (one VectorE select)."""
    _tile("where", condition, "condition")
    tiles = [t for t in (x, y) if isinstance(t, NkiTensor)]
    for t in tiles:
        _tile("where", t)
        _engine.same_partitions("where", "condition", condition, "x/y", t)
        _engine.same_free("where", "condition", condition, "x/y", t)
    ref = tiles[0] if tiles else condition
    out = _new(condition.shape, dtype or ref.dtype, "where")
    shape = condition._data.shape
    xv = f32(x).reshape(shape) if isinstance(x, NkiTensor) else torch.tensor(float(x))
    yv = f32(y).reshape(shape) if isinstance(y, NkiTensor) else torch.tensor(float(y))
    _store("where", out, torch.where(f32(condition) != 0, xv, yv))
    record("select_reduce", "vector",
           [("predicate", condition), ("on_true", x), ("on_false", y)], [("dst", out)],
           out._data.numel(), {"reduce": False, "reduce_cmd": "idle"})
    return out


def dropout(x, rate, dtype=None):
    _tile("dropout", x)
    out = _new(x.shape, x.dtype, "dropout")
    _isa.dropout(out, x, rate)
    if dtype is not None and _dt.to_nki(dtype) != x.dtype:
        return copy(out, dtype)
    return out


def gather_flattened(data, indices, axis=0, dtype=None):
    """Per-partition gather from the flattened free axes of ``data`` (GpSimd)."""
    _tile("gather_flattened", data, "data")
    _tile("gather_flattened", indices, "indices")
    _engine.same_partitions("gather_flattened", "data", data, "indices", indices)
    P = data.shape[0]
    src = data._data.reshape(P, -1)
    idx = indices._data.reshape(P, -1).to(torch.int64)
    n = src.shape[1]
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise IndexError(f"gather_flattened: index {int(idx.max())} out of range [0, {n}) "
                         f"for data {data.shape}")
    out = _new(indices.shape, dtype or data.dtype, "gather_flattened")
    vals = torch.gather(src, 1, idx)
    _store("gather_flattened", out, vals if not data.dtype.is_float else vals.float())
    record("nc_n_gather", "gpsimd", [("data", data), ("indices", indices)], [("dst", out)],
           out._data.numel(), {})
    return out


def expand_dims(x, axis):
    return x.expand_dim(axis)


def broadcast_to(x, shape, dtype=None):
    """x broadcast to ``shape`` (same rank). Free axes broadcast as a view; a size-1
    partition dim is replicated into a new SBUF tile (one DMA, partition stride 0)."""
    _tile("broadcast_to", x)
    shape = _shape(shape)
    if len(shape) != x.ndim:
        raise NkiValidationError(f"broadcast_to: target {shape} must have the rank of {x.shape}")
    for d, (a, b) in enumerate(zip(x.shape, shape)):
        if a != b and a != 1:
            raise NkiValidationError(f"broadcast_to: dim {d} of size {a} cannot broadcast to {b}")
    dt = _dt.to_nki(dtype) if dtype is not None else x.dtype
    if shape[0] == x.shape[0]:
        v = x._view(x._data.expand(shape)) if shape != x.shape else x
        return v if dt == x.dtype else copy(v, dt)
    if shape[0] > current().target.partitions:
        raise NkiValidationError(
            f"broadcast_to: partition dim {shape[0]} exceeds maximum {current().target.partitions}")
    out = _new(shape, dt, "broadcast_to")
    _store("broadcast_to", out, f32(x).expand(shape) if dt.is_float else x._data.expand(shape))
    record("dma_copy", "dma", [("src", x)], [("dst", out)], 0,
           {"bytes": out._data.numel() * dt.itemsize, "src_bytes": x._data.numel() * x.itemsize,
            "direction": "sbuf_to_sbuf", "partition_broadcast": True})
    return out


def transpose(x, dtype=None):
    """Partition <-> free transpose of a 2-D tile into PSUM (TensorE; VectorE for PSUM input)."""
    _tile("transpose", x)
    P, F = x.shape[0], free_elems(x)
    if x._alloc.kind == "sbuf":
        out = allocate((F, P), x.dtype, psum, "transpose")
        _isa.nc_transpose(out, x, engine=_isa.engine.tensor)
    else:
        out = _new((F, P), x.dtype, "transpose")
        _isa.nc_transpose(out, x, engine=_isa.engine.vector)
    if dtype is not None and _dt.to_nki(dtype) != x.dtype:
        return copy(out, dtype)
    return out


def matmul(x, y, transpose_x=False):
    """x @ y (or x.T @ y with transpose_x=True) into a new fp32 PSUM tile."""
    _tile("matmul", x)
    _tile("matmul", y, "y")
    if not transpose_x:
        xt = transpose(x)  # TensorE transpose into PSUM, then back to SBUF
        x = copy(xt)
    M = free_elems(x)
    N = free_elems(y)
    out = allocate((M, N), float32, psum, "matmul")
    _isa.nc_matmul(out, x, y)
    return out


# ------------------------------------------------------------------ names not modelled


def _unsupported(name):
    def fn(*args, **kwargs):
        raise UnsupportedError(f"nl.{name} is not supported by the simulator")
    fn.__name__ = name
    return fn


float8_e5m2_x4 = "float8_e5m2_x4"
float8_e4m3fn_x4 = "float8_e4m3fn_x4"
float8_e8m0fnu = "float8_e8m0fnu"
float4_e2m1fn_x4 = "float4_e2m1fn_x4"

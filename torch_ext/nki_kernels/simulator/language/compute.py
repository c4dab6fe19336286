"""``nki.language`` compute helpers: the elementwise operators (``nl.add``, ``nl.exp``...,
attached to the op objects of ops.py), ``copy``, the reductions, ``softmax``,
``rms_norm``, ``where``, ``dropout``, ``transpose`` and ``matmul``.

Every helper returns a NEW tile (SBUF unless said otherwise) and is executed as the ISA
instruction(s) it lowers to, so a helper obeys exactly the rules of those instructions:
unary math -> ``activation`` (ScalarE) or, for ALU-only ops, ``tensor_scalar`` (``rsqrt``: a
GpSimd ``tensor_scalar``, as NKI 0.5 moved it); binary ops
-> ``tensor_tensor`` (same shapes) or ``tensor_scalar`` (scalar or (P, 1) operand);
reductions -> ``tensor_reduce``; ``nl.matmul`` -> ``nc_matmul``. Beta 2 has no ``mask=``.
"""

from __future__ import annotations

import builtins
import math

from .. import dtypes as _dt
from .. import isa as _isa
from .. import ops as _ops
from ..context import current
from ..errors import NkiValidationError
from ..isa.alu import reduce_axes
from ..isa.operands import free_elems
from ..memory import MemoryRegion
from ..ops import Op
from ..tensor import NkiTensor
from ..tensor_alloc import allocate
from .common import check_tile, new_tile
from .constants import float32, uint8

# ------------------------------------------------------------------ elementwise


def _unary(op: Op):
    if op.name == "rsqrt":
        # NKI 0.5 moved nl.rsqrt to GpSimd: it "now runs on the GpSimd Engine for higher
        # numerical precision and no longer accepts PSUM inputs" (aws-neuron-sdk
        # nki/migration/index.rst, 0.4 -> 0.5 breaking changes); ScalarE's rsqrt stays
        # reachable as nisa.activation(op=nl.rsqrt).
        def fn(x, dtype=None):
            check_tile(op.name, x)
            if x.buffer is MemoryRegion.psum:
                raise NkiValidationError(
                    "nl.rsqrt: x is in PSUM; nl.rsqrt runs on the GpSimd engine, which cannot "
                    "read PSUM (NKI 0.5 migration guide); use nisa.activation(op=nl.rsqrt) "
                    "for a PSUM input")
            out = new_tile(x.shape, dtype or x.dtype, op.name)
            _isa.tensor_scalar(out, x, op, None, engine=_isa.engine.gpsimd)
            return out
    elif op.act is not None:
        def fn(x, dtype=None):
            check_tile(op.name, x)
            out = new_tile(x.shape, dtype or x.dtype, op.name)
            _isa.activation(out, op, x)
            return out
    else:  # ALU-only unary ops run as a VectorE tensor_scalar
        def fn(x, dtype=None):
            check_tile(op.name, x)
            out = new_tile(x.shape, dtype or x.dtype, op.name)
            _isa.tensor_scalar(out, x, op, None)
            return out
    fn.__name__ = op.name
    return fn


def _as_f32_column(name, t):
    if t.dtype.name == "float32":
        return t
    c = new_tile(t.shape, float32, name + "_operand")
    _isa.tensor_copy(c, t)
    return c


def _binary(op: Op):
    def fn(x, y, dtype=None):
        refused = _ops.operator_refusal(op, f"nl.{op.name}")
        if refused is not None:
            raise refused
        xt, yt = isinstance(x, NkiTensor), isinstance(y, NkiTensor)
        if not (xt or yt):
            raise NkiValidationError(f"nl.{op.name}: at least one of x, y must be a tile, got x {type(x).__name__} "
                                     f"and y {type(y).__name__}")
        if xt:
            check_tile(op.name, x, "x")
        if yt:
            check_tile(op.name, y, "y")
        if xt and yt:
            px, py = x.shape[0], y.shape[0]
            fx, fy = free_elems(x), free_elems(y)
            if px == py and fx == fy:
                out = new_tile(x.shape, dtype or x.dtype, op.name)
                _isa.tensor_tensor(out, x, y, op)
                return out
            if px == py and fy == 1:
                out = new_tile(x.shape, dtype or x.dtype, op.name)
                yv = y if op.bitvec else _as_f32_column(op.name, y)
                _isa.tensor_scalar(out, x, op, yv)
                return out
            if px == py and fx == 1:
                out = new_tile(y.shape, dtype or x.dtype, op.name)
                xv = x if op.bitvec else _as_f32_column(op.name, x)
                _isa.tensor_scalar(out, y, op, xv, reverse0=True)
                return out
            raise NkiValidationError(
                f"nl.{op.name}: shapes {x.shape} and {y.shape} are incompatible; tiles must "
                "have the same partitions and elements per partition, or one must be (P, 1) "
                "(broadcast along the free axes); partitions never broadcast")
        if xt:
            out = new_tile(x.shape, dtype or x.dtype, op.name)
            _isa.tensor_scalar(out, x, op, y)
        else:
            out = new_tile(y.shape, dtype or y.dtype, op.name)
            _isa.tensor_scalar(out, y, op, x, reverse0=True)
        return out
    fn.__name__ = op.name
    return fn


BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "equal",
          "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and",
          "logical_or", "logical_xor", "abs_max", "abs_min", "fmod", "mod", "bitwise_and",
          "bitwise_or", "bitwise_xor", "left_shift", "right_shift")
UNARY = ("abs", "square", "relu", "rsqrt", "reciprocal", "sigmoid", "tanh", "exp", "log",
         "sqrt", "sin", "arctan", "sign", "erf", "erf_dx", "gelu", "gelu_dx", "gelu_apprx_tanh",
         "gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx", "silu", "silu_dx", "softplus", "mish",
         "negative", "ceil", "floor", "trunc", "cos", "tan", "logical_not", "invert")

for _name in BINARY:
    _ops.by_name(_name)._impl = _binary(_ops.by_name(_name))
for _name in UNARY:
    _ops.by_name(_name)._impl = _unary(_ops.by_name(_name))


def _copy(x, dtype=None):
    """A new SBUF tile with x's values (tensor_copy; x in SBUF or PSUM)."""
    check_tile("copy", x)
    out = new_tile(x.shape, dtype or x.dtype, "copy")
    _isa.tensor_copy(out, x)
    return out


_ops.copy._impl = _copy

# ------------------------------------------------------------------ reductions


def _suffix_axes(fn, x, axis):
    """The reduced axes: "can only be the last contiguous dim(s) of the tile" (the v2.33
    docstrings of nl.softmax / nl.var / nl.sum, as nisa.tensor_reduce), so [2] of a 3-D tile
    as well as [1, 2]; reduce_axes refuses anything else."""
    return reduce_axes(f"nl.{fn}", [axis] if isinstance(axis, int) else list(axis), x.ndim)


def _reduced_shape(fn, x, axis, keepdims):
    axes = _suffix_axes(fn, x, axis)
    if keepdims:
        shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    else:
        shape = tuple(s for d, s in enumerate(x.shape) if d not in axes)
        if len(shape) < 2:
            shape = shape + (1,) * (2 - len(shape))
    return axes, shape


def _reduction(op_name, fn_name):
    def fn(x, axis, dtype=None, keepdims=False):
        check_tile(fn_name, x)
        axes, shape = _reduced_shape(fn_name, x, axis, keepdims)
        out = new_tile(shape, dtype or x.dtype, fn_name)
        _isa.tensor_reduce(out, _ops.by_name(op_name), x, axes, keepdims=keepdims)
        return out
    fn.__name__ = fn_name
    return fn


_ops.sum._impl = _reduction("add", "sum")
_ops.max._impl = _reduction("maximum", "max")
_ops.min._impl = _reduction("minimum", "min")
_ops.prod._impl = _reduction("multiply", "prod")


def _all(x, axis, dtype=None):
    return _reduction("logical_and", "all")(x, axis, dtype)


_ops.all._impl = _all


def _mean(x, axis, dtype=None, keepdims=False):
    check_tile("mean", x)
    axes, shape = _reduced_shape("mean", x, axis, keepdims)
    n = math.prod(x.shape[a] for a in axes)
    acc = new_tile(shape, float32, "mean_sum")  # fp32 intermediate, as documented
    _isa.tensor_reduce(acc, _ops.add, x, axes, keepdims=keepdims)
    out = new_tile(shape, dtype or x.dtype, "mean")
    _isa.tensor_scalar(out, acc, _ops.multiply, 1.0 / n)
    return out


_ops.mean._impl = _mean


def _spread(t, shape):
    """A [P, *kept] tile viewed as ``shape`` = [P, *kept, *reduced]: one value per kept
    index, broadcast (stride 0) over the reduced axes."""
    for d in range(t.ndim, len(shape)):
        t = t.expand_dim(d)
    return t.broadcast_to(tuple(shape))


def _var(x, axis, dtype=None, keepdims=False):
    """Population variance over trailing free axes. All of them: bn_stats per bn_stats_fmax
    elements, then bn_aggr (both per partition). Only the last ones: two passes of
    tensor_reduce (mean, then the centred squares), since bn_stats/bn_aggr give one
    statistic per partition. The result has the reduced axes removed ("a shape of the input
    tile's shape with the specified axes removed", nl.var), or kept as 1 with keepdims."""
    check_tile("var", x)
    axes, shape = _reduced_shape("var", x, axis, keepdims)
    out = new_tile(shape, dtype or x.dtype, "var")
    if axes[0] > 1:
        _suffix_var(x, axes, out)
        return out
    P, F = x.shape[0], free_elems(x)
    flat = x.reshape((P, F)) if x.ndim != 2 else x
    chunk = current().target.bn_stats_fmax
    chunks = -(-F // chunk)
    stats = new_tile((P, 6 * chunks), float32, "var_stats")
    for c in range(chunks):
        lo, hi = c * chunk, builtins.min(F, (c + 1) * chunk)
        _isa.bn_stats(stats[:, 6 * c:6 * c + 6], flat[:, lo:hi])
    mv = new_tile((P, 2), float32, "var_aggr")
    _isa.bn_aggr(mv, stats)
    _isa.tensor_copy(out, mv[:, 1:2])
    return out


def _suffix_var(x, axes, out):
    kept = x.shape[:axes[0]]
    n = math.prod(x.shape[a] for a in axes)
    neg_mean = new_tile(kept, float32, "var_negmean")
    _isa.tensor_reduce(neg_mean, _ops.add, x, axes)
    _isa.tensor_scalar(neg_mean, neg_mean, _ops.multiply, -1.0 / n)
    centred = new_tile(x.shape, float32, "var_centred")
    _isa.tensor_tensor(centred, x, _spread(neg_mean, x.shape), _ops.add)
    _isa.tensor_tensor(centred, centred, centred, _ops.multiply)   # squared in place
    total = new_tile(kept, float32, "var_sum")
    _isa.tensor_reduce(total, _ops.add, centred, axes)
    _isa.tensor_scalar(out.reshape(kept), total, _ops.multiply, 1.0 / n)


_ops.var._impl = _var


def softmax(x, axis=-1, dtype=None):
    """exp(x - max) / sum(exp(x - max)) over trailing free axes: over all of them, 4
    instructions (ScalarE's exp sums each partition as it goes); over the last ones only,
    6 (the exp's per-partition sum cannot split a partition's rows, so VectorE sums)."""
    check_tile("softmax", x)
    axes = _suffix_axes("softmax", x, axis)
    if axes[0] > 1:
        return _suffix_softmax(x, axes, dtype)
    P = x.shape[0]
    neg_max = new_tile((P, 1), float32, "softmax_negmax")
    _isa.tensor_reduce(neg_max, _ops.maximum, x, list(range(1, x.ndim)), negate=True)
    e = new_tile(x.shape, float32, "softmax_exp")
    s = new_tile((P, 1), float32, "softmax_sum")
    _isa.activation(e, _ops.exp, x, bias=neg_max, reduce_op=_ops.add, reduce_res=s,
                    reduce_cmd=_isa.reduce_cmd.reset_reduce)
    r = new_tile((P, 1), float32, "softmax_rsum")
    _isa.reciprocal(r, s)
    out = new_tile(x.shape, dtype or x.dtype, "softmax")
    _isa.tensor_scalar(out, e, _ops.multiply, r)
    return out


def _suffix_softmax(x, axes, dtype):
    kept = x.shape[:axes[0]]
    neg_max = new_tile(kept, float32, "softmax_negmax")
    _isa.tensor_reduce(neg_max, _ops.maximum, x, axes, negate=True)
    e = new_tile(x.shape, float32, "softmax_exp")
    _isa.tensor_tensor(e, x, _spread(neg_max, x.shape), _ops.add)
    _isa.activation(e, _ops.exp, e)   # in place: one fp32 temporary of x's size
    s = new_tile(kept, float32, "softmax_sum")
    _isa.tensor_reduce(s, _ops.add, e, axes)
    r = new_tile(kept, float32, "softmax_rsum")
    _isa.reciprocal(r, s)
    out = new_tile(x.shape, dtype or x.dtype, "softmax")
    _isa.tensor_tensor(out, e, _spread(r, x.shape), _ops.multiply)
    return out


def rms_norm(x, w, axis, n, epsilon=1e-06, dtype=None, compute_dtype=None):
    """x / sqrt(sum(x^2) / n + eps) * w over trailing free axes (5 instructions over all of
    them; over the last ones only the sum of squares is a VectorE tensor_reduce and the
    scaling a tensor_tensor against the broadcast rstd: 6)."""
    check_tile("rms_norm", x)
    check_tile("rms_norm", w, "w")
    axes = _suffix_axes("rms_norm", x, axis)
    kept = x.shape[:axes[0]] if axes[0] > 1 else (x.shape[0], 1)
    sq = new_tile(x.shape, float32, "rms_sq")
    ss = new_tile(kept, float32, "rms_ss")
    if axes[0] > 1:
        _isa.activation(sq, _ops.square, x)
        _isa.tensor_reduce(ss, _ops.add, sq, axes)
    else:
        _isa.activation(sq, _ops.square, x, reduce_op=_ops.add, reduce_res=ss,
                        reduce_cmd=_isa.reduce_cmd.reset_reduce)
    rstd = new_tile(kept, float32, "rms_rstd")
    _isa.tensor_scalar(rstd, ss, _ops.multiply, 1.0 / n, op1=_ops.add, operand1=float(epsilon))
    _isa.activation(rstd, _ops.rsqrt, rstd)
    normed = new_tile(x.shape, float32, "rms_normed")
    if axes[0] > 1:
        _isa.tensor_tensor(normed, x, _spread(rstd, x.shape), _ops.multiply)
    else:
        _isa.tensor_scalar(normed, x, _ops.multiply, rstd)
    out = new_tile(x.shape, dtype or x.dtype, "rms_norm")
    _isa.tensor_tensor(out, normed, w, _ops.multiply)
    return out


# select_reduce takes any on_true dtype but these (its docstring); others take the
# predicated-copy form of nl.where.
_SELECT_ON_TRUE_EXCLUDED = ("tfloat32", "int32", "uint32")


def where(condition, x, y, dtype=None):
    """Elements of x where ``condition`` (a float tile, 1.0 true / 0.0 false; any nonzero
    counts as true) else y; x and y are tiles of the condition's shape or scalars.

    The select instructions take an integer predicate, so the condition first becomes a
    uint8 one (tensor_scalar not_equal 0). Then: one VectorE select_reduce when one of x, y
    is a scalar (the predicate reversed when x is); a tensor_copy of y (or a memset of a
    scalar y) and a tensor_copy_predicated of x when both are tiles or both scalars."""
    check_tile("where", condition, "condition")
    for role, t in (("x", x), ("y", y)):
        if isinstance(t, NkiTensor):
            check_tile("where", t, role)
    ref = x if isinstance(x, NkiTensor) else y if isinstance(y, NkiTensor) else condition
    out = new_tile(condition.shape, dtype or ref.dtype, "where")
    pred = new_tile(condition.shape, uint8, "where_predicate")
    _isa.tensor_scalar(pred, condition, _ops.not_equal, 0.0)
    x_tile, y_tile = isinstance(x, NkiTensor), isinstance(y, NkiTensor)
    if x_tile != y_tile:
        on_true, on_false = (x, y) if x_tile else (y, x)
        if on_true.dtype.name not in _SELECT_ON_TRUE_EXCLUDED:
            _isa.select_reduce(out, pred, on_true, float(on_false), reverse_pred=not x_tile)
            return out
    if y_tile:
        _isa.tensor_copy(out, y)
    else:
        _isa.memset(out, y)
    if x_tile and x.dtype != out.dtype:  # the predicated copy moves dst-dtype values
        xc = new_tile(x.shape, out.dtype, "where_x")
        _isa.tensor_copy(xc, x)
        x = xc
    _isa.tensor_copy_predicated(out, x, pred)
    return out


def dropout(x, rate, dtype=None):
    check_tile("dropout", x)
    out = new_tile(x.shape, x.dtype, "dropout")
    _isa.dropout(out, x, rate)
    if dtype is not None and _dt.to_nki(dtype) != x.dtype:
        return _copy(out, dtype)
    return out


def transpose(x, dtype=None):
    """Partition <-> free transpose of a 2-D tile into PSUM (TensorE; VectorE for PSUM input)."""
    check_tile("transpose", x)
    P, F = x.shape[0], free_elems(x)
    if x._alloc.kind == "sbuf":
        out = allocate((F, P), x.dtype, MemoryRegion.psum, "transpose")
        _isa.nc_transpose(out, x, engine=_isa.engine.tensor)
    else:
        out = new_tile((F, P), x.dtype, "transpose")
        _isa.nc_transpose(out, x, engine=_isa.engine.vector)
    if dtype is not None and _dt.to_nki(dtype) != x.dtype:
        return _copy(out, dtype)
    return out


def matmul(x, y, transpose_x=False):
    """x @ y (or x.T @ y with transpose_x=True) into a new fp32 PSUM tile."""
    check_tile("matmul", x)
    check_tile("matmul", y, "y")
    if not transpose_x:
        xt = transpose(x)  # TensorE transpose into PSUM, then back to SBUF
        x = _copy(xt)
    M = free_elems(x)
    N = free_elems(y)
    out = allocate((M, N), float32, MemoryRegion.psum, "matmul")
    _isa.nc_matmul(out, x, y)
    return out

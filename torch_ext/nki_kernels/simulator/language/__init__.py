"""``nki.language`` (beta 2): dtypes, buffers, ``tile_size``, allocation, data movement,
loops and launch grid, and the convenience ops (``nl.add``, ``nl.exp``, ``nl.sum``,
``nl.matmul``...).

* constants.py   dtypes, buffers, buffer predicates, NKIObject, tile_size (active target)
* allocation.py  ndarray, zeros/ones/full(_like), empty_like, rand, random_seed,
                 shared_constant, shared_identity_matrix
* movement.py    load, store, load_transpose2d, broadcast_to, expand_dims, gather_flattened
* control.py     ds, the loop ranges, fori_loop, while_loop, no_reorder, program_id,
                 num_programs, program_ndim, device_print
* compute.py     elementwise ops, copy, reductions, softmax, rms_norm, where, dropout,
                 transpose, matmul
* common.py      the argument checks and tile allocation the helpers share

Every helper that computes or moves data issues the ``nisa`` instruction(s) it stands for
(recorded in the trace as such), so it obeys exactly those instructions' rules.
``__all__`` is the ``nki.language`` surface (modules.py builds the module from it).
"""

from __future__ import annotations

from ..memory import MemoryRegion
from ..ops import (abs, abs_max, abs_min, add, all, arctan, average, bitwise_and,  # noqa: A004
                   bitwise_or, bitwise_xor, bypass, ceil, copy, cos, divide, equal, erf, erf_dx,
                   exp, floor, fmod, gelu, gelu_apprx_sigmoid, gelu_apprx_sigmoid_dx,
                   gelu_apprx_tanh, gelu_dx, greater, greater_equal, invert, left_shift, less,
                   less_equal, log, logical_and, logical_not, logical_or, logical_xor, max,
                   maximum, mean, min, minimum, mish, mod, multiply, negative, not_equal, power,
                   prelu, prod, reciprocal, relu, right_shift, rsqrt, sigmoid, sign, silu,
                   silu_dx, sin, softplus, sqrt, square, subtract, sum, tan, tanh, trunc, var)
from ..tensor import NkiTensor
from .allocation import (empty_like, full, ndarray, ones, rand, random_seed, shared_constant,
                         shared_identity_matrix, zeros, zeros_like)
from .compute import dropout, matmul, rms_norm, softmax, transpose, where
from .constants import (DType, NKIObject, bf16, bfloat16, bool_, float4_e2m1fn_x4, float8_e4m3,
                        float8_e4m3fn, float8_e4m3fn_x4, float8_e5m2, float8_e5m2_x4,
                        float8_e8m0fnu, float16, float32, fp16, fp32, hbm, int8, int16, int32,
                        is_hbm, is_on_chip, is_psum, is_sbuf, private_hbm, psum, sbuf, shared_hbm,
                        tfloat32, tile_size, uint8, uint16, uint32)
from .control import (affine_range, device_print, ds, dynamic_range, fori_loop, no_reorder,
                      num_programs, program_id, program_ndim, sequential_range, static_range,
                      while_loop)
from .movement import broadcast_to, expand_dims, gather_flattened, load, load_transpose2d, store

__all__ = [
    # dtypes
    "bool_", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16", "float32",
    "bfloat16", "tfloat32", "float8_e4m3", "float8_e4m3fn", "float8_e5m2", "fp32", "fp16",
    "bf16", "DType", "float8_e5m2_x4", "float8_e4m3fn_x4", "float8_e8m0fnu", "float4_e2m1fn_x4",
    # buffers, tensors, tile sizes
    "sbuf", "psum", "hbm", "private_hbm", "shared_hbm", "MemoryRegion", "NkiTensor", "NKIObject",
    "is_hbm", "is_on_chip", "is_psum", "is_sbuf", "tile_size",
    # allocation
    "ndarray", "zeros", "ones", "full", "zeros_like", "empty_like", "rand", "random_seed",
    "shared_constant", "shared_identity_matrix",
    # data movement
    "load", "store", "load_transpose2d", "broadcast_to", "expand_dims", "gather_flattened", "ds",
    # loops and grid
    "affine_range", "sequential_range", "static_range", "dynamic_range", "fori_loop",
    "while_loop", "no_reorder", "program_id", "num_programs", "program_ndim", "device_print",
    # operators (callable, and the op selectors nisa instructions take)
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "equal",
    "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and", "logical_or",
    "logical_xor", "logical_not", "abs_max", "abs_min", "fmod", "mod", "bitwise_and",
    "bitwise_or", "bitwise_xor", "invert", "left_shift", "right_shift", "abs", "square", "relu",
    "rsqrt", "reciprocal", "negative", "ceil", "floor", "trunc", "cos", "tan", "sin", "arctan",
    "exp", "log", "sqrt", "tanh", "sigmoid", "sign", "erf", "erf_dx", "gelu", "gelu_dx",
    "gelu_apprx_tanh", "gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx", "silu", "silu_dx",
    "softplus", "mish", "copy", "bypass", "prelu",
    # reductions and composite ops
    "sum", "max", "min", "mean", "prod", "var", "all", "average", "softmax", "rms_norm", "where",
    "dropout", "transpose", "matmul",
]

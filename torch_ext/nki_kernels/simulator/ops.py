"""Operator objects: ``nl.add``, ``nl.exp``, ``nl.maximum``... are both op selectors
passed to ``nisa`` instructions and callable convenience functions (``nl.add(x, y)``).

Each ``Op`` carries its fp32 math: ``alu`` (Vector/GpSimd ALU, binary or unary), ``act``
(ScalarE activation function), both, or neither (reductions like ``nl.sum``, which name
their ALU op through ``reduce``). The callable behaviour is attached by language.py.

Activation functions use the standard formulas in fp32. Functions the hardware only
supports on a limited input range (log [2^-64, 2^64], sin [-pi, pi], arctan [-pi/2, pi/2],
sqrt [2^-116, 2^118], rsqrt [2^-87, 2^97], reciprocal +-[2^-42, 2^42]) do NOT raise
outside it: the simulator returns the exact math where hardware returns garbage (the
official simulator extrapolates sin's polynomial; we do not).
"""

from __future__ import annotations

import math

import torch

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_TWO_SQRT_PI = 2.0 / math.sqrt(math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


class Op:
    """One NKI operator (ALU op, activation function, or reduction)."""

    def __init__(self, name, alu=None, act=None, unary=False, bitvec=False, reducible=False,
                 compare=False, reduce=None, doc=""):
        self.name = name
        self.alu = alu            # fp32 (or int64 for bitvec) math: f(a, b) or f(a) if unary
        self.act = act            # activation math f(x) on fp32
        self.unary = unary
        self.bitvec = bitvec
        self.reducible = reducible  # legal as a reduction op
        self.compare = compare
        self.reduce = reduce      # for reductions (nl.sum...): the ALU op name they reduce with
        self.__doc__ = doc
        self._impl = None

    def __call__(self, *args, **kwargs):
        if self._impl is None:
            raise TypeError(f"nl.{self.name} is an operator selector only; it cannot be called")
        return self._impl(*args, **kwargs)

    def __repr__(self):
        return f"nl.{self.name}"

    def __reduce__(self):
        return (by_name, (self.name,))


def _b(x):
    return x != 0


def _flt(t):
    return t.to(torch.float32)


def _exp(x):
    # torch's fp32 exp takes a ~30x slower path when results are subnormal or zero (every
    # masked softmax element); fp64 has no such cliff and rounds to the same fp32 values.
    return torch.exp(x.to(torch.float64)).to(torch.float32)


def _gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x * _SQRT1_2))


def _gelu_dx(x):
    return 0.5 * (1.0 + torch.erf(x * _SQRT1_2)) + x * _INV_SQRT_2PI * torch.exp(-0.5 * x * x)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_PI * (x + 0.044715 * x * x * x)))


def _gelu_sig(x):
    return x * torch.sigmoid(1.702 * x)


def _gelu_sig_dx(x):
    s = torch.sigmoid(1.702 * x)
    return s + 1.702 * x * s * (1.0 - s)


def _silu_dx(x):
    s = torch.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def _softplus(x):
    return torch.nn.functional.softplus(x)


def _mish(x):
    return x * torch.tanh(torch.nn.functional.softplus(x))


def _abs_max(a, b):
    return torch.where(a.abs() > b.abs(), a, b)


def _abs_min(a, b):
    return torch.where(a.abs() < b.abs(), a, b)


def _logical_not(a):
    return _flt(a == 0)


def _rshift(a, b):
    # logical shift right on the 32-bit pattern
    return (a & 0xFFFFFFFF) >> b


_OPS: dict[str, Op] = {}


def _op(name, **kw):
    op = Op(name, **kw)
    _OPS[name] = op
    return op


# ---------------------------------------------------------------- binary arithmetic ALU ops
add = _op("add", alu=torch.add, reducible=True, doc="x + y")
subtract = _op("subtract", alu=torch.sub, reducible=True, doc="x - y")
multiply = _op("multiply", alu=torch.mul, reducible=True, doc="x * y")
divide = _op("divide", alu=torch.div, doc="x / y")
maximum = _op("maximum", alu=torch.maximum, reducible=True, doc="max(x, y)")
minimum = _op("minimum", alu=torch.minimum, reducible=True, doc="min(x, y)")
power = _op("power", alu=torch.pow, doc="x ** y")
equal = _op("equal", alu=lambda a, b: _flt(a == b), compare=True, doc="1 where x == y")
not_equal = _op("not_equal", alu=lambda a, b: _flt(a != b), compare=True, doc="1 where x != y")
greater = _op("greater", alu=lambda a, b: _flt(a > b), compare=True, doc="1 where x > y")
greater_equal = _op("greater_equal", alu=lambda a, b: _flt(a >= b), compare=True, doc="1 where x >= y")
less = _op("less", alu=lambda a, b: _flt(a < b), compare=True, doc="1 where x < y")
less_equal = _op("less_equal", alu=lambda a, b: _flt(a <= b), compare=True, doc="1 where x <= y")
logical_and = _op("logical_and", alu=lambda a, b: _flt(_b(a) & _b(b)), reducible=True)
logical_or = _op("logical_or", alu=lambda a, b: _flt(_b(a) | _b(b)), reducible=True)
logical_xor = _op("logical_xor", alu=lambda a, b: _flt(_b(a) ^ _b(b)), reducible=True)
abs_max = _op("abs_max", alu=_abs_max, doc="x if |x| > |y| else y")
abs_min = _op("abs_min", alu=_abs_min, doc="x if |x| < |y| else y")
fmod = _op("fmod", alu=torch.fmod, doc="C-style remainder (sign of x)")
mod = _op("mod", alu=torch.remainder, doc="Python-style remainder (sign of y)")

# ---------------------------------------------------------------- bitvec ALU ops (integers)
bitwise_and = _op("bitwise_and", alu=torch.bitwise_and, bitvec=True, reducible=True)
bitwise_or = _op("bitwise_or", alu=torch.bitwise_or, bitvec=True, reducible=True)
bitwise_xor = _op("bitwise_xor", alu=torch.bitwise_xor, bitvec=True, reducible=True)
left_shift = _op("left_shift", alu=torch.bitwise_left_shift, bitvec=True)
right_shift = _op("right_shift", alu=_rshift, bitvec=True)
invert = _op("invert", alu=torch.bitwise_not, bitvec=True, unary=True)

# ---------------------------------------------------------------- unary ops
# (ALU unary ops of Vector/GpSimd and/or ScalarE activation functions)
logical_not = _op("logical_not", alu=_logical_not, unary=True)
abs = _op("abs", alu=torch.abs, act=torch.abs, unary=True)  # noqa: A001
square = _op("square", alu=torch.square, act=torch.square, unary=True)
relu = _op("relu", alu=torch.relu, act=torch.relu, unary=True)
rsqrt = _op("rsqrt", alu=torch.rsqrt, act=torch.rsqrt, unary=True)
reciprocal = _op("reciprocal", alu=torch.reciprocal, act=torch.reciprocal, unary=True)
negative = _op("negative", alu=torch.neg, unary=True)
ceil = _op("ceil", alu=torch.ceil, unary=True)
floor = _op("floor", alu=torch.floor, unary=True)
trunc = _op("trunc", alu=torch.trunc, unary=True)
cos = _op("cos", alu=torch.cos, unary=True)
tan = _op("tan", alu=torch.tan, unary=True)
bypass = _op("bypass", alu=lambda a, b=None: a, unary=True, doc="pass data through unchanged")

copy = _op("copy", act=lambda x: x, unary=True)
sigmoid = _op("sigmoid", act=torch.sigmoid, unary=True)
tanh = _op("tanh", act=torch.tanh, unary=True)
exp = _op("exp", act=_exp, unary=True)
log = _op("log", act=torch.log, unary=True)
sqrt = _op("sqrt", act=torch.sqrt, unary=True)
sin = _op("sin", act=torch.sin, unary=True)
arctan = _op("arctan", act=torch.atan, unary=True)
sign = _op("sign", act=torch.sign, unary=True)
erf = _op("erf", act=torch.erf, unary=True)
erf_dx = _op("erf_dx", act=lambda x: _TWO_SQRT_PI * torch.exp(-x * x), unary=True)
gelu = _op("gelu", act=_gelu, unary=True)
gelu_dx = _op("gelu_dx", act=_gelu_dx, unary=True)
gelu_apprx_tanh = _op("gelu_apprx_tanh", act=_gelu_tanh, unary=True)
gelu_apprx_sigmoid = _op("gelu_apprx_sigmoid", act=_gelu_sig, unary=True)
gelu_apprx_sigmoid_dx = _op("gelu_apprx_sigmoid_dx", act=_gelu_sig_dx, unary=True)
silu = _op("silu", act=torch.nn.functional.silu, unary=True)
silu_dx = _op("silu_dx", act=_silu_dx, unary=True)
softplus = _op("softplus", act=_softplus, unary=True)
mish = _op("mish", act=_mish, unary=True)
prelu = _op("prelu", act=torch.relu, unary=True, doc="PReLU (slope 0 unless relu_param is given)")

# ---------------------------------------------------------------- reductions (nl.sum, nl.max...)
sum = _op("sum", reduce="add")  # noqa: A001
max = _op("max", reduce="maximum")  # noqa: A001
min = _op("min", reduce="minimum")  # noqa: A001
prod = _op("prod", reduce="multiply")
mean = _op("mean", reduce="add")
var = _op("var")
all = _op("all", reduce="logical_and")  # noqa: A001
average = _op("average", reduce="add", doc="average (partition reduction)")

# numpy/torch function names a beta-1 kernel might pass as `op`
_FOREIGN = {
    "add": "add", "subtract": "subtract", "sub": "subtract", "multiply": "multiply",
    "mul": "multiply", "divide": "divide", "true_divide": "divide", "div": "divide",
    "maximum": "maximum", "minimum": "minimum", "power": "power", "pow": "power",
    "equal": "equal", "eq": "equal", "not_equal": "not_equal", "ne": "not_equal",
    "greater": "greater", "gt": "greater", "greater_equal": "greater_equal", "ge": "greater_equal",
    "less": "less", "lt": "less", "less_equal": "less_equal", "le": "less_equal",
    "exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "abs": "abs",
    "absolute": "abs", "square": "square", "reciprocal": "reciprocal", "sin": "sin",
    "arctan": "arctan", "atan": "arctan", "sign": "sign", "erf": "erf", "sigmoid": "sigmoid",
    "relu": "relu", "rsqrt": "rsqrt", "logical_and": "logical_and", "logical_or": "logical_or",
    "logical_xor": "logical_xor", "logical_not": "logical_not", "bitwise_and": "bitwise_and",
    "bitwise_or": "bitwise_or", "bitwise_xor": "bitwise_xor", "invert": "invert",
    "left_shift": "left_shift", "right_shift": "right_shift", "amax": "maximum",
    "amin": "minimum", "max": "maximum", "min": "minimum", "sum": "add", "prod": "multiply",
}


def by_name(name: str) -> Op:
    return _OPS[name]


def resolve(op, what: str = "op") -> Op:
    """``op`` as an ``Op``: an Op passes; numpy/torch functions map by name."""
    if isinstance(op, Op):
        return op
    name = getattr(op, "__name__", None)
    if isinstance(name, str) and name in _FOREIGN:
        return _OPS[_FOREIGN[name]]
    raise _err(f"{what}={op!r} is not an NKI operator (use nl.add, nl.exp, ...)")


# Not operators of NKI's ISA: the "Supported Math Operators for NKI ISA" table (aws-neuron-sdk
# nki/api/nki.api.shared.rst) lists no divide, and nki/api/nki.language.rst lists divide as
# "not supported" (AWS's own simulator may still run such a kernel; the compiler is what
# refuses). nl.divide keeps its name and torch.div; every instruction (alu_of) and nl.divide
# itself refuse it, with the fix.
NOT_ISA_OPERATORS = {"divide": "multiply by nisa.reciprocal's result, or by 1 / c for a constant c"}
# Operators of NeuronCore-v4 (trn3) and newer only: nki.language.abs_max / abs_min, "Available
# only on NeuronCore-v4 (trn3) and newer" (their API pages; the 2.30 release notes: "trn3 only").
V4_OPERATORS = ("abs_max", "abs_min")


def operator_refusal(op: Op, where: str) -> Exception | None:
    """The error for an op the active target's ISA does not have (NOT_ISA_OPERATORS on every
    generation, V4_OPERATORS before NeuronCore-v4), or None."""
    fix = NOT_ISA_OPERATORS.get(op.name)
    if fix is not None:
        return _err(f"{where}: nl.{op.name} is not an operator of NKI's ISA (its table of supported math "
                    f"operators has none; nki.language lists {op.name} as not supported): {fix}")
    if op.name in V4_OPERATORS:
        from .isa.operands import generation_refusal   # (lazy: the ISA modules import this one)

        msg = generation_refusal(where, 4, f"nl.{op.name}", source=f"nki.language.{op.name}")
        if msg is not None:
            return _err(msg)
    return None


def alu_of(op: Op, instr: str, role: str) -> Op:
    """The ALU op behind ``op`` (reductions like nl.max name nl.maximum), or raise."""
    refused = operator_refusal(op, f"{instr}: {role}")
    if refused is not None:
        raise refused
    if op.alu is None and op.reduce is not None:
        op = _OPS[op.reduce]
    if op.alu is None:
        raise _err(f"{instr}: {role}={op!r} is not an ALU operator (see the nki-aluop table: "
                   "add, subtract, multiply, maximum, minimum, comparisons, logical/bitwise ops, "
                   "abs, square, relu, rsqrt, reciprocal, power, ...)")
    return op


def _err(msg):
    from .errors import NkiValidationError

    return NkiValidationError(msg)


ACTIVATIONS = tuple(name for name, op in _OPS.items() if op.act is not None)
ALU_OPS = tuple(name for name, op in _OPS.items() if op.alu is not None)

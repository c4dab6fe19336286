"""nisa compute instructions against independent torch computations on fresh random data,
and their rule checks in both directions (bad call flagged, good call quiet)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nki_kernels import simulator
from nki_kernels.simulator import NkiValidationError

# (dtype, atol, rtol): fp32 results are the same fp32 math, so tight; bf16 outputs carry one
# bf16 rounding (2^-8 relative).
F32 = ("float32", 1e-6, 1e-6)
BF16 = ("bfloat16", 1e-2, 8e-3)


def close(got, ref, tol=F32):
    torch.testing.assert_close(got, ref, atol=tol[1], rtol=tol[2])


# ------------------------------------------------------------------ activation functions

_SQ2 = math.sqrt(2.0)
ACT_REFS = {
    "copy": lambda x: x,
    "square": lambda x: x * x,
    "sigmoid": torch.sigmoid,
    "relu": F.relu,
    "tanh": torch.tanh,
    "exp": torch.exp,
    "gelu": lambda x: F.gelu(x),
    "gelu_apprx_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_apprx_sigmoid": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu_dx": lambda x: 0.5 * (1 + torch.erf(x / _SQ2)) + x * torch.exp(-x * x / 2) / math.sqrt(2 * math.pi),
    "silu": F.silu,
    "silu_dx": lambda x: torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x))),
    "softplus": F.softplus,
    "mish": F.mish,
    "erf": torch.erf,
    "erf_dx": lambda x: 2 / math.sqrt(math.pi) * torch.exp(-x * x),
    "sign": torch.sign,
    "abs": torch.abs,
    "sin": torch.sin,
    "arctan": torch.atan,
    "log": lambda x: torch.log(x.abs() + 0.5),
    "sqrt": lambda x: torch.sqrt(x.abs() + 0.5),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.5),
    "reciprocal": lambda x: 1 / (x.abs() + 0.5),
}
_POSITIVE = {"log", "sqrt", "rsqrt", "reciprocal"}


@pytest.mark.parametrize("name", sorted(ACT_REFS))
def test_activation_functions(sim, mk, v, last, name):
    _, nl, nisa = sim
    x = torch.randn(128, 96) * 2
    xin = x.abs() + 0.5 if name in _POSITIVE else x
    ref_fn = ACT_REFS[name]
    ref = ref_fn(x) if name in _POSITIVE else ref_fn(xin)
    data = mk(xin)
    dst = nl.ndarray((128, 96), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=dst, op=getattr(nl, name), data=data)
    close(v(dst), ref, ("float32", 2e-6, 2e-5))
    ins = last()
    assert (ins.op, ins.engine, ins.attrs["func"]) == ("activation", "scalar", name)


def test_activation_out_of_range_does_not_raise(sim, mk, v):
    _, nl, nisa = sim
    x = mk(torch.tensor([[9.0, -20.0, 0.0, -1.0]]))
    dst = nl.ndarray((1, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst, nl.sin, x)  # outside [-pi, pi]: exact math, no error
    close(v(dst), torch.sin(torch.tensor([[9.0, -20.0, 0.0, -1.0]])))
    nisa.activation(dst, nl.log, x)  # log of <= 0: nan / -inf, no error
    assert torch.isnan(v(dst)[0, 1]) and torch.isinf(v(dst)[0, 2])


def test_activation_scale_bias_and_bf16_output_round_once(sim, mk, v):
    _, nl, nisa = sim
    x = torch.randn(64, 200)
    s = torch.rand(64, 1) + 0.5
    b = torch.randn(64, 1)
    dst = nl.ndarray((64, 200), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.activation(dst, nl.exp, mk(x), bias=mk(b), scale=mk(s))
    ref = torch.exp(x * s + b).to(torch.bfloat16).float()  # fp32 math, one rounding to bf16
    assert torch.equal(v(dst), ref)
    nisa.activation(dst, nl.tanh, mk(x), bias=0.25, scale=3.0)
    assert torch.equal(v(dst), torch.tanh(x * 3.0 + 0.25).to(torch.bfloat16).float())


def test_activation_reduce_registers_persist(sim, mk, v):
    _, nl, nisa = sim
    a, b = torch.randn(128, 64), torch.randn(128, 64)
    dst = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst, nl.exp, mk(a), reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.activation(dst, nl.exp, mk(b), reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reduce,
                    reduce_res=res)
    close(v(res), (torch.exp(a).sum(1) + torch.exp(b).sum(1))[:, None], ("f", 1e-4, 1e-5))
    nisa.activation(dst, nl.exp, mk(b), reduce_cmd=nisa.reduce_cmd.reset)
    nisa.activation(dst, nl.copy, mk(a), reduce_cmd=nisa.reduce_cmd.idle, reduce_res=res)
    assert torch.equal(v(res), torch.zeros(128, 1))  # reset zeroed, idle left them alone


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_activation_reduce_only_sums(sim, mk, op):
    # ScalarE's reduction registers only add (nisa.activation docs, Neuron 2.33).
    _, nl, nisa = sim
    dst = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
    with pytest.raises(NkiValidationError, match=f"activation: reduce_op {op} is not supported"):
        nisa.activation(dst, nl.exp, mk(torch.randn(128, 64)), reduce_op=getattr(nl, op),
                        reduce_res=res, reduce_cmd=nisa.reduce_cmd.reset_reduce)


def test_activation_reduce_matches_activation_reset_reduce(sim, mk, v):
    _, nl, nisa = sim
    x = torch.randn(32, 40)
    dst = nl.ndarray((32, 40), dtype=nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst, nl.square, mk(x), reduce_op=nl.add, reduce_res=res)
    close(v(res), (x * x).sum(1, keepdim=True), ("f", 1e-5, 1e-5))


@pytest.mark.parametrize("bad", [
    dict(op="add"), dict(scale_shape=(64, 2)), dict(bias_shape=(32, 1)), dict(scale_dtype="bfloat16"),
])
def test_activation_rule_violations(sim, mk, bad):
    _, nl, nisa = sim
    x = mk(torch.randn(64, 8))
    dst = nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.sbuf)
    kw = {}
    if "scale_shape" in bad:
        kw["scale"] = mk(torch.rand(bad["scale_shape"]))
    if "scale_dtype" in bad:
        kw["scale"] = mk(torch.rand(64, 1), bad["scale_dtype"])
    if "bias_shape" in bad:
        kw["bias"] = mk(torch.rand(bad["bias_shape"]))
    with pytest.raises(NkiValidationError, match="activation"):
        nisa.activation(dst, getattr(nl, bad.get("op", "exp")), x, **kw)


# ------------------------------------------------------------------ ALU instructions

BINARY_REFS = {
    "add": torch.add, "subtract": torch.sub, "multiply": torch.mul,
    "maximum": torch.maximum, "minimum": torch.minimum,
    "equal": lambda a, b: (a == b).float(), "not_equal": lambda a, b: (a != b).float(),
    "greater": lambda a, b: (a > b).float(), "greater_equal": lambda a, b: (a >= b).float(),
    "less": lambda a, b: (a < b).float(), "less_equal": lambda a, b: (a <= b).float(),
    "logical_and": lambda a, b: ((a != 0) & (b != 0)).float(),
    "logical_or": lambda a, b: ((a != 0) | (b != 0)).float(),
    "logical_xor": lambda a, b: ((a != 0) ^ (b != 0)).float(),
    "power": lambda a, b: torch.pow(a.abs(), b),
}


@pytest.mark.parametrize("name", sorted(BINARY_REFS))
def test_tensor_tensor_ops(sim, mk, v, last, name):
    _, nl, nisa = sim
    a = torch.randn(128, 3, 20)
    b = torch.randn(128, 60)
    if name in ("equal", "not_equal", "logical_and", "logical_or", "logical_xor"):
        a = torch.randint(-1, 2, a.shape).float()
        b = torch.randint(-1, 2, b.shape).float()
    if name == "power":
        a = a.abs()
    dst = nl.ndarray((128, 60), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=dst, data1=mk(a), data2=mk(b), op=getattr(nl, name))
    close(v(dst), BINARY_REFS[name](a.reshape(128, 60), b))
    assert last().engine == ("gpsimd" if name == "power" else "vector")


V4_BINARY_REFS = {"abs_max": lambda a, b: torch.where(a.abs() > b.abs(), a, b),
                  "abs_min": lambda a, b: torch.where(a.abs() < b.abs(), a, b)}


@pytest.mark.parametrize("name", sorted(V4_BINARY_REFS))
def test_abs_max_and_abs_min_run_on_trn3_and_are_refused_before_it(sim, mk, name):
    # nki.language.abs_max / abs_min: "Available only on NeuronCore-v4 (trn3) and newer"
    _, nl, nisa = sim
    a, b = torch.randn(128, 60), torch.randn(128, 60)
    dst = nl.ndarray((128, 60), dtype=nl.float32, buffer=nl.sbuf)
    for call in (lambda: nisa.tensor_tensor(dst=dst, data1=mk(a), data2=mk(b), op=getattr(nl, name)),
                 lambda: nisa.tensor_scalar(dst=dst, data=mk(a), op0=getattr(nl, name), operand0=0.5),
                 lambda: getattr(nl, name)(mk(a), mk(b))):
        with pytest.raises(NkiValidationError, match=rf"nl.{name} needs NeuronCore-v4 \(trn3\) or newer.*trn2"):
            call()
    with simulator.activated("trn3") as nki:
        nl3, nisa3 = nki.language, nki.isa
        tiles = []
        for values in (a, b):
            t = nl3.ndarray((128, 60), dtype=nl3.float32, buffer=nl3.sbuf)
            t.dtype.assign(t._data, values)
            tiles.append(t)
        out = nl3.ndarray((128, 60), dtype=nl3.float32, buffer=nl3.sbuf)
        nisa3.tensor_tensor(dst=out, data1=tiles[0], data2=tiles[1], op=getattr(nl3, name))
        close(out.values().to(torch.float32), V4_BINARY_REFS[name](a, b))


def test_divide_is_refused_by_every_alu_instruction_and_by_nl_divide(sim, mk):
    # NKI's table of ISA operators (nki.api.shared, "Supported Math Operators for NKI ISA")
    # has no divide and nki.language lists divide as not supported: a kernel dividing would
    # run here and fail to compile on a Trainium host. The error gives the fix.
    _, nl, nisa = sim
    x, col = mk(torch.rand(16, 8) + 1), mk(torch.rand(16, 1) + 1)
    dst = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
    calls = {
        "tensor_tensor: op": lambda: nisa.tensor_tensor(dst=dst, data1=x, data2=x, op=nl.divide),
        "tensor_scalar: op0": lambda: nisa.tensor_scalar(dst=dst, data=x, op0=nl.divide, operand0=2.0),
        "tensor_scalar: op1": lambda: nisa.tensor_scalar(dst=dst, data=x, op0=nl.multiply, operand0=2.0,
                                                         op1=nl.divide, operand1=col),
        "scalar_tensor_tensor: op1": lambda: nisa.scalar_tensor_tensor(dst=dst, data=x, op0=nl.multiply,
                                                                       operand0=2.0, op1=nl.divide, operand1=x),
        "nl.divide": lambda: nl.divide(x, col),
    }
    for where, call in calls.items():
        with pytest.raises(NkiValidationError, match=rf"{where}: nl.divide is not an operator of NKI's ISA.*"
                                                     r"nisa.reciprocal"):
            call()


def test_tensor_tensor_integer_bitwise(sim, mk, v):
    _, nl, nisa = sim
    a = torch.randint(0, 1 << 20, (16, 32))
    b = torch.randint(0, 1 << 20, (16, 32))
    dst = nl.ndarray((16, 32), dtype=nl.int32, buffer=nl.sbuf)
    for name, fn in (("bitwise_and", torch.bitwise_and), ("bitwise_or", torch.bitwise_or),
                     ("bitwise_xor", torch.bitwise_xor)):
        nisa.tensor_tensor(dst, mk(a, "int32"), mk(b, "int32"), getattr(nl, name))
        assert torch.equal(dst.values(), fn(a, b))


def test_tensor_tensor_int32_defaults_to_gpsimd_unless_psum(sim, mk, v, last):
    # Beta-2 default engine: GpSimd when every operand is int32/uint32, VectorE when one
    # is in PSUM (GpSimd cannot reach it) or any operand is a float.
    _, nl, nisa = sim
    a = torch.randint(-1000, 1000, (32, 16))
    b = torch.randint(-1000, 1000, (32, 16))
    dst = nl.ndarray((32, 16), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst, mk(a, "int32"), mk(b, "int32"), nl.add)
    assert torch.equal(dst.values(), a + b) and last().engine == "gpsimd"
    nisa.tensor_tensor(dst, mk(a, "int32", buffer="psum"), mk(b, "int32"), nl.add)
    assert torch.equal(dst.values(), a + b) and last().engine == "vector"
    fdst = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(fdst, mk(a, "int32"), mk(b.float()), nl.add)
    assert torch.equal(v(fdst), (a + b).float()) and last().engine == "vector"


def test_tensor_tensor_rules(sim, mk, v):
    _, nl, nisa = sim
    a = mk(torch.randn(64, 8), buffer="psum")
    b = mk(torch.randn(64, 8), buffer="psum")
    s = mk(torch.randn(64, 8))
    dst = nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.sbuf)
    with pytest.raises(NkiValidationError, match="data1 and data2 cannot both be in PSUM"):
        nisa.tensor_tensor(dst, a, b, nl.add)
    nisa.tensor_tensor(dst, a, s, nl.add)  # one PSUM input is fine
    with pytest.raises(NkiValidationError, match="partition dim 32 does not match"):
        nisa.tensor_tensor(dst, s, mk(torch.randn(32, 16)), nl.add)
    with pytest.raises(NkiValidationError, match="elements per partition"):
        nisa.tensor_tensor(dst, s, mk(torch.randn(64, 9)), nl.add)
    hbm = nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    with pytest.raises(NkiValidationError, match="data2 is in HBM"):
        nisa.tensor_tensor(dst, s, hbm, nl.add)
    # v2.33: power "runs on the GpSimd engine" and takes no tile in PSUM (an input or dst)
    with pytest.raises(NkiValidationError, match="op power cannot take tiles in PSUM"):
        nisa.tensor_tensor(dst, a, s, nl.power)
    psum_dst = nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.psum)
    with pytest.raises(NkiValidationError, match="op power cannot take tiles in PSUM"):
        nisa.tensor_tensor(psum_dst, s, s, nl.power)
    with pytest.raises(NkiValidationError, match="op power runs on the GpSimd engine only; got engine=vector"):
        nisa.tensor_tensor(dst, s, s, nl.power, engine=nisa.engine.vector)
    base = torch.rand(64, 8) + 0.5
    expo = torch.randn(64, 8)
    nisa.tensor_tensor(dst, mk(base), mk(expo), nl.power)          # SBUF on GpSimd: fine
    close(v(dst), base ** expo)


def test_tensor_scalar_two_ops_reverse_and_vector_operand(sim, mk, v, last):
    _, nl, nisa = sim
    x = torch.randn(96, 50)
    col = torch.randn(96, 1)
    dst = nl.ndarray((96, 50), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst, mk(x), nl.subtract, mk(col), op1=nl.multiply, operand1=3.0)
    close(v(dst), (x - col) * 3.0)
    nisa.tensor_scalar(dst, mk(x), nl.subtract, 2.0, reverse0=True, op1=nl.subtract,
                       operand1=mk(col), reverse1=True)
    close(v(dst), col - (2.0 - x))
    nisa.tensor_scalar(dst, mk(x.abs() + 0.1), nl.rsqrt, None)
    close(v(dst), torch.rsqrt(x.abs() + 0.1))
    assert last().attrs == {"op0": "rsqrt", "op1": None}


def test_tensor_scalar_rounds_once_into_bf16(sim, mk, v):
    _, nl, nisa = sim
    x = torch.randn(64, 128)
    dst = nl.ndarray((64, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_scalar(dst, mk(x), nl.multiply, 1.0009765625, op1=nl.add, operand1=0.0078125)
    once = (x * 1.0009765625 + 0.0078125).to(torch.bfloat16).float()
    assert torch.equal(v(dst), once)


@pytest.mark.parametrize("kwargs, msg", [
    (dict(op0="subtract", operand0=("bf16col",)), "operand tile must be float32"),
    (dict(op0="add", operand0=("col32",)), "partition dim 32 does not match"),
    (dict(op0="add", operand0=1.0, op1="bitwise_and", operand1=1), "both be bitvec or both"),
    (dict(op0="multiply", operand0=1.0, op1="subtract", operand1=1.0, engine="scalar"),
     "Scalar engine supports only"),
    (dict(op0="bitwise_and", operand0=3, engine="gpsimd"), "must run on the Vector engine, got engine=gpsimd"),
    (dict(op0="bitwise_or", operand0=3, engine="scalar"), "must run on the Vector engine, got engine=scalar"),
])
def test_tensor_scalar_rules(sim, mk, kwargs, msg):
    _, nl, nisa = sim
    x = mk(torch.randn(64, 8))
    dst = nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.sbuf)
    kw = dict(kwargs)
    kw["op0"] = getattr(nl, kw["op0"])
    if "op1" in kw:
        kw["op1"] = getattr(nl, kw["op1"])
    if kw["operand0"] == ("bf16col",):
        kw["operand0"] = mk(torch.randn(64, 1), "bfloat16")
    if kw["operand0"] == ("col32",):
        kw["operand0"] = mk(torch.randn(32, 1))
    if "engine" in kw:
        kw["engine"] = getattr(nisa.engine, kw["engine"])
    with pytest.raises(NkiValidationError, match=msg):
        nisa.tensor_scalar(dst, x, **kw)


@pytest.mark.parametrize("op, ref", [
    ("add", lambda x, d: x.sum(d)), ("maximum", lambda x, d: x.amax(d)),
    ("minimum", lambda x, d: x.amin(d)), ("multiply", lambda x, d: x.prod(d)),
])
def test_tensor_reduce(sim, mk, v, op, ref):
    _, nl, nisa = sim
    x = torch.rand(100, 4, 6) + 0.5
    dst = nl.ndarray((100, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst, getattr(nl, op), mk(x), axis=2)
    close(v(dst), ref(x, 2), ("f", 1e-5, 1e-5))
    dst2 = nl.ndarray((100, 1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst2, getattr(nl, op), mk(x), axis=(1, 2), negate=True, keepdims=True)
    close(v(dst2).reshape(100), -ref(x.reshape(100, 24), 1), ("f", 1e-4, 1e-5))


def test_tensor_reduce_rules(sim, mk):
    _, nl, nisa = sim
    x = mk(torch.randn(16, 4, 6))
    with pytest.raises(NkiValidationError, match="partition dim"):
        nisa.tensor_reduce(nl.ndarray((1, 24), dtype=nl.float32, buffer=nl.sbuf), nl.add, x, axis=0)
    with pytest.raises(NkiValidationError, match="last contiguous free axes"):
        nisa.tensor_reduce(nl.ndarray((16, 6), dtype=nl.float32, buffer=nl.sbuf), nl.add, x, axis=1)
    with pytest.raises(NkiValidationError, match="elements per partition"):
        nisa.tensor_reduce(nl.ndarray((16, 5), dtype=nl.float32, buffer=nl.sbuf), nl.add, x, axis=2)
    with pytest.raises(NkiValidationError, match="not a legal reduction"):
        nisa.tensor_reduce(nl.ndarray((16, 4), dtype=nl.float32, buffer=nl.sbuf), nl.power, x, axis=2)


def test_scalar_tensor_tensor(sim, mk, v):
    _, nl, nisa = sim
    x, y, c = torch.randn(64, 30), torch.randn(64, 30), torch.randn(64, 1)
    dst = nl.ndarray((64, 30), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=dst, data=mk(x), op0=nl.multiply, operand0=mk(c),
                              op1=nl.add, operand1=mk(y))
    close(v(dst), x * c + y)
    nisa.scalar_tensor_tensor(dst, mk(x), nl.subtract, 1.5, nl.subtract, mk(y), reverse0=True,
                              reverse1=True)
    close(v(dst), y - (1.5 - x))


@pytest.mark.parametrize("op, ref", [("add", lambda t: t.sum(1, keepdim=True)),
                                     ("maximum", lambda t: t.amax(1, keepdim=True)),
                                     ("minimum", lambda t: t.amin(1, keepdim=True))])
def test_scalar_tensor_tensor_fused_reduction(sim, mk, v, last, op, ref):
    # v2.33 signature: reduce_cmd=reset_reduce, reduce_op, reduce_res after reverse1; the
    # result's free-axis reduction through the VectorE accumulators, as tensor_scalar_reduce's
    _, nl, nisa = sim
    x, y, c = torch.randn(64, 3, 10), torch.randn(64, 3, 10), torch.randn(64, 1)
    dst = nl.ndarray((64, 3, 10), dtype=nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((64, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst, mk(x), nl.multiply, mk(c), nl.add, mk(y),
                              reduce_op=getattr(nl, op), reduce_res=res)
    first = (x * c[:, :, None] + y).reshape(64, -1)
    close(v(dst), x * c[:, :, None] + y)
    close(v(res), ref(first))
    assert last().attrs["reduce_op"] == op and [o.role for o in last().writes] == ["dst", "reduce_res"]
    # reduce_cmd=reduce keeps accumulating into the same registers
    nisa.scalar_tensor_tensor(dst, mk(y), nl.subtract, 0.5, nl.multiply, mk(x),
                              reduce_cmd=nisa.reduce_cmd.reduce, reduce_op=getattr(nl, op), reduce_res=res)
    second = ((y - 0.5) * x).reshape(64, -1)      # (the accumulators persist between calls)
    both = torch.cat([first, second], dim=1)
    close(v(res), ref(both), ("f", 1e-5, 1e-5))


def test_scalar_tensor_tensor_reduction_rules_and_cost(sim, mk, last):
    from nki_kernels.simulator.cost import compute_cost
    from nki_kernels.simulator.hardware import TARGETS

    _, nl, nisa = sim
    x, y = mk(torch.randn(64, 40)), mk(torch.randn(64, 40))
    dst = nl.ndarray((64, 40), dtype=nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((64, 1), dtype=nl.float32, buffer=nl.sbuf)
    with pytest.raises(NkiValidationError, match="reduce_res is given but reduce_op is not"):
        nisa.scalar_tensor_tensor(dst, x, nl.multiply, 2.0, nl.add, y, reduce_res=res)
    with pytest.raises(NkiValidationError, match="reduce_op .*power.* is not supported"):
        nisa.scalar_tensor_tensor(dst, x, nl.multiply, 2.0, nl.add, y, reduce_op=nl.power, reduce_res=res)
    with pytest.raises(NkiValidationError, match="reduce_cmd=.*idle.* is not supported with a reduction"):
        nisa.scalar_tensor_tensor(dst, x, nl.multiply, 2.0, nl.add, y, reduce_op=nl.add, reduce_res=res,
                                  reduce_cmd=nisa.reduce_cmd.idle)
    with pytest.raises(NkiValidationError, match=r"reduce_res must be \(64, 1\)"):
        nisa.scalar_tensor_tensor(dst, x, nl.multiply, 2.0, nl.add, y, reduce_op=nl.add,
                                  reduce_res=nl.ndarray((64, 2), dtype=nl.float32, buffer=nl.sbuf))
    # the fused reduction costs the accumulator read-out on top of the plain instruction
    target = TARGETS["trn2"]
    nisa.scalar_tensor_tensor(dst, x, nl.multiply, 2.0, nl.add, y)
    plain = compute_cost(last(), target).cycles
    nisa.scalar_tensor_tensor(dst, x, nl.multiply, 2.0, nl.add, y, reduce_op=nl.add, reduce_res=res)
    assert compute_cost(last(), target).cycles == plain + target.vector_reduce_readout_cycles


def test_rank_limits_of_memset_and_reciprocal(sim, mk, v):
    # v2.33 nki.isa.memset / reciprocal: "at most four free dimensions (maximum rank 5)", also
    # for a contiguous tile whose access pattern would merge to fewer
    _, nl, nisa = sim
    six = nl.ndarray((8, 2, 2, 2, 2, 2), dtype=nl.float32, buffer=nl.sbuf)
    with pytest.raises(NkiValidationError, match=r"memset: dst has rank 6 .*at most 5"):
        nisa.memset(six, 1.0)
    with pytest.raises(NkiValidationError, match=r"reciprocal: data has rank 6 .*at most 5"):
        nisa.reciprocal(nl.ndarray((8, 2, 2, 2, 2, 2), dtype=nl.float32, buffer=nl.sbuf), six)
    five = nl.ndarray((8, 2, 2, 2, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(five, 2.0)
    x = torch.rand(8, 2, 2, 2, 4) + 0.5
    nisa.reciprocal(five, mk(x))
    close(v(five), 1 / x)


def test_activation_engine_parameter(sim, mk, v):
    # v2.33 signature: engine=engine.scalar; GpSimd only on NeuronCore-v4+, which this
    # simulator refuses (its cost is not documented)
    from nki_kernels import simulator

    _, nl, nisa = sim
    x = torch.randn(32, 16)
    dst = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst, nl.exp, mk(x), engine=nisa.engine.scalar)
    close(v(dst), torch.exp(x))
    with pytest.raises(NkiValidationError, match=r"engine=gpsimd needs NeuronCore-v4 \(trn3\) or newer.*trn2"):
        nisa.activation(dst, nl.exp, mk(x), engine=nisa.engine.gpsimd)
    with pytest.raises(NkiValidationError, match="engine vector is not supported"):
        nisa.activation(dst, nl.exp, mk(x), engine=nisa.engine.vector)
    with simulator.activated("trn3") as nki:
        nl3, nisa3 = nki.language, nki.isa
        src = nl3.ndarray((32, 16), dtype=nl3.float32, buffer=nl3.sbuf)
        with pytest.raises(NkiValidationError, match="engine=gpsimd .* not supported by this simulator"):
            nisa3.activation(nl3.ndarray((32, 16), dtype=nl3.float32, buffer=nl3.sbuf), nl3.exp, src,
                             engine=nisa3.engine.gpsimd)


def test_tensor_scalar_reduce(sim, mk, v):
    _, nl, nisa = sim
    x, c = torch.randn(64, 30), torch.randn(64, 1)
    dst = nl.ndarray((64, 30), dtype=nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((64, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(dst=dst, data=mk(x), op0=nl.multiply, operand0=mk(c),
                              reduce_op=nl.max, reduce_res=res)
    close(v(dst), x * c)
    close(v(res), (x * c).amax(1, keepdim=True))
    nisa.tensor_scalar_reduce(dst, mk(x), nl.add, 1.0, nl.add, res,
                              reduce_cmd=nisa.reduce_cmd.reduce, reduce_res_negate=True)
    close(v(res), -((x * c).amax(1, keepdim=True) + (x + 1).sum(1, keepdim=True)), ("f", 1e-5, 1e-5))


def test_tensor_copy_casts_and_rules(sim, mk, v, last):
    _, nl, nisa = sim
    x = torch.randn(128, 70) * 100
    dst = nl.ndarray((128, 70), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_copy(dst, mk(x, buffer="psum"))
    assert torch.equal(v(dst), x.to(torch.bfloat16).float())
    idst = nl.ndarray((128, 70), dtype=nl.int16, buffer=nl.sbuf)
    nisa.tensor_copy(idst, mk(x), engine=nisa.engine.gpsimd)
    assert torch.equal(idst.values(), torch.round(x).long())
    assert last().engine == "gpsimd"
    with pytest.raises(NkiValidationError, match="GpSimd engine cannot access PSUM"):
        nisa.tensor_copy(dst, mk(x, buffer="psum"), engine=nisa.engine.gpsimd)


def test_memset(sim, v):
    _, nl, nisa = sim
    t = nl.ndarray((32, 7), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.memset(dst=t, value=1.00390625)  # not representable in bf16: rounds to 1.0
    assert torch.equal(v(t), torch.ones(32, 7))
    i = nl.ndarray((32, 7), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(i, 7)
    assert (i.values() == 7).all()
    with pytest.raises(NkiValidationError, match="does not match integer"):
        nisa.memset(i, 0.5)


def test_reciprocal(sim, mk, v):
    _, nl, nisa = sim
    x = torch.randn(50, 40)
    dst = nl.ndarray((50, 40), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst, mk(x))
    close(v(dst), 1 / x)


def test_iota_and_affine_select(sim, mk, v):
    _, nl, nisa = sim
    io = nl.ndarray((16, 4, 5), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(io, [[10, 4], [1, 5]], offset=3, channel_multiplier=100)
    p, i, j = torch.meshgrid(torch.arange(16), torch.arange(4), torch.arange(5), indexing="ij")
    assert torch.equal(io.values(), 3 + 100 * p + 10 * i + j)
    x = torch.randn(64, 64)
    dst = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
    # causal mask: keep where row - col >= 0
    nisa.affine_select(dst, [[-1, 64]], 1, mk(x), -1e30, cmp_op=nl.greater_equal)
    ref = torch.where(torch.tril(torch.ones(64, 64)) > 0, x, torch.tensor(-1e30))
    assert torch.equal(v(dst), ref)
    with pytest.raises(NkiValidationError, match="iota: dst must be in SBUF"):
        nisa.iota(nl.ndarray((16, 20), dtype=nl.float32, buffer=nl.psum), [[1, 20]])
    with pytest.raises(NkiValidationError, match="pattern covers 19"):
        nisa.iota(nl.ndarray((16, 20), dtype=nl.float32, buffer=nl.sbuf), [[1, 19]])


def test_select_reduce(sim, mk, v):
    _, nl, nisa = sim
    x = torch.randn(64, 33)
    pred = torch.randint(0, 2, (64, 33))
    dst = nl.ndarray((64, 33), dtype=nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((64, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst, mk(pred, "uint8"), mk(x), -5.0, reduce_res=res,
                       reduce_cmd=nisa.reduce_cmd.reset_reduce)
    ref = torch.where(pred != 0, x, torch.tensor(-5.0))
    assert torch.equal(v(dst), ref)
    assert torch.equal(v(res), ref.amax(1, keepdim=True))
    with pytest.raises(NkiValidationError, match="predicate dtype"):
        nisa.select_reduce(dst, mk(pred.float()), mk(x), 0.0)
    int_res = nl.ndarray((64, 1), dtype=nl.int32, buffer=nl.sbuf)
    with pytest.raises(NkiValidationError, match="reduce_res dtype int32 must be a float type"):
        nisa.select_reduce(dst, mk(pred, "uint8"), mk(x), -5.0, reduce_res=int_res,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce)


def test_bn_stats_and_bn_aggr(sim, mk, v):
    _, nl, nisa = sim
    x = torch.randn(128, 1000) * 3 + 1
    stats = nl.ndarray((128, 12), dtype=nl.float32, buffer=nl.sbuf)
    xt = mk(x)
    nisa.bn_stats(stats[:, 0:6], xt[:, 0:500])
    nisa.bn_stats(stats[:, 6:12], xt[:, 500:1000])
    half = x[:, 0:500]
    close(v(stats)[:, 0:3], torch.stack([torch.full((128,), 250.0), half[:, 0::2].mean(1),
                                         half[:, 0::2].var(1, unbiased=False) * 250], 1),
          ("f", 1e-3, 1e-4))
    mv = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.bn_aggr(mv, stats)
    close(v(mv), torch.stack([x.mean(1), x.var(1, unbiased=False)], 1), ("f", 1e-4, 1e-4))
    with pytest.raises(NkiValidationError, match="exceeds maximum 512"):
        nisa.bn_stats(stats[:, 0:6], xt[:, 0:513])


def test_start_partition_rules_both_directions(sim, mk):
    _, nl, nisa = sim
    x = mk(torch.randn(128, 8))
    dst = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst[64:128], x[64:128])   # 64 partitions at 64: fine
    nisa.tensor_copy(dst[96:120], x[96:120])   # 24 partitions at 96: fine
    with pytest.raises(NkiValidationError, match="starting at partition 32"):
        nisa.tensor_copy(dst[32:96], x[32:96])  # 64 partitions at 32
    with pytest.raises(NkiValidationError, match="starting at partition 5"):
        nisa.tensor_copy(dst[5:6], x[5:6])
    # tensor_tensor's inputs may start at different partitions (the docstring requires only
    # equal partition counts and elements per partition)
    nisa.tensor_tensor(dst[0:32], x[0:32], x[32:64], nl.add)
    assert torch.equal(dst.values()[0:32], x.values()[0:32] + x.values()[32:64])

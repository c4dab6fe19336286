"""ScalarE instructions: ``activation`` and ``activation_reduce``.

``dst = op(data * scale + bias)`` with exact fp32 formulas for the activation functions
(ops.py), and an optional add-reduction into the 128 per-lane ScalarE accumulators
(``scalar_regs`` of the run's context).
"""

from __future__ import annotations

from .. import ops as _ops
from ..context import current
from ..tensor import NkiTensor
from . import enums
from .operands import (check_reduce_cmd, engine_of, f32, fail, free_elems, is_scalar, lanes, onchip,
                       operand_vec, record, reduce_free, require_generation, same_free, same_partitions, store,
                       target, update_regs)


def _bias_scale(I, data, bias, scale):
    if isinstance(scale, NkiTensor):
        s = operand_vec(I, "scale", scale, data, need_f32=True)
    elif is_scalar(scale):
        s = float(scale)
    else:
        fail(f"{I}: scale must be a float or a (P, 1) float32 tile, got {type(scale).__name__}")
    if bias is None:
        b = 0.0
    elif isinstance(bias, NkiTensor):
        if bias.dtype.name == "tfloat32":
            fail(f"{I}: bias dtype tfloat32 is not supported; use a float32 (P, 1) tile")
        b = operand_vec(I, "bias", bias, data)
    else:
        require_generation(I, 3, "a scalar bias", supported=target().activation_scalar_bias,
                           hint="bias must be a (P, 1) tile there")
        b = operand_vec(I, "bias", bias, data)
    return s, b


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=enums.reduce_cmd.idle, engine=enums.engine.scalar, name=None):
    """``dst = op(data * scale + bias)`` on ScalarE, with optional free-axis reduction of the
    result into the 128 per-lane accumulator registers, read out into ``reduce_res``.
    ``engine`` (v2.33): Scalar, or GpSimd "on NeuronCore-v4+", which this simulator refuses
    (no AWS figure prices an activation on GpSimd, so the cost model could not)."""
    I = "activation"
    eng = engine_of(I, engine, ("scalar", "gpsimd"), "scalar")
    if eng == "gpsimd":
        require_generation(I, 4, "engine=gpsimd", source="nki.isa.activation, v2.33")
        fail(f"{I}: engine=gpsimd (NeuronCore-v4+) is not supported by this simulator: no AWS "
             "figure prices an activation on GpSimd; use the Scalar engine")
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    same_partitions(I, "data", data, "dst", dst)
    same_free(I, "data", data, "dst", dst)
    f = _ops.resolve(op)
    if f.act is None:
        fail(f"{I}: op {f!r} is not an activation function (supported: "
             f"{', '.join(_ops.ACTIVATIONS)})")
    cmd = check_reduce_cmd(I, reduce_cmd)
    # reduce_cmd: idle, reset, reduce or reset_reduce (NKI 0.7 nki.isa.activation); ScalarE's
    # registers have no load_reduce (no initial-value operand)
    if cmd is enums.reduce_cmd.load_reduce:
        fail(f"{I}: reduce_cmd load_reduce is not supported (idle, reset, reduce, reset_reduce)")
    s, b = _bias_scale(I, data, bias, scale)
    x = f32(data)
    if not (isinstance(s, float) and s == 1.0):
        x = x * s
    if not (isinstance(b, float) and b == 0.0):
        x = x + b
    y = f.act(x)
    store(I, dst, y)
    reduces = cmd is not enums.reduce_cmd.idle or reduce_res is not None
    if reduces:
        ro = "add" if reduce_op is None else _ops.alu_of(
            _ops.resolve(reduce_op, "reduce_op"), I, "reduce_op").name
        # ScalarE's reduction registers can only sum (NKI 0.7 / Neuron 2.33 docs of
        # nisa.activation): max/min need a separate tensor_reduce (or activate2 on v4+).
        if ro != "add":
            fail(f"{I}: reduce_op {ro} is not supported; the Scalar engine's reduction "
                 "registers only sum (use nl.add, or a separate nisa.tensor_reduce)")
        ctx = current()
        sl = lanes(data)
        # the reduction sees the fp32 activation output, before the cast to dst's dtype
        r = reduce_free(ro, y) if cmd in (enums.reduce_cmd.reduce,
                                          enums.reduce_cmd.reset_reduce) else None
        update_regs(ctx.scalar_regs, sl, cmd, ro, r)
        if reduce_res is not None:
            onchip(I, "reduce_res", reduce_res)
            same_partitions(I, "data", data, "reduce_res", reduce_res)
            if free_elems(reduce_res) != 1:
                fail(f"{I}: reduce_res must be ({data.shape[0]}, 1), got {reduce_res.shape}")
            store(I, reduce_res, ctx.scalar_regs[sl].reshape(reduce_res.shape))
    return record(I, "scalar", [("data", data), ("bias", bias), ("scale", scale)],
                  [("dst", dst), ("reduce_res", reduce_res)], dst.size,
                  {"func": f.name, "reduce": reduce_res is not None, "reduce_cmd": cmd.name})


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """``activation`` with reduce_cmd=reset_reduce, reading the result into ``reduce_res``."""
    return activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op,
                      reduce_res=reduce_res, reduce_cmd=enums.reduce_cmd.reset_reduce)

"""Activation ops: gelu, silu (kernels/elementwise.py) and the gated silu_and_mul /
gelu_and_mul (kernels/activation_and_mul.py).

Per op: its NKI launch (``<op>_kernel_call``), its custom op (``_custom_op.define_op``:
dispatch, fake, backward), the public function with the ``torch.nn.functional``
signature, and its registration (twin, eager model, workloads).

Backward: each op's backward custom op (``<op>_backward``) runs kernels/activation_backward.py
(``neuron``, simulator backend) or backward_references.py (reference backend); gelu's tanh
approximation (no ScalarE derivative function) and empty inputs take the recompute
backward (PyTorch ops in fp32).
"""

from __future__ import annotations

import torch

from .. import _checks, _dispatch, backward_references, references, registry, roofline
from .._custom_op import KernelBackward, define_op
from ._workloads import VIT_TOKENS, randn

__all__ = ["gelu", "gelu_and_mul", "silu", "silu_and_mul"]

GELU_APPROXIMATIONS = ("none", "tanh")
# kernels/elementwise.py and kernels/activation_and_mul.py name gelu's two forms this way
_GELU_KERNEL_OP = {"none": "gelu", "tanh": "gelu_tanh"}


def _fp32(fn):
    """``fn`` of the twins computed in fp32: what the recompute backward differentiates."""
    return lambda *args: fn(*args, compute_dtype=torch.float32)


# ---------------------------------------------------------------------------- gelu

def gelu_kernel_call(input: torch.Tensor, approximate: str = "none") -> _dispatch.KernelCall:
    """The NKI launch computing ``gelu(input)``: kernels/elementwise.py, any shape, one pass."""
    return _dispatch.KernelCall("elementwise", "elementwise_kernel", (input,),
                                {"op": _GELU_KERNEL_OP[approximate]})


# Activations whose derivative ScalarE computes (kernels/activation_backward.py FUNCTIONS).
_BACKWARD_KERNEL_OPS = ("gelu", "silu")


def _backward_kernel_op(approximate: str) -> str:
    op = _GELU_KERNEL_OP[approximate]
    if op not in _BACKWARD_KERNEL_OPS:
        raise ValueError(f"approximate={approximate!r}: the NKI backward kernels take gelu's erf form only "
                         "(ScalarE has no derivative of the tanh approximation); its backward recomputes")
    return op


def gelu_backward_kernel_call(grad_output: torch.Tensor, input: torch.Tensor,
                              approximate: str = "none") -> _dispatch.KernelCall:
    """The NKI launch of gelu's backward: kernels/activation_backward.py, any shape."""
    return _dispatch.KernelCall("activation_backward", "elementwise_backward_kernel", (grad_output, input),
                                {"op": _backward_kernel_op(approximate)})


def _gelu_backward(grad_output: torch.Tensor, input: torch.Tensor, approximate: str) -> torch.Tensor: ...


_gelu_backward_op = define_op(
    _gelu_backward, kernel_call=gelu_backward_kernel_call, reference=backward_references.gelu_backward,
    fake=lambda dy, input, approximate: torch.empty_like(input), grad_reference=_fp32(backward_references.gelu_backward))


def _gelu(input: torch.Tensor, approximate: str) -> torch.Tensor: ...


_gelu_op = define_op(_gelu, kernel_call=gelu_kernel_call, reference=references.gelu,
                     fake=lambda input, approximate: torch.empty_like(input),
                     grad_reference=_fp32(references.gelu),
                     backward=KernelBackward(
                         lambda inputs, outputs, grads: (_gelu_backward_op(grads[0], inputs[0], inputs[1]), None),
                         applies=lambda input, approximate: approximate == "none" and input.numel() > 0))


def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU with the ``torch.nn.functional.gelu`` contract.

    Shapes: any; dtypes: float32, bfloat16, float16. ``approximate``: "none" (erf) or
    "tanh". Runs the NKI kernel on neuron tensors; on CPU the reference, or the kernel in
    the simulator with ``NKI_KERNELS_CPU_BACKEND=simulator``. Numerics: the activation in
    fp32 (the simulator's formula is exact in fp32; ScalarE's hardware approximation is not
    modeled), one rounding to the dtype. Backward: NKI kernel (kernels/activation_backward.py)
    for the erf form; the tanh approximation recomputes with PyTorch ops.
    """
    _checks.check_float_tensor("input", input)
    _checks.check_choice("approximate", approximate, GELU_APPROXIMATIONS)
    return _gelu_op(input, approximate)


# ---------------------------------------------------------------------------- silu

def silu_kernel_call(input: torch.Tensor) -> _dispatch.KernelCall:
    """The NKI launch computing ``silu(input)``: kernels/elementwise.py, any shape, one pass."""
    return _dispatch.KernelCall("elementwise", "elementwise_kernel", (input,), {"op": "silu"})


def silu_backward_kernel_call(grad_output: torch.Tensor, input: torch.Tensor) -> _dispatch.KernelCall:
    """The NKI launch of silu's backward: kernels/activation_backward.py, any shape."""
    return _dispatch.KernelCall("activation_backward", "elementwise_backward_kernel", (grad_output, input),
                                {"op": "silu"})


def _silu_backward(grad_output: torch.Tensor, input: torch.Tensor) -> torch.Tensor: ...


_silu_backward_op = define_op(
    _silu_backward, kernel_call=silu_backward_kernel_call, reference=backward_references.silu_backward,
    fake=lambda dy, input: torch.empty_like(input), grad_reference=_fp32(backward_references.silu_backward))


def _silu(input: torch.Tensor) -> torch.Tensor: ...


_silu_op = define_op(_silu, kernel_call=silu_kernel_call, reference=references.silu,
                     fake=lambda input: torch.empty_like(input), grad_reference=_fp32(references.silu),
                     backward=KernelBackward(lambda inputs, outputs, grads: (_silu_backward_op(grads[0], inputs[0]),),
                                             applies=lambda input: input.numel() > 0))


def silu(input: torch.Tensor) -> torch.Tensor:
    """SiLU with the ``torch.nn.functional.silu`` contract (no ``inplace``).

    Shapes: any; dtypes: float32, bfloat16, float16. Backward: NKI kernel
    (kernels/activation_backward.py).
    """
    _checks.check_float_tensor("input", input)
    return _silu_op(input)


# ---------------------------------------------------------------------------- gated: silu_and_mul / gelu_and_mul

def _check_gated_input(input: torch.Tensor, op_name: str) -> None:
    _checks.check_float_tensor("input", input)
    if input.dim() == 0:
        raise ValueError(f"input is 0-dimensional; {op_name} needs a last dimension of even size 2d")
    if input.shape[-1] % 2 != 0:
        raise ValueError(
            f"input has last dimension {input.shape[-1]} (shape {list(input.shape)}); {op_name} "
            "needs an even size 2d to split into act(x[..., :d]) * x[..., d:]"
        )


def _act_and_mul_kernel_call(input: torch.Tensor, act: str) -> _dispatch.KernelCall:
    """The NKI launch: kernels/activation_and_mul.py on ``input`` viewed as [N, 2d]."""
    in_cols = input.shape[-1]
    out_shape = tuple(input.shape[:-1]) + (in_cols // 2,)
    return _dispatch.KernelCall("activation_and_mul", "act_and_mul_kernel",
                                (input.reshape(-1, in_cols),), {"act": act},
                                finish=lambda out: out.reshape(out_shape))


def silu_and_mul_kernel_call(input: torch.Tensor) -> _dispatch.KernelCall:
    """The NKI launch computing ``silu_and_mul(input)``."""
    return _act_and_mul_kernel_call(input, "silu")


def gelu_and_mul_kernel_call(input: torch.Tensor, approximate: str = "none") -> _dispatch.KernelCall:
    """The NKI launch computing ``gelu_and_mul(input, approximate)``."""
    return _act_and_mul_kernel_call(input, _GELU_KERNEL_OP[approximate])


def _gated_empty(input: torch.Tensor, *_) -> torch.Tensor:
    return input.new_empty(tuple(input.shape[:-1]) + (input.shape[-1] // 2,))


def _act_and_mul_backward_kernel_call(grad_output: torch.Tensor, input: torch.Tensor, act: str) -> _dispatch.KernelCall:
    """The NKI launch of a gated op's backward: kernels/activation_backward.py on [N, 2d]."""
    in_cols = input.shape[-1]
    shape = input.shape
    return _dispatch.KernelCall("activation_backward", "act_and_mul_backward_kernel",
                                (grad_output.reshape(-1, in_cols // 2), input.reshape(-1, in_cols)), {"act": act},
                                finish=lambda dx: dx.reshape(shape))


def silu_and_mul_backward_kernel_call(grad_output: torch.Tensor, input: torch.Tensor) -> _dispatch.KernelCall:
    """The NKI launch of silu_and_mul's backward."""
    return _act_and_mul_backward_kernel_call(grad_output, input, "silu")


def gelu_and_mul_backward_kernel_call(grad_output: torch.Tensor, input: torch.Tensor,
                                      approximate: str = "none") -> _dispatch.KernelCall:
    """The NKI launch of gelu_and_mul's backward (erf form only)."""
    return _act_and_mul_backward_kernel_call(grad_output, input, _backward_kernel_op(approximate))


def _silu_and_mul_backward(grad_output: torch.Tensor, input: torch.Tensor) -> torch.Tensor: ...


_silu_and_mul_backward_op = define_op(
    _silu_and_mul_backward, kernel_call=silu_and_mul_backward_kernel_call,
    reference=backward_references.silu_and_mul_backward, fake=lambda dy, input: torch.empty_like(input),
    grad_reference=_fp32(backward_references.silu_and_mul_backward))


def _gelu_and_mul_backward(grad_output: torch.Tensor, input: torch.Tensor, approximate: str) -> torch.Tensor: ...


_gelu_and_mul_backward_op = define_op(
    _gelu_and_mul_backward, kernel_call=gelu_and_mul_backward_kernel_call,
    reference=backward_references.gelu_and_mul_backward, fake=lambda dy, input, approximate: torch.empty_like(input),
    grad_reference=_fp32(backward_references.gelu_and_mul_backward))


def _silu_and_mul(input: torch.Tensor) -> torch.Tensor: ...


_silu_and_mul_op = define_op(_silu_and_mul, kernel_call=silu_and_mul_kernel_call, reference=references.silu_and_mul,
                             fake=_gated_empty, grad_reference=_fp32(references.silu_and_mul),
                             backward=KernelBackward(
                                 lambda inputs, outputs, grads: (_silu_and_mul_backward_op(grads[0], inputs[0]),),
                                 applies=lambda input: input.numel() > 0))


def silu_and_mul(input: torch.Tensor) -> torch.Tensor:
    """SwiGLU gate: ``silu(x[..., :d]) * x[..., d:]`` for ``x = [..., 2d]`` -> ``[..., d]``.

    The kernels-community ``activation`` contract (functional form). dtypes: float32,
    bfloat16, float16. Backward: NKI kernel (kernels/activation_backward.py).
    """
    _check_gated_input(input, "silu_and_mul")
    return _silu_and_mul_op(input)


def _gelu_and_mul(input: torch.Tensor, approximate: str) -> torch.Tensor: ...


_gelu_and_mul_op = define_op(_gelu_and_mul, kernel_call=gelu_and_mul_kernel_call, reference=references.gelu_and_mul,
                             fake=_gated_empty, grad_reference=_fp32(references.gelu_and_mul),
                             backward=KernelBackward(
                                 lambda inputs, outputs, grads: (
                                     _gelu_and_mul_backward_op(grads[0], inputs[0], inputs[1]), None),
                                 applies=lambda input, approximate: approximate == "none" and input.numel() > 0))


def gelu_and_mul(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GeGLU gate: ``gelu(x[..., :d], approximate) * x[..., d:]`` for ``x = [..., 2d]``.

    ``approximate``: "none" (erf, kernels-community ``gelu_and_mul``) or "tanh"
    (``gelu_tanh_and_mul``). dtypes: float32, bfloat16, float16. Backward: NKI kernel
    (kernels/activation_backward.py) for the erf form; "tanh" recomputes with PyTorch ops.
    """
    _check_gated_input(input, "gelu_and_mul")
    _checks.check_choice("approximate", approximate, GELU_APPROXIMATIONS)
    return _gelu_and_mul_op(input, approximate)


# ---------------------------------------------------------------------------- registration

def _grad_inputs(out_shape):
    """Backward op arguments from a forward workload: (dy of the output's shape, input, *rest)."""
    def inputs(gen, args, kwargs):
        x = args[0]
        return (randn(gen, *out_shape(x), dtype=x.dtype), *args), dict(kwargs)
    return inputs


_same_shape = _grad_inputs(lambda x: tuple(x.shape))
_gated_shape = _grad_inputs(lambda x: tuple(x.shape[:-1]) + (x.shape[-1] // 2,))

GELU_BACKWARD = registry.Backward(_gelu_backward_op, _same_shape, gelu_backward_kernel_call,
                                  backward_references.gelu_backward, roofline.gelu_backward)
SILU_BACKWARD = registry.Backward(_silu_backward_op, _same_shape, silu_backward_kernel_call,
                                  backward_references.silu_backward, roofline.silu_backward)
SILU_AND_MUL_BACKWARD = registry.Backward(_silu_and_mul_backward_op, _gated_shape, silu_and_mul_backward_kernel_call,
                                          backward_references.silu_and_mul_backward, roofline.silu_and_mul_backward)
GELU_AND_MUL_BACKWARD = registry.Backward(_gelu_and_mul_backward_op, _gated_shape, gelu_and_mul_backward_kernel_call,
                                          backward_references.gelu_and_mul_backward, roofline.gelu_and_mul_backward)


def _rows_workload(name, rows, cols, scale, kwargs, **kw):
    def make(gen):
        return (randn(gen, rows, cols, scale=scale),), dict(kwargs)
    return registry.Workload(f"{name} [{rows}, {cols}]", make, **kw)


registry.register(registry.OpSpec(
    "gelu", gelu, _gelu_op, gelu_kernel_call, references.gelu, roofline.gelu,
    workloads=(_rows_workload("ViT-B/16 MLP B=8", VIT_TOKENS, 3072, 3.0, {"approximate": "none"}, quick=True),
               _rows_workload("ViT-L/16 MLP B=8", VIT_TOKENS, 4096, 3.0, {"approximate": "none"}, large=True)),
    layers=("Gelu", "GeluTanh"), backward=GELU_BACKWARD))
registry.register(registry.OpSpec(
    "silu", silu, _silu_op, silu_kernel_call, references.silu, roofline.silu,
    workloads=(_rows_workload("Llama-7B MLP gate 1024 tok", 1024, 11008, 2.0, {}, large=True),),
    layers=("SiLU",), backward=SILU_BACKWARD))
registry.register(registry.OpSpec(
    "silu_and_mul", silu_and_mul, _silu_and_mul_op, silu_and_mul_kernel_call, references.silu_and_mul,
    roofline.silu_and_mul,
    workloads=(_rows_workload("Llama-7B MLP 1024 tok", 1024, 2 * 11008, 2.0, {}, quick=True, large=True),),
    layers=("SiLUAndMul", "SiluGatedMLP"), backward=SILU_AND_MUL_BACKWARD))
registry.register(registry.OpSpec(
    "gelu_and_mul", gelu_and_mul, _gelu_and_mul_op, gelu_and_mul_kernel_call, references.gelu_and_mul,
    roofline.gelu_and_mul,
    workloads=(_rows_workload("GeGLU 1024 tok", 1024, 2 * 8192, 2.0, {}, large=True),),
    layers=("GeluAndMul", "GeluTanhAndMul"), backward=GELU_AND_MUL_BACKWARD))

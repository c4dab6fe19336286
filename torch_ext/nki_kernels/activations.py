"""Activation ops: custom op, fake, autograd and public function per op."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _checks, _dispatch, references
from ._ops import add_op_namespace_prefix

GELU_APPROXIMATIONS = ("none", "tanh")


# ---------------------------------------------------------------------------- gelu

def gelu_kernel_call(input: torch.Tensor, approximate: str = "none") -> _dispatch.KernelCall:
    """The NKI launch computing ``gelu(input)``: kernels/elementwise.py, any shape, one pass."""
    op = "gelu" if approximate == "none" else "gelu_tanh"
    return _dispatch.KernelCall("elementwise", "elementwise_kernel", (input,), {"op": op})


@torch.library.custom_op(add_op_namespace_prefix("gelu"), mutates_args=())
def _gelu(input: torch.Tensor, approximate: str) -> torch.Tensor:
    if input.numel() == 0:
        return torch.empty_like(input)
    return _dispatch.run(
        lambda: gelu_kernel_call(input, approximate),
        lambda: references.gelu(input, approximate),
        input.device,
    )


@_gelu.register_fake
def _(input: torch.Tensor, approximate: str) -> torch.Tensor:
    return torch.empty_like(input)


def _gelu_setup_context(ctx, inputs, output):
    input, approximate = inputs
    ctx.save_for_backward(input)
    ctx.approximate = approximate


def _gelu_backward(ctx, grad_output):
    # Backward recomputes with PyTorch ops (no NKI backward kernel yet).
    (input,) = ctx.saved_tensors
    with torch.enable_grad():
        x = input.detach().float().requires_grad_(True)
        y = F.gelu(x, approximate=ctx.approximate)
        (grad,) = torch.autograd.grad(y, x, grad_output.float())
    return grad.to(input.dtype), None


_gelu.register_autograd(_gelu_backward, setup_context=_gelu_setup_context)


def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU with the ``torch.nn.functional.gelu`` contract.

    Shapes: any; dtypes: float32, bfloat16, float16. ``approximate``: "none" (erf) or
    "tanh". Runs the NKI kernel on neuron tensors; on CPU the reference, or the kernel in
    the simulator with ``NKI_KERNELS_CPU_BACKEND=simulator``. Backward recomputes with
    PyTorch ops.
    """
    _checks.check_float_tensor("input", input)
    _checks.check_choice("approximate", approximate, GELU_APPROXIMATIONS)
    return _gelu(input, approximate)


# ---------------------------------------------------------------------------- silu

def silu_kernel_call(input: torch.Tensor) -> _dispatch.KernelCall:
    """The NKI launch computing ``silu(input)``: kernels/elementwise.py, any shape, one pass."""
    return _dispatch.KernelCall("elementwise", "elementwise_kernel", (input,), {"op": "silu"})


@torch.library.custom_op(add_op_namespace_prefix("silu"), mutates_args=())
def _silu(input: torch.Tensor) -> torch.Tensor:
    if input.numel() == 0:
        return torch.empty_like(input)
    return _dispatch.run(
        lambda: silu_kernel_call(input),
        lambda: references.silu(input),
        input.device,
    )


@_silu.register_fake
def _(input: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(input)


def _silu_setup_context(ctx, inputs, output):
    (input,) = inputs
    ctx.save_for_backward(input)


def _silu_backward(ctx, grad_output):
    # Backward recomputes with PyTorch ops (no NKI backward kernel yet).
    (input,) = ctx.saved_tensors
    with torch.enable_grad():
        x = input.detach().float().requires_grad_(True)
        (grad,) = torch.autograd.grad(F.silu(x), x, grad_output.float())
    return grad.to(input.dtype)


_silu.register_autograd(_silu_backward, setup_context=_silu_setup_context)


def silu(input: torch.Tensor) -> torch.Tensor:
    """SiLU with the ``torch.nn.functional.silu`` contract (no ``inplace``).

    Shapes: any; dtypes: float32, bfloat16, float16. Backward recomputes with PyTorch ops.
    """
    _checks.check_float_tensor("input", input)
    return _silu(input)


# ---------------------------------------------------------------------------- gated: silu_and_mul / gelu_and_mul

# act name in kernels/activation_and_mul.py for each (op, approximate)
_AND_MUL_ACTS = {("silu", "none"): "silu", ("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_tanh"}


def _check_gated_input(input: torch.Tensor, op_name: str) -> None:
    _checks.check_float_tensor("input", input)
    if input.dim() == 0:
        raise ValueError(f"input is 0-dimensional; {op_name} needs a last dimension of even size 2d")
    if input.shape[-1] % 2 != 0:
        raise ValueError(
            f"input has last dimension {input.shape[-1]} (shape {list(input.shape)}); {op_name} "
            "needs an even size 2d to split into act(x[..., :d]) * x[..., d:]"
        )


def act_and_mul_kernel_call(input: torch.Tensor, act: str) -> _dispatch.KernelCall:
    """The NKI launch: kernels/activation_and_mul.py on ``input`` viewed as [N, 2d]."""
    in_cols = input.shape[-1]
    out_shape = tuple(input.shape[:-1]) + (in_cols // 2,)
    return _dispatch.KernelCall("activation_and_mul", "act_and_mul_kernel",
                                (input.reshape(-1, in_cols),), {"act": act},
                                finish=lambda out: out.reshape(out_shape))


def silu_and_mul_kernel_call(input: torch.Tensor) -> _dispatch.KernelCall:
    """The NKI launch computing ``silu_and_mul(input)``."""
    return act_and_mul_kernel_call(input, "silu")


def gelu_and_mul_kernel_call(input: torch.Tensor, approximate: str = "none") -> _dispatch.KernelCall:
    """The NKI launch computing ``gelu_and_mul(input, approximate)``."""
    return act_and_mul_kernel_call(input, _AND_MUL_ACTS[("gelu", approximate)])


def _gated_empty(input: torch.Tensor) -> torch.Tensor:
    return input.new_empty(tuple(input.shape[:-1]) + (input.shape[-1] // 2,))


def _gated_backward(ctx, grad_output, act):
    (input,) = ctx.saved_tensors
    with torch.enable_grad():
        x = input.detach().float().requires_grad_(True)
        d = x.shape[-1] // 2
        y = act(x[..., :d]) * x[..., d:]
        (grad,) = torch.autograd.grad(y, x, grad_output.float())
    return grad.to(input.dtype)


@torch.library.custom_op(add_op_namespace_prefix("silu_and_mul"), mutates_args=())
def _silu_and_mul(input: torch.Tensor) -> torch.Tensor:
    if input.numel() == 0:
        return _gated_empty(input)
    return _dispatch.run(
        lambda: silu_and_mul_kernel_call(input),
        lambda: references.silu_and_mul(input),
        input.device,
    )


@_silu_and_mul.register_fake
def _(input: torch.Tensor) -> torch.Tensor:
    return _gated_empty(input)


def _silu_and_mul_backward(ctx, grad_output):
    # Backward recomputes with PyTorch ops (no NKI backward kernel yet).
    return _gated_backward(ctx, grad_output, F.silu)


_silu_and_mul.register_autograd(_silu_and_mul_backward, setup_context=_silu_setup_context)


def silu_and_mul(input: torch.Tensor) -> torch.Tensor:
    """SwiGLU gate: ``silu(x[..., :d]) * x[..., d:]`` for ``x = [..., 2d]`` -> ``[..., d]``.

    The kernels-community ``activation`` contract (functional form). dtypes: float32,
    bfloat16, float16. Backward recomputes with PyTorch ops.
    """
    _check_gated_input(input, "silu_and_mul")
    return _silu_and_mul(input)


@torch.library.custom_op(add_op_namespace_prefix("gelu_and_mul"), mutates_args=())
def _gelu_and_mul(input: torch.Tensor, approximate: str) -> torch.Tensor:
    if input.numel() == 0:
        return _gated_empty(input)
    return _dispatch.run(
        lambda: gelu_and_mul_kernel_call(input, approximate),
        lambda: references.gelu_and_mul(input, approximate),
        input.device,
    )


@_gelu_and_mul.register_fake
def _(input: torch.Tensor, approximate: str) -> torch.Tensor:
    return _gated_empty(input)


def _gelu_and_mul_setup_context(ctx, inputs, output):
    input, approximate = inputs
    ctx.save_for_backward(input)
    ctx.approximate = approximate


def _gelu_and_mul_backward(ctx, grad_output):
    # Backward recomputes with PyTorch ops (no NKI backward kernel yet).
    approximate = ctx.approximate
    return _gated_backward(ctx, grad_output, lambda t: F.gelu(t, approximate=approximate)), None


_gelu_and_mul.register_autograd(_gelu_and_mul_backward, setup_context=_gelu_and_mul_setup_context)


def gelu_and_mul(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GeGLU gate: ``gelu(x[..., :d], approximate) * x[..., d:]`` for ``x = [..., 2d]``.

    ``approximate``: "none" (erf, kernels-community ``gelu_and_mul``) or "tanh"
    (``gelu_tanh_and_mul``). dtypes: float32, bfloat16, float16. Backward recomputes with
    PyTorch ops.
    """
    _check_gated_input(input, "gelu_and_mul")
    _checks.check_choice("approximate", approximate, GELU_APPROXIMATIONS)
    return _gelu_and_mul(input, approximate)

"""One helper defines an op's torch custom op: dispatch, fake and autograd.

Every op of the package is a custom op whose body runs, per input device, the NKI kernel
(``kernel_call``) or the PyTorch reference (``_dispatch.run``); whose fake returns empty
outputs of the right shapes (``torch.compile``, meta tensors); and whose backward is
either

* a **kernel backward** (``KernelBackward``): the op's backward is itself a custom op,
  defined with ``define_op`` like any forward op, so its body dispatches the same way (NKI
  backward kernel on ``neuron`` and on the simulator backend, PyTorch math on the
  reference backend), ``torch.compile`` traces it into the backward graph, and opcheck
  checks it; or
* the **recompute backward** (every op without a kernel backward, and the shapes a
  kernel backward declines, ``KernelBackward.applies``): the op recomputed in fp32 with
  PyTorch autograd from the saved inputs.

How the op is registered depends on the host (``_neuron.registrar``):

* where ``torch_neuronx`` imports (the ``torch-neuron`` Hub variant on a Trainium host, or
  any install with torch-neuronx): ``torch_neuronx.nki_op(name, mutates_args={})`` on the
  annotated body, the registration TorchNeuron documents for NKI kernels (``_neuron.py``);
  NOT YET RUN ON HARDWARE;
* elsewhere: ``torch.library.custom_op(name, body, mutates_args=())``.

The body, the fake and the backward are the same in both cases; ``registered_with`` says
which registration each op got.

``define_op`` takes a *typed stub* (a function whose signature, with type annotations, is
the op's schema; its body is not used) and the pieces that differ between ops.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from . import _dispatch, _neuron
from ._ops import add_op_namespace_prefix

TORCH_CUSTOM_OP = "torch.library.custom_op"
NKI_OP = "torch_neuronx.nki_op"
# op name -> TORCH_CUSTOM_OP or NKI_OP: how each op of this process was registered
registered_with: dict[str, str] = {}


def _first_tensor(args: Sequence[Any]) -> torch.Tensor:
    return next(a for a in args if isinstance(a, torch.Tensor))


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


@dataclass(frozen=True)
class KernelBackward:
    """An op's backward through its backward custom op (see the module docstring).

    * ``grads(inputs, outputs, grad_outputs)``: one gradient (or None) per input of the
      forward op, computed by calling the backward custom op; ``inputs`` are the forward
      op's arguments as called (tensors as saved), ``outputs`` its outputs (a tuple; only
      those named by ``save_outputs`` are kept, the others are None), ``grad_outputs`` one
      gradient per output (None where autograd has none: pass zeros to the kernel);
    * ``applies(*inputs)``: whether the backward op takes this call (e.g. within the
      kernel's limits); where it does not, the recompute backward runs (default: always);
    * ``save_outputs``: indices of the forward outputs the backward reads (softmax: its
      output); the others are not kept alive;
    * ``grads_for``: indices of the inputs whose gradients ``grads`` computes (None: all);
      when autograd needs the gradient of another input (e.g. rotary's cos), the recompute
      backward runs.
    """

    grads: Callable[..., tuple]
    applies: Callable[..., bool] = lambda *inputs: True
    save_outputs: tuple[int, ...] = ()
    grads_for: tuple[int, ...] | None = None


def _in_fake_layout(result, fake: Callable, args: tuple):
    """``result`` with every output in the layout (strides) the op's ``fake`` gives.

    torch.compile traces an op through its fake and checks the real outputs against it, so
    the two must agree whatever the inputs' layout; the backends compute in their own (the
    kernels on contiguous copies, the references in torch's), so an output in another
    layout is copied into the fake's. With contiguous inputs every fake is contiguous
    (tests/ops/test_opcheck.py checks both), so that common case costs nothing."""
    outs = result if isinstance(result, tuple) else (result,)
    if (all(a.is_contiguous() for a in args if isinstance(a, torch.Tensor))
            and all(o is None or o.is_contiguous() for o in outs)):
        return result
    wanted = fake(*args)
    wanted = wanted if isinstance(wanted, tuple) else (wanted,)
    fixed = tuple(o if o is None or w is None or o.stride() == w.stride() else w.copy_(o)
                  for o, w in zip(outs, wanted))
    return fixed if isinstance(result, tuple) else fixed[0]


def _own_outputs(result, args: tuple):
    """``result`` with every output that is a view of a tensor the op made (the kernel
    backends' ``finish`` reshapes the kernel's [rows, hidden] output back to the input's
    shape) returned as a tensor of its own, sharing that memory (``detach``: no copy).
    Returned as a view, autograd marked it as the view of a custom op's output and refused
    in-place changes to it (``y.add_(1)`` after rms_norm: "Output 0 of GeneratedBackwardFor...
    is a view and is being modified inplace"), which torch's own ops and the reference
    backend allow. A view of an argument's memory is left as it is (an op must not hide
    that it aliases an input)."""
    outs = result if isinstance(result, tuple) else (result,)
    if all(o is None or o._base is None for o in outs):
        return result
    inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
    own = tuple(o if o is None or o._base is None or o.untyped_storage().data_ptr() in inputs
                else o.detach() for o in outs)
    return own if isinstance(result, tuple) else own[0]


def define_op(stub: Callable, *, kernel_call: Callable, reference: Callable, fake: Callable,
              grad_reference: Callable, is_empty: Callable | None = None,
              backward: KernelBackward | None = None):
    """The custom op ``<namespace>::<stub name without leading _>`` with the stub's schema.

    * ``kernel_call(**args)``: the NKI launch (``_dispatch.KernelCall``), args by name;
    * ``reference(*args)``: the result on the reference backend;
    * ``fake(*args)``: empty outputs with the result's shapes, dtypes and strides;
    * ``grad_reference(*args)``: the op written with differentiable PyTorch ops, called
      with fp32 copies of the tensor arguments (the backward differentiates it);
    * ``is_empty(*args)``: True when the result has no elements, so nothing runs
      (default: the first tensor argument is empty);
    * ``backward``: the op's kernel backward (``KernelBackward``), or None for the
      recompute backward alone.
    """
    # the schema: the stub's signature with its (possibly string) annotations evaluated in
    # the stub's module, where the names they use are defined
    signature = inspect.signature(stub, eval_str=True)
    names = tuple(signature.parameters)
    empty = is_empty or (lambda *args: _first_tensor(args).numel() == 0)

    def body(*args):
        if empty(*args):
            return fake(*args)
        result = _dispatch.run(lambda: kernel_call(**dict(zip(names, args))),
                               lambda: reference(*args), _first_tensor(args).device)
        return _own_outputs(_in_fake_layout(result, fake, args), args)

    body.__name__, body.__qualname__, body.__module__ = stub.__name__, stub.__qualname__, stub.__module__
    body.__signature__ = signature
    # nki_op wants "explicit type signatures" (TorchNeuron docs, see _neuron.py): the stub's
    # annotations, evaluated, also as __annotations__ for tools that read them directly
    annotations = {n: p.annotation for n, p in signature.parameters.items()}
    annotations["return"] = signature.return_annotation
    body.__annotations__ = annotations

    name = add_op_namespace_prefix(stub.__name__.lstrip("_"))
    register = _neuron.registrar()
    if register is not None:
        op = register(name)(body)
        registered_with[name] = NKI_OP
    else:
        op = torch.library.custom_op(name, body, mutates_args=())
        registered_with[name] = TORCH_CUSTOM_OP
    # our fake on both paths (nki_op registers the body as the fake, which would run the
    # kernel's own shape inference; ours is the same empty outputs as on CPU)
    op.register_fake(fake)
    recompute = _recompute_backward(grad_reference)
    if backward is None:
        op.register_autograd(recompute, setup_context=_save_inputs)
    else:
        op.register_autograd(_kernel_backward(backward, recompute),
                             setup_context=lambda ctx, inputs, output: _save_inputs(
                                 ctx, inputs, output, backward.save_outputs))
    return op


def _save_inputs(ctx, inputs, output, save_outputs: tuple[int, ...] = ()):
    """Save the tensor inputs (and the outputs named by ``save_outputs``) for the
    backward; remember the other arguments as they are."""
    tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
    outputs = _as_tuple(output)
    ctx.n_outputs = len(outputs)
    ctx.saved_outputs = tuple(save_outputs)
    ctx.save_for_backward(*tensors, *(outputs[i] for i in save_outputs))
    ctx.arguments = [None if isinstance(a, torch.Tensor) else a for a in inputs]
    ctx.is_tensor = [isinstance(a, torch.Tensor) for a in inputs]


def _saved(ctx) -> tuple[list, tuple]:
    """The forward's arguments (tensors as saved) and outputs (None where not saved)."""
    saved = iter(ctx.saved_tensors)
    inputs = [next(saved) if is_tensor else arg for arg, is_tensor in zip(ctx.arguments, ctx.is_tensor)]
    outputs = [None] * ctx.n_outputs
    for i in ctx.saved_outputs:
        outputs[i] = next(saved)
    return inputs, tuple(outputs)


def _kernel_backward(backward: KernelBackward, recompute: Callable):
    """The autograd formula of an op with a kernel backward: its backward custom op where
    ``backward.applies``, else ``recompute``."""

    def run(ctx, *grad_outputs):
        inputs, outputs = _saved(ctx)
        uncovered = backward.grads_for is not None and any(
            need for i, need in enumerate(ctx.needs_input_grad) if i not in backward.grads_for)
        if uncovered or not backward.applies(*inputs):
            return recompute(ctx, *grad_outputs)
        grads = tuple(backward.grads(inputs, outputs, grad_outputs))
        # a gradient only where autograd asked for one (and the input is a tensor)
        return tuple(g if need and is_tensor else None
                     for g, need, is_tensor in zip(grads, ctx.needs_input_grad, ctx.is_tensor))

    return run


def _recompute_backward(grad_reference: Callable):
    """A backward that recomputes ``grad_reference`` in fp32 and differentiates it."""

    def backward(ctx, *grad_outputs):
        inputs, _ = _saved(ctx)
        originals, leaves = [], []
        for i, (arg, is_tensor) in enumerate(zip(inputs, ctx.is_tensor)):
            if not is_tensor:
                originals.append(None)
                leaves.append(arg)
                continue
            t = arg
            originals.append(t)
            if t.is_floating_point():
                t = t.detach().float().requires_grad_(bool(ctx.needs_input_grad[i]))
            leaves.append(t)
        wanted = [leaf for leaf, orig in zip(leaves, originals) if orig is not None and
                  isinstance(leaf, torch.Tensor) and leaf.requires_grad]
        outs, grads = [], []
        with torch.enable_grad():
            results = _as_tuple(grad_reference(*leaves))
        for out, grad in zip(results, grad_outputs):
            if grad is not None and out.requires_grad:
                outs.append(out)
                grads.append(grad.float())
        found = iter(torch.autograd.grad(outs, wanted, grads, allow_unused=True) if wanted and outs
                     else [None] * len(wanted))
        result = []
        for leaf, orig in zip(leaves, originals):
            if orig is None or not (isinstance(leaf, torch.Tensor) and leaf.requires_grad):
                result.append(None)
                continue
            g = next(found)
            result.append(torch.zeros_like(orig) if g is None else g.to(orig.dtype))
        return tuple(result)

    return backward

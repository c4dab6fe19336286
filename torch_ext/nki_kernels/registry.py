"""The op registry: one declaration per op, which the main job, the benchmarks, the Hub
card and the tests enumerate.

An :class:`OpSpec` ties together, by reference (never by name strings):

* ``function``: the public function (``torch.nn.functional``-style signature);
* ``kernel_call``: the same signature -> the :class:`~._dispatch.KernelCall` launching the
  NKI kernel (what the op runs on ``neuron`` and in the simulator);
* ``reference``: the same signature plus ``compute_dtype=`` -> the PyTorch twin
  (``references.py``);
* ``roofline``: the same signature plus ``target=`` -> the op's limit and modeled eager
  baseline (``roofline.py``);
* ``workloads``: representative model shapes (the main job's grid);
* ``layers``: names of the ``kernelize`` layers (``layers.py``) built on the op;
* ``backward`` (optional): the op's NKI backward (:class:`Backward`): its backward custom
  op, launch, twin and roofline, run by the main job on the same workloads as the
  forward (a "backward" row beside each forward row).

Each op module registers its ops when it is imported (``nki_kernels/ops/``); adding an op
is: its kernel in ``kernels/``, its op module, its twin and eager model, one ``register``
(docs/ARCHITECTURE.md walks through it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class Workload:
    """One representative call of an op: a model's shape and the inputs to make it."""

    name: str                                    # what model and shape, e.g. "Llama-7B 2048 tok [2048, 4096]"
    make: Callable[[torch.Generator], tuple[tuple, dict]]  # fresh inputs (CPU): (args, kwargs)
    dtype: torch.dtype = torch.bfloat16          # the dtype of the data inputs (what the row reports)
    quick: bool = False                          # part of the main job's quick grid
    large: bool = False                          # a large shape: memory-bound ops target 0.8 efficiency
    speedup_target: float | None = None          # a modeled speedup the op must reach here
    reference_dtype: torch.dtype = torch.float64  # compute dtype of the reference it is checked against
    inference_only: bool = False                 # a token-generation call: the main job has no backward row


@dataclass(frozen=True)
class Backward:
    """An op's NKI backward kernel, declared like the op itself but with the backward
    op's signature (output gradients first, then what the forward saved; e.g.
    ``rms_norm_backward(grad_output, input, normalized_shape, weight, eps)``):

    * ``custom_op``: the backward custom op (``_custom_op.define_op``; what the forward's
      autograd formula calls, ``_custom_op.KernelBackward``);
    * ``inputs(gen, args, kwargs) -> (bargs, bkwargs)``: the backward op's arguments for a
      forward workload's inputs (``args, kwargs`` from ``Workload.make``): fresh random
      output gradients plus the saved tensors;
    * ``kernel_call``: the backward signature -> :class:`~._dispatch.KernelCall`;
    * ``reference``: the backward signature + ``compute_dtype=`` -> the input gradients
      (a tuple, in the order the backward op returns them);
    * ``roofline``: the backward signature + ``lnc=, target=`` -> ``roofline.Roofline``:
      the backward's limit and the modeled EAGER-AUTOGRAD baseline (the ATen ops autograd
      runs for the op's backward, each at its own limit);
    * ``covers(args, kwargs)``: whether the backward kernel takes a forward workload's call
      (e.g. softmax's rows past the one-pass length take the recompute backward): the main
      job adds a backward row only where it does;
    * ``speedup_targets``: the modeled speedups over eager autograd the main job's backward
      rows must reach, by workload name (none where absent);
    * ``efficiency_target``: the efficiency the backward rows must reach (None: the forward
      rows' rule, benchmarks/model_report.py).
    """

    custom_op: Any
    inputs: Callable[[torch.Generator, tuple, dict], tuple[tuple, dict]]
    kernel_call: Callable[..., Any]
    reference: Callable[..., Any]
    roofline: Callable[..., Any]
    covers: Callable[[tuple, dict], bool] = lambda args, kwargs: True
    # modeled speedups over eager autograd the backward row must reach, by workload name
    speedup_targets: dict = field(default_factory=dict)
    efficiency_target: float | None = None


@dataclass(frozen=True)
class OpSpec:
    """Everything the project knows about one op (see the module docstring)."""

    name: str
    function: Callable[..., Any]
    custom_op: Any                               # the torch.library custom op behind ``function``
    kernel_call: Callable[..., Any]
    reference: Callable[..., Any]
    roofline: Callable[..., Any]
    workloads: tuple[Workload, ...] = field(default_factory=tuple)
    layers: tuple[str, ...] = ()
    backward: Backward | None = None


_OPS: dict[str, OpSpec] = {}



def register(spec: OpSpec) -> OpSpec:
    """Add ``spec`` to the registry (its name must equal its public function's name)."""
    if spec.name != spec.function.__name__:
        raise ValueError(f"OpSpec name {spec.name!r} differs from its function {spec.function.__name__!r}")
    if spec.name in _OPS and _OPS[spec.name] is not spec:
        raise ValueError(f"op {spec.name!r} is registered twice")
    _OPS[spec.name] = spec
    return spec


def ops() -> tuple[OpSpec, ...]:
    """Every registered op, in registration order."""
    return tuple(_OPS.values())


def get(name: str) -> OpSpec:
    """The op named ``name`` (its public function's name)."""
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"no op named {name!r}; registered: {', '.join(_OPS)}") from None

"""Test doubles of AWS's toolchain that record how the package calls it.

* :class:`RecordingNkiOp` stands in for ``torch_neuronx.nki_op``: it records each call
  (the name, how ``mutates_args`` was passed, whether the function came through the
  decorator, the decorated function's signature and the schema torch infers from it), then
  does what TorchNeuron's ``nki_op`` is documented/observed to do on CPU: a
  ``torch.library.custom_op`` of the function, with the function itself registered as the
  fake (the package must replace that fake with its own).
* :class:`RecordingKernel` stands in for an ``@nki.jit`` kernel: it records whether it was
  launched plainly or as ``kernel[n]``, ``NEURON_LOGICAL_NC_CONFIG`` at the call, and the
  arguments; it returns what ``compute`` makes of them.

Nothing here imports or imitates AWS code; the call forms come from AWS's documents (see
torch_ext/nki_kernels/_neuron.py for the sources).
"""

from __future__ import annotations

import inspect
import os
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch._library.infer_schema import infer_schema

_UNSET = object()


@dataclass
class NkiOpCall:
    name: Any
    fn_given_directly: bool
    mutates_args: Any = _UNSET
    other_kwargs: dict = field(default_factory=dict)
    signature: inspect.Signature | None = None
    annotations: dict | None = None
    schema: str = ""


class RecordingNkiOp:
    """``torch_neuronx.nki_op`` double (see the module docstring)."""

    def __init__(self):
        self.calls: list[NkiOpCall] = []

    def __call__(self, name, fn=None, *args, mutates_args=_UNSET, **kwargs):
        if args:
            raise TypeError("nki_op double: only the name and fn may be positional")
        call = NkiOpCall(name, fn is not None, mutates_args, dict(kwargs))
        self.calls.append(call)

        def decorate(f: Callable):
            call.signature = inspect.signature(f)
            call.annotations = dict(getattr(f, "__annotations__", {}))
            mutates = () if mutates_args is _UNSET else mutates_args
            call.schema = infer_schema(f, mutates_args=mutates)
            op = torch.library.custom_op(name, f, mutates_args=mutates)
            op.register_fake(f)
            return op

        return decorate if fn is None else decorate(fn)


def torch_neuronx_module(nki_op=None) -> types.ModuleType:
    """A ``torch_neuronx`` module object carrying ``nki_op`` (or none, like the XLA-era one)."""
    module = types.ModuleType("torch_neuronx", "test double of torch-neuronx")
    if nki_op is not None:
        module.nki_op = nki_op
    return module


class RecordingKernel:
    """``@nki.jit`` kernel double (see the module docstring)."""

    def __init__(self, compute: Callable[..., Any] | None = None):
        self.compute = compute
        self.events: list[tuple] = []

    def _run(self, form, degree, args, kwargs):
        self.events.append((form, degree, os.environ.get("NEURON_LOGICAL_NC_CONFIG"), args, kwargs))
        return self.compute(*args, **kwargs) if self.compute is not None else args[0]

    def __getitem__(self, degree):
        return lambda *args, **kwargs: self._run("bracket", degree, args, kwargs)

    def __call__(self, *args, **kwargs):
        return self._run("plain", None, args, kwargs)

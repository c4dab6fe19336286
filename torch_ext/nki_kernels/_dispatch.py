"""Which implementation of an op runs, decided per call from the input device.

* ``neuron`` tensors: the NKI kernel through AWS's toolchain (``_neuron.py``: torch-neuronx
  compiles an ``@nki.jit`` kernel called with neuron tensors on first use, TorchNeuron's
  documented eager path; launched at neuronx-cc's logical-core degree). WRITTEN AS AWS
  DOCUMENTS IT; NOT YET RUN ON HARDWARE.
* ``cpu`` tensors: the PyTorch reference (default), or the NKI kernel in the bundled
  simulator when ``NKI_KERNELS_CPU_BACKEND=simulator``.

The simulator backend launches kernels at the degree neuronx-cc would use for its target
(``logical_core_degree``: ``NEURON_LOGICAL_NC_CONFIG`` when set, else the target's default,
trn2: 2), as ``kernel[degree](...)``.

Every op describes its kernel launch as a :class:`KernelCall` (which kernel, which tensors,
which static arguments, how to turn the kernel's outputs into the op's result), so the op,
the tests, the modeled report (benchmarks/model_report.py) and the acceptance run
(``acceptance.py``) launch kernels the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import _kernel_sources, _neuron

CPU_BACKEND_ENV = "NKI_KERNELS_CPU_BACKEND"
CPU_BACKENDS = ("reference", "simulator")
# AWS's variable for the logical-core degree of the compiler and of nki.jit launches
# (nki.jit reference, Neuron 2.33; see _neuron.py and docs/hardware.md, source [L]).
LNC_ENV = _neuron.LNC_ENV
# TorchNeuron (Neuron 2.33) runs on Trn2 and Trn3, whose compiler default is LNC=2.
NEURON_DEFAULT_LNC = _neuron.COMPILER_DEFAULT_LNC


@dataclass(frozen=True)
class KernelCall:
    """One launch of an NKI kernel: ``kernels/<module>.py::<kernel>(*tensors, **static)``."""

    module: str
    kernel: str
    tensors: tuple[torch.Tensor, ...]
    static: dict[str, Any] = field(default_factory=dict)
    # Maps the kernel's return value to the op's result (e.g. a reshape back to [..., D]).
    finish: Callable[[Any], Any] | None = None

    def finish_outputs(self, outputs: Any) -> Any:
        return outputs if self.finish is None else self.finish(outputs)


def cpu_backend() -> str:
    """The CPU implementation selected by ``NKI_KERNELS_CPU_BACKEND`` (read at every call)."""
    value = os.environ.get(CPU_BACKEND_ENV, "reference").strip().lower() or "reference"
    if value not in CPU_BACKENDS:
        raise ValueError(
            f"{CPU_BACKEND_ENV}={value!r} is not supported; expected one of {CPU_BACKENDS}"
        )
    return value


def logical_core_degree(default: int = NEURON_DEFAULT_LNC, maximum: int = 2) -> int:
    """The degree kernels launch at: ``NEURON_LOGICAL_NC_CONFIG`` when set (read at every
    call), else ``default`` (the target's compiler default). Raises ``ValueError`` for a
    value other than 1 or 2, or above ``maximum`` (trn1: 1)."""
    raw = os.environ.get(LNC_ENV, "").strip()
    if not raw:
        return default
    if raw not in ("1", "2"):
        raise ValueError(f"{LNC_ENV}={raw!r} is not supported; expected 1 or 2")
    degree = int(raw)
    if degree > maximum:
        raise ValueError(f"{LNC_ENV}={degree} exceeds {maximum}, the largest logical-core degree "
                         "of the target (Trainium1 runs LNC=1 only)")
    return degree


def run(call: Callable[[], KernelCall], reference: Callable[[], Any], device: torch.device) -> Any:
    """Run an op on ``device``: the NKI kernel described by ``call()``, or ``reference()``.

    ``call`` and ``reference`` are thunks so that only the selected path does any work.
    """
    if device.type == "neuron":
        return run_on_neuron(call())
    if device.type != "cpu":
        raise RuntimeError(
            f"nki_kernels has no implementation for device {device}; "
            "supported devices are 'neuron' (NKI kernel) and 'cpu' (reference or simulator)"
        )
    if cpu_backend() == "reference":
        return reference()
    return run_simulated(call())


def simulator_kernel(call: KernelCall):
    """The simulator-flavoured kernel function for ``call``."""
    return _kernel_sources.kernel(call.module, call.kernel, "simulator")


def run_simulated(call: KernelCall, lnc: int | None = None) -> Any:
    """Run the NKI kernel of ``call`` in the bundled simulator on CPU tensors, at degree
    ``lnc`` (default: ``logical_core_degree()`` for the calling thread's simulator target:
    ``simulator.activated(target)``'s inside one, else the default, trn2)."""
    from . import simulator
    from .simulator import context

    if lnc is None:
        target = context.current().target
        lnc = logical_core_degree(default=target.max_logical_cores, maximum=target.max_logical_cores)
    kernel = simulator_kernel(call)[lnc]
    inputs = tuple(t.detach().contiguous() for t in call.tensors)
    return call.finish_outputs(simulator.nki_modules()["nki"].simulate(kernel)(*inputs, **call.static))


def neuron_kernel(call: KernelCall):
    """The AWS-toolchain kernel function for ``call`` (kernels/ imported with the real ``nki``)."""
    return _kernel_sources.kernel(call.module, call.kernel, "neuron")


def run_on_neuron(call: KernelCall) -> Any:
    """Run ``call``'s kernel on neuron tensors through AWS's toolchain (``_neuron.launch``:
    eager compile per shape, dtype and static values; at neuronx-cc's degree).
    NOT YET RUN ON HARDWARE."""
    _neuron.toolchain()  # a clear error naming the missing package before anything else
    kernel = neuron_kernel(call)
    inputs = tuple(t.contiguous() for t in call.tensors)
    return call.finish_outputs(_neuron.launch(kernel, inputs, call.static))

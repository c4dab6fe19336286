"""AWS's toolchain on the ``neuron`` device: op registration with ``torch_neuronx.nki_op``
and NKI kernel launches at the compiler's logical-core degree.

WRITTEN AS AWS DOCUMENTS IT (Neuron 2.33: torch-neuronx 2.13.x / 2.14.x, NKI 0.7);
NOT YET RUN ON HARDWARE. tests/neuron/ replaces ``torch_neuronx`` and ``nki`` by test doubles
that record how they are called, so a change of the call shapes below fails there.

Registration. TorchNeuron documents one way to make an NKI kernel a PyTorch operator:
``torch_neuronx.nki_op("<ns>::<name>", mutates_args={})`` on a function with explicit
type annotations, with ``register_autograd()`` for training ([NKI-ABOUT], [PT-NATIVE],
[TN-HOWTO]). Wherever ``torch_neuronx`` imports, :func:`registrar` hands that decorator to
``_custom_op.define_op``; elsewhere (CPU hosts) ops stay plain ``torch.library.custom_op``s.
Either way the op body, fake and backward are the same functions.

Launch. Calling an ``@nki.jit`` kernel with neuron tensors compiles it on first use "for the
input shapes, data types, and non-tensor argument values of that call" (eager), and inside
``torch.compile(backend="neuron")`` the call "becomes one node in the captured graph"
[TN-HOWTO]. NKI 0.7 rejects a kernel whose logical-core degree differs from neuronx-cc's
(NCC_EVRF066 [EVRF066]). So :func:`launch` calls the kernel

* plainly, ``kernel(*tensors, **static)``, when ``NEURON_LOGICAL_NC_CONFIG`` is set: the
  2.33 ``nki.jit`` reference documents that variable as how the degree is configured
  ("set ... to 1 or 2 before invoking the kernel") [NKI-JIT], and EVRF066's resolution is
  to set it so kernel and compiler agree;
* as ``kernel[n](...)`` otherwise, ``n`` being neuronx-cc's degree: without the variable a
  plain call is LNC=1 while neuronx-cc defaults to 2 on Trn2 and later [EVRF066]; the
  bracket is the call-site form the 2.33 LNC page still lists [LNC] ("being deprecated"
  per EVRF066, so setting the variable is the recommended way to run these ops).

neuronx-cc's degree: ``--lnc``/``-lnc``/``--logical-nc-config`` in ``NEURON_CC_FLAGS`` if
given, else ``NEURON_LOGICAL_NC_CONFIG``, else 2 (Trn2/Trn3 default [NCC-REF], [EVRF066];
TorchNeuron runs on Trn2 and Trn3 only [QS-NKI]). A variable and a flag that disagree raise,
as EVRF066's third cause would; so does a flag of 1 without a runtime variable (below): the
runtime then runs at its default of 2, and AWS "doesn't support setting the compiler flag to a different
LNC configuration than the Neuron Runtime environment variable" [LNC-CONFIG].

Runtime degree. The runtime also takes its degree from ``NEURON_RT_VIRTUAL_CORE_SIZE``
(AWS's TorchNeuron profiling example launches with ``NEURON_RT_VIRTUAL_CORE_SIZE=2``
[PROFILE]; the Neuron Explorer glossary: a VNC is "Configured via
NEURON_RT_VIRTUAL_CORE_SIZE" [EXPLORER-GLOSSARY]). nki.jit does not read it, so it sets no
launch form; where it is set and differs from the compiler's degree, the same rule of
[LNC-CONFIG] applies and the launch raises, naming the variable to export (a
``NEURON_RT_VIRTUAL_CORE_SIZE=1`` host would otherwise run ``kernel[2]`` launches on one-core
logical cores, which the nki.jit reference says "will cause a runtime error").

Scalars. Every distinct non-tensor argument value is a new compile [TN-HOWTO]; ours are
``eps`` (norms), ``scale``/``causal``/``layout`` (attention), the activation name,
softmax's column budget and what a launch returns or takes (``return_lse``,
``save_stats``, ``with_bias``, ``transpose``). They are per-model constants, so a model
compiles each kernel once per shape and value (README "Running on a Trainium host" lists
them; a model run for training and for inference compiles attention's and layer_norm's
forwards once for each).

Sources (AWS Neuron documentation, awsdocs-neuron.readthedocs-hosted.com):
[TN-HOWTO] /en/latest/torch/guides/how-to-work-with-nki.html (2026-10-15), "How NKI kernels
           run in torch-neuronx".
[NKI-ABOUT] nki/get-started/about/index.rst (2.32 sources), "Working with NKI Kernels":
           ``@nki_op("mylib::my_op", mutates_args={})``.
[PT-NATIVE] frameworks/torch/pytorch-native-overview.rst (2.32 sources): "Register as
           PyTorch operators with @nki_op ... Provide explicit type signatures ... add
           autograd support via register_autograd()".
[NKI-JIT]  /en/v2.33.1/nki/api/generated/nki.jit.html: the LNC degree and its default 1.
[LNC]      /en/v2.33.1/nki/get-started/about/lnc.html: "NEURON_LOGICAL_NC_CONFIG environment
           variable or via bracket syntax at the kernel call site".
[EVRF066]  /en/latest/compiler/error-codes/EVRF066.html.
[LNC-CONFIG] about-neuron/arch/neuron-features/logical-neuroncore-config.rst (2.32 sources):
           ``--logical-nc-config`` or ``-lnc``; LNC=2 the Trn2 default; compiler flag and
           runtime variable must match.
[NCC-REF]  compiler/neuronx-cc/api-reference-guide (2.32 sources): ``--logical-nc-config``
           {1, 2}, default 2.
[QS-NKI]   /en/latest/torch/get-started/quickstart-nki-kernel.html: Trn2 or Trn3, Python
           3.12-3.14; ``import torch_neuronx, nki`` checks both packages.
[PROFILE]  tools/neuron-explorer/how-to-profile-workload.rst (2.32 sources):
           ``torch.neuron.synchronize()`` ("Neuron is asynchronous"); its multi-rank
           example runs ``NEURON_RT_NUM_CORES=4 NEURON_RT_VIRTUAL_CORE_SIZE=2 torchrun ...``.
[EXPLORER-GLOSSARY] tools/neuron-explorer/glossary.rst (2.32 sources): VNC, "Configured via
           ``NEURON_RT_VIRTUAL_CORE_SIZE``".
[NXDI]     libraries/nxd-inference/developer_guides/weights-sharding-guide.rst (2.32 sources):
           ``export NEURON_RT_VIRTUAL_CORE_SIZE=$LNC``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shlex
import sys
from typing import Any, Callable, Sequence

import torch

# AWS's variable for the degree of nki.jit launches and of the compiler [NKI-JIT], [LNC].
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
# The Neuron runtime's own name for its degree (a "VNC", "Configured via
# NEURON_RT_VIRTUAL_CORE_SIZE" [EXPLORER-GLOSSARY]; AWS's TorchNeuron profiling example and
# NxD Inference's launches set it [PROFILE], [NXDI]); nki.jit does not read it [NKI-JIT].
RT_CORE_SIZE_ENV = "NEURON_RT_VIRTUAL_CORE_SIZE"
# neuronx-cc's extra flags; `--lnc=N` there overrides the compiler's degree [EVRF066].
CC_FLAGS_ENV = "NEURON_CC_FLAGS"
CC_LNC_FLAGS = ("--lnc", "-lnc", "--logical-nc-config")   # [NCC-REF], [LNC-CONFIG]
# neuronx-cc's degree on Trn2/Trn3 when nothing sets it [NCC-REF], [EVRF066].
COMPILER_DEFAULT_LNC = 2
DEGREES = (1, 2)
# What the ops ask of AWS's toolchain, in the order it is imported [QS-NKI].
TOOLCHAIN = ("torch_neuronx", "nki")
README_SECTION = 'README "Running on a Trainium host"'
# ``nki_op``'s mutates_args for ops that write no input (the documented spelling) [NKI-ABOUT].
NO_MUTATION: dict = {}


class ToolchainMissing(RuntimeError):
    """AWS's NKI toolchain (``torch_neuronx``, ``nki``) is not importable here."""


def _import(name: str):
    return importlib.import_module(name)


def toolchain() -> tuple[Any, Any]:
    """``(torch_neuronx, nki)``, imported; :class:`ToolchainMissing` naming what failed."""
    modules = []
    for name in TOOLCHAIN:
        try:
            modules.append(_import(name))
        except ImportError as err:
            raise ToolchainMissing(
                f"neuron tensors need AWS's NKI toolchain (`nki` and `torch-neuronx` from AWS's "
                f"package repository); importing {name} failed here: {err}. See {README_SECTION}."
            ) from err
    return modules[0], modules[1]


# ---------------------------------------------------------------------------- registration

def registrar() -> Callable[[str], Callable[[Callable], Any]] | None:
    """How ops are registered here: ``name -> decorator`` from ``torch_neuronx.nki_op`` when
    ``torch_neuronx`` imports, else ``None`` (ops stay ``torch.library.custom_op``s).

    ``find_spec`` first, so a host without torch-neuronx never imports anything here; a
    torch-neuronx that is installed but fails to import leaves the CPU ops working (the
    neuron path then raises :class:`ToolchainMissing` with that error when used).
    """
    if "torch_neuronx" not in sys.modules and importlib.util.find_spec("torch_neuronx") is None:
        return None
    try:
        torch_neuronx = _import("torch_neuronx")
    except ImportError:
        return None
    nki_op = getattr(torch_neuronx, "nki_op", None)
    if nki_op is None:  # the XLA-based torch-neuronx 2.9 shares the name but has no nki_op
        return None

    def register(name: str):
        # the documented call form: positional name, mutates_args={} [NKI-ABOUT]
        return nki_op(name, mutates_args=NO_MUTATION)

    return register


# ---------------------------------------------------------------------------- launch degree

def _flag_degree(flags: str) -> int | None:
    """The degree an ``--lnc`` / ``-lnc`` / ``--logical-nc-config`` flag in ``flags`` sets,
    if any; given more than once, the last one (as a command-line parser takes a repeated
    option; an assumption about neuronx-cc, not run on hardware)."""
    words = shlex.split(flags)
    found = None
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name not in CC_LNC_FLAGS:
            continue
        if not eq:
            value = words[i + 1] if i + 1 < len(words) else ""
        if value not in ("1", "2"):
            raise ValueError(f"{CC_FLAGS_ENV} sets {name} {value!r}; neuronx-cc takes 1 or 2")
        found = int(value)
    return found


def _variable_degree(name: str) -> int | None:
    """The degree environment variable ``name`` sets (1 or 2), or None when unset."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if raw not in ("1", "2"):
        raise ValueError(f"{name}={raw!r} is not supported; expected 1 or 2")
    return int(raw)


def compiler_degree() -> int:
    """neuronx-cc's logical-core degree (see the module docstring); read at every call.
    Raises where the compiler's degree and the runtime's would differ: the runtime's comes
    from ``NEURON_LOGICAL_NC_CONFIG`` or ``NEURON_RT_VIRTUAL_CORE_SIZE`` (which must then
    agree), else its default 2."""
    env = _variable_degree(LNC_ENV)
    runtime_var = _variable_degree(RT_CORE_SIZE_ENV)      # module docstring, "Runtime degree"
    flag = _flag_degree(os.environ.get(CC_FLAGS_ENV, ""))
    if env is not None and flag is not None and env != flag:
        raise ValueError(
            f"{LNC_ENV}={env} but {CC_FLAGS_ENV} makes neuronx-cc use LNC={flag}; NKI 0.7 rejects a "
            "kernel whose degree differs from the compiler's (NCC_EVRF066): make them agree")
    if env is not None and runtime_var is not None and env != runtime_var:
        raise ValueError(
            f"{LNC_ENV}={env} but {RT_CORE_SIZE_ENV}={runtime_var}: the two variables set the Neuron "
            "runtime's degree and must agree (the kernels compile at the first)")
    runtime = env if env is not None else runtime_var
    degree = flag if flag is not None else (env if env is not None else COMPILER_DEFAULT_LNC)
    if runtime is None and degree != COMPILER_DEFAULT_LNC:
        raise ValueError(
            f"{CC_FLAGS_ENV} makes neuronx-cc use LNC={flag} but neither {LNC_ENV} nor {RT_CORE_SIZE_ENV} "
            f"is set, so the Neuron runtime runs at its default LNC={COMPILER_DEFAULT_LNC}; AWS supports only "
            f"a compiler flag that matches the runtime's variable: export {LNC_ENV}={flag}")
    if runtime is not None and runtime != degree:
        if flag is not None:
            source, fix = (f"{CC_FLAGS_ENV}'s --lnc {flag}",
                           f"set --lnc {runtime} in {CC_FLAGS_ENV} (or remove it) and export {LNC_ENV}={runtime}")
        else:
            source, fix = f"neuronx-cc's default", f"export {LNC_ENV}={runtime}"
        raise ValueError(
            f"{RT_CORE_SIZE_ENV}={runtime} runs the Neuron runtime at LNC={runtime} but the kernels "
            f"compile at LNC={degree} ({source}); AWS supports only a compiler degree that matches the "
            f"runtime's: {fix}")
    return degree


def launch_form() -> tuple[str, int]:
    """``("env", n)``: plain call, the degree comes from ``NEURON_LOGICAL_NC_CONFIG``;
    ``("bracket", n)``: ``kernel[n](...)`` at neuronx-cc's degree."""
    degree = compiler_degree()
    return ("env", degree) if _variable_degree(LNC_ENV) is not None else ("bracket", degree)


def launch(kernel, tensors: Sequence[Any], static: dict[str, Any]) -> Any:
    """Call the ``@nki.jit`` ``kernel`` on neuron ``tensors`` with the non-tensor ``static``
    arguments, at the compiler's degree (module docstring)."""
    form, degree = launch_form()
    if form == "env":
        return kernel(*tensors, **static)
    return kernel[degree](*tensors, **static)


# ---------------------------------------------------------------------------- device

def synchronize() -> None:
    """Wait until the neuron device has finished the work queued so far: TorchNeuron runs
    asynchronously, so timers and profiles must synchronise [PROFILE]."""
    neuron = getattr(torch, "neuron", None)
    if neuron is not None and hasattr(neuron, "synchronize"):
        neuron.synchronize()
    else:  # torch's generic accelerator API (TorchNeuron registers as PrivateUse1)
        torch.accelerator.synchronize()


def device_available() -> tuple[bool, str]:
    """(True, "") when a neuron device is usable here, else (False, why not)."""
    for name in TOOLCHAIN:
        try:
            _import(name)
        except ImportError as err:
            return False, f"{name} does not import ({err})"
    accel = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if accel is None or accel.type != "neuron":
        return False, (f"torch-neuronx imports but torch sees no neuron device (accelerator: "
                       f"{accel.type if accel is not None else 'none'})")
    return True, ""

"""AWS's test harness, pointed at this simulator.

nki-library's test suite runs kernels in "simulation mode" through a simulator package named
``nki_cpu_simulator`` (not published): its ``test/utils/simulation_setup.py`` imports
``nki_cpu_simulator.nki`` and ``.nki.builtin / .compiler / .isa / .isa.constants / .language /
.language.dtypes / .tensor / .typing``, aliases them as ``nki``, ``nki.isa``, ... (and
``nki.dtype`` to ``.language.dtypes``), and runs each kernel as
``nki.cpu_simulate(kernel)[lnc](**inputs)``, naming the NeuronCore generation in the
environment variable ``NKI_NC_VERSION`` (gen2, gen3, gen4). ``install()`` registers this
simulator's modules under all those names, so that harness (or any code written against it)
runs on ``nki_kernels.simulator``; ``cpu_simulate`` is that entry point.

    from nki_kernels import simulator
    from nki_kernels.simulator import harness
    simulator.install_aws_harness()         # nki_cpu_simulator.*, nki.* -> this simulator
    out = nki.cpu_simulate(kernel)[2](x=x_np, w=w_np)
    harness.last_result()                   # the run's SimResult (trace, memory peaks)

``install_aws_harness()`` (modules.py) changes ``sys.modules`` for the whole process and
for good (unlike ``activated()``): it is meant for a test session that runs AWS's harness.
"""

from __future__ import annotations

import dataclasses
import os
import threading

from .context import current
from .errors import NkiValidationError

# NKI_NC_VERSION (AWS's harness) and NEURON_PLATFORM_TARGET_OVERRIDE (nki.jit docs:
# "trn1|inf2|gen2", "trn2|gen3", "trn3|gen4") name the target
_TARGETS = {"gen2": "trn1", "trn1": "trn1", "inf2": "trn1", "gen3": "trn2", "trn2": "trn2",
            "gen4": "trn3", "trn3": "trn3"}
_ENV_TARGET = ("NKI_NC_VERSION", "NEURON_PLATFORM_TARGET_OVERRIDE")

_last = threading.local()


def _env_target():
    for var in _ENV_TARGET:
        raw = os.environ.get(var, "").strip()
        if raw:
            try:
                return _TARGETS[raw.lower()]
            except KeyError:
                raise ValueError(f"{var}={raw!r} names no NeuronCore target; expected one of "
                                 f"{', '.join(sorted(_TARGETS))}") from None
    return None


class _CpuSimulate:
    """``cpu_simulate(kernel)``: ``[lnc]`` binds the degree; calling runs the kernel."""

    def __init__(self, kernel):
        self._kernel = kernel

    def __getitem__(self, lnc):
        if lnc not in (1, 2):
            raise NkiValidationError(f"cpu_simulate(kernel)[{lnc!r}]: the logical-core "
                                     "degree must be 1 or 2")
        return lambda *args, **kwargs: self._run(int(lnc), args, kwargs)

    def __call__(self, *args, **kwargs):
        return self._run(None, args, kwargs)

    def _run(self, lnc, args, kwargs):
        from .interpreter import Kernel, _unwrap, run_kernel
        from .result import result_of

        fn, bracket = _unwrap(self._kernel)
        degree = lnc if lnc is not None else bracket
        params = current().params
        target = _env_target()
        if target is not None and target != params.target.name:
            params = dataclasses.replace(params, target=target)
        kernel = Kernel(fn)[degree] if degree is not None else fn
        outputs, ctx = run_kernel(kernel, args, kwargs, params)
        _last.result = result_of(outputs, ctx)
        return outputs


def cpu_simulate(kernel):
    """``nki.cpu_simulate(kernel)[lnc](**inputs)`` -> the kernel's outputs (numpy in, numpy
    out), the entry point of AWS's harness. The target is ``NKI_NC_VERSION`` /
    ``NEURON_PLATFORM_TARGET_OVERRIDE`` when set, else the calling thread's options."""
    return _CpuSimulate(kernel)


def last_result():
    """The ``SimResult`` of the calling thread's last ``cpu_simulate`` run (None before)."""
    return getattr(_last, "result", None)

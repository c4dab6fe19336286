"""The simulated ``nki`` modules (``nki``, ``nki.language``, ``nki.isa`` and the smaller
``nki.isa.constants``, ``nki.language.dtypes`` = ``nki.dtype``, ``nki.typing``,
``nki.compiler``, ``nki.tensor``, ``nki.builtin``, ``nki.collectives``), and
``activated()``, which makes ``import nki`` resolve to them.

The modules are built once per process (singletons) from the explicit export lists
of language/ and isa/ (and nki_extras.py). ``nki_modules()`` hands them out without touching ``sys.modules``
(a loader can bind kernel sources to them through its own ``__import__``).

``activated()`` is reference-counted under a lock, so threads may hold it at once: the
first enter saves the ``sys.modules`` entries of those names and installs the
simulated modules, the last exit restores exactly what was saved. While ANY thread holds
it, ``import nki`` in EVERY thread of the process resolves to the simulator. Each
``activated()`` also pushes a context with its options on the calling thread's stack.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types

from . import isa as _isa
from . import language as _language
from .context import Context, pop, push
from .errors import NkiValidationError
from .interpreter import Kernel, jit, simulate
from .params import SimParams, resolve


def _module(name, source, doc):
    m = types.ModuleType(name, doc)
    for n in source.__all__:
        setattr(m, n, getattr(source, n))
    m.__all__ = list(source.__all__)
    m.__package__ = "nki"
    return m


def _plain(name, doc, **attrs):
    m = types.ModuleType(name, doc)
    m.__dict__.update(attrs)
    m.__all__ = [k for k in attrs if not k.startswith("_")]
    m.__package__ = "nki"
    return m


def _build() -> dict[str, types.ModuleType]:
    from . import collectives as _coll
    from . import dtypes as _dt
    from . import harness as _harness
    from . import surface as _x

    nl = _module("nki.language", _language, "nki.language (beta 2), simulated by nki_kernels.simulator")
    nisa = _module("nki.isa", _isa, "nki.isa (beta 2), simulated by nki_kernels.simulator")
    nisa.NkiValidationError = NkiValidationError
    # nki.isa.constants: the ISA enums (nki-library: `from nki.isa.constants import oob_mode`)
    constants = _plain("nki.isa.constants", "nki.isa.constants: the nki.isa configuration enums",
                       **{n: getattr(_isa, n) for n in _x.ISA_CONSTANTS})
    nisa.constants = constants
    nisa.__path__ = []  # a package: `import nki.isa.constants`
    # nki.language.dtypes / nki.dtype: the dtypes (AWS's test harness aliases nki.dtype to
    # its simulator's nki.language.dtypes; kernels annotate `dtype: nki.dtype`)
    dtypes = _plain("nki.language.dtypes", "nki.language.dtypes: the NKI data types",
                    **{d.name: d for d in _dt.ALL})
    nl.dtypes = dtypes
    nl.__path__ = []
    typing_ = _plain("nki.typing", "nki.typing: tensor annotations (accepted, not checked)",
                     tensor=_x.tensor, mutable_tensor=_x.mutable_tensor, scalar=_x.scalar)
    compiler = _plain("nki.compiler", "nki.compiler: per-kernel compile options (accepted, "
                      "ignored by the simulator)", CompileConfig=_x.CompileConfig,
                      SpecializationConfig=_x.SpecializationConfig,
                      AddressRotation=_x.AddressRotation)
    tensor = _plain("nki.tensor", "nki.tensor: the tensor class", NkiTensor=_language.NkiTensor,
                    ndarray=_language.ndarray)
    builtin = _plain("nki.builtin", "nki.builtin (no public API; present for AWS's harness)")
    collectives = _plain("nki.collectives", "nki.collectives (multi-rank collectives)",
                         **{n: getattr(_coll, n) for n in _coll.__all__})
    nki = types.ModuleType("nki", "nki (beta 2) as simulated by nki_kernels.simulator")
    nki.__path__ = []  # a package, so `import nki.language` resolves through sys.modules
    nki.language = nl
    nki.isa = nisa
    nki.jit = jit
    nki.simulate = simulate
    nki.Kernel = Kernel
    nki.dtype = dtypes
    nki.typing = typing_
    nki.compiler = compiler
    nki.tensor = tensor
    nki.builtin = builtin
    nki.collectives = collectives
    nki.cpu_simulate = _harness.cpu_simulate
    nki.__version__ = "0.7-simulated"
    nki.__simulator__ = True
    nki.__all__ = ["jit", "simulate", "language", "isa", "Kernel", "dtype", "typing", "compiler",
                   "tensor", "collectives", "cpu_simulate"]
    return {"nki": nki, "nki.language": nl, "nki.isa": nisa, "nki.isa.constants": constants,
            "nki.language.dtypes": dtypes, "nki.dtype": dtypes, "nki.typing": typing_,
            "nki.compiler": compiler, "nki.tensor": tensor, "nki.builtin": builtin,
            "nki.collectives": collectives}


_MODULES = _build()


def nki_modules() -> dict[str, types.ModuleType]:
    """The simulated modules by import name: 'nki', 'nki.language', 'nki.isa',
    'nki.isa.constants', 'nki.language.dtypes' (also as 'nki.dtype'), 'nki.typing',
    'nki.compiler', 'nki.tensor', 'nki.builtin', 'nki.collectives' (the same objects on every
    call; the dict is a fresh copy)."""
    return dict(_MODULES)


_MISSING = object()
_alias_lock = threading.Lock()
_alias_holders = 0
_alias_saved: dict[str, object] = {}


def _install() -> None:
    global _alias_holders, _alias_saved
    with _alias_lock:
        if _alias_holders == 0:
            _alias_saved = {name: sys.modules.get(name, _MISSING) for name in _MODULES}
            sys.modules.update(_MODULES)
        _alias_holders += 1


def _restore() -> None:
    global _alias_holders
    with _alias_lock:
        _alias_holders -= 1
        if _alias_holders == 0:
            for name, old in _alias_saved.items():
                if old is _MISSING:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = old
            _alias_saved.clear()


@contextlib.contextmanager
def activated(target=None, params: SimParams | None = None):
    """Make ``import nki`` / ``nki.language`` / ``nki.isa`` resolve to the simulator for the
    block, with ``target`` (default "trn2") or ``params`` as the options of the ``nl``/``nisa``
    calls and ``nki.simulate`` runs the calling thread makes inside it. Yields the ``nki``
    module. Safe to nest and to hold from several threads (see the module docstring)."""
    ctx = Context(resolve(target, params))
    _install()
    try:
        push(ctx)
        try:
            yield _MODULES["nki"]
        finally:
            pop(ctx)
    finally:
        _restore()


_PACKAGE = "nki_cpu_simulator"


def install_aws_harness(alias_nki: bool = True) -> None:
    """Register the simulator under the module names of AWS's test harness (harness.py):
    as ``nki_cpu_simulator`` (and, with ``alias_nki``, as ``nki``
    itself, since nki-library's conftest imports ``nki.isa`` before its own aliasing runs;
    plus ``neuronxcc.nki.typing``, which nki-library's router_topk still imports).
    Idempotent; replaces what those names held."""
    mods = nki_modules()
    pkg = sys.modules.get(_PACKAGE)
    if pkg is None or not getattr(pkg, "__simulator__", False):
        pkg = types.ModuleType(_PACKAGE, "nki_kernels.simulator registered under the name "
                                         "AWS's test harness imports")
        pkg.__path__ = []
        pkg.__simulator__ = True
        sys.modules[_PACKAGE] = pkg
    pkg.nki = mods["nki"]
    for name, mod in mods.items():
        sys.modules[f"{_PACKAGE}.{name}"] = mod
        if alias_nki:
            sys.modules[name] = mod
    if alias_nki:
        legacy = sys.modules.get("neuronxcc")
        if legacy is None:
            legacy = types.ModuleType("neuronxcc", "placeholder: neuronxcc.nki.typing only")
            legacy.__path__ = []
            sys.modules["neuronxcc"] = legacy
        if getattr(legacy, "__file__", None) is None:  # never shadow a real neuronxcc
            nxc = types.ModuleType("neuronxcc.nki")
            nxc.__path__ = []
            nxc.typing = mods["nki.typing"]
            legacy.nki = nxc
            sys.modules["neuronxcc.nki"] = nxc
            sys.modules["neuronxcc.nki.typing"] = mods["nki.typing"]

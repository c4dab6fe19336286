"""Find and import the NKI kernel sources as a package.

The sources live in the repository's ``kernels/`` folder during development and in
``nki_src/`` inside a Hub build. Kernels import ``nki``, ``nki.language`` and ``nki.isa``
and share helpers with relative imports (``from .tiling import row_blocks``), so the
folder is imported as a *package*, once per flavour, each under its own private name:

* ``"neuron"``: ``<this package>.nki_src``, imported the ordinary way, so ``import nki``
  binds AWS's toolchain. In a Hub build ``nki_src/`` is a real subpackage with an
  ``__init__.py``; in the repository the same name is given to ``kernels/`` (which has no
  ``__init__.py``, so it never shadows Hugging Face's ``kernels`` library).
* ``"simulator"``: ``<this package>._nki_src_simulator``, whose modules are executed with
  an ``__import__`` that resolves ``nki``, ``nki.language`` and ``nki.isa`` to the bundled
  simulator. Nothing is swapped in ``sys.modules``, so loading is safe while other threads
  run, and a real ``nki`` installed next to us is never shadowed.

``limits`` (the shapes the kernels accept) imports nothing, so the op layer reads it
without any toolchain.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

# Not .resolve(): in the Hugging Face cache the snapshot files are symlinks into blobs/,
# and the package's siblings (nki_src/) are only found next to the link.
_PACKAGE_DIR = Path(os.path.abspath(__file__)).parent
FLAVOURS = ("simulator", "neuron")
_PACKAGE_NAMES = {"neuron": f"{__package__}.nki_src", "simulator": f"{__package__}._nki_src_simulator"}
_NKI_MODULES = ("nki", "nki.language", "nki.isa")
_lock = threading.RLock()


def source_dir() -> Path:
    """The folder holding the NKI sources: ``nki_src/`` in a build, else the repo's ``kernels/``."""
    shipped = _PACKAGE_DIR / "nki_src"
    if shipped.is_dir():
        return shipped
    repo = _PACKAGE_DIR.parent.parent / "kernels"
    if repo.is_dir():
        return repo
    raise FileNotFoundError(f"NKI kernel sources not found: neither {shipped} nor {repo} exists")


def source_path(module: str) -> Path:
    """Path of the NKI source ``<module>.py``."""
    path = source_dir() / f"{module}.py"
    if not path.is_file():
        raise FileNotFoundError(f"NKI kernel module {module!r} not found at {path}")
    return path


def _simulator_import(name, globals=None, locals=None, fromlist=(), level=0):
    """``__import__`` of simulator-flavoured kernel modules: ``nki*`` is the simulator's."""
    if level == 0 and (name == "nki" or name.startswith("nki.")):
        from . import simulator

        modules = simulator.nki_modules()
        if name not in modules:
            raise ImportError(f"{name} is not provided by the nki_kernels simulator "
                              f"(it provides {', '.join(sorted(modules))})")
        return modules[name] if fromlist else modules["nki"]
    return builtins.__import__(name, globals, locals, fromlist, level)


_SIMULATOR_BUILTINS = dict(vars(builtins), __import__=_simulator_import)


class _SimulatorLoader(importlib.machinery.SourceFileLoader):
    """Executes a kernel source with the simulator's ``nki`` bound by ``import nki``."""

    def exec_module(self, module):
        module.__dict__["__builtins__"] = _SIMULATOR_BUILTINS
        super().exec_module(module)


class _SimulatorFinder:
    """Finds the modules of the simulator-flavoured kernel package (and nothing else)."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        prefix = _PACKAGE_NAMES["simulator"] + "."
        if not fullname.startswith(prefix):
            return None
        rel = fullname[len(prefix):]
        file = source_dir().joinpath(*rel.split(".")).with_suffix(".py")
        if not file.is_file():
            return None
        loader = _SimulatorLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def _package(flavour: str) -> ModuleType:
    """The package module of ``flavour``, created (and registered) on first use."""
    name = _PACKAGE_NAMES[flavour]
    pkg = sys.modules.get(name)
    if pkg is not None:
        return pkg
    src = source_dir()
    if flavour == "neuron" and (src / "__init__.py").is_file():
        return importlib.import_module(name)  # a Hub build: nki_src/ is a real subpackage
    pkg = ModuleType(name, f"NKI kernel sources from {src} ({flavour} flavour)")
    pkg.__path__ = [str(src)]
    pkg.__package__ = name
    pkg.__file__ = None
    if flavour == "simulator":
        pkg.__path__ = []  # submodules come from _SimulatorFinder only
        if not any(isinstance(f, _SimulatorFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _SimulatorFinder())
    sys.modules[name] = pkg
    return pkg


def load(module: str, flavour: str) -> ModuleType:
    """The kernel module ``module`` (e.g. ``"rms_norm"``) of ``flavour``, imported once."""
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour={flavour!r}: expected one of {FLAVOURS}")
    source_path(module)  # a clear error for a missing module
    with _lock:
        pkg = _package(flavour)
        return importlib.import_module(f"{pkg.__name__}.{module}")


def kernel(module: str, name: str, flavour: str):
    """The kernel function ``name`` of kernel module ``module`` for ``flavour``."""
    mod = load(module, flavour)
    try:
        return getattr(mod, name)
    except AttributeError:
        raise AttributeError(f"NKI kernel module {module!r} has no kernel {name!r}") from None


def limits() -> ModuleType:
    """``kernels/limits.py``: the shapes the kernels accept (imports nothing)."""
    return load("limits", "neuron")

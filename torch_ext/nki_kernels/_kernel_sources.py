"""Find and import the NKI kernel sources.

The NKI sources live in the repository's ``kernels/`` folder during development and are
copied into ``nki_src/`` inside a Hub build. They import ``nki`` at module level, so the
same file is imported once per flavour: under the simulator (while
``simulator.activated()`` is in force) and under the real toolchain. Each flavour gets its
own private module name, so neither can see the other's ``nki``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

# Not .resolve(): in the Hugging Face cache the snapshot files are symlinks into blobs/,
# and the package's siblings (nki_src/) are only found next to the link.
_PACKAGE_DIR = Path(os.path.abspath(__file__)).parent
_FLAVOURS = ("simulator", "neuron")
_loaded: dict[tuple[str, str], ModuleType] = {}


def source_dir() -> Path:
    """The folder holding the NKI sources: ``nki_src/`` in a build, else the repo's ``kernels/``."""
    shipped = _PACKAGE_DIR / "nki_src"
    if shipped.is_dir():
        return shipped
    repo = _PACKAGE_DIR.parent.parent / "kernels"
    if repo.is_dir():
        return repo
    raise FileNotFoundError(
        f"NKI kernel sources not found: neither {shipped} nor {repo} exists"
    )


def source_path(module: str) -> Path:
    """Path of the NKI source ``<module>.py``."""
    path = source_dir() / f"{module}.py"
    if not path.is_file():
        raise FileNotFoundError(f"NKI kernel module {module!r} not found at {path}")
    return path


def load(module: str, flavour: str) -> ModuleType:
    """Import kernel source ``module`` for ``flavour`` ("simulator" or "neuron"), cached.

    For "simulator" the caller must hold ``simulator.activated()`` on the first load, so
    that ``import nki`` inside the source binds the simulator.
    """
    if flavour not in _FLAVOURS:
        raise ValueError(f"flavour={flavour!r}: expected one of {_FLAVOURS}")
    key = (module, flavour)
    if key not in _loaded:
        name = f"{__package__}._nki_src_{flavour}.{module}"
        spec = importlib.util.spec_from_file_location(name, source_path(module))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
        _loaded[key] = mod
    return _loaded[key]

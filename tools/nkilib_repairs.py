"""In-memory repair of nki-library modules that do not parse at the commit we run (d2ad3a5).

AWS's checkout is never modified: a finder on ``sys.meta_path`` hands the listed modules to
a loader that compiles their source with the defect removed. Used by tools/run_nki_library.py
(``--patch-known-defects``) and by benchmarks/side_by_side_nki_library.py's ``NkiLibrary``
(which calibrate.py's QoR rows also use), so every way we run AWS's kernels imports the same
source.

* ``src/nkilib_src/nkilib/core/mlp/mlp.py``: a duplicated tail of the ``mlp`` docstring
  follows the docstring (IndentationError); the repair drops the lines from the error to the
  next closing triple quote. Without it every kernel under ``core/mlp`` (mlp_tkg, mlp_cte)
  fails to import.

Standard library only: the plugin side of run_nki_library imports it before anything else.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

REPAIRED_MODULES = ("nkilib_src.nkilib.core.mlp.mlp",)


class RepairingLoader(importlib.machinery.SourceFileLoader):
    """Compiles the source with each stray indented block (up to 3) after a docstring
    dropped, up to and including the next line that is only a closing triple quote."""

    def source_to_code(self, data, path, *, _optimize=-1):
        text = data.decode() if isinstance(data, bytes) else data
        for _ in range(3):
            try:
                return compile(text, path, "exec", dont_inherit=True, optimize=_optimize)
            except IndentationError as err:
                lines = text.splitlines(keepends=True)
                start = err.lineno - 1
                end = next((i for i in range(start, len(lines)) if lines[i].strip() == '"""'), None)
                if end is None:
                    raise
                text = "".join(lines[:start] + lines[end + 1:])
        return compile(text, path, "exec", dont_inherit=True, optimize=_optimize)


class RepairFinder(importlib.abc.MetaPathFinder):
    """Finds REPAIRED_MODULES as the path finder would, with RepairingLoader as loader."""

    def find_spec(self, name, path=None, target=None):
        if name not in REPAIRED_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.origin:
            spec.loader = RepairingLoader(name, spec.origin)
        return spec


def install() -> None:
    """Put RepairFinder first on sys.meta_path (once per process)."""
    if not any(isinstance(f, RepairFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, RepairFinder())

"""tools/nkilib_repairs.py: nki-library d2ad3a5's core/mlp/mlp.py does not parse (a duplicated
docstring tail); the repair imports it with the stray block dropped, without touching the
file, and leaves every other module to the normal import system."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# the shape of the defect: a docstring, then a duplicated, indented tail of it
DEFECT = '''def mlp(x):
    """Fused MLP.

    CTE mode supports:
    - FP8 quantization
    """

        TKG mode supports:
        - FP8 quantization

        CTE mode supports:
        - FP8 quantization
    """
    return x + 1
'''


@pytest.fixture
def repairs():
    spec = importlib.util.spec_from_file_location("nkilib_repairs", ROOT / "tools" / "nkilib_repairs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def fake_checkout(tmp_path, monkeypatch):
    pkg = tmp_path / "nkilib_src" / "nkilib" / "core" / "mlp"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent, pkg.parent.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "mlp.py").write_text(DEFECT)
    (pkg / "other.py").write_text(DEFECT)
    monkeypatch.syspath_prepend(str(tmp_path))
    # an earlier test may have imported the real nki-library's nkilib_src: set it aside
    real = {n: sys.modules.pop(n) for n in [n for n in sys.modules if n.startswith("nkilib_src")]}
    yield pkg
    for name in [n for n in sys.modules if n.startswith("nkilib_src")]:
        del sys.modules[name]
    sys.modules.update(real)


def test_the_listed_module_imports_with_the_stray_block_dropped(repairs, fake_checkout, monkeypatch):
    with pytest.raises(IndentationError):
        compile(DEFECT, "mlp.py", "exec")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    repairs.install()
    repairs.install()                       # once per process, however often it is called
    assert sum(isinstance(f, repairs.RepairFinder) for f in sys.meta_path) == 1
    mod = importlib.import_module("nkilib_src.nkilib.core.mlp.mlp")
    assert mod.mlp(2) == 3 and "CTE mode supports" in mod.mlp.__doc__
    assert (fake_checkout / "mlp.py").read_text() == DEFECT      # the checkout is not modified
    # modules not listed get no repair
    with pytest.raises(IndentationError):
        importlib.import_module("nkilib_src.nkilib.core.mlp.other")


def _stray(name, tail_lines):
    """A function whose docstring is followed by an indented stray tail (the defect)."""
    tail = "".join(f"        {line}\n" for line in tail_lines)
    return f'def {name}(x):\n    """{name}."""\n\n{tail}    """\n    return x + {len(name)}\n\n\n'


def _import_repaired(repairs, fake_checkout, monkeypatch, source):
    (fake_checkout / "mlp.py").write_text(source)
    with pytest.raises(IndentationError):
        compile(source, "mlp.py", "exec")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    repairs.install()
    return importlib.import_module("nkilib_src.nkilib.core.mlp.mlp")


def test_up_to_three_stray_blocks_are_dropped(repairs, fake_checkout, monkeypatch):
    source = "".join(_stray(n, ["TKG mode:", "- FP8"]) for n in ("a", "bb", "ccc"))
    mod = _import_repaired(repairs, fake_checkout, monkeypatch, source)
    assert (mod.a(1), mod.bb(1), mod.ccc(1)) == (2, 3, 4)


def test_a_stray_block_ends_at_a_line_that_is_only_a_closing_quote(repairs, fake_checkout, monkeypatch):
    # lines of the tail that quote triple quotes inline do not end it
    tail = ['Use """ for docstrings.', 'x = """a"""', 'And """ again.', "last line"]
    mod = _import_repaired(repairs, fake_checkout, monkeypatch, _stray("mlp", tail))
    assert mod.mlp(1) == 4 and mod.mlp.__doc__ == "mlp."

"""The shipped code runs on Python 3.12-3.14 (TorchNeuron 2.33's versions) although only
3.11 installs here: a static scan of torch_ext/nki_kernels and kernels/ for what 3.12, 3.13
and 3.14 removed, deprecated or changed.

Sources: "What's New In Python 3.12 / 3.13 / 3.14" (Removed, Deprecated, Porting sections)
and docs.python.org/3/deprecations/ ("Pending removal in Python 3.14/3.15/..."). Each
entry says the version and what to use instead. The scan resolves import aliases, so
``import datetime as dt; dt.datetime.utcnow()`` is found; it cannot see through values
passed around, which is why the shipped code keeps stdlib use plain.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = sorted((ROOT / "torch_ext" / "nki_kernels").rglob("*.py")) + sorted((ROOT / "kernels").glob("*.py"))
SUPPORTED = ("3.10", "3.11", "3.12", "3.13", "3.14")     # pyproject requires-python
NEURON_PYTHONS = ("3.12", "3.13", "3.14")                 # TorchNeuron 2.33 (torch-neuronx README)

_PEP594 = ("aifc audioop cgi cgitb chunk crypt imghdr mailcap msilib nis nntplib ossaudiodev pipes "
           "sndhdr spwd sunau telnetlib uu xdrlib").split()
# module -> (version, what happened, what to use)
MODULES = {
    **{m: ("3.13", "removed (PEP 594)", "a maintained third-party or stdlib replacement") for m in _PEP594},
    "lib2to3": ("3.13", "removed", "ast / a third-party parser"),
    "distutils": ("3.12", "removed (PEP 632)", "setuptools / sysconfig / shutil"),
    "imp": ("3.12", "removed", "importlib"),
    "asynchat": ("3.12", "removed", "asyncio"),
    "asyncore": ("3.12", "removed", "asyncio"),
    "smtpd": ("3.12", "removed", "a third-party SMTP server"),
    "typing.io": ("3.13", "removed", "typing"),
    "typing.re": ("3.13", "removed", "typing"),
    "sre_compile": ("3.11", "deprecated", "re"),
    "sre_constants": ("3.11", "deprecated", "re"),
    "sre_parse": ("3.11", "deprecated", "re"),
}
# dotted name -> (version, what happened, what to use)
NAMES = {
    **{f"ast.{n}": ("3.14", "removed", "ast.Constant") for n in ("Num", "Str", "Bytes", "NameConstant", "Ellipsis")},
    **{f"collections.{n}": ("3.10", "removed", f"collections.abc.{n}")
       for n in ("Mapping", "MutableMapping", "Sequence", "MutableSequence", "Iterable", "Callable", "Set")},
    "asyncio.get_child_watcher": ("3.14", "removed", "nothing (child watchers are gone)"),
    "asyncio.set_child_watcher": ("3.14", "removed", "nothing (child watchers are gone)"),
    "asyncio.get_event_loop": ("3.14", "changed: raises RuntimeError without a running loop",
                               "asyncio.run / asyncio.get_running_loop"),
    "asyncio.iscoroutinefunction": ("3.14", "deprecated", "inspect.iscoroutinefunction"),
    "pkgutil.find_loader": ("3.14", "removed", "importlib.util.find_spec"),
    "pkgutil.get_loader": ("3.14", "removed", "importlib.util.find_spec"),
    "importlib.abc.ResourceReader": ("3.14", "removed", "importlib.resources.abc"),
    "importlib.abc.Traversable": ("3.14", "removed", "importlib.resources.abc.Traversable"),
    "importlib.abc.TraversableResources": ("3.14", "removed", "importlib.resources.abc"),
    "importlib.util.set_package": ("3.12", "removed", "module specs"),
    "importlib.util.set_loader": ("3.12", "removed", "module specs"),
    "importlib.util.module_for_loader": ("3.12", "removed", "module specs"),
    "importlib.find_loader": ("3.12", "removed", "importlib.util.find_spec"),
    "urllib.request.URLopener": ("3.14", "removed", "urllib.request.urlopen"),
    "urllib.request.FancyURLopener": ("3.14", "removed", "urllib.request.urlopen"),
    "sqlite3.version": ("3.14", "removed", "sqlite3.sqlite_version"),
    "sqlite3.version_info": ("3.14", "removed", "sqlite3.sqlite_version_info"),
    "pty.master_open": ("3.14", "removed", "pty.openpty"),
    "pty.slave_open": ("3.14", "removed", "pty.openpty"),
    "typing.ByteString": ("3.12", "deprecated (removal 3.17)", "collections.abc.Buffer or a union"),
    "collections.abc.ByteString": ("3.12", "deprecated (removal 3.17)", "collections.abc.Buffer or a union"),
    "configparser.SafeConfigParser": ("3.12", "removed", "configparser.ConfigParser"),
    "ssl.wrap_socket": ("3.12", "removed", "ssl.SSLContext.wrap_socket"),
    "ssl.match_hostname": ("3.12", "removed", "ssl.SSLContext hostname checking"),
    "locale.format": ("3.12", "removed", "locale.format_string"),
    "locale.resetlocale": ("3.13", "removed", "locale.setlocale(locale.LC_ALL, '')"),
    "locale.getdefaultlocale": ("3.11", "deprecated (removal 3.15)", "locale.getlocale"),
    "logging.warn": ("3.13", "removed", "logging.warning"),
    "unittest.makeSuite": ("3.13", "removed", "unittest.TestLoader"),
    "unittest.findTestCases": ("3.13", "removed", "unittest.TestLoader"),
    "unittest.getTestCaseNames": ("3.13", "removed", "unittest.TestLoader"),
    "inspect.getargspec": ("3.11", "removed", "inspect.signature"),
    "inspect.formatargspec": ("3.11", "removed", "inspect.signature"),
    "asyncio.coroutine": ("3.11", "removed", "async def"),
    "datetime.datetime.utcnow": ("3.12", "deprecated", "datetime.datetime.now(datetime.UTC)"),
    "datetime.datetime.utcfromtimestamp": ("3.12", "deprecated", "datetime.datetime.fromtimestamp(t, datetime.UTC)"),
    "codecs.open": ("3.14", "deprecated", "open()"),
    "ctypes.SetPointerType": ("3.13", "deprecated", "ctypes pointer types"),
    "glob.glob0": ("3.13", "deprecated", "glob.glob"),
    "glob.glob1": ("3.13", "deprecated", "glob.glob"),
}
# attribute names, whatever the object (methods removed or deprecated)
ATTRIBUTES = {
    **{n: ("3.12", "removed", "the unittest assert* name") for n in (
        "assertEquals", "assertNotEquals", "failUnless", "failIf", "failUnlessEqual", "failIfEqual",
        "assertRegexpMatches", "assertRaisesRegexp", "assertNotRegexpMatches", "assertDictContainsSubset",
        "assertAlmostEquals", "assertNotAlmostEquals", "assert_")},
    **{n: ("3.10", "deprecated", "the snake_case name") for n in (
        "setDaemon", "isDaemon", "isSet", "notifyAll", "currentThread", "activeCount")},
    "readfp": ("3.12", "removed", "ConfigParser.read_file"),
    "link_to": ("3.12", "removed", "Path.hardlink_to"),
    "co_lnotab": ("3.12", "deprecated", "code.co_lines()"),
    "utcnow": ("3.12", "deprecated", "datetime.now(datetime.UTC)"),
    "utcfromtimestamp": ("3.12", "deprecated", "datetime.fromtimestamp(t, datetime.UTC)"),
}
PROCESS_POOLS = {"multiprocessing.Pool", "multiprocessing.Process", "multiprocessing.pool.Pool",
                 "concurrent.futures.ProcessPoolExecutor"}


class _Scan(ast.NodeVisitor):
    """Findings of one file: ``(line, message)``."""

    def __init__(self, path: Path):
        self.path = path
        self.aliases: dict[str, str] = {}
        self.findings: list[tuple[int, str]] = []

    def found(self, node, text: str, entry) -> None:
        version, what, use = entry
        self.findings.append((node.lineno, f"{text}: {what} in Python {version}; use {use}"))

    # -------------------------------------------------------------- imports
    def visit_Import(self, node):
        for alias in node.names:
            self._module(node, alias.name)
            self.aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]

    def visit_ImportFrom(self, node):
        if node.level:                        # package-internal
            return
        module = node.module or ""
        self._module(node, module)
        for alias in node.names:
            full = f"{module}.{alias.name}"
            self._module(node, full)
            if full in NAMES:
                self.found(node, f"from {module} import {alias.name}", NAMES[full])
            self.aliases[alias.asname or alias.name] = full

    def _module(self, node, name: str) -> None:
        for candidate in (name, name.split(".")[0]):
            if candidate in MODULES:
                self.found(node, f"import {name}", MODULES[candidate])
                return

    # -------------------------------------------------------------- names
    def dotted(self, node) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        root = self.aliases.get(node.id)
        return None if root is None else ".".join([root, *reversed(parts)])

    def visit_Attribute(self, node):
        name = self.dotted(node)
        if name in NAMES:
            self.found(node, name, NAMES[name])
        elif node.attr in ATTRIBUTES:
            self.found(node, f".{node.attr}", ATTRIBUTES[node.attr])
        if node.attr == "__annotations__" and isinstance(node.ctx, ast.Load):
            self.found(node, "reading __annotations__", (
                "3.14", "changed (PEP 649/749: evaluated lazily, may raise NameError)",
                "inspect.signature / inspect.get_annotations"))
        self.generic_visit(node)

    # -------------------------------------------------------------- calls
    def visit_Call(self, node):
        name = self.dotted(node.func) or ""
        keywords = {k.arg for k in node.keywords}
        method = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if method in ("extractall", "extract") and "tarfile" in self.aliases.values() and "filter" not in keywords:
            self.found(node, f".{method}() without filter=", (
                "3.14", "changed: the default extraction filter is 'data'", "an explicit filter='data'"))
        if name in ("re.sub", "re.subn") and len(node.args) > 3 or name == "re.split" and len(node.args) > 2:
            self.found(node, f"{name}() with count/flags passed positionally", (
                "3.13", "deprecated", "count= / flags= keywords"))
        if name == "shutil.rmtree" and "onerror" in keywords:
            self.found(node, "shutil.rmtree(onerror=)", ("3.12", "deprecated", "onexc="))
        if name in PROCESS_POOLS and "mp_context" not in keywords:
            self.found(node, f"{name}() with the default start method", (
                "3.14", "changed: the default start method on Linux is forkserver",
                "an explicit multiprocessing.get_context(...)"))
        self.generic_visit(node)

    # -------------------------------------------------------------- finally
    def visit_Try(self, node):
        for stmt in node.finalbody:
            for inner in _exits(stmt):
                self.found(inner, f"{type(inner).__name__.lower()} in a finally block", (
                    "3.14", "a SyntaxWarning (PEP 765)", "code after the try statement"))
        self.generic_visit(node)

    visit_TryStar = visit_Try


def _exits(stmt, in_loop=False):
    """return / break / continue statements that leave the finally block ``stmt`` is in."""
    if isinstance(stmt, ast.Return) or (isinstance(stmt, (ast.Break, ast.Continue)) and not in_loop):
        yield stmt
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
        return
    loop = isinstance(stmt, (ast.For, ast.AsyncFor, ast.While))
    for child in ast.iter_child_nodes(stmt):
        if isinstance(child, ast.stmt):
            yield from _exits(child, in_loop or loop)


def scan_source(source: str, path: Path) -> list[str]:
    """Every finding of one source file, as ``"<file>:<line>: <message>"``."""
    findings = []
    with warnings.catch_warnings():
        # invalid escape sequences and similar: DeprecationWarning on 3.11, SyntaxWarning from
        # 3.12, an error in a later version
        warnings.simplefilter("error", SyntaxWarning)
        warnings.simplefilter("error", DeprecationWarning)
        try:
            compile(source, str(path), "exec", dont_inherit=True)
        except (SyntaxError, SyntaxWarning, DeprecationWarning) as err:
            findings.append(f"{path.name}:{getattr(err, 'lineno', '?')}: does not compile cleanly: {err}")
    scan = _Scan(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # reported above
        tree = ast.parse(source, filename=str(path))
    scan.visit(tree)
    findings += [f"{path.name}:{line}: {message}" for line, message in scan.findings]
    return findings


def test_the_scan_covers_the_shipped_package_and_the_kernels():
    names = {p.relative_to(ROOT).as_posix() for p in SCANNED}
    assert {"torch_ext/nki_kernels/_neuron.py", "torch_ext/nki_kernels/simulator/kernel_rules.py",
            "kernels/attention.py"} <= names


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_api_removed_deprecated_or_changed_in_312_to_314(path):
    assert scan_source(path.read_text(), path) == []


BAD = {
    "import imp\n": "imp: removed in Python 3.12",
    "import cgi, os\n": "cgi: removed (PEP 594) in Python 3.13",
    "from distutils.version import LooseVersion\n": "removed (PEP 632) in Python 3.12",
    "import ast\nx = ast.Num(1)\n": "ast.Num: removed in Python 3.14",
    "import ast as a\nx = isinstance(1, a.Str)\n": "ast.Str: removed in Python 3.14",
    "from pkgutil import find_loader\n": "removed in Python 3.14",
    "import datetime as dt\nt = dt.datetime.utcnow()\n": "deprecated in Python 3.12",
    "import typing\nx: typing.ByteString\n": "typing.ByteString: deprecated (removal 3.17)",
    "import threading\nthreading.Thread().setDaemon(True)\n": ".setDaemon",
    "import re\nre.sub('a', 'b', 'c', 0, re.I)\n": "re.sub() with count/flags passed positionally",
    "import tarfile\ntarfile.open('x').extractall('d')\n": "the default extraction filter",
    "import multiprocessing\nmultiprocessing.Pool(2)\n": "forkserver",
    "def f():\n    try:\n        pass\n    finally:\n        return 1\n": "return in a finally block",
    "for i in range(2):\n    try:\n        pass\n    finally:\n        continue\n": "continue in a finally block",
    "x = '\\d'\n": "does not compile cleanly",
    "class A:\n    y: int\nz = A.__annotations__\n": "reading __annotations__",
    "import asyncio\nasyncio.get_event_loop()\n": "raises RuntimeError without a running loop",
}


@pytest.mark.parametrize("source, message", list(BAD.items()), ids=lambda v: v.split("\n")[0][:40])
def test_the_scan_finds_each_kind(source, message):
    findings = scan_source(source, Path("example.py"))
    assert any(message in f for f in findings), findings


def test_the_scan_leaves_correct_code_alone():
    good = ("import datetime, re, tarfile, threading\n"
            "def f(t):\n    try:\n        for i in range(2):\n            break\n    finally:\n"
            "        for j in range(2):\n            continue\n"
            "    threading.Thread(daemon=True)\n    re.sub('a', 'b', 'c', count=1, flags=re.I)\n"
            "    tarfile.open('x').extractall('d', filter='data')\n"
            "    return datetime.datetime.now(datetime.UTC), r'\\d'\n")
    assert scan_source(good, Path("good.py")) == []


# ---------------------------------------------------------------------------- what pyproject says

def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_requires_python_names_what_we_support():
    spec = _pyproject()["project"]["requires-python"]
    assert spec == ">=3.10,<3.15", spec
    classifiers = _pyproject()["project"].get("classifiers", [])
    assert [c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(
        r"Programming Language :: Python :: 3\.\d+", c)] == list(SUPPORTED)


def test_the_neuron_extra_pins_the_families_that_match_our_torch():
    project = _pyproject()["project"]
    torch_pin = next(d for d in project["dependencies"] if d.startswith("torch=="))
    major_minor = ".".join(torch_pin.removeprefix("torch==").split(".")[:2])
    # AWS: "Install the torch-neuronx package family that matches the PyTorch version"; the
    # Neuron 2.33 release of that family (2.13.3.0 / 2.14.3.0), its compiler, 2.28.7631.0
    # (installed beside torch-neuronx by AWS's update page), and its NKI, 0.7.0
    assert project["optional-dependencies"]["neuron"] == [f"torch-neuronx=={major_minor}.3.0",
                                                          "neuronx-cc==2.28.7631.0", "nki==0.7.0"]


def test_readme_trainium_section_names_the_pins_the_pythons_and_the_acceptance_run():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Running on a Trainium host", 1)[1].split("\n## ", 1)[0]
    project = _pyproject()["project"]
    for pin in project["optional-dependencies"]["neuron"]:
        assert pin in section, pin
    torch_pin = next(d for d in project["dependencies"] if d.startswith("torch=="))
    assert torch_pin in section
    assert "Python 3.12, 3.13 or 3.14" in section
    assert "python -m nki_kernels.acceptance" in section
    assert sys.version_info[:2] >= (3, 10)

"""NKI 0.7's language rules for kernel code (classes, helpers, imports, purity, loops):
a static scan of every kernel source, the simulator's enforcement of the same rules
(simulator/kernel_rules.py, checked when a run starts) in both directions, and every
kernel of kernels/ passing that check.

Sources (AWS Neuron docs): NKI language guide "Class Support" and "Kernel Caching" (2.32);
"Announcing changes to NKI specialization" and the NKI 0.7.0 release notes (2.33: Python
tracing, class inheritance, dynamic loops removed); NKI migration guide (neuronxcc.nki is an
error, 0.3 -> 0.4); nested jitted kernels are inlined, as AWS's nki-library uses them (the
scan still keeps our own kernels/ to plain helpers, a house rule); nki-loops deep dive
(affine_range / sequential_range / static_range are deprecated aliases of range in 0.7).
The scan asks for the form both NKI 0.6 and 0.7 accept (a single nl.NKIObject base); the
simulator enforces 0.7's (NKIObject-rooted inheritance allowed).
"""

from __future__ import annotations

import ast
import enum
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from nki_kernels import _kernel_sources, simulator
from nki_kernels.simulator import kernel_rules
from nki_kernels.simulator.language import NKIObject

ROOT = Path(__file__).resolve().parents[2]
KERNEL_SOURCES = sorted((ROOT / "kernels").glob("*.py"))
LOOP_HELPERS_GONE = {"dynamic_range": "removed in NKI 0.7 (use nl.fori_loop / nl.while_loop)",
                     "affine_range": "a deprecated alias of range in NKI 0.7",
                     "sequential_range": "a deprecated alias of range in NKI 0.7",
                     "static_range": "a deprecated alias of range in NKI 0.7"}
MUTATING_METHODS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault",
                    "add", "discard", "popitem", "sort", "reverse"}


# ---------------------------------------------------------------------------- the static scan

class _Module:
    def __init__(self, path: Path):
        self.path = path
        self.tree = ast.parse(path.read_text(), filename=str(path))
        self.aliases = {}          # local name -> imported module / object path
        for node in self.tree.body:
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{'.' * node.level}{node.module or ''}.{a.name}"
        self.globals = {t.id for node in self.tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                        if isinstance(t, ast.Name)}

    def resolves_to(self, node, dotted: str) -> bool:
        """Whether expression ``node`` names ``dotted`` (e.g. "nki.language.NKIObject")."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.aliases:
            return False
        return ".".join([self.aliases[node.id], *reversed(parts)]) == dotted

    def where(self, node) -> str:
        return f"{self.path.name}:{node.lineno}"


MODULES = [_Module(p) for p in KERNEL_SOURCES]
JITTED = {f.name for m in MODULES for f in m.tree.body if isinstance(f, ast.FunctionDef)
          and any(m.resolves_to(d.func if isinstance(d, ast.Call) else d, "nki.jit") for d in f.decorator_list)}


def test_the_scan_sees_the_kernels():
    assert {"rms_norm_kernel", "attention_kernel", "flash_attention_kernel", "elementwise_kernel"} <= JITTED
    assert sum(isinstance(n, ast.ClassDef) for m in MODULES for n in ast.walk(m.tree)) >= 4


def check_classes_inherit_nl_nkiobject_only(module):
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.ClassDef):
            continue
        assert len(node.bases) == 1 and module.resolves_to(node.bases[0], "nki.language.NKIObject"), (
            f"{module.where(node)}: class {node.name} must inherit from nl.NKIObject and nothing else")
        assert not node.keywords, f"{module.where(node)}: class {node.name} passes {ast.unparse(node.keywords[0])}"
        for deco in node.decorator_list:
            target = deco.func if isinstance(deco, ast.Call) else deco
            assert module.resolves_to(target, "dataclasses.dataclass"), (
                f"{module.where(deco)}: class {node.name} may carry @dataclass only, not {ast.unparse(deco)}")


def check_only_top_level_kernels_carry_nki_jit_and_no_kernel_calls_another(module):
    for node in ast.walk(module.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node not in module.tree.body:
            for deco in node.decorator_list:
                assert not module.resolves_to(deco.func if isinstance(deco, ast.Call) else deco, "nki.jit"), (
                    f"{module.where(node)}: nested function {node.name} carries @nki.jit")
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            assert name not in JITTED, (
                f"{module.where(node)}: calls the jitted kernel {name}; in kernels/ sub-kernels are plain "
                "functions (house style: one launch per op, helpers never look like entry points)")


def check_imports_are_module_level_and_never_neuronxcc(module):
    top = set(map(id, module.tree.body))
    for node in ast.walk(module.tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            assert id(node) in top, f"{module.where(node)}: import inside a function or class"
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            assert not any(n.split(".")[0] == "neuronxcc" for n in names), (
                f"{module.where(node)}: neuronxcc.nki is a compilation error since NKI 0.4.0")
            assert all(a.name != "*" for a in node.names), f"{module.where(node)}: star import"


def _locals(fn: ast.FunctionDef) -> set[str]:
    names = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
    names |= {a.arg for a in (fn.args.vararg, fn.args.kwarg) if a is not None}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _root_name(node):
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def check_kernel_code_is_pure(module):
    """Kernels are pure functions of their arguments (language guide, 'Kernel Caching'): no
    global/nonlocal, no module-level statement that mutates, no function that mutates a
    module-level value."""
    allowed_top = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
    for i, node in enumerate(module.tree.body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        assert docstring or isinstance(node, allowed_top), f"{module.where(node)}: module-level {type(node).__name__}"
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            assert all(isinstance(t, (ast.Name, ast.Tuple)) for t in targets), (
                f"{module.where(node)}: module-level assignment into {ast.unparse(targets[0])}")
    for fn in ast.walk(module.tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        local = _locals(fn)
        for node in ast.walk(fn):
            assert not isinstance(node, (ast.Global, ast.Nonlocal)), f"{module.where(node)}: {type(node).__name__}"
            shared = lambda n: (_root_name(n) in module.globals) and _root_name(n) not in local  # noqa: E731
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for t in targets:
                    assert not (isinstance(t, (ast.Attribute, ast.Subscript)) and shared(t)), (
                        f"{module.where(node)}: {fn.name} writes into the module-level {_root_name(t)}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in MUTATING_METHODS and shared(node.func.value):
                raise AssertionError(f"{module.where(node)}: {fn.name} mutates the module-level "
                                     f"{_root_name(node.func.value)} ({node.func.attr})")


def check_no_removed_or_deprecated_loop_helpers(module):
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Attribute) and node.attr in LOOP_HELPERS_GONE \
                and module.resolves_to(node, f"nki.language.{node.attr}"):
            raise AssertionError(f"{module.where(node)}: nl.{node.attr} is {LOOP_HELPERS_GONE[node.attr]}")


CHECKS = [check_classes_inherit_nl_nkiobject_only,
          check_only_top_level_kernels_carry_nki_jit_and_no_kernel_calls_another,
          check_imports_are_module_level_and_never_neuronxcc, check_kernel_code_is_pure,
          check_no_removed_or_deprecated_loop_helpers]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.path.name)
def test_kernel_sources_follow_the_rules(module, check):
    check(module)


BAD_SOURCES = {
    check_classes_inherit_nl_nkiobject_only: [
        "class Shapes:\n    pass\n",
        "import nki.language as nl\nclass Shapes(nl.NKIObject, dict):\n    pass\n",
        "import functools\nimport nki.language as nl\n@functools.total_ordering\nclass S(nl.NKIObject):\n    pass\n"],
    check_only_top_level_kernels_carry_nki_jit_and_no_kernel_calls_another: [
        "def helper(x):\n    return rms_norm_kernel(x)\n",
        "import nki\ndef outer():\n    @nki.jit\n    def inner(x):\n        return x\n"],
    check_imports_are_module_level_and_never_neuronxcc: [
        "import neuronxcc.nki.language as nl\n", "def f():\n    import math\n", "from math import *\n"],
    check_kernel_code_is_pure: [
        "CACHE = {}\ndef f(x):\n    CACHE[x] = 1\n", "SEEN = []\ndef f(x):\n    SEEN.append(x)\n",
        "N = 0\ndef f():\n    global N\n    N = 1\n", "T = {}\nT['a'] = 1\n", "print('import time')\n"],
    check_no_removed_or_deprecated_loop_helpers: [
        "import nki.language as nl\ndef f(n):\n    for i in nl.dynamic_range(n):\n        pass\n",
        "import nki.language as nl\ndef f(n):\n    for i in nl.affine_range(n):\n        pass\n"],
}


@pytest.mark.parametrize("check, source", [(c, s) for c, sources in BAD_SOURCES.items() for s in sources],
                         ids=lambda v: v.__name__.removeprefix("check_") if callable(v) else None)
def test_each_check_rejects_a_bad_source(tmp_path, check, source):
    path = tmp_path / "bad_kernel.py"
    path.write_text(source)
    with pytest.raises(AssertionError):
        check(_Module(path))


def test_local_names_that_shadow_module_values_are_not_mutations(tmp_path):
    path = tmp_path / "ok_kernel.py"
    path.write_text("ROWS = 128\ndef f(x):\n    ROWS = []\n    ROWS.append(x)\n    return ROWS\n")
    check_kernel_code_is_pure(_Module(path))


def test_every_kernel_passes_the_simulators_rule_check():
    """The same rules as the simulator enforces them, on every jitted kernel of kernels/."""
    checked = []
    for path in KERNEL_SOURCES:
        module = _kernel_sources.load(path.stem, "simulator")
        for name in JITTED & set(vars(module)):
            kernel = getattr(module, name)
            if getattr(kernel, "__module__", "") == module.__name__:
                kernel_rules.check_function(kernel.fn)
                checked.append(name)
    assert set(checked) == JITTED


def test_neuron_flavour_sources_are_a_real_package_the_compiler_can_read():
    """AWS's compiler reads a kernel's source: the neuron flavour imports kernels/ the
    ordinary way, under a registered parent package, with source files inspect can read.
    (The simulator's modules stand in for `nki` in a fresh interpreter.)"""
    code = (
        "import inspect, sys\n"
        "from nki_kernels import simulator, _kernel_sources\n"
        "with simulator.activated():\n"
        "    k = _kernel_sources.kernel('rms_norm', 'rms_norm_kernel', 'neuron')\n"
        "    mod = sys.modules[k.__module__]\n"
        "    print(mod.__name__, mod.__package__ in sys.modules, mod.__spec__.parent,\n"
        "          'def rms_norm_kernel' in inspect.getsource(k.fn),\n"
        "          mod.program_row_blocks.__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["nki_kernels.nki_src.rms_norm", "True", "nki_kernels.nki_src", "True",
                                  "nki_kernels.nki_src.tiling"]


# ---------------------------------------------------------------------------- the simulator enforces them

class _Plain:
    """A class that is not an NKI object."""

    def __init__(self, n=2):
        self.n = n


class _Mixin:
    pass


class _Config(NKIObject):
    def __init__(self, n=2):
        self.n = n


class _Derived(_Config):          # NKI 0.7: inheritance between NKI classes
    pass


class _Mixed(NKIObject, _Mixin):
    pass


@dataclass(frozen=True)
class _Frozen(NKIObject):
    n: int = 2


class _Mode(enum.Enum):
    A = 1


_neuronxcc = types.ModuleType("neuronxcc.nki.language")
_CALLS = 0


def _kernel(use):
    """A jitted copy kernel that calls ``use()`` first (what a rule looks at)."""
    nki, nl, nisa = (simulator.nki_modules()[n] for n in ("nki", "nki.language", "nki.isa"))

    @nki.jit
    def copy_kernel(x, config=None):
        use()
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x)
        nisa.dma_copy(dst=out, src=tile)
        return out
    return copy_kernel


def _run(kernel, **kwargs):
    x = torch.randn(4, 8)
    out = simulator.run(kernel, x, **kwargs).outputs
    assert torch.equal(out, x)


@pytest.mark.parametrize("use", [
    lambda: _Config(3), lambda: _Derived(), lambda: _Frozen(4) == _Frozen(4), lambda: _Mode.A,
    lambda: len([1, 2]), lambda: torch.float32,
], ids=["nkiobject", "nki-inheritance", "frozen-dataclass", "enum", "builtins", "third-party"])
def test_allowed_classes_run(use):
    _run(_kernel(use))


@pytest.mark.parametrize("use, words", [
    (lambda: _Plain(), ["_Plain", "derives from object", "nl.NKIObject"]),
    (lambda: _Mixed(), ["_Mixed", "_Mixin", "every base"]),
], ids=["plain-class", "plain-mixin"])
def test_other_classes_are_rejected(use, words):
    with pytest.raises(kernel_rules.KernelRuleError) as info:
        _run(_kernel(use))
    assert isinstance(info.value, AssertionError)          # an NkiValidationError
    for word in words:
        assert word in str(info.value)


def test_a_class_used_through_a_helper_is_found():
    def helper():
        return _Plain()

    with pytest.raises(kernel_rules.KernelRuleError, match="_Plain"):
        _run(_kernel(lambda: helper()))


@pytest.mark.parametrize("config, ok", [(_Config(), True), (_Frozen(), True), (_Mode.A, True), (3, True),
                                        (_Plain(), False)], ids=["nki", "dataclass", "enum", "int", "plain"])
def test_argument_classes(config, ok):
    kernel = _kernel(lambda: None)
    if ok:
        _run(kernel, config=config)
    else:
        with pytest.raises(kernel_rules.KernelRuleError, match="an argument of"):
            _run(kernel, config=config)


def test_a_jitted_sub_kernel_is_inlined_and_its_code_obeys_the_rules():
    # AWS's nki-library calls jitted kernels from kernels (moe_cte -> bwmm_shard_on_block):
    # NKI 0.7 inlines them; what they do is checked like the caller's own code
    nki = simulator.nki_modules()["nki"]
    calls = []

    def helper():
        calls.append(1)
        return 1

    jitted = nki.jit(helper)
    _run(_kernel(lambda: helper()))
    _run(_kernel(lambda: jitted()))
    assert len(calls) == 2
    impure = nki.jit(lambda: _bump())
    with pytest.raises(kernel_rules.KernelRuleError, match="assigns the module global '_CALLS'"):
        _run(_kernel(lambda: impure()))
    assert _CALLS == 0


def _bump():
    global _CALLS
    _CALLS += 1


def test_writing_a_module_global_is_rejected():
    with pytest.raises(kernel_rules.KernelRuleError, match="assigns the module global '_CALLS'.*pure"):
        _run(_kernel(lambda: _bump()))
    assert _CALLS == 0


def test_the_neuronxcc_namespace_is_rejected():
    with pytest.raises(kernel_rules.KernelRuleError, match="neuronxcc.nki.language.*NKI 0.4.0"):
        _run(_kernel(lambda: _neuronxcc))


def test_an_attribute_named_like_a_jitted_global_is_not_a_call_of_it():
    # `nisa.activation(...)` in a module that also has a jitted kernel named `activation`:
    # the attribute is not the global (co_names holds both kinds of name)
    global scale_rows, _holder
    import types

    scale_rows = simulator.nki_modules()["nki"].jit(lambda: 1)
    _holder = types.SimpleNamespace(scale_rows=lambda: 2)
    try:
        _run(_kernel(lambda: _holder.scale_rows()))
        _run(_kernel(lambda: scale_rows()))      # a nested jitted kernel: inlined, allowed
    finally:
        del scale_rows, _holder


_DOOMED = 1


def _drop_global():
    global _DOOMED
    del _DOOMED


def test_deleting_a_module_global_is_rejected():
    with pytest.raises(kernel_rules.KernelRuleError, match="module global '_DOOMED'.*pure functions"):
        _run(_kernel(lambda: _drop_global()))
    assert _DOOMED == 1


def _class_body_uses_a_plain_class():
    class Holder(NKIObject):
        kind = _Plain          # a name the class body loads (LOAD_NAME), not the function

    return Holder


def test_a_class_named_in_a_nested_class_body_is_checked():
    with pytest.raises(kernel_rules.KernelRuleError, match="class _Plain .*derives from object"):
        _run(_kernel(lambda: _class_body_uses_a_plain_class()))


# a sibling module of this test's package, as a kernel package's helper module would be
_sibling = types.ModuleType(f"{__package__}._rules_sibling")
exec("def impure():\n    global counter\n    counter = 1\n\n\ndef plain():\n    return 2\n",
     _sibling.__dict__)


def test_a_sibling_module_s_function_called_as_a_method_is_checked():
    _run(_kernel(lambda: _sibling.plain()))
    with pytest.raises(kernel_rules.KernelRuleError, match="impure .*assigns the module global 'counter'"):
        _run(_kernel(lambda: _sibling.impure()))
    assert not hasattr(_sibling, "counter")


class _ImpureBase(NKIObject):
    def bump(self):
        global _CALLS
        _CALLS += 1


class _ImpureChild(_ImpureBase):
    pass


def test_methods_inherited_from_a_user_base_class_are_checked():
    with pytest.raises(kernel_rules.KernelRuleError, match="bump .*assigns the module global '_CALLS'"):
        _run(_kernel(lambda: _ImpureChild()))
    assert _CALLS == 0


class _ImpureProperty(NKIObject):
    @property
    def size(self):
        global _CALLS
        _CALLS += 1
        return 1


def test_property_functions_are_checked():
    with pytest.raises(kernel_rules.KernelRuleError, match="size .*assigns the module global '_CALLS'"):
        _run(_kernel(lambda: _ImpureProperty().size))
    assert _CALLS == 0


class _ImpureStatic(NKIObject):
    @staticmethod
    def bump():
        global _CALLS
        _CALLS += 1


class _ImpureClassMethod(NKIObject):
    @classmethod
    def bump(cls):
        global _CALLS
        _CALLS += 1


@pytest.mark.parametrize("klass", [_ImpureStatic, _ImpureClassMethod], ids=["staticmethod", "classmethod"])
def test_static_and_class_methods_are_checked(klass):
    # the class's members are walked when the kernel uses the class, the function inside a
    # staticmethod / classmethod wrapper too (mutation testing: nothing else checked them)
    with pytest.raises(kernel_rules.KernelRuleError, match="bump .*assigns the module global '_CALLS'"):
        _run(_kernel(lambda: klass()))
    assert _CALLS == 0


def test_argument_classes_inside_lists_and_of_the_standard_library():
    import fractions

    kernel = _kernel(lambda: None)
    _run(kernel, config=[_Config(), 3])
    _run(kernel, config=fractions.Fraction(1, 3))      # the standard library's: not a user class
    for config in ([_Config(), _Plain()], (_Plain(),)):
        with pytest.raises(kernel_rules.KernelRuleError, match="class _Plain .*an argument of"):
            _run(kernel, config=config)

"""NKI 0.7's rules for the Python a kernel is made of: classes, helpers (sub-kernels),
imports and purity. Checked once per kernel function when a run starts (``check_kernel``),
plus the classes of the arguments of every run.

What AWS documents, and what is checked here (a violation raises :class:`KernelRuleError`):

* **Classes.** "When you declare a class for use in a NKI kernel, the class must inherit
  from NKIObject" (NKI language guide, "Class Support", Neuron 2.32 / NKI 0.6, which adds
  "and no other classes"); NKI 0.7 traces kernels with Python, so "class inheritance" is
  allowed (2.33 announcement "Announcing changes to NKI specialization", NKI 0.7.0 release
  notes). The 0.7 rule enforced: every class a kernel uses, or an instance of which is
  passed to it, derives from ``nl.NKIObject``, and every one of its bases does too (a
  chain of NKI classes is fine, a plain mixin is not). Enums are allowed (the guide lists
  them). ``@dataclass`` is optional (guide). With 0.7, ``==`` on such objects follows
  Python ("Kernels that use == on user-defined classes can behave differently"): a
  dataclass compares fields, any other class identity, which is what the simulator does.
* **Helpers.** Functions a kernel calls are traced as ordinary Python and inlined (NKI 0.7
  specialises kernels by running them with Python). A jitted kernel called from inside
  another kernel is inlined the same way, not launched: AWS's nki-library (2.33) does it
  (core/moe/moe_cte/moe_cte.py calls the jitted ``bwmm_shard_on_block``; attention_block_tkg,
  moe_tkg likewise), and the 2.33 ``nki.jit`` docstring's ``specialization_config``
  (``allow_nested_config_override``) configures exactly such nested jitted calls. The old
  "remove the nki.jit decorator from sub-kernels" (NKI migration guide, 0.1 -> 0.2) is not
  a rule of 0.7, so it is not enforced; the rules below apply to the inlined kernel's code.
* **Imports.** The ``neuronxcc.nki`` namespace inside kernels is a compilation error since
  NKI 0.4.0 (NKI migration guide, 0.3 -> 0.4); kernels use ``nki``, ``nki.language``,
  ``nki.isa``.
* **Purity.** "NKI caches compiled kernels based on their input arguments ... NKI kernels
  must be pure functions of their arguments" (language guide, "Kernel Caching"): kernel
  code that assigns or deletes a module global is an error.

What a kernel "uses": the globals and closure cells its code names, followed through the
functions, classes (their methods) and sibling modules of the kernel's own package; the
``nki`` modules, the standard library and third-party code are not entered.
tests/kernels/test_language_rules.py exercises every rule both ways and checks that every
kernel of kernels/ passes them.
"""

from __future__ import annotations

import dis
import enum
import sys
import threading
import types

from .errors import NkiValidationError
from .language import NKIObject

_SIMULATOR_PACKAGE = __name__.rpartition(".")[0]
_MISSING = object()
_GLOBAL_WRITES = ("STORE_GLOBAL", "DELETE_GLOBAL")
# types whose instances are plain data to the kernel (never checked as argument classes)
_PLAIN = (bool, int, float, complex, str, bytes, type(None), tuple, list, dict, slice,
          type(Ellipsis), enum.Enum)


class KernelRuleError(NkiValidationError):
    """A kernel breaks a rule of the NKI language (classes, helpers, imports, purity)."""


def _module_name(obj) -> str:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    return getattr(obj, "__module__", None) or ""


def _package(module: str) -> str:
    return module.rpartition(".")[0]


def _is_user(obj, home: str) -> bool:
    """Whether ``obj`` is the kernel author's code: defined in the kernel's module ``home``
    or a sibling module of its package (never the simulator, the stdlib or third parties)."""
    module = _module_name(obj)
    if not module or module.startswith(_SIMULATOR_PACKAGE):
        return False
    if module == home:
        return True
    package = _package(home)
    return bool(package) and module.startswith(package + ".")


def _is_jitted(value) -> bool:
    """A simulator ``nki.jit`` kernel object (recognised by shape, so this module needs no
    import of the interpreter, which imports it)."""
    return (not isinstance(value, (type, types.ModuleType, types.FunctionType))
            and _module_name(type(value)).startswith(_SIMULATOR_PACKAGE)
            and isinstance(getattr(value, "fn", None), types.FunctionType))


def _where(fn) -> str:
    code = getattr(fn, "__code__", None)
    return f"{fn.__qualname__} ({code.co_filename}:{code.co_firstlineno})" if code else repr(fn)


def check_class(cls: type, used_by: str) -> None:
    """The NKI 0.7 class rule (module docstring) for ``cls``, named in errors by ``used_by``."""
    if issubclass(cls, enum.Enum):
        return
    if cls is NKIObject:
        return
    bad = [b for b in cls.__bases__ if not (isinstance(b, type) and issubclass(b, NKIObject))]
    if bad or not issubclass(cls, NKIObject):
        names = ", ".join(b.__qualname__ for b in (bad or cls.__bases__))
        raise KernelRuleError(
            f"class {cls.__qualname__} (used by {used_by}) derives from {names}: a class used in an NKI "
            "kernel must inherit from nl.NKIObject, and every base must be an NKIObject class "
            "(NKI language guide, 'Class Support'; NKI 0.7 allows inheritance between NKI classes)")


def _code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


class _Walk:
    """Everything one kernel function uses (module docstring), checked as it is found."""

    def __init__(self, root):
        self.root = root
        self.home = _module_name(root)
        self.seen: set[int] = set()

    def function(self, fn, used_by: str) -> None:
        if id(fn) in self.seen:
            return
        self.seen.add(id(fn))
        where = _where(fn)
        for code in _code_objects(fn.__code__):
            # co_names mixes global names with attribute names (nisa.activation): only the
            # names the code loads as globals are looked up in the module
            global_names, attributes = [], []
            for ins in dis.get_instructions(code):
                if ins.opname in _GLOBAL_WRITES:
                    raise KernelRuleError(
                        f"{where} assigns the module global {ins.argval!r}: NKI kernels must be pure "
                        "functions of their arguments (NKI language guide, 'Kernel Caching')")
                if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                    global_names.append(ins.argval)
                elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                    attributes.append(ins.argval)
            for name in dict.fromkeys(global_names):
                value = fn.__globals__.get(name, _MISSING)
                if value is not _MISSING:
                    self.value(value, where, attributes)
        for cell in fn.__closure__ or ():
            try:
                self.value(cell.cell_contents, where, fn.__code__.co_names)
            except ValueError:  # an empty cell (a name assigned later in the enclosing scope)
                continue

    def value(self, value, used_by: str, names) -> None:
        if _is_jitted(value):
            # a nested jitted kernel is inlined (module docstring): its code obeys the rules
            if value.fn is not self.root and isinstance(value.fn, types.FunctionType):
                self.function(value.fn, used_by)
            return
        if isinstance(value, types.ModuleType):
            if value.__name__.split(".")[0] == "neuronxcc":
                raise KernelRuleError(
                    f"{used_by} uses the module {value.__name__}: the neuronxcc.nki namespace is a "
                    "compilation error since NKI 0.4.0; import nki, nki.language and nki.isa")
            if _is_user(value, self.home):       # a sibling kernel module: what the code takes from it
                for name in names:
                    attr = getattr(value, name, _MISSING)
                    if attr is not _MISSING and not isinstance(attr, types.ModuleType):
                        self.value(attr, used_by, names)
            return
        if isinstance(value, type):
            if _is_user(value, self.home) and id(value) not in self.seen:
                self.seen.add(id(value))
                check_class(value, used_by)
                for klass in value.__mro__:
                    if _is_user(klass, self.home):
                        for member in vars(klass).values():
                            self._member(member, used_by)
            return
        if isinstance(value, types.FunctionType) and _is_user(value, self.home):
            self.function(value, used_by)

    def _member(self, member, used_by: str) -> None:
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property):
            for part in (member.fget, member.fset, member.fdel):
                if isinstance(part, types.FunctionType):
                    self.value(part, used_by, ())
            return
        if isinstance(member, types.FunctionType):
            self.value(member, used_by, ())


_checked: set = set()
_checked_lock = threading.Lock()


def check_function(fn) -> None:
    """The static rules (classes, helpers, imports, purity) for kernel function ``fn`` and
    everything it uses; each function is walked once per process."""
    key = (fn, getattr(fn, "__code__", None))
    with _checked_lock:
        if key in _checked:
            return
    if isinstance(fn, types.FunctionType):
        _Walk(fn).function(fn, _where(fn))
    with _checked_lock:
        _checked.add(key)


def check_arguments(fn, args, kwargs) -> None:
    """Argument objects of user classes must be NKI objects: NKI converts an argument
    instance "using the objects dictionary" of its class (language guide, 'Class Support')."""
    for value in (*args, *kwargs.values()):
        for item in (value if isinstance(value, (tuple, list)) else (value,)):
            cls = type(item)
            if isinstance(item, _PLAIN) or isinstance(item, type):
                continue
            module = _module_name(cls)
            top = module.split(".")[0]
            if (not module or module == "builtins" or top in sys.stdlib_module_names
                    or top in ("torch", "numpy") or module.startswith(_SIMULATOR_PACKAGE)):
                continue
            check_class(cls, f"an argument of {_where(fn)}")


def check_kernel(fn, args=(), kwargs=None) -> None:
    """Every rule for one run of kernel function ``fn`` with ``args``/``kwargs``."""
    check_function(fn)
    check_arguments(fn, args, kwargs or {})

"""Argument validation shared by the ops. Every error names the argument, the value and the limit."""

from __future__ import annotations

import numbers
import operator
from typing import Iterable

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The largest finite float32: the kernels take eps and scale as fp32 values, so a Python
# float beyond it would be infinite there.
FP32_MAX = float(torch.finfo(torch.float32).max)


def check_float_tensor(name: str, tensor: object, dtypes: Iterable[torch.dtype] = FLOAT_DTYPES) -> None:
    """Raise TypeError unless ``tensor`` is a dense torch.Tensor of one of ``dtypes``."""
    dtypes = tuple(dtypes)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    check_dense(name, tensor)
    if tensor.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} has dtype {_dtype_name(tensor)}; supported: {allowed}")


def check_dense(name: str, tensor: torch.Tensor) -> None:
    """Raise TypeError unless ``tensor`` has torch's dense layout (``torch.strided``): the
    kernels read memory by strides; a sparse or nested tensor failed inside the simulator
    with an error naming no argument."""
    if tensor.is_nested:
        raise TypeError(f"{name} is a nested tensor; the kernels take dense tensors (torch.strided), "
                        f"e.g. {name}.to_padded_tensor(0.0) or one call per component")
    if tensor.layout != torch.strided:
        raise TypeError(f"{name} has layout {tensor.layout}; the kernels take dense tensors (torch.strided), "
                        f"e.g. {name}.to_dense()")


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _first_mismatch(tensors: dict, key):
    """(name, tensor, first name, first tensor) of the first non-None tensor whose ``key``
    differs from the first non-None tensor's, or None."""
    items = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if key(t) != key(first):
            return name, t, first_name, first
    return None


def check_same_dtype(**tensors: torch.Tensor) -> None:
    """Raise TypeError if the named tensors do not all share one dtype."""
    bad = _first_mismatch(tensors, lambda t: t.dtype)
    if bad:
        name, t, first_name, first = bad
        raise TypeError(f"{name} has dtype {_dtype_name(t)} but {first_name} has {_dtype_name(first)}; "
                        "mixed dtypes are not supported")


def check_same_device(**tensors: torch.Tensor) -> None:
    """Raise RuntimeError if the named tensors are not all on one device."""
    bad = _first_mismatch(tensors, lambda t: t.device)
    if bad:
        name, t, first_name, first = bad
        raise RuntimeError(f"{name} is on {t.device} but {first_name} is on {first.device}; "
                           "all tensors must be on the same device")


def check_choice(name: str, value: object, choices: tuple) -> None:
    """Raise ValueError unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; expected one of {choices}")


def check_real(name: str, value: object, what: str = "a float") -> float:
    """``value`` as a Python float: any real number, numpy scalars too (torch takes them);
    a bool is refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {what}, got {value!r} ({type(value).__qualname__})")
    return float(value)


def check_index(name: str, value: object) -> int:
    """``value`` as a Python int: an int or anything with ``__index__`` (numpy integers, as
    torch takes them); a bool or a float is refused."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__qualname__})")


def check_bool(name: str, value: object) -> bool:
    """``value`` when it is a Python bool (as torch's flags require); anything else, numpy's
    bool_ included, is refused with its value and type."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a Python bool, got {value!r} ({type(value).__module__}."
                        f"{type(value).__qualname__})")
    return value

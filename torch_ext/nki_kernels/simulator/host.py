"""Host arrays in and out of a simulated run: numpy arrays and CPU torch tensors become HBM
tensors named after the kernel's parameters; the HBM tensors a kernel returns go back as the
caller's array type; inputs the kernel wrote are copied back into the caller's arrays.

numpy is imported lazily, only when a caller passes numpy arrays.
"""

from __future__ import annotations

import torch

from . import dtypes as _dt
from .errors import NkiValidationError
from .memory import MemoryRegion
from .tensor import NkiTensor
from .tensor_alloc import from_torch


def numpy_to_torch(a) -> torch.Tensor:
    """A torch copy of numpy array ``a`` (ml_dtypes bf16/fp8 arrays as float32)."""
    import numpy as np  # lazy: the caller passed numpy data

    a = np.ascontiguousarray(a)
    if a.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3"):  # ml_dtypes
        a = a.astype(np.float32)
    return torch.from_numpy(a.copy())


def _is_numpy(x) -> bool:
    return type(x).__module__ == "numpy" and hasattr(x, "dtype") and hasattr(x, "shape")


def _input_dtype(dtype, name):
    try:
        return _dt.to_nki(dtype)
    except TypeError as err:
        raise TypeError(f"argument {name}: {err}") from None


class Inputs:
    """The host arrays of one call, wrapped as HBM tensors (``wrap``), and what to hand back."""

    def __init__(self):
        self.kind = None   # "torch" | "numpy": the array type outputs are returned as
        self.pairs = []    # (caller's array, NkiTensor)

    def wrap(self, x, name, region):
        if isinstance(x, torch.Tensor):
            if x.device.type != "cpu":
                raise TypeError(f"argument {name}: the simulator takes CPU tensors, got {x.device}")
            self.kind = self.kind or "torch"
            dt = _input_dtype(x.dtype, name)
            if x.dtype == torch.float32 and x.is_contiguous() and not x.is_inference():
                # zero-copy: the HBM tensor IS the caller's fp32 tensor (in-place semantics);
                # not an inference tensor, which the run cannot write in place (its modes:
                # interpreter._plain_torch_modes), so that one is copied and copied back
                t = from_torch(x.detach(), dt, region, name, alias=True)
            else:
                t = from_torch(x.detach(), dt, region, name)
            self.pairs.append((x, t))
            return t
        if _is_numpy(x):
            self.kind = self.kind or "numpy"
            t = from_torch(numpy_to_torch(x), _input_dtype(x.dtype, name), region, name)
            self.pairs.append((x, t))
            return t
        if isinstance(x, (list, tuple)) and any(
                isinstance(e, torch.Tensor) or _is_numpy(e) for e in x):
            return type(x)(self.wrap(e, f"{name}[{i}]", region) for i, e in enumerate(x))
        return x

    def outputs(self, result):
        """The kernel's return value with its HBM tensors as the callers' array type."""
        inputs = {id(t._alloc) for _, t in self.pairs}
        return _convert(result, self.kind or "torch", inputs)

    def copy_back(self) -> None:
        """Update the caller's arrays the kernel wrote (aliased fp32 tensors already are)."""
        for orig, t in self.pairs:
            if t._alloc.written and not (isinstance(orig, torch.Tensor)
                                         and orig.data_ptr() == t._alloc.base.data_ptr()):
                if isinstance(orig, torch.Tensor):
                    # an inference tensor can be written in place only in inference mode
                    with torch.no_grad(), torch.inference_mode(orig.is_inference()):
                        orig.copy_(_to_torch(t).to(orig.dtype))
                else:
                    orig[...] = _to_numpy(t).astype(orig.dtype)


def _to_torch(t: NkiTensor) -> torch.Tensor:
    # After the run nothing writes the simulator's storage again: outputs whose bits torch
    # holds natively (fp32, bf16, fp16, fp8, integers) are returned without a copy (a fresh
    # HBM allocation, or the caller's own aliased input); packed MX words as their uint words.
    d = t._data
    dt = t.dtype
    if dt.is_bool:
        return d != 0
    if dt.is_packed or d.dtype == dt.torch_dtype:
        return d
    return dt.from_bits(d).to(_dt.torch_output_dtype(dt))


def _to_numpy(t: NkiTensor):
    d = t._data
    dt = t.dtype
    if dt.is_packed:
        return d.numpy()
    if dt.is_float:
        return dt.from_bits(d).to(torch.float32).numpy().astype(_dt.numpy_output_dtype(dt))
    return dt.from_bits(d).numpy().astype(_dt.numpy_output_dtype(dt))


def _convert(result, kind, inputs, index=0):
    """``result`` with its tensors as ``kind`` arrays. A returned tensor the kernel allocated
    must be in nl.shared_hbm: "All kernel output (return) tensors must be allocated with
    buffer=nl.shared_hbm. Using nl.hbm for output tensors will cause compilation failures"
    (aws-neuron-sdk nki/migration/index.rst, NKI 0.3). A returned input (ids in ``inputs``)
    stays where the caller put it."""
    if isinstance(result, NkiTensor):
        if result.on_chip:
            raise NkiValidationError(
                f"kernel output {index} is in {result.buffer.value}; kernel outputs must be "
                "HBM tensors (nl.ndarray(..., buffer=nl.shared_hbm)) written with nl.store / "
                "nisa.dma_copy")
        if result.buffer is not MemoryRegion.shared_hbm and id(result._alloc) not in inputs:
            raise NkiValidationError(
                f"kernel output {index} is in {result.buffer.value}; a tensor a kernel returns "
                "must be allocated with buffer=nl.shared_hbm (NKI 0.3 migration guide: nl.hbm "
                "outputs fail to compile)")
        return _to_numpy(result) if kind == "numpy" else _to_torch(result)
    if isinstance(result, (tuple, list)):
        return tuple(_convert(r, kind, inputs, i) for i, r in enumerate(result))
    if isinstance(result, dict):
        return {k: _convert(v, kind, inputs, k) for k, v in result.items()}
    return result

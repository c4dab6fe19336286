"""The small ``nki`` modules beside ``nki.language`` and ``nki.isa``: ``nki.isa.constants``
(which enums it holds), ``nki.typing`` (tensor annotations) and ``nki.compiler`` (compile
options). modules.py builds the module objects.

* ``nki.isa.constants``: the ``nki.isa`` configuration enums under a module of their own, as
  nki-library imports them (``from nki.isa.constants import dge_mode, oob_mode``).
* ``nki.typing``: ``tensor``, ``mutable_tensor``, ``scalar`` annotation markers ("the
  nki.typing module for declaring expected tensor shapes", NKI 0.3.0 release notes);
  subscriptable (``nt.tensor[[128, 512], nl.float32]``); the simulator does not check them.
* ``nki.compiler``: ``CompileConfig`` (address_rotation, barrier_check, dead_code_elim,
  nki_alloc_fallback, non_ssa_legalization, prefetch_auto), ``SpecializationConfig``
  (allow_nested_config_override) and ``AddressRotation`` (AUTO, ENABLE, DISABLE), the
  objects ``nki.jit(compile_config=..., specialization_config=...)`` takes (Neuron 2.33
  nki.compiler reference). They steer the compiler only: accepted and ignored here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

ISA_CONSTANTS = ("engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode",
                 "nc_version", "dma_engine")


class _Annotation:
    """A type annotation marker: ``nt.tensor`` or ``nt.tensor[shape, dtype]``."""

    def __class_getitem__(cls, item):
        return cls


class tensor(_Annotation):  # noqa: N801 (NKI name)
    """A kernel tensor argument (nki.typing)."""


class mutable_tensor(_Annotation):  # noqa: N801
    """A kernel tensor argument the kernel writes (nki.typing)."""


class scalar(_Annotation):  # noqa: N801
    """A kernel scalar argument (nki.typing)."""


class AddressRotation(Enum):
    """Whether the backend may rotate a memloc's address (nki.compiler.AddressRotation)."""

    AUTO = "auto"
    ENABLE = "enable"
    DISABLE = "disable"


@dataclass
class CompileConfig:
    """Per-kernel compiler options (nki.compiler.CompileConfig); ignored by the simulator.
    Defaults the docs state: address rotation AUTO, nki_alloc_fallback "On by default",
    prefetch_auto "Off by default"; None leaves the others to the compiler."""

    address_rotation: AddressRotation = AddressRotation.AUTO
    barrier_check: bool | None = None
    dead_code_elim: bool | None = None
    nki_alloc_fallback: bool = True
    non_ssa_legalization: bool | None = None
    prefetch_auto: bool = False


@dataclass
class SpecializationConfig:
    """Per-kernel specialization options (nki.compiler.SpecializationConfig); ignored."""

    allow_nested_config_override: bool | None = None

"""The ``nki.isa`` enums (beta-2 names and values) and the NeuronCore version queries.

Instruction modules import this module as ``enums`` and never the enum names themselves:
instruction parameters are named like the enums (``engine=``, ``reduce_cmd=``, ...).
"""

from __future__ import annotations

from enum import Enum

from ..context import current


class engine(Enum):  # noqa: N801  (beta-2 name)
    """Neuron Device engines."""

    tensor = 1
    vector = 5
    scalar = 2
    gpsimd = 3
    dma = 4
    sync = 6
    unknown = 0


class reduce_cmd(Enum):  # noqa: N801
    """Engine accumulator-register commands."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(Enum):  # noqa: N801
    """DMA descriptor generation mode (accepted, not modelled)."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(Enum):  # noqa: N801
    """Out-of-bounds handling of indirect DMA (accepted, not modelled)."""

    error = 0
    skip = 1


class matmul_perf_mode(Enum):  # noqa: N801
    none = "none"
    double_row = "double_row"


class nc_version(Enum):  # noqa: N801
    """NeuronCore version; the value is the generation number (hardware.Target.generation).

    Members order by generation and compare with ints, as nki-library's kernels compare them
    (``get_nc_version() >= nc_version.gen3``, ``get_nc_version() >= 3``): the docs give the
    values (gen2 = 2 "Trn1/Inf2", gen3 = 3 "Trn2", gen4 = 4 "Trn3") and NKI 0.7 runs
    kernels with "standard Python semantics" (Neuron 2.33 release notes)."""

    gen2 = 2
    gen3 = 3
    gen4 = 4

    def _cmp(self, other):
        if isinstance(other, nc_version):
            return other.value
        if isinstance(other, int) and not isinstance(other, bool):
            return other
        return NotImplemented

    def __lt__(self, other):
        o = self._cmp(other)
        return o if o is NotImplemented else self.value < o

    def __le__(self, other):
        o = self._cmp(other)
        return o if o is NotImplemented else self.value <= o

    def __gt__(self, other):
        o = self._cmp(other)
        return o if o is NotImplemented else self.value > o

    def __ge__(self, other):
        o = self._cmp(other)
        return o if o is NotImplemented else self.value >= o

    def __eq__(self, other):
        o = self._cmp(other)
        return o if o is NotImplemented else self.value == o

    def __hash__(self):
        return hash(self.value)

    def __int__(self):
        return self.value

    __index__ = __int__


class dma_engine(Enum):  # noqa: N801
    dma = 1
    gpsimd_dma = 2


tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown

# Trace engine name of each engine an instruction may run on (sync instructions are
# issued by the DMA queues).
ENGINE_NAME = {engine.tensor: "tensor", engine.vector: "vector", engine.scalar: "scalar",
               engine.gpsimd: "gpsimd", engine.dma: "dma", engine.sync: "dma"}


def get_nc_version() -> nc_version:
    """The NeuronCore version of the active target."""
    return nc_version(current().target.generation)


def get_nc_sub_version() -> int:
    return 0

"""``nki.isa`` (beta 2): one function per instruction, destination first, split by engine.

* enums.py          engine, reduce_cmd, dge_mode, oob_mode, matmul_perf_mode, nc_version,
                    dma_engine; get_nc_version
* operands.py       the checks, reads, writes and trace recording every instruction shares
* dma.py            dma_copy, dma_transpose, dma_compute
* tensor_engine.py  nc_matmul, nc_transpose
* alu.py            the ALU instructions Vector, Scalar and GpSimd share (tensor_copy, memset,
                    tensor_tensor, tensor_scalar, scalar_tensor_tensor, tensor_reduce)
* vector_engine.py  VectorE-only instructions (selects, accumulator reductions, scans,
                    bn_stats/bn_aggr, max8 family, shuffle, random numbers)
* scalar_engine.py  activation, activation_reduce
* gpsimd.py         iota, affine_select, nc_n_gather, tensor_partition_reduce, local_gather,
                    nonzero_with_count
* sync.py           sendrecv, core_barrier (between the cores of an LNC=2 launch)
* registers.py      VirtualRegister and register_* instructions
* unsupported.py    names the simulator does not model (raise UnsupportedError)

Each instruction validates the hardware rules of the active target (messages name the
instruction, the operand and the limit), computes in fp32 on whole tiles, rounds ONCE into
the destination dtype, records one trace ``Instruction`` and returns an ``NkiInstruction``.
"""

from __future__ import annotations

from .. import tensor as _tensor
from ..errors import NkiValidationError, UnsupportedError
from .alu import memset, scalar_tensor_tensor, tensor_copy, tensor_reduce, tensor_scalar, tensor_tensor
from .dma import dma_compute, dma_copy, dma_transpose
from .enums import (dge_mode, dma_engine, engine, get_nc_sub_version, get_nc_version,
                    matmul_perf_mode, nc_version, oob_mode, reduce_cmd, unknown_engine)
from .gpsimd import (affine_select, iota, local_gather, nc_n_gather, nonzero_with_count,
                     sequence_bounds, tensor_partition_reduce)
from .operands import NkiInstruction, is_scalar
from .registers import (VirtualRegister, register_alloc, register_load, register_move,
                        register_store)
from .scalar_engine import activation, activation_reduce
from .tensor_engine import nc_matmul, nc_matmul_mx, nc_transpose
from .unsupported import NAMES as _UNSUPPORTED
from .sync import core_barrier, sendrecv
from .unsupported import activate2, rand2, rand_get_state, rand_set_state, topk
from .vector_engine import (bn_aggr, bn_stats, dropout, exponential, max8, nc_find_index8,
                            nc_match_replace8,
                            nc_stream_shuffle, quantize_mx, range_select, reciprocal, rng,
                            select_reduce,
                            set_rng_seed, tensor_copy_predicated, tensor_scalar_cumulative,
                            tensor_scalar_reduce, tensor_tensor_scan)

__all__ = [
    "engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "nc_version",
    "dma_engine", "NkiInstruction", "NkiValidationError", "VirtualRegister",
    "tensor_engine", "vector_engine", "scalar_engine", "gpsimd_engine", "unknown_engine",
    "get_nc_version", "get_nc_sub_version",
    "dma_copy", "dma_transpose", "dma_compute", "tensor_copy", "tensor_copy_predicated", "memset",
    "nc_matmul", "nc_matmul_mx", "quantize_mx", "nc_transpose", "tensor_tensor", "tensor_scalar", "scalar_tensor_tensor",
    "tensor_reduce", "tensor_partition_reduce", "tensor_scalar_reduce", "tensor_scalar_cumulative",
    "tensor_tensor_scan", "activation", "activation_reduce", "iota", "affine_select",
    "select_reduce", "range_select", "reciprocal", "bn_stats", "bn_aggr", "nc_n_gather",
    "local_gather", "nonzero_with_count", "sequence_bounds", "exponential", "max8", "nc_find_index8", "nc_match_replace8", "nc_stream_shuffle", "dropout", "rng",
    "set_rng_seed", "core_barrier", "sendrecv", "register_alloc", "register_move", "register_load",
    "register_store", *_UNSUPPORTED,
]


# Importing the engine modules (isa/tensor_engine.py, ...) binds their names on this package;
# the beta-2 names are the engine constants (nisa.scalar_engine == nisa.engine.scalar).
tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd


def _assign(dst, value) -> None:
    """``t[idx] = value``: a tile is copied (tensor_copy on chip, dma_copy when HBM is
    involved), a scalar fills (memset)."""
    if isinstance(value, _tensor.NkiTensor):
        if dst.on_chip and value.on_chip:
            tensor_copy(dst, value)
        else:
            dma_copy(dst, value)
    elif isinstance(value, (int, float, bool)) or is_scalar(value):
        if not dst.on_chip:
            raise NkiValidationError(
                "memset: dst is in HBM; fill an SBUF tile and dma_copy it to HBM")
        memset(dst, value)
    else:
        raise UnsupportedError(
            f"cannot assign {type(value).__name__} to an NKI tensor; assign a tile or a scalar")


# tensor.py sits below this package (the instructions take its tensors), so it cannot import
# the instructions its item assignment lowers to: they are installed here.
_tensor.install_assignment(_assign)

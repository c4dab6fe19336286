"""``nki.collectives``: collectives between ranks (NeuronCores or devices in a replica
group). The simulator runs one logical core, so there is no other rank to talk to: the
functions exist with their documented signatures and raise ``UnsupportedError``.
``ReplicaGroup`` is a plain NKI class (it can be built and passed to kernels).
"""

from __future__ import annotations

import enum
import numbers

from .errors import UnsupportedError
from .language.constants import NKIObject


class rg_partition_op(enum.Enum):
    """How ``ReplicaGroup.from_partition_op`` maps a rank to its rank-list id,
    ``op(rank, operand)``. The members the v2.33 ``ReplicaGroup`` page shows in its examples
    (bitwise_and with 0: one rank-list; div: contiguous; mod: strided); the page lists no
    others, so none are made up."""

    bitwise_and = "bitwise_and"
    div = "div"
    mod = "mod"


_RANK_LIST_ID = {
    rg_partition_op.bitwise_and: lambda rank, operand: rank & operand,
    rg_partition_op.div: lambda rank, operand: rank // operand,
    rg_partition_op.mod: lambda rank, operand: rank % operand,
}


def _count(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"ReplicaGroup.from_partition_op: {name}={value!r} must be an integer >= {minimum}")
    return int(value)


class ReplicaGroup(NKIObject):
    """The set of ranks a collective runs on, as a list of rank-lists (``replica_groups``);
    "Each rank in the replica-group must participate in only one rank-list" (v2.33
    ``nki.collectives.ReplicaGroup``)."""

    replica_groups = None

    @staticmethod
    def from_partition_op(world_size: int, op: rg_partition_op, operand: int) -> "ReplicaGroup":
        """Ranks ``[0, world_size)`` split into rank-lists: ranks with the same
        ``op(rank, operand)`` form one, in increasing id (v2.33: ``div, 4`` over 8 ranks gives
        ``[[0, 1, 2, 3], [4, 5, 6, 7]]``, ``mod, 4`` gives ``[[0, 4], [1, 5], [2, 6], [3, 7]]``)."""
        world_size = _count("world_size", world_size, 1)
        if not isinstance(op, rg_partition_op):
            raise ValueError(f"ReplicaGroup.from_partition_op: op={op!r} must be an rg_partition_op "
                             f"({', '.join('rg_partition_op.' + m.name for m in rg_partition_op)})")
        operand = _count("operand", operand, 1 if op is not rg_partition_op.bitwise_and else 0)
        lists: dict[int, list[int]] = {}
        for rank in range(world_size):
            lists.setdefault(_RANK_LIST_ID[op](rank, operand), []).append(rank)
        return ReplicaGroup([lists[k] for k in sorted(lists)])


def _unsupported(name):
    def fn(*args, **kwargs):
        raise UnsupportedError(
            f"nki.collectives.{name}: collectives between ranks are not simulated (the "
            "simulator runs one logical core; between its two cores use nisa.sendrecv / "
            "nisa.core_barrier)")
    fn.__name__ = fn.__qualname__ = name
    return fn


_NAMES = ("all_reduce", "all_gather", "all_gather_v", "reduce_scatter", "all_to_all",
          "all_to_all_v", "collective_permute", "collective_permute_implicit",
          "collective_permute_implicit_reduce",
          "collective_permute_implicit_current_processing_rank_id", "rank_id")
for _n in _NAMES:
    globals()[_n] = _unsupported(_n)

__all__ = ["ReplicaGroup", "rg_partition_op", *_NAMES]

"""``nki.collectives``: collectives between ranks (NeuronCores or devices in a replica
group). The simulator runs one logical core, so there is no other rank to talk to: the
functions exist with their documented signatures and raise ``UnsupportedError``.
``ReplicaGroup`` is a plain NKI class (it can be built and passed to kernels).
"""

from __future__ import annotations

from .errors import UnsupportedError
from .language.constants import NKIObject


class ReplicaGroup(NKIObject):
    """Groups of ranks that take part in a collective (``replica_groups``: lists of ranks;
    "Sub-groups represented by lists of ranks should not have any overlap")."""

    replica_groups = None


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

__all__ = ["ReplicaGroup", *_NAMES]

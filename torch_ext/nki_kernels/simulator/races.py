"""Races between the cores of an LNC=2 launch on shared HBM tensors.

Both physical cores of a logical core see the same HBM; AWS documents how they may share a
tensor: "two NeuronCores both need to write to disjoint portions of a shared HBM tensor
(data) and they both need to consume the tensor after both cores have finished writing into
the tensor ... they both can perform the write ... and then signal to each other ... using
nisa.core_barrier" (nki.isa.core_barrier, Neuron 2.33). So, within one launch:

* both cores writing the same bytes of a shared HBM tensor is a race, unless the writes
  are ordered by a synchronisation between the cores (a core_barrier both pass, or a
  sendrecv from the first writer to the second);
* one core reading bytes the other core writes is a race unless the write and the read are
  ordered that way.

Ordering is tracked with the synchronisation epochs of isa/sync.py: every core counts the
synchronisations it has completed; an access of core A at A's epoch ``ea`` happens before
an access of core B at B's epoch ``eb`` when some synchronisation between them was entered
by A after ``ea`` and left by B before ``eb`` (``RaceTracker.ordered``). The accesses are
checked when the run ends; ``RaceError`` names the tensor, the byte range and the cores.
HBM reads and writes of kernel inputs and outputs are all tracked (by byte ranges of the
views the DMA instructions touch).
"""

from __future__ import annotations

from .errors import RaceError


class RaceTracker:
    """Shared-HBM accesses of the cores of one LNC=2 run, and the synchronisations between
    them."""

    def __init__(self, run):
        self.run = run
        self.accesses: list[tuple] = []  # (core, epoch, instruction, kind, alloc, lo, hi)
        self.epoch = [0] * run.grid      # synchronisations completed, per core
        # (cores, {core: epoch it entered the synchronisation at}) recorded by isa/sync.py
        self.syncs: list[tuple] = []

    def record(self, core, idx, op, reads, writes) -> None:
        for kind, pairs in (("read", reads), ("write", writes)):
            for _, t in pairs:
                a = getattr(t, "_alloc", None)
                if a is None or a.kind != "hbm":
                    continue
                lo, hi = _byte_range(t)
                self.accesses.append((core, self.epoch[core], idx, kind, a, lo, hi))

    def synchronised(self, cores) -> None:
        """Cores ``cores`` completed a barrier together: what each did before it happens
        before what any of them does after it."""
        entered = {c: self.epoch[c] for c in cores}
        for c in cores:
            self.epoch[c] += 1
        self.syncs.append((tuple(cores), entered))

    def sent(self, sender) -> int:
        """``sender`` sends a message; returns the epoch its earlier accesses belong to."""
        e = self.epoch[sender]
        self.epoch[sender] += 1
        return e

    def received(self, sender, send_epoch, receiver) -> None:
        """``receiver`` got the message ``sender`` sent at ``send_epoch``: the sender's
        accesses before the send happen before the receiver's after the receipt."""
        self.syncs.append(((sender, receiver), {sender: send_epoch,
                                                receiver: self.epoch[receiver]}))
        self.epoch[receiver] += 1

    def ordered(self, a_core, a_epoch, b_core, b_epoch) -> bool:
        """Does an access of ``a_core`` at epoch ``a_epoch`` happen before one of ``b_core``
        at ``b_epoch`` (a synchronisation a_core entered after the first access and b_core
        left before the second)?"""
        for cores, entered in self.syncs:
            if a_core in entered and b_core in entered and entered[a_core] >= a_epoch \
                    and entered[b_core] < b_epoch:
                return True
        return False

    def check(self, describe) -> None:
        """Raise ``RaceError`` for the first unordered pair of accesses of different cores to
        overlapping bytes of one shared tensor, at least one of them a write."""
        by_alloc: dict[int, list] = {}
        for acc in self.accesses:
            by_alloc.setdefault(acc[4].alloc_id, []).append(acc)
        found = []
        for accs in by_alloc.values():
            if not any(a[3] == "write" for a in accs) or len({a[0] for a in accs}) < 2:
                continue
            accs.sort(key=lambda a: a[5])
            for i, x in enumerate(accs):
                for y in accs[i + 1:]:
                    if y[5] >= x[6]:
                        break
                    if x[0] == y[0] or (x[3] == "read" and y[3] == "read"):
                        continue
                    if self.ordered(x[0], x[1], y[0], y[1]) or \
                            self.ordered(y[0], y[1], x[0], x[1]):
                        continue
                    found.append((x, y) if x[3] == "write" else (y, x))
                    break
        if found:
            w, o = min(found, key=lambda p: max(p[0][2], p[1][2]))
            raise RaceError(_message(w, o, describe))


def _byte_range(t) -> tuple[int, int]:
    """Bytes [lo, hi) of the allocation a view may touch (its hull)."""
    a = t._alloc
    if type(t).__name__ != "NkiTensor":  # data-dependent view: the whole tensor
        return 0, a.base.numel() * a.base.element_size()
    d = t._data
    es = d.element_size()
    lo = d.storage_offset() * es - a.base_byte_offset
    span = sum((s - 1) * st for s, st in zip(d.shape, d.stride()) if st > 0)
    return lo, lo + (span + 1) * es


def _message(w, o, describe) -> str:
    a = w[4]
    lo, hi = max(w[5], o[5]), min(w[6], o[6])
    what = "both write" if o[3] == "write" else f"core {o[0]} reads what core {w[0]} writes"
    return (f"LNC race on shared HBM tensor {a.name or '(unnamed)'} {a.shape} {a.dtype.name}, "
            f"bytes {lo}..{hi - 1}: {what} with no core_barrier or sendrecv between them "
            f"(core {w[0]} {w[3]} at instruction {describe(w[2])}, core {o[0]} {o[3]} at "
            f"instruction {describe(o[2])})")

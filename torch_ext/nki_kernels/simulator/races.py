"""Races between the cores of an LNC=2 launch on shared HBM tensors.

Both physical cores of a logical core see the same HBM; AWS documents how they may share a
tensor: "two NeuronCores both need to write to disjoint portions of a shared HBM tensor
(data) and they both need to consume the tensor after both cores have finished writing into
the tensor ... they both can perform the write ... and then signal to each other ... using
nisa.core_barrier" (nki.isa.core_barrier). What the check reports (``RaceError``, naming the
tensor, the byte range and the cores), for two accesses of different cores to the same
bytes with no synchronisation ordering them:

* a write and a read, when the write changes those bytes: what the reader sees depends on
  which core gets there first;
* two writes, when they leave different bits as each core's last write to those bytes:
  the final contents depend on which core writes last. A write that its own core writes
  over later is not compared (only the last write of each core can be final; what the
  other core might read in between is the read rule's), so two cores that both zero a
  tensor and then both scatter the same values into it (AWS's router_topk at LNC=2) give
  the same memory in any order.

Two cores writing the SAME bits to the same bytes (AWS's cumsum and rope kernels at LNC=2
both compute and store the whole output) give the same memory in either order: that is not
reported. Ordering comes from the synchronisations of isa/sync.py: each core counts the
synchronisations it has completed (its epoch); an access of core A at epoch ``ea`` happens
before an access of core B at ``eb`` when some synchronisation that A entered at an epoch
>= ``ea`` was left by B at an epoch < ``eb`` (a core_barrier both passed, or a sendrecv
message from A that B received). Accesses are recorded at every instruction touching a
shared HBM tensor (exact element positions, also through dynamic access patterns) and
checked when the run ends.
"""

from __future__ import annotations

import torch

from .errors import RaceError


class RaceTracker:
    """Shared-HBM accesses of the cores of one LNC=2 run, and their synchronisations."""

    def __init__(self, run):
        self.run = run
        # (core, epoch, instruction, "read"|"write", allocation, lo, hi, where, changed,
        #  written: the bits a write left, in its elements' order; None for a read)
        self.accesses: list[tuple] = []
        self.epoch = [0] * run.grid      # synchronisations completed, per core
        self.syncs: list[tuple] = []     # (cores, {core: epoch it entered at})
        self._changed: dict[int, torch.Tensor] = {}  # id(view) -> changed mask of its store
        self._written: dict[int, torch.Tensor] = {}  # id(view) -> the bits its store wrote

    # ------------------------------------------------------------------ writes
    def before_store(self, dst) -> torch.Tensor | None:
        """The bits ``dst`` holds before a store (HBM views only)."""
        if dst._alloc.kind != "hbm" or type(dst).__name__ != "NkiTensor":
            return None
        return dst._data.clone()

    def after_store(self, view, dst, old) -> None:
        """Remember which elements of ``view``, the destination the instruction names (the
        operand the trace records), the store changed (bit for bit). ``dst`` is what was
        written: ``view`` itself, or its reduction to one element per address (a step-0
        view: each repeated address holds its last write), broadcast back to ``view``."""
        if old is None:
            return
        new, shape = dst._data, tuple(view._data.shape)
        self._changed[id(view)] = (_bits(new) != _bits(old)).expand(shape)
        self._written[id(view)] = _bits(new).clone().expand(shape)

    def after_store_indirect(self, dst, old, new) -> None:
        """The same for a store through a run-time access pattern (elements in the view's
        order; the ones it did not write compare equal)."""
        self._changed[id(dst)] = _bits(new) != _bits(old)
        self._written[id(dst)] = _bits(new).clone()

    # ------------------------------------------------------------------ recording
    def record(self, core, idx, op, reads, writes) -> None:
        for kind, pairs in (("read", reads), ("write", writes)):
            for _, t in pairs:
                a = getattr(t, "_alloc", None)
                if a is None or a.kind != "hbm":
                    continue
                where, keep = _where(t)
                changed = self._changed.pop(id(t), None) if kind == "write" else None
                written = self._written.pop(id(t), None) if kind == "write" else None
                if changed is not None and keep is not None:
                    changed = changed[keep]
                if written is not None and keep is not None:
                    written = written[keep]
                changed = _compact(changed)
                lo, hi = _hull(where)
                if hi <= lo:
                    continue
                self.accesses.append((core, self.epoch[core], idx, kind, a, lo, hi, where,
                                      changed, written))

    # ------------------------------------------------------------------ synchronisation
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
        """Does an access of ``a_core`` at ``a_epoch`` happen before one of ``b_core`` at
        ``b_epoch``?"""
        for _, entered in self.syncs:
            if a_core in entered and b_core in entered and entered[a_core] >= a_epoch \
                    and entered[b_core] < b_epoch:
                return True
        return False

    # ------------------------------------------------------------------ the check
    def check(self, describe) -> None:
        """Raise ``RaceError`` for the earliest racing pair (see the module docstring)."""
        by_alloc: dict[int, list] = {}
        for acc in self.accesses:
            by_alloc.setdefault(acc[4].alloc_id, []).append(acc)
        found = []
        for accs in by_alloc.values():
            if not any(a[3] == "write" for a in accs) or len({a[0] for a in accs}) < 2:
                continue
            if _cores_touch_disjoint_bytes(accs):
                continue  # no byte one core writes is touched by another: nothing to order
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
                    hit = _conflict(x, y, accs)
                    if hit is not None:
                        found.append(hit)
        if found:
            w, o, lo, hi = min(found, key=lambda f: max(f[0][2], f[1][2]))
            raise RaceError(_message(w, o, lo, hi, describe))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bits of ``t`` as integers (so NaN payloads compare exactly)."""
    size = t.element_size()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    return t.contiguous().view(ints) if t.dtype != ints else t


def _where(t):
    """What a view touches, and which of its elements (None: all): ("strided", byte offset,
    element size, shape, strides) of a plain view, or ("bytes", start offsets, element
    size) of a data-dependent one (byte offsets from the allocation's first byte)."""
    a = t._alloc
    if type(t).__name__ == "NkiTensor":
        d = t._data
        es = d.element_size()
        return ("strided", d.storage_offset() * es - a.base_byte_offset, es, tuple(d.shape),
                tuple(d.stride())), None
    if type(t).__name__ == "IndirectView":
        starts, row_ok, shape, strides = t.rows()
        es = t.dtype.itemsize
        # rows of the view written/read: per partition for a vector offset, all or none
        keep = row_ok if t._vector is not None else row_ok[0].expand(t.shape[0])
        return ("rows", starts[row_ok] * es, es, tuple(shape), tuple(strides)), keep
    n = a.base.numel() * a.base.element_size()
    return ("strided", 0, 1, (n,), (1,)), None


def _cores_touch_disjoint_bytes(accs) -> bool:
    """Whether no byte one core writes is read or written by another core (one linear pass
    over dense byte masks; the pairwise check below is only needed when this fails, e.g.
    LNC=2 kernels whose cores interleave columns of the same rows)."""
    size = max(a[6] for a in accs)
    masks: dict[tuple, torch.Tensor] = {}
    for a in accs:
        mask = masks.get((a[0], a[3]))
        if mask is None:   # one per (core, kind): setdefault would zero a new one per access
            mask = masks[(a[0], a[3])] = torch.zeros(size, dtype=torch.bool)
        starts = _byte_offsets(a[7])
        for k in range(a[7][2]):
            mask[starts + k] = True
    cores = sorted({a[0] for a in accs})
    empty = torch.zeros(size, dtype=torch.bool)
    for c in cores:
        mine = masks.get((c, "write"))
        if mine is None:
            continue
        for other in cores:
            if other != c and bool((mine & (masks.get((other, "write"), empty)
                                            | masks.get((other, "read"), empty))).any()):
                return False
    return True


def _compact(changed):
    """A changed mask kept small: None = every element changed, False = none did."""
    if changed is None:
        return None
    if bool(changed.all()):
        return None
    if not bool(changed.any()):
        return False
    return changed


def _hull(where) -> tuple[int, int]:
    kind, off, es, shape, stride = where
    span = sum((s - 1) * st for s, st in zip(shape, stride) if st > 0)
    if kind == "strided":
        return off, off + (span + 1) * es
    if off.numel() == 0:
        return 0, 0
    return int(off.min()), int(off.max()) + (span + 1) * es


def _byte_offsets(where) -> torch.Tensor:
    """Start byte of every element, in the view's element order (flattened)."""
    kind, off, es, shape, stride = where
    idx = torch.tensor(0, dtype=torch.int64)
    for s, st in zip(shape, stride):
        idx = idx.unsqueeze(-1) + torch.arange(s, dtype=torch.int64) * st
    if kind == "strided":
        return off + idx.reshape(-1) * es
    return (off.reshape(-1, 1) + idx.reshape(1, -1) * es).reshape(-1)


def _bytes(starts: torch.Tensor, es: int) -> torch.Tensor:
    """Every byte of the elements starting at ``starts`` (``es`` bytes each), element by element."""
    return (starts.unsqueeze(1) + torch.arange(es)).reshape(-1)


def _covering(starts, es, other_starts, other_es) -> torch.Tensor:
    """Which elements (``starts``, ``es`` bytes each) share a byte with the other set."""
    if es == other_es and bool(((starts % es) == 0).all()) and bool(((other_starts % es) == 0).all()):
        # aligned elements of one size: a dense mask over the two sets' common range (linear
        # time; torch.isin sorts, which took seconds per pair on [1576, 8192] outputs)
        lo = max(int(starts.min()), int(other_starts.min())) // es
        hi = min(int(starts.max()), int(other_starts.max())) // es + 1
        if hi <= lo:
            return torch.zeros(starts.shape, dtype=torch.bool)
        theirs = other_starts // es
        theirs = theirs[(theirs >= lo) & (theirs < hi)] - lo
        mask = torch.zeros(hi - lo, dtype=torch.bool)
        mask[theirs] = True
        mine = starts // es - lo
        inside = (mine >= 0) & (mine < hi - lo)
        hit = torch.zeros(starts.shape, dtype=torch.bool)
        hit[inside] = mask[mine[inside]]
        return hit
    mine = _bytes(starts, es)
    theirs = _bytes(other_starts, other_es)
    return torch.isin(mine, theirs).reshape(-1, es).any(1)


def _conflict(x, y, accs):
    """(write, other, lo, hi) if accesses ``x``, ``y`` of different cores race, else None.
    A read of bytes the other core writes is not a race when the reader itself wrote the
    same bits there earlier (after the other core's write, so its own write changed nothing):
    it reads those bits in any order (AWS's dynamic_elementwise_add: both cores store the
    whole result, then read it back)."""
    w, o = (x, y) if x[3] == "write" else (y, x)
    if o[3] == "write" and w[9] is not None and o[9] is not None:
        return _last_writes_differ(w, o, accs)
    if o[3] == "write" and o[2] > w[2]:
        w, o = o, w  # of two writes, the later one decides whether the order matters
    wb, ob = _byte_offsets(w[7]), _byte_offsets(o[7])
    hit = _covering(wb, w[7][2], ob, o[7][2])
    if not bool(hit.any()):
        return None
    changed = w[8]
    if changed is False:
        return None  # the write changed nothing: the order is not observable
    if changed is not None:
        hit = hit & changed.reshape(-1)
        if not bool(hit.any()):
            return None  # same bits either way: the order is not observable
    starts = wb[hit]
    if o[3] == "read":
        hit_bytes = _bytes(starts, w[7][2])
        for own in accs:
            if own[0] != o[0] or own[3] != "write" or not w[2] < own[2] < o[2] \
                    or own[8] is None:
                continue
            ob_own = _byte_offsets(own[7])
            same = ob_own if own[8] is False else ob_own[~own[8].reshape(-1)]
            same = _bytes(same, own[7][2])
            hit_bytes = hit_bytes[~torch.isin(hit_bytes, same)]
            if hit_bytes.numel() == 0:
                return None
        starts = hit_bytes
        return w, o, int(starts.min()), int(starts.max()) + 1
    return w, o, int(starts.min()), int(starts.max()) + w[7][2]


def _written_bytes(acc, lo, hi) -> torch.Tensor:
    """The byte values write ``acc`` leaves in [lo, hi), -1 where it writes nothing."""
    values = torch.full((hi - lo,), -1, dtype=torch.int16)
    es = acc[7][2]
    starts = _byte_offsets(acc[7])
    data = acc[9].contiguous().reshape(-1).view(torch.uint8).reshape(-1, es).to(torch.int16)
    at = _bytes(starts, es) - lo
    inside = (at >= 0) & (at < hi - lo)
    values[at[inside]] = data.reshape(-1)[inside]
    return values


def _last_writes_differ(w, o, accs):
    """(w, o, lo, hi) if the two writes, each its core's last write to some bytes, leave
    different values there (the final memory depends on which core writes last)."""
    lo, hi = max(w[5], o[5]), min(w[6], o[6])
    if hi <= lo:
        return None
    ends = []
    for acc in (w, o):
        values = _written_bytes(acc, lo, hi)
        for own in accs:  # the same core writing those bytes again later
            if own[0] == acc[0] and own[3] == "write" and own[2] > acc[2] and own[5] < hi and own[6] > lo:
                at = _bytes(_byte_offsets(own[7]), own[7][2]) - lo
                values[at[(at >= 0) & (at < hi - lo)]] = -1
        ends.append(values)
    differ = (ends[0] >= 0) & (ends[1] >= 0) & (ends[0] != ends[1])
    if not bool(differ.any()):
        return None
    where = differ.nonzero().reshape(-1)
    first, second = (w, o) if w[2] > o[2] else (o, w)
    es = first[7][2]  # reported in whole elements (0.0 and 1.0 share their low bytes)
    first_byte, end_byte = lo + int(where.min()), lo + int(where.max()) + 1
    return first, second, first_byte // es * es, -(-end_byte // es) * es


def _message(w, o, lo, hi, describe) -> str:
    a = w[4]
    if o[3] == "write":
        what = "both cores write different values there"
    else:
        what = f"core {o[0]} reads what core {w[0]} writes"
    return (f"LNC race on shared HBM tensor {a.name or '(unnamed)'} {a.shape} {a.dtype.name}, "
            f"bytes {lo}..{hi - 1}: {what} with no core_barrier or sendrecv between them "
            f"(core {w[0]} writes at instruction {describe(w[2])}, core {o[0]} "
            f"{'writes' if o[3] == 'write' else 'reads'} at instruction {describe(o[2])})")

"""Which part of an attention launch each physical core runs (LNC=2): ``program_units``.

A launch's work is (batch, kv head, query tile) items. At LNC=1 the one program takes them
all. At LNC=2 (AWS, "Using Logical NeuronCores (LNC) with NKI": two programs, one per
physical core, sharing the HBM inputs and output) the split must keep both cores equally
busy:

* when the (batch, kv head) pairs divide evenly between the programs, each takes a
  contiguous half of them, with every query tile: nothing is loaded twice;
* otherwise (e.g. one kv head, or three), every program takes every (batch, kv head) pair
  and a contiguous range of query tiles holding an equal share of the work, counting keys
  per tile (causal: tile t attends to min(Sk, 128 (t + 1)) keys, so the later tiles weigh
  more).

A unit is ``(b, hk0, hk1, t0, t1)``: batch b, kv heads hk0:hk1 (at most ``kv_group`` of
them, one batch), query tiles t0:t1. Units are listed in issue order.
"""

import nki.language as nl

from .attention_launch import P


def program_units(facts):
    """This program's work units (see the module docstring); [] when it has none."""
    f = facts
    pid, count = nl.program_id(0), nl.num_programs()
    pairs = f.B * f.Hkv
    if pairs % count == 0:
        lo, hi = (pid * pairs) // count, ((pid + 1) * pairs) // count
        return _group(f, lo, hi, 0, f.n_q_tiles)
    t0, t1 = _tile_share(f, pid, count)
    if t1 <= t0:
        return []
    return _group(f, 0, pairs, t0, t1)


def _group(facts, lo, hi, t0, t1):
    """Units for the (batch, kv head) pairs lo:hi (flattened b * Hkv + hk), grouped by
    batch into runs of at most kv_group kv heads, each over query tiles t0:t1."""
    f = facts
    units = []
    i = lo
    while i < hi:
        b, hk0 = i // f.Hkv, i % f.Hkv
        hk1 = min(f.Hkv, hk0 + f.kv_group, hk0 + (hi - i))
        units.append((b, hk0, hk1, t0, t1))
        i += hk1 - hk0
    return units


def _tile_work(facts, t):
    """Relative cost of query tile t: its keys (causal: those at or before its last row)."""
    r = min(P, facts.Sq - t * P)
    return min(facts.Sk, t * P + r) if facts.causal else facts.Sk


def _tile_share(facts, pid, count):
    """[t0, t1) of query tiles for program pid: contiguous, splitting the summed tile work
    as evenly as whole tiles allow."""
    work = [_tile_work(facts, t) for t in range(facts.n_q_tiles)]
    total = sum(work)
    bounds = [0]
    acc = 0
    t = 0
    for p in range(1, count):
        goal = total * p / count
        while t < len(work) and acc + work[t] / 2 <= goal:   # a tile goes where its middle falls
            acc += work[t]
            t += 1
        bounds.append(t)
    bounds.append(len(work))
    return bounds[pid], bounds[pid + 1]

"""Which part of an attention launch each physical core runs (LNC=2): ``program_units``.

A launch's work is a grid of (batch, kv head) pairs x query tiles. At LNC=1 the one program
takes it all. At LNC=2 (AWS, "Using Logical NeuronCores (LNC) with NKI": two programs, one
per physical core, sharing the HBM inputs and output) the grid, flattened pair by pair,
is cut into two contiguous halves of equal work, counting a query tile's keys as its work
(causal: tile t attends to min(Sk, 128 (t + 1)) keys, so later tiles weigh more; a short
tail tile costs the engines as much as a full one, so rows do not count). When the pairs
divide evenly the cut falls between pairs, and no kv head is loaded by both cores; else
(one kv head, or three) the pair at the cut is shared by query tiles.

A unit is ``(b, hk0, hk1, t0, t1)``: batch b, kv heads hk0:hk1 (at most ``kv_group`` of
them, one batch), query tiles t0:t1. Units are listed in issue order.
"""

import nki.language as nl

from .attention_launch import P


def program_units(facts):
    """This program's work units (see the module docstring); [] when it has none."""
    f = facts
    work = [_tile_work(f, t) for t in range(f.n_q_tiles)]
    lo, hi = _cut(work, f.B * f.Hkv, nl.program_id(0), nl.num_programs())
    units = []
    i = lo
    T = f.n_q_tiles
    while i < hi:
        pair, t0 = i // T, i % T
        b, hk0 = pair // f.Hkv, pair % f.Hkv
        if t0 > 0 or hi - i < T:              # part of one pair's query tiles
            t1 = min(T, t0 + hi - i)
            units.append((b, hk0, hk0 + 1, t0, t1))
            i += t1 - t0
            continue
        # whole pairs: up to kv_group kv heads of this batch, all query tiles
        pairs = min(f.Hkv - hk0, f.kv_group, (hi - i) // T)
        units.append((b, hk0, hk0 + pairs, 0, T))
        i += pairs * T
    return units


def _tile_work(facts, t):
    """Relative cost of query tile t: its keys (causal: those at or before its last row)."""
    r = min(P, facts.Sq - t * P)
    return min(facts.Sk, t * P + r) if facts.causal else facts.Sk


def _cut(tile_work, pairs, pid, count):
    """[lo, hi) of the flattened (pair, tile) items for program pid: contiguous, the summed
    work split as evenly as whole items allow (an item goes where its middle falls)."""
    if count == 1:
        return 0, pairs * len(tile_work)
    per_pair = sum(tile_work)
    total = per_pair * pairs
    bounds = []
    for p in (pid, pid + 1):
        goal = total * p / count
        full = int(goal // per_pair) if per_pair else 0
        full = min(full, pairs)
        i, acc = full * len(tile_work), full * per_pair
        for w in tile_work:
            if i >= pairs * len(tile_work) or acc + w / 2 > goal:
                break
            acc += w
            i += 1
        bounds.append(i)
    return bounds[0], bounds[1]



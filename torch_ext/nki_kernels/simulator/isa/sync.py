"""Instructions between the physical cores of a logical core: ``sendrecv`` and
``core_barrier``.

In an LNC=2 launch the two cores run concurrently (interpreter.Lockstep): these
instructions block the calling core until the other core reaches its side, which is how
the two programs advance together. What the docs require of them, and what is checked:

* ``sendrecv`` (nki.isa.sendrecv): "The current NeuronCore sends its src tile to the dst
  location of the target NeuronCore specified by send_to_rank, while simultaneously
  receiving data from recv_from_rank into its own dst tile"; "src and dst tiles must both
  be in SBUF", "the same data type", "the same shape"; ranks "must be either 0 or 1";
  "Operations with the same pipe_id form a logical group where all operations in the group
  must complete before any can proceed": a core leaves sendrecv once it has received and
  its own tile has been taken. ``dma_engine.gpsimd_dma`` moves at most 1024/512/256 bytes
  per partition for 32/16/8-bit types.
* Both are "Available only on NeuronCore-v3 or newer" (their docstrings): trn1 refuses them.
* ``core_barrier`` (nki.isa.core_barrier): "all specified NeuronCores must reach before any
  can proceed"; "Currently only cores=(0, 1) is supported"; ``data`` "must be data in
  shared HBM". Both cores must pass their barriers in the same order: the k-th barrier of
  one core meets the k-th of the other, and named barriers must agree on the name (the
  compiler's LNC barrier checker reports "Expected core barriers to have name ...").

Messages and barrier arrivals live in the run (context.Run); completed exchanges order the
cores' shared-HBM accesses for the race check (races.py). A launch of one core has no
partner: a barrier is a no-op there (the other core of the pair belongs to another
launch, which this run does not simulate) and only a sendrecv to itself can complete.
"""

from __future__ import annotations

from ..context import current
from ..errors import DeadlockError
from . import enums
from .operands import fail, record, require_generation, store, tensor_arg

# nisa.sendrecv with dma_engine.gpsimd_dma: "1024 bytes for 32-bit types, 512 bytes for
# 16-bit types, 256 bytes for 8-bit types" per partition
_GPSIMD_DMA_BYTES = {4: 1024, 2: 512, 1: 256}


def _state(run):
    st = getattr(run, "sync_state", None)
    if st is None:
        st = run.sync_state = {"mail": {}, "barriers": [], "taken": {}}
    return st


def _needs_v3(instr):
    """Both instructions' docstrings: "Available only on NeuronCore-v3 or newer" (trn1 is v2)."""
    require_generation(instr, 3, source=f"nki.isa.{instr}")


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=enums.dma_engine.dma,
             name=None):
    """Send ``src`` to core ``send_to_rank`` and receive core ``recv_from_rank``'s tile into
    ``dst`` (see the module docstring)."""
    I = "sendrecv"
    _needs_v3(I)
    for role, t in (("src", src), ("dst", dst)):
        tensor_arg(I, role, t)
        if t._alloc.kind != "sbuf":
            fail(f"{I}: {role} must be in SBUF, got {t._alloc.kind.upper()}")
    if src.dtype != dst.dtype:
        fail(f"{I}: src dtype {src.dtype.name} and dst dtype {dst.dtype.name} must be the same")
    if tuple(src.shape) != tuple(dst.shape):
        fail(f"{I}: src shape {src.shape} and dst shape {dst.shape} must be the same")
    ctx = current()
    run = ctx.run
    me = ctx.program_id
    for role, r in (("send_to_rank", send_to_rank), ("recv_from_rank", recv_from_rank)):
        if not isinstance(r, int) or not 0 <= r < max(2, run.grid):
            fail(f"{I}: {role}={r!r} must be 0 or 1 (the cores of a logical core)")
    if dma_engine is enums.dma_engine.gpsimd_dma:
        per_part = src.size // src.shape[0] * src.dtype.itemsize
        most = _GPSIMD_DMA_BYTES.get(src.dtype.itemsize, 1024)
        if per_part > most:
            fail(f"{I}: dma_engine gpsimd_dma moves at most {most} bytes per partition of a "
                 f"{8 * src.dtype.itemsize}-bit type; src has {per_part}")
    payload = src._data.clone()
    nbytes = src.size * src.dtype.itemsize
    attrs = {"bytes": nbytes, "src_bytes": nbytes, "direction": "sbuf_to_sbuf",
             "send_to_rank": send_to_rank, "recv_from_rank": recv_from_rank,
             "pipe_id": pipe_id}
    if run.grid == 1 or run.scheduler is None:
        if send_to_rank != me or recv_from_rank != me:
            raise DeadlockError(
                f"{I}: core {me} of an LNC={run.grid} launch exchanges with cores "
                f"{send_to_rank}/{recv_from_rank}, which are not in this launch (sendrecv "
                "needs LNC=2)")
        store(I, dst, payload, raw=True)
        return record(I, "dma", [("src", src)], [("dst", dst)], 0, attrs)
    st = _state(run)
    races = run.races
    out_key = (me, send_to_rank, pipe_id)
    in_key = (recv_from_rank, me, pipe_id)
    token = [races.sent(me) if races is not None else 0, False]  # [epoch, taken]
    st["mail"].setdefault(out_key, []).append((payload, token))
    run.scheduler.wait(me, lambda: bool(st["mail"].get(in_key)),
                       f"sendrecv from core {recv_from_rank} (pipe_id {pipe_id})")
    got, their = st["mail"][in_key].pop(0)
    their[1] = True
    if races is not None:
        races.received(recv_from_rank, their[0], me)
    if tuple(got.shape) != tuple(dst.shape) or got.dtype != dst._data.dtype:
        fail(f"{I}: core {me} receives a {tuple(got.shape)} tile from core {recv_from_rank} "
             f"into dst {dst.shape} {dst.dtype.name}; both sides must move the same tile")
    store(I, dst, got, raw=True)
    ins = record(I, "dma", [("src", src)], [("dst", dst)], 0, attrs)
    run.scheduler.wait(me, lambda: token[1],
                       f"core {send_to_rank} to take its tile (sendrecv pipe_id {pipe_id})")
    return ins


def core_barrier(data, cores, engine=enums.engine.gpsimd, name=None):
    """Wait until every core in ``cores`` reaches its barrier (see the module docstring)."""
    I = "core_barrier"
    _needs_v3(I)
    tensor_arg(I, "data", data)
    if data._alloc.kind != "hbm":
        fail(f"{I}: data must be a shared HBM tensor, got {data._alloc.kind.upper()}")
    try:
        cores = tuple(int(c) for c in cores)
    except TypeError:
        fail(f"{I}: cores={cores!r} must be a tuple of core ids")
    if cores != (0, 1):
        fail(f"{I}: cores={cores}; only cores=(0, 1) is supported")
    ctx = current()
    run = ctx.run
    # A barrier moves no data: it is not a trace instruction (the cost model has no
    # cross-core wait to price; the run's sync_state keeps the barriers).
    if run.grid == 1 or run.scheduler is None:
        return None
    me = ctx.program_id
    st = _state(run)
    barriers = st["barriers"]
    mine = st.setdefault("count", {}).get(me, 0)
    st["count"][me] = mine + 1
    if mine == len(barriers):
        barriers.append({"arrived": set(), "name": name, "core": me})
    b = barriers[mine]
    if b["name"] != name:
        fail(f"{I}: barrier #{mine} is named {name!r} on core {me} but {b['name']!r} on core "
             f"{b['core']}; both cores must pass the same barriers in the same order")
    b["arrived"].add(me)
    run.scheduler.wait(me, lambda: all(c in b["arrived"] for c in cores),
                       f"core_barrier #{mine}{'' if name is None else f' ({name!r})'}")
    if not b.get("done"):
        b["done"] = True
        b["at_instruction"] = len(run.recorder)
        if run.races is not None:
            run.races.synchronised(cores)
    return None


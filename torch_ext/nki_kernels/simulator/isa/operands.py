"""What every instruction shares: operand checks (on chip, partition counts and start
partitions, free sizes, PSUM/GpSimd rules), fp32 reads, the round-once write into dst,
engine selection, accumulator-register updates and trace recording.

Kept small and cheap: each check is a few attribute reads, each compute a few whole-tile
torch ops. Limits come from the active target (hardware.py).
"""

from __future__ import annotations

import math
import numbers

import torch

from ..context import current
from ..errors import NkiValidationError
from ..hardware import Target
from ..memory import STATE_DTYPE
from ..tensor import NkiTensor, OutOfBoundsView, UnmaterializedTensor, _signed
from ..trace import capture
from . import enums


class NkiInstruction:
    """Opaque handle to an issued instruction (beta-2 ISA calls return one)."""

    __slots__ = ("_recorder", "index")

    def __init__(self, recorder, index):
        self._recorder = recorder
        self.index = index

    @property
    def instruction(self):
        """The trace record of this instruction."""
        return self._recorder.instructions[self.index]

    def depends_on(self, *producers) -> "NkiInstruction":
        # The simulator executes in program order; dependencies are already satisfied.
        return self

    def __repr__(self):
        ins = self.instruction
        return f"NkiInstruction({ins.index}: {ins.op} on {ins.engine})"


def fail(msg):
    raise NkiValidationError(msg)


def target() -> Target:
    """The active target (hardware.py): every limit a rule checks comes from it."""
    return current().target


def generation_refusal(instr: str, version: int, feature: str = "", supported: bool | None = None,
                       source: str = "", hint: str = "") -> str | None:
    """The refusal of ``instr`` (or of its ``feature``, an option such as "dge_mode=hwdge") on
    a target older than NeuronCore-v``version``, or None when the target has it. ``supported``
    is the target's own capability flag where hardware.py keeps one (``has_mx``, ...): it
    decides instead of the generation number. ``source`` names the AWS page the rule is from;
    ``hint`` what to write instead. One message for every such rule: "<instr>: [<feature> ]needs
    NeuronCore-vN (trnX) or newer[ (<source>)]; the target is <name>[: <hint>]"."""
    tgt = target()
    ok = tgt.generation >= version if supported is None else supported
    if ok:
        return None
    from ..hardware import TARGETS   # (the family name of a NeuronCore version: v3 is trn2)

    family = next((t.name for t in TARGETS.values() if t.generation == version), None)
    what = f"{feature} needs" if feature else "needs"
    core = f"NeuronCore-v{version} ({family})" if family else f"NeuronCore-v{version}"
    cited = f" ({source})" if source else ""
    fix = f": {hint}" if hint else ""
    return f"{instr}: {what} {core} or newer{cited}; the target is {tgt.name}{fix}"


def require_generation(instr: str, version: int, feature: str = "", supported: bool | None = None,
                       source: str = "", hint: str = "") -> None:
    """Refuse ``instr`` on a target older than NeuronCore-v``version`` (generation_refusal)."""
    msg = generation_refusal(instr, version, feature, supported, source, hint)
    if msg is not None:
        fail(msg)


def is_scalar(x) -> bool:
    return isinstance(x, numbers.Number) or (
        not isinstance(x, NkiTensor) and hasattr(x, "item") and getattr(x, "ndim", 1) == 0)


def tensor_arg(instr, role, t) -> NkiTensor:
    if not isinstance(t, NkiTensor):
        fail(f"{instr}: {role} must be an NKI tensor, got {type(t).__name__}")
    if isinstance(t, UnmaterializedTensor):
        t._refuse()   # nl.NkiTensor(..., storage=None): never materialized
    return t


def start_partition(t: NkiTensor) -> int:
    return t._start_partition()


# "Within each SBUF/PSUM partition, the tensor read/write logic on the NeuronCore supports
# accessing elements from up to four-dimensional arrays" (AWS, "NKI Access Patterns" deep
# dive, Hardware Capability). Which instructions take fewer ("most instructions only support
# 1D/2D/3D in the free dimension due to instruction length limitations") it does not list,
# so only the 4 is enforced; instructions whose docstrings give a lower limit check it
# themselves (max_rank).
MAX_FREE_PATTERN_DIMS = 4


def free_pattern_rank(shape, strides) -> int:
    """Dimensions of a view's free access pattern, as the hardware counts them: size-1
    dimensions dropped and a dimension merged into the one outside it when that one steps
    over it exactly (stride == inner stride * inner count), so a contiguous [P, 2, 3, 4, 5]
    tile is one free dimension."""
    merged: list[list[int]] = []
    for stride, count in zip(strides[1:], shape[1:]):
        if count == 1:
            continue
        if merged and merged[-1][0] == stride * count:
            merged[-1] = [stride, merged[-1][1] * count]
        else:
            merged.append([stride, count])
    return len(merged)


def onchip(instr, role, t, *, psum=True, sbuf=True, why="", quadrant_offsets=()) -> NkiTensor:
    """Check an engine operand: an SBUF/PSUM tensor, <= 128 partitions, legal start partition.

    ``quadrant_offsets``: starts this many partitions into a quadrant the operand may also
    take (MX scale tiles); the rule then applies to the access from the quadrant's start."""
    if not isinstance(t, NkiTensor):
        fail(f"{instr}: {role} must be an NKI tensor, got {type(t).__name__}")
    kind = t._alloc.kind
    shape = t._data.shape if type(t) is NkiTensor else t.shape
    if 0 in shape:
        fail(f"{instr}: {role} is empty (shape {tuple(shape)}); an instruction needs elements")
    if kind == "hbm":
        fail(f"{instr}: {role} is in HBM; compute engines read and write only SBUF/PSUM "
             "(move data with nl.load / nisa.dma_copy)")
    if kind == "psum" and not psum:
        fail(f"{instr}: {role} must be in SBUF, got PSUM{why}")
    if kind == "sbuf" and not sbuf:
        fail(f"{instr}: {role} must be in PSUM, got SBUF{why}")
    if len(shape) < 2:
        # a 1-D on-chip tensor (allowed for the register instructions and DMA: the v2.33
        # register_load / register_store examples) is no engine tile: every documented
        # engine operand is [partition, free...], so the simulator does not guess one
        fail(f"{instr}: {role} is a 1-D on-chip tensor (shape {tuple(shape)}); engine instructions "
             f"take [partition, free...] tiles: use {role}.reshape(({shape[0]}, 1))")
    # only a view of more than 4 free dimensions can merge to more than 4 (this runs for every
    # operand of every instruction); an out-of-bounds view raises IndexError when used
    if len(shape) > MAX_FREE_PATTERN_DIMS + 1 and not isinstance(t, OutOfBoundsView):
        rank = free_pattern_rank(t.shape, t.strides)
        if rank > MAX_FREE_PATTERN_DIMS:
            fail(f"{instr}: {role} (shape {tuple(t.shape)}, strides {tuple(t.strides)}) accesses {rank} "
                 f"free dimensions of its partitions (after merging contiguous ones); the engines' "
                 f"access patterns have at most {MAX_FREE_PATTERN_DIMS}")
    p = shape[0]
    tgt = current().target
    if p > tgt.partitions:
        fail(f"{instr}: {role} partition dim {p} exceeds maximum {tgt.partitions}")
    s = start_partition(t)
    q = tgt.partition_quadrant
    if s % q and s % q in quadrant_offsets:
        p, s = p + s % q, s - s % q
    if s:
        # Start-partition rule (docs/hardware.md): an access of more than two quadrants
        # starts at 0, of more than one at 0 or at the middle, else at a quadrant boundary.
        if p > 2 * q:
            fail(f"{instr}: {role} spans {p} partitions starting at partition {s}; "
                 f"an access of more than {2 * q} partitions must start at partition 0")
        if p > q and s != 2 * q:
            fail(f"{instr}: {role} spans {p} partitions starting at partition {s}; "
                 f"an access of {q + 1}-{2 * q} partitions must start at partition 0 or {2 * q}")
        if s % q or s + p > ((s // q) + 1) * q and p <= q:
            starts = [str(b) for b in range(0, tgt.partitions, q)]
            fail(f"{instr}: {role} spans {p} partitions starting at partition {s}; "
                 f"an access of at most {q} partitions must start at partition "
                 f"{', '.join(starts[:-1])} or {starts[-1]} and stay within that quadrant")
    return t


def free_elems(t: NkiTensor) -> int:
    if type(t) is NkiTensor:
        d = t._data
        return d.numel() // d.shape[0]
    shape = t.shape
    return math.prod(shape) // shape[0]


def _parts(t) -> int:
    return t._data.shape[0] if type(t) is NkiTensor else t.shape[0]


def max_rank(instr, limit, *pairs):
    """Each (role, tensor) has at most ``limit`` dimensions (a partition dim and ``limit - 1``
    free dims), as an instruction's docstring states it."""
    for role, t in pairs:
        if len(t.shape) > limit:
            fail(f"{instr}: {role} has rank {len(t.shape)} {tuple(t.shape)}; at most {limit} "
                 f"(a partition and {limit - 1} free dimension{'s' if limit > 2 else ''})")


def same_partitions(instr, ra, a, rb, b):
    pa, pb = _parts(a), _parts(b)
    if pa != pb:
        fail(f"{instr}: {rb} partition dim {pb} does not match {ra} partition dim {pa}")


def same_free(instr, ra, a, rb, b):
    fa, fb = free_elems(a), free_elems(b)
    if fa != fb:
        fail(f"{instr}: {rb} has {fb} elements per partition but {ra} has {fa}")


def not_both_psum(instr, ra, a, rb, b):
    if isinstance(a, NkiTensor) and isinstance(b, NkiTensor) and \
            a._alloc.kind == "psum" and b._alloc.kind == "psum":
        fail(f"{instr}: {ra} and {rb} cannot both be in PSUM")


def no_psum_on_gpsimd(instr, *pairs):
    for role, t in pairs:
        if isinstance(t, NkiTensor) and t._alloc.kind == "psum":
            fail(f"{instr}: {role} is in PSUM; the GpSimd engine cannot access PSUM")


def f32(t: NkiTensor) -> torch.Tensor:
    """The view's values as fp32 (a float32 view is returned as is: no copy)."""
    d = t._data
    if d.dtype == torch.float32:
        return d
    dt = t.dtype
    if dt.is_float:
        return dt.from_bits(d)
    if dt.is_packed:
        dt.from_bits(d)  # raises: packed MX words have no element values
    return d.to(torch.float32)  # integers: exact, or RNE above 2^24 as any int -> fp32 cast


def signed_bits(bits: torch.Tensor) -> torch.Tensor:
    """``bits`` viewed as a signed integer of the same size (torch's gather/scatter kernels
    do not take every dtype, e.g. uint32); view the result back with ``.view(dtype)``."""
    return _signed(bits.contiguous())


def ints(t: NkiTensor) -> torch.Tensor:
    """The view's values as int64 (integer dtypes: exact)."""
    return t.dtype.from_bits(t._data).to(torch.int64)


def store(instr, dst: NkiTensor, value: torch.Tensor, matmul=False, raw=False) -> None:
    """Round ``value`` (fp32/fp64 or integer values) ONCE into dst's dtype and write it into
    the dst view; ``raw``: ``value`` is already dst's bits (a same-dtype copy)."""
    if type(dst) is not NkiTensor:
        bits = value if raw else dst.dtype.to_bits(value)
        bits = bits.expand(dst.shape) if bits.numel() == 1 else bits.reshape(dst.shape)
        dst._store_bits(bits)
        return
    view = dst  # the operand the instruction names (the race check keys on it)
    d = dst._data
    v = value
    if v.shape != d.shape and v.numel() == d.numel():
        v = v.reshape(d.shape)
    step0 = False
    for s, st in zip(d.shape, d.stride()):
        if st == 0 and s > 1:
            step0 = True
            break
    if step0:
        # A dst pattern may repeat addresses (step 0; nothing in the docs forbids it, and
        # nki-library writes an unused activation_reduce output that way). The engine writes
        # in pattern order, so the last write to an address wins: the last index of every
        # step-0 dimension.
        key = tuple(slice(s - 1, s) if (st == 0 and s > 1) else slice(None)
                    for s, st in zip(d.shape, d.stride()))
        v = (v if tuple(v.shape) == tuple(d.shape) else v.expand(d.shape))[key]
        dst = NkiTensor.of_view(dst._alloc, d[key], dst._dtype)
        d = dst._data
    a = dst._alloc
    races = current().run.races if a.kind == "hbm" else None
    old = races.before_store(dst) if races is not None else None
    if raw:
        d.copy_(v)  # a one-element value broadcasts
    else:
        dst.dtype.assign(d, v)
    if a.kind == "psum":
        psum_state(dst).fill_(1 if matmul else 2)
    elif a.kind == "hbm":
        a.written = True
        if races is not None:
            races.after_store(view, dst, old)


def cast_copy(instr, dst: NkiTensor, src: NkiTensor) -> None:
    """Copy ``src`` into dst: equal dtypes copy bits; any other pair, integer to integer
    included, casts through fp32 (round to nearest even, then saturate to dst's range):
    dma_copy "first casting from src.dtype to float32, then from float32 to dst.dtype",
    tensor_copy an "intermediate FP32 cast when input and output data types differ" (NKI
    0.7 docstrings). So int32 300 -> int8 is 127 (not 44), and int32 above 2**24 loses its
    low bits."""
    sd, dd = src.dtype, dst.dtype
    if sd == dd or (sd.storage == dd.storage and (sd.is_packed or dd.is_packed)):
        store(instr, dst, src._data, raw=True)
    else:
        store(instr, dst, f32(src))


def convert_bits(bits: torch.Tensor, src_dtype, dst_dtype) -> torch.Tensor:
    """``bits`` of ``src_dtype`` as ``dst_dtype`` bits, converted as cast_copy does."""
    if src_dtype == dst_dtype or (src_dtype.storage == dst_dtype.storage
                                  and (src_dtype.is_packed or dst_dtype.is_packed)):
        return bits
    values = src_dtype.from_bits(bits).to(torch.float32)    # through fp32, as cast_copy
    return dst_dtype.to_bits(values)


def require_one_psum_bank(instr, role, t: NkiTensor) -> None:
    """TensorE writes one PSUM bank per instruction: "each nc_matmul can only write to a
    single PSUM bank, which can only hold 512 FP32 elements per PSUM partition", and its
    output tile "must fit into one PSUM bank per partition" (aws-neuron-sdk
    nki/guides/architecture/trainium_inferentia2_arch.rst). A PSUM tensor starts at a bank
    boundary (placed ones at their address, itself at a boundary), so the view's bytes
    within its partition name the banks it touches. NeuronCore-v4's TensorE may fill all 8
    banks (its moving free size, Target.matmul_moving_fmax, is 8 banks of fp32): no rule."""
    tgt = target()
    if type(t) is not NkiTensor or not t.size or tgt.matmul_moving_fmax * 4 > tgt.psum_bank_bytes:
        return
    a = t._alloc
    d = t._data
    es = d.element_size()
    _, first = _partition_and_byte(t)
    last = first + sum((n - 1) * st for n, st in zip(d.shape[1:], d.stride()[1:])) * es + es
    if a.address is not None:
        first, last = first + a.address[1], last + a.address[1]
    bank = tgt.psum_bank_bytes
    if first // bank != (last - 1) // bank:
        fail(f"{instr}: {role} writes bytes [{first}, {last}) of each PSUM partition, across banks "
             f"{first // bank} to {(last - 1) // bank}; a TensorE instruction's output must fit one PSUM bank "
             f"({bank} bytes per partition: 'each nc_matmul can only write to a single PSUM bank'); "
             f"split it at a bank boundary or allocate its PSUM tile apart")


def _partition_and_byte(t: NkiTensor) -> tuple[int, int]:
    """(first partition, byte within the partition) of on-chip view ``t``'s first element,
    from its tensor's start."""
    a = t._alloc
    rel = t._data.storage_offset() * t._data.element_size() - a.base_byte_offset
    return divmod(rel, a.part_stride) if a.part_stride else (0, rel)


def psum_state(t: NkiTensor) -> torch.Tensor:
    """The PSUM accumulation state of view ``t``'s elements: an int view (one int of the
    element's size per element) of the allocation's state bytes (memory.py), which are
    laid out [partitions, bytes per partition] wherever the tensor is placed."""
    a = t._alloc
    if type(t) is not NkiTensor:
        fail(f"PSUM view {t!r}: dynamic or out-of-range access patterns on PSUM are not "
             "supported by the simulator")
    d = t._data
    es = d.element_size()
    p, f = _partition_and_byte(t)                          # from the tensor's start
    row = a.state.shape[1]
    strides = list(d.stride())
    if strides:
        strides[0] = strides[0] * es // a.part_stride * row // es if a.part_stride else 0
    state = a.state.view(-1).view(STATE_DTYPE[es])
    return torch.as_strided(state, d.shape, strides, (p * row + f) // es)


def operand_vec(instr, role, x, data: NkiTensor, need_f32=False):
    """A scalar operand (returned as float) or a (P, 1) tile (returned as fp32 column
    broadcastable against ``data``'s shape)."""
    if isinstance(x, NkiTensor):
        onchip(instr, role, x)
        same_partitions(instr, "data", data, role, x)
        if free_elems(x) != 1:
            fail(f"{instr}: {role} must be a scalar or a ({data.shape[0]}, 1) tile, got "
                 f"shape {x.shape}")
        if need_f32 and x.dtype.name != "float32":
            fail(f"{instr}: {role} tile must be float32, got {x.dtype.name}")
        v = f32(x).reshape((x.shape[0],) + (1,) * (data.ndim - 1))
        return v
    if is_scalar(x):
        return float(x) if not isinstance(x, bool) else float(x)
    fail(f"{instr}: {role} must be a scalar or a (P, 1) tile, got {type(x).__name__}")


def engine_of(instr, eng, allowed, default):
    """Resolve ``engine=`` to a trace engine name; ``unknown`` picks ``default``."""
    if eng is None or eng is enums.engine.unknown:
        return default
    if not isinstance(eng, enums.engine):
        fail(f"{instr}: engine={eng!r} is not a nisa.engine member")
    name = enums.ENGINE_NAME.get(eng)
    if name not in allowed:
        fail(f"{instr}: engine {eng.name} is not supported; use one of "
             f"{', '.join('nisa.engine.' + a for a in allowed)}")
    return name


def record(op, eng, reads, writes, flops, attrs) -> NkiInstruction:
    ctx = current()
    rec = ctx.recorder
    r = [capture(role, t) for role, t in reads if isinstance(t, NkiTensor)]
    w = [capture(role, t) for role, t in writes if isinstance(t, NkiTensor)]
    run = ctx.run
    if ctx.sequential_iterations:
        attrs["sequential"] = tuple(ctx.sequential_iterations)
    idx = rec.record(op, eng, r, w, flops, attrs, ctx.program_id if run.grid > 1 else None)
    # liveness (memory.Life): first and last use, first write, last read
    for role, t in reads:
        if isinstance(t, NkiTensor):
            life = t._alloc.life
            if life is not None:
                if life.first is None:
                    life.first = idx
                life.last = life.last_read = idx
    for role, t in writes:
        if isinstance(t, NkiTensor):
            life = t._alloc.life
            if life is not None:
                if life.first is None:
                    life.first = idx
                if life.first_write is None:
                    life.first_write = idx
                life.last = idx
    if run.races is not None:
        run.races.record(ctx.program_id, idx, op, reads, writes)
    return NkiInstruction(rec, idx)


def lanes(t: NkiTensor) -> slice:
    s = start_partition(t)
    return slice(s, s + t.shape[0])


def reduce_free(op_name, v: torch.Tensor) -> torch.Tensor:
    """Reduce all free axes of ``v`` (partition dim first) with the named ALU op -> (P,)."""
    v = v.reshape(v.shape[0], -1)
    return reduce_last(op_name, v)


def reduce_last(op_name, v: torch.Tensor) -> torch.Tensor:
    if op_name == "add":
        return v.sum(-1)
    if op_name == "maximum":
        return v.amax(-1)
    if op_name == "minimum":
        return v.amin(-1)
    if op_name == "multiply":
        return v.prod(-1)
    if op_name == "subtract":  # accumulator starts at 0: acc = acc - x
        return -v.sum(-1)
    if op_name == "logical_and":
        return (v != 0).all(-1).to(v.dtype)
    if op_name == "logical_or":
        return (v != 0).any(-1).to(v.dtype)
    if op_name == "logical_xor":
        return ((v != 0).sum(-1) % 2).to(v.dtype)
    if op_name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        fn = {"bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
              "bitwise_xor": torch.bitwise_xor}[op_name]
        out = v[..., 0]
        for i in range(1, v.shape[-1]):
            out = fn(out, v[..., i])
        return out
    fail(f"reduction with op {op_name} is not supported")


REDUCE_IDENTITY = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -math.inf,
                   "minimum": math.inf}


def combine(op_name, acc, r):
    if op_name in ("add", "subtract"):
        return acc + r
    if op_name == "multiply":
        return acc * r
    if op_name == "maximum":
        return torch.maximum(acc, r)
    if op_name == "minimum":
        return torch.minimum(acc, r)
    fail(f"accumulation with op {op_name} is not supported")


def check_reduce_cmd(instr, cmd) -> enums.reduce_cmd:
    if isinstance(cmd, enums.reduce_cmd):
        return cmd
    fail(f"{instr}: reduce_cmd={cmd!r} is not a nisa.reduce_cmd member")


def update_regs(regs, sl, cmd, op_name, r, init=None):
    """Apply ``reduce_cmd`` ``cmd`` to accumulator registers ``regs[sl]`` with partial ``r``."""
    rc = enums.reduce_cmd
    if cmd is rc.reset or cmd is rc.reset_reduce:
        regs[sl] = REDUCE_IDENTITY.get(op_name, 0.0)
    elif cmd is rc.load_reduce:
        regs[sl] = init
    if cmd in (rc.reduce, rc.reset_reduce, rc.load_reduce):
        regs[sl] = combine(op_name, regs[sl], r)


def vector_reduce_regs(instr, reduce_op, cmd, r, data, reduce_res, init=None, negate=False):
    """The VectorE accumulators of ``data``'s lanes updated with ``r`` (``cmd``, ``reduce_op``;
    ``init`` for load_reduce) and read out into ``reduce_res`` if given (negated with
    ``negate``)."""
    ctx = current()
    sl = lanes(data)
    if r is not None:
        update_regs(ctx.vector_regs, sl, cmd, reduce_op, r, init)
    if reduce_res is not None:
        onchip(instr, "reduce_res", reduce_res)
        same_partitions(instr, "data", data, "reduce_res", reduce_res)
        if free_elems(reduce_res) != 1:
            fail(f"{instr}: reduce_res must be ({data.shape[0]}, 1), got {reduce_res.shape}")
        out = ctx.vector_regs[sl].reshape(reduce_res.shape)
        store(instr, reduce_res, -out if negate else out)

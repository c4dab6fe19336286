"""Per-instruction cost rules: how long one traced instruction occupies its engine.

Every number comes from the target table in ``simulator/hardware.py`` (which names its
sources); this module only applies the documented rules. ``N`` below is the number of
elements per partition of an instruction's input tile (its free size), ``P`` its partition
count. Engines work on one element per partition per cycle (one lane per partition), so
cycles depend on ``N`` only: a tile with ``P < 128`` costs the same as a full one and
wastes ``128 - P`` lanes.

TensorE (``tensor_hz``)
    ``nc_matmul``: ``max(min(64, M), N, M / 4)`` cycles, M the stationary free size (output
    partitions), N the moving free size (output columns); x4 when an operand is float32
    (fp32 runs in four passes: 20 vs 79 TFLOPS; tfloat32 runs at the bf16 rate). ``M / 4``:
    the background LoadStationary, up to 4x faster than a matmul of the same size [A1].
    ``nc_matmul_mx`` (v4) as ``nc_matmul`` on its x4 tile sizes (4 packed pairs per PE [A3]).
    ``nc_transpose`` on TensorE (and ``nc_matmul(is_transpose=True)``): ``max(P, min(64, F))``
    cycles for a ``[P, F]`` input; fp32 x2 with v3+ transpose mode (x4 on v2).
    Back-to-back matmuls issue at that rate (the next stationary loads while the current
    moving operand streams); a consumer of the PSUM result waits the pipeline latency
    ``matmul_latency_cycles`` after the matmul's interval ends (perf-guide profiles).

VectorE (``vector_hz``)
    one input pass ``N`` cycles, two full-size inputs (``tensor_tensor``,
    ``scalar_tensor_tensor``, ``select_reduce``...) ``2N``; ``tensor_tensor`` and
    ``scalar_tensor_tensor`` with one input in PSUM and the other in SBUF ``N``;
    ``tensor_reduce`` ``N`` (``N/2`` for add/max with bf16 input and output);
    ``reciprocal`` ``8N``; ``nc_transpose`` (32x32) ``N``; ``bn_aggr`` ``13N/3``; ``memset`` of
    zero into bf16/fp16 ``N/2``; ``tensor_scalar_reduce`` ``max(64, N) + 64``; v4's
    ``quantize_mx`` ``N/4`` and ``exponential`` at the data path's width (``N/4`` 16-bit,
    ``N/2`` otherwise); an ALU ``power``/``rsqrt``/``reciprocal`` op inside
    tensor_scalar/tensor_tensor/... x8 (iterative, like reciprocal). NeuronCore-v3+
    performance mode:
    ``tensor_copy``/``tensor_scalar`` with every operand bf16/fp16 (or an fp8 output from
    16-bit inputs: ``vector_perf_mode_8bit_dst``) run 4x faster when all operands are in
    SBUF with a contiguous innermost free dimension, 2x when strided or when one side is in
    PSUM (contiguous; strided with PSUM, or both sides in PSUM: no mode); ``tensor_tensor`` with both inputs in SBUF
    and every operand bf16/fp16 runs 2x faster. Then ``max(MIN_II=64, cycles)`` plus the
    engine's static overhead ``vector_static_cycles`` (calibrated per generation, see
    hardware.py).

ScalarE (``scalar_hz``)
    ``activation`` and anything else on ScalarE: ``max(64, N / r)`` cycles, ``r`` = elements
    per partition per cycle (1, or 2 for 16-bit types on trn3); +64 cycles when the
    instruction reads its accumulator out (``reduce_res``); plus ``scalar_static_cycles``.

GpSimd (``gpsimd_hz``)
    ``iota``/``affine_select``: ``150 + N``; ``local_gather`` ``150 + V x E x C`` (V indices
    per core, E elements each, C cycles per element from the docstring's formula): AWS's
    whole cost, its 150 the instruction's startup ("GPSIMD_START"), so no fixed cost is
    added to them; other instructions as VectorE without its performance mode, x4 with an
    ALU ``power``/``rsqrt``/``reciprocal`` op (~4x slower than ScalarE's rsqrt); plus
    ``gpsimd_static_cycles``.

NeuronCore-v2 (trn1), every Vector/Scalar/GpSimd instruction: x2 when an SBUF/PSUM
operand's most minor free dimension steps more than 16 bytes ("roughly 50% performance
hit", the trn1 architecture guide's "Access pattern" [A1]; ``strided_access_factor``).

DMA (16 engines per core, called queues here, ``dma_bytes_per_s / 16`` each)
    A transfer is spread over ``ceil(P / 8)`` queues (each DMA engine serves 8 SBUF
    partitions [D]; HBM to HBM uses all 16), each moving an equal share. Per queue:

    * data time = (bytes + descriptors x ``dma_descriptor_bytes``) / per-queue bandwidth,
      where descriptors are the contiguous chunks (DMA buffers) of the transfer: the finer
      side's chunking (an SBUF row never continues into the next partition) [A1];
    * occupancy = max(``dma_transfer_gap_s``, data time + ``dma_transfer_handoff_s``): an
      engine moves one transfer at a time, hands over to the next one (a transfer's own
      profiled duration is its data time), and starts transfers no closer than the gap
      (the packet rate [DB]);
    * latency: the data starts ``dma_latency_s`` after the transfer was triggered (its
      dependencies done) [DB]; queued transfers overlap it, so streams hide it and only
      dependency chains pay it.

    A lone transfer therefore takes latency + data; a stream of [128, B] transfers runs at
    data / max(gap, data) of the bandwidth (the DMA overview's curve: linear below ~2 KiB
    per partition, saturated from ~4 KiB). ``dma_transpose`` uses all 16 queues at 90%
    (from HBM) or 50% (SBUF to SBUF) of the copy bandwidth [A2]. A casting copy moves the
    bytes of its larger side (it converts through fp32 element by element [D]; the docs
    do not price it). At LNC=2, transfers touching HBM run at ``min(1, stack / (2 x core))``
    of the bandwidth while both cores are active (schedule.py): one HBM stack per core pair.

Dependencies: a consumer of a Vector/Scalar/GpSimd result starts at the earliest
``dependency_latency_cycles`` (100, of the producer's clock) after the producer ends
(results committed to SBUF/PSUM before the next instruction reads them); a consumer of a
matmul's PSUM result ``matmul_latency_cycles`` of TensorE after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..hardware import Target
from ..trace import ENGINES

COMPUTE_ENGINES = tuple(e for e in ENGINES if e != "dma")

_SIXTEEN_BIT_FLOATS = frozenset({"bfloat16", "float16"})
_EIGHT_BIT_FLOATS = frozenset({"float8_e4m3", "float8_e4m3fn", "float8_e5m2"})
_FP32 = frozenset({"float32"})
# Roles that are outputs or accumulators, never a data input pass.
_OUTPUT_ROLES = frozenset({"dst", "reduce_res", "out", "output"})
_PATTERN_OPS = frozenset({"iota", "affine_select"})
_REDUCE_FAST_OPS = frozenset({"add", "max", "maximum"})
# ALU ops computed iteratively on VectorE/GpSimd (ScalarE evaluates them from tables).
_ALU_TRANSCENDENTAL = frozenset({"power", "pow", "rsqrt", "reciprocal"})


class CostModelError(ValueError):
    """An instruction the cost model cannot price (names the instruction and the reason)."""


@dataclass(frozen=True)
class InstructionCost:
    """Engine occupancy of one compute instruction (DMA transfers use :class:`DmaCost`)."""

    engine: str
    cycles: float          # engine cycles the instruction occupies its engine
    seconds: float         # cycles / engine clock
    rule: str              # the rule applied, for traces and docs (e.g. "matmul max(min(64,M),N)")
    lanes: int             # partitions used (lane occupancy = lanes / 128)


@dataclass(frozen=True)
class DmaCost:
    """One DMA transfer spread over ``queues`` queues."""

    queues: int
    bytes: int             # bytes moved in total
    bytes_per_queue: float
    data_seconds: float    # per queue: (bytes + descriptor overhead) / per-queue bandwidth
    gap_seconds: float     # per queue: minimum spacing between two transfer starts
    latency_seconds: float  # trigger to first byte (overlapped with queued transfers)
    hbm_bytes: int         # bytes read from or written to HBM
    descriptors: int = 0   # contiguous chunks moved (DMA buffers)
    rule: str = ""
    handoff_seconds: float = 0.0  # per queue: hand-over to the next transfer after the data

    @property
    def occupancy_seconds(self) -> float:
        """How long each queue is held: one transfer at a time (its data, then the hand-over
        to the next), at least the gap between transfer starts."""
        return max(self.gap_seconds, self.data_seconds + self.handoff_seconds)

    @property
    def lone_seconds(self) -> float:
        """A transfer on idle queues: latency, then its data."""
        return self.latency_seconds + self.data_seconds


def engine_hz(target: Target, engine: str) -> float:
    try:
        return {"tensor": target.tensor_hz, "vector": target.vector_hz,
                "scalar": target.scalar_hz, "gpsimd": target.gpsimd_hz}[engine]
    except KeyError:
        raise CostModelError(f"engine={engine!r} has no clock; expected one of {COMPUTE_ENGINES}") from None


def _inputs(ins):
    """Data inputs of an instruction: its reads minus accumulators/outputs."""
    return [o for o in ins.reads if o.role not in _OUTPUT_ROLES]


def _main_free(ins) -> tuple[int, int]:
    """(N, P) of an instruction: the largest input tile's free size, else its output's."""
    ins_in = [o for o in _inputs(ins) if o.buffer != "hbm"]
    if ins_in:
        big = max(ins_in, key=lambda o: o.free_elems)
        return big.free_elems, big.partitions
    outs = [o for o in ins.writes if o.buffer != "hbm"]
    if outs:
        big = max(outs, key=lambda o: o.free_elems)
        return big.free_elems, big.partitions
    raise CostModelError(f"instruction {ins.index} ({ins.op}) has no on-chip operand to size it")


def _full_inputs(ins, n: int) -> list:
    """Inputs streamed in full (per-partition scalars such as a (P,1) bias are not)."""
    full = [o for o in _inputs(ins) if o.buffer != "hbm" and (o.free_elems == n or n == 1)]
    return full


def _data_operands(full: list, ins) -> list:
    """The data tensors a dtype-dependent rate is about: the full-size inputs ``full`` and the
    on-chip output (per-partition scalar operands such as a (P,1) fp32 bias do not count)."""
    return full + [o for o in ins.writes if o.role == "dst" and o.buffer != "hbm"]


def _all_16bit(operands) -> bool:
    return bool(operands) and all(o.dtype in _SIXTEEN_BIT_FLOATS for o in operands)


def _all_narrow(operands) -> bool:
    """16-bit or 8-bit floats: what trn3's wide ScalarE and VectorE data paths take, "256
    BF16/FP16/FP8 input/output" (ScalarE) and "512 BF16/FP16/FP8" (VectorE) elements per
    cycle [A3] "Compute Engine Specifications"."""
    return bool(operands) and all(o.dtype in _SIXTEEN_BIT_FLOATS or o.dtype in _EIGHT_BIT_FLOATS
                                  for o in operands)


def _copy_perf_mode_operands(operands, target: Target) -> bool:
    """Whether a tensor_copy/tensor_scalar's data operands allow VectorE's performance mode:
    16-bit floats, or (``target.vector_perf_mode_8bit_dst``) an 8-bit float output from
    16-bit inputs."""
    if not target.vector_perf_mode_8bit_dst:
        return _all_16bit(operands)
    return bool(operands) and all(o.dtype in _SIXTEEN_BIT_FLOATS
                                  or (o.role in _OUTPUT_ROLES and o.dtype in _EIGHT_BIT_FLOATS)
                                  for o in operands)


def _innermost_step(operand) -> int | None:
    """The step, in elements, of ``operand``'s innermost (most minor) free dimension of more
    than one element (size-1 dimensions skipped); None for a tile without such a dimension
    or an operand recorded without strides (a view read at run time or reinterpreted as
    another element size: nothing says how it steps)."""
    strides = getattr(operand, "strides", ())
    shape = tuple(operand.shape)
    if not strides or len(strides) != len(shape):
        return None
    free = [st for size, st in list(zip(shape, strides))[1:] if size != 1]
    return free[-1] if free else None


def _innermost_contiguous(operand) -> bool:
    """Whether ``operand``'s innermost free dimension is physically contiguous: stride 1
    element, or no step known (``_innermost_step``)."""
    step = _innermost_step(operand)
    return step is None or step == 1


def _widest_innermost_stride_bytes(ins) -> int:
    """The largest step in bytes, over the instruction's SBUF/PSUM operands, of the most
    minor free dimension of more than one element (0 when none steps)."""
    steps = [abs(step) * o.itemsize for o in ins.reads + ins.writes
             if o.buffer != "hbm" and (step := _innermost_step(o)) is not None]
    return max(steps, default=0)


def _attr(ins, *names, default=None):
    for name in names:
        if name in ins.attrs:
            return ins.attrs[name]
    return default


def _op_name(value) -> str:
    """'add' from nl.add, 'np.add', a function, an enum, or a string."""
    if value is None:
        return ""
    name = getattr(value, "__name__", None) or getattr(value, "name", None) or str(value)
    return str(name).rsplit(".", 1)[-1].lower()


def _is_fp32(o) -> bool:
    return o.dtype in _FP32


def _alu_transcendental(ins) -> str | None:
    """The first power/rsqrt/reciprocal ALU op of a Vector/GpSimd instruction, if any."""
    for key in ("op", "op0", "op1"):
        name = _op_name(ins.attrs.get(key))
        if name in _ALU_TRANSCENDENTAL:
            return name
    return None


def _is_transpose(ins) -> bool:
    return ins.op == "nc_transpose" or (ins.op == "nc_matmul" and _attr(ins, "is_transpose", default=False))


def _transpose_data(ins):
    """The operand a TensorE transpose reads (None if the trace has none)."""
    return next((o for o in ins.reads if o.role in ("data", "stationary", "src")), None)


def _matmul_operands(ins):
    """(stationary, moving, M, N) of a matmul: M the stationary free size (output
    partitions), N the moving free size; attrs ``M``/``N`` win (hand-built traces)."""
    st = next((o for o in ins.reads if o.role == "stationary"), None)
    mv = next((o for o in ins.reads if o.role == "moving"), None)
    m = _attr(ins, "M", default=st.free_elems if st is not None else None)
    n = _attr(ins, "N", default=mv.free_elems if mv is not None else None)
    return st, mv, m, n


def tensor_engine_cost(ins, target: Target) -> tuple[float, str]:
    """TensorE cycles of a matmul or transpose."""
    if _is_transpose(ins):
        data = _transpose_data(ins)
        if data is None:
            raise CostModelError(f"instruction {ins.index} ({ins.op}): no data operand to transpose")
        p, f = data.partitions, data.free_elems
        cycles = max(p, min(target.matmul_min_cycles, f))
        rule = "transpose max(P, min(64, F))"
        if _is_fp32(data):
            cycles *= target.transpose_fp32_factor
            rule += f" x{target.transpose_fp32_factor} fp32"
        return cycles, rule
    if ins.op in ("nc_matmul", "nc_matmul_mx"):
        # nc_matmul_mx (v4): each PE multiplies four packed MX pairs per cycle, so an
        # instruction on [K, M] x4 / [K, N] x4 tiles takes a bf16 matmul's cycles for the same
        # M and N (4x the FLOPs) [A3] "Quad-MXFP8/MXFP4 Matmul Performance"
        st, mv, m, n = _matmul_operands(ins)
        if m is None or n is None:
            raise CostModelError(f"instruction {ins.index} ({ins.op}): needs attrs M and N or "
                                 "stationary/moving operands")
        fp32 = _attr(ins, "fp32", default=None)
        if fp32 is None:
            fp32 = any(_is_fp32(o) for o in (st, mv) if o is not None)
        cycles = max(min(target.matmul_min_cycles, m), n, m / target.load_stationary_speedup)
        rule = ("mx " if ins.op == "nc_matmul_mx" else "") + "matmul max(min(64, M), N, M/4)"
        if fp32:
            cycles *= target.matmul_fp32_factor
            rule += f" x{target.matmul_fp32_factor} fp32"
        return cycles, rule
    raise CostModelError(f"instruction {ins.index}: op {ins.op!r} on TensorE is not priced "
                         "(expected nc_matmul, nc_matmul_mx or nc_transpose)")


def tensor_utilization(ins, target: Target, cycles: float | None = None) -> float:
    """The fraction of TensorE's peak bf16 multiply-accumulate rate (rows x columns MACs per
    cycle) a matmul or transpose uses while it runs at its full rate: its K x M x N MACs
    over the cycles ``tensor_engine_cost`` gives it (``cycles``, if the caller has them
    already). A 64-cycle floor, a contraction over fewer than 128 partitions, fp32's four
    passes ("BF16-adjusted" peak) all lower it. A transpose of [P, F] is a matmul of the
    data (K = P, M = F) by a P x P identity (N = P)."""
    if cycles is None:
        cycles, _ = tensor_engine_cost(ins, target)
    if _is_transpose(ins):
        data = _transpose_data(ins)
        k, m, n = data.partitions, data.free_elems, data.partitions
    else:
        st, _, m, n = _matmul_operands(ins)
        k = st.partitions if st is not None else target.matmul_rows
    macs = k * m * n * (target.matmul_mx_pairs_per_pe if ins.op == "nc_matmul_mx" else 1)
    return min(1.0, macs / (target.matmul_rows * target.matmul_columns * cycles))


def vector_engine_cost(ins, target: Target) -> tuple[float, str]:
    cycles, rule = _vector_pass_cycles(ins, target)
    if ins.op == "scalar_tensor_tensor" and any(o.role == "reduce_res" for o in ins.writes):
        # its fused reduction read out of the accumulators, as tensor_scalar_reduce's
        r = target.vector_reduce_readout_cycles
        cycles, rule = cycles + r, rule + f" +{r} read-out"
    return cycles, rule


def _strided_factor(ins, target: Target) -> tuple[float, str]:
    """(factor, rule note) of NeuronCore-v2's strided access: an SBUF/PSUM operand whose most
    minor free dimension steps more than 16 bytes halves its interface's bandwidth, "roughly
    50% performance hit on the instructions" [A1] "Access pattern". It scales an
    instruction's per-element work, not its minimum, read-out or startup."""
    if target.strided_access_factor <= 1:          # trn2, trn3: no such rule, nothing to scan
        return 1.0, ""
    stride = _widest_innermost_stride_bytes(ins)
    if stride > target.strided_access_max_bytes:
        return target.strided_access_factor, f" x{target.strided_access_factor:g} stride {stride} B"
    return 1.0, ""


def _vector_pass_cycles(ins, target: Target) -> tuple[float, str]:
    f, note = _strided_factor(ins, target)
    if ins.op == "tensor_scalar_reduce":
        n, _ = _main_free(ins)
        r = target.vector_reduce_readout_cycles
        return (max(target.min_instruction_cycles, n * f) + r,
                f"tensor_scalar_reduce max(64, N) +{r} read-out" + note)
    cycles, rule = _vector_stream_cycles(ins, target)
    return cycles * f, rule + note


def _vector_stream_cycles(ins, target: Target) -> tuple[float, str]:
    """VectorE's per-element work of one instruction (not tensor_scalar_reduce's)."""
    n, _ = _main_free(ins)
    op = ins.op
    if op == "reciprocal":
        return target.vector_reciprocal_factor * n, f"reciprocal {target.vector_reciprocal_factor}N"
    if op == "tensor_reduce":
        # "N/2: both input and output data types are bfloat16 *and* the reduction operator
        # is add or maximum; N otherwise" [S] tensor_reduce: a bf16 row sum into an fp32
        # result (the norms' statistics) runs at N
        data = _inputs(ins)
        out = [o for o in ins.writes if o.role == "dst"]
        rop = _op_name(_attr(ins, "op", "reduce_op"))
        if (data and out and all(o.dtype == "bfloat16" for o in data[:1] + out)
                and rop in _REDUCE_FAST_OPS):
            return n / target.reduce_bf16_speedup, f"tensor_reduce N/{target.reduce_bf16_speedup} bf16 {rop}"
        return n, "tensor_reduce N"
    if op == "nc_transpose":
        return n, "vector transpose N"
    if op == "bn_aggr":
        c = target.bn_aggr_cycles_per_3_elems
        return c * n / 3, f"bn_aggr {c}N/3"
    if op == "memset" and ins.engine == "vector":
        dst = next((o for o in ins.writes if o.buffer != "hbm"), None)
        value = _attr(ins, "value", default=None)
        if dst is not None and dst.dtype in _SIXTEEN_BIT_FLOATS and value is not None and float(value) == 0.0:
            f = target.memset_zero_16bit_speedup
            return n / f, f"memset of zero into 16-bit N/{f}"
        return n, "memset N"
    if op == "quantize_mx":
        r = target.quantize_mx_elems_per_lane
        return n / r, f"quantize_mx N/{r}"
    if op == "exponential":
        return _exponential_cycles(ins, n, target)
    full = _full_inputs(ins, n)
    passes = max(1, len(full))
    cycles = passes * n
    rule = f"{passes} input pass{'es' if passes > 1 else ''} x N"
    two_inputs = op in ("tensor_tensor", "scalar_tensor_tensor", "tensor_copy_predicated") and len(full) == 2
    bufs = sorted(o.buffer for o in full) if two_inputs else []
    one_in_psum = bufs == ["psum", "sbuf"]
    if one_in_psum:
        # tensor_tensor: "If one input tile is in PSUM and the other is in SBUF, N Vector
        # Engine cycles" [S]; scalar_tensor_tensor has "approximately the same latency as a
        # regular tensor_tensor instruction" (its NKI 0.7 docstring, nki/api/nki/isa);
        # tensor_copy_predicated: "max(MIN_II, N)" "If src is from SBUF and predicate is from
        # PSUM or the other way around", else "max(MIN_II, 2N)" [S]
        cycles, rule = n, f"{op} N (one input in PSUM)"
    elif op == "scalar_tensor_tensor" and _stt_bf16_subtract_multiply(ins, n):
        # "N: data and operand1 are both bfloat16, op0=nl.subtract and op1=nl.multiply, and N
        # is even; 2*N otherwise" [S] scalar_tensor_tensor
        cycles, rule = n, "scalar_tensor_tensor N (bf16 subtract then multiply)"
    alu = _alu_transcendental(ins)
    if alu:
        # the ALU op's factor applies to the instruction's passes as priced above
        f = target.alu_transcendental_factor_vector
        return cycles * f, rule + f" x{f} ALU {alu}"
    if one_in_psum:
        return cycles, rule
    on_chip = _data_operands(full, ins)   # what the performance-mode conditions are about
    # the 2x performance mode is listed for tensor_tensor only (trn2 architecture guide,
    # "Vector Engine Performance Mode"), not for scalar_tensor_tensor
    if (op == "tensor_tensor" and bufs == ["sbuf", "sbuf"] and _all_16bit(on_chip)
            and target.vector_perf_mode_half > 1):
        return cycles / target.vector_perf_mode_half, rule + f" /{target.vector_perf_mode_half} perf mode"
    if op in ("tensor_copy", "tensor_scalar") and _copy_perf_mode_operands(on_chip, target):
        # trn2 architecture guide, "Vector Engine Performance Mode": 4x when input and
        # output are in SBUF, 16-bit and "have physically contiguous elements in the
        # inner-most (most minor) free dimension"; 2x when they are in SBUF but not
        # contiguous, or contiguous "but one of input and output tensors is in PSUM"
        in_psum = sum(o.buffer == "psum" for o in on_chip)
        contiguous = all(_innermost_contiguous(o) for o in on_chip)
        if in_psum == 0:
            speed = target.vector_perf_mode_full if contiguous else target.vector_perf_mode_half
        elif in_psum == 1 and contiguous:
            speed = target.vector_perf_mode_half
        else:
            speed = 1
        if speed > 1:
            return cycles / speed, rule + f" /{speed} perf mode" + ("" if contiguous else " (strided)")
    return cycles, rule


def _stt_bf16_subtract_multiply(ins, n: int) -> bool:
    """scalar_tensor_tensor's one-pass case [S]: data and operand1 bf16, (data - operand0) *
    operand1, an even N."""
    roles = {o.role: o for o in ins.reads}
    data, other = roles.get("data"), roles.get("operand1")
    return (data is not None and other is not None and data.dtype == other.dtype == "bfloat16"
            and _op_name(_attr(ins, "op0")) == "subtract" and _op_name(_attr(ins, "op1")) == "multiply"
            and n % 2 == 0)


def _exponential_cycles(ins, n: int, target: Target) -> tuple[float, str]:
    """nisa.exponential (VectorE, v4) at VectorE's full data path: 4 elements per lane per
    cycle when every operand is 16-bit (512 per cycle), 2 otherwise (256 per cycle) [A3]
    "Compute Engine Specifications". The guide's "4x the throughput compared to the
    nisa.activation (op=nl.exp) instruction" [A3] is this rate against ScalarE's 128-element
    fp32 path; against its 256-element bf16 path the data path allows 2x, not 4x."""
    narrow = _all_narrow(_data_operands(_full_inputs(ins, n), ins))
    rate = target.vector_perf_mode_full if narrow else target.vector_other_elems_per_lane
    return n / rate, f"exponential N/{rate} (data path)"


def scalar_engine_cost(ins, target: Target) -> tuple[float, str]:
    n, _ = _main_free(ins)
    narrow = _all_narrow(_data_operands(_full_inputs(ins, n), ins))   # trn2: 128 either way
    per_cycle = target.scalar_elems_per_cycle if narrow else target.scalar_elems_per_cycle_fp32
    rate = max(1.0, per_cycle / target.partitions)
    f, note = _strided_factor(ins, target)
    cycles = max(target.min_instruction_cycles, n * f / rate)
    rule = ("activation max(64, N)" if rate == 1 else f"activation max(64, N/{rate:g})") + note
    readout = any(o.role == "reduce_res" for o in ins.writes) or bool(_attr(ins, "reduce_res", default=False))
    if readout:
        cycles += target.activation_readout_cycles
        rule += f" +{target.activation_readout_cycles} accumulator read-out"
    return cycles, rule


def _local_gather_cycles(ins, target: Target, strided: float = 1.0) -> tuple[float, str]:
    """[S] local_gather: "150 + (num_valid_indices * num_elem_per_idx)/C GpSimd Engine
    cycles, where C = ((28 + t * num_elem_per_idx)/(t * num_elem_per_idx)) /
    min(4/dtype_size, num_elem_per_idx)", t = 4. C as written is cycles per gathered
    element (a 28-cycle loop per t indices, plus one cycle per element, over as many
    elements as fit a 4-byte word), so the elements are multiplied by it: dividing, as the
    text's "/C" reads, would gather 8 one-element indices per cycle on a software loop.
    Each GpSimd core (16 partitions) gathers its own ``num_valid_indices`` in parallel."""
    e = int(_attr(ins, "num_elem_per_idx", default=1))
    src = next((o for o in ins.reads if o.role == "src_buffer"), None)
    if src is None or "num_valid_indices" not in ins.attrs:
        raise CostModelError(f"instruction {ins.index} (local_gather): needs a src_buffer "
                             "operand and attr num_valid_indices")
    v = int(ins.attrs["num_valid_indices"])
    t = target.local_gather_indices_per_loop
    per_word = min(4 / src.itemsize, e)
    c = (target.local_gather_loop_cycles + t * e) / (t * e) / per_word
    start = target.local_gather_start_cycles
    return start + v * e * c * strided, f"local_gather {start} + V x E x {c:.3g}"


def gpsimd_engine_cost(ins, target: Target) -> tuple[float, str]:
    sf, note = _strided_factor(ins, target)
    if ins.op == "local_gather":
        cycles, rule = _local_gather_cycles(ins, target, sf)
        return cycles, rule + note
    n, _ = _main_free(ins)
    if ins.op in _PATTERN_OPS:
        return target.gpsimd_pattern_cycles + n * sf, f"{ins.op} {target.gpsimd_pattern_cycles} + N" + note
    passes = max(1, len(_full_inputs(ins, n)))
    rule = f"{passes} input pass{'es' if passes > 1 else ''} x N"
    alu = _alu_transcendental(ins)
    if alu:
        f = target.alu_transcendental_factor_gpsimd
        return passes * n * f * sf, rule + f" x{f} ALU {alu}" + note
    return passes * n * sf, rule + note


def compute_cost(ins, target: Target) -> InstructionCost:
    """Engine occupancy of one TensorE/VectorE/ScalarE/GpSimd instruction."""
    engine = ins.engine
    if engine == "tensor":
        cycles, rule = tensor_engine_cost(ins, target)
        lanes = max((o.partitions for o in ins.reads if o.buffer != "hbm"), default=0)
    else:
        if engine == "vector":
            cycles, rule = vector_engine_cost(ins, target)
        elif engine == "scalar":
            cycles, rule = scalar_engine_cost(ins, target)
        elif engine == "gpsimd":
            cycles, rule = gpsimd_engine_cost(ins, target)
        else:
            raise CostModelError(f"instruction {ins.index} ({ins.op}): engine={engine!r}; "
                                 f"expected one of {ENGINES}")
        # iota, affine_select and local_gather: AWS's cost is the whole instruction's,
        # "GPSIMD_START + N" with "GPSIMD_START ... the instruction startup overhead on
        # GpSimdE, roughly 150 engine cycles" [S] (the formulas above), so the engine's
        # fixed cost is not added a second time
        own_start = engine == "gpsimd" and (ins.op in _PATTERN_OPS or ins.op == "local_gather")
        static = 0.0 if own_start else target.static_cycles(engine)
        cycles = max(target.min_instruction_cycles, cycles) + static
        rule += f", min {target.min_instruction_cycles}, " + ("startup included" if own_start else f"+{static:g} static")
        _, lanes = _main_free(ins)
    return InstructionCost(engine, cycles, cycles / engine_hz(target, engine), rule, lanes)


def contiguous_runs(operand) -> int:
    """How many contiguous chunks (DMA buffers) ``operand``'s elements form.

    Innermost dimensions merge while their strides nest exactly; an on-chip operand's
    partition dimension always starts a new chunk (each partition is its own address
    range). Without strides (older traces) every partition row (on chip) or the whole
    tensor (HBM) counts as one chunk."""
    shape = tuple(operand.shape)
    n = math.prod(shape)
    if n == 0:
        return 0
    strides = getattr(operand, "strides", ())
    on_chip = operand.buffer != "hbm"
    if not strides or len(strides) != len(shape):
        return operand.partitions if on_chip else 1
    dims = list(zip(shape, strides))
    if on_chip:
        dims = dims[1:]  # the partition dim never merges
    dims = [(s, st) for s, st in dims if s != 1]
    run = 1
    # walk from the innermost dim outwards while the layout stays contiguous
    for size, st in reversed(dims):
        if st != run:
            break
        run *= size
    return max(1, n // max(1, run))


def dma_cost(ins, target: Target, bandwidth_scale: float = 1.0) -> DmaCost:
    """Queues, bytes and time of one DMA transfer (``bandwidth_scale``: share of the
    per-queue bandwidth it gets, < 1 when two cores share the HBM stack)."""
    if not ins.reads and not ins.writes:
        raise CostModelError(f"instruction {ins.index} ({ins.op}): DMA without operands")
    # Bytes through the engines: the larger side (a casting copy reads one size and writes
    # another; dma_compute reads every source).
    nbytes = max(int(_attr(ins, "bytes", default=0) or 0), int(_attr(ins, "src_bytes", default=0) or 0))
    if not nbytes:
        nbytes = max(sum(o.nbytes for o in ins.reads), sum(o.nbytes for o in ins.writes))
    operands = list(ins.reads) + list(ins.writes)
    hbm = sum(o.nbytes for o in operands if o.buffer == "hbm")
    on_chip = [o.partitions for o in operands if o.buffer != "hbm"]
    parts = max(on_chip) if on_chip else target.partitions
    per_queue_parts = max(1, target.partitions // target.dma_queues)
    queues = max(1, min(target.dma_queues, math.ceil(parts / per_queue_parts)))
    per_queue_bw = target.dma_bytes_per_s / target.dma_queues * bandwidth_scale
    if ins.op == "dma_transpose" or _attr(ins, "transpose", default=False):
        # All 16 engines cooperate on a DMA transpose, at a documented fraction of the
        # copy throughput (HBM->SBUF 90%, SBUF->SBUF 50%) that covers its element-wise
        # access pattern: no descriptor term.
        queues = target.dma_queues
        from_hbm = any(o.buffer == "hbm" for o in ins.reads)
        eff = target.dma_transpose_hbm_efficiency if from_hbm else target.dma_transpose_sbuf_efficiency
        share = nbytes / queues
        return DmaCost(queues, nbytes, share, share / (per_queue_bw * eff), target.dma_transfer_gap_s,
                       target.dma_latency_s, hbm, 0, f"dma transpose {eff:.0%} of copy bandwidth",
                       target.dma_transfer_handoff_s)
    # A descriptor is contiguous on both sides: the finer side sets the count.
    descriptors = max((contiguous_runs(o) for o in operands), default=1)
    share = nbytes / queues
    data = (share + descriptors / queues * target.dma_descriptor_bytes) / per_queue_bw
    rule = f"{queues} queues, {descriptors} chunks of {nbytes / max(1, descriptors):.0f} B"
    return DmaCost(queues, nbytes, share, data, target.dma_transfer_gap_s, target.dma_latency_s,
                   hbm, descriptors, rule, target.dma_transfer_handoff_s)


def dependency_latency_seconds(engine: str, target: Target) -> float:
    """Extra wait of a consumer of a result (read after write) after its producer on
    ``engine`` ends: the Vector/Scalar/GpSimd write-back latency, TensorE's pipeline."""
    if engine in ("vector", "scalar", "gpsimd"):
        return target.dependency_latency_cycles / engine_hz(target, engine)
    if engine == "tensor":
        return target.matmul_latency_cycles / target.tensor_hz
    return 0.0

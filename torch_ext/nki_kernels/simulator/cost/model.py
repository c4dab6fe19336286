"""Per-instruction cost rules: how long one traced instruction occupies its engine.

Every number comes from the target table in ``simulator/hardware.py`` (which names its
sources); this module only applies the documented rules. ``N`` below is the number of
elements per partition of an instruction's input tile (its free size), ``P`` its partition
count. Engines work on one element per partition per cycle (one lane per partition), so
cycles depend on ``N`` only: a tile with ``P < 128`` costs the same as a full one and
wastes ``128 - P`` lanes.

TensorE (``tensor_hz``)
    ``nc_matmul``: ``max(min(64, M), N)`` cycles, M the stationary free size (output
    partitions), N the moving free size (output columns); x4 when an operand is float32
    (fp32 runs in four passes: 20 vs 79 TFLOPS; tfloat32 runs at the bf16 rate).
    ``nc_transpose`` on TensorE (and ``nc_matmul(is_transpose=True)``): ``max(P, min(64, F))``
    cycles for a ``[P, F]`` input; fp32 x2 with v3+ transpose mode (x4 on v2).
    No static overhead: TensorE loads the next stationary operand while the current
    moving operand streams, so back-to-back matmuls issue at the rate above.

VectorE (``vector_hz``)
    one input pass ``N`` cycles, two full-size inputs (``tensor_tensor``,
    ``scalar_tensor_tensor``, ``select_reduce``...) ``2N``; ``tensor_tensor`` with one input
    in PSUM and the other in SBUF ``N``; ``tensor_reduce`` ``N`` (``N/2`` for bf16 add/max);
    ``reciprocal`` ``8N``; ``nc_transpose`` (32x32) ``N``; an ALU ``power``/``rsqrt``/
    ``reciprocal`` op inside tensor_scalar/tensor_tensor/... x8 (iterative, like reciprocal). NeuronCore-v3+ performance mode:
    ``tensor_copy``/``tensor_scalar`` with every operand bf16/fp16 run 4x faster when all
    operands are in SBUF, 2x when one is in PSUM; ``tensor_tensor`` with both inputs in SBUF
    and every operand bf16/fp16 runs 2x faster. Then ``max(MIN_II=64, cycles)`` plus the
    static SBUF access overhead (60 cycles).

ScalarE (``scalar_hz``)
    ``activation`` and anything else on ScalarE: ``max(64, N / r)`` cycles, ``r`` = elements
    per partition per cycle (1, or 2 for 16-bit types on trn3); +64 cycles when the
    instruction reads its accumulator out (``reduce_res``); plus the static overhead.

GpSimd (``gpsimd_hz``)
    ``iota``/``affine_select``: ``150 + N``; other instructions as VectorE without its
    performance mode, x4 with an ALU ``power``/``rsqrt``/``reciprocal`` op (~4x slower than
    ScalarE's rsqrt); plus the static overhead.

DMA (16 queues, ``dma_bytes_per_s / 16`` each)
    A transfer is spread over ``ceil(P / 8)`` queues (each DMA engine serves 8 SBUF
    partitions; HBM to HBM uses all 16), each moving an equal share of the bytes.
    Each queue pays the fixed cost ``dma_fixed_s`` per transfer and moves its bytes at
    the per-queue bandwidth. The fixed cost (descriptor generation, semaphore-to-start) is
    latency that a queue overlaps with moving the previous transfer's data: a queue is
    occupied ``max(fixed, data)`` per transfer and the transfer completes ``fixed + data``
    after it starts. This reproduces the documented behaviour: a lone transfer takes fixed
    + bytes/bandwidth; a stream of transfers with >= ~2-4 KiB per partition saturates the
    bandwidth; small transfers are bound by the fixed cost (descriptor rate), not bandwidth.
    A DMA transpose (``dma_transpose``) uses all 16 queues at 90% (from HBM) or 50% (SBUF
    to SBUF) of the copy bandwidth. Bytes are those of the larger side (casts, dma_compute).

Dependencies: a consumer of a Vector/Scalar/GpSimd result starts at the earliest
``dependency_latency_cycles`` (100, of the producer's clock) after the producer ends
(results committed to SBUF/PSUM before the next instruction reads them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..hardware import Target
from ..trace import ENGINES

COMPUTE_ENGINES = tuple(e for e in ENGINES if e != "dma")

_SIXTEEN_BIT_FLOATS = frozenset({"bfloat16", "float16"})
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
    data_seconds: float    # per queue: bytes_per_queue / per-queue bandwidth
    fixed_seconds: float   # per queue: fixed cost of a transfer
    hbm_bytes: int         # bytes read from or written to HBM

    @property
    def occupancy_seconds(self) -> float:
        """How long each queue is occupied (fixed cost overlapped with earlier data)."""
        return max(self.fixed_seconds, self.data_seconds)

    @property
    def latency_seconds(self) -> float:
        """From the start of the transfer on a queue to the completion of its share."""
        return self.fixed_seconds + self.data_seconds


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


def _all_16bit(operands) -> bool:
    return bool(operands) and all(o.dtype in _SIXTEEN_BIT_FLOATS for o in operands)


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


def tensor_engine_cost(ins, target: Target) -> tuple[float, str]:
    """TensorE cycles of a matmul or transpose."""
    if ins.op == "nc_transpose" or (ins.op == "nc_matmul" and _attr(ins, "is_transpose", default=False)):
        data = next((o for o in ins.reads if o.role in ("data", "stationary", "src")), None)
        if data is None:
            raise CostModelError(f"instruction {ins.index} ({ins.op}): no data operand to transpose")
        p, f = data.partitions, data.free_elems
        cycles = max(p, min(target.matmul_min_cycles, f))
        rule = "transpose max(P, min(64, F))"
        if _is_fp32(data):
            cycles *= target.transpose_fp32_factor
            rule += f" x{target.transpose_fp32_factor} fp32"
        return cycles, rule
    if ins.op == "nc_matmul":
        st = next((o for o in ins.reads if o.role == "stationary"), None)
        mv = next((o for o in ins.reads if o.role == "moving"), None)
        m = _attr(ins, "M", default=st.free_elems if st is not None else None)
        n = _attr(ins, "N", default=mv.free_elems if mv is not None else None)
        if m is None or n is None:
            raise CostModelError(f"instruction {ins.index} (nc_matmul): needs attrs M and N or "
                                 "stationary/moving operands")
        fp32 = _attr(ins, "fp32", default=None)
        if fp32 is None:
            fp32 = any(_is_fp32(o) for o in (st, mv) if o is not None)
        cycles = max(min(target.matmul_min_cycles, m), n)
        rule = "matmul max(min(64, M), N)"
        if fp32:
            cycles *= target.matmul_fp32_factor
            rule += f" x{target.matmul_fp32_factor} fp32"
        return cycles, rule
    raise CostModelError(f"instruction {ins.index}: op {ins.op!r} on TensorE is not priced "
                         "(expected nc_matmul or nc_transpose)")


def vector_engine_cost(ins, target: Target) -> tuple[float, str]:
    n, _ = _main_free(ins)
    op = ins.op
    if op == "reciprocal":
        return target.vector_reciprocal_factor * n, f"reciprocal {target.vector_reciprocal_factor}N"
    if op == "tensor_reduce":
        data = _inputs(ins)
        rop = _op_name(_attr(ins, "op", "reduce_op"))
        if data and data[0].dtype == "bfloat16" and rop in _REDUCE_FAST_OPS:
            return n / target.reduce_bf16_speedup, f"tensor_reduce N/{target.reduce_bf16_speedup} bf16 {rop}"
        return n, "tensor_reduce N"
    if op == "nc_transpose":
        return n, "vector transpose N"
    full = _full_inputs(ins, n)
    passes = max(1, len(full))
    cycles = passes * n
    rule = f"{passes} input pass{'es' if passes > 1 else ''} x N"
    alu = _alu_transcendental(ins)
    if alu:
        f = target.alu_transcendental_factor_vector
        return cycles * f, rule + f" x{f} ALU {alu}"
    # The data tensors the performance-mode conditions are about: full-size inputs and the
    # output (per-partition scalar operands such as a (P,1) fp32 bias do not count).
    on_chip = full + [o for o in ins.writes if o.role == "dst" and o.buffer != "hbm"]
    if op == "tensor_tensor" and len(full) == 2:
        bufs = sorted(o.buffer for o in full)
        if bufs == ["psum", "sbuf"]:
            return n, "tensor_tensor N (one input in PSUM)"
        if bufs == ["sbuf", "sbuf"] and _all_16bit(on_chip) and target.vector_perf_mode_half > 1:
            return cycles / target.vector_perf_mode_half, rule + f" /{target.vector_perf_mode_half} perf mode"
    if op in ("tensor_copy", "tensor_scalar") and _all_16bit(on_chip):
        in_psum = sum(o.buffer == "psum" for o in on_chip)
        speed = target.vector_perf_mode_full if in_psum == 0 else target.vector_perf_mode_half
        if speed > 1:
            return cycles / speed, rule + f" /{speed} perf mode"
    return cycles, rule


def scalar_engine_cost(ins, target: Target) -> tuple[float, str]:
    n, _ = _main_free(ins)
    sixteen = _all_16bit(_full_inputs(ins, n) + [o for o in ins.writes if o.role == "dst" and o.buffer != "hbm"])
    per_cycle = target.scalar_elems_per_cycle if sixteen else target.scalar_elems_per_cycle_fp32
    rate = max(1.0, per_cycle / target.partitions)
    cycles = max(target.min_instruction_cycles, n / rate)
    rule = "activation max(64, N)" if rate == 1 else f"activation max(64, N/{rate:g})"
    readout = any(o.role == "reduce_res" for o in ins.writes) or bool(_attr(ins, "reduce_res", default=False))
    if readout:
        cycles += target.activation_readout_cycles
        rule += f" +{target.activation_readout_cycles} accumulator read-out"
    return cycles, rule


def gpsimd_engine_cost(ins, target: Target) -> tuple[float, str]:
    n, _ = _main_free(ins)
    if ins.op in _PATTERN_OPS:
        return target.gpsimd_pattern_cycles + n, f"{ins.op} {target.gpsimd_pattern_cycles} + N"
    passes = max(1, len(_full_inputs(ins, n)))
    rule = f"{passes} input pass{'es' if passes > 1 else ''} x N"
    alu = _alu_transcendental(ins)
    if alu:
        f = target.alu_transcendental_factor_gpsimd
        return passes * n * f, rule + f" x{f} ALU {alu}"
    return passes * n, rule


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
        cycles = max(target.min_instruction_cycles, cycles) + target.static_overhead_cycles
        rule += f", min {target.min_instruction_cycles}, +{target.static_overhead_cycles} static"
        _, lanes = _main_free(ins)
    return InstructionCost(engine, cycles, cycles / engine_hz(target, engine), rule, lanes)


def dma_cost(ins, target: Target) -> DmaCost:
    """Queues, bytes and time of one DMA transfer."""
    if not ins.reads and not ins.writes:
        raise CostModelError(f"instruction {ins.index} ({ins.op}): DMA without operands")
    # Bytes through the engines: the larger side (a casting copy reads one size and writes
    # another; dma_compute reads every source).
    nbytes = max(int(_attr(ins, "bytes", default=0) or 0), int(_attr(ins, "src_bytes", default=0) or 0))
    if not nbytes:
        nbytes = max(sum(o.nbytes for o in ins.reads), sum(o.nbytes for o in ins.writes))
    hbm = sum(o.nbytes for o in list(ins.reads) + list(ins.writes) if o.buffer == "hbm")
    on_chip = [o.partitions for o in list(ins.reads) + list(ins.writes) if o.buffer != "hbm"]
    parts = max(on_chip) if on_chip else target.partitions
    per_queue_parts = max(1, target.partitions // target.dma_queues)
    queues = max(1, min(target.dma_queues, math.ceil(parts / per_queue_parts)))
    per_queue_bw = target.dma_bytes_per_s / target.dma_queues
    if ins.op == "dma_transpose" or _attr(ins, "transpose", default=False):
        # All 16 engines cooperate on a DMA transpose, at a documented fraction of the
        # copy throughput (HBM->SBUF 90%, SBUF->SBUF 50%).
        queues = target.dma_queues
        from_hbm = any(o.buffer == "hbm" for o in ins.reads)
        per_queue_bw *= target.dma_transpose_hbm_efficiency if from_hbm else target.dma_transpose_sbuf_efficiency
    share = nbytes / queues
    return DmaCost(queues, nbytes, share, share / per_queue_bw, target.dma_fixed_s, hbm)


def dependency_latency_seconds(engine: str, target: Target) -> float:
    """Extra wait of a consumer after a producer on ``engine`` ends."""
    if engine in ("vector", "scalar", "gpsimd"):
        return target.dependency_latency_cycles / engine_hz(target, engine)
    return 0.0

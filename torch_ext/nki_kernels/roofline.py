"""Per-op limits and modeled eager-PyTorch baselines on a NeuronCore (all MODELED).

One function per op, with the op's public signature plus ``lnc=`` (the logical-core
degree: how many physical NeuronCores work on the call, 1 or 2) and ``target=``; the op
registry (``registry.py``) names it as the op's limit and eager model.

The **limit** of an op call is the least time any kernel could take on the ``lnc``
NeuronCores of the target (each with its own DMA engines, TensorE and ScalarE): the
largest of

* compulsory HBM traffic (every input read once, every output written once) over the
  practical DMA bandwidth of a core (``dma_bytes_per_s``);
* matmul FLOPs over the TensorE peak (bf16/fp16 peak, or the fp32 peak for fp32 inputs);
* transcendental elements (exp, gelu, silu, rsqrt, reciprocal...) over the ScalarE rate
  (``scalar_hz * scalar_elems_per_cycle``; fp32 rate for fp32 data).

A kernel's *efficiency* is ``limit / modeled latency`` (1.0 = at the limit).

The **modeled eager baseline** is what eager PyTorch runs for the same call, one ATen op
at a time, as TorchNeuron's eager mode does (each op its own compiled program, every
intermediate written to HBM and read back by the next op). Each op is charged *at its own
limit* by the rule above, with zero launch overhead and perfect engine use. That is the
best case eager could ever reach, so ``speedup = eager / modeled kernel`` is a lower bound
on the speedup against any real eager run. The op sequences are those ATen dispatches on
CPU for these calls (checked with a ``TorchDispatchMode``), with two simplifications that
only make eager faster: SDPA's math path is charged in the input dtype (the CPU math path
upcasts bf16 to fp32) and ``_safe_softmax`` as a single softmax pass.

Every function takes tensors (or anything with ``.shape``, ``.dtype`` and
``.element_size()``, e.g. ``torch.empty(shape, dtype=..., device="meta")``).

**Backward rows** (ops with a backward kernel, ``registry.Backward``): the limit is the
backward's compulsory work (``Work``, as above: the gradients' reads and writes); the
modeled **eager-autograd baseline** is the sequence of ATen ops PyTorch's autograd runs
for the backward of the op's eager composition (``eager_autograd``: recorded on meta
tensors with a ``TorchDispatchMode``, so it is the sequence torch 2.13 actually
dispatches, not a hand list), each charged at its own limit by the same rule (every input
read from and every output written to HBM; view ops free). The forward ops eager ran are
not counted: the baseline is the backward pass alone, as the kernel row is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .simulator.hardware import DEFAULT_TARGET, Target, get_target

_FP32_NAMES = ("float32", "float64")


def _dtype_name(dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def _nbytes(t) -> int:
    return math.prod(t.shape) * t.element_size()


@dataclass(frozen=True)
class Work:
    """What one op (or one ATen op of the eager sequence) must do at minimum."""

    name: str
    hbm_bytes: int = 0
    matmul_flops: int = 0
    transcendentals: int = 0
    fp32: bool = False          # fp32 data: fp32 TensorE peak and ScalarE fp32 rate

    def terms(self, target: Target, cores: int = 1) -> dict[str, float]:
        """Seconds per resource of ``cores`` physical cores working together (a logical
        core of degree ``cores``: each has its own DMA engines, TensorE and ScalarE):
        {"dma", "tensor", "scalar"}. The cores of a logical core share one HBM stack ("Each
        bank is shared by two physical NeuronCore-v3", the trn2 architecture guide), so
        their DMA moves at most the stack's bandwidth together, as in the cost model's
        schedule (trn2: 725 GB/s, not 2 x 368; until 2026-12-06 the limit took 2 x 368,
        which no modeled kernel could reach)."""
        peak = target.tensor_peak_fp32_flops if self.fp32 else target.tensor_peak_bf16_flops
        per_cycle = target.scalar_elems_per_cycle_fp32 if self.fp32 else target.scalar_elems_per_cycle
        return {
            "dma": self.hbm_bytes / (cores * target.dma_bytes_per_s * target.hbm_share(cores)),
            "tensor": self.matmul_flops / (cores * peak),
            "scalar": self.transcendentals / (cores * target.scalar_hz * per_cycle),
        }

    def seconds(self, target: Target, cores: int = 1) -> float:
        return max(self.terms(target, cores).values())

    def bound(self, target: Target, cores: int = 1) -> str:
        terms = self.terms(target, cores)
        return max(terms, key=terms.get)


@dataclass(frozen=True)
class EagerStep:
    work: Work
    us: float                   # modeled: this ATen op at its own limit
    bound: str


@dataclass(frozen=True)
class Roofline:
    """Limit and modeled eager baseline of one op call on one target (all MODELED)."""

    op: str
    target: str
    lnc: int                                # logical-core degree: physical cores working on the call
    work: Work                              # the fused op's compulsory work
    limit_us: float
    limit_terms_us: dict[str, float]        # {"dma", "tensor", "scalar"}
    bound: str                              # the term that sets the limit
    eager_steps: tuple[EagerStep, ...] = field(default_factory=tuple)

    @property
    def eager_us(self) -> float:
        return sum(s.us for s in self.eager_steps)

    @property
    def eager_hbm_bytes(self) -> int:
        return sum(s.work.hbm_bytes for s in self.eager_steps)

    def efficiency(self, modeled_us: float) -> float:
        return self.limit_us / modeled_us if modeled_us > 0 else float("nan")

    def speedup(self, modeled_us: float) -> float:
        return self.eager_us / modeled_us if modeled_us > 0 else float("nan")


def _roofline(op: str, work: Work, eager: list[Work], target, lnc: int) -> Roofline:
    """The op's limit and its eager baseline on a logical core of degree ``lnc``: at LNC=2
    the kernel has two physical cores, and so does every eager ATen op (neuronx-cc
    compiles each at the same degree), so both are charged on two cores' resources."""
    tgt = get_target(target)
    if lnc not in (1, 2) or lnc > tgt.max_logical_cores:
        raise ValueError(f"lnc={lnc!r} is not supported on {tgt.name}; expected 1"
                         + (" or 2" if tgt.max_logical_cores > 1 else " (LNC=2 starts with Trainium2)"))
    terms = work.terms(tgt, lnc)
    steps = tuple(EagerStep(w, w.seconds(tgt, lnc) * 1e6, w.bound(tgt, lnc)) for w in eager)
    return Roofline(op, tgt.name, lnc, work, max(terms.values()) * 1e6,
                    {k: v * 1e6 for k, v in terms.items()}, max(terms, key=terms.get), steps)


def _is_fp32(t) -> bool:
    return _dtype_name(t.dtype) in _FP32_NAMES


def _elementwise(name, reads_bytes, writes_bytes, transcendentals=0, fp32=False) -> Work:
    return Work(name, int(reads_bytes + writes_bytes), 0, int(transcendentals), fp32)


# ----------------------------------------------------------------------------- attention

def _causal_pairs(sq: int, sk: int) -> int:
    """(query, key) pairs a top-left-aligned causal mask keeps: key j <= query i."""
    full = min(sq, sk)
    return full * (full + 1) // 2 + max(0, sq - sk) * sk


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale=None, enable_gqa: bool = False,
                                 lnc: int = 1, target: str | Target = DEFAULT_TARGET) -> Roofline:
    """SDPA ``softmax(q k^T * scale + mask) v`` with q ``[B, H, Sq, D]``, k/v ``[B, Hkv, Sk, D]``.

    Eager baseline (SDPA math path): q*sqrt(scale), k*sqrt(scale), [repeat_interleave of
    k/v for grouped-query heads], bmm q k^T, [causal mask build], [bool mask -> float],
    [mask add], softmax, bmm p v; in the input dtype.
    """
    b, h, sq, d = query.shape
    hkv, sk, dv = key.shape[1], key.shape[2], value.shape[-1]
    it = query.element_size()
    fp32 = _is_fp32(query)
    pairs = b * h * (_causal_pairs(sq, sk) if is_causal else sq * sk)
    rows = b * h * sq
    io = _nbytes(query) + _nbytes(key) + _nbytes(value) + b * h * sq * dv * it
    mask_bytes = _nbytes(attn_mask) if attn_mask is not None else 0
    work = Work("scaled_dot_product_attention", io + mask_bytes, 2 * pairs * (d + dv), pairs + rows, fp32)

    scores = b * h * sq * sk * it
    eager = [
        _elementwise("mul (q * sqrt(scale))", _nbytes(query), _nbytes(query), fp32=fp32),
        _elementwise("mul (k * sqrt(scale))", _nbytes(key), _nbytes(key), fp32=fp32),
    ]
    k_bytes, v_bytes = _nbytes(key), _nbytes(value)
    if hkv != h:
        k_rep, v_rep = b * h * sk * d * it, b * h * sk * dv * it
        eager += [_elementwise("repeat_interleave (k)", k_bytes, k_rep, fp32=fp32),
                  _elementwise("repeat_interleave (v)", v_bytes, v_rep, fp32=fp32)]
        k_bytes, v_bytes = k_rep, v_rep
    eager.append(Work("bmm (q k^T)", _nbytes(query) + k_bytes + scores, 2 * b * h * sq * sk * d, 0, fp32))
    mask_read = 0
    if is_causal:
        eager.append(_elementwise("ones+tril+where (causal mask)", 0, sq * sk * (1 + 1 + it), fp32=fp32))
        mask_read = sq * sk * it
    elif attn_mask is not None:
        mask_read = mask_bytes
        if _dtype_name(attn_mask.dtype) == "bool":
            n_mask = math.prod(attn_mask.shape)
            eager.append(_elementwise("where (bool mask -> float)", n_mask, n_mask * it, fp32=fp32))
            mask_read = n_mask * it
    if mask_read:
        eager.append(_elementwise("add (mask)", scores + mask_read, scores, fp32=fp32))
    eager.append(_elementwise("softmax", scores, scores, b * h * sq * sk + rows, fp32))
    eager.append(Work("bmm (p v)", scores + v_bytes + b * h * sq * dv * it, 2 * b * h * sq * sk * dv, 0, fp32))
    return _roofline("scaled_dot_product_attention", work, eager, target, lnc)


def _eager_sdpa_math(query, key, value, attn_mask, is_causal, scale):
    """SDPA's math path as eager autograd sees it (the same ATen ops as the forward model
    above): q·sqrt(scale), k·sqrt(scale), repeat_interleave for grouped heads, bmm, causal
    mask, mask add, softmax, bmm; in the input dtype."""
    import torch

    h, hkv = query.shape[1], key.shape[1]
    root = math.sqrt(scale)
    q, k, v = query * root, key * root, value
    if hkv != h:
        k, v = k.repeat_interleave(h // hkv, dim=1), v.repeat_interleave(h // hkv, dim=1)
    s = q @ k.transpose(-2, -1)
    if is_causal:
        # as the math path: a -inf bias built from tril and added (its backward passes the
        # gradient through; the bias itself needs none)
        keep = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).tril()
        bias = torch.zeros(keep.shape, dtype=s.dtype, device=s.device).masked_fill(~keep, float("-inf"))
        s = s + bias
    if attn_mask is not None:
        s = s + attn_mask
    return torch.softmax(s, dim=-1) @ v


def scaled_dot_product_attention_backward(grad_out, query, key, value, out, lse, attn_mask=None,
                                          is_causal: bool = False, scale=None, lnc: int = 1,
                                          target: str | Target = DEFAULT_TARGET) -> Roofline:
    """Attention's backward (FlashAttention-2: P recomputed from Q, K and the saved lse).

    Limit: reads q, k, v, O, dO, lse (and the mask), writes dq, dk, dv; matmuls S = Q·Kᵀ
    (recomputed), dP = dO·Vᵀ, dV = Pᵀ·dO, dK = dSᵀ·Q, dQ = dS·K over the (query, key) pairs
    the mask keeps (causal: the lower triangle); one exp per pair.
    Eager autograd: the backward of SDPA's math path (``_eager_sdpa_math``), recorded
    (``eager_autograd``): bmm's, softmax backward, the scale multiplies; every [Sq, Sk]
    intermediate through HBM."""
    b, h, sq, d = query.shape
    hkv, sk, dv = key.shape[1], key.shape[2], value.shape[-1]
    scale = d ** -0.5 if scale is None else scale
    pairs = b * h * (_causal_pairs(sq, sk) if is_causal else sq * sk)
    reads = (grad_out, query, key, value, out, lse) + ((attn_mask,) if attn_mask is not None else ())
    work = Work("scaled_dot_product_attention backward",
                sum(_nbytes(t) for t in reads) + _nbytes(query) + _nbytes(key) + _nbytes(value),
                2 * pairs * (3 * d + 2 * dv), pairs, _is_fp32(query))
    mask = attn_mask
    if mask is not None and _dtype_name(mask.dtype) == "bool":
        import torch

        mask = torch.empty(tuple(mask.shape), dtype=query.dtype, device="meta")
    return backward_roofline("scaled_dot_product_attention backward", work, _eager_sdpa_math,
                             (query, key, value, mask, is_causal, scale), (0, 1, 2), target, lnc)


# ----------------------------------------------------------------------------- norms

def _rms_norm_eager(x, weight, prefix: str = "") -> list[Work]:
    """ATen ops of F.rms_norm (CompositeImplicit): upcast, pow, mean, add eps, rsqrt, mul, mul w, downcast."""
    n = math.prod(x.shape)
    rows = n // x.shape[-1]
    it = x.element_size()
    f32 = 4
    steps = []
    if it != f32:
        steps.append(_elementwise(prefix + "_to_copy (to fp32)", n * it, n * f32))
    steps += [
        _elementwise(prefix + "pow", n * f32, n * f32, fp32=True),
        _elementwise(prefix + "mean", n * f32, rows * f32, fp32=True),
        _elementwise(prefix + "add (eps)", rows * f32, rows * f32, fp32=True),
        _elementwise(prefix + "rsqrt", rows * f32, rows * f32, rows, fp32=True),
        _elementwise(prefix + "mul (x * rstd)", n * f32 + rows * f32, n * f32, fp32=True),
    ]
    if weight is not None:
        steps.append(_elementwise(prefix + "mul (weight)", n * f32 + _nbytes(weight), n * f32, fp32=True))
    if it != f32:
        steps.append(_elementwise(prefix + "_to_copy (to input dtype)", n * f32, n * it))
    return steps


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5,
               lnc: int = 1, target: str | Target = DEFAULT_TARGET) -> Roofline:
    """``F.layer_norm`` over the last ``len(normalized_shape)`` dims. Eager: one
    ``native_layer_norm`` (it also writes fp32 mean and rstd per row)."""
    hidden = math.prod(normalized_shape)
    rows = math.prod(input.shape) // hidden
    params = sum(_nbytes(p) for p in (weight, bias) if p is not None)
    fp32 = _is_fp32(input)
    work = Work("layer_norm", 2 * _nbytes(input) + params, 0, rows, fp32)
    eager = [Work("native_layer_norm", 2 * _nbytes(input) + params + 2 * rows * 4, 0, rows, fp32)]
    return _roofline("layer_norm", work, eager, target, lnc)


def rms_norm(input, normalized_shape, weight=None, eps=None, lnc: int = 1,
             target: str | Target = DEFAULT_TARGET) -> Roofline:
    """``F.rms_norm``. Eager: its ATen decomposition (see ``_rms_norm_eager``)."""
    hidden = math.prod(normalized_shape)
    rows = math.prod(input.shape) // hidden
    params = _nbytes(weight) if weight is not None else 0
    work = Work("rms_norm", 2 * _nbytes(input) + params, 0, rows, _is_fp32(input))
    return _roofline("rms_norm", work, _rms_norm_eager(input, weight), target, lnc)


def fused_add_rms_norm(input, residual, weight=None, eps=None,
                       lnc: int = 1, target: str | Target = DEFAULT_TARGET) -> Roofline:
    """``(rms_norm(input + residual), input + residual)``. Eager: add, then F.rms_norm's ops."""
    rows = math.prod(input.shape) // input.shape[-1]
    params = _nbytes(weight) if weight is not None else 0
    n_bytes = _nbytes(input)
    work = Work("fused_add_rms_norm", 4 * n_bytes + params, 0, rows, _is_fp32(input))
    eager = [_elementwise("add (input + residual)", 2 * n_bytes, n_bytes, fp32=_is_fp32(input))]
    eager += _rms_norm_eager(input, weight)
    return _roofline("fused_add_rms_norm", work, eager, target, lnc)


# ----------------------------------------------------------------------------- activations

def _unary_activation(op: str, input, target, lnc) -> Roofline:
    n = math.prod(input.shape)
    work = _elementwise(op, _nbytes(input), _nbytes(input), n, _is_fp32(input))
    return _roofline(op, work, [work], target, lnc)


def gelu(input, approximate: str = "none", lnc: int = 1,
         target: str | Target = DEFAULT_TARGET) -> Roofline:
    """``F.gelu``. Eager: one ``gelu``."""
    return _unary_activation("gelu", input, target, lnc)


def silu(input, lnc: int = 1,
         target: str | Target = DEFAULT_TARGET) -> Roofline:
    """``F.silu``. Eager: one ``silu``."""
    return _unary_activation("silu", input, target, lnc)


def _act_and_mul(op: str, act: str, input, target, lnc) -> Roofline:
    n_out = math.prod(input.shape) // 2
    it = input.element_size()
    fp32 = _is_fp32(input)
    work = _elementwise(op, 2 * n_out * it, n_out * it, n_out, fp32)
    eager = [_elementwise(f"{act} (x[..., :d])", n_out * it, n_out * it, n_out, fp32),
             _elementwise("mul (by x[..., d:])", 2 * n_out * it, n_out * it, fp32=fp32)]
    return _roofline(op, work, eager, target, lnc)


def silu_and_mul(input, lnc: int = 1,
                 target: str | Target = DEFAULT_TARGET) -> Roofline:
    """``silu(x[..., :d]) * x[..., d:]``. Eager: silu, mul."""
    return _act_and_mul("silu_and_mul", "silu", input, target, lnc)


def gelu_and_mul(input, approximate: str = "none", lnc: int = 1,
                 target: str | Target = DEFAULT_TARGET) -> Roofline:
    """``gelu(x[..., :d]) * x[..., d:]``. Eager: gelu, mul."""
    return _act_and_mul("gelu_and_mul", "gelu", input, target, lnc)


def softmax(input, dim: int = -1, lnc: int = 1,
            target: str | Target = DEFAULT_TARGET) -> Roofline:
    """``torch.softmax``. Eager: one ``_softmax`` (exp per element, one reciprocal per row)."""
    n = math.prod(input.shape)
    rows = n // input.shape[dim]
    work = _elementwise("softmax", _nbytes(input), _nbytes(input), n + rows, _is_fp32(input))
    return _roofline("softmax", work, [work], target, lnc)


def apply_rotary_pos_emb(q, k, cos, sin, lnc: int = 1,
                         target: str | Target = DEFAULT_TARGET) -> Roofline:
    """transformers' Llama rotary: ``x * cos + rotate_half(x) * sin`` for q and k.

    Eager per tensor: mul (x*cos), neg (second half), cat (rotate_half), mul (*sin), add.
    """
    fp32 = _is_fp32(q)
    cs = _nbytes(cos) + _nbytes(sin)
    work = _elementwise("apply_rotary_pos_emb", _nbytes(q) + _nbytes(k) + cs, _nbytes(q) + _nbytes(k), 0, fp32)
    eager = []
    for name, x in (("q", q), ("k", k)):
        nb = _nbytes(x)
        eager += [
            _elementwise(f"mul ({name} * cos)", nb + _nbytes(cos), nb, fp32=fp32),
            _elementwise(f"neg ({name}[..., d/2:])", nb // 2, nb // 2, fp32=fp32),
            _elementwise(f"cat (rotate_half {name})", nb, nb, fp32=fp32),
            _elementwise(f"mul (rotate_half({name}) * sin)", nb + _nbytes(sin), nb, fp32=fp32),
            _elementwise(f"add ({name})", 2 * nb, nb, fp32=fp32),
        ]
    return _roofline("apply_rotary_pos_emb", work, eager, target, lnc)



# ----------------------------------------------------------------------------- backward

# ATen ops that only change a tensor's metadata (no data moved): free in the eager models.
_VIEW_OPS = frozenset({
    "detach", "expand", "view", "_unsafe_view", "t", "transpose", "permute", "unsqueeze",
    "squeeze", "slice", "select", "alias", "as_strided", "reshape", "split", "split_with_sizes",
    "unbind", "chunk", "narrow", "_reshape_alias", "unflatten", "flatten",
})
# ATen ops that evaluate a transcendental per output element on ScalarE (exp, tanh,
# sigmoid, erf, rsqrt; a fractional or negative power is an exp/log pair, counted once).
_TRANSCENDENTAL_OPS = frozenset({
    "exp", "tanh", "sigmoid", "rsqrt", "sqrt", "erf", "log", "reciprocal", "silu", "gelu",
    "silu_backward", "gelu_backward", "sigmoid_backward", "tanh_backward",
})


def _aten_work(func, args, kwargs, out) -> Work | None:
    """``Work`` of one recorded ATen call (None for a view op): every tensor input read,
    every tensor output written, transcendentals per output element for the ops above,
    matmul FLOPs for mm/bmm/addmm."""
    import torch

    name = func.overloadpacket.__name__
    if name in _VIEW_OPS:
        return None
    flat_in = [a for a in list(args) + list((kwargs or {}).values()) for a in (a if isinstance(a, (list, tuple)) else (a,))]
    ins = [a for a in flat_in if isinstance(a, torch.Tensor)]
    outs = [o for o in (out if isinstance(out, (list, tuple)) else (out,)) if isinstance(o, torch.Tensor)]
    nbytes = sum(_nbytes(t) for t in ins + outs)
    n_out = sum(math.prod(o.shape) for o in outs)
    trans = 0
    if name in _TRANSCENDENTAL_OPS:
        trans = n_out
    elif name == "pow":
        exponent = args[1] if len(args) > 1 else None
        if not (isinstance(exponent, (int, float)) and float(exponent).is_integer() and exponent >= 0):
            trans = n_out
    flops = 0
    if name in ("mm", "bmm", "addmm", "baddbmm"):
        a, b = ins[-2], ins[-1]
        flops = 2 * math.prod(a.shape) * b.shape[-1]
    fp32 = any(_is_fp32(o) for o in outs)
    return Work(f"{name}", nbytes, flops, trans, fp32)


def eager_autograd(forward: Callable, inputs: Sequence, grad_inputs: Sequence[int]) -> list[Work]:
    """The ATen ops autograd runs for the backward of ``forward(*inputs)`` (the op's
    eager composition), as ``Work``: recorded on meta copies of the tensor ``inputs``
    (shape and dtype kept, no data), the gradients taken with respect to the inputs at
    positions ``grad_inputs``, the output gradients of the outputs' shapes and dtypes.
    Non-tensor inputs pass through."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    metas = [torch.empty(tuple(a.shape), dtype=a.dtype, device="meta",
                         requires_grad=i in grad_inputs and a.is_floating_point())
             if isinstance(a, torch.Tensor) else a for i, a in enumerate(inputs)]
    wrt = [metas[i] for i in grad_inputs if isinstance(metas[i], torch.Tensor)]
    with torch.enable_grad():
        outs = forward(*metas)
    outs = [o for o in (outs if isinstance(outs, (tuple, list)) else (outs,)) if o.requires_grad]
    grads = [torch.empty_like(o) for o in outs]
    steps: list[Work] = []

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            work = _aten_work(func, args, kwargs, out)
            if work is not None:
                steps.append(work)
            return out

    with _Record():
        torch.autograd.grad(outs, wrt, grads, allow_unused=True)
    return steps


def backward_roofline(op: str, work: Work, forward: Callable, inputs: Sequence,
                      grad_inputs: Sequence[int], target, lnc: int) -> Roofline:
    """The limit of a backward kernel (``work``: its compulsory work) and its modeled
    eager-autograd baseline (``eager_autograd(forward, inputs, grad_inputs)``)."""
    return _roofline(op, work, eager_autograd(forward, inputs, grad_inputs), target, lnc)


def _grad_io(name: str, reads: Sequence, writes: Sequence, transcendentals: int = 0) -> Work:
    """Compulsory work of a backward: every tensor of ``reads`` read once, of ``writes``
    written once (None entries skipped); fp32 when the first read is fp32."""
    present = [t for t in list(reads) + list(writes) if t is not None]
    return Work(name, sum(_nbytes(t) for t in present), 0, int(transcendentals), _is_fp32(reads[0]))


def _eager_rms_norm(x, normalized_shape, weight, eps):
    import torch.nn.functional as F

    return F.rms_norm(x, tuple(normalized_shape), weight, eps)


def rms_norm_backward(grad_output, input, normalized_shape, weight=None, eps=None, lnc: int = 1,
                      target: str | Target = DEFAULT_TARGET) -> Roofline:
    """rms_norm's backward: reads dy, x (weight), writes dx (dweight); one rsqrt per row.
    Eager autograd: the backward of F.rms_norm's ATen decomposition."""
    rows = math.prod(input.shape) // math.prod(normalized_shape)
    work = _grad_io("rms_norm backward", (grad_output, input, weight), (input, weight), rows)
    return backward_roofline("rms_norm backward", work, _eager_rms_norm,
                             (input, list(normalized_shape), weight, 1e-6 if eps is None else eps),
                             (0, 2), target, lnc)


def _eager_fused_add_rms_norm(x, residual, weight, eps):
    import torch.nn.functional as F

    total = x + residual
    return F.rms_norm(total, (x.shape[-1],), weight, eps), total


def fused_add_rms_norm_backward(grad_output, grad_total, total, weight=None, eps=None, lnc: int = 1,
                                target: str | Target = DEFAULT_TARGET) -> Roofline:
    """fused_add_rms_norm's backward: reads d(normed), d(total), the saved sum and the
    weight; writes d(input) (= d(residual), the same tensor) and dweight. Eager autograd:
    the backward of add + F.rms_norm (autograd's add backward passes the gradient through,
    its accumulation of the two gradients of the sum is an add)."""
    rows = math.prod(total.shape) // total.shape[-1]
    work = _grad_io("fused_add_rms_norm backward", (grad_output, grad_total, total, weight), (total, weight), rows)
    return backward_roofline("fused_add_rms_norm backward", work, _eager_fused_add_rms_norm,
                             (total, total, weight, 1e-6 if eps is None else eps), (0, 1, 2), target, lnc)


def _eager_layer_norm(x, normalized_shape, weight, bias, eps):
    import torch.nn.functional as F

    return F.layer_norm(x, tuple(normalized_shape), weight, bias, eps)


def layer_norm_backward(grad_output, input, stats, normalized_shape, weight=None, bias=None, eps: float = 1e-5,
                        lnc: int = 1, target: str | Target = DEFAULT_TARGET) -> Roofline:
    """layer_norm's backward: reads dy, x, the forward's saved stats (fp32 mean and rstd per
    row) (weight), writes dx (dweight, dbias). Eager autograd: ``native_layer_norm_backward``
    (one fused ATen op reading the same saved statistics)."""
    work = _grad_io("layer_norm backward", (grad_output, input, stats, weight), (input, weight, bias))
    return backward_roofline("layer_norm backward", work, _eager_layer_norm,
                             (input, list(normalized_shape), weight, bias, eps), (0, 2, 3), target, lnc)


def gelu_backward(grad_output, input, approximate: str = "none", lnc: int = 1,
                  target: str | Target = DEFAULT_TARGET) -> Roofline:
    """gelu's backward: reads dy, x, writes dx; one derivative (transcendental) per
    element. Eager autograd: one ``gelu_backward``."""
    import torch.nn.functional as F

    work = _grad_io("gelu backward", (grad_output, input), (input,), math.prod(input.shape))
    return backward_roofline("gelu backward", work, lambda x: F.gelu(x, approximate=approximate), (input,), (0,),
                             target, lnc)


def silu_backward(grad_output, input, lnc: int = 1, target: str | Target = DEFAULT_TARGET) -> Roofline:
    """silu's backward: reads dy, x, writes dx; one derivative per element. Eager autograd:
    one ``silu_backward``."""
    import torch.nn.functional as F

    work = _grad_io("silu backward", (grad_output, input), (input,), math.prod(input.shape))
    return backward_roofline("silu backward", work, F.silu, (input,), (0,), target, lnc)


def _gated_backward(op, act, grad_output, input, target, lnc) -> Roofline:
    # reads dy [.., d] and x [.., 2d], writes dx [.., 2d]; act and act' per output element
    work = _grad_io(f"{op} backward", (grad_output, input), (input,), 2 * math.prod(grad_output.shape))

    def eager(x):
        d = x.shape[-1] // 2
        return act(x[..., :d]) * x[..., d:]

    return backward_roofline(f"{op} backward", work, eager, (input,), (0,), target, lnc)


def silu_and_mul_backward(grad_output, input, lnc: int = 1, target: str | Target = DEFAULT_TARGET) -> Roofline:
    """silu_and_mul's backward. Eager autograd: the backward of silu(x[..., :d]) * x[..., d:]
    (mul's two products, silu_backward, the slices' gradients into a [.., 2d] buffer)."""
    import torch.nn.functional as F

    return _gated_backward("silu_and_mul", F.silu, grad_output, input, target, lnc)


def gelu_and_mul_backward(grad_output, input, approximate: str = "none", lnc: int = 1,
                          target: str | Target = DEFAULT_TARGET) -> Roofline:
    """gelu_and_mul's backward. Eager autograd: as silu_and_mul's with gelu_backward."""
    import torch.nn.functional as F

    return _gated_backward("gelu_and_mul", lambda g: F.gelu(g, approximate=approximate), grad_output, input,
                           target, lnc)


def apply_rotary_pos_emb_backward(grad_q, grad_k, cos, sin, lnc: int = 1,
                                  target: str | Target = DEFAULT_TARGET) -> Roofline:
    """Rotary's backward (d q, d k; cos/sin take none): reads d q_out, d k_out, cos, sin,
    writes d q, d k. Eager autograd: the backward of transformers' composition
    (x * cos + rotate_half(x) * sin) for q and k."""
    def eager(q, k, c, s):
        c, s = (c.unsqueeze(1), s.unsqueeze(1)) if c.dim() == 3 else (c, s)

        def rope(x):
            half = x.shape[-1] // 2
            return x * c + _cat_last((-x[..., half:], x[..., :half])) * s
        return rope(q), rope(k)

    work = _grad_io("apply_rotary_pos_emb backward", (grad_q, grad_k, cos, sin), (grad_q, grad_k))
    return backward_roofline("apply_rotary_pos_emb backward", work, eager, (grad_q, grad_k, cos, sin), (0, 1),
                             target, lnc)


def _cat_last(tensors):
    import torch

    return torch.cat(tensors, dim=-1)


def softmax_backward(grad_output, output, dim: int = -1, lnc: int = 1,
                     target: str | Target = DEFAULT_TARGET) -> Roofline:
    """softmax's backward from its output: reads dy, y, writes dx. Eager autograd: one
    ``_softmax_backward_data``."""
    import torch

    work = _grad_io("softmax backward", (grad_output, output), (output,))
    return backward_roofline("softmax backward", work, lambda x: torch.softmax(x, dim), (output,), (0,), target, lnc)

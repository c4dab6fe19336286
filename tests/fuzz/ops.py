"""Per op of the registry: a random-input generator, a float64 oracle, and the derived
elementwise error bound (notation: tolerance.py; u = unit roundoff of the output dtype,
U32 = 2**-24, K = 8 fp32 roundings for a handful of fp32 operations, S(n) = the roundings
charged to an fp32 sum of n terms, F = floor(dtype)).

The oracles are torch's own functions run in float64 on the exact stored input values,
independent of ``nki_kernels.references``. Magnitude limits per op (``max_log10``) keep the
op's fp32 intermediates finite, which is where torch's fp32 result (and so "the
reference") is defined: beyond them torch itself overflows (rms_norm's x**2, for one).
Special values are drawn only where torch defines the result the same way in fp32 and in
float64 (e.g. not gelu(+inf): NaN or +inf in torch's fp32 erf gelu depending on the machine,
inf in float64; not inf/NaN in
an attention key: issue 14 changes how the reference backend treats masked ones).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

import nki_kernels

from .tolerance import U32, floor, sum_roundings, unit
from .values import DTYPE_NAMES, MAGNITUDES, Draw, as_view, dtype_of, values, with_specials

K = 8.0
SIXTEEN = (torch.bfloat16, torch.float16)
# Largest number of elements of one generated input (the simulator runs every case).
MAX_ELEMENTS = 300_000


@dataclass(frozen=True)
class FuzzOp:
    """One op's fuzz recipe. ``generate(draw) -> (args, kwargs)``; ``oracle(args, kwargs)``
    -> tuple of float64 results; ``bounds(args, kwargs, exact)`` -> tuple of elementwise
    bounds (None: must equal the oracle rounded to the dtype, bit for bit)."""

    name: str
    generate: Callable
    oracle: Callable
    bounds: Callable
    # bounds(args, kwargs, exact, backend) when the reference backend (torch's own ops,
    # issue 14) has numerics of its own; else bounds(args, kwargs, exact) for both backends
    per_backend: bool = False

    def run(self, args, kwargs):
        out = getattr(nki_kernels, self.name)(*args, **kwargs)
        return out if isinstance(out, tuple) else (out,)


def _f64(t):
    return None if t is None else t.double()


def _rows_shape(draw: Draw, last, max_elements=MAX_ELEMENTS):
    """Leading dims (0 to 3 of them, sizes near the 128-row tiles, sometimes 0) for rows of
    ``last`` elements, within max_elements."""
    lead = []
    for _ in range(draw.choice([0, 1, 1, 2, 2, 3])):
        lead.append(draw.size([1, 2, 3, 5, 7, 16, 33], [0, 127, 128, 129, 255, 257, 1576], p_boundary=0.2))
    while lead and math.prod(lead) * last > max_elements:
        lead[draw.rng.randrange(len(lead))] = draw.choice([1, 2, 3])
        if math.prod(lead) * last > max_elements:
            lead.pop()
    return tuple(lead)


# ---------------------------------------------------------------------------- elementwise
# gelu / silu: the activation in fp32 (a few ulps: K * U32 * |f(x)|), one rounding (u * |f|).
# gelu = 0.5 x (1 + erf(x / sqrt 2)) loses U32 * |x| to the cancellation in 1 + erf when
# x << 0 (the tanh form likewise): + K * U32 * |x|.

def _any_shape(draw: Draw):
    rank = draw.choice([0, 1, 1, 2, 2, 3, 4])
    shape = [draw.size([1, 2, 3, 7, 64, 100, 768], [0, 127, 128, 129, 2048, 2049, 4097], 0.2) for _ in range(rank)]
    while math.prod(shape) > MAX_ELEMENTS:
        shape[draw.rng.randrange(rank)] = draw.choice([1, 2, 3, 5])
    return tuple(shape)


def _gen_gelu(draw: Draw):
    dtype = dtype_of(draw)
    approximate = draw.choice(["none", "tanh"])
    x = values(draw, _any_shape(draw), dtype)
    x = with_specials(draw, x, ["-inf", "nan", "zero"] + (["inf"] if approximate == "tanh" else []))
    return (as_view(draw, x),), {"approximate": approximate}


def _gen_silu(draw: Draw):
    x = values(draw, _any_shape(draw), dtype_of(draw))
    x = with_specials(draw, x, ["inf", "-inf", "nan", "zero"])
    return (as_view(draw, x),), {}


def _bounds_act(x, exact, cancels):
    dtype = x.dtype
    x = x.double().abs()
    e = exact.abs()
    b = unit(dtype) * e + K * U32 * (e + (x if cancels else 0)) + floor(dtype)
    return b


GELU = FuzzOp("gelu", _gen_gelu,
              lambda a, kw: (F.gelu(a[0].double(), approximate=kw["approximate"]),),
              lambda a, kw, ex: (_bounds_act(a[0], ex[0], cancels=True),))
SILU = FuzzOp("silu", _gen_silu, lambda a, kw: (F.silu(a[0].double()),),
              lambda a, kw, ex: (_bounds_act(a[0], ex[0], cancels=False),))


# ---------------------------------------------------------------------------- gated
# act(g) * up: the activation as above (its absolute error scaled by |up|), the product in
# fp32 (one rounding: in K), one rounding to the dtype. An activation that fp32 flushes to
# 0 (silu(-104) = -1e-43) is off by < 2**-120, times |up|.

def _gen_gated(draw: Draw, gelu: bool):
    dtype = dtype_of(draw)
    d = draw.size([1, 2, 3, 17, 64, 333, 1000], [4095, 4096, 4097, 8192, 8193, 11008], 0.25)
    x = values(draw, _rows_shape(draw, 2 * d) + (2 * d,), dtype)
    gate_specials = ["-inf", "nan"] + ([] if gelu else ["inf"])
    x = torch.cat([with_specials(draw, x[..., :d], gate_specials),
                   with_specials(draw, x[..., d:], ["nan", "zero"])], -1)
    kwargs = {"approximate": draw.choice(["none", "tanh"])} if gelu else {}
    return (as_view(draw, x, ("transposed", "sliced")),), kwargs


def _oracle_gated(a, kw, gelu):
    x = a[0].double()
    d = x.shape[-1] // 2
    act = F.gelu(x[..., :d], approximate=kw["approximate"]) if gelu else F.silu(x[..., :d])
    return (act * x[..., d:],)


def _bounds_gated(a, ex, gelu):
    x = a[0].double()
    d = x.shape[-1] // 2
    g, up = x[..., :d].abs(), x[..., d:].abs()
    e = ex[0].abs()
    dtype = a[0].dtype
    gu = torch.nan_to_num(g * up, nan=0.0, posinf=math.inf)
    return (unit(dtype) * e + K * U32 * (e + (gu if gelu else 0)) + 2.0 ** -120 * up + floor(dtype),)


SILU_AND_MUL = FuzzOp("silu_and_mul", lambda d: _gen_gated(d, False), lambda a, kw: _oracle_gated(a, kw, False),
                      lambda a, kw, ex: _bounds_gated(a, ex, False))
GELU_AND_MUL = FuzzOp("gelu_and_mul", lambda d: _gen_gated(d, True), lambda a, kw: _oracle_gated(a, kw, True),
                      lambda a, kw, ex: _bounds_gated(a, ex, True))


# ---------------------------------------------------------------------------- softmax
# exp(x - m) / l: x - m rounded in fp32 (|x - m| * U32 absolute in the exponent, so
# relative in the result), the sum l over C terms (S(C) roundings; the online form
# rescales once per 4096-column chunk: + C / 4096), the exp and the normalisation (K),
# one rounding to the dtype.

def _gen_softmax(draw: Draw):
    dtype = dtype_of(draw)
    cols = draw.size([1, 2, 3, 7, 64, 197, 1000], [511, 512, 513, 4096, 8191, 8192, 8193, 12289, 20000, 32000],
                     0.3)
    if draw.chance(0.01):
        cols = 70001                     # past the resident budget: the streaming online form
    lead = _rows_shape(draw, cols)
    x = values(draw, lead + (cols,), dtype, max_log10=30)
    if x.numel() and draw.chance(0.3):
        # masked logits, as attention scores carry them: -inf or the dtype's finfo.min,
        # sometimes on whole rows (a row of -inf is NaN, as in torch)
        fill = draw.choice([-math.inf, float(torch.finfo(dtype).min)])
        keep = draw.rand(*x.shape) > draw.choice([0.3, 0.9, 1.0])
        x = torch.where(keep, x, torch.tensor(fill, dtype=dtype))
        draw.note(f"masked with {fill:g}")
    x = with_specials(draw, x, ["inf", "nan"], p=0.05)
    x = as_view(draw, x)
    dim = draw.rng.randrange(-x.dim(), x.dim()) if x.dim() and draw.chance(0.2) else -1
    return (x,), {"dim": dim}


def _bounds_softmax(a, kw, ex, backend):
    x = a[0].double()
    dim = kw["dim"]
    e = ex[0]
    c = x.shape[dim] if x.dim() else 1
    m = x.amax(dim=dim, keepdim=True) if x.dim() and x.numel() else x
    gap = torch.nan_to_num((x - m).abs() * e.abs(), nan=0.0, posinf=0.0)   # -inf entries: e = 0
    rel = K + sum_roundings(c) + c / 4096
    # the reference backend is torch.softmax itself: over a dim other than the last, torch's
    # CPU kernel for 16-bit inputs rounds to the dtype once more than ours (every seed-13
    # failure of the reference backend, 16 in 1000, was over a non-last dim, at most 1.7x
    # the one-rounding bound), so that backend gets a second rounding there
    roundings = 2 if backend == "reference" and a[0].dtype != torch.float32 and x.dim() \
        and dim % x.dim() != x.dim() - 1 else 1
    return (roundings * (unit(a[0].dtype) * e.abs() + floor(a[0].dtype)) + U32 * (rel * e.abs() + gap),)


SOFTMAX = FuzzOp("softmax", _gen_softmax, lambda a, kw: (torch.softmax(a[0].double(), kw["dim"]),), _bounds_softmax,
                 per_backend=True)


# ---------------------------------------------------------------------------- norms

NORM_HIDDEN = ([1, 2, 3, 16, 64, 96, 768, 1000, 4096],
               [511, 512, 513, 8191, 8192, 8193, 12288, 16384, 20000, 32768])


def _norm_input(draw: Draw, last_dims):
    hidden = math.prod(last_dims)
    lead = _rows_shape(draw, hidden)
    return values(draw, lead + tuple(last_dims), dtype_of(draw), max_log10=15)


def _hidden_dims(draw: Draw):
    h = draw.size(*NORM_HIDDEN, p_boundary=0.3)
    if draw.chance(0.01):
        h = 65536                        # the largest: rows and weights past every SBUF budget
    if h > 1 and h % 8 == 0 and draw.chance(0.15):
        return (8, h // 8)               # a 2-D normalized_shape
    return (h,)


def _param(draw: Draw, shape, like_dtype, shift=0.0):
    dtype = like_dtype if draw.chance(0.6) else dtype_of(draw)
    return values(draw, shape, dtype, "normal", shift=False) + torch.tensor(shift, dtype=dtype)


def _gen_layer_norm(draw: Draw):
    dims = _hidden_dims(draw)
    x = _norm_input(draw, dims)
    x = with_specials(draw, x, ["nan", "inf"], p=0.05)
    affine = draw.choice(["none", "weight", "bias", "both", "both"])
    weight = _param(draw, dims, x.dtype, 1.0) if affine in ("weight", "both") else None
    bias = _param(draw, dims, x.dtype) if affine in ("bias", "both") else None
    eps = draw.choice([1e-5, 1e-6, 1e-12, 0.1])
    return (as_view(draw, x), list(dims), weight, bias), {"eps": eps}


def _oracle_layer_norm(a, kw):
    x, shape, w, b = a
    return (F.layer_norm(x.double(), shape, _f64(w), _f64(b), kw["eps"]),)


def _bounds_layer_norm(a, kw, ex):
    """Per row: sigma = sqrt(var + eps), kappa = max|x| / sigma (the row's condition: the
    mean's fp32 error, <= S(H) * U32 * max|x|, shifts every y by that / sigma), y the exact
    normalised row. |out - exact| <= |w| * K * S(H) * U32 * (kappa + |y|) + K * U32 * |exact|
    + roundings: u * |exact| + F once; 16-bit rows of <= 8192 with a weight or bias (the
    kernel's 16-bit path: y, y * w, y * w + b each rounded to the dtype, the first one's
    error then scaled by |w|): (u |y| + F) |w| + (u |y w| + F) + u |exact| + F."""
    x, shape, w, b = a
    dims = tuple(range(-len(shape), 0))
    x64 = x.double()
    hidden = math.prod(shape)
    mean = x64.mean(dims, keepdim=True)
    sigma = (((x64 - mean) ** 2).mean(dims, keepdim=True) + kw["eps"]).sqrt()
    kappa = x64.abs().amax(dims, keepdim=True) / sigma
    y = ((x64 - mean) / sigma).abs()
    w64 = torch.ones(()) if w is None else w.double().abs()
    e = ex[0].abs()
    u = unit(x.dtype)
    eta = floor(x.dtype)                  # a rounding's absolute part (subnormal results)
    if x.dtype in SIXTEEN and hidden <= 8192 and (w is not None or b is not None):
        rounding = (u * y + eta) * w64 + (u * y * w64 + eta) + u * e     # y, y * w, + b
    else:
        rounding = u * e
    bound = w64 * K * sum_roundings(hidden) * U32 * (kappa + y) + K * U32 * e + rounding + eta
    return (torch.nan_to_num(bound, nan=math.inf),)


LAYER_NORM = FuzzOp("layer_norm", _gen_layer_norm, _oracle_layer_norm, _bounds_layer_norm)

# rms_norm: mean(x**2) a sum of H positive terms (S(H) roundings, relative), rsqrt and the
# products (K), one rounding: |out - exact| <= (u + (K + S(H)) * U32) * |exact| + F.


def _rms_eps(draw: Draw):
    return draw.choice([None, 1e-6, 1e-5, 1e-12])


def _gen_rms_norm(draw: Draw):
    dims = _hidden_dims(draw)
    x = with_specials(draw, _norm_input(draw, dims), ["nan", "inf"], p=0.05)
    weight = _param(draw, dims, x.dtype, 1.0) if draw.chance(0.7) else None
    return (as_view(draw, x), list(dims), weight), {"eps": _rms_eps(draw)}


def _rms64(x, shape, w, eps, dtype):
    # eps=None: float32's machine epsilon for every input dtype (F.rms_norm uses its opmath type)
    eps = torch.finfo(torch.float32).eps if eps is None else eps
    return F.rms_norm(x.double(), shape, _f64(w), eps)


def _bounds_rms(dtype, hidden, e):
    return ((unit(dtype) + (K + sum_roundings(hidden)) * U32) * e.abs() + floor(dtype),)


RMS_NORM = FuzzOp("rms_norm", _gen_rms_norm,
                  lambda a, kw: (_rms64(a[0], a[1], a[2], kw["eps"], a[0].dtype),),
                  lambda a, kw, ex: _bounds_rms(a[0].dtype, math.prod(a[1]), ex[0]))


def _gen_fused(draw: Draw):
    h = _hidden_dims(draw)[-1]
    x = with_specials(draw, _norm_input(draw, (h,)), ["nan"], p=0.05)
    residual = values(draw, x.shape, x.dtype, max_log10=15)
    weight = _param(draw, (h,), x.dtype, 1.0) if draw.chance(0.7) else None
    return (as_view(draw, x), as_view(draw, residual), weight, _rms_eps(draw)), {}


def _oracle_fused(a, kw):
    x, r, w, eps = a
    total = (x.double() + r.double()).to(x.dtype)       # the sum in the input dtype, rounded once
    return _rms64(total, [x.shape[-1]], w, eps, x.dtype), total.double()


# normed: as rms_norm, from the rounded sum; total: bit for bit (None)
FUSED_ADD_RMS_NORM = FuzzOp("fused_add_rms_norm", _gen_fused, _oracle_fused,
                            lambda a, kw, ex: _bounds_rms(a[0].dtype, a[0].shape[-1], ex[0]) + (None,))


# ---------------------------------------------------------------------------- rotary
# x * cos + rotate_half(x) * sin: two fp32 products and their sum (2 * U32 * (|x cos| +
# |rot(x) sin|), which also covers cancellation), one rounding.

def _gen_rotary(draw: Draw):
    dtype = dtype_of(draw)
    b = draw.choice([1, 1, 2, 3])
    s = draw.size([1, 2, 5, 17, 64], [127, 128, 129, 255, 300], 0.3)
    d = 2 * draw.size([1, 8, 32, 50, 64], [128, 257, 513], 0.15)
    hq = draw.size([1, 2, 3, 8], [0, 32], 0.15)
    hk = draw.size([1, 2], [0, 8], 0.15)
    while b * (hq + hk) * s * d > MAX_ELEMENTS:
        s = max(1, s // 2)
    if draw.chance(0.6):                  # genuine tables, |cos|, |sin| <= 1
        pos = torch.arange(s, dtype=torch.float64)[:, None] + 1000 * draw.rand(1)
        inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        ang = torch.cat([pos * inv, pos * inv], -1)
        cos, sin = ang.cos()[None].expand(b, s, d).to(dtype), ang.sin()[None].expand(b, s, d).to(dtype)
        x_max = 30
    else:                                 # any tables (the contract allows them)
        cos, sin = (values(draw, (b, s, d), dtype, "normal") for _ in range(2))
        x_max = 20
        draw.note("arbitrary tables")
    q, k = (values(draw, (b, h, s, d), dtype, max_log10=x_max) for h in (hq, hk))
    q = with_specials(draw, q, ["nan"], p=0.05)
    layout = draw.choice(["BSD", "1SD", "SD"])
    if layout != "BSD":
        cos, sin = cos[:1], sin[:1]
        if layout == "SD":
            cos, sin = cos[0], sin[0]
    elif draw.chance(0.3):
        cos, sin = cos[:1].expand(b, s, d), sin[:1].expand(b, s, d)
        draw.note("cos/sin expanded over batch")
    if draw.chance(0.3):                  # transformers' q/k: transposed views of [B, S, H, D]
        q, k = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k))
        draw.note("q/k bshd views")
    return (q, k, cos, sin), {}


def _oracle_rotary(a, kw):
    q, k, cos, sin = (t.double() for t in a)
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    half = q.shape[-1] // 2

    def rot(x):
        return torch.cat([-x[..., half:], x[..., :half]], -1)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def _bounds_rotary(a, kw, ex):
    q, k, cos, sin = (t.double() for t in a)
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    half = q.shape[-1] // 2
    out = []
    for x, e in zip((q, k), ex):
        rot = torch.cat([x[..., half:], x[..., :half]], -1).abs()
        terms = torch.nan_to_num(x.abs() * cos.abs() + rot * sin.abs(), nan=0.0)
        out.append(unit(a[0].dtype) * e.abs() + 3 * U32 * terms + floor(a[0].dtype))
    return tuple(out)


ROTARY = FuzzOp("apply_rotary_pos_emb", _gen_rotary, _oracle_rotary, _bounds_rotary)


# ---------------------------------------------------------------------------- attention
# O_i = sum_j p_j v_j / sum_j p_j. Per query row i: the exp arguments carry the fp32 error
# of the scores (D products accumulated, the scale, the mask added, the max subtracted):
# E_i = (D + 4) * U32 * A_i, A_i = max over the row's unmasked keys of
# |scale| * sum_d |q_d k_jd| + |mask_ij|, i.e. each p_j is off by a factor <= exp(E_i).
# 16-bit data rounds P to the input dtype before P·V (relative u) and P·V / the row sum
# accumulate Sk terms. A weighted mean with weights off by a relative r moves by
# <= 2 r max_j |v_jc|: per output column c,
# |out - exact| <= u |exact| + 2 (u_P + expm1(E_i) + K S(Sk) U32) V_c + F,
# u_P = u (16-bit) or U32, V_c = max_j |v_jc| over the kv head's keys.

def _mask(draw: Draw, b, h, sq, sk, dtype, lead_dims):
    """A mask broadcastable to lead + [H, Sq, Sk] of a random kind and broadcast shape."""
    kind = draw.choice(["bool", "bool", "float", "finfo_min", "neg_inf"])
    full = list(lead_dims) + [h, sq, sk]
    shape = [s if draw.chance(0.5) else 1 for s in full]
    shape[-1] = sk if draw.chance(0.9) else 1
    drop = draw.rng.randint(0, len(shape) - 1) if draw.chance(0.4) else 0
    shape = shape[drop:]
    keep = draw.rand(*shape) > draw.choice([0.1, 0.5, 0.9])
    if shape[-1] > 0 and draw.chance(0.7):
        keep[..., 0] = True               # most rows keep a key; others may lose all
    mdtype = draw.choice([torch.float32, dtype])
    if kind == "bool":
        m = keep
    elif kind == "float":
        m = torch.where(keep, draw.randn(*shape) * 2, torch.tensor(-math.inf, dtype=torch.float64)).to(mdtype)
    elif kind == "finfo_min":
        m = torch.where(keep, torch.zeros(shape, dtype=torch.float64),
                        torch.tensor(float(torch.finfo(mdtype).min), dtype=torch.float64)).to(mdtype)
    else:
        m = torch.where(keep, torch.zeros(shape, dtype=torch.float64),
                        torch.tensor(-math.inf, dtype=torch.float64)).to(mdtype)
    draw.note(f"mask {kind} {list(m.shape)} {DTYPE_NAMES.get(m.dtype, 'bool')}")
    return m


def _gen_attention(draw: Draw):
    dtype = dtype_of(draw)
    b = draw.size([1, 1, 2, 3], [0], 0.05)
    hkv = draw.size([1, 1, 2, 3, 4], [0], 0.03)
    g = draw.choice([1, 1, 2, 3, 4])
    h = hkv * g
    seqs = ([1, 2, 5, 17, 64, 100], [0, 127, 128, 129, 197, 255, 256, 257, 385, 512, 700])
    sq, sk = draw.size(*seqs, p_boundary=0.4), draw.size(*seqs, p_boundary=0.4)
    if draw.chance(0.02):
        sk = draw.choice([2049, 2500])    # the flash kernel
    d = draw.size([8, 16, 32, 64, 64, 72, 80, 96, 128], [1, 127, 129, 200, 256], 0.2)
    dv = d if draw.chance(0.8) else draw.choice([1, 16, 64, 100, 128, 160, 256])
    while b * h * sq * sk * (d + dv) > 4e7:
        if sq > 1 and (sq >= sk or sk <= 1):
            sq //= 2
        else:
            sk //= 2
    rank = draw.choice([4, 4, 4, 3, 5])
    if rank == 3:
        b = 1
    lead = {3: (), 4: (b,), 5: (b, 2)}[rank]
    if rank == 5:
        draw.note("5-D")
    # q, k up to ~1e4: scaled logits up to ~1e9, still finite in fp32 for every D; k often
    # takes q's magnitude class, so huge logits (both large) come up often
    mag_q = draw.choice(MAGNITUDES)
    mag_k = mag_q if draw.chance(0.5) else draw.choice(MAGNITUDES)
    q = values(draw, lead + (h, sq, d), dtype, mag_q, max_log10=4)
    k = values(draw, lead + (hkv, sk, d), dtype, mag_k, max_log10=4)
    v = values(draw, lead + (hkv, sk, dv), dtype, max_log10=30)
    if draw.chance(0.3):                  # transformers' layout: transposed views of [.., S, H, D]
        q, k, v = (t.transpose(-3, -2).contiguous().transpose(-3, -2) for t in (q, k, v))
        draw.note("bshd views")
    else:
        q, k, v = as_view(draw, q, ("sliced",)), as_view(draw, k, ("sliced", "expanded")), v
    kwargs = {"is_causal": draw.chance(0.3), "enable_gqa": g > 1 or draw.chance(0.1)}
    if draw.chance(0.4):
        kwargs["attn_mask"] = _mask(draw, b, h, sq, sk, dtype, lead)
    if draw.chance(0.25):
        kwargs["scale"] = draw.choice([0.0, -0.3, 0.05, 1.0, 2.5])
    return (q, k, v), kwargs


def _oracle_attention(a, kw):
    """Attention by its definition in float64: softmax(scale · Q·Kᵀ + mask) · V, a bool mask
    (False = masked) and causal (top-left) as -inf, a row with every key masked -> 0.
    (Not F.scaled_dot_product_attention itself: in torch 2.13 it returns NaN for scale=0
    with is_causal, and rejects a 1-D mask, which broadcasts and the op accepts.)"""
    q, k, v = (t.double() for t in a)
    g = q.shape[-3] // k.shape[-3] if k.shape[-3] else 1
    k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    scale = kw.get("scale")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    mask = kw.get("attn_mask")
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask.double()
    if kw.get("is_causal"):
        scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    if scores.shape[-1] == 0:
        return (q.new_zeros(scores.shape[:-1] + (v.shape[-1],)),)
    m = scores.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)   # all-masked rows -> 0
    p = torch.exp(scores - m)
    total = p.sum(-1, keepdim=True)
    return ((p @ v) / torch.where(total == 0, torch.ones_like(total), total),)


def _bounds_attention(a, kw, ex):
    q, k, v = (t.double() for t in a)
    dtype = a[0].dtype
    h, hkv, sq, sk, d = q.shape[-3], k.shape[-3], q.shape[-2], k.shape[-2], q.shape[-1]
    e = ex[0]
    if e.numel() == 0 or sk == 0:
        return (torch.full_like(e, floor(dtype)),)
    g = h // hkv
    scale = kw.get("scale")
    scale = d ** -0.5 if scale is None else scale
    kx = k.repeat_interleave(g, dim=-3)
    vx = v.repeat_interleave(g, dim=-3)
    a_ij = abs(scale) * (q.abs() @ kx.abs().transpose(-2, -1))          # [.., H, Sq, Sk]
    visible = torch.ones(a_ij.shape, dtype=torch.bool)
    mask = kw.get("attn_mask")
    if mask is not None:
        if mask.dtype == torch.bool:
            visible = visible & mask
        else:
            m = mask.double()
            visible = visible & (m > -1e30)
            a_ij = a_ij + torch.nan_to_num(m.abs(), posinf=0.0).where(m > -1e30, torch.zeros(()))
    if kw.get("is_causal"):
        visible = visible & torch.ones(sq, sk, dtype=torch.bool).tril()
    a_i = torch.where(visible, a_ij, torch.zeros(())).amax(-1, keepdim=True)
    err_exp = torch.expm1((d + 4) * U32 * a_i)
    u_p = unit(dtype) if dtype in SIXTEEN else U32
    v_c = vx.abs().amax(-2, keepdim=True)                                  # [.., H, 1, Dv]
    rel = 2 * (u_p + err_exp + K * sum_roundings(sk) * U32)
    bound = unit(dtype) * e.abs() + rel * v_c + floor(dtype)
    return (torch.nan_to_num(bound, nan=math.inf),)


ATTENTION = FuzzOp("scaled_dot_product_attention", _gen_attention, _oracle_attention, _bounds_attention)


OPS = {op.name: op for op in (ATTENTION, LAYER_NORM, RMS_NORM, FUSED_ADD_RMS_NORM, GELU, SILU, SILU_AND_MUL,
                              GELU_AND_MUL, SOFTMAX, ROTARY)}

"""Random inputs for the fuzz tier: sizes near the kernels' tile and chunk boundaries, values
of every magnitude class, special values, and non-contiguous views.

Everything is drawn from one ``Draw`` per case (a ``random.Random`` for choices and a
``torch.Generator`` for data, both seeded from the case's seed), so a case is rebuilt bit
for bit from (op, seed, index): that is what the one-line reproduction relies on.
"""

from __future__ import annotations

import math
import random

import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}

# Magnitude classes of generated data (how values are scaled before rounding to the dtype):
#   normal  randn * s, s in [0.1, 10], with a shift sometimes (a mean far from 0)
#   large   randn * 10**k, k up to the op's limit (the largest the op's fp32 math keeps finite)
#   tiny    randn * 10**-k, down to the dtype's subnormal range
#   denormal  values in the dtype's subnormal range only
#   mixed   each element from a random class (so rows mix 1e-30 and 1e4)
MAGNITUDES = ("normal", "normal", "normal", "large", "tiny", "denormal", "mixed")
# smallest positive normal per dtype (below: subnormals)
TINY_NORMAL = {torch.float32: 2.0 ** -126, torch.bfloat16: 2.0 ** -126, torch.float16: 2.0 ** -14}
SMALLEST_SUBNORMAL = {torch.float32: 2.0 ** -149, torch.bfloat16: 2.0 ** -133, torch.float16: 2.0 ** -24}
LARGEST = {d: float(torch.finfo(d).max) for d in DTYPES}


class Draw:
    """The random source of one case: ``rng`` for choices, ``gen`` for tensor data, and a
    list of the features drawn (``notes``) that becomes the case's description."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.notes: list[str] = []

    def choice(self, options):
        return options[self.rng.randrange(len(options))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def note(self, text: str) -> None:
        self.notes.append(text)

    def size(self, common, boundary=(), p_boundary=0.25):
        """A size from ``common``, or (with probability ``p_boundary``) from ``boundary``:
        the sizes around the kernels' tile / chunk limits."""
        if boundary and self.chance(p_boundary):
            return self.choice(boundary)
        return self.choice(common)

    def randn(self, *shape):
        return torch.randn(tuple(shape), generator=self.gen, dtype=torch.float64)

    def rand(self, *shape):
        return torch.rand(tuple(shape), generator=self.gen, dtype=torch.float64)


def values(draw: Draw, shape, dtype, magnitude: str | None = None, max_log10: float = 30.0,
           min_log10: float = -30.0, shift: bool = True) -> torch.Tensor:
    """A tensor of ``shape`` in ``dtype`` (values rounded to it, so the float64 oracle sees
    exactly the stored values). ``max_log10`` / ``min_log10``: the largest and smallest
    magnitude class the op's fp32 math handles (see each op's generator)."""
    magnitude = magnitude or draw.choice(MAGNITUDES)
    if magnitude == "mixed":
        classes = torch.randint(0, 3, shape, generator=draw.gen)
        parts = [values(draw, shape, dtype, m, max_log10, min_log10, shift=False)
                 for m in ("normal", "large", "tiny")]
        out = torch.where(classes == 0, parts[0], torch.where(classes == 1, parts[1], parts[2]))
        draw.note("mixed")
        return out
    x = draw.randn(*shape)
    if magnitude == "normal":
        s = 10 ** draw.rng.uniform(-1, 1)
        x = x * s
        if shift and draw.chance(0.3):
            mean = draw.choice([-3.0, 1.0, 10.0, 1000.0])
            x = x + mean
            draw.note(f"mean {mean:g}")
    elif magnitude == "large":
        hi = min(max_log10, math.log10(LARGEST[dtype]) - 1)
        k = draw.rng.uniform(max(2.0, hi - 3.0), hi)      # the top of the op's range
        x = x * 10 ** k
        draw.note(f"large 1e{k:.0f}")
    elif magnitude == "tiny":
        lo = max(min_log10, math.log10(SMALLEST_SUBNORMAL[dtype]) + 1)
        k = draw.rng.uniform(lo, -2.0)
        x = x * 10 ** k
        draw.note(f"tiny 1e{k:.0f}")
    elif magnitude == "denormal":
        x = x * (TINY_NORMAL[dtype] / 4)
        draw.note("denormal")
    return x.to(dtype)


def with_specials(draw: Draw, x: torch.Tensor, kinds, p: float = 0.15, max_count: int = 3) -> torch.Tensor:
    """x with up to ``max_count`` elements replaced by values of ``kinds`` (subset of
    "inf", "-inf", "nan", "zero") with probability ``p``; only those the op's reference
    defines (each op passes its own list)."""
    if not kinds or x.numel() == 0 or not draw.chance(p):
        return x
    x = x.clone()
    flat = x.view(-1)
    for _ in range(draw.rng.randint(1, max_count)):
        kind = draw.choice(list(kinds))
        flat[draw.rng.randrange(flat.numel())] = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan,
                                                  "zero": 0.0}[kind]
        draw.note(kind)
    return x


def as_view(draw: Draw, x: torch.Tensor, kinds=("transposed", "sliced", "expanded"), p: float = 0.3):
    """``x`` or, with probability ``p``, a non-contiguous view holding its values: the
    transpose of a contiguous tensor of the transposed shape, or a strided slice of a
    larger tensor; or an expanded view (stride 0) of x's first slice along a dim, which
    repeats that slice. The result is the op's input and what the oracle reads."""
    if x.dim() == 0 or x.numel() == 0 or not draw.chance(p):
        return x
    kind = draw.choice(list(kinds))
    if kind == "transposed" and x.dim() >= 2:
        a, b = sorted(draw.rng.sample(range(x.dim()), 2))
        draw.note(f"transposed({a},{b})")
        return x.transpose(a, b).contiguous().transpose(a, b)
    if kind == "sliced":
        d = draw.rng.randrange(x.dim())
        step = draw.choice([2, 3])
        shape = list(x.shape)
        shape[d] = shape[d] * step
        big = torch.zeros(shape, dtype=x.dtype)
        index = [slice(None)] * x.dim()
        index[d] = slice(0, None, step)
        big[tuple(index)] = x
        draw.note(f"sliced(dim {d}, step {step})")
        return big[tuple(index)]
    if kind == "expanded":
        dims = [d for d in range(x.dim()) if x.shape[d] > 1]
        if dims:
            d = draw.choice(dims)
            draw.note(f"expanded(dim {d})")
            return x.narrow(d, 0, 1).expand(x.shape)
    return x


def dtype_of(draw: Draw, dtypes=DTYPES) -> torch.dtype:
    return draw.choice(list(dtypes))

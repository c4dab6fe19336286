#!/usr/bin/env python
"""Side by side: AWS's nki-library kernels and ours on the same shapes, both MODELED.

Given a checkout of aws-neuron/nki-library, this runs each of its kernels that overlaps one
of our ops (RMSNorm and LayerNorm: the TKG kernels on 1-64 token decode shapes and on
prefill shapes; RoPE: rope_hf, the HuggingFace layout, and RoPE, the [d, B, heads, S] one;
the RoPE backward: rope_hf with backward=True; attention_cte; attention_bwd; the MLP pieces,
listed) and our kernel for the same shape in
the bundled simulator, models both traces with the same cost model on the same target, and
prints one row per shape: AWS's kernel, modeled us (error bar) of each, and ours / AWS's.

Nothing ran on a Trainium: every time is MODELED (<target>). AWS's kernels run from the
checkout as they are (their code is not copied into this repository). A shape AWS's kernel
does not serve is a row that says why: "refused" (its own input checks), "exceeds memory"
(it allocates more on-chip memory than the target has) or "blocked" (our simulator cannot
run it yet, with the first error).

Usage:
    python benchmarks/side_by_side_nki_library.py --nkilib /path/to/nki-library
        [--target trn2|trn3] [--lnc 1|2] [--commit SHA]
        [--ops rms_norm,layer_norm,rope,rope_backward,attention,attention_decode,attention_backward]
        [--quick] [--markdown FILE] [--csv FILE]

--csv writes one row per pair (both sides' status, modeled us and error bar, the ratio,
whole notes), the file a plot is made from; --markdown the printed table.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import importlib.util
import math
import sys
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nki_kernels import _dispatch, registry, simulator
from nki_kernels.simulator.cost import estimate_trace, time_range
from nki_kernels.simulator.errors import CapacityError

# where the pairs go without --csv (out/ is the repository's output folder, git-ignored)
DEFAULT_CSV = Path(__file__).resolve().parent.parent / "out" / "side_by_side.csv"

# nki-library's test harness aliases these module names to the simulator's (test/utils/
# simulation_setup.py); ours provides the first three, the others are not modelled yet.
_NKI_NAMES = ("nki", "nki.language", "nki.isa")

DECODE_TOKENS = (1, 4, 8, 16, 32, 64)
DECODE_HIDDEN = (2048, 4096, 8192)
PREFILL_SHAPES = ((128, 4096), (512, 4096), (2048, 4096))   # [tokens, H]: Llama-7B prefill
VIT_LAYER_NORM = (1576, 768)                                # ViT-B/16 batch 8


@dataclass
class Side:
    """One kernel on one shape: modeled latency and its error bar, or why it did not run
    ("blocked": our simulator cannot run AWS's kernel; "refused": AWS's kernel rejects the
    shape by its own input checks; "exceeds memory": it allocates more on-chip memory than
    the target has at that shape)."""

    status: str = "not run"            # ok | blocked | refused | exceeds memory | no counterpart
    us: float = float("nan")
    low: float = float("nan")
    high: float = float("nan")
    note: str = ""
    kernel: str = ""                   # AWS's kernel (its function name), for the table

    def text(self, width: int = 70) -> str:
        """The table's cell: the time and its error bar, or the status and note cut to
        ``width`` characters (marked "..."; the CSV has the whole note)."""
        if self.status != "ok":
            cell = f"{self.status}: {self.note}"
            return cell if len(cell) <= width else cell[:width - 3] + "..."
        return f"{self.us:.1f} ({self.low:.1f}-{self.high:.1f})"


@dataclass
class Pair:
    op: str
    shape: str
    ours: Side = field(default_factory=Side)
    aws: Side = field(default_factory=Side)

    @property
    def ratio(self) -> float:
        """ours / AWS's modeled time (< 1: ours faster)."""
        if self.ours.status == self.aws.status == "ok":
            return self.ours.us / self.aws.us
        return float("nan")

    @property
    def ours_at_least_as_fast(self) -> bool | None:
        """At the central value and at both ends of the error bar (same cost numbers)."""
        if math.isnan(self.ratio):
            return None
        return (self.ours.us <= self.aws.us and self.ours.low <= self.aws.low
                and self.ours.high <= self.aws.high)


def _side(est, kernel: str = "") -> Side:
    low, high = time_range(est)
    return Side("ok", est.latency_us, low, high, kernel=kernel)


# ----------------------------------------------------------------------------- ours

def _ours(op: str, args, kwargs, target: str, lnc: int) -> Side:
    spec = registry.get(op)
    call = spec.kernel_call(*args, **kwargs)
    kernel = _dispatch.simulator_kernel(call)[lnc]
    tensors = tuple(t.detach().contiguous() for t in call.tensors)
    est = simulator.estimate(kernel, target)(*tensors, **call.static)
    return _side(est)


# ----------------------------------------------------------------------------- AWS's

class NkiLibrary:
    """Imports nki-library kernels from a checkout with ``nki`` bound to our simulator (and
    the checkout's modules that do not parse repaired in memory: tools/nkilib_repairs.py)."""

    def __init__(self, checkout: Path):
        src = checkout / "src"
        if not (src / "nkilib_src" / "nkilib").is_dir():
            raise FileNotFoundError(f"--nkilib {checkout}: not an nki-library checkout (no src/nkilib_src/nkilib)")
        self.src = src
        self.commit = _git_head(checkout)
        _source_repairs().install()

    @contextlib.contextmanager
    def bound(self, target: str):
        """sys.path and ``nki`` modules as nki-library's own simulation harness sets them."""
        sys.path.insert(0, str(self.src))
        try:
            with simulator.activated(target=target):
                yield
        finally:
            sys.path.remove(str(self.src))

    def function(self, module: str, name: str, target: str):
        with self.bound(target):
            mod = importlib.import_module(f"nkilib_src.nkilib.{module}")
        return getattr(mod, name)

    def run(self, module: str, name: str, target: str, lnc: int, **inputs) -> Side:
        """Model AWS's ``module.name`` on ``inputs`` at ``lnc``. A sub-kernel that is a plain
        function (rmsnorm_tkg, layernorm_tkg: other kernels call them) is jitted here, as
        nki-library's test harness does with its ``kernel_entry``, so it launches at ``lnc``
        like the rest (run as a plain call, it ran at LNC=1 whatever ``lnc`` said)."""
        try:
            fn = self.function(module, name, target)
            if not hasattr(fn, "__getitem__"):
                with self.bound(target):
                    import nki
                    fn = nki.jit(fn)
        except Exception as err:  # noqa: BLE001 - reported as the row's status
            return self._failed(err, name)
        return self.run_kernel(fn, name, target, lnc, **inputs)

    def run_kernel(self, fn, name: str, target: str, lnc: int, **inputs) -> Side:
        """Model jitted kernel ``fn`` (AWS's, or a wrapper around it) on ``inputs`` at ``lnc``."""
        if lnc > 1 and not hasattr(fn, "__getitem__"):
            raise TypeError(f"run_kernel: {name} is not an nki.jit kernel, so it cannot be launched at "
                            f"lnc={lnc}; jit it first (NkiLibrary.run does)")
        try:
            with self.bound(target):
                kernel = fn[lnc] if lnc > 1 else fn
                res = simulator.run(kernel, target=target, **inputs)
            est = estimate_trace(res.trace, target, allocations=res.allocations)
            return _side(est, kernel=name)
        except Exception as err:  # a kernel our simulator cannot run yet: report, go on
            return self._failed(err, name)

    @staticmethod
    def _failed(err, name: str) -> Side:
        """The row's status for an exception raised by AWS's kernel or our simulator."""
        where = traceback.extract_tb(err.__traceback__)[-1]
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        if "Kernel validation" in first:
            # AWS's kernel_assert: the kernel's own input contract rejects the shape
            reason = first.split("Kernel validation exception: ")[-1].split(" - Please check")[0]
            return Side("refused", note=reason, kernel=name)
        if isinstance(err, CapacityError):
            # the kernel, called on this shape, allocates more SBUF/PSUM than the target has
            return Side("exceeds memory", note=first.split(" at instruction")[0], kernel=name)
        msg = f"{type(err).__name__}: {first}"
        return Side("blocked", note=f"{msg} ({Path(where.filename).name}:{where.lineno})", kernel=name)


def _source_repairs():
    """tools/nkilib_repairs.py (a script folder, not a package: loaded by path, once)."""
    name = "nkilib_repairs"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / "tools" / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def _git_head(path: Path) -> str:
    head = path / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            return (path / ".git" / ref[5:]).read_text().strip()[:12]
        return ref[:12]
    except OSError:
        return "unknown"


# ----------------------------------------------------------------------------- the table

def _rand(shape, dtype, gen):
    return (torch.rand(shape, generator=gen) * 2 - 1).to(dtype)


def norm_pairs(lib: NkiLibrary, op: str, target: str, lnc: int, quick: bool) -> list[Pair]:
    """RMSNorm / LayerNorm on [tokens, H] fp16 (AWS's TKG kernels: input [1, T, H], gamma
    [1, H], output [128, T, H / 128] in HBM, the layout their next matmul reads): the decode
    shapes, then prefill shapes, where nki-library has no other plain RMSNorm / LayerNorm
    kernel (rmsnorm_quant also quantizes) and its TKG kernels still run."""
    pairs = []
    tokens = (1, 64) if quick else DECODE_TOKENS
    hidden = (2048,) if quick else DECODE_HIDDEN
    shapes = [(t, h) for h in hidden for t in tokens]
    if not quick:
        shapes += list(PREFILL_SHAPES) + ([VIT_LAYER_NORM] if op == "layer_norm" else [])
    for t, h in shapes:
        gen = torch.Generator().manual_seed(zlib.crc32(f"{op}{t}{h}".encode()))
        x = _rand((t, h), torch.float16, gen)
        w = _rand((h,), torch.float16, gen)
        b = _rand((h,), torch.float16, gen)
        pair = Pair(op, f"[{t}, {h}] fp16")
        if op == "rms_norm":
            pair.ours = _ours("rms_norm", (x, (h,), w, 1e-6), {}, target, lnc)
            pair.aws = lib.run("core.subkernels.rmsnorm_tkg", "rmsnorm_tkg", target, lnc,
                               input=x.reshape(1, t, h), gamma=w.reshape(1, h),
                               output=torch.zeros((128, t, h // 128), dtype=torch.float16), eps=1e-6)
        else:
            pair.ours = _ours("layer_norm", (x, (h,), w, b, 1e-6), {}, target, lnc)
            pair.aws = lib.run("core.subkernels.layernorm_tkg", "layernorm_tkg", target, lnc,
                               input=x.reshape(1, t, h), gamma=w.reshape(1, h),
                               output=torch.zeros((128, t, h // 128), dtype=torch.float16),
                               beta=b.reshape(1, h), eps=1e-6)
        pairs.append(pair)
    return pairs


# (batch, q heads, kv heads, S): Llama-7B heads at four lengths, then the few-head case of
# nki-library's own rope_hf test table (test_rope_hf.py ROPE_HF_TEST_CASES (4, 1, 1, 512, 128))
ROPE_SHAPES = ((1, 32, 8, 128), (1, 32, 8, 512), (1, 32, 8, 2048), (1, 32, 8, 4096), (4, 1, 1, 512))


def _rope_inputs(seed: str, s: int, batch: int = 1, q_heads: int = 32, kv_heads: int = 8):
    """Fresh q [B, Hq, s, 128], k [B, Hk, s, 128], cos and sin [B, s, 128] (bf16; by default
    Llama-7B heads), the row's shape text and the generator (for further inputs)."""
    gen = torch.Generator().manual_seed(zlib.crc32(seed.encode()))
    q = _rand((batch, q_heads, s, 128), torch.bfloat16, gen)
    k = _rand((batch, kv_heads, s, 128), torch.bfloat16, gen)
    cos = _rand((batch, s, 128), torch.bfloat16, gen)
    sin = _rand((batch, s, 128), torch.bfloat16, gen)
    return q, k, cos, sin, f"q [{batch}, {q_heads}, {s}, 128], k [{batch}, {kv_heads}, {s}, 128] bf16", gen


def rope_pairs(lib: NkiLibrary, target: str, lnc: int, quick: bool) -> list[Pair]:
    """Rotary on q [1, 32, S, 128] and k [1, 8, S, 128] bf16 (Llama-7B heads), against both
    of AWS's RoPE kernels:

    * rope_hf: the HuggingFace layout ([B, heads, S, d], cos/sin [B, S, d]), q and k in one
      launch, as ours: the like-for-like comparison;
    * rope: x [d, B, heads, S] with cos/sin of the first half [d/2, B, S], one launch per
      tensor, times added (our inputs permuted to its layout, outside the timed kernel)."""
    pairs = []
    for batch, q_heads, kv_heads, s in (ROPE_SHAPES[1:2] if quick else ROPE_SHAPES):
        seed = f"rope{s}" if (batch, q_heads, kv_heads) == (1, 32, 8) else f"rope{batch}{q_heads}{kv_heads}{s}"
        q, k, cos, sin, shape, _ = _rope_inputs(seed, s, batch, q_heads, kv_heads)
        ours = _ours("apply_rotary_pos_emb", (q, k, cos, sin), {}, target, lnc)
        hf = Pair("apply_rotary_pos_emb", shape, ours)
        hf.aws = lib.run("core.embeddings.rope_hf", "rope_hf", target, lnc, q=q, k=k, q_out=torch.zeros_like(q),
                         k_out=torch.zeros_like(k), cos=cos, sin=sin)
        pairs.append(hf)
        pair = Pair("apply_rotary_pos_emb", shape, ours)
        sides = []
        # cos/sin of the first half of d (rotate_half repeats them in the second half)
        cos_h = cos[..., :64].permute(2, 0, 1).contiguous()
        sin_h = sin[..., :64].permute(2, 0, 1).contiguous()
        for x in (q, k):
            sides.append(lib.run("core.embeddings.rope", "RoPE", target, lnc,
                                 x_in=x.permute(3, 0, 1, 2).contiguous(), cos=cos_h, sin=sin_h))
        pair.aws = _sum(sides)
        pairs.append(pair)
    return pairs


ROPE_BACKWARD_SEQ = (512, 2048)


def rope_backward_pairs(lib: NkiLibrary, target: str, lnc: int, quick: bool) -> list[Pair]:
    """The rotary backward (d q, d k from the output gradients) on q [1, 32, S, 128] and
    k [1, 8, S, 128] bf16: ours (the forward kernel with the transposed rotation) against
    rope_hf with backward=True (the same inverse rotation, one launch for both)."""
    pairs = []
    for s in ((512,) if quick else ROPE_BACKWARD_SEQ):
        q, k, cos, sin, shape, gen = _rope_inputs(f"rope-bwd{s}", s)
        pair = Pair("apply_rotary_pos_emb backward", shape)
        pair.ours = _ours_backward("apply_rotary_pos_emb", (q, k, cos, sin), {}, target, lnc)
        dq, dk = (_rand(t.shape, torch.bfloat16, gen) for t in (q, k))
        pair.aws = lib.run("core.embeddings.rope_hf", "rope_hf", target, lnc, q=dq, k=dk,
                           q_out=torch.zeros_like(dq), k_out=torch.zeros_like(dk), cos=cos, sin=sin,
                           backward=True)
        pairs.append(pair)
    return pairs


def attention_pairs(lib: NkiLibrary, target: str, lnc: int, quick: bool) -> list[Pair]:
    """Prefill attention: ours (SDPA) vs AWS's attention_cte (heads folded into the batch,
    q [B*H, S, d] with tp_q, k [B*H, d, S], v [B*H, S, d], fp32 softmax)."""
    # ViT-B/16 batch 8, Llama causal, and a vision encoder's from nki-library's own
    # attention_cte table (no_cp_vnc_param_unit [2, 2, 577, 577, 88, bf16, tp_q])
    shapes = [(8, 12, 197, 64, False), (1, 8, 2048, 128, True), (1, 2, 577, 88, False)]
    if quick:
        shapes = shapes[:1]
    pairs = []
    for b, h, s, d, causal in shapes:
        gen = torch.Generator().manual_seed(zlib.crc32(f"attn{b}{h}{s}{d}".encode()))
        q, k, v = (_rand((b, h, s, d), torch.bfloat16, gen) for _ in range(3))
        pair = Pair("scaled_dot_product_attention", f"B={b} H={h} S={s} D={d}{' causal' if causal else ''} bf16")
        pair.ours = _ours("scaled_dot_product_attention", (q, k, v), {"is_causal": causal}, target, lnc)
        bh = b * h
        pair.aws = lib.run("core.attention.attention_cte", "attention_cte", target, lnc,
                           q=q.reshape(bh, s, d), k=k.reshape(bh, s, d).transpose(1, 2).contiguous(),
                           v=v.reshape(bh, s, d), scale=1.0 / math.sqrt(d), causal_mask=causal)
        pairs.append(pair)
    return pairs


# Decode attention: (B, query heads per kv head, query tokens, cached keys, head dim), one kv
# head per launch as nki-library's attention_tkg serves it (tensor parallelism leaves one kv
# head per core). First the shapes of AWS's own tkg test table (test_attention_tkg.py
# attention_tkg_fast_configs: Llama 76B / 3.1 70B / 405B slots, smaller buckets, d = 64;
# speculative decoding with 5 or 7 tokens), then Llama-style one-token batches, batch-1 long
# contexts (one pair per launch: both kernels split its keys over the two cores) and odd
# batches (ours splits the last pair's keys; attention_tkg shards every pair's keys).
DECODE_ATTENTION = (
    (4, 1, 5, 1024, 128), (4, 1, 5, 3072, 128), (4, 1, 5, 7168, 128), (4, 1, 5, 10240, 128),
    (4, 1, 5, 16384, 128), (4, 1, 5, 24576, 128), (4, 2, 7, 16384, 128), (4, 2, 7, 256, 128),
    (4, 2, 7, 2048, 128), (4, 2, 7, 512, 64), (4, 3, 7, 16384, 64), (4, 1, 5, 10240, 64),
    (1, 4, 1, 2048, 128), (4, 8, 1, 1024, 128), (8, 4, 1, 4096, 128), (32, 8, 1, 2048, 128),
    (1, 4, 1, 8192, 128), (1, 4, 1, 16384, 128), (1, 8, 1, 24576, 128),
    (3, 4, 1, 16384, 128), (5, 4, 1, 8192, 128),
    # more query rows per kv head, from the same table (AttnTKGConfig(4, 8, 7, 3072, ...) and
    # (4, 10, 5, 5376, ...), without the sink): 56 and 50 rows, past our decode path's 32
    (4, 8, 7, 3072, 64), (4, 10, 5, 5376, 64),
)


def _tkg_kernel(lib: NkiLibrary, target: str, cfg):
    """A jitted wrapper that calls AWS's attention_tkg as its own tests do (q and the active
    key copied to SBUF first, an SbufManager over the SBUF, output [B, H, d, s_active] in
    HBM); built inside the checkout's ``nki`` binding."""
    tkg = lib.function("core.attention.attention_tkg", "attention_tkg", target)
    sbuf_manager = lib.function("core.utils.allocator", "SbufManager", target)
    logger = lib.function("core.utils.logging", "Logger", target)
    with lib.bound(target):
        import nki
        import nki.isa as nisa
        import nki.language as nl

        @nki.jit
        def attention_tkg(q, k_active, v_active, k_prior, v_prior, mask):
            sbm = sbuf_manager(0, nl.tile_size.total_available_sbuf_size - 16 * 1024, logger("SBM"))
            sbm.open_scope()
            out = nl.ndarray((cfg.bs, cfg.q_head, cfg.d_head, cfg.s_active), dtype=q.dtype, buffer=nl.shared_hbm)
            q_sb = sbm.alloc_stack(q.shape, dtype=q.dtype, buffer=nl.sbuf)
            k_sb = sbm.alloc_stack(k_active.shape, dtype=k_active.dtype, buffer=nl.sbuf)
            nisa.dma_copy(q_sb, q)
            nisa.dma_copy(k_sb, k_active)
            result, _ = tkg(q_sb, k_sb, v_active, k_prior, v_prior, mask, out, cfg, sbm)
            sbm.close_scope()
            return result
    return attention_tkg


def attention_decode_pairs(lib: NkiLibrary, target: str, lnc: int, quick: bool) -> list[Pair]:
    """Decode attention: ours (SDPA, q [B, G, s, d], k/v [B, 1, S, d]; a key-padding mask
    [B, 1, 1, S] for one token, a [B, 1, s, S] mask with the s active tokens causal among
    themselves for speculative decoding) vs AWS's attention_tkg on the same cache (k_prior [B, 1, S, d], the layout
    HF caches use, so tp_k_prior=True; its uint8 mask [S, B, G, s]; q pre-scaled, no RoPE
    fusion). attention_tkg attends to S keys, the active token in the cache's last slot."""
    shapes = DECODE_ATTENTION[:1] if quick else DECODE_ATTENTION
    pairs = []
    for b, g, sa, sp, d in shapes:
        gen = torch.Generator().manual_seed(zlib.crc32(f"decode{b}{g}{sa}{sp}{d}".encode()))
        q = _rand((b, g, sa, d), torch.bfloat16, gen)
        k, v = (_rand((b, 1, sp, d), torch.bfloat16, gen) for _ in range(2))
        if sa == 1:
            keep, what = torch.ones((b, 1, 1, sp), dtype=torch.bool), "key mask"
        else:   # speculative decoding: the sa active tokens (the last keys) see each other causally
            keep, what = torch.ones((b, 1, sa, sp), dtype=torch.bool).tril(sp - sa), "causal active mask"
        pair = Pair("scaled_dot_product_attention (decode)", f"B={b} H={g}/1kv s={sa} S={sp} D={d} bf16 {what}")
        pair.ours = _ours("scaled_dot_product_attention", (q, k, v), {"attn_mask": keep, "enable_gqa": g > 1},
                          target, lnc)
        try:
            cfg = lib.function("core.attention.attention_tkg_utils", "AttnTKGConfig", target)(
                bs=b, q_head=g, s_active=sa, curr_sprior=sp, full_sprior=sp, d_head=d, tp_k_prior=True,
                qk_in_sb=True)
            kernel = _tkg_kernel(lib, target, cfg)
        except Exception as err:  # an older checkout without the kernel: report, go on
            pair.aws = Side("blocked", note=f"{type(err).__name__}: {err}", kernel="attention_tkg")
            pairs.append(pair)
            continue
        pair.aws = lib.run_kernel(kernel, "attention_tkg", target, lnc,
                                  q=q.permute(3, 0, 1, 2).reshape(d, b * g * sa).contiguous(),
                                  k_active=k[:, 0, sp - sa:sp, :].permute(2, 0, 1).reshape(d, b * sa).contiguous(),
                                  v_active=v[:, :, sp - sa:sp, :].contiguous(), k_prior=k, v_prior=v,
                                  mask=torch.ones((sp, b, g, sa), dtype=torch.uint8))
        pairs.append(pair)
    return pairs


def _ours_backward(op: str, args, kwargs, target: str, lnc: int) -> Side:
    """Our backward kernel of ``op`` on a forward call's inputs (the registry's backward
    arguments: fresh output gradients plus what the forward saves)."""
    backward = registry.get(op).backward
    gen = torch.Generator().manual_seed(zlib.crc32(f"{op} backward".encode()))
    bargs, bkwargs = backward.inputs(gen, args, kwargs)
    call = backward.kernel_call(*bargs, **bkwargs)
    kernel = _dispatch.simulator_kernel(call)[lnc]
    tensors = tuple(t.detach().contiguous() for t in call.tensors)
    return _side(simulator.estimate(kernel, target)(*tensors, **call.static))


def attention_backward_pairs(lib: NkiLibrary, target: str, lnc: int, quick: bool) -> list[Pair]:
    """Attention backward: ours (dQ, dK, dV from Q, K, V, O, dO and the fp32 lse) vs AWS's
    attention_bwd (q/k/v/o/dy as [B, H, d, S], lse [B, H, 128, S / 128]); shapes from AWS's
    own test table (a non-causal 16-head 1024, a causal GQA Llama 2048 and GPT-2's causal 12
    heads, test_cases_misc (1, 12, 12, 1024, 64))."""
    shapes = [(1, 16, 16, 1024, 64, False), (1, 8, 2, 2048, 128, True), (1, 12, 12, 1024, 64, True)]
    if quick:
        shapes = shapes[:1]
    pairs = []
    for b, h, kvh, s, d, causal in shapes:
        gen = torch.Generator().manual_seed(zlib.crc32(f"attn-bwd{b}{h}{kvh}{s}{d}".encode()))
        q = _rand((b, h, s, d), torch.bfloat16, gen)
        k, v = (_rand((b, kvh, s, d), torch.bfloat16, gen) for _ in range(2))
        pair = Pair("scaled_dot_product_attention backward",
                    f"B={b} H={h}/{kvh}kv S={s} D={d}{' causal' if causal else ''} bf16")
        pair.ours = _ours_backward("scaled_dot_product_attention", (q, k, v), {"is_causal": causal}, target, lnc)
        heads_d_s = (lambda t: t.transpose(2, 3).contiguous())
        o, dy = (_rand((b, h, s, d), torch.bfloat16, gen) for _ in range(2))
        lse = torch.rand((b, h, 128, s // 128), generator=gen) + 5.0   # values do not change the time
        pair.aws = lib.run("core.attention.attention_bwd", "attention_bwd", target, lnc,
                           q_ref=heads_d_s(q), k_ref=heads_d_s(k), v_ref=heads_d_s(v), o_ref=heads_d_s(o),
                           dy_ref=heads_d_s(dy), lse_ref=lse, use_causal_mask=causal,
                           softmax_scale=1.0 / math.sqrt(d))
        pairs.append(pair)
    return pairs


def no_counterpart_pairs() -> list[Pair]:
    """AWS kernels that overlap ours only in part: listed, not compared."""
    return [
        Pair("MLP pieces", "any", Side("no counterpart", note="ours: silu_and_mul/gelu_and_mul only; AWS's mlp fuses the matmuls"),
             Side("not run", note="not comparable", kernel="core.mlp.mlp (CTE/TKG)")),
    ]


def _sum(sides: list[Side]) -> Side:
    bad = [s for s in sides if s.status != "ok"]
    if bad:
        return bad[0]
    launches = f"{sides[0].kernel} x {len(sides)}" if len(sides) > 1 else sides[0].kernel
    return Side("ok", sum(s.us for s in sides), sum(s.low for s in sides), sum(s.high for s in sides),
                kernel=launches)


def table(pairs: list[Pair], target: str) -> str:
    lines = [f"| op | shape | ours, modeled ({target}) us (error bar) | AWS's kernel | nki-library, modeled "
             f"({target}) us (error bar) | ours / AWS | ours at least as fast |", "|---|---|---|---|---|---|---|"]
    for p in pairs:
        ratio = "-" if math.isnan(p.ratio) else f"{p.ratio:.2f}"
        claim = {None: "-", True: "yes", False: "no"}[p.ours_at_least_as_fast]
        lines.append(f"| {p.op} | {p.shape} | {p.ours.text()} | {p.aws.kernel or '-'} | {p.aws.text()} | {ratio} "
                     f"| {claim} |")
    return "\n".join(lines)


def write_csv(pairs: list[Pair], path: Path, target: str, lnc: int, commit: str) -> None:
    """One row per pair: what the table shows, unrounded, with whole notes (MODELED columns
    carry the target in their name)."""
    m = f"modeled_{target}"
    fields = ["op", "shape", "aws_kernel", "lnc", "nkilib_commit",
              "ours_status", f"ours_us_{m}", f"ours_low_us_{m}", f"ours_high_us_{m}", "ours_note",
              "aws_status", f"aws_us_{m}", f"aws_low_us_{m}", f"aws_high_us_{m}", "aws_note",
              "ours_over_aws", "ours_at_least_as_fast"]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for p in pairs:
            row = {"op": p.op, "shape": p.shape, "aws_kernel": p.aws.kernel, "lnc": lnc, "nkilib_commit": commit,
                   "ours_over_aws": "" if math.isnan(p.ratio) else p.ratio,
                   "ours_at_least_as_fast": {None: "", True: "yes", False: "no"}[p.ours_at_least_as_fast]}
            for name, side in (("ours", p.ours), ("aws", p.aws)):
                row.update({f"{name}_status": side.status, f"{name}_note": side.note,
                            f"{name}_us_{m}": "" if math.isnan(side.us) else side.us,
                            f"{name}_low_us_{m}": "" if math.isnan(side.low) else side.low,
                            f"{name}_high_us_{m}": "" if math.isnan(side.high) else side.high})
            w.writerow(row)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nkilib", required=True, help="path of an aws-neuron/nki-library checkout")
    ap.add_argument("--target", default="trn2", choices=("trn2", "trn3"))
    ap.add_argument("--lnc", type=int, default=2, choices=(1, 2),
                    help="launch degree of both sides (default 2: how AWS's compiler launches on trn2/trn3)")
    ap.add_argument("--commit", default="", help="nki-library commit, when the checkout has no .git")
    known = ("rms_norm", "layer_norm", "rope", "rope_backward", "attention", "attention_decode", "attention_backward")
    ap.add_argument("--ops", default=",".join(known), help="comma-separated ops to compare (default: all)")
    ap.add_argument("--quick", action="store_true", help="one or two shapes per op")
    ap.add_argument("--markdown", default="", help="also write the table to this file")
    ap.add_argument("--csv", default=str(DEFAULT_CSV),
                    help="write the pairs as CSV to this file, the file a plot is made from (unrounded, whole "
                    "notes; default out/side_by_side.csv)")
    args = ap.parse_args(argv)
    for flag, value in (("--markdown", args.markdown), ("--csv", args.csv)):
        if value and value != str(DEFAULT_CSV) and not Path(value).parent.is_dir():
            ap.error(f"{flag} {value}: folder {Path(value).parent} does not exist")
    ops = {o.strip() for o in args.ops.split(",") if o.strip()}
    if not ops:
        ap.error(f"--ops {args.ops!r} names no op; choose from {', '.join(known)}")
    unknown = ops - set(known)
    if unknown:
        ap.error(f"--ops {sorted(unknown)} unknown; choose from {', '.join(known)}")
    try:
        lib = NkiLibrary(Path(args.nkilib))
    except FileNotFoundError as err:
        ap.error(str(err))
    if args.commit:
        lib.commit = args.commit
    pairs: list[Pair] = []
    for op in ("rms_norm", "layer_norm"):
        if op in ops:
            pairs += norm_pairs(lib, op, args.target, args.lnc, args.quick)
    if "rope" in ops:
        pairs += rope_pairs(lib, args.target, args.lnc, args.quick)
    if "rope_backward" in ops:
        pairs += rope_backward_pairs(lib, args.target, args.lnc, args.quick)
    if "attention" in ops:
        pairs += attention_pairs(lib, args.target, args.lnc, args.quick)
    if "attention_decode" in ops:
        pairs += attention_decode_pairs(lib, args.target, args.lnc, args.quick)
    if "attention_backward" in ops:
        pairs += attention_backward_pairs(lib, args.target, args.lnc, args.quick)
    pairs += no_counterpart_pairs()
    text = (f"nki-library @ {lib.commit} vs nki-kernels, both MODELED ({args.target}) by the nki_kernels cost "
            f"model; both at LNC={args.lnc}. Not measured on hardware.\n\n"
            + table(pairs, args.target))
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
        print(f"wrote {args.markdown}")
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)     # (out/ for the default)
        write_csv(pairs, Path(args.csv), args.target, args.lnc, lib.commit)
        print(f"wrote {args.csv} (MODELED, {args.target})")
    blocked = [p for p in pairs if p.aws.status == "blocked"]   # our simulator's gaps only
    if blocked:
        print(f"\n{len(blocked)} AWS kernel run(s) blocked in our simulator; first: {blocked[0].aws.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Attention: ``scaled_dot_product_attention`` as a custom op running the NKI kernels of
``kernels/attention.py`` (the transformers attention function built on it is
``nki_kernels.transformers.nki_attention_forward``).

Kernel variants (the op picks one per call, see :func:`attention_kernel_call`):

* ``attention_kernel`` (single pass): ``Sk <= SINGLE_PASS_MAX_KEYS``. A 128-query tile's
  whole score row ``[128, Sk]`` stays on chip (PSUM), softmax in one pass.
* ``flash_attention_kernel`` (online softmax): any ``Sk`` (tested to 16K). Keys are
  streamed in blocks of 2048; running max / sum / output are rescaled per block, so
  SBUF/PSUM use does not grow with the sequence.

Masks: a key-padding mask (broadcasting to ``[B, 1, 1, Sk]``) is passed to the kernel as
an additive fp32 ``[B or 1, Sk]`` row; any other mask is materialised as an additive fp32
``[B or 1, H or 1, Sq, Sk]`` tensor. Booleans become ``0 / -inf``.

All-masked query rows (every key masked by ``False`` / ``-inf``, alone or with
``is_causal``): the output row is 0, as torch's SDPA gives. A finite "minus large" mask
(``torch.finfo(dtype).min``, as transformers builds) is plain arithmetic: the row is the
softmax of equal scores, i.e. the mean of the values, again as SDPA gives.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .. import _checks, _dispatch, _kernel_sources, references, registry, roofline
from .._custom_op import KernelBackward, define_op
from ._workloads import randn

__all__ = ["scaled_dot_product_attention"]

# The kernels' limits (kernels/limits.py, where the reasons are): head dims, and the longest
# key sequence the single-pass kernel takes.
MAX_HEAD_DIM = _kernel_sources.limits().ATTENTION_MAX_HEAD_DIM
SINGLE_PASS_MAX_KEYS = _kernel_sources.limits().ATTENTION_SINGLE_PASS_MAX_KEYS
KERNEL_MODULE = "attention"   # kernels/attention.py
# Grouped-query calls with fewer query rows than one 128-row tile (decode, short chunks) and
# no is_causal fold each kv head's query heads into its query rows (_folded_inputs; a
# per-row mask folds with them, _folded_mask): modeled trn2 LNC=2, decode B=4 H=8/1kv S=1024 d=128 31.4 -> 11.9 us,
# B=1 H=32/8kv S=2048 82.0 -> 34.7 us.
FOLD_MAX_QUERY_ROWS = 128
BACKWARD_MODULE = "attention_bwd"   # kernels/attention_bwd.py
_MASK_DTYPES = (torch.bool, torch.float32)


# ---------------------------------------------------------------------------- validation

def _dims(name: str, t: torch.Tensor) -> None:
    if t.dim() < 3:
        raise ValueError(f"{name} must have at least 3 dims ([..., seq, head_dim]), got shape {tuple(t.shape)}")
    # Batch, heads and sequence may be empty (the result is what torch's SDPA gives); the
    # query/key head dim is what Q·Kᵀ contracts over and must not be.
    if name in ("query", "key") and t.shape[-1] == 0:
        raise ValueError(f"{name} has head_dim 0 (shape {tuple(t.shape)}); the query/key head dim "
                         "must be >= 1")


def _validate(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """Check SDPA's contract; every error names the argument, the value and the limit."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        _checks.check_float_tensor(name, t)
    _checks.check_same_dtype(query=query, key=key, value=value)
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask is not None:
        _checks.check_dense("attn_mask", attn_mask)
    _checks.check_same_device(query=query, key=key, value=value, attn_mask=attn_mask)
    for name, t in (("query", query), ("key", key), ("value", value)):
        _dims(name, t)
    if not (query.dim() == key.dim() == value.dim()):
        raise ValueError(
            f"query, key and value must have the same number of dims, got {query.dim()}, {key.dim()} and {value.dim()}")
    # any real number, numpy scalars too (torch takes them), then the range
    p = _checks.check_real("dropout_p", dropout_p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout_p={dropout_p!r} must be a float in [0, 1]")
    if p != 0.0:
        raise NotImplementedError(
            f"dropout_p={dropout_p}: the NKI attention kernel has no dropout; pass dropout_p=0.0 "
            "(e.g. model.eval()) or use torch.nn.functional.scaled_dot_product_attention")
    _checks.check_bool("is_causal", is_causal)
    _checks.check_bool("enable_gqa", enable_gqa)
    if scale is not None:
        _checks.check_real("scale", scale, "a float or None")
        if not math.isfinite(scale) or abs(scale) > _checks.FP32_MAX:
            # (the kernel scales in fp32: past its range the scale is infinite there)
            raise ValueError(f"scale={scale} must be finite in float32 (|scale| at most {_checks.FP32_MAX:.6g})")

    lead = query.shape[:-3]
    if key.shape[:-3] != lead or value.shape[:-3] != lead:
        raise ValueError(
            f"batch dims differ: query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}")
    d, dk, dv = query.shape[-1], key.shape[-1], value.shape[-1]
    if dk != d:
        raise ValueError(f"key head_dim {dk} does not match query head_dim {d}")
    for name, size in (("query/key head_dim", d), ("value head_dim", dv)):
        if size > MAX_HEAD_DIM:
            raise ValueError(f"{name}={size} exceeds {MAX_HEAD_DIM}, the largest head dim the NKI attention "
                             "kernel takes")
    sk, skv = key.shape[-2], value.shape[-2]
    if skv != sk:
        raise ValueError(f"value has {skv} keys (dim -2) but key has {sk}")
    h, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
    if hv != hk:
        raise ValueError(f"value has {hv} heads (dim -3) but key has {hk}")
    if h != hk:
        if not enable_gqa:
            raise ValueError(
                f"query has {h} heads but key/value have {hk}; pass enable_gqa=True for grouped-query attention")
        if hk == 0 or h % hk:
            raise ValueError(f"query heads {h} must be a multiple of key/value heads {hk} (enable_gqa=True)")

    if attn_mask is not None:
        if attn_mask.dtype not in _MASK_DTYPES and attn_mask.dtype != query.dtype:
            raise TypeError(
                f"attn_mask has dtype {str(attn_mask.dtype).removeprefix('torch.')}; expected bool, "
                f"float32 or the query dtype {str(query.dtype).removeprefix('torch.')}")
        target = tuple(lead) + (h, query.shape[-2], sk)
        try:
            torch.broadcast_shapes(tuple(attn_mask.shape), target)
            ok = attn_mask.dim() <= len(target) and all(
                a in (1, b) for a, b in zip(reversed(attn_mask.shape), reversed(target)))
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                f"[..., heads, Sq, Sk] = {list(target)}")


# ---------------------------------------------------------------------------- kernel launch

def _layout(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> str:
    """"bshd" when q/k/v are transposed views of [B, S, H, D] memory (how transformers
    builds them), so the kernel reads them, and writes the output, with no copy; else "bhsd"."""
    if query.is_contiguous() and key.is_contiguous() and value.is_contiguous():
        return "bhsd"
    if all(t.transpose(1, 2).is_contiguous() for t in (query, key, value)):
        return "bshd"
    return "bhsd"


def _kernel_mask(attn_mask: Optional[torch.Tensor], b: int, h: int, sq: int, sk: int):
    """The mask as the kernel takes it: None, an additive fp32 key row [B or 1, Sk], or an
    additive fp32 [B or 1, H or 1, Sq, Sk] tensor. Booleans become 0 / -inf."""
    if attn_mask is None:
        return None
    m = attn_mask
    while m.dim() < 4:
        m = m.unsqueeze(0)
    if m.dtype == torch.bool:
        m = torch.zeros(m.shape, dtype=torch.float32, device=m.device).masked_fill(~m, float("-inf"))
    else:
        m = m.to(torch.float32)
    mb, mh, mq, _ = m.shape
    if mh == 1 and mq == 1:
        return m.expand(mb, 1, 1, sk).reshape(mb, sk).contiguous()
    return m.expand(mb, mh, sq, sk).contiguous()


def attention_kernel_call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                          is_causal: bool = False, scale: Optional[float] = None,
                          enable_gqa: bool = False) -> _dispatch.KernelCall:
    """The NKI launch computing SDPA for 4-D ``query [B, H, Sq, D]``, ``key [B, Hkv, Sk, D]``,
    ``value [B, Hkv, Sk, Dv]`` (``H`` a multiple of ``Hkv``; the kernel reads kv head
    ``h // (H // Hkv)`` for query head ``h`` whatever ``enable_gqa`` says; ``dropout_p``
    must be 0, as the public function checks). Picks ``attention_kernel``
    (single pass) for ``Sk <= SINGLE_PASS_MAX_KEYS``, else ``flash_attention_kernel``.
    ``finish`` turns the kernel output into ``[B, H, Sq, Dv]`` (a transposed view of a
    ``[B, Sq, H, Dv]`` buffer when the inputs were such views)."""
    b, h, sq, d = query.shape
    hk, sk = key.shape[1], key.shape[2]
    if scale is None:
        scale = d ** -0.5
    layout = _layout(query, key, value)
    mask = _kernel_mask(attn_mask, b, h, sq, sk)
    group = h // hk
    static = {"scale": float(scale), "causal": bool(is_causal), "layout": layout}
    if group > 1 and sq < FOLD_MAX_QUERY_ROWS and not is_causal:
        tensors, finish = _folded_inputs(query, key, value, layout, group)
        if mask is not None and mask.dim() == 4:
            if mask.shape[1] == 1:
                # the G heads' rows repeat the same sq rows: the decode path loads them once
                static["mask_period"] = sq
            mask = _folded_mask(mask, group)
    elif layout == "bshd":
        tensors = (query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2))
        finish = _finish_bshd
    else:
        tensors = (query.contiguous(), key.contiguous(), value.contiguous())
        finish = None
    if mask is not None:
        tensors = tensors + (mask,)
    kernel = "attention_kernel" if sk <= SINGLE_PASS_MAX_KEYS else "flash_attention_kernel"
    return _dispatch.KernelCall(KERNEL_MODULE, kernel, tensors, static, finish)


def _finish_bshd(out):
    return out.transpose(1, 2)


def _folded_mask(mask, group):
    """A per-row kernel mask [Bm, Hm, Sq, Sk] for the folded launch: [Bm, Hm', G * Sq, Sk]
    with row g * Sq + s of kv head kv = the mask of query head kv * G + g at position s
    (Hm = H: a reshape; Hm = 1: the same rows repeated for each of the G heads, a copy of
    G * Sq rows, small where the fold applies; the launch's ``mask_period`` = Sq tells the
    kernel so, and its decode path loads the Sq distinct rows once per kv head)."""
    mb, mh, sq, sk = mask.shape
    if mh == 1:
        return mask.repeat(1, 1, group, 1)
    return mask.reshape(mb, mh // group, group * sq, sk)


def _folded_inputs(query, key, value, layout, group):
    """(tensors, finish) of a grouped-query launch with short queries (decode), the
    ``group`` query heads of each kv head folded into its query rows: q [B, H, Sq, D] as
    [B, Hkv, G * Sq, D] (row g * Sq + s is query head kv * G + g, position s), so one
    128-row query tile holds every head of the group instead of Sq rows of one head, and
    K / V are read once per kv head. Exact: every row's softmax is its own; without a causal
    mask no row's keys depend on its position, and a per-row mask folds with the rows
    (_folded_mask). bhsd inputs fold as views; bshd ones copy q and the output
    (B * H * Sq * D elements, small where this applies), never K / V. The LSE of
    ``attention_lse_kernel_call``, [B, Hkv, G * Sq], is [B, H, Sq] reshaped."""
    b, h, sq, d = query.shape
    hk, dv = key.shape[1], value.shape[-1]
    rows = group * sq
    if layout == "bshd":
        # [B, Sq, H, D] memory -> [B, G * Sq, Hkv, D] (row g * Sq + s of kv head kv)
        q = query.transpose(1, 2).reshape(b, sq, hk, group, d).permute(0, 3, 1, 2, 4).reshape(b, rows, hk, d)
        tensors = (q.contiguous(), key.transpose(1, 2), value.transpose(1, 2))

        def finish(out):   # [B, G * Sq, Hkv, Dv] -> a [B, H, Sq, Dv] view of [B, Sq, H, Dv] memory
            o = out.reshape(b, group, sq, hk, dv).permute(0, 2, 3, 1, 4).reshape(b, sq, h, dv)
            return o.contiguous().transpose(1, 2)
    else:
        tensors = (query.contiguous().reshape(b, hk, rows, d), key.contiguous(), value.contiguous())

        def finish(out):   # [B, Hkv, G * Sq, Dv] -> [B, H, Sq, Dv], a view
            return out.reshape(b, h, sq, dv)
    return tensors, finish


# ---------------------------------------------------------------------------- custom op

def _empty_out(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *_) -> torch.Tensor:
    """The output's shape, dtype and layout (uninitialised), or zeros when there are no keys:
    an empty softmax attends to nothing, and torch's SDPA returns 0 for Sk = 0."""
    b, h, sq, _ = query.shape
    dv = value.shape[-1]
    new = query.new_zeros if key.shape[2] == 0 else query.new_empty
    if _layout(query, key, value) == "bshd":
        return new((b, sq, h, dv)).transpose(1, 2)
    return new((b, h, sq, dv))


def _nothing_to_compute(query, key, value, *_) -> bool:
    """No output element, or no key (zeros): ``_empty_out`` is the result, no kernel runs."""
    return query.shape[0] * query.shape[1] * query.shape[2] * value.shape[-1] == 0 or key.shape[2] == 0


def _twin(query, key, value, attn_mask, is_causal, scale, compute_dtype=None):
    if _nothing_to_compute(query, key, value):
        # constant (empty or zeros): no gradient flows to the inputs
        return query.new_zeros(tuple(query.shape[:3]) + (value.shape[-1],))
    return references.scaled_dot_product_attention(
        query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        enable_gqa=query.shape[1] != key.shape[1], compute_dtype=compute_dtype)


def _reference(query, key, value, attn_mask, is_causal, scale):
    """The twin (torch's SDPA in the input dtype) in the layout the kernel would write
    (``_empty_out``); torch's CPU SDPA already writes that layout, so nothing is copied."""
    result = _twin(query, key, value, attn_mask, is_causal, scale)
    out = _empty_out(query, key, value)
    if result.stride() == out.stride():
        return result
    return out.copy_(result)


def _scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                  attn_mask: Optional[torch.Tensor], is_causal: bool,
                                  scale: float) -> torch.Tensor: ...


_sdpa_op = define_op(_scaled_dot_product_attention, kernel_call=attention_kernel_call, reference=_reference,
                     fake=_empty_out, grad_reference=lambda *args: _twin(*args, compute_dtype=torch.float32),
                     is_empty=_nothing_to_compute)


# ---------------------------------------------------------------------------- training: lse + backward kernel
#
# When autograd needs gradients of q, k or v, the public function calls
# ``scaled_dot_product_attention_lse``, which also returns the per-row log-sum-exp
# ``lse [B, H, Sq]`` (fp32) the forward kernel saves (``return_lse=True``); its autograd
# formula calls ``scaled_dot_product_attention_backward``, whose body runs the NKI backward
# kernel (kernels/attention_bwd.py) on ``neuron`` and on the simulator backend, and PyTorch
# math (fp32 autograd of the twin) on the reference backend. Without grad the plain op runs
# (no lse, nothing saved). A float attn_mask that itself requires grad takes the plain op's
# recompute backward (its gradient is an [Sq, Sk] tensor, which the kernel never makes).


def attention_lse_kernel_call(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """The forward launch of ``attention_kernel_call`` with ``return_lse=True``: the op's
    result is (out, lse [B, H, Sq] fp32)."""
    call = attention_kernel_call(query, key, value, attn_mask, 0.0, is_causal, scale,
                                 enable_gqa=query.shape[1] != key.shape[1])
    finish = call.finish
    b, h, sq = query.shape[:3]

    def both(outputs):
        out, lse = outputs
        # [B, H, Sq] as the kernel wrote it, or [B, Hkv, G * Sq] from a folded launch
        # (_folded_inputs), whose rows g * Sq + s are query head kv * G + g
        return (out if finish is None else finish(out)), lse.reshape(b, h, sq)

    return _dispatch.KernelCall(call.module, call.kernel, call.tensors, {**call.static, "return_lse": True}, both)


def _reference_lse(query, key, value, attn_mask, is_causal, scale):
    """(twin output, lse) on the reference backend: lse = logsumexp(scale·S + mask) in fp32."""
    out = _reference(query, key, value, attn_mask, is_causal, scale)
    return out, _lse_twin(query, key, attn_mask, is_causal, scale)


def _lse_twin(query, key, attn_mask, is_causal, scale):
    b, h, sq, _ = query.shape
    if query.numel() == 0 or key.shape[2] == 0:
        return query.new_full((b, h, sq), float("-inf"), dtype=torch.float32)
    k = key.float().repeat_interleave(h // key.shape[1], dim=1)
    s = (query.float() @ k.transpose(-1, -2)) * scale
    mask = _kernel_mask(attn_mask, b, h, sq, key.shape[2])
    if mask is not None:
        s = s + (mask[:, None, None, :] if mask.dim() == 2 else mask)
    if is_causal:
        keep = torch.ones(sq, key.shape[2], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.logsumexp(s, dim=-1)


def _empty_lse(query, key, value, *_):
    b, h, sq, _ = query.shape
    return _empty_out(query, key, value), query.new_empty((b, h, sq), dtype=torch.float32)


def _twin_lse(query, key, value, attn_mask, is_causal, scale):
    return (_twin(query, key, value, attn_mask, is_causal, scale, compute_dtype=torch.float32),
            _lse_twin(query, key, attn_mask, is_causal, scale))


def attention_backward_kernel_call(grad_out, query, key, value, out, lse, attn_mask=None,
                                   is_causal=False, scale=None) -> _dispatch.KernelCall:
    """The NKI backward launch (kernels/attention_bwd.py): every tensor as [B, heads, S, d]
    contiguous (a transposed-layout input or output is copied), the mask as the forward
    kernel takes it. Returns (dq, dk, dv) in the input dtype."""
    b, h, sq, d = query.shape
    if scale is None:
        scale = d ** -0.5
    tensors = tuple(t.contiguous() for t in (query, key, value, out, grad_out.to(query.dtype)))
    tensors = tensors + (lse.contiguous(),)
    mask = _kernel_mask(attn_mask, b, h, sq, key.shape[2])
    static = {"scale": float(scale), "causal": bool(is_causal)}
    if mask is not None:
        return _dispatch.KernelCall(BACKWARD_MODULE, "attention_bwd_kernel", tensors + (mask,), static)
    # Without a mask the batches are more heads: [B, H, S, d] contiguous is [1, B·H, S, d]
    # (kv head b·Hkv + j still serves query heads (b·Hkv + j)·G ...), so the kernel's units
    # of kv heads span batches and its loads and stores move more heads per transfer.
    flat = tuple(t.reshape((1, t.shape[0] * t.shape[1]) + tuple(t.shape[2:])) for t in tensors)
    shapes = (query.shape, key.shape, value.shape)
    return _dispatch.KernelCall(BACKWARD_MODULE, "attention_bwd_kernel", flat, static,
                                lambda grads: tuple(g.reshape(s) for g, s in zip(grads, shapes)))


def _backward_math(grad_out, query, key, value, attn_mask, is_causal, scale, compute_dtype=torch.float32):
    """dq, dk, dv of attention in ``compute_dtype`` with explicit PyTorch ops (the body of a
    custom op runs below autograd, so the formulas are written out): P = softmax(scale·S +
    mask) (an all-masked row: P = 0, as the forward returns 0), dV = Pᵀ·dO, dS = P ⊙ (dO·Vᵀ -
    rowsum(dO ⊙ O)), dQ = scale·dS·K, dK = scale·dSᵀ·Q; GQA sums over each kv head's group."""
    b, h, sq, _ = query.shape
    hkv, sk = key.shape[1], key.shape[2]
    g = h // hkv
    q, k, v, do = (t.to(compute_dtype) for t in (query, key, value, grad_out))
    k_rep, v_rep = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q @ k_rep.transpose(-1, -2)) * scale
    mask = _kernel_mask(attn_mask, b, h, sq, sk)
    if mask is not None:
        s = s + (mask[:, None, None, :] if mask.dim() == 2 else mask).to(compute_dtype)
    if is_causal:
        keep = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    empty = torch.isneginf(s).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    dv = (p.transpose(-1, -2) @ do).unflatten(1, (hkv, g)).sum(2)
    dp = do @ v_rep.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    dq = (ds @ k_rep) * scale
    dk = ((ds.transpose(-1, -2) @ q) * scale).unflatten(1, (hkv, g)).sum(2)
    return dq, dk, dv


def _empty_grads(grad_out, query, key, value, *_):
    return (query.new_zeros(query.shape), key.new_zeros(key.shape, dtype=query.dtype),
            value.new_zeros(value.shape, dtype=query.dtype))


def _no_backward_work(grad_out, query, key, value, *_):
    return query.numel() == 0 or key.shape[2] == 0 or value.shape[-1] == 0


def _reference_backward(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale):
    """The reference backend's backward: PyTorch math in fp32, one rounding to the dtype."""
    if _no_backward_work(grad_out, query, key, value):
        return _empty_grads(grad_out, query, key, value)
    grads = _backward_math(grad_out, query, key, value, attn_mask, is_causal, scale)
    return tuple(g.to(query.dtype).contiguous() for g in grads)


def _grad_reference_backward(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale):
    """Differentiable form of the backward (for a double backward): the same formulas."""
    return _backward_math(grad_out, query, key, value, attn_mask, is_causal, scale)


def _scaled_dot_product_attention_backward(
        grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, attn_mask: Optional[torch.Tensor], is_causal: bool,
        scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


_sdpa_backward_op = define_op(
    _scaled_dot_product_attention_backward, kernel_call=attention_backward_kernel_call,
    reference=_reference_backward, fake=_empty_grads, grad_reference=_grad_reference_backward,
    is_empty=_no_backward_work)


def _lse_grads(inputs, outputs, grad_outputs):
    """Autograd formula of the lse op: the backward op on (dO, q, k, v, O, lse); no gradient
    for the mask (see the section comment), is_causal and scale."""
    query, key, value, attn_mask, is_causal, scale = inputs
    out, lse = outputs
    grad_out = grad_outputs[0] if grad_outputs[0] is not None else torch.zeros_like(out)
    dq, dk, dv = _sdpa_backward_op(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale)
    return dq, dk, dv, None, None, None


def _scaled_dot_product_attention_lse(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                      attn_mask: Optional[torch.Tensor], is_causal: bool,
                                      scale: float) -> tuple[torch.Tensor, torch.Tensor]: ...


_sdpa_lse_op = define_op(
    _scaled_dot_product_attention_lse, kernel_call=attention_lse_kernel_call, reference=_reference_lse,
    fake=_empty_lse, grad_reference=_twin_lse, is_empty=_nothing_to_compute,
    backward=KernelBackward(_lse_grads, save_outputs=(0, 1)))


def _wants_kernel_backward(query, key, value, attn_mask) -> bool:
    """Autograd will ask for gradients of q, k or v, and none of a float mask."""
    if not torch.is_grad_enabled():
        return False
    if not any(t.requires_grad for t in (query, key, value)):
        return False
    return attn_mask is None or not attn_mask.requires_grad


# ---------------------------------------------------------------------------- public API

def _autocast_inputs(query, key, value, attn_mask):
    """Inside ``torch.autocast`` for the inputs' device, torch's SDPA is a lower-precision op:
    autocast casts its floating inputs (float64 excepted) to the autocast dtype. This op takes
    them the same way, so a model under autocast gets from it what SDPA gives (a bf16 q/k from
    an fp32 rotary beside a bf16 v would otherwise be refused as mixed dtypes). Custom ops
    are outside autocast's lists, hence the explicit cast."""
    if not isinstance(query, torch.Tensor):
        return query, key, value, attn_mask
    device = query.device.type
    if not (torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)):
        return query, key, value, attn_mask
    dtype = torch.get_autocast_dtype(device)

    def cast(t):
        eligible = isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
        return t.to(dtype) if eligible else t

    return cast(query), cast(key), cast(value), cast(attn_mask)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """Attention with the ``torch.nn.functional.scaled_dot_product_attention`` contract.

    Shapes: query ``[..., H, Sq, D]``, key ``[..., Hkv, Sk, D]``, value ``[..., Hkv, Sk, Dv]``
    (3-D inputs are ``[H, S, D]``, no batch dim), ``1 <= D <= 256``, ``Dv <= 256``; batch, ``H``,
    ``Sq`` and ``Sk`` may be 0 (an empty result, or zeros when ``Sk = 0``, as torch gives);
    ``H == Hkv``, or ``H`` a multiple of ``Hkv`` with ``enable_gqa=True`` (query head ``h``
    reads kv head ``h // (H // Hkv)``). Returns ``[..., H, Sq, Dv]`` in the input dtype.
    dtypes: float32, bfloat16, float16 (all three the same). Under ``torch.autocast`` for
    their device they are cast to the autocast dtype first, as torch's SDPA is.

    ``attn_mask`` broadcasts to ``[..., H, Sq, Sk]``: bool (True = attend) or additive float
    (float32 or the query dtype). ``is_causal`` keeps keys ``j <= i`` (top-left aligned);
    given together with ``attn_mask`` both apply (as CPU SDPA does). ``scale`` defaults to
    ``D ** -0.5``. ``dropout_p > 0`` raises ``NotImplementedError``.

    A query row whose keys are all masked (``False`` / ``-inf``) returns 0, like torch's
    SDPA; a finite large negative mask (``finfo.min``) gives the mean of the values.

    Runs, per input device:
      * ``neuron``: the NKI kernel through AWS's toolchain (``nki`` + ``torch_neuronx``),
        written as the TorchNeuron docs describe; NOT YET RUN ON HARDWARE.
      * ``cpu``: the PyTorch reference (``references.scaled_dot_product_attention``) by
        default; the NKI kernel in the bundled simulator when
        ``NKI_KERNELS_CPU_BACKEND=simulator``.
    Numerics of the kernel: softmax statistics in fp32; matmul operands in the input dtype
    (bf16 stays bf16, fp32 stays fp32); normalisation after P·V (FlashAttention-2 style).
    For 16-bit inputs P is rounded to the input dtype before P·V (the reference keeps it
    fp32): an output element is off by up to 2 u max_j |v_j| (its column's largest value)
    beyond the final rounding, u the dtype's unit roundoff (2**-8 bf16, 2**-11 fp16).

    Autograd: when gradients of query, key or value are needed, the forward also saves the
    per-row log-sum-exp (fp32) and the backward is the NKI backward kernel (FlashAttention-2
    style, kernels/attention_bwd.py: P recomputed per block, no [Sq, Sk] tensor in HBM) on
    ``neuron`` and on the simulator backend, PyTorch math (fp32) on the reference backend.
    A float ``attn_mask`` that requires grad takes a backward that recomputes attention
    with PyTorch ops in fp32 (its gradient is [Sq, Sk]). Works under
    ``torch.compile(fullgraph=True)``, forward and backward (the ops have fake implementations).
    """
    query, key, value, attn_mask = _autocast_inputs(query, key, value, attn_mask)
    _validate(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if scale is None:
        scale = query.shape[-1] ** -0.5
    squeeze = query.dim() == 3
    lead = query.shape[:-3]
    if squeeze:  # [H, S, D] -> [1, H, S, D] (dim -3 is the head dim, as SDPA's enable_gqa reads it)
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    elif len(lead) > 1:  # [..., H, S, D] -> [prod(...), H, S, D] (explicit size: may be 0)
        batch = math.prod(lead)
        if attn_mask is not None:
            full = tuple(lead) + (query.shape[-3], query.shape[-2], key.shape[-2])
            attn_mask = attn_mask.expand(full).reshape((batch,) + full[-3:])
        query, key, value = (t.reshape((batch,) + tuple(t.shape[-3:])) for t in (query, key, value))
    if _wants_kernel_backward(query, key, value, attn_mask):
        out = _sdpa_lse_op(query, key, value, attn_mask, is_causal, float(scale))[0]
    else:
        out = _sdpa_op(query, key, value, attn_mask, is_causal, float(scale))
    if squeeze:
        return out.squeeze(0)
    if len(lead) > 1:
        return out.reshape(tuple(lead) + tuple(out.shape[-3:]))
    return out


# ---------------------------------------------------------------------------- registration

def _workload_label(name, b, h, s, d, hkv=None, causal=False, sq=None, key_padding=False):
    hkv = hkv or h
    return (f"{name} B={b} H={h}" + (f"/{hkv}kv" if hkv != h else "") + (f" Sq={sq}" if sq not in (None, s) else "")
            + f" S={s} D={d}" + (" causal" if causal else "") + (" key padding" if key_padding else ""))


def _workload(name, b, h, s, d, hkv=None, causal=False, sq=None, key_padding=False, **kw):
    """A registry workload: q [b, h, sq (default s), d], k / v [b, hkv, s, d]; with
    ``key_padding`` a bool mask [b, 1, 1, s] (transformers' padding mask at decode) whose
    batches pad different numbers of leading keys (batch i: 37 i mod s / 2)."""
    hkv = hkv or h
    sq = s if sq is None else sq

    def make(gen):
        q, k, v = randn(gen, b, h, sq, d), randn(gen, b, hkv, s, d), randn(gen, b, hkv, s, d)
        mask = None
        if key_padding:
            mask = torch.ones((b, 1, 1, s), dtype=torch.bool)
            for i in range(b):
                mask[i, :, :, :(37 * i) % (s // 2)] = False
        return (q, k, v), {"attn_mask": mask, "is_causal": causal, "enable_gqa": hkv != h}

    return registry.Workload(_workload_label(name, b, h, s, d, hkv, causal, sq, key_padding), make, **kw)


def _backward_inputs(gen, args, kwargs):
    """The backward op's arguments for a forward workload: fresh dO, the saved O and lse
    (the reference forward in fp32, O rounded to the dtype)."""
    query, key, value = args
    attn_mask, is_causal = kwargs.get("attn_mask"), kwargs.get("is_causal", False)
    scale = float(query.shape[-1] ** -0.5)
    enable_gqa = query.shape[1] != key.shape[1]
    out = references.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal,
                                                  scale=scale, enable_gqa=enable_gqa,
                                                  compute_dtype=torch.float32).to(query.dtype)
    lse = _lse_twin(query, key, attn_mask, is_causal, scale)
    grad_out = randn(gen, *out.shape, dtype=query.dtype)
    return (grad_out, query, key, value, out, lse), {"attn_mask": attn_mask, "is_causal": is_causal,
                                                      "scale": scale}


def _backward_reference(grad_out, query, key, value, out, lse, attn_mask=None, is_causal=False, scale=None,
                        compute_dtype=torch.float64):
    """dq, dk, dv in ``compute_dtype`` (PyTorch math, ``_backward_math``)."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    return _backward_math(grad_out, query, key, value, attn_mask, is_causal, scale, compute_dtype)


VIT_B, VIT_L, LLAMA_2K = (_workload_label("ViT-B/16", 8, 12, 197, 64), _workload_label("ViT-L/16", 8, 16, 197, 64),
                          _workload_label("Llama long-S", 1, 8, 2048, 128, hkv=2, causal=True))
BACKWARD = registry.Backward(
    custom_op=_sdpa_backward_op, inputs=_backward_inputs, kernel_call=attention_backward_kernel_call,
    reference=_backward_reference, roofline=roofline.scaled_dot_product_attention_backward,
    # issue 15's targets (modeled trn2 LNC=2, over modeled eager autograd)
    speedup_targets={VIT_B: 2.0, VIT_L: 2.0, LLAMA_2K: 3.0})

registry.register(registry.OpSpec(
    "scaled_dot_product_attention", scaled_dot_product_attention, _sdpa_op, attention_kernel_call,
    references.scaled_dot_product_attention, roofline.scaled_dot_product_attention, backward=BACKWARD,
    workloads=(
        _workload("ViT-B/16", 8, 12, 197, 64, quick=True, speedup_target=2.4),
        _workload("ViT-L/16", 8, 16, 197, 64, quick=True, speedup_target=2.4),
        _workload("ViT-B/16 batch 1", 1, 12, 197, 64),
        _workload("SigLIP so400m@384", 2, 16, 729, 72),
        _workload("Llama long-S", 1, 8, 2048, 128, hkv=2, causal=True, quick=True,
                  reference_dtype=torch.float32),
        _workload("Llama long-S", 1, 16, 4096, 128, hkv=4, causal=True, reference_dtype=torch.float32),
        # token generation: one new query per sequence against a padded KV cache
        _workload("Llama decode", 8, 32, 2048, 128, hkv=8, sq=1, key_padding=True, reference_dtype=torch.float32,
                  inference_only=True),
    )))

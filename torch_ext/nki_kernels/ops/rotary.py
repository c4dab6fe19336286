"""Rotary position embedding op, transformers' Llama convention (kernels/rotary.py): its
NKI launch, custom op, public function and registration."""

from __future__ import annotations

import torch

from .. import _checks, _dispatch, backward_references, references, registry, roofline
from .._custom_op import KernelBackward, define_op
from ._workloads import randn

__all__ = ["apply_rotary_pos_emb"]


def _check_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        _checks.check_float_tensor(name, t)
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            raise ValueError(f"{name} has shape {list(t.shape)}; expected 4 dimensions [B, H, S, D]")
    batch, _, seq, dim = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, seq, dim):
        raise ValueError(
            f"k has shape {list(k.shape)} but q has {list(q.shape)}; B, S and D must match "
            "(only the head count may differ)"
        )
    if dim % 2 != 0:
        raise ValueError(f"head dim D={dim} (q shape {list(q.shape)}) is odd; rotate-half needs an even D")
    if cos.shape != sin.shape:
        raise ValueError(f"cos has shape {list(cos.shape)} but sin has {list(sin.shape)}; they must match")
    if cos.dim() == 2:
        ok = tuple(cos.shape) == (seq, dim)
    elif cos.dim() == 3:
        ok = cos.shape[0] in (1, batch) and tuple(cos.shape[1:]) == (seq, dim)
    else:
        ok = False
    if not ok:
        raise ValueError(
            f"cos/sin have shape {list(cos.shape)}, which does not broadcast against q/k "
            f"[B={batch}, H, S={seq}, D={dim}]; expected [S, D] = [{seq}, {dim}] or "
            f"[B, S, D] with B in (1, {batch})"
        )
    _checks.check_same_device(q=q, k=k, cos=cos, sin=sin)


def apply_rotary_pos_emb_kernel_call(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                     sin: torch.Tensor) -> _dispatch.KernelCall:
    """The NKI launch: kernels/rotary.py, cos/sin given to the kernel as [Bc, S, D]. When q
    or k has no element (e.g. zero heads), only the other one goes to the kernel
    (``rotary_single_kernel``) and the empty one's result is a new empty tensor."""
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    if k.numel() == 0:
        return _dispatch.KernelCall("rotary", "rotary_single_kernel", (q, cos, sin),
                                    finish=lambda out: (out, torch.empty_like(k)))
    if q.numel() == 0:
        return _dispatch.KernelCall("rotary", "rotary_single_kernel", (k, cos, sin),
                                    finish=lambda out: (torch.empty_like(q), out))
    return _dispatch.KernelCall("rotary", "rotary_kernel", (q, k, cos, sin),
                                finish=lambda outs: (outs[0], outs[1]))


def apply_rotary_pos_emb_backward_kernel_call(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor,
                                              sin: torch.Tensor) -> _dispatch.KernelCall:
    """The NKI launch of rotary's backward: the forward's kernels with ``transpose=True``
    (the transposed rotation: sin's halves swapped and negated, kernels/rotary.py)."""
    call = apply_rotary_pos_emb_kernel_call(grad_q, grad_k, cos, sin)
    return _dispatch.KernelCall(call.module, call.kernel, call.tensors, {**call.static, "transpose": True},
                                finish=call.finish)


def _apply_rotary_pos_emb_backward(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor,
                                   sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


_rotary_backward_op = define_op(
    _apply_rotary_pos_emb_backward, kernel_call=apply_rotary_pos_emb_backward_kernel_call,
    reference=backward_references.apply_rotary_pos_emb_backward,
    fake=lambda gq, gk, cos, sin: (torch.empty_like(gq), torch.empty_like(gk)),
    grad_reference=lambda *a: backward_references.apply_rotary_pos_emb_backward(*a, compute_dtype=torch.float32),
    is_empty=lambda gq, gk, cos, sin: gq.numel() == 0 and gk.numel() == 0)


def _rotary_grads(inputs, outputs, grad_outputs):
    q, k, cos, sin = inputs
    gq, gk = (torch.zeros_like(t) if g is None else g for g, t in zip(grad_outputs, (q, k)))
    dq, dk = _rotary_backward_op(gq, gk, cos, sin)
    return dq, dk, None, None


def _apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                          sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


_rotary_op = define_op(
    _apply_rotary_pos_emb, kernel_call=apply_rotary_pos_emb_kernel_call, reference=references.apply_rotary_pos_emb,
    fake=lambda q, k, cos, sin: (torch.empty_like(q), torch.empty_like(k)),
    grad_reference=lambda *a: references.apply_rotary_pos_emb(*a, compute_dtype=torch.float32),
    is_empty=lambda q, k, cos, sin: q.numel() == 0 and k.numel() == 0,
    # the kernel backward gives d q and d k; a gradient of cos or sin takes the recompute
    backward=KernelBackward(_rotary_grads, grads_for=(0, 1)))


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding with transformers' Llama ``apply_rotary_pos_emb`` contract (rotate-half).

    q: [B, Hq, S, D], k: [B, Hk, S, D] (Hq and Hk may differ), D even; cos/sin: [B, S, D],
    [1, S, D] or [S, D], broadcast over heads (``unsqueeze_dim=1`` in transformers' terms).
    Float dtypes may differ: as in transformers' ``q * cos + rotate_half(q) * sin``, q_embed
    has torch's promoted dtype of (q, cos, sin) and k_embed that of (k, cos, sin), so a bf16
    q with fp32 cos/sin (an fp32 model under ``torch.autocast``) gives fp32 embeddings. The
    kernel runs in the promotion of all four (each input widened exactly; none when they
    agree). Returns ``(q_embed, k_embed)``; q or k may be empty (e.g. zero heads). Numerics
    on every backend: products and sum in fp32, one rounding to the output dtype (the kernel
    matches the reference bit for bit). Backward: the same NKI kernel with the transposed
    rotation (d q, d k); gradients of cos / sin recompute with PyTorch ops.
    """
    _check_rotary(q, k, cos, sin)
    q_dtype = torch.promote_types(torch.promote_types(q.dtype, cos.dtype), sin.dtype)
    k_dtype = torch.promote_types(torch.promote_types(k.dtype, cos.dtype), sin.dtype)
    common = torch.promote_types(q_dtype, k_dtype)
    q_embed, k_embed = _rotary_op(q.to(common), k.to(common), cos.to(common), sin.to(common))
    return q_embed.to(q_dtype), k_embed.to(k_dtype)


def _workload(name, b, h, hkv, s, d, **kw):
    def make(gen):
        pos = torch.arange(s, dtype=torch.float32)[:, None]
        inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
        ang = torch.cat([pos * inv, pos * inv], dim=-1)[None].expand(b, s, d)
        cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
        return (randn(gen, b, h, s, d), randn(gen, b, hkv, s, d), cos, sin), {}
    return registry.Workload(f"{name} B={b} H={h}/{hkv}kv S={s} D={d}", make, **kw)


def _rotary_backward_inputs(gen, args, kwargs):
    """(d q_out, d k_out, cos, sin) from a forward workload."""
    q, k, cos, sin = args
    return (randn(gen, *q.shape, dtype=q.dtype), randn(gen, *k.shape, dtype=k.dtype), cos, sin), dict(kwargs)


ROTARY_BACKWARD = registry.Backward(
    _rotary_backward_op, _rotary_backward_inputs, apply_rotary_pos_emb_backward_kernel_call,
    backward_references.apply_rotary_pos_emb_backward, roofline.apply_rotary_pos_emb_backward)

registry.register(registry.OpSpec(
    "apply_rotary_pos_emb", apply_rotary_pos_emb, _rotary_op, apply_rotary_pos_emb_kernel_call,
    references.apply_rotary_pos_emb, roofline.apply_rotary_pos_emb,
    workloads=(_workload("Llama-7B 2048 tok", 1, 32, 8, 2048, 128, quick=True, large=True),),
    layers=("ApplyRotaryPosEmb",), backward=ROTARY_BACKWARD))

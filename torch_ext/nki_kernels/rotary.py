"""Rotary position embedding op (transformers' Llama convention): custom op, fake,
autograd and public function (kernels/rotary.py)."""

from __future__ import annotations

import torch

from . import _checks, _dispatch, references
from ._ops import add_op_namespace_prefix


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
    _checks.check_same_dtype(q=q, k=k, cos=cos, sin=sin)
    _checks.check_same_device(q=q, k=k, cos=cos, sin=sin)


def apply_rotary_pos_emb_kernel_call(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                     sin: torch.Tensor) -> _dispatch.KernelCall:
    """The NKI launch: kernels/rotary.py, cos/sin given to the kernel as [Bc, S, D]."""
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    return _dispatch.KernelCall("rotary", "rotary_kernel", (q, k, cos, sin),
                                finish=lambda outs: (outs[0], outs[1]))


@torch.library.custom_op(add_op_namespace_prefix("apply_rotary_pos_emb"), mutates_args=())
def _apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                          sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if q.numel() == 0 or k.numel() == 0:
        return torch.empty_like(q), torch.empty_like(k)
    return _dispatch.run(
        lambda: apply_rotary_pos_emb_kernel_call(q, k, cos, sin),
        lambda: references.apply_rotary_pos_emb(q, k, cos, sin),
        q.device,
    )


@_apply_rotary_pos_emb.register_fake
def _(q, k, cos, sin):
    return torch.empty_like(q), torch.empty_like(k)


def _rotary_setup_context(ctx, inputs, output):
    q, k, cos, sin = inputs
    ctx.save_for_backward(q, k, cos, sin)


def _rotary_backward(ctx, grad_q, grad_k):
    # Backward recomputes with PyTorch ops in fp32 (no NKI backward kernel yet).
    q, k, cos, sin = ctx.saved_tensors
    leaves = [t.detach().float().requires_grad_(bool(ctx.needs_input_grad[i]))
              for i, t in enumerate((q, k, cos, sin))]
    with torch.enable_grad():
        q_out, k_out = references.apply_rotary_pos_emb(*leaves, compute_dtype=torch.float32)
    outs, grads = [], []
    for out, grad in ((q_out, grad_q), (k_out, grad_k)):
        if grad is not None:
            outs.append(out)
            grads.append(grad.float())
    wanted = [t for t in leaves if t.requires_grad]
    found = iter(torch.autograd.grad(outs, wanted, grads, allow_unused=True) if wanted and outs else ())
    result = []
    for leaf, orig in zip(leaves, (q, k, cos, sin)):
        if not leaf.requires_grad:
            result.append(None)
        else:
            g = next(found)
            result.append(torch.zeros_like(orig) if g is None else g.to(orig.dtype))
    return tuple(result)


_apply_rotary_pos_emb.register_autograd(_rotary_backward, setup_context=_rotary_setup_context)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding with transformers' Llama ``apply_rotary_pos_emb`` contract (rotate-half).

    q: [B, Hq, S, D], k: [B, Hk, S, D] (Hq and Hk may differ), D even; cos/sin: [B, S, D],
    [1, S, D] or [S, D], broadcast over heads (``unsqueeze_dim=1`` in transformers' terms).
    All four tensors share one float dtype. Returns ``(q_embed, k_embed)``. Backward
    recomputes with PyTorch ops.
    """
    _check_rotary(q, k, cos, sin)
    return _apply_rotary_pos_emb(q, k, cos, sin)

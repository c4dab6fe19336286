"""DTensor sharding rules for the package's custom ops (``torch.distributed.tensor``).

A custom op called with DTensor inputs (e.g. a norm under a sequence-parallel plan, whose
input is ``Shard(1)`` and whose weight is ``Replicate()``) fails in DTensor with "Operator ...
does not have a sharding strategy registered" unless the op declares how it may be sharded.
Each rule below lists, for one mesh dimension, the acceptable (output placements, input
placements); DTensor expands it to the whole mesh, picks the cheapest option and
redistributes the inputs to it (torch 2.13,
``torch.distributed.tensor.experimental.register_sharding``, marked experimental). Every op
then runs shard-locally on the local tensors: a rule only lists shardings under which the op
of the shards IS the shard of the op (rows of a norm, elements of an activation, batch or
heads of attention). Every op of the namespace has one, the training forwards and the
backward ops autograd calls included, so training on DTensors works too: a weight's or
bias's gradient over sharded rows is ``Partial()`` (each rank's rows' share, added up when
DTensor redistributes it).

:func:`register_rules` registers them for this package's op namespace (a Hub build has its
own); it imports torch.distributed.tensor (~0.7 s), so the package calls it only once that
module is in use: at import when it already is, and from ``nki_kernels.transformers``.
Call it yourself when you create DTensors after importing the package.
"""

from __future__ import annotations

import sys
import threading

from ._ops import ops

_registered = False
_lock = threading.Lock()


def register_rules() -> None:
    """Register every op's sharding rule with DTensor (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        from torch.distributed.tensor.experimental import register_sharding

        for name, rule in RULES.items():
            register_sharding(getattr(ops, name).default)(rule)
        _registered = True


def register_rules_if_in_use() -> None:
    """:func:`register_rules` if ``torch.distributed.tensor`` is imported (DTensors may exist)."""
    if "torch.distributed.tensor" in sys.modules:
        register_rules()


def _placements():
    from torch.distributed.tensor import Replicate, Shard

    return Replicate(), Shard


def _param_grad(t):
    """Placement of a weight's / bias's gradient when the rows are sharded: each rank sums its
    own rows' terms, so the ranks' results add up to the gradient (``Partial()``, as DTensor's
    rule for aten's layer_norm backward gives); an absent parameter's empty gradient is
    ``Replicate()``."""
    from torch.distributed.tensor import Partial, Replicate

    return Replicate() if t is None else Partial()


def _rows(input, extra_dims: int, params: list, *, inputs: int = 1, outputs: int = 1, grads: tuple = ()):
    """Shard any dim of ``input`` but its last ``extra_dims`` (each row is computed alone):
    the first ``inputs`` arguments (shaped like ``input``, or like it but for the last dim)
    and the first ``outputs`` results shard alike. ``params``: the placement of every other
    argument (``Replicate()`` for a weight, None for a non-tensor or an absent tensor);
    ``grads``: the parameters (or None) whose gradients follow the row results
    (``_param_grad`` where the rows are sharded)."""
    replicate, shard = _placements()
    rules = [([replicate] * (outputs + len(grads)), [replicate] * inputs + params)]
    rules += [([shard(d)] * outputs + [_param_grad(g) for g in grads], [shard(d)] * inputs + params)
              for d in range(input.ndim - extra_dims)]
    return rules


def _param(t):
    replicate, _ = _placements()
    return None if t is None else replicate


def _rms_norm(input, normalized_shape, weight, eps):
    return _rows(input, len(normalized_shape), [None, _param(weight), None])


def _layer_norm(input, normalized_shape, weight, bias, eps):
    return _rows(input, len(normalized_shape), [None, _param(weight), _param(bias), None])


def _fused_add_rms_norm(input, residual, weight, eps):
    return _rows(input, 1, [_param(weight), None], inputs=2, outputs=2)


def _gelu(input, approximate):
    return _rows(input, 0, [None])


def _silu(input):
    return _rows(input, 0, [])


def _silu_and_mul(input):
    return _rows(input, 1, [])                       # [..., 2d]: the halves of the last dim pair up


def _gelu_and_mul(input, approximate):
    return _rows(input, 1, [None])


def _softmax(input, dim):
    replicate, shard = _placements()
    dim = dim % input.ndim
    return [([replicate], [replicate, None])] + [
        ([shard(d)], [shard(d), None]) for d in range(input.ndim) if d != dim]


def _apply_rotary_pos_emb(q, k, cos, sin):
    """q/k [B, H, S, D], cos/sin [B or 1, S, D] or [S, D]: batch, heads or sequence."""
    replicate, shard = _placements()
    per_batch = cos.ndim == 3 and cos.shape[0] > 1
    cs_batch = shard(0) if per_batch else replicate
    cs_seq = shard(cos.ndim - 2)
    return [
        ([replicate, replicate], [replicate] * 4),
        ([shard(0), shard(0)], [shard(0), shard(0), cs_batch, cs_batch]),
        ([shard(1), shard(1)], [shard(1), shard(1), replicate, replicate]),
        ([shard(2), shard(2)], [shard(2), shard(2), cs_seq, cs_seq]),
    ]


def _scaled_dot_product_attention(query, key, value, attn_mask, is_causal, scale):
    """q [B, H, Sq, D], k/v [B, Hkv, Sk, D], mask broadcasting to [B, H, Sq, Sk]: batch, or
    heads when every head count divides by the mesh size (query head h reads kv head
    h // (H // Hkv), so equal contiguous blocks keep the pairing). Never a sequence dim:
    every query needs every key, and the causal diagonal needs global positions."""
    replicate, shard = _placements()

    def mask_for(dim):
        if attn_mask is None:
            return None
        mask_dim = dim - (4 - attn_mask.ndim)        # the mask's dims align with q's from the right
        if mask_dim >= 0 and attn_mask.shape[mask_dim] > 1:
            return shard(mask_dim)
        return replicate

    rules = [([replicate], [replicate, replicate, replicate, _param(attn_mask), None, None])]
    rules.append(([shard(0)], [shard(0), shard(0), shard(0), mask_for(0), None, None]))
    size = query.mesh.size()
    if query.shape[1] % size == 0 and key.shape[1] % size == 0:
        rules.append(([shard(1)], [shard(1), shard(1), shard(1), mask_for(1), None, None]))
    return rules


# The training forwards and the backward ops autograd calls (a DTensor input that requires
# grad takes them: without rules, training under a sharding plan fails). Row-wise and
# element-wise ops shard as their forwards; a weight's or bias's gradient sums over the rows,
# so it is Partial where the rows are sharded (_param_grad).

def _rms_norm_backward(grad_output, input, normalized_shape, weight, eps):
    return _rows(input, len(normalized_shape), [None, _param(weight), None], inputs=2, grads=(weight,))


def _fused_add_rms_norm_backward(grad_output, grad_total, total, weight, eps):
    """grads (of the output y and of the sum x + residual) and the saved sum: rows."""
    return _rows(total, 1, [_param(weight), None], inputs=3, grads=(weight,))


def _layer_norm_train(input, normalized_shape, weight, bias, eps):
    """(output, stats [*row dims, 2]): the statistics shard with the input's row dims."""
    return _rows(input, len(normalized_shape), [None, _param(weight), _param(bias), None], outputs=2)


def _layer_norm_backward(grad_output, input, stats, normalized_shape, weight, bias, eps):
    return _rows(input, len(normalized_shape), [None, _param(weight), _param(bias), None], inputs=3,
                 grads=(weight, bias))


def _elementwise_backward(grad_output, input, *rest):
    """gelu / silu backward: every element alone (``rest``: non-tensor arguments)."""
    return _rows(input, 0, [None] * len(rest), inputs=2)


def _gated_backward(grad_output, input, *rest):
    """silu_and_mul / gelu_and_mul backward: dy [..., d] and x [..., 2d]: any dim but the last."""
    return _rows(input, 1, [None] * len(rest), inputs=2)


def _softmax_backward(grad_output, output, dim):
    replicate, shard = _placements()
    dim = dim % output.ndim
    return [([replicate], [replicate, replicate, None])] + [
        ([shard(d)], [shard(d), shard(d), None]) for d in range(output.ndim) if d != dim]


def _scaled_dot_product_attention_lse(query, key, value, attn_mask, is_causal, scale):
    """(output, lse [B, H, Sq]): the forward's options, lse sharded as the output."""
    return [([outs[0], outs[0]], ins)
            for outs, ins in _scaled_dot_product_attention(query, key, value, attn_mask, is_causal, scale)]


def _scaled_dot_product_attention_backward(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale):
    """dq, dk, dv from (dO, q, k, v, O, lse): the forward's batch or heads (a kv head's query
    heads are on its rank, so its dk / dv are whole there)."""
    rules = []
    for outs, ins in _scaled_dot_product_attention(query, key, value, attn_mask, is_causal, scale):
        p = outs[0]
        q, k, v, mask = ins[:4]
        rules.append(([q, k, v], [p, q, k, v, p, p, mask, None, None]))
    return rules


# op name -> rule, for every op of the namespace: the registry's ops (by their functions'
# names), their training forwards and their backward ops. tests/integration check that every
# op has one.
RULES = {
    "rms_norm": _rms_norm,
    "layer_norm": _layer_norm,
    "fused_add_rms_norm": _fused_add_rms_norm,
    "gelu": _gelu,
    "silu": _silu,
    "silu_and_mul": _silu_and_mul,
    "gelu_and_mul": _gelu_and_mul,
    "softmax": _softmax,
    "apply_rotary_pos_emb": _apply_rotary_pos_emb,
    "scaled_dot_product_attention": _scaled_dot_product_attention,
    "layer_norm_train": _layer_norm_train,
    "scaled_dot_product_attention_lse": _scaled_dot_product_attention_lse,
    "rms_norm_backward": _rms_norm_backward,
    "fused_add_rms_norm_backward": _fused_add_rms_norm_backward,
    "layer_norm_backward": _layer_norm_backward,
    "gelu_backward": _elementwise_backward,
    "silu_backward": _elementwise_backward,
    "silu_and_mul_backward": _gated_backward,
    "gelu_and_mul_backward": _gated_backward,
    "softmax_backward": _softmax_backward,
    "apply_rotary_pos_emb_backward": _apply_rotary_pos_emb,
    "scaled_dot_product_attention_backward": _scaled_dot_product_attention_backward,
}

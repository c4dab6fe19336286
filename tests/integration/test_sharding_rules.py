"""The DTensor sharding rules (``nki_kernels.sharding``), checked in one process.

tests/integration/test_distributed.py runs the rules under real DTensors on 2 processes, but
DTensor picks the cheapest option of a rule, so a rule listing a WRONG option (a dim the op
does not compute shard-locally) or missing a right one passes there unless that case's
placements happen to choose it. Here every option of every rule is simulated the way
DTensor runs it: each input is given to each of ``size`` ranks as its placement says
(``Shard(d)``: ``torch.chunk`` along d, ranks past the last chunk empty; ``Replicate()``:
whole), the op runs on each rank's pieces, and the ranks' outputs, put together as the
output placements say (``Partial()``: added up, a weight's gradient over sharded rows), must
be the op of the whole inputs. A second check names the dims
each rule must offer (the op's row / batch / head dims: where sharding is free).
"""

from __future__ import annotations

import types

import pytest
import torch

from nki_kernels import sharding
from nki_kernels._ops import ops

_dtensor = pytest.importorskip("torch.distributed.tensor")
Replicate, Shard, Partial = _dtensor.Replicate, _dtensor.Shard, _dtensor.Partial


class _Spec:
    """What a rule reads of a DTensor argument (DTensor passes a DTensorSpec): ndim, shape
    and the mesh's size."""

    def __init__(self, t: torch.Tensor, size: int):
        self.ndim, self.shape = t.ndim, t.shape
        self.mesh = types.SimpleNamespace(size=lambda: size)


def _piece(t, placement, rank, size):
    if placement is None or isinstance(placement, Replicate):
        return t
    chunks = torch.chunk(t, size, placement.dim)
    if rank < len(chunks):
        return chunks[rank]
    shape = list(t.shape)
    shape[placement.dim] = 0
    return t.new_empty(shape)


def _options(name, args, size):
    rule_args = [_Spec(a, size) if isinstance(a, torch.Tensor) else a for a in args]
    return sharding.RULES[name](*rule_args)


def _check_every_option(name, args, size=2):
    """Every option of the rule, simulated on ``size`` ranks, gives the op of the whole inputs."""
    op = getattr(ops, name).default
    whole = op(*args)
    whole = whole if isinstance(whole, tuple) else (whole,)
    options = _options(name, args, size)
    for out_placements, in_placements in options:
        assert len(in_placements) == len(args), (name, in_placements)
        for a, p in zip(args, in_placements):
            # a tensor gets a placement, a non-tensor (or an absent tensor) None
            assert (p is None) == (not isinstance(a, torch.Tensor)), (name, in_placements)
        per_rank = []
        for rank in range(size):
            pieces = [_piece(a, p, rank, size) if isinstance(a, torch.Tensor) else a
                      for a, p in zip(args, in_placements)]
            out = op(*pieces)
            per_rank.append(out if isinstance(out, tuple) else (out,))
        for i, (p, want) in enumerate(zip(out_placements, whole)):
            if isinstance(p, Replicate):
                got = per_rank[0][i]
            elif isinstance(p, Partial):
                got = sum(r[i] for r in per_rank)
            else:
                got = torch.cat([r[i] for r in per_rank], dim=p.dim)
            # each rank computes its rows with the op itself: the same arithmetic as the whole,
            # but a Partial sum adds the ranks' row sums in another order (fp32: ~1e-6 of the
            # 24 terms' magnitude)
            atol = 1e-5 if isinstance(p, Partial) else 1e-6
            torch.testing.assert_close(got, want, atol=atol, rtol=1e-6,
                                       msg=lambda m: f"{name} {out_placements} <- {in_placements}: {m}")
    return options


def _offered(options):
    """The dims of the first input that the rule's options shard."""
    return {p.dim for _, ins in options for p in ins[:1] if isinstance(p, Shard)}


def _x(*shape):
    return torch.randn(*shape)


def _cases():
    x = _x(4, 6, 32)
    w, b = torch.randn(32) * 0.3 + 1, torch.randn(32)
    q, k, v = _x(2, 4, 6, 16), _x(2, 2, 6, 16), _x(2, 2, 6, 16)
    keep4 = torch.rand(2, 1, 6, 6) > 0.3
    keep4[..., 0] = True
    heads_mask = torch.randn(4, 6, 6)          # [H, Sq, Sk]: aligns with q's last 3 dims
    seq_mask = torch.randn(6, 6)               # [Sq, Sk]: one mask for every batch and head
    cos, sin = _x(2, 6, 16), _x(2, 6, 16)
    # (id, op, args, dims the first input's sharding may take)
    return [
        ("rms_norm rows", "rms_norm", (x, [32], w, 1e-6), {0, 1}),
        ("rms_norm over (6, 32)", "rms_norm", (x, [6, 32], None, 1e-6), {0}),
        ("layer_norm", "layer_norm", (x, [32], w, b, 1e-5), {0, 1}),
        ("layer_norm no affine", "layer_norm", (x, [32], None, None, 1e-5), {0, 1}),
        ("fused_add_rms_norm", "fused_add_rms_norm", (x, x * 0.5, w, 1e-6), {0, 1}),
        ("gelu", "gelu", (x, "tanh"), {0, 1, 2}),
        ("silu", "silu", (x,), {0, 1, 2}),
        ("silu_and_mul", "silu_and_mul", (x,), {0, 1}),
        ("gelu_and_mul", "gelu_and_mul", (x, "none"), {0, 1}),
        ("softmax dim 1", "softmax", (x, 1), {0, 2}),
        ("softmax dim -1", "softmax", (x, -1), {0, 1}),
        ("rotary per-batch cos", "apply_rotary_pos_emb", (q, k, cos, sin), {0, 1, 2}),
        ("rotary cos [1, S, D]", "apply_rotary_pos_emb", (q, k, cos[:1], sin[:1]), {0, 1, 2}),
        ("rotary cos [S, D]", "apply_rotary_pos_emb", (q, k, cos[0], sin[0]), {0, 1, 2}),
        ("sdpa GQA causal", "scaled_dot_product_attention", (q, k, v, None, True, 0.25), {0, 1}),
        ("sdpa [B, 1, Sq, Sk] bool mask", "scaled_dot_product_attention", (q, k, v, keep4, False, 0.25), {0, 1}),
        ("sdpa [H, Sq, Sk] mask", "scaled_dot_product_attention", (q, k, v, heads_mask, False, 0.25), {0, 1}),
        ("sdpa [Sq, Sk] mask", "scaled_dot_product_attention", (q, k, v, seq_mask, False, 0.25), {0, 1}),
        # one kv head cannot be split over 2 ranks: batch only
        ("sdpa MQA", "scaled_dot_product_attention", (q, k[:, :1], v[:, :1], None, False, 0.25), {0}),
    ] + _training_cases()


def _training_cases():
    """The training forwards and the backward ops autograd calls on DTensors (sharding.py)."""
    x, dy = _x(4, 6, 32), _x(4, 6, 32)
    w, b = torch.randn(32) * 0.3 + 1, torch.randn(32)
    q, k, v = _x(2, 4, 6, 16), _x(2, 2, 6, 16), _x(2, 2, 6, 16)
    keep4 = torch.rand(2, 1, 6, 6) > 0.3
    keep4[..., 0] = True
    out, lse = ops.scaled_dot_product_attention_lse.default(q, k, v, None, True, 0.25)
    out_m, lse_m = ops.scaled_dot_product_attention_lse.default(q, k, v, keep4, False, 0.25)
    _, stats = ops.layer_norm_train.default(x, [32], w, b, 1e-5)
    _, stats2 = ops.layer_norm_train.default(x, [6, 32], None, None, 1e-5)
    cos, sin = _x(2, 6, 16), _x(2, 6, 16)
    gated = _x(4, 6, 16)
    return [
        ("layer_norm_train", "layer_norm_train", (x, [32], w, b, 1e-5), {0, 1}),
        ("layer_norm_train over (6, 32)", "layer_norm_train", (x, [6, 32], None, None, 1e-5), {0}),
        ("sdpa_lse GQA causal", "scaled_dot_product_attention_lse", (q, k, v, None, True, 0.25), {0, 1}),
        ("rms_norm_backward", "rms_norm_backward", (dy, x, [32], w, 1e-6), {0, 1}),
        ("rms_norm_backward no weight", "rms_norm_backward", (dy, x, [32], None, 1e-6), {0, 1}),
        ("fused_add_rms_norm_backward", "fused_add_rms_norm_backward", (dy, dy * 0.5, x, w, 1e-6), {0, 1}),
        ("layer_norm_backward", "layer_norm_backward", (dy, x, stats, [32], w, b, 1e-5), {0, 1}),
        ("layer_norm_backward over (6, 32)", "layer_norm_backward", (dy, x, stats2, [6, 32], None, None, 1e-5), {0}),
        ("gelu_backward", "gelu_backward", (dy, x, "tanh"), {0, 1, 2}),
        ("silu_backward", "silu_backward", (dy, x), {0, 1, 2}),
        ("silu_and_mul_backward", "silu_and_mul_backward", (gated, x), {0, 1}),
        ("gelu_and_mul_backward", "gelu_and_mul_backward", (gated, x, "none"), {0, 1}),
        ("softmax_backward dim 1", "softmax_backward", (dy, torch.softmax(x, 1), 1), {0, 2}),
        ("rotary backward", "apply_rotary_pos_emb_backward", (q, k, cos, sin), {0, 1, 2}),
        ("sdpa backward GQA causal", "scaled_dot_product_attention_backward",
         (_x(2, 4, 6, 16), q, k, v, out, lse, None, True, 0.25), {0, 1}),
        ("sdpa backward [B, 1, Sq, Sk] mask", "scaled_dot_product_attention_backward",
         (_x(2, 4, 6, 16), q, k, v, out_m, lse_m, keep4, False, 0.25), {0, 1}),
    ]


CASES = _cases()


@pytest.mark.parametrize("name, args, dims", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_option_of_a_rule_is_shard_local(reference_backend, name, args, dims):
    options = _check_every_option(name, args)
    if name.endswith("_backward") and any(isinstance(p, Partial) for outs, _ in options for p in outs):
        # a parameter's gradient: Partial exactly where the rows are sharded
        for outs, ins in options:
            assert isinstance(outs[1], Partial) == isinstance(ins[0], Shard), (name, outs, ins)
    # a replicated option first (DTensor's fallback), and exactly the op's free dims
    assert all(isinstance(p, Replicate) for p in options[0][0])
    assert _offered(options) == dims, f"{name}: offers {sorted(_offered(options))}, expected {sorted(dims)}"

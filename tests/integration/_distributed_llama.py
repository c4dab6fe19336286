"""Run by tests/integration/test_distributed.py on 2 CPU processes (gloo), launched like torchrun:

    python -m torch.distributed.run --standalone --nproc_per_node 2 _distributed_llama.py CHECKPOINT RESULT.json

1. Every op on DTensor inputs (``nki_kernels.sharding`` rules): sharded results equal the
   unsharded op's, and the output keeps the input's sharding; with inputs that require grad
   (the training forwards and the backward ops), the gradients equal the unsharded ones.
2. A tiny Llama (CHECKPOINT) under transformers' tensor-parallel plan, ``attn_implementation="nki"``
   and ``nki_kernels.transformers.kernelize``: logits, greedy ``generate()``, a training loss and
   gradients against the unsharded sdpa model.
3. The same model with sequence-parallel norms (DTensor inputs to ``rms_norm``): kernelize
   after sharding is refused with a clear error; kernelize first, then shard, matches, in
   inference and in a training step (loss and gradients; the gradients against the same
   plan without kernels: transformers' norm-only sequence-parallel plan doubles the norm
   weights' gradients at 2 ranks, kernels or not).

Rank 0 writes the measured differences to RESULT.json; the test asserts on them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the repo root, for tests.integration._models

import nki_kernels  # noqa: E402
import nki_kernels.transformers as nkt  # noqa: E402
from tests.integration._models import padded_batch  # noqa: E402

SP_PLAN = {"model.layers.*.input_layernorm": "sequence_parallel",
           "model.layers.*.post_attention_layernorm": "sequence_parallel", "model.norm": "sequence_parallel"}


def _max_diff(a, b) -> float:
    a = a.full_tensor() if isinstance(a, DTensor) else a
    b = b.full_tensor() if isinstance(b, DTensor) else b
    return float((a.double() - b.double()).abs().max())


def op_cases():
    """(name, op call, inputs, placements): inputs are full tensors, distributed with placements."""
    x = torch.randn(4, 6, 32)
    w, b = torch.randn(32) * 0.3 + 1, torch.randn(32)
    q, k, v = torch.randn(2, 4, 6, 16), torch.randn(2, 2, 6, 16), torch.randn(2, 2, 6, 16)
    cos, sin = torch.randn(2, 6, 16), torch.randn(2, 6, 16)
    keep = torch.rand(2, 1, 6, 6) > 0.3
    keep[..., 0] = True
    R, S = Replicate(), Shard
    return [
        ("rms_norm rows", lambda x, w: nki_kernels.rms_norm(x, (32,), w, 1e-6), (x, w), (S(1), R)),
        ("rms_norm (6, 32) over Shard(0)", lambda x: nki_kernels.rms_norm(x, (6, 32), None, 1e-6), (x,), (S(0),)),
        ("layer_norm", lambda x, w, b: nki_kernels.layer_norm(x, (32,), w, b), (x, w, b), (S(0), R, R)),
        ("fused_add_rms_norm", lambda x, r, w: nki_kernels.fused_add_rms_norm(x, r, w, 1e-6), (x, x * 0.5, w),
         (S(1), S(1), R)),
        ("gelu", lambda x: nki_kernels.gelu(x, "tanh"), (x,), (S(2),)),
        ("silu", nki_kernels.silu, (x,), (S(2),)),
        ("silu_and_mul", nki_kernels.silu_and_mul, (x,), (S(1),)),
        ("gelu_and_mul", nki_kernels.gelu_and_mul, (x,), (S(0),)),
        ("softmax over the sharded dim", lambda x: nki_kernels.softmax(x, 1), (x,), (S(1),)),
        ("apply_rotary_pos_emb heads", nki_kernels.apply_rotary_pos_emb, (q, k, cos, sin), (S(1), S(1), R, R)),
        ("apply_rotary_pos_emb sequence", nki_kernels.apply_rotary_pos_emb, (q, k, cos, sin), (S(2), S(2), S(1), S(1))),
        ("apply_rotary_pos_emb sequence, 2-D cos/sin", nki_kernels.apply_rotary_pos_emb, (q, k, cos[0], sin[0]),
         (S(2), S(2), S(0), S(0))),
        ("rms_norm over the sharded hidden dim", lambda x: nki_kernels.rms_norm(x, (32,), None, 1e-6), (x,), (S(2),)),
        ("sdpa GQA heads, causal", lambda q, k, v: nki_kernels.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True), (q, k, v), (S(1), S(1), S(1))),
        ("sdpa batch + bool mask", lambda q, k, v, m: nki_kernels.scaled_dot_product_attention(
            q, k, v, attn_mask=m, enable_gqa=True), (q, k, v, keep), (S(0), S(0), S(0), S(0))),
        ("sdpa queries sharded", lambda q, k, v: nki_kernels.scaled_dot_product_attention(
            q, k, v, enable_gqa=True), (q, k, v), (S(2), R, R)),
    ]


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _op_grads(call, inputs, placements, mesh, grads):
    """Input gradients of call's outputs against ``grads`` (full tensors, one per output), on
    full tensors (mesh None) or on DTensors distributed with ``placements``; the float inputs
    require grad."""
    def leaf(t, p):
        t = t.clone() if mesh is None else distribute_tensor(t.clone(), mesh, [p])
        return t.requires_grad_(t.is_floating_point())
    leaves = [leaf(t, p) for t, p in zip(inputs, placements)]
    outs = _as_tuple(call(*leaves))
    gs = [g if mesh is None else distribute_tensor(g, mesh, list(o.placements)) for g, o in zip(grads, outs)]
    torch.autograd.backward(outs, gs)
    return [t.grad for t in leaves if t.requires_grad]


def check_ops(mesh) -> dict:
    results = {}
    torch.manual_seed(1)           # the same inputs on both ranks
    for name, call, inputs, placements in op_cases():
        expected = call(*inputs)
        sharded = call(*(distribute_tensor(t, mesh, [p]) for t, p in zip(inputs, placements)))
        outs, exps = _as_tuple(sharded), _as_tuple(expected)
        grads = [torch.randn_like(e) for e in exps]
        want = _op_grads(call, inputs, placements, None, grads)
        got = _op_grads(call, inputs, placements, mesh, grads)
        results[name] = {"max_diff": max(_max_diff(o, e) for o, e in zip(outs, exps)),
                         "placements": [repr(o.placements[0]) for o in outs],
                         "grad_max_diff": max(_max_diff(g, w) for g, w in zip(got, want)),
                         "grad_placements": [repr(g.placements[0]) for g in got]}
    return results


def reference_results(checkpoint, batch, labels):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="sdpa").eval()
    with torch.no_grad():
        logits = ref(**batch.kwargs()).logits
        tokens = ref.generate(**batch.kwargs(), max_new_tokens=5, do_sample=False, pad_token_id=0)
    ref.train()
    loss = ref(**batch.kwargs(), labels=labels).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
    return logits, tokens, loss.detach(), grads


def tensor_parallel(checkpoint, batch, labels, expected) -> dict:
    from transformers import AutoModelForCausalLM
    from transformers.distributed.configuration_utils import DistributedConfig

    logits, tokens, loss, grads = expected
    model = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="nki",
                                                 distributed_config=DistributedConfig(tp_size=2)).eval()
    nkt.kernelize(model)
    q_proj = model.model.layers[0].self_attn.q_proj.weight
    with torch.no_grad():
        got = model(**batch.kwargs()).logits
        got_tokens = model.generate(**batch.kwargs(), max_new_tokens=5, do_sample=False, pad_token_id=0)
    model.train()
    got_loss = model(**batch.kwargs(), labels=labels).loss
    got_loss.backward()
    grad_diff = max(_max_diff(p.grad, grads[n]) for n, p in model.named_parameters() if p.grad is not None)
    return {"q_proj_is_sharded": isinstance(q_proj, DTensor) and q_proj.placements[0] == Shard(0),
            "logits_max_diff": float((got - logits)[batch.valid].abs().max()),
            "generate_identical": bool(torch.equal(got_tokens, tokens)),
            "loss_diff": abs(float(got_loss.detach()) - float(loss)), "grad_max_diff": grad_diff,
            "kernelized": model.model.norm.forward.__func__ is nki_kernels.layers.RMSNorm.forward}


def sequence_parallel_norms(checkpoint, batch, labels, expected) -> dict:
    from transformers import AutoModelForCausalLM
    from transformers.distributed.configuration_utils import DistributedConfig

    config = DistributedConfig(tp_size=2, tp_plan=SP_PLAN)
    # wrong order: transformers' styles set module.forward, kernelize would drop the wrapper
    wrapped = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="nki", distributed_config=config)
    try:
        nkt.kernelize(wrapped.eval())
        refused = ""
    except ValueError as err:
        refused = str(err)
    # right order: kernelize, then shard (transformers' two loading steps, run by hand)
    def sharded(kernelized):
        model = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="nki" if kernelized else "sdpa")
        if kernelized:
            nkt.kernelize(model.eval())
        plan, _, mesh_manager = type(model).prepare_distribute_model(DistributedConfig(tp_size=2, tp_plan=SP_PLAN))
        return type(model).maybe_distribute_model(model, plan, mesh_manager)

    def train_step(model):
        model.train()
        loss = model(**batch.kwargs(), labels=labels).loss
        loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    model = sharded(kernelized=True).eval()
    seen = []
    real = nki_kernels.layers.rms_norm

    def spy(x, *args, **kwargs):
        seen.append(f"{type(x).__name__}{list(x.placements) if isinstance(x, DTensor) else ''}")
        return real(x, *args, **kwargs)

    nki_kernels.layers.rms_norm = spy
    try:
        with torch.no_grad():
            got = model(**batch.kwargs()).logits
        # a training step: the norms' backward ops on DTensors (sharding.py's backward rules)
        loss, grads = train_step(model)
    finally:
        nki_kernels.layers.rms_norm = real
    got = got.full_tensor() if isinstance(got, DTensor) else got
    eager_loss, eager_grads = train_step(sharded(kernelized=False))
    assert set(grads) == set(eager_grads)
    return {"refused_wrong_order": refused, "rms_norm_inputs": sorted(set(seen)),
            "logits_max_diff": float((got - expected[0])[batch.valid].abs().max()),
            "loss_diff": abs(float(loss) - float(expected[2])),
            "grad_max_diff": max(_max_diff(grads[n], eager_grads[n]) for n in grads),
            "norm_grad_ratio_unsharded": float(grads["model.norm.weight"].full_tensor().norm()
                                               / expected[3]["model.norm.weight"].norm())}


def main(checkpoint: str, result_path: str) -> None:
    start = time.perf_counter()
    nkt.register()
    torch.manual_seed(0)
    batch = padded_batch("left")
    labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
    expected = reference_results(checkpoint, batch, labels)   # before kernelize: it patches rotary process-wide
    result = {"world_size": None}
    result["tensor_parallel"] = tensor_parallel(checkpoint, batch, labels, expected)
    result["world_size"] = dist.get_world_size()
    result["sequence_parallel_norms"] = sequence_parallel_norms(checkpoint, batch, labels, expected)
    result["ops"] = check_ops(init_device_mesh("cpu", (dist.get_world_size(),)))
    result["wall_s"] = time.perf_counter() - start
    if dist.get_rank() == 0:
        Path(result_path).write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])

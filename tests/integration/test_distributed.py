"""The ops under torch.distributed: a tiny Llama sharded with transformers' tensor-parallel
plan over 2 CPU processes (gloo), with ``attn_implementation="nki"`` and the kernelized
layers, matches the unsharded model; ops given DTensor inputs (sequence-parallel norms, and
every op directly) run under the package's sharding rules.

One launch, like torchrun (``python -m torch.distributed.run``), of
``_distributed_llama.py``; about 20-30 s on 2 cores, mostly imports in two processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nki_kernels import _custom_op, registry, sharding

from ._models import CAUSAL_LM

SCRIPT = Path(__file__).with_name("_distributed_llama.py")


def test_every_op_has_a_sharding_rule():
    # every custom op of the package: the registry's, their training forwards and their
    # backward ops (without a rule, an op given a DTensor raises)
    defined = {name.partition("::")[2] for name in _custom_op.registered_with}
    assert {spec.name for spec in registry.ops()} < defined
    assert set(sharding.RULES) == defined


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    import accelerate  # noqa: F401  transformers' tensor-parallel loading needs it (a dev dependency: fail, never skip)
    if not torch.distributed.is_available():
        pytest.skip("this torch build has no torch.distributed")
    tmp = tmp_path_factory.mktemp("tp")
    torch.manual_seed(0)
    CAUSAL_LM["llama"]().save_pretrained(tmp / "llama")
    result = tmp / "result.json"
    env = {**os.environ, "NKI_KERNELS_CPU_BACKEND": "reference", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(SCRIPT), str(tmp / "llama"), str(result)],
        capture_output=True, text=True, env=env, timeout=240)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(result.read_text())


def test_tensor_parallel_llama_matches_unsharded(launched):
    tp = launched["tensor_parallel"]
    assert launched["world_size"] == 2
    assert tp["q_proj_is_sharded"] and tp["kernelized"]
    # each rank computes half the heads / half the MLP columns; the row-parallel sums add the
    # halves in another order than one matmul: fp32 rounding, ~2e-7 measured
    assert tp["logits_max_diff"] < 1e-5
    assert tp["generate_identical"]
    assert tp["loss_diff"] < 1e-5
    assert tp["grad_max_diff"] < 1e-5


def test_sequence_parallel_norms_get_dtensors(launched):
    sp = launched["sequence_parallel_norms"]
    assert "before sharding" in sp["refused_wrong_order"]
    assert sp["rms_norm_inputs"] == ["DTensor[Shard(dim=1)]"]      # each norm's input, all layers
    assert sp["logits_max_diff"] < 1e-5
    # training: the norms' backward on DTensors, weight gradients summed over the ranks'
    # rows, as the same plan gives without kernels (eager RMSNorm on DTensors). That plan
    # alone (norms only, no parallel linears) doubles the norm weights' gradients against
    # the unsharded model, kernels or not: transformers' behaviour, recorded, not ours
    assert sp["loss_diff"] < 1e-5
    assert sp["grad_max_diff"] < 1e-5
    assert abs(sp["norm_grad_ratio_unsharded"] - 2) < 1e-3


def test_ops_on_dtensors(launched):
    ops = launched["ops"]
    assert len(ops) == 16
    for name, case in ops.items():
        assert case["max_diff"] < 1e-6, name      # shard-local computation: bitwise or nearly
        # gradients through the training forwards and backward ops; a weight's gradient over
        # sharded rows is the ranks' partial sums added (fp32, another order: ~1e-6)
        assert case["grad_max_diff"] < 1e-5, name
    assert ops["rms_norm rows"]["placements"] == ["Shard(dim=1)"]
    assert ops["rms_norm rows"]["grad_placements"] == ["Shard(dim=1)", "Partial(sum)"]   # dx, dw
    assert ops["layer_norm"]["grad_placements"] == ["Shard(dim=0)", "Partial(sum)", "Partial(sum)"]
    assert ops["sdpa GQA heads, causal"]["grad_placements"] == ["Shard(dim=1)"] * 3
    assert ops["rms_norm (6, 32) over Shard(0)"]["placements"] == ["Shard(dim=0)"]
    assert ops["fused_add_rms_norm"]["placements"] == ["Shard(dim=1)", "Shard(dim=1)"]
    assert ops["softmax over the sharded dim"]["placements"] == ["Replicate()"]   # redistributed first
    assert ops["apply_rotary_pos_emb heads"]["placements"] == ["Shard(dim=1)", "Shard(dim=1)"]
    assert ops["apply_rotary_pos_emb sequence"]["placements"] == ["Shard(dim=2)", "Shard(dim=2)"]
    assert ops["apply_rotary_pos_emb sequence, 2-D cos/sin"]["placements"] == ["Shard(dim=2)", "Shard(dim=2)"]
    # a row split over its own hidden dim is gathered first (each rank needs whole rows)
    assert ops["rms_norm over the sharded hidden dim"]["placements"] == ["Replicate()"]
    assert ops["sdpa GQA heads, causal"]["placements"] == ["Shard(dim=1)"]
    assert ops["sdpa batch + bool mask"]["placements"] == ["Shard(dim=0)"]
    assert ops["sdpa queries sharded"]["placements"] == ["Replicate()"]      # never split a sequence

"""The decode attention path (kernels/attention_decode.py: keys on partitions) in the
simulator, through the op: which launches take it, values against float64, masks, tails,
both layouts, memory."""

from __future__ import annotations

import pytest
import torch

import nki_kernels
from nki_kernels import _kernel_sources, simulator
from nki_kernels.ops import attention
from nki_kernels.simulator.hardware import get_target
from tests.ops._attention_cases import check_close, make_mask, make_qkv

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32

# (B, H, Hkv, Sq, Sk, D, Dv, dtype, layout, mask): the op folds grouped-query decode into
# kv heads with G * Sq rows, so every case reaches the kernel with one query head per kv head
DECODE = [
    (8, 4, 1, 1, 4096, 128, 128, BF16, "bhsd", "key_bool"),   # Llama-style GQA decode, blocked keys
    (3, 8, 2, 2, 1000, 64, 64, F16, "bshd", None),            # 1000 keys: a 104-key tail tile
    (2, 6, 6, 1, 300, 128, 96, BF16, "bhsd", "key_float"),    # MHA: runs of heads, Dv != D, tail
    (1, 2, 2, 32, 257, 64, 64, BF16, "bshd", "key_bool"),     # 32 rows (DECODE_MAX_ROWS), 1-key tail
    (2, 2, 2, 1, 1, 32, 32, BF16, "bhsd", None),              # one key
    (5, 4, 1, 3, 640, 96, 128, BF16, "bhsd", "key_bool"),     # odd batch count, D = 96
    # past DECODE_RESIDENT_KEYS: one pair at a time, Kᵀ streamed in blocks one pair ahead
    (2, 4, 1, 5, 10240, 128, 128, BF16, "bhsd", "key_bool"),  # AWS's tkg table: 4 heads x 5 tokens, blocked keys
    (1, 2, 2, 3, 9000, 64, 64, F16, "bshd", None),            # 9000 keys: a 40-key tail tile, natural order
    (2, 3, 1, 7, 10240, 64, 64, BF16, "bhsd", "key_bool"),    # D = 64: 4096-key Kᵀ blocks, blocked keys, a half block
    (3, 2, 1, 7, 4097, 128, 96, BF16, "bhsd", "key_float"),   # 3 pairs over 2 cores, Dv != D
    # one pair at LNC=2: each core takes half of the keys, core 0 combines (split-KV)
    (1, 4, 1, 1, 16384, 128, 128, BF16, "bhsd", "key_bool"),  # batch-1 long-context decode
    (1, 1, 1, 5, 9000, 64, 64, F16, "bshd", None),            # halves of 4608 and 4392 keys: a tail
    (3, 4, 1, 1, 4096, 128, 128, BF16, "bhsd", "key_bool"),   # 3 pairs: the last one split
    (2, 2, 2, 2, 3000, 64, 256, BF16, "bhsd", None),          # streamed, Dv = 256: P·V with Pᵀ stationary
    (2, 2, 1, 2, 20000, 96, 96, BF16, "bhsd", "key_bool"),    # 157 key tiles: the mask transposed in 2 chunks
    # per-row masks ([B or 1, H or 1, Sq, Sk]: speculative decoding's causal active tokens)
    (2, 4, 1, 3, 3000, 128, 128, BF16, "bhsd", "full_float"), # per-head rows, folded with the heads
    (3, 2, 1, 5, 1000, 64, 64, F16, "bshd", "finfo_min"),     # transformers' [B, 1, Sq, Sk] finfo.min mask
    (1, 2, 2, 7, 2304, 128, 128, BF16, "bhsd", "bool_2d"),    # one [Sq, Sk] pattern, split pair
    # masked launches past DECODE_MAX_ROWS (up to DECODE_MASKED_MAX_ROWS, within
    # DECODE_MASKED_WIDE_SCORES); the fold's repeated mask rows loaded once (mask_period)
    (4, 8, 1, 7, 3072, 64, 64, BF16, "bhsd", "causal_active"),  # AWS's tkg table: 56 rows, streamed
    (4, 10, 1, 5, 5376, 64, 64, BF16, "bshd", "finfo_min"),     # 50 rows, 42 key tiles
    (3, 16, 1, 4, 1000, 128, 96, F16, "bhsd", "causal_active"), # 64 rows resident, a tail tile
    (2, 48, 1, 1, 700, 96, 96, BF16, "bhsd", "key_bool"),       # 48 rows of key padding
]


def _id(case):
    b, h, hkv, sq, sk, d, dv, dtype, layout, mask = case
    return f"B{b}-H{h}/{hkv}-Sq{sq}-Sk{sk}-D{d}-Dv{dv}-{str(dtype)[6:]}-{layout}" + (f"-{mask}" if mask else "")


def _kernel_trace(q, k, v, mask=None, lnc=1):
    """The trn2 simulator result of the op's launch for (q, k, v, mask)."""
    call = attention.attention_kernel_call(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
    with simulator.activated():
        kernel = getattr(_kernel_sources.load(call.module, "simulator"), call.kernel)
    if lnc > 1:
        kernel = kernel[lnc]
    return call, simulator.run(kernel, *[t.contiguous() for t in call.tensors], target="trn2", **call.static)


def _exps(res):
    return [ins for ins in res.trace if ins.op == "activation" and ins.attrs.get("func") == "exp"]


@pytest.mark.parametrize("case", DECODE, ids=_id)
def test_decode_matches_float64(simulator_backend, case):
    b, h, hkv, sq, sk, d, dv, dtype, layout, mask_kind = case
    q, k, v = make_qkv(b, h, hkv, sq, sk, d, dv, dtype, layout)
    mask = make_mask(mask_kind, b, h, sq, sk, dtype)
    out = nki_kernels.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=h != hkv)
    check_close(out, q, k, v, mask)


@pytest.mark.parametrize("case", DECODE, ids=_id)
def test_decode_launch_puts_keys_on_partitions(case):
    """Every exp of a decode launch covers all 128 partitions (keys), whatever the few query
    rows, and one exp serves a whole batch of (batch, head) pairs."""
    b, h, hkv, sq, sk, d, dv, dtype, layout, mask_kind = case
    q, k, v = make_qkv(b, h, hkv, sq, sk, d, dv, dtype, layout)
    mask = make_mask(mask_kind, b, h, sq, sk, dtype)
    call, res = _kernel_trace(q, k, v, mask)
    exps = _exps(res)
    assert exps and all(ins.writes[0].partitions == 128 for ins in exps)
    assert len(exps) <= b * hkv                       # one exp per batch of (batch, kv head) pairs
    check_close(call.finish_outputs(res.outputs), q, k, v, mask)


@pytest.mark.parametrize("why, kwargs", [
    ("33 rows", dict(b=2, h=4, hkv=1, sq=9, sk=512, d=64)),          # G * Sq = 36 > DECODE_MAX_ROWS
    ("fp32", dict(b=2, h=4, hkv=1, sq=1, sk=512, d=64, dtype=F32)),   # Kᵀ needs 2-byte DMA transposes
    ("head dim 256", dict(b=2, h=4, hkv=1, sq=1, sk=512, d=256)),
    ("streamed pair over budget", dict(b=1, h=1, hkv=1, sq=32, sk=24000, d=128)),   # 84 KiB > 80 KiB
])
def test_launches_the_decode_path_does_not_take(why, kwargs):
    """Outside the decode path's contract the row-tile paths run (their exps cover only the
    query rows), with the same values."""
    q, k, v = make_qkv(kwargs.pop("b"), kwargs.pop("h"), kwargs.pop("hkv"), kwargs.pop("sq"), kwargs.pop("sk"),
                       kwargs.pop("d"), dtype=kwargs.pop("dtype", BF16))
    call, res = _kernel_trace(q, k, v)
    assert all(ins.writes[0].partitions < 128 for ins in _exps(res)), why
    check_close(call.finish_outputs(res.outputs), q, k, v)


@pytest.mark.parametrize("why, kwargs, mask_kind", [
    ("65 masked rows", dict(b=2, h=13, hkv=1, sq=5, sk=512, d=64), "causal_active"),   # > DECODE_MASKED_MAX_ROWS
    ("56 masked rows x 64 key tiles", dict(b=2, h=8, hkv=1, sq=7, sk=8192, d=64), "causal_active"),
])
def test_masked_launches_the_decode_path_does_not_take(why, kwargs, mask_kind):
    """Past DECODE_MASKED_MAX_ROWS rows, or past DECODE_MASKED_WIDE_SCORES rows x key tiles,
    a masked launch runs on the row-tile paths, with the same values."""
    b, h, hkv, sq, sk = (kwargs.pop(n) for n in ("b", "h", "hkv", "sq", "sk"))
    q, k, v = make_qkv(b, h, hkv, sq, sk, kwargs.pop("d"), dtype=BF16)
    mask = make_mask(mask_kind, b, h, sq, sk, BF16)
    call, res = _kernel_trace(q, k, v, mask)
    assert all(ins.writes[0].partitions < 128 for ins in _exps(res)), why
    check_close(call.finish_outputs(res.outputs), q, k, v, mask)


@pytest.mark.parametrize("h, mask_kind, rows_loaded", [
    (8, "causal_active", 1),      # [B, 1, Sq, Sk]: the G = 8 heads share each position's row
    (8, "full_float", 8),         # [B, H, Sq, Sk]: a row per head
])
def test_folded_mask_rows_are_loaded_once_per_kv_head(h, mask_kind, rows_loaded):
    """A decode launch reads each distinct mask row once: with one mask for all query heads
    the op folds G heads into G·Sq rows that repeat Sq mask rows (mask_period = Sq), and the
    kernel loads Sq rows per kv head, not G·Sq."""
    b, hkv, sq, sk = 2, 1, 7, 3072
    q, k, v = make_qkv(b, h, hkv, sq, sk, 64, dtype=BF16)
    mask = make_mask(mask_kind, b, h, sq, sk, BF16)
    call, res = _kernel_trace(q, k, v, mask)
    assert _exps(res) and all(ins.writes[0].partitions == 128 for ins in _exps(res))
    mask_bytes = sum(op.nbytes for ins in res.trace if ins.op == "dma_copy" for op in ins.reads
                     if op.buffer == "hbm" and op.dtype == "float32")
    assert mask_bytes == b * hkv * rows_loaded * sq * sk * 4
    check_close(call.finish_outputs(res.outputs), q, k, v, mask)


@pytest.mark.parametrize("mask_kind, period", [
    ("causal_active", -7),        # 56 % -7 == 0 in Python: refused as negative
    ("causal_active", 7.0),       # not an int
    ("causal_active", 3),         # does not divide the 56 folded rows
    ("key_bool", 7),              # a key-padding mask has no rows to repeat
])
def test_a_bad_mask_period_is_refused_by_name(mask_kind, period):
    b, h, sq, sk = 2, 8, 7, 512
    q, k, v = make_qkv(b, h, 1, sq, sk, 64, dtype=BF16)
    mask = make_mask(mask_kind, b, h, sq, sk, BF16)
    call = attention.attention_kernel_call(q, k, v, attn_mask=mask, enable_gqa=True)
    with simulator.activated():
        kernel = getattr(_kernel_sources.load(call.module, "simulator"), call.kernel)
    static = dict(call.static, mask_period=period)
    with pytest.raises(Exception, match=r"mask_period=.*expected 0 or a positive int dividing Sq=56"):
        simulator.run(kernel, *[t.contiguous() for t in call.tensors], target="trn2", **static)


def test_decode_all_masked_batch_is_zero_and_huge_logits_stay_finite(simulator_backend):
    """A batch whose keys are all padded returns 0 (as torch's SDPA); scaled logits of ~1e7
    give no inf or NaN (the max is subtracted exactly)."""
    q, k, v = make_qkv(3, 8, 1, 1, 700, 128, dtype=BF16)
    q, k = (q.float() * 5e3).to(BF16), (k.float() * 5e3).to(BF16)
    mask = torch.rand(3, 1, 1, 700) > 0.5
    mask[1] = False
    out = nki_kernels.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert torch.isfinite(out).all()
    assert (out[1] == 0).all() and (out[0] != 0).any()
    check_close(out, q, k, v, mask)


@pytest.mark.parametrize("lnc", [1, 2])
def test_decode_fits_trn2_at_its_limits(lnc):
    """The largest decode launches stay within trn2's SBUF and PSUM and write every output
    element: 64 pairs of 2048 resident keys; streamed pairs at DECODE_STREAM_BYTES (32 rows
    of 23296 keys, 5 rows of 36608 keys)."""
    trn2 = get_target("trn2")
    for b, h, hkv, sq, sk in ((64, 8, 1, 1, 2048), (2, 1, 1, 32, 23296), (2, 1, 1, 5, 36608)):
        q, k, v = make_qkv(b, h, hkv, sq, sk, 128, dtype=BF16)
        call, res = _kernel_trace(q, k, v, lnc=lnc)
        assert res.peak_sbuf_bytes_per_partition <= trn2.sbuf_bytes_per_partition
        assert res.peak_psum_banks <= trn2.psum_banks
        out = call.finish_outputs(res.outputs)
        assert not torch.isnan(out).any()
        check_close(out, q, k, v)


# ``-m sweep``: key counts around the tile and block edges x pair shapes x masks (head dim,
# dtype and layout cycle along)
SWEEP_KEYS = [1, 127, 128, 129, 2048, 4097, 8192]
SWEEP_PAIRS = [(1, 1, 1, 1), (4, 8, 1, 1), (3, 6, 6, 2), (2, 4, 2, 8)]      # (B, H, Hkv, Sq)
SWEEP = [(b, h, hkv, sq, sk, d, d, dtype, layout, mask)
         for i, (sk, (b, h, hkv, sq), mask) in enumerate(
             (sk, p, m) for sk in SWEEP_KEYS for p in SWEEP_PAIRS for m in (None, "key_bool", "key_float"))
         for d, dtype, layout in [((64, BF16, "bshd"), (128, F16, "bhsd"), (96, BF16, "bhsd"))[i % 3]]]


@pytest.mark.sweep
@pytest.mark.parametrize("case", SWEEP, ids=_id)
def test_decode_sweep(simulator_backend, case):
    test_decode_matches_float64(simulator_backend, case)


def test_one_pair_splits_its_keys_over_the_two_cores():
    """At LNC=2 a launch with one (batch, kv head) pair and more than DECODE_RESIDENT_KEYS
    keys gives each core half of the keys: one sendrecv per core swaps the partial O |
    rowsum | max, and only core 0 stores. Values against float64, also with the keys of one
    half (or all of them) masked."""
    q, k, v = make_qkv(1, 4, 1, 2, 5000, 128, dtype=BF16)
    call, res = _kernel_trace(q, k, v, lnc=2)
    exchanges = [ins for ins in res.trace if ins.op == "sendrecv"]
    assert sorted(ins.attrs["core"] for ins in exchanges) == [0, 1]
    stores = [ins for ins in res.trace if ins.op == "dma_copy" and any(w.buffer == "hbm" for w in ins.writes)]
    assert stores and {ins.attrs["core"] for ins in stores} == {0}
    assert {ins.attrs["core"] for ins in _exps(res)} == {0, 1}          # both cores make scores
    check_close(call.finish_outputs(res.outputs), q, k, v)
    for cut in (3000, 5000):                     # core 0's keys all masked; every key masked
        mask = torch.ones(1, 1, 1, 5000, dtype=torch.bool)
        mask[..., :cut] = False
        call, res = _kernel_trace(q, k, v, mask, lnc=2)
        out = call.finish_outputs(res.outputs)
        if cut == 5000:
            assert (out == 0).all()
        else:
            check_close(out, q, k, v, mask)


def test_an_odd_number_of_pairs_splits_only_the_last_pair():
    """3 pairs with streamed keys at LNC=2: each core takes one whole pair and half of the
    last pair's keys; one exchange per core; core 0 stores two pairs' rows, core 1 one."""
    q, k, v = make_qkv(3, 4, 1, 1, 4096, 128, dtype=BF16)
    mask = make_mask("key_bool", 3, 4, 1, 4096, BF16)
    call, res = _kernel_trace(q, k, v, mask, lnc=2)
    assert sorted(ins.attrs["core"] for ins in res.trace if ins.op == "sendrecv") == [0, 1]
    stores = [ins.attrs["core"] for ins in res.trace if ins.op == "dma_copy" and any(w.buffer == "hbm" for w in ins.writes)]
    assert sorted(stores) == [0, 0, 1]
    check_close(call.finish_outputs(res.outputs), q, k, v, mask)

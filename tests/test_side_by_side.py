"""benchmarks/side_by_side_nki_library.py: the table's claims and the statuses of AWS's side.

The comparison itself runs AWS's kernels from an nki-library checkout (skipped without
one); the rest checks what the table says about a pair: the ratio, the "at least as fast"
claim at the central value and both ends of the error bar, and which AWS kernel a row is
against (a refused shape and a kernel our simulator cannot run are told apart)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
NKILIB_CHECKOUT = Path(os.environ.get("NKILIB_CHECKOUT", "/work/scratch/nkilib/nki-library"))
HAVE_CHECKOUT = (NKILIB_CHECKOUT / "src" / "nkilib_src" / "nkilib").is_dir()


@pytest.fixture(scope="module")
def sbs():
    spec = importlib.util.spec_from_file_location("_side_by_side", ROOT / "benchmarks" / "side_by_side_nki_library.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _pair(sbs, ours, aws):
    return sbs.Pair("op", "shape", sbs.Side("ok", *ours), sbs.Side("ok", *aws, kernel="aws_kernel"))


def test_ours_is_at_least_as_fast_only_at_the_central_value_and_both_ends(sbs):
    assert _pair(sbs, (10.0, 8.0, 12.0), (11.0, 9.0, 14.0)).ours_at_least_as_fast is True
    # faster at the centre and the pessimistic end, slower at the optimistic end: no claim
    slower_low = _pair(sbs, (10.0, 8.0, 12.0), (11.0, 7.5, 14.0))
    assert slower_low.ours_at_least_as_fast is False
    assert slower_low.ratio == pytest.approx(10.0 / 11.0)
    assert _pair(sbs, (12.0, 8.0, 12.0), (11.0, 9.0, 14.0)).ours_at_least_as_fast is False
    assert _pair(sbs, (10.0, 8.0, 15.0), (11.0, 9.0, 14.0)).ours_at_least_as_fast is False


def test_a_side_that_did_not_run_makes_no_ratio_and_no_claim(sbs):
    pair = sbs.Pair("op", "shape", sbs.Side("ok", 10.0, 8.0, 12.0),
                    sbs.Side("refused", note="seq len must be a multiple of 256", kernel="rope_hf"))
    assert pair.ours_at_least_as_fast is None
    row = sbs.table([pair], "trn2").splitlines()[-1]
    assert row == ("| op | shape | 10.0 (8.0-12.0) | rope_hf | refused: seq len must be a multiple of 256 | - "
                   "| - |")


def test_a_long_note_is_cut_visibly_in_the_table_and_kept_whole_in_the_csv(sbs, tmp_path):
    note = "x" * 100
    pair = sbs.Pair("op", "[4, 8] fp16", sbs.Side("ok", 10.0, 8.0, 12.0),
                    sbs.Side("blocked", note=note, kernel="aws_kernel"))
    cell = pair.aws.text()
    assert len(cell) == 70 and cell.endswith("...") and cell.startswith("blocked: xxx")
    faster = _pair(sbs, (10.0, 8.0, 12.0), (11.0, 9.0, 14.0))
    path = tmp_path / "pairs.csv"
    sbs.write_csv([pair, faster], path, "trn2", 2, "abc123")
    import csv
    rows = list(csv.DictReader(path.open()))
    assert rows[0]["aws_note"] == note and rows[0]["aws_status"] == "blocked"
    assert rows[0]["ours_over_aws"] == "" and rows[0]["ours_at_least_as_fast"] == ""
    assert float(rows[1]["ours_us_modeled_trn2"]) == 10.0 and float(rows[1]["aws_high_us_modeled_trn2"]) == 14.0
    assert (float(rows[1]["ours_low_us_modeled_trn2"]), float(rows[1]["ours_high_us_modeled_trn2"])) == (8.0, 12.0)
    assert (float(rows[1]["aws_us_modeled_trn2"]), float(rows[1]["aws_low_us_modeled_trn2"])) == (11.0, 9.0)
    assert float(rows[1]["ours_over_aws"]) == pytest.approx(10.0 / 11.0)
    assert rows[1]["ours_at_least_as_fast"] == "yes" and rows[1]["nkilib_commit"] == "abc123"


@pytest.mark.parametrize("argv, message", [
    (["--ops", ","], "--ops ',' names no op"),
    (["--ops", "rmsnorm"], "--ops ['rmsnorm'] unknown"),
    (["--csv", "/nonexistent/dir/pairs.csv"], "--csv /nonexistent/dir/pairs.csv: folder /nonexistent/dir does not exist"),
    ([], "--nkilib /nonexistent/checkout: not an nki-library checkout"),   # a traceback before
], ids=["empty-ops", "unknown-op", "missing-folder", "missing-checkout"])
def test_bad_arguments_are_refused_before_any_kernel_runs(sbs, capsys, argv, message):
    with pytest.raises(SystemExit):
        sbs.main(["--nkilib", "/nonexistent/checkout", *argv])
    assert message in capsys.readouterr().err


def test_two_launches_add_up_and_name_the_kernel_once(sbs):
    total = sbs._sum([sbs.Side("ok", 3.0, 2.0, 4.0, kernel="RoPE"), sbs.Side("ok", 1.5, 1.0, 2.5, kernel="RoPE")])
    assert (total.us, total.low, total.high, total.kernel) == (4.5, 3.0, 6.5, "RoPE x 2")
    blocked = sbs.Side("blocked", note="CapacityError", kernel="RoPE")
    assert sbs._sum([sbs.Side("ok", 3.0, 2.0, 4.0, kernel="RoPE"), blocked]) is blocked


@pytest.mark.skipif(not HAVE_CHECKOUT, reason="needs an aws-neuron/nki-library checkout (set NKILIB_CHECKOUT)")
def test_aws_refusing_or_outgrowing_a_shape_is_told_apart_from_a_kernel_we_cannot_run(sbs):
    lib = sbs.NkiLibrary(NKILIB_CHECKOUT)
    gen = torch.Generator().manual_seed(7)
    q, k = sbs._rand((1, 4, 128, 64), torch.bfloat16, gen), sbs._rand((1, 2, 128, 64), torch.bfloat16, gen)
    cos, sin = sbs._rand((1, 128, 64), torch.bfloat16, gen), sbs._rand((1, 128, 64), torch.bfloat16, gen)
    # rope_hf at LNC=2 splits the sequence over the two cores in 128-row tiles: 128 is refused
    side = lib.run("core.embeddings.rope_hf", "rope_hf", "trn2", 2, q=q, k=k, q_out=torch.zeros_like(q),
                   k_out=torch.zeros_like(k), cos=cos, sin=sin)
    assert (side.status, side.kernel) == ("refused", "rope_hf")
    assert side.note == "seq len must be multiple of 128 * LNC=2, got 128"
    # AWS's [d, B, H, S] RoPE called on a whole 2048-position sequence outgrows SBUF
    x = sbs._rand((128, 1, 32, 2048), torch.bfloat16, gen)
    half = sbs._rand((64, 1, 2048), torch.bfloat16, gen)
    big = lib.run("core.embeddings.rope", "RoPE", "trn2", 2, x_in=x, cos=half, sin=half)
    assert (big.status, big.kernel) == ("exceeds memory", "RoPE")
    assert big.note.startswith("sbuf: a tensor (64, 1, 32, 2048) bfloat16 needs")
    missing = lib.run("core.embeddings.rope_hf", "no_such_kernel", "trn2", 2)
    assert (missing.status, missing.kernel) == ("blocked", "no_such_kernel")
    assert missing.note.startswith("AttributeError")


@pytest.mark.skipif(not HAVE_CHECKOUT, reason="needs an aws-neuron/nki-library checkout (set NKILIB_CHECKOUT)")
def test_rope_rows_compare_ours_with_both_of_aws_kernels(sbs):
    lib = sbs.NkiLibrary(NKILIB_CHECKOUT)
    pairs = sbs.rope_pairs(lib, "trn2", 2, quick=True)
    assert [p.aws.kernel for p in pairs] == ["rope_hf", "RoPE x 2"]
    for p in pairs:
        assert p.ours.status == p.aws.status == "ok", (p.ours.note, p.aws.note)
        assert p.ours.low <= p.ours.us <= p.ours.high and p.aws.low <= p.aws.us <= p.aws.high
    assert pairs[0].ours is pairs[1].ours          # one run of ours against both


@pytest.mark.skipif(not HAVE_CHECKOUT, reason="needs an aws-neuron/nki-library checkout (set NKILIB_CHECKOUT)")
@pytest.mark.parametrize("rows, op, kernel", [
    ("rope_backward_pairs", "apply_rotary_pos_emb backward", "rope_hf"),       # rope_hf(backward=True)
    ("attention_decode_pairs", "scaled_dot_product_attention (decode)", "attention_tkg"),
])
def test_single_kernel_rows_compare_ours_with_the_aws_kernel(sbs, rows, op, kernel):
    lib = sbs.NkiLibrary(NKILIB_CHECKOUT)
    (pair,) = getattr(sbs, rows)(lib, "trn2", 2, quick=True)
    assert pair.op == op and pair.aws.kernel == kernel
    assert pair.ours.status == pair.aws.status == "ok", (pair.ours.note, pair.aws.note)
    assert pair.ours.low <= pair.ours.us <= pair.ours.high and pair.aws.low <= pair.aws.us <= pair.aws.high


def test_the_table_says_modeled_on_both_sides_and_states_the_ratio_and_the_claim(sbs):
    faster, slower = _pair(sbs, (10.0, 8.0, 12.0), (11.0, 9.0, 14.0)), _pair(sbs, (12.0, 10.0, 15.0), (11.0, 9.0, 14.0))
    header, rule, *rows = sbs.table([faster, slower], "trn3").splitlines()
    assert "ours, modeled (trn3) us" in header and "nki-library, modeled (trn3) us" in header
    assert "measured" not in header
    assert rows[0] == f"| op | shape | 10.0 (8.0-12.0) | aws_kernel | 11.0 (9.0-14.0) | {10.0 / 11.0:.2f} | yes |"
    assert rows[1] == f"| op | shape | 12.0 (10.0-15.0) | aws_kernel | 11.0 (9.0-14.0) | {12.0 / 11.0:.2f} | no |"


def test_a_note_that_fits_the_cell_is_not_cut(sbs):
    side = sbs.Side("blocked", note="y" * (70 - len("blocked: ")))
    assert side.text() == "blocked: " + "y" * 61 and len(side.text()) == 70


@pytest.mark.skipif(not HAVE_CHECKOUT, reason="needs an aws-neuron/nki-library checkout (set NKILIB_CHECKOUT)")
def test_a_plain_function_sub_kernel_launches_at_the_tables_lnc(sbs):
    # layernorm_tkg is a plain function (other kernels call it); with shard_on_h=True each
    # core takes half of H and exchanges its partial sums with the other core (sendrecv),
    # which only an LNC=2 launch can do: run as a plain call it ran at LNC=1 and deadlocked
    lib = sbs.NkiLibrary(NKILIB_CHECKOUT)
    gen = torch.Generator().manual_seed(11)
    x, w, b = (sbs._rand(shape, torch.float16, gen) for shape in ((2, 8, 3072), (1, 3072), (1, 3072)))
    side = lib.run("core.subkernels.layernorm_tkg", "layernorm_tkg", "trn2", 2, input=x, gamma=w, beta=b,
                   output=torch.zeros((128, 16, 24), dtype=torch.float16), eps=1e-6, shard_on_h=True)
    assert (side.status, side.kernel) == ("ok", "layernorm_tkg"), side.note
    plain = lib.function("core.subkernels.layernorm_tkg", "layernorm_tkg", "trn2")
    with pytest.raises(TypeError, match="not an nki.jit kernel, so it cannot be launched at lnc=2"):
        lib.run_kernel(plain, "layernorm_tkg", "trn2", 2, input=x)

"""Rules of NKI 0.7 instructions the simulator enforces as their docstrings state them
(review of 2026-12-04; each test names the instruction and quotes the rule it holds)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import NkiValidationError


def test_affine_select_with_equal_dtypes_selects_bits(sim, mk):
    # "If the data type of on_true_tile differs from that of dst, the input elements ... are
    # first cast to FP32": with equal dtypes an int32 above 2**24 keeps its low bits
    _, nl, nisa = sim
    big = torch.randint(2**24 + 1, 2**30, (8, 6)) * torch.where(torch.rand(8, 6) < 0.5, -1, 1)
    dst = nl.ndarray((8, 6), dtype=nl.int32, buffer=nl.sbuf)
    # affine value = partition - column: select where it is >= 0 (lower triangle), else -7
    nisa.affine_select(dst, [[-1, 6]], 1, mk(big, "int32"), -7, cmp_op=nl.greater_equal)
    p, f = torch.meshgrid(torch.arange(8), torch.arange(6), indexing="ij")
    expect = torch.where(p - f >= 0, big, torch.full_like(big, -7))
    assert torch.equal(dst.values().to(torch.int64), expect)
    # a differing dtype still goes through fp32 (the documented cast)
    dst_f = nl.ndarray((8, 6), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst_f, [[-1, 6]], 1, mk(big, "int32"), -7.0, cmp_op=nl.greater_equal)
    assert torch.equal(dst_f.values(), expect.to(torch.float32))


def test_tensor_partition_reduce_takes_xor_and_refuses_what_it_cannot(sim, mk):
    # "op - the reduction operator (add, mean, max, bitwise_or, bitwise_and, bitwise_xor)";
    # "at most four free dimensions (maximum rank 5)"
    _, nl, nisa = sim
    x = torch.randint(0, 2**20, (40, 12))
    dst = nl.ndarray((1, 12), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_partition_reduce(dst, nl.bitwise_xor, mk(x, "int32"))
    expect = x[0].clone()
    for row in x[1:]:
        expect ^= row
    assert torch.equal(dst.values().to(torch.int64)[0], expect)
    with pytest.raises(NkiValidationError, match="bitwise_or takes integer data"):
        nisa.tensor_partition_reduce(nl.ndarray((1, 12), dtype=nl.float32, buffer=nl.sbuf),
                                     nl.bitwise_or, mk(torch.randn(40, 12)))
    x6 = mk(torch.randn(4, 2, 2, 2, 2, 2))
    with pytest.raises(NkiValidationError, match="rank 6 .* at most 5"):
        nisa.tensor_partition_reduce(nl.ndarray((1, 2, 2, 2, 2, 2), dtype=nl.float32, buffer=nl.sbuf),
                                     nl.add, x6)


def test_nc_matmul_double_row_refuses_column_tiling_and_transpose_keeps_fp32_pairing(sim, mk):
    # "double_row performance mode cannot be combined with Tensor Engine column tiling mode";
    # "if one of the input tiles is tfloat32/float32, the other tile must also be" (no
    # exception for is_transpose)
    _, nl, nisa = sim
    st = mk(torch.randn(32, 2, 64), "float8_e4m3")
    mv = mk(torch.randn(32, 2, 100), "float8_e4m3")
    dst = nl.ndarray((64, 100), dtype=nl.float32, buffer=nl.psum)
    with pytest.raises(NkiValidationError, match="double_row cannot be combined with column tiling"):
        nisa.nc_matmul(dst, st, mv, perf_mode=nisa.matmul_perf_mode.double_row,
                       tile_position=(0, 64), tile_size=(32, 64))
    eye = mk(torch.eye(16), "bfloat16")
    with pytest.raises(NkiValidationError, match="pairs only with float32"):
        nisa.nc_matmul(nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.psum),
                       mk(torch.randn(16, 16)), eye, is_transpose=True)


def test_dma_transpose_dge_rules(sim, mk):
    # direct: "The only valid dge_modes are unknown and hwdge"; with hwdge "src.shape[0] ==
    # 16" (2-D), "src.shape[-1] <= 128", "src.dtype is 2 bytes"; indirect: unknown or swdge,
    # 2-byte dtype; dge_mode: "Hardware based DGE is only supported for NeuronCore-v3 or newer"
    _, nl, nisa = sim
    x = torch.randn(16, 96)
    src = mk(x, "bfloat16", "hbm")
    dst = nl.ndarray((96, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_transpose(dst, src, dge_mode=nisa.dge_mode.hwdge)
    assert torch.equal(dst.values(), src.values().t())
    with pytest.raises(NkiValidationError, match="not valid for a direct transpose"):
        nisa.dma_transpose(dst, src, dge_mode=nisa.dge_mode.swdge)
    # none: against the docstring's list, but AWS's nki-library (mlp_tkg) issues it, and as
    # the member's int value (_DGE_MODE_NONE = 3), as that kernel passes it
    for mode in (nisa.dge_mode.none, 3):
        again = nl.ndarray((96, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(again, src, dge_mode=mode)
        assert torch.equal(again.values(), src.values().t())
    with pytest.raises(NkiValidationError, match="dge_mode=7 is not a nisa.dge_mode member"):
        nisa.dma_transpose(dst, src, dge_mode=7)
    with pytest.raises(NkiValidationError, match="2-byte src dtype"):
        nisa.dma_transpose(nl.ndarray((96, 16), dtype=nl.float32, buffer=nl.sbuf),
                           mk(x, "float32", "hbm"), dge_mode=nisa.dge_mode.hwdge)
    with pytest.raises(NkiValidationError, match=r"src.shape\[0\] == 16"):
        nisa.dma_transpose(nl.ndarray((96, 32), dtype=nl.bfloat16, buffer=nl.sbuf),
                           mk(torch.randn(32, 96), "bfloat16", "hbm"), dge_mode=nisa.dge_mode.hwdge)
    # the same fp32 transpose with the compiler's choice of DGE is fine
    d32 = nl.ndarray((96, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_transpose(d32, mk(x, "float32", "hbm"))
    assert torch.equal(d32.values(), x.t())
    table = mk(torch.randn(256, 128), "float32", "hbm")
    idx = mk(torch.randperm(256)[:128].reshape(128, 1), "uint32")
    view = table.ap(pattern=[[128, 128], [1, 128]], vector_offset=idx, indirect_dim=0)
    with pytest.raises(NkiValidationError, match="an indirect transpose needs a 2-byte"):
        nisa.dma_transpose(nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf), view, axes=(1, 0))
    # a bf16 gather-transpose as the docstring's 1-D example; its indices' limits refused
    table16 = mk(torch.randn(256, 64), "bfloat16", "hbm")
    rows = torch.randperm(256)[:128]
    view16 = table16.ap(pattern=[[64, 128], [1, 64]], vector_offset=idx, indirect_dim=0)
    gathered = nl.ndarray((64, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
    idx.dtype.assign(idx._data, rows.reshape(128, 1))
    nisa.dma_transpose(gathered, view16, axes=(1, 0))
    assert torch.equal(gathered.values(), table16.values()[rows].t())
    for bad, message in ((mk(rows[:8].reshape(8, 1), "uint32"), r"partitions must be in \[16, 128\]"),
                         (mk(rows.reshape(128, 1), "int32"), "indices' dtype must be uint32")):
        bad_view = table16.ap(pattern=[[64, bad.shape[0]], [1, 64]], vector_offset=bad, indirect_dim=0)
        with pytest.raises(NkiValidationError, match=message):
            nisa.dma_transpose(nl.ndarray((64, bad.shape[0]), dtype=nl.bfloat16, buffer=nl.sbuf), bad_view,
                               axes=(1, 0))
    # "When src is 4D: len(src[1]) or len(src[2]) must be 1": [rows, 1, 2, 8] gathers and
    # transposes; [rows, 2, 2, 8] is refused
    table4 = mk(torch.randn(64, 2, 2, 8), "bfloat16", "hbm")
    rows16 = torch.randperm(64)[:16]
    idx16 = mk(rows16.reshape(16, 1), "uint32")
    one = table4.ap(pattern=[[32, 16], [16, 1], [8, 2], [1, 8]], vector_offset=idx16, indirect_dim=0)
    got = nl.ndarray((8, 1, 2, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_transpose(got, one, axes=(3, 1, 2, 0))
    assert torch.equal(got.values(), table4.values()[rows16][:, 0:1].permute(3, 1, 2, 0))
    both = table4.ap(pattern=[[32, 16], [16, 2], [8, 2], [1, 8]], vector_offset=idx16, indirect_dim=0)
    with pytest.raises(NkiValidationError, match=r"4-D indirect transpose needs src.shape\[1\] or "
                                                 r"src.shape\[2\] to be 1, got src shape \(16, 2, 2, 8\)"):
        nisa.dma_transpose(nl.ndarray((8, 2, 2, 16), dtype=nl.bfloat16, buffer=nl.sbuf), both, axes=(3, 1, 2, 0))
    # oob_mode=skip "Only valid when src uses indirect indexing"
    with pytest.raises(NkiValidationError, match="oob_mode=skip is only valid when src uses indirect"):
        nisa.dma_transpose(nl.ndarray((96, 16), dtype=nl.bfloat16, buffer=nl.sbuf), src,
                           oob_mode=nisa.oob_mode.skip)
    with simulator.activated("trn1") as nki1:
        t1 = nki1.language.ndarray((16, 96), dtype=nki1.language.bfloat16, buffer=nki1.language.hbm)
        d1 = nki1.language.ndarray((96, 16), dtype=nki1.language.bfloat16, buffer=nki1.language.sbuf)
        with pytest.raises(NkiValidationError, match="hwdge needs NeuronCore-v3"):
            nki1.isa.dma_transpose(d1, t1, dge_mode=nki1.isa.dge_mode.hwdge)


def test_indirect_transpose_with_2d_indices_reads_them_column_by_column(sim, mk):
    # nki.isa.dma_transpose, "Indirect transpose example with 2D indices (indices.shape=[128,
    # N] where N > 1)": "flat_indices = indices.T.flatten()[:src.shape[0]]", "gathered =
    # src[flat_indices, :]", "dst = gathered.T"; "When indices.shape[1] > 1: indices.shape[0]
    # must be exactly 128"
    _, nl, nisa = sim
    table = mk(torch.randn(512, 128), "bfloat16", "hbm")
    chosen = torch.randperm(512)[:256]
    indices = chosen.reshape(2, 128).t().contiguous()          # [128, 2]: column 0 first
    idx = mk(indices, "uint32")
    view = table.ap(pattern=[[128, 256], [1, 128]], vector_offset=idx, indirect_dim=0)
    dst = nl.ndarray((128, 256), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_transpose(dst, view, axes=(1, 0))
    flat = indices.t().reshape(-1)
    assert torch.equal(dst.values(), table.values()[flat].t())
    assert not torch.equal(flat, indices.reshape(-1))           # row-major order would differ
    # fewer gathered rows than indices: the first src.shape[0] of the flat order
    part = table.ap(pattern=[[128, 160], [1, 128]], vector_offset=idx, indirect_dim=0)
    dst160 = nl.ndarray((128, 160), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_transpose(dst160, part, axes=(1, 0))
    assert torch.equal(dst160.values(), table.values()[flat[:160]].t())
    narrow = mk(chosen[:128].reshape(64, 2), "uint32")
    view64 = table.ap(pattern=[[128, 128], [1, 128]], vector_offset=narrow, indirect_dim=0)
    with pytest.raises(NkiValidationError, match=r"indices of 2 columns need exactly 128 partitions.*"
                                                 r"got shape \(64, 2\)"):
        nisa.dma_transpose(nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf), view64, axes=(1, 0))
    # a copy takes one offset per partition: 2-D indices are documented for transposes only
    with pytest.raises(NkiValidationError, match=r"dma_copy: src's vector_offset has shape \(128, 2\)"):
        nisa.dma_copy(nl.ndarray((256, 128), dtype=nl.bfloat16, buffer=nl.hbm), view)
    with pytest.raises(NkiValidationError, match=r"must have shape \(P, 1\) or \(P, N\), got \(128, 2, 1\)"):
        table.ap(pattern=[[128, 256], [1, 128]], vector_offset=mk(indices.reshape(128, 2, 1), "uint32"),
                 indirect_dim=0)


def test_nc_stream_shuffle_mask_range_and_start_partitions(sim, mk):
    # "shuffle_mask[i] indicates which input partition ... within each 32-partition quadrant"
    # (or 255); "If num_active_partitions is 64, src_start_partition/dst_start_partition must
    # be 0/64", "If ... 32, ... must be 0/32/64/96"
    _, nl, nisa = sim
    x = torch.randn(32, 4)
    big = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
    mask = torch.randperm(32).tolist()
    nisa.nc_stream_shuffle(big[96:128, :], mk(x), mask)  # 32 active: start 96 is allowed
    assert torch.equal(big.values()[96:128], x[mask])
    with pytest.raises(NkiValidationError, match=r"shuffle_mask\[0\]=40"):
        nisa.nc_stream_shuffle(nl.ndarray((32, 4), dtype=nl.float32, buffer=nl.sbuf),
                               mk(torch.randn(64, 4)), [40] + list(range(1, 32)))
    with pytest.raises(NkiValidationError, match="dst starts at partition 32; with 64 active"):
        nisa.nc_stream_shuffle(big[32:64, :], mk(torch.randn(64, 4)), list(range(32)))


def test_tensor_scalar_cumulative_subtract_and_refusals(sim, mk):
    # "Reduction operation (op1) is limited to add, subtract, mult, max, min" with reg =
    # op1(op0(x[i], imm0), reg); "INT32/UINT32 are not supported"; imm1 "Must be FP32"
    _, nl, nisa = sim
    x = torch.randn(8, 9)
    dst = nl.ndarray((8, 9), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_cumulative(dst, mk(x), nl.multiply, nl.subtract, 3.0)
    reg = torch.zeros(8, dtype=torch.float64)
    expect = torch.empty(8, 9, dtype=torch.float64)
    for i in range(9):
        reg = 3.0 * x[:, i].double() - reg
        expect[:, i] = reg
    torch.testing.assert_close(dst.values().double(), expect, atol=1e-5, rtol=1e-5)
    with pytest.raises(NkiValidationError, match="src dtype int32 is not supported"):
        nisa.tensor_scalar_cumulative(nl.ndarray((8, 9), dtype=nl.float32, buffer=nl.sbuf),
                                      mk(torch.randint(-9, 9, (8, 9)), "int32"), nl.add, nl.add, 0.0)
    with pytest.raises(NkiValidationError, match="imm1 tile must be float32"):
        nisa.tensor_scalar_cumulative(dst, mk(x), nl.add, nl.add, 0.0, imm1=mk(torch.randn(8, 1), "bfloat16"),
                                      reduce_cmd=nisa.reduce_cmd.load_reduce)
    with pytest.raises(NkiValidationError, match="op0 .* must be an arithmetic operator"):
        nisa.tensor_scalar_cumulative(dst, mk(x), nl.bitwise_and, nl.add, 1)
    # a comparison is an arithmetic operator ("Supported Math Operators for NKI ISA"): a
    # running count of the elements above 0.25
    nisa.tensor_scalar_cumulative(dst, mk(x), nl.greater, nl.add, 0.25)
    assert torch.equal(dst.values(), (x > 0.25).to(torch.float32).cumsum(1))
    # the register commands its pseudo-code names: reset_reduce, reduce, load_reduce; reset and
    # idle would leave the register as the previous instruction left it
    for cmd in (nisa.reduce_cmd.reset, nisa.reduce_cmd.idle):
        with pytest.raises(NkiValidationError, match=f"reduce_cmd=.*{cmd.name}.* is not supported "
                                                     r"\(reset_reduce, reduce, load_reduce\)"):
            nisa.tensor_scalar_cumulative(dst, mk(x), nl.add, nl.add, 0.0, reduce_cmd=cmd)


def test_tensor_scalar_reduce_refuses_what_its_docstring_does_not_support(sim, mk):
    # reverse0 "(not supported yet)"; reduce_cmd "Supported: reset_reduce (default), reduce,
    # load_reduce"; reduce_init "Supported dtypes: float32", "should only be set when
    # reduce_cmd is load_reduce"; "at most three free dimensions"
    _, nl, nisa = sim
    x = mk(torch.randn(8, 12))
    dst = nl.ndarray((8, 12), dtype=nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((8, 1), dtype=nl.float32, buffer=nl.sbuf)
    cases = [
        (dict(reverse0=True), "reverse0=True is not supported"),
        (dict(reduce_cmd=nisa.reduce_cmd.idle), "reduce_cmd=.*idle.* is not supported"),
        (dict(reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=mk(torch.randn(8, 1), "bfloat16")),
         "reduce_init tile must be float32"),
        (dict(reduce_init=1.5), "reduce_init is only for reduce_cmd=load_reduce"),
    ]
    for kwargs, msg in cases:
        with pytest.raises(NkiValidationError, match=msg):
            nisa.tensor_scalar_reduce(dst, x, nl.add, 1.0, nl.add, res, **kwargs)
    x5 = mk(torch.randn(4, 2, 2, 2, 2))
    with pytest.raises(NkiValidationError, match="rank 5 .* at most 4"):
        nisa.tensor_scalar_reduce(nl.ndarray((4, 2, 2, 2, 2), dtype=nl.float32, buffer=nl.sbuf), x5,
                                  nl.add, 1.0, nl.add, nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf))
    # load_reduce with an fp32 reduce_init starts the sum from it
    init = torch.randn(8, 1)
    xv = torch.randn(8, 12)
    nisa.tensor_scalar_reduce(dst, mk(xv), nl.multiply, 2.0, nl.add, res,
                              reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=mk(init))
    torch.testing.assert_close(res.values(), init + (2 * xv).sum(1, keepdim=True), atol=1e-5, rtol=1e-5)


def test_packed_memset_zero_and_small_checks(sim, mk):
    # memset: "For x4 packed types ... only value=0 is supported"; max8: "The source tile can
    # be up to 3-dimensional, while the output tile is always 2-dimensional"; activation's
    # reduce_cmd has no load_reduce; tensor_tensor_scan: "any binary arithmetic operator";
    # nonzero_with_count: index_offset and padding_val "must be int32" (numpy ints are)
    _, nl, nisa = sim
    packed = nl.ndarray((4, 8), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    packed._data.fill_(0x5A5A5A5A)
    nisa.memset(packed, 0)
    assert not bool(packed._data.ne(0).any())
    with pytest.raises(NkiValidationError, match="only value=0 is supported"):
        nisa.memset(packed, 1.0)
    with pytest.raises(NkiValidationError, match="src has rank 4"):
        nisa.max8(nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf), mk(torch.randn(4, 2, 2, 4)))
    with pytest.raises(NkiValidationError, match="dst must be 2-D"):
        nisa.max8(nl.ndarray((4, 2, 4), dtype=nl.float32, buffer=nl.sbuf), mk(torch.randn(4, 16)))
    a = mk(torch.randn(4, 8))
    with pytest.raises(NkiValidationError, match="load_reduce is not supported"):
        nisa.activation(nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf), nl.exp, a, reduce_op=nl.add,
                        reduce_res=nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf),
                        reduce_cmd=nisa.reduce_cmd.load_reduce)
    with pytest.raises(NkiValidationError, match="op0 .* must be a binary arithmetic operator"):
        nisa.tensor_tensor_scan(nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf), a, a, 0.0,
                                nl.bitwise_and, nl.add)
    s = torch.where(torch.rand(16, 8) < 0.5, torch.randn(16, 8), torch.zeros(16, 8))
    nd = nl.ndarray((16, 9), dtype=nl.int32, buffer=nl.sbuf)
    nisa.nonzero_with_count(nd, mk(s), index_offset=np.int32(16), padding_val=np.int32(-1))
    got = nd.values().to(torch.int64)
    nz = (s[0] != 0).nonzero().flatten()
    assert torch.equal(got[0, :nz.numel()], nz + 16) and int(got[0, 8]) == nz.numel()


def test_exponential_reduce_res_dtype_on_trn3():
    # reduce_res "Supported dtypes: float8_e4m3, float8_e5m2, float16, bfloat16, float32, tfloat32"
    with simulator.activated("trn3") as nki:
        nl, nisa = nki.language, nki.isa
        src = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
        src.dtype.assign(src._data, torch.randn(4, 8))
        with pytest.raises(NkiValidationError, match="reduce_res dtype int32 is not supported"):
            nisa.exponential(nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf), src,
                             reduce_res=nl.ndarray((4, 1), dtype=nl.int32, buffer=nl.sbuf),
                             reduce_cmd=nisa.reduce_cmd.reset_reduce)

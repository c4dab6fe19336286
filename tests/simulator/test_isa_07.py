"""Instructions added for NKI 0.7 kernels (nonzero_with_count, local_gather, quantize_mx,
nc_matmul_mx) and the rules that follow the docs' wording (tensor_tensor start partitions,
scalar_tensor_tensor operand dtypes, step-0 destinations)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import NkiValidationError
from nki_kernels.simulator.isa.tensor_engine import mx_values


def test_nonzero_with_count_docstring_example(sim, mk):
    _, nl, nisa = sim
    row = torch.tensor([0, 1, 1, 0, 0, 1, 0, 0], dtype=torch.float32)
    src = mk(torch.stack([row] * 32))
    dst = mk(torch.full((32, 9), 77), "int32")
    nisa.nonzero_with_count(dst, src, index_offset=16, padding_val=-1)
    v = dst.values()
    assert v[0].tolist() == [17, 18, 21, -1, -1, -1, -1, -1, 3] and torch.equal(v[16], v[0])
    assert v[1].eq(77).all() and v[17:].eq(77).sum() == 15 * 9  # only partitions 0, 16


def test_nonzero_with_count_random_rows_and_rules(sim, mk):
    _, nl, nisa = sim
    x = (torch.rand(128, 40) < 0.3).to(torch.int32) * torch.randint(1, 9, (128, 40))
    dst = mk(torch.zeros(128, 41), "int32")
    nisa.nonzero_with_count(dst, mk(x, "int32"), padding_val=-5)
    for p in range(0, 128, 16):
        nz = torch.nonzero(x[p]).reshape(-1)
        ref = torch.cat([nz, torch.full((40 - nz.numel(),), -5), torch.tensor([nz.numel()])])
        assert torch.equal(dst.values()[p], ref)
    with pytest.raises(NkiValidationError, match="one more element"):
        nisa.nonzero_with_count(mk(torch.zeros(128, 40), "int32"), mk(x, "int32"))
    with pytest.raises(NkiValidationError, match="src dtype must be float32 or int32"):
        nisa.nonzero_with_count(dst, mk(x, "bfloat16"))


def test_local_gather_matches_the_docstrings_numpy_semantics(sim, mk):
    _, nl, nisa = sim
    rng = np.random.default_rng(3)
    src = rng.random((128, 512, 4), dtype=np.float32)
    per_core = rng.integers(0, 512, (16, 4))
    index = np.tile(per_core, (8, 1))
    n_elem, n_valid = 4, 64
    dst = nl.ndarray((128, n_valid * n_elem), dtype=nl.float32)
    nisa.local_gather(dst, mk(torch.from_numpy(src.reshape(128, -1))),
                      mk(torch.from_numpy(index * n_elem), "uint16"), n_elem, n_valid)
    ref = np.empty((128, n_valid, n_elem), np.float32)
    for c in range(8):
        idx = index[16 * c:16 * (c + 1)].flatten(order="F")[:n_valid]
        ref[16 * c:16 * (c + 1)] = np.take(src[16 * c:16 * (c + 1)], idx, axis=1)
    assert np.array_equal(dst.values().numpy(), ref.reshape(128, -1))
    with pytest.raises(NkiValidationError, match="num_elem_per_idx=3"):
        nisa.local_gather(dst, mk(torch.zeros(128, 8)),
                          mk(torch.zeros(128, 4), "uint16"), 3)
    with pytest.raises(NkiValidationError, match="index must be uint16"):
        nisa.local_gather(dst, mk(torch.zeros(128, 8)), mk(torch.zeros(128, 4), "int32"))


def test_local_gather_records_what_its_cost_needs(sim, mk, last):
    # the cost model prices local_gather from num_elem_per_idx and num_valid_indices, whose
    # default is every index of one GpSimd core: index.size / (index.shape[0] / 16)
    _, nl, nisa = sim
    index = mk(torch.randint(0, 100, (128, 3)), "uint16")
    dst = nl.ndarray((128, 48 * 2), dtype=nl.bfloat16)
    nisa.local_gather(dst, mk(torch.randn(128, 256), "bfloat16"), index, 2)
    assert last().attrs == {"num_elem_per_idx": 2, "num_valid_indices": 48}
    dst = nl.ndarray((128, 10 * 2), dtype=nl.bfloat16)
    nisa.local_gather(dst, mk(torch.randn(128, 256), "bfloat16"), index, 2, 10)
    assert last().attrs["num_valid_indices"] == 10


def _quantize(nl, nisa, x, dtype="float8_e4m3fn_x4"):
    """quantize_mx of x (bf16) under the caller's trn3 context (the mk fixture is trn2's)."""
    P, F = x.shape
    src = nl.ndarray((P, F), dtype=nl.bfloat16)
    src.dtype.assign(src._data, x)
    data = nl.ndarray((P, F // 4), dtype=getattr(nl, dtype))
    scale = nl.ndarray((P, F // 4), dtype=nl.float8_e8m0fnu)
    nisa.quantize_mx(data, src, scale)
    return src, data, scale


def test_quantize_mx_scales_follow_the_docstring_formula():
    with simulator.activated("trn3") as nki:
        nl, nisa = nki.language, nki.isa
        x = torch.randn(64, 16) * 10
        x[8:16, 0:4] = 0.0  # an all-zero group
        src, data, scale = _quantize(nl, nisa, x)
        v = src.values().reshape(8, 8, 4, 4)           # groups of 8 partitions x 4 elements
        amax = v.abs().amax(dim=(1, 3))               # [8 groups, 4 columns]
        expo = torch.floor(torch.log2(amax)) - (8 - 1)
        ref = torch.where(amax > 0, 2.0 ** expo, torch.tensor(2.0 ** -127))
        rows = [32 * (g // 4) + g % 4 for g in range(8)]  # 4 scale rows per quadrant
        assert torch.equal(scale.values()[rows], ref)
        q = mx_values(data)                            # [64, 4, 4]
        deq = q * scale.values()[[32 * (p // 32) + (p % 32) // 8 for p in range(64)]].unsqueeze(-1)
        torch.testing.assert_close(deq.reshape(64, 16), src.values(), rtol=2 ** -3, atol=0)


def test_nc_matmul_mx_matches_the_dequantized_product():
    with simulator.activated("trn3") as nki:
        nl, nisa = nki.language, nki.isa
        K, M, N = 128, 32, 96
        _, a, sa = _quantize(nl, nisa, torch.randn(K, 4 * M), "float8_e5m2_x4")
        _, b, sb = _quantize(nl, nisa, torch.randn(K, 4 * N))
        out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(out, a, b, sa, sb)
        rows = [32 * (k // 32) + (k % 32) // 8 for k in range(K)]
        A = (mx_values(a) * sa.values()[rows].unsqueeze(-1)).permute(0, 2, 1).reshape(4 * K, M)
        B = (mx_values(b) * sb.values()[rows].unsqueeze(-1)).permute(0, 2, 1).reshape(4 * K, N)
        ref = A.double().t() @ B.double()
        torch.testing.assert_close(out.values().double(), ref, rtol=1e-5, atol=1e-4)
        nisa.nc_matmul_mx(out, a, b, sa, sb)  # accumulate=None: the second adds
        torch.testing.assert_close(out.values().double(), 2 * ref, rtol=1e-5, atol=1e-4)
        with pytest.raises(NkiValidationError, match="must be even"):
            nisa.nc_matmul_mx(out[0:31], a[:, 0:31], b, sa[:, 0:31], sb)
    with simulator.activated("trn2") as nki:
        with pytest.raises(NkiValidationError, match="needs NeuronCore-v4"):
            nki.isa.quantize_mx(None, None, None)


def test_mx_scales_of_two_tiles_pack_into_one_at_quadrant_offsets():
    # MX deep dive, "Packing Scale Values": scales at "an offset of 0, 4, 8, or 12" within each
    # quadrant; its example writes one tile's scales to packed[0:, :M], the other's to packed[4:, :]
    with simulator.activated("trn3") as nki:
        nl, nisa = nki.language, nki.isa
        K, M, N = 128, 16, 40
        packed = nl.ndarray((K, N), dtype=nl.uint8)
        packed.dtype.assign(packed._data, torch.full((K, N), 0xAB))   # poison: unwritten rows
        xs = []
        for free, rows in ((M, slice(0, None)), (N, slice(4, None))):
            x = torch.randn(K, 4 * free) * 5
            src = nl.ndarray((K, 4 * free), dtype=nl.bfloat16)
            src.dtype.assign(src._data, x)
            data = nl.ndarray((K, free), dtype=nl.float8_e4m3fn_x4)
            nisa.quantize_mx(data, src, packed[rows, 0:free])
            xs.append((src, data, packed[rows, 0:free]))
        (xa, a, sa), (xb, b, sb) = xs
        out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(out, a, b, sa, sb)
        # each x4 column of the data is four contraction elements: [K, F, 4] -> [4K, F]
        A = xa.values().reshape(K, M, 4).permute(0, 2, 1).reshape(4 * K, M).double()
        B = xb.values().reshape(K, N, 4).permute(0, 2, 1).reshape(4 * K, N).double()
        ref = A.t() @ B
        # fp8 e4m3 keeps 3 mantissa bits: each product within ~2^-3 relative, errors average out
        torch.testing.assert_close(out.values().double(), ref, rtol=0.1, atol=0.1 * ref.abs().max().item())
        used = {32 * q + r for q in range(4) for r in range(8)}
        codes = packed.values()
        assert all(codes[p].eq(0xAB).all() for p in range(K) if p not in used)
        assert not any(codes[p, 0:M].eq(0xAB).all() for p in used)
        for bad in (2, 16):
            with pytest.raises(NkiValidationError, match=f"starting at partition {bad}"):
                nisa.quantize_mx(a, xa, packed[bad:, 0:M])
            with pytest.raises(NkiValidationError, match=f"starting at partition {bad}"):
                nisa.nc_matmul_mx(out, a, b, packed[bad:, 0:M], sb)


def test_tensor_tensor_inputs_may_start_at_different_partitions(sim, mk):
    # "The two tiles must have the same partition axis size and the same number of elements
    # per partition" (nki.isa.tensor_tensor): no rule on where each starts
    _, nl, nisa = sim
    a = mk(torch.randn(64, 8))
    ps = mk(torch.randn(64, 8), buffer="psum")
    dst = nl.ndarray((32, 8), dtype=nl.float32)
    nisa.tensor_tensor(dst, a[0:32], ps[32:64], nl.add)
    assert torch.equal(dst.values(), a.values()[0:32] + ps.values()[32:64])
    with pytest.raises(NkiValidationError, match="partition dim 16 does not match"):
        nisa.tensor_tensor(dst, a[0:32], ps[32:48], nl.add)


def test_scalar_tensor_tensor_operand0_may_be_any_dtype(sim, mk):
    # "All input tiles can be any supported NKI data type" (nki.isa.scalar_tensor_tensor),
    # while tensor_scalar's operands "must be float32"
    _, nl, nisa = sim
    data, other = torch.randn(16, 8), torch.randn(16, 8)
    col = mk(torch.randn(16, 1), "bfloat16")
    dst = nl.ndarray((16, 8), dtype=nl.float32)
    nisa.scalar_tensor_tensor(dst, mk(data), nl.multiply, col, nl.add, mk(other))
    torch.testing.assert_close(dst.values(), data * col.values() + other)
    with pytest.raises(NkiValidationError, match="must be float32"):
        nisa.tensor_scalar(dst, mk(data), nl.multiply, col)


def test_a_step0_dst_takes_the_last_write(sim, mk):
    # nki-library's qkv_cte writes an unused activation_reduce output through
    # dst=act.ap([[1, s], [0, H]]): the pattern repeats addresses; the last write wins
    _, nl, nisa = sim
    x = torch.randn(4, 6)
    dst = mk(torch.zeros(4, 1))
    red = nl.ndarray((4, 1), dtype=nl.float32)
    nisa.activation_reduce(dst.ap([[1, 4], [0, 6]]), nl.copy, mk(x), nl.add, red)
    assert torch.equal(dst.values().reshape(-1), x[:, -1])
    torch.testing.assert_close(red.values().reshape(-1), x.sum(1))


def test_sequence_bounds_docstring_example(sim, mk):
    _, nl, nisa = sim
    ids = mk(torch.tensor([[0, 1, 1, 2, 2, 2, 0, 3, 3]]), "int32")
    dst = nl.ndarray((1, 2, 9), dtype=nl.int32)
    nisa.sequence_bounds(dst, ids)
    assert dst.values().tolist() == [[[9, 1, 1, 3, 3, 3, 9, 7, 7],
                                      [-1, 3, 3, 6, 6, 6, -1, 9, 9]]]
    with pytest.raises(NkiValidationError, match="partition dim must be 1"):
        nisa.sequence_bounds(nl.ndarray((2, 2, 9), dtype=nl.int32),
                             mk(torch.zeros(2, 9), "int32"))


def test_exponential_subtracts_the_max_and_accumulates(mk):
    with simulator.activated("trn3") as nki:
        nl, nisa = nki.language, nki.isa
        x = torch.randn(16, 40)
        m = x.amax(1, keepdim=True)
        dst = nl.ndarray((16, 40), dtype=nl.bfloat16)
        res = nl.ndarray((16, 1), dtype=nl.float32)
        src = mk(x)
        nisa.exponential(dst, src, max_value=mk(m), reduce_res=res,
                         reduce_cmd=nisa.reduce_cmd.reset_reduce)
        ref = torch.exp(x - m)
        assert torch.equal(dst.values(), ref.bfloat16().float())
        torch.testing.assert_close(res.values(), ref.sum(1, keepdim=True))
        nisa.exponential(dst, src, max_value=mk(m), reduce_res=res,
                         reduce_cmd=nisa.reduce_cmd.reduce)  # keeps summing
        torch.testing.assert_close(res.values(), 2 * ref.sum(1, keepdim=True))
        with pytest.raises(NkiValidationError, match="reduce_init must be unset"):
            nisa.exponential(dst, src, reduce_init=1.0)
    with simulator.activated("trn2") as nki:
        with pytest.raises(NkiValidationError, match="needs NeuronCore-v4"):
            nki.isa.exponential(None, None)


def _e2m1(code: torch.Tensor) -> torch.Tensor:
    """OCP MX v1.0 FP4 E2M1, written from its definition (not the simulator's table): sign
    bit 3, exponent bits 2-1 (bias 1), mantissa bit 0; exponent 0 is subnormal (m x 0.5)."""
    s, e, m = (code >> 3) & 1, (code >> 1) & 3, code & 1
    mag = torch.where(e == 0, 0.5 * m, 2.0 ** (e - 1) * (1 + 0.5 * m))
    return torch.where(s == 1, -mag, mag).double()


def test_nc_matmul_mx_decodes_hand_packed_float4():
    # float4_e2m1fn_x4: four 4-bit codes per 16-bit word, lowest nibble first; scales of
    # 127 (e8m0: 2^0) leave the decoded values as they are, so the product is exact
    with simulator.activated("trn3") as nki:
        nl, nisa = nki.language, nki.isa
        K, M, N = 32, 4, 6
        tiles = []
        for free in (M, N):
            codes = torch.randint(0, 16, (K, free, 4))
            words = sum(codes[..., i] << (4 * i) for i in range(4))
            t = nl.ndarray((K, free), dtype=nl.float4_e2m1fn_x4)
            t._data.copy_(words.to(torch.int32).to(torch.int16).view(t._data.dtype))
            scale = nl.ndarray((K, free), dtype=nl.uint8)
            scale._data.fill_(127)
            tiles.append((codes, t, scale))
        (ca, a, sa), (cb, b, sb) = tiles
        out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
        out._data.fill_(float("nan"))
        nisa.nc_matmul_mx(out, a, b, sa, sb)
        A = _e2m1(ca).permute(0, 2, 1).reshape(4 * K, M)   # contraction index 4k + nibble
        B = _e2m1(cb).permute(0, 2, 1).reshape(4 * K, N)
        assert torch.equal(out.values().double(), A.t() @ B)

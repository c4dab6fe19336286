"""nki.language helpers, tensor views, capacity, host conversion and launch checks that a
mutation-testing review (2026-12-06) found no simulator test pinning: each of these changed
one line of the simulator and every test in tests/simulator (and a fuzz run) still passed.
Each test states the rule it pins."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import CapacityError, NkiValidationError
from nki_kernels.simulator.errors import SimulatorError


# ---------------------------------------------------------------- nl compute helpers

def test_a_binary_helpers_dtype_does_not_depend_on_which_operand_broadcasts(sim, mk):
    # the result takes x's dtype whether y is a full tile or a (P, 1) column, or x is
    _, nl, _ = sim
    col, full = mk(torch.randn(4, 1), "bfloat16"), mk(torch.randn(4, 3))
    assert nl.add(col, full).dtype == nl.add(mk(torch.randn(4, 3), "bfloat16"), full).dtype == nl.bfloat16
    assert nl.add(full, col).dtype == nl.float32


def test_mean_of_a_bf16_tile_accumulates_in_fp32(sim, mk):
    _, nl, _ = sim
    x = torch.rand(128, 333) * 100
    tile = mk(x, "bfloat16")
    expected = tile.values().double().mean(1)
    got = nl.mean(tile, axis=1).values().double().reshape(-1)
    # the fp32 mean rounded once to bf16: within one bf16 unit (2**-8) of the exact mean
    assert ((got - expected).abs() <= 2**-8 * expected.abs()).all()


def test_transpose_load_empty_like_and_ones_take_their_dtype_and_buffer(sim, mk):
    _, nl, _ = sim
    assert nl.transpose(mk(torch.randn(4, 6)), dtype=nl.bfloat16).dtype == nl.bfloat16
    assert nl.empty_like(mk(torch.randn(4, 8)), dtype=nl.bfloat16).dtype == nl.bfloat16
    assert nl.ones((4, 8), dtype=nl.float32, buffer=nl.psum).buffer == nl.psum
    # zeros_like defaults to SBUF whatever x's buffer
    assert nl.zeros_like(nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.psum)).buffer == nl.sbuf

    def kernel(x):
        import nki.language as nl
        return nl.load(x, dtype=nl.bfloat16).dtype.name

    assert simulator.run(kernel, torch.randn(4, 2)).outputs == "bfloat16"


def test_rms_norm_adds_its_epsilon(sim, mk):
    # a zero row: x * rsqrt(0 + eps) = 0; without eps, 0 * inf = NaN
    _, nl, _ = sim
    x = torch.randn(4, 8)
    x[0] = 0.0
    out = nl.rms_norm(mk(x), mk(torch.ones(4, 8)), axis=1, n=8).values()
    assert torch.equal(out[0], torch.zeros(8))
    torch.testing.assert_close(out[1:], x[1:] * torch.rsqrt(x[1:].square().mean(1, keepdim=True) + 1e-6),
                               atol=1e-5, rtol=1e-5)


def test_all_is_a_logical_and(sim, mk):
    _, nl, _ = sim
    got = nl.all(mk(torch.tensor([[1.0, 0.0], [1.0, 1.0]])), axis=1).values().reshape(-1)
    assert got.tolist() == [0, 1]


def test_zeros_in_hbm_fill_a_one_element_tail():
    def kernel(x):
        import nki.language as nl
        return nl.zeros((129,), dtype=nl.float32, buffer=nl.shared_hbm)

    out = simulator.run(kernel, torch.randn(1)).outputs
    assert torch.equal(out, torch.zeros(129))


# ---------------------------------------------------------------- views and indexing

def test_view_shapes_of_negative_dims_full_slices_and_integer_indices(sim):
    _, nl, _ = sim
    t = nl.ndarray((4, 8), dtype=nl.float32)
    assert t.expand_dim(-1).shape == (4, 8, 1)
    assert t.slice(1, 2, 8).shape == (4, 6)              # end == size is in bounds
    assert t[:, :-1].shape == (4, 7)
    assert nl.ndarray((4, 8, 5), dtype=nl.float32)[0, 0].shape == (1, 5)   # the partition dim stays


def test_a_reinterpreted_views_offset_counts_its_own_elements(sim):
    _, nl, _ = sim
    t = nl.ndarray((4, 8), dtype=nl.float32)
    assert t[:, 2:4].offset == 2
    assert t[:, 2:4].view(nl.bfloat16).offset == 4      # 8 bytes in = 4 bf16 elements


def test_an_hbm_access_pattern_past_the_end_raises_index_error_when_used(sim):
    # [[4, 4], [1, 5]] over a [4, 4] tensor reaches element 16 of 16: the view is built (an
    # access pattern may be formed before its use) and its use raises
    _, nl, nisa = sim
    h = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    view = h.ap([[4, 4], [1, 5]])
    with pytest.raises(IndexError, match="reaches elements 0..16 of a tensor of 16"):
        nisa.dma_copy(nl.ndarray((4, 5), dtype=nl.float32), view)
    nisa.dma_copy(nl.ndarray((4, 4), dtype=nl.float32), h.ap([[4, 4], [1, 4]]))   # the whole tensor


# ---------------------------------------------------------------- capacity and placement

def test_an_sbuf_tile_of_exactly_the_partition_size_fits(sim):
    _, nl, _ = sim
    # trn2: 224 KiB per partition; sbuf_fmax counts fp32 elements
    assert nl.tile_size.sbuf_fmax_bytes == 224 * 1024 and nl.tile_size.sbuf_fmax == 57344
    assert nl.ndarray((128, 57344), dtype=nl.float32).shape == (128, 57344)
    with pytest.raises(CapacityError):
        nl.ndarray((128, 57345), dtype=nl.float32)


def _placed(kind):
    def kernel(x):
        import nki.isa as nisa
        import nki.language as nl

        out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        if kind == "overlapping":     # two 120 KiB tensors sharing all but 4 KiB: 124 KiB in all
            a = nl.ndarray((128, 30720), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0))
            b = nl.ndarray((128, 30720), dtype=nl.float32, buffer=nl.sbuf, address=(0, 4096))
            nisa.memset(a, 1.0)
            nisa.dma_copy(out, b[:, 0:4])
            nisa.dma_copy(out, a[:, 0:4])
        elif kind == "handoff":       # a is read by the instruction that writes b: both live
            a = nl.ndarray((128, 30720), dtype=nl.float32, buffer=nl.sbuf)
            b = nl.ndarray((128, 30720), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(a, 1.0)
            nisa.tensor_copy(b, a)
            nisa.dma_copy(out, b[:, 0:4])
        elif kind == "in_place":      # b placed over a; one instruction reads a, writes b
            a = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0))
            b = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0))
            nisa.memset(a, 1.0)
            nisa.activation(b, nl.exp, a)
            nisa.dma_copy(out, b)
        elif kind == "adjacent":      # partitions 0..63 and 64..127 at the same bytes
            a = nl.ndarray((64, 4), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0))
            b = nl.ndarray((64, 4), dtype=nl.float32, buffer=nl.sbuf, address=(64, 0))
            nisa.memset(b, 2.0)
            nisa.memset(a, 1.0)
            nisa.dma_copy(out[0:64], a)
            nisa.dma_copy(out[64:128], b)
        elif kind == "past_the_partitions":
            nl.ndarray((64, 4), dtype=nl.float32, buffer=nl.sbuf, address=(65, 0))
        return out
    return kernel


def test_placement_and_liveness_edges():
    run = lambda kind: simulator.run(_placed(kind), torch.randn(1)).outputs   # noqa: E731
    assert run("overlapping")[0, 0].item() == 1.0                 # 124 KiB, not 240
    with pytest.raises(CapacityError):
        run("handoff")                                            # 240 KiB live at the copy
    assert torch.allclose(run("in_place"), torch.full((128, 4), float(np.exp(1.0))))
    got = run("adjacent")
    assert (got[:64] == 1.0).all() and (got[64:] == 2.0).all()
    with pytest.raises(NkiValidationError):
        run("past_the_partitions")


# ---------------------------------------------------------------- host conversion

def test_host_arrays_fp8_in_bool_out_and_one_tensor_passed_twice():
    import ml_dtypes

    def cast_in(x):
        import nki.language as nl
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x, dtype=nl.float32))
        return out

    e4m3 = np.array([[1.5, 2.0, -0.375]], dtype=ml_dtypes.float8_e4m3)
    assert simulator.run(cast_in, e4m3).outputs.tolist() == [[1.5, 2.0, -0.375]]

    def bools(x):
        import nki.isa as nisa
        import nki.language as nl
        out = nl.ndarray((2, 2), dtype=nl.bool_, buffer=nl.shared_hbm)
        t = nl.ndarray((2, 2), dtype=nl.bool_)
        nisa.memset(t, 1)
        nl.store(out, t)
        return out

    out = simulator.run(bools, torch.randn(1)).outputs
    assert out.dtype == torch.bool and out.all()

    def store_a_load_b(a, b):
        import nki.isa as nisa
        import nki.language as nl
        out = nl.ndarray((2, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((2, 2), dtype=nl.float32)
        nisa.memset(t, 7.0)
        nl.store(a, t)
        nl.store(out, nl.load(b))
        return out

    x = torch.randn(2, 2)
    assert torch.equal(simulator.run(store_a_load_b, x, x).outputs, torch.full((2, 2), 7.0))  # one tensor


# ---------------------------------------------------------------- launch

def test_launch_queries_and_input_buffers():
    # program_ndim: 0 for a launch without a degree, 1 with kernel[n]; at LNC=1 the inputs
    # are private HBM (so a kernel's own private output is refused while a returned input
    # is not, test_language_docstring_limits.py)
    def ndim_and_buffer(x):
        import nki.language as nl
        return nl.program_ndim(), x.buffer.name

    with simulator.activated("trn2") as nki:
        assert nki.simulate(ndim_and_buffer)(torch.randn(1)) == (0, "private_hbm")
        assert nki.simulate(nki.jit(ndim_and_buffer)[1])(torch.randn(1)) == (1, "private_hbm")
        assert nki.simulate(nki.jit(ndim_and_buffer)[2])(torch.randn(1)) == (1, "shared_hbm")


def _different_trip_counts(x):
    import nki.language as nl
    out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    state = {"left": 2 + nl.program_id(0)}

    def body(_):
        state["left"] -= 1
        return state["left"]

    nl.while_loop(state["left"], body)
    return out


def _different_outputs(x):
    import nki.isa as nisa
    import nki.language as nl
    if nl.program_id(0) == 1:
        nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)   # core 1's n-th allocation differs
    out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((1, 1), dtype=nl.float32)
    nisa.memset(t, 1.0)
    nl.store(out, t)
    return out


@pytest.mark.parametrize("kernel, match", [(_different_trip_counts, "dynamic"), (_different_outputs, "different outputs")])
def test_lnc2_cores_must_agree_on_loops_and_outputs(kernel, match):
    with simulator.activated("trn2") as nki:
        with pytest.raises(SimulatorError, match=match):
            nki.simulate(nki.jit(kernel)[2])(torch.randn(1))


_GLOBAL = 1


def test_deleting_a_global_is_a_global_write():
    def kernel(x):
        global _GLOBAL
        del _GLOBAL
        return x

    with pytest.raises(SimulatorError, match="global"):
        simulator.run(kernel, torch.randn(1))

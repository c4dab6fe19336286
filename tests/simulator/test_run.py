"""activated() and sys.modules, nki.jit / nki.simulate / run(), array types in and out,
in-place updates of inputs."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from nki_kernels import simulator
from nki_kernels.simulator import NkiValidationError, SimulatorError, CapacityError


def _copy_kernel(x):
    import nki.language as nl

    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out


def test_run_refuses_what_is_not_a_kernel_and_tensors_off_the_cpu():
    with pytest.raises(TypeError, match=r"expected an NKI kernel \(function or nki.jit object\), got 42"):
        simulator.run(42, torch.randn(4, 4))
    with pytest.raises(TypeError, match=r"argument x: the simulator takes CPU tensors, got meta"):
        simulator.run(_copy_kernel, torch.empty(4, 4, device="meta"))


def test_error_hierarchy():
    assert issubclass(NkiValidationError, SimulatorError) and issubclass(NkiValidationError, AssertionError)
    assert issubclass(CapacityError, NkiValidationError)
    with simulator.activated() as nki:
        assert nki.isa.NkiValidationError is NkiValidationError


def test_activated_installs_and_restores_absent_entries():
    saved = {k: sys.modules.pop(k) for k in ("nki", "nki.language", "nki.isa") if k in sys.modules}
    try:
        with simulator.activated():
            import nki
            import nki.isa as nisa
            import nki.language as nl

            assert nki.__simulator__ and nl.add is nki.language.add and nisa.nc_matmul
        assert "nki" not in sys.modules and "nki.language" not in sys.modules
    finally:
        sys.modules.update(saved)


def test_activated_restores_a_real_nki_and_nests():
    fake = types.ModuleType("nki")
    fake_nl = types.ModuleType("nki.language")
    before = {k: sys.modules.get(k) for k in ("nki", "nki.language", "nki.isa")}
    sys.modules["nki"], sys.modules["nki.language"] = fake, fake_nl
    sys.modules.pop("nki.isa", None)
    try:
        with simulator.activated("trn2"):
            outer = sys.modules["nki"]
            with simulator.activated("trn1"):
                assert sys.modules["nki"] is outer
                import nki.language as nl

                assert nl.tile_size.total_available_sbuf_size == 192 * 1024
            assert sys.modules["nki"] is outer
            assert nl.tile_size.total_available_sbuf_size == 224 * 1024
        assert sys.modules["nki"] is fake and sys.modules["nki.language"] is fake_nl
        assert "nki.isa" not in sys.modules
    finally:
        for k, m in before.items():
            if m is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = m


def test_activated_restores_on_error():
    before = sys.modules.get("nki")
    with pytest.raises(RuntimeError):
        with simulator.activated():
            raise RuntimeError("boom")
    assert sys.modules.get("nki") is before


def test_jit_forms_and_direct_call():
    with simulator.activated():
        import nki

        k1 = nki.jit(_copy_kernel)
        k2 = nki.jit()(_copy_kernel)
        # platform_target: the migration guide calls it an error since NKI 0.3, but AWS's
        # beta-2 MX tutorial passes it (nki-samples mxfp-matmul/mx_kernels.py): ignored
        k3 = nki.jit(platform_target="trn2", show_compiler_tb=True)(_copy_kernel)
        x = torch.randn(16, 8)
        for k in (k1, k2, k3):
            assert torch.equal(k(x), x)           # a direct call simulates
            assert torch.equal(nki.simulate(k)(x), x)
        assert torch.equal(nki.simulate(_copy_kernel)(x), x)  # plain functions too


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.uint8])
def test_torch_in_torch_out_keeps_dtype(dtype):
    x = (torch.randn(32, 12) * 10).to(dtype)
    out = simulator.run(_copy_kernel, x).outputs
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and torch.equal(out, x)


def test_numpy_in_numpy_out():
    import numpy as np  # a dev dependency: fail, never skip
    for dt in (np.float32, np.float16, np.int32, np.int8):
        x = (np.random.randn(32, 12) * 10).astype(dt)
        out = simulator.run(_copy_kernel, x).outputs
        assert isinstance(out, np.ndarray) and out.dtype == dt and (out == x).all()


def test_several_outputs_and_static_args():
    def kernel(x, scale, *, offset=0.0):
        import nki.language as nl

        a = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        b = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(a, nl.multiply(t, scale))
        nl.store(b, nl.add(t, offset))
        return a, b

    x = torch.randn(8, 8)
    a, b = simulator.run(kernel, x, 3.0, offset=1.0).outputs
    torch.testing.assert_close(a, x * 3.0)
    assert b.dtype == torch.bfloat16 and torch.equal(b, (x + 1.0).bfloat16())


def test_inputs_written_by_the_kernel_are_updated_in_place():
    import numpy as np  # a dev dependency: fail, never skip

    def kernel(x, y):
        import nki.language as nl

        nl.store(y[0:4], nl.add(nl.load(x[0:4]), 1.0))

    # y is random, not zeros: rows the kernel does not write must keep their own values
    x, y = torch.randn(8, 6), torch.randn(8, 6)
    y_tail = y[4:].clone()
    y_before_id = id(y)
    simulator.run(kernel, x, y)
    assert id(y) == y_before_id and torch.equal(y[0:4], x[0:4] + 1) and torch.equal(y[4:], y_tail)
    xn, yn = np.random.randn(8, 6).astype(np.float32), np.random.randn(8, 6).astype(np.float32)
    yn_tail = yn[4:].copy()
    simulator.run(kernel, xn, yn)
    np.testing.assert_allclose(yn[0:4], xn[0:4] + 1, rtol=1e-6)
    assert (yn[4:] == yn_tail).all()
    # an input only read is untouched
    x2 = torch.randn(8, 6)
    keep = x2.clone()
    simulator.run(kernel, x2, torch.zeros(8, 6))
    assert torch.equal(x2, keep)


def test_on_chip_output_is_rejected():
    def kernel(x):
        import nki.language as nl

        return nl.load(x)

    with pytest.raises(NkiValidationError, match="kernel outputs must be HBM tensors"):
        simulator.run(kernel, torch.randn(4, 4))


def test_unwritten_output_shows_nan():
    def kernel(x):
        import nki.language as nl

        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out[0:2], nl.load(x[0:2]))
        return out

    out = simulator.run(kernel, torch.randn(4, 4)).outputs
    assert torch.isnan(out[2:]).all() and not torch.isnan(out[:2]).any()


def test_run_result_fields():
    r = simulator.run(_copy_kernel, torch.randn(128, 64), target="trn3")
    assert r.target == "trn3" and [i.op for i in r.trace] == ["dma_copy", "dma_copy"]
    assert [i.index for i in r.trace] == [0, 1]
    assert r.peak_sbuf_bytes_per_partition == 64 * 4 and r.peak_psum_banks == 0


def test_float64_input_is_rejected_with_the_argument_name():
    with pytest.raises(TypeError, match="argument x.*float64"):
        simulator.run(_copy_kernel, torch.randn(4, 4, dtype=torch.float64))


def test_estimate_is_exported():
    assert callable(simulator.estimate)


def test_trace_operands_describe_what_an_instruction_touches():
    def kernel(x):
        import nki.isa as nisa
        import nki.language as nl

        t = nl.ndarray((4, 6), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(t, x[:, 2:8])
        out = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(out, x)
        # a reinterpreting view: bf16 elements 1..4 of row 1 are bytes 34..41 of the fp32
        # tensor, so fp32 elements 8..10 (not a whole number of them)
        b = nl.ndarray((1, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(b, out.view(nl.bfloat16)[1:2, 1:5])
        return out

    x = torch.randn(4, 8)
    r = simulator.run(kernel, x)
    assert torch.equal(r.outputs, x)
    load = r.trace[0]
    src, dst = load.reads[0], load.writes[0]
    # HBM: one partition of every element; SBUF: shape[0] partitions of prod(shape[1:])
    assert (src.buffer, src.partitions, src.free_elems, src.nbytes) == ("hbm", 1, 24, 96)
    assert (dst.buffer, dst.partitions, dst.free_elems, dst.nbytes) == ("sbuf", 4, 6, 96)
    assert src.span == (2, 8 * 3 + 7 + 1) and src.strides == (8, 1) and src.offset == 2
    view = r.trace[2].reads[0]
    assert view.span == (8, 11) and view.strides == () and view.nbytes == 8

"""NkiTensor views: indexing rules, bounds, shared storage, view methods, no arithmetic."""

from __future__ import annotations

import pytest
import torch

from nki_kernels.simulator import NkiValidationError, UnsupportedError


@pytest.mark.parametrize("key, shape", [
    ((5,), (1, 4, 8)),                 # int on partition dim keeps a size-1 partition dim
    ((slice(None), 1), (128, 8)),      # int on a free dim drops it
    ((slice(None), 1, 2), (128, 1)),   # ... unless the result would fall below 2-D
    ((Ellipsis, 0), (128, 4)),
    ((slice(0, 64, 2), slice(1, 3)), (32, 2, 8)),
    ((slice(-32, None),), (32, 4, 8)),
])
def test_on_chip_indexing_rules(sim, key, shape):
    _, nl, _ = sim
    t = nl.ndarray((128, 4, 8), dtype=nl.float32, buffer=nl.sbuf)
    assert t[key].shape == shape


def test_hbm_indexing_drops_int_dims(sim):
    _, nl, _ = sim
    t = nl.ndarray((3, 128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    assert t[1].shape == (128, 8)
    assert t[1, 2].shape == (8,)
    assert t[1, 2, 3].shape == (1,)


def test_ds_slices(sim):
    _, nl, _ = sim
    t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    assert t[nl.ds(32, 32), nl.ds(8, 16)].shape == (32, 16)


@pytest.mark.parametrize("key, words", [
    ((slice(0, 129),), ["0:129", "dim 0", "128"]),
    ((slice(None), 64), ["64", "dim 1", "(128, 64)"]),
    ((slice(None), -65), ["-65", "dim 1"]),
])
def test_out_of_bounds_raises_index_error_naming_index_dim_shape(sim, key, words):
    _, nl, _ = sim
    t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    with pytest.raises(IndexError) as err:
        t[key]
    for w in words:
        assert w in str(err.value)


def test_ds_out_of_bounds_and_negative_step(sim):
    _, nl, _ = sim
    t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    with pytest.raises(IndexError, match="nl.ds"):
        t[:, nl.ds(60, 8)]
    with pytest.raises(IndexError, match="step"):
        t[:, ::-1]


def test_views_share_storage(sim):
    _, nl, nisa = sim
    t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(t, 0.0)
    nisa.memset(t[0:32, 16:32], 3.0)
    v = t.reshape((128, 4, 16))
    assert float(v.values()[5, 1, 0]) == 3.0 and float(v.values()[40, 1, 0]) == 0.0
    assert t[0:32, 16:32]._alloc is t._alloc


def test_view_methods(sim):
    _, nl, _ = sim
    t = nl.ndarray((128, 4, 6), dtype=nl.float32, buffer=nl.sbuf)
    assert t.reshape((128, 24)).shape == (128, 24)
    assert t.permute((0, 2, 1)).shape == (128, 6, 4)
    assert t.expand_dim(1).shape == (128, 1, 4, 6)
    assert t.expand_dim(1).squeeze_dim(1).shape == (128, 4, 6)
    assert t.expand_dim(2).broadcast(2, 5).shape == (128, 4, 5, 6)
    assert t.reshape_dim(2, (2, 3)).shape == (128, 4, 2, 3)
    assert t.flatten_dims(1, 2).shape == (128, 24)
    assert t.slice(1, 1, 3).shape == (128, 2, 6)
    assert t.select(1, 2).shape == (128, 6)


@pytest.mark.parametrize("call", [
    lambda t: t.reshape((64, 48)),          # partition dim must be kept
    lambda t: t.permute((1, 0, 2)),         # partition dim must stay first
    lambda t: t.broadcast(1, 8),            # dim 1 is not size 1
    lambda t: t.expand_dim(0),              # cannot insert before the partition dim
    lambda t: t.permute((0, 2, 1)).reshape((128, 24)),  # layout incompatible with reshape
])
def test_view_method_violations(sim, call):
    _, nl, _ = sim
    t = nl.ndarray((128, 4, 6), dtype=nl.float32, buffer=nl.sbuf)
    with pytest.raises(NkiValidationError):
        call(t)


@pytest.mark.parametrize("op", [
    lambda a, b: a + b, lambda a, b: a * 2, lambda a, b: a - b, lambda a, b: a / b,
    lambda a, b: -a, lambda a, b: a @ b, lambda a, b: a < b,
])
def test_arithmetic_operators_are_removed(sim, op):
    _, nl, _ = sim
    a = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
    with pytest.raises(UnsupportedError, match="beta-2"):
        op(a, a)


def test_setitem_copies_and_fills(sim):
    _, nl, _ = sim
    a = nl.ndarray((8, 4), dtype=nl.float32, buffer=nl.sbuf)
    a[...] = 2.0
    b = nl.ndarray((8, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
    b[...] = a
    assert torch.equal(b.values(), torch.full((8, 4), 2.0))


def test_attributes(sim):
    _, nl, _ = sim
    t = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.psum, name="acc")
    assert (t.shape, t.dtype, t.buffer, t.ndim, t.name) == ((128, 64), nl.bfloat16, nl.psum, 2, "acc")
    assert t[:, 8:16].offset == 8 and t.strides == (64, 1)


def test_rearrange_splits_reorders_and_merges(sim):
    _, nl, _ = sim
    t = nl.ndarray((128, 24), dtype=nl.float32)
    x = torch.randn(128, 24)
    t.dtype.assign(t._data, x)
    r = t.rearrange(("b", ("h", "w")), ("b", "w", "h"), {"h": 4})  # the docstring's example
    assert r.shape == (128, 6, 4) and torch.equal(r.values(), x.reshape(128, 4, 6).permute(0, 2, 1))
    back = t.rearrange(("b", ("h", "w")), ("b", ("h", "w")), {"w": 6})
    assert torch.equal(back.values(), x)
    with pytest.raises(NkiValidationError, match="not a view"):
        r.rearrange(("b", "w", "h"), ("b", ("w", "h")))
    with pytest.raises(NkiValidationError, match=r"moves or splits the partition dim of on-chip \(128, 24\); it must stay first"):
        t.rearrange(("b", "f"), ("f", "b"))
    with pytest.raises(NkiValidationError, match="cannot split"):
        t.rearrange(("b", ("h", "w")), ("b", "h", "w"), {"h": 5})


# ------------------------------------------------------- nl.NkiTensor(shape, dtype, storage, ...)
# NKI 0.7's documented constructor (aws-neuron-sdk 81ce03ae nki/api/nki/language/__init__.py):
# a tensor "bound to an existing storage handle"; storage "May be None when the tensor is used
# as a signature placeholder and never materialized".

@pytest.mark.parametrize("buffer", ["sbuf", "psum", "shared_hbm"])
def test_constructor_placeholder_reads_as_given_and_every_use_is_refused(sim, buffer):
    _, nl, nisa = sim
    region = getattr(nl, buffer)
    p = nl.NkiTensor((32, 4, 16), nl.bfloat16, None, buffer=region, name="sig")
    assert isinstance(p, nl.NkiTensor)
    assert (p.shape, p.dtype, p.buffer, p.name, p.ndim, p.size) == ((32, 4, 16), nl.bfloat16, region, "sig", 3, 2048)
    assert (p.strides, p.offset) == ((64, 16, 1), 0)
    real = nl.ndarray((32, 4, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
    real[...] = 1.0
    uses = [lambda: p[0:4], lambda: p.reshape((32, 64)), lambda: p.select(1, 0),
            lambda: p.__setitem__(slice(None), 1.0), lambda: p.values()]
    if buffer == "shared_hbm":
        uses += [lambda: nisa.dma_copy(dst=p, src=real), lambda: nisa.dma_copy(dst=real, src=p)]
    else:
        uses += [lambda: nisa.tensor_copy(dst=p, src=real), lambda: nisa.tensor_copy(dst=real, src=p)]
    for use in uses:
        with pytest.raises(NkiValidationError, match="storage=None, a signature placeholder"):
            use()
    assert torch.equal(real.values(), torch.ones(32, 4, 16))   # the refused copies wrote nothing


@pytest.mark.parametrize("dtype, storage_dtype", [("float32", torch.float32), ("bfloat16", torch.bfloat16)])
def test_constructor_binds_host_storage_and_the_kernel_reads_and_writes_it(sim, dtype, storage_dtype):
    nki, nl, nisa = sim
    fixture_in = torch.randn(64, 24).to(storage_dtype)
    fixture_out = torch.full((64, 24), float("nan")).to(storage_dtype)   # poisoned: the kernel must write it

    @nki.jit
    def kernel(x):
        src = nl.NkiTensor((64, 24), getattr(nl, dtype), fixture_in, buffer=nl.shared_hbm, name="fixture_in")
        dst = nl.NkiTensor((64, 24), getattr(nl, dtype), fixture_out, buffer=nl.shared_hbm, name="fixture_out")
        a = nl.ndarray((64, 24), dtype=x.dtype, buffer=nl.sbuf)
        b = nl.ndarray((64, 24), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=x)
        nisa.dma_copy(dst=b, src=src)
        nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)
        nisa.dma_copy(dst=dst, src=a)
        out = nl.ndarray((64, 24), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        return out

    x = torch.randn(64, 24).to(storage_dtype)
    out = nki.simulate(kernel)(x)
    expected = (x.double() + fixture_in.double()).to(storage_dtype)   # one rounding of the fp32 sum
    assert torch.equal(out, expected)
    assert torch.equal(fixture_out, expected)   # the writes landed in the bound storage


def _copy_into_bound(nki, nl, nisa, sink, source=None):
    """A kernel that binds the host fp32 array ``sink`` with nl.NkiTensor and copies into it
    the bound host array ``source`` (or, without one, the kernel's input); it returns a copy
    of its input."""

    @nki.jit
    def kernel(x):
        dst = nl.NkiTensor(tuple(sink.shape), nl.float32, sink, buffer=nl.shared_hbm)
        src = x if source is None else nl.NkiTensor(tuple(source.shape), nl.float32, source, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src)
        nisa.dma_copy(dst=dst, src=t)
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    return kernel


def test_constructor_binds_a_numpy_array(sim):
    import numpy as np  # a dev dependency: fail, never skip
    nki, nl, nisa = sim
    host = np.random.default_rng(7).standard_normal((8, 16)).astype(np.float32)
    expected = host.copy()
    sink = np.full((8, 16), np.nan, dtype=np.float32)

    nki.simulate(_copy_into_bound(nki, nl, nisa, sink, source=host))(torch.randn(8, 16))
    assert np.array_equal(sink, expected)


@pytest.mark.parametrize("args, kwargs, error, words", [
    (((0, 4), "float32", None), {}, NkiValidationError, ["shape", "(0, 4)"]),
    (((4, -1), "float32", None), {}, NkiValidationError, ["shape", "(4, -1)"]),
    (((4, 2.0), "float32", None), {}, NkiValidationError, ["shape"]),
    (((True, 4), "float32", None), {}, NkiValidationError, ["shape"]),
    ((4, "float32", None), {}, NkiValidationError, ["shape", "4"]),
    (((), "float32", None), {}, NkiValidationError, ["shape", "()"]),
    (((4, 8), "float32", "storage-handle"), {"buffer": "shared_hbm"}, UnsupportedError, ["str"]),
    (((4, 8), "float32", [1.0] * 32), {"buffer": "shared_hbm"}, UnsupportedError, ["list"]),
    (((4, 8), "float32", "torch"), {"buffer": "sbuf"}, UnsupportedError, ["buffer=sbuf", "nl.ndarray"]),
    (((4, 8), "float32", "torch"), {"buffer": "psum"}, UnsupportedError, ["buffer=psum", "nl.ndarray"]),
    (((4, 8), "float32", "torch (4, 9)"), {"buffer": "shared_hbm"}, NkiValidationError, ["(4, 9)", "(4, 8)"]),
    (((4, 8), "bfloat16", "torch"), {"buffer": "shared_hbm"}, NkiValidationError, ["torch.float32", "bfloat16", "torch.bfloat16"]),
    (((4, 8), "float32", "torch transposed"), {"buffer": "shared_hbm"}, NkiValidationError, ["contiguous"]),
])
def test_constructor_refuses_bad_arguments_naming_them(sim, args, kwargs, error, words):
    _, nl, _ = sim
    shape, dtype, storage = args
    if isinstance(storage, str) and storage.startswith("torch"):
        storage = {"torch": torch.randn(4, 8), "torch (4, 9)": torch.randn(4, 9),
                   "torch transposed": torch.randn(8, 4).t()}[storage]
    kwargs = {k: getattr(nl, v) for k, v in kwargs.items()}
    with pytest.raises(error) as err:
        nl.NkiTensor(shape, getattr(nl, dtype), storage, **kwargs)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("use", ["ap", "ap_scalar_offset", "core_barrier"])
def test_constructor_placeholder_is_refused_by_access_patterns_and_barriers(sim, use):
    _, nl, nisa = sim
    p = nl.NkiTensor((8, 4), nl.float32, None, buffer=nl.shared_hbm, name="sig")
    with pytest.raises(NkiValidationError, match="storage=None, a signature placeholder"):
        if use == "ap":
            p.ap([[4, 8], [1, 4]])
        elif use == "ap_scalar_offset":
            reg = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
            p.ap([[4, 2], [1, 4]], scalar_offset=reg, indirect_dim=0)
        else:
            nisa.core_barrier(data=p, cores=(0, 1))


def test_constructor_placeholder_follows_ndarray_shape_rules(sim):
    import numpy as np  # a dev dependency: fail, never skip
    _, nl, _ = sim
    p = nl.NkiTensor((np.int64(128), np.int64(4)), nl.float32, None, name=None)
    assert (p.shape, p.name) == ((128, 4), "")
    for shape, words in [((), "tuple of positive integers"), ((256, 4), "exceeds maximum 128"),
                         ((128, 10 ** 9), "bytes per partition")]:
        with pytest.raises(Exception, match=words):
            nl.NkiTensor(shape, nl.float32, None, buffer=nl.sbuf)


def test_constructor_binds_a_tensor_that_requires_grad_by_aliasing(sim):
    nki, nl, nisa = sim
    sink = torch.full((4, 8), float("nan"), requires_grad=True)

    x = torch.randn(4, 8)
    nki.simulate(_copy_into_bound(nki, nl, nisa, sink))(x)
    assert torch.equal(sink.detach(), x)


def _numpy_storages():
    import numpy as np  # a dev dependency: fail, never skip
    read_only = np.zeros((4, 8), np.float32)
    read_only.setflags(write=False)
    return [(read_only, "read-only"),
            (np.zeros((8, 4), np.float32).T, "not C-contiguous"),
            (np.zeros((4, 8), np.float32)[::-1], "not C-contiguous"),
            (np.zeros((4, 8), ">f4" if np.little_endian else "<f4"), "byte order"),
            (np.float32(1.0), "got float32")]


def test_constructor_refuses_host_storages_it_cannot_alias_safely(sim):
    _, nl, _ = sim
    for storage, words in _numpy_storages():
        with pytest.raises((NkiValidationError, UnsupportedError), match=words):
            nl.NkiTensor((4, 8), nl.float32, storage, buffer=nl.shared_hbm)
    with torch.inference_mode():
        inference = torch.randn(4, 8)
    with pytest.raises(NkiValidationError, match="inference_mode"):
        nl.NkiTensor((4, 8), nl.float32, inference, buffer=nl.shared_hbm)
    tf32 = torch.randn(4, 8)   # random fp32: low mantissa bits set
    with pytest.raises(NkiValidationError, match="not tfloat32 values"):
        nl.NkiTensor((4, 8), nl.tfloat32, tf32, buffer=nl.shared_hbm)
    nl.NkiTensor((4, 8), nl.tfloat32, (tf32.view(torch.int32) & ~0x1FFF).view(torch.float32),
                 buffer=nl.shared_hbm)   # tf32 bit patterns bind
    codes = torch.randint(0, 2, (4, 8), dtype=torch.uint8)
    nl.NkiTensor((4, 8), nl.bool_, codes, buffer=nl.shared_hbm)
    codes[1, 2] = 7
    with pytest.raises(NkiValidationError, match="not bool_ values"):
        nl.NkiTensor((4, 8), nl.bool_, codes, buffer=nl.shared_hbm)


def _bound_writers(fixture, race):
    """An LNC=2 kernel whose cores bind the host tensor ``fixture`` and write it: each its half
    of the rows, or (``race``) both every row, with different values."""

    def kernel(x):
        import nki.isa as nisa
        import nki.language as nl

        me = nl.program_id(0)
        rows = x.shape[0] // 2
        bound = nl.NkiTensor(tuple(fixture.shape), nl.float32, fixture, buffer=nl.shared_hbm, name="fixture")
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(me))   # core 1's values differ
        if race:
            nisa.dma_copy(dst=bound, src=t)
        else:
            nisa.dma_copy(dst=bound[me * rows:(me + 1) * rows], src=t[me * rows:(me + 1) * rows])
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[me * rows:(me + 1) * rows], src=t[me * rows:(me + 1) * rows])
        return out

    return kernel


def test_constructor_storage_bound_by_both_lnc2_cores_is_one_tensor(sim):
    from nki_kernels import simulator
    from nki_kernels.simulator.errors import RaceError

    lnc2 = simulator.SimParams(logical_cores=2)
    x = torch.randn(8, 16)
    fixture = torch.full((8, 16), float("nan"))
    simulator.run(_bound_writers(fixture, False), x, params=lnc2)
    want = x.clone()
    want[4:] += 1.0
    assert torch.equal(fixture, want)   # each core's half landed
    with pytest.raises(RaceError, match=r"fixture \(8, 16\) float32.*both cores write different values"):
        simulator.run(_bound_writers(torch.zeros(8, 16), True), x, params=lnc2)


def test_plain_tensors_still_copy_and_pickle(sim):
    import copy
    import pickle
    import inspect

    _, nl, _ = sim
    t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
    x = torch.randn(4, 8)
    t.dtype.assign(t._data, x)
    for clone in (copy.copy(t), copy.deepcopy(t), pickle.loads(pickle.dumps(t))):
        assert type(clone) is type(t) and clone.shape == (4, 8) and torch.equal(clone.values(), x)
    assert list(inspect.signature(nl.NkiTensor).parameters) == ["shape", "dtype", "storage", "buffer", "name"]

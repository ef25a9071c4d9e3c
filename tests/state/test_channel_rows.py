"""Per-channel collection reads each batch once in memory order, all channels at once (the core's
``stream::channel_rows``): its histograms are bit-identical to collecting each channel's slice as a
tensor of its own (the per-tensor path, the reference here), for every rank and channel axis, float16/
float32/float64, NaN and ±Inf, non-contiguous batches, empty tensors, scalars and 1-D tensors (one
channel), several tensors and batches at once; and a batch is not copied on the way."""

from __future__ import annotations

import tracemalloc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from histocal import _core
from histocal.state.channels import ChannelHistograms, channel_key

BINS = 64


@st.composite
def _batch(draw, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    size = int(np.prod(shape))
    scale = draw(st.sampled_from([1e-30, 1e-3, 1.0, 300.0, 6e4]))
    seed = draw(st.integers(0, 2**16))
    x = (np.random.default_rng(seed).standard_normal(size) * scale).astype(np.float64)
    if size:
        specials = draw(
            st.lists(st.tuples(st.integers(0, size - 1), st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0])))
        )
        for i, v in specials:
            x[i] = v
    with np.errstate(over="ignore"):  # beyond float16: ±Inf, wanted
        x = x.astype(dtype).reshape(shape)
    layout = draw(st.sampled_from(["c", "f", "reversed", "strided"]))
    if layout == "f":
        return np.asfortranarray(x)
    if layout == "reversed" and x.ndim:
        return x[::-1]
    if layout == "strided":
        wide = np.repeat(x[..., None], 2, axis=-1)  # every other element of a bigger buffer
        return wide[..., 0]
    return x


@st.composite
def _tensor(draw, axis: int) -> list[np.ndarray]:
    """A tensor's batches: one rank and dtype, its channel count fixed, other sizes varying (0 too)."""
    rank = draw(st.integers(0, 4))
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    base = draw(st.lists(st.integers(1, 20), min_size=rank, max_size=rank))
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        shape = [
            s if -rank <= axis < rank and i == axis % rank else draw(st.integers(0, 20)) for i, s in enumerate(base)
        ]
        batches.append(draw(_batch(tuple(shape), dtype)))
    return batches


def _channel_slices(a: np.ndarray, axis: int) -> list[np.ndarray]:
    """The reference: each channel's values as a tensor of its own (a tensor without the axis: whole)."""
    if -a.ndim <= axis < a.ndim:
        return [np.ascontiguousarray(np.take(a, c, axis=axis)) for c in range(a.shape[axis])]
    return [np.ascontiguousarray(a)]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), axis=st.sampled_from([0, 1, 2, -1, -2]), n=st.integers(1, 3))
def test_channels_equal_per_tensor_collection_of_each_slice(data, axis, n):
    tensors = {f"t{i}": data.draw(_tensor(axis)) for i in range(n)}
    ch = ChannelHistograms(BINS, axis)
    reference = _core.StreamHistograms(BINS)
    for b in range(max(len(v) for v in tensors.values())):
        items = [(t, [v[b]]) for t, v in tensors.items() if b < len(v)]
        ch.collect(items)
        for t, arrays in items:
            for c, part in enumerate(_channel_slices(arrays[0], axis)):
                reference.collect([(channel_key(t, c), [part])])
    assert ch.stream.names() == reference.names()
    for key in reference.names():
        got, want = ch.stream.export(key), reference.export(key)
        assert got.bins.dtype == want.bins.dtype and np.array_equal(got.bins, want.bins), key
        assert (got.dtype, got.level, got.finite_min, got.finite_max, got.abs_min, got.counts) == (
            want.dtype, want.level, want.finite_min, want.finite_max, want.abs_min, want.counts
        ), key  # fmt: skip


def test_a_last_axis_batch_is_not_copied():
    """768 channels of 1024 values each along the last axis (3 MiB): the old path made a channels-first
    copy of every such batch; now nothing near the batch's size is allocated."""
    x = np.random.default_rng(0).standard_normal((8, 128, 768)).astype(np.float32)
    ch = ChannelHistograms(BINS, -1)
    ch.collect([("t", [x])])  # the histograms and keys exist from here on
    tracemalloc.start()
    try:
        ch.collect([("t", [x])])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < x.nbytes // 8, peak
    assert ch.stream.counts(channel_key("t", 767)).batches == 2

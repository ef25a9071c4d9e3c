"""``channel_quantization``: onnxruntime's per-channel weight parameters, every channel at once, against
onnxruntime's own loop (``compute_data_quant_params`` channel by channel) on the same weights."""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import numpy_helper
from onnxruntime.quantization import qdq_quantizer, quant_utils
from support.models import transformer, transformer_feeds
from test_recipe import classifier, feeds

import histocal
from histocal.quantize import channel_quantization, weight_memo
from histocal.quantize import ort as quantize_ort
from histocal.quantize.ort import QuantizationArgs, quantize_with_ranges
from histocal.quantize.preparation import prepare_model

TYPES = [onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16]


@contextlib.contextmanager
def onnxruntime_s_own_loop():
    """histocal's calls of quantize_static without ``every_channel_at_once``: onnxruntime's own
    channel-by-channel loop, the reference the computation at once is compared with."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantize_ort, "every_channel_at_once", contextlib.nullcontext)
        yield


def onnxruntime_loop(weight, axis, quant_type, reduce_range, min_real_range):
    """What ``QDQQuantizer._calc_initializer_quant_params`` does for a per-channel weight."""
    zero_points, scales = [], []
    for i in range(weight.shape[axis]):
        zero_point, scale = quant_utils.compute_data_quant_params(
            weight.take(i, axis).ravel(), quant_type, True, reduce_range=reduce_range, min_real_range=min_real_range
        )
        zero_points.append(zero_point)
        scales.append(scale)
    return np.asarray(zero_points), np.asarray(scales)


def _same(got, expected):
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), (a, b)


def test_the_sources_are_the_ones_checked():
    # Where this fails, onnxruntime's functions changed: read them again before adding their hashes.
    assert channel_quantization.known_sources(qdq_quantizer, quant_utils)


magnitudes = st.sampled_from([0.0, 1e-44, 1e-39, 1e-30, 1e-8, 1e-3, 1.0, 1e3, 1e30, 3e38])


@st.composite
def weights(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=6))
    values = draw(
        hnp.arrays(np.float32, shape, elements=st.floats(-1, 1, width=32, allow_subnormal=True), fill=st.nothing())
    )
    weight = (values * np.float32(draw(magnitudes))).astype(np.float32)  # all-zero and sub-tiny channels too
    if draw(st.booleans()):
        weight = np.abs(weight) * np.float32(draw(st.sampled_from([1, -1])))  # one-signed channels
    axis = draw(st.integers(0, len(shape) - 1))
    if draw(st.booleans()):  # a channel of zeros among others
        index = [slice(None)] * len(shape)
        index[axis] = draw(st.integers(0, shape[axis] - 1))
        weight[tuple(index)] = 0
    return weight, axis


@settings(max_examples=300, deadline=None)
@given(
    weights(),
    st.sampled_from(TYPES),
    st.booleans(),
    st.sampled_from([None, 0.0, 1e-4, 1.0, 1e30]),
)
def test_every_channel_at_once_is_onnxruntime_s_loop(weight_axis, quant_type, reduce_range, min_real_range):
    weight, axis = weight_axis
    with np.errstate(all="ignore"):
        expected = onnxruntime_loop(weight, axis, quant_type, reduce_range, min_real_range)
    got = channel_quantization.channel_parameters(weight, axis, quant_type, reduce_range, min_real_range, quant_utils)
    assert got is not None
    _same(got, expected)


@settings(max_examples=300, deadline=None)
@given(weights(), st.sampled_from(TYPES), st.booleans(), st.booleans())
def test_every_channel_quantized_at_once_is_onnxruntime_s_loop(weight_axis, quant_type, reduce_range, negative_axis):
    weight, axis = weight_axis
    zero_points, scales = channel_quantization.channel_parameters(
        weight, axis, quant_type, reduce_range, None, quant_utils
    )
    tensor = numpy_helper.from_array(weight, "w")
    given_axis = axis - weight.ndim if negative_axis else axis
    with np.errstate(all="ignore"):
        expected = quant_utils.quantize_onnx_initializer(tensor, quant_type, zero_points, scales, given_axis)
    got = channel_quantization.quantized_weight(tensor, quant_type, zero_points, scales, given_axis)
    assert got is not None
    assert got.SerializeToString() == expected.SerializeToString()
    named = channel_quantization.quantized_weight(tensor, quant_type, zero_points, scales, axis, "q")
    assert (
        named.name
        == "q"
        == quant_utils.quantize_onnx_initializer(tensor, quant_type, zero_points, scales, axis, "q").name
    )


def test_a_weight_it_does_not_quantize_is_left_to_onnxruntime():
    weight = numpy_helper.from_array(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), "w")
    zero_points, scales = np.zeros(2, np.int8), np.ones(2, np.float32)
    quantized = channel_quantization.quantized_weight
    assert quantized(weight, onnx.TensorProto.INT8, zero_points, scales, None) is None  # per tensor
    assert quantized(weight, onnx.TensorProto.INT8, zero_points, scales, 0, block_size=2) is None
    assert quantized(weight, onnx.TensorProto.INT4, zero_points, scales, 0) is None
    assert quantized(weight, onnx.TensorProto.INT8, zero_points, scales.astype(np.float16), 0) is None
    assert quantized(weight, onnx.TensorProto.INT8, zero_points[:1], scales[:1], 0) is None
    assert quantized(weight, onnx.TensorProto.INT8, zero_points, scales, 2) is None
    nan = numpy_helper.from_array(np.array([[1.0, np.nan], [3.0, 4.0]], np.float32), "w")
    assert quantized(nan, onnx.TensorProto.INT8, zero_points, scales, 0) is None
    half = numpy_helper.from_array(np.ones((2, 2), np.float16), "w")
    assert quantized(half, onnx.TensorProto.INT8, zero_points, scales, 0) is None


@pytest.mark.parametrize(
    "weight",
    [
        np.array([[1.0, np.nan], [2.0, 3.0]], np.float32),
        np.array([[1.0, np.inf], [2.0, 3.0]], np.float32),
        np.ones((2, 3), np.float16),
        np.ones((2, 0), np.float32),
        np.ones((0, 3), np.float32),
    ],
    ids=["NaN", "inf", "float16", "empty channels", "no channel"],
)
def test_what_it_does_not_compute_is_left_to_onnxruntime(weight):
    assert channel_quantization.channel_parameters(weight, 0, onnx.TensorProto.INT8, False, None, quant_utils) is None


@pytest.mark.parametrize(
    "make, data",
    [
        (lambda: classifier(11), lambda: feeds(4, 0)),
        (lambda: transformer(d=32, ff=64), lambda: transformer_feeds([2, 3, 4, 5], d=32, seed=3)),
    ],
    ids=["classifier", "transformer"],
)
@pytest.mark.parametrize("extra", [{}, {"MinimumRealRange": 1e-4}, {"ActivationSymmetric": True}], ids=str)
def test_the_quantizer_writes_onnxruntime_s_bytes(make, data, extra, tmp_path):
    """A model quantized per channel while the weights' parameters come from ``channel_quantization``
    (the first quantization under ``shared_weight_quantization``) is onnxruntime's own, byte for
    byte; every per-channel weight was computed at once, and only those."""
    path = prepare_model(make(), data(), tmp_path, per_channel=True).path
    ranges = histocal.calibrate(path, data())
    quantization = QuantizationArgs(per_channel=True, extra_options={"WeightSymmetric": True, **extra})
    with onnxruntime_s_own_loop():
        quantize_with_ranges(path, tmp_path / "plain.onnx", ranges, quantization)
    computed = []
    parameters = channel_quantization.quantizer_parameters

    def counted(quantizer, info, tensor, module):
        found = parameters(quantizer, info, tensor, module)
        rank = len(tensor.dims)
        per_channel = info.axis is not None and -rank <= info.axis < rank  # the others: one call each
        computed.append((tensor.name, per_channel, found is not None))
        return found

    quantized = []
    weight = channel_quantization.quantized_weight

    def counted_weight(*args, **kwargs):
        found = weight(*args, **kwargs)
        axis = args[4] if len(args) > 4 else kwargs.get("axis")
        quantized.append((axis is not None, found is not None))
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(channel_quantization, "quantizer_parameters", counted)
        patch.setattr(channel_quantization, "quantized_weight", counted_weight)
        with weight_memo.shared_weight_quantization():
            quantize_with_ranges(path, tmp_path / "memo.onnx", ranges, quantization)
    assert any(at_once for _, _, at_once in computed)
    assert all(at_once == per_channel for _, per_channel, at_once in computed), computed
    assert any(at_once for _, at_once in quantized)
    assert all(at_once == per_channel for per_channel, at_once in quantized), quantized
    assert (tmp_path / "memo.onnx").read_bytes() == (tmp_path / "plain.onnx").read_bytes()


def test_every_route_to_quantize_static_computes_every_channel_at_once(tmp_path):
    """The default route (``histocal.quantize_static`` with ``per_channel=True``) computes each
    per-channel weight at once, keeps no memo, and writes the model onnxruntime's loop writes."""
    path = prepare_model(classifier(13), feeds(4, 0), tmp_path, per_channel=True).path
    ranges = histocal.calibrate(path, feeds(4, 0))
    with onnxruntime_s_own_loop():
        histocal.quantize_static(path, tmp_path / "loop.onnx", tensors_range=ranges, per_channel=True)
    at_once = []
    weight = channel_quantization.quantized_weight

    def counted(*args, **kwargs):
        found = weight(*args, **kwargs)
        at_once.append(found is not None)
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(channel_quantization, "quantized_weight", counted)
        histocal.quantize_static(path, tmp_path / "at_once.onnx", tensors_range=ranges, per_channel=True)
    assert at_once and all(at_once)
    assert not weight_memo._memo and not weight_memo._memo_uses
    assert qdq_quantizer.quantize_onnx_initializer is quant_utils.quantize_onnx_initializer  # undone
    assert (tmp_path / "at_once.onnx").read_bytes() == (tmp_path / "loop.onnx").read_bytes()

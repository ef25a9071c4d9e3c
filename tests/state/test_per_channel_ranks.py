"""Per-channel collection of tensors with too few dimensions for the channel axis (scalars, 1-D tensors
such as batch norm parameters held by Constant nodes): each gets its per-tensor range in per-channel form
(arrays of one value), as onnxruntime's MinMaxCalibrater(per_channel=True) gives a 1-D tensor, for every
histogram method, through the calibrators, state files and the CLI."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.calibrate import MinMaxCalibrater as OrtMinMax
from test_per_channel import METHODS, _per_tensor, _same

from histocal import _core
from histocal.calibrators import PercentileCalibrater, create_calibrator
from histocal.cli import main
from histocal.state import CalibrationState, Collection
from histocal.state.channels import MAX_CHANNEL_BYTES_ENV, ChannelHistograms


def _bn_model(gamma: np.ndarray, beta: np.ndarray) -> onnx.ModelProto:
    """X[N,C,H,W] * gamma[C,1,1] + beta[C,1,1] with gamma and beta 1-D Constant nodes reshaped in the graph,
    and a 1-D mean over N,H,W (keepdims=0): the 1-D tensors ORT's per_channel MinMax reduces to one value."""
    c = gamma.size
    shape = numpy_helper.from_array(np.array([c, 1, 1], np.int64), "shape")
    nodes = [
        helper.make_node("Constant", [], ["gamma"], value=numpy_helper.from_array(gamma)),
        helper.make_node("Constant", [], ["beta"], value=numpy_helper.from_array(beta)),
        helper.make_node("Reshape", ["gamma", "shape"], ["gamma3"]),
        helper.make_node("Reshape", ["beta", "shape"], ["beta3"]),
        helper.make_node("Mul", ["X", "gamma3"], ["scaled"]),
        helper.make_node("Add", ["scaled", "beta3"], ["Y"]),
        helper.make_node("ReduceMean", ["Y"], ["mean"], axes=[0, 2, 3], keepdims=0),
        helper.make_node("Relu", ["mean"], ["R"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bn",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", c, 3, 3])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", c, 3, 3]),
            helper.make_tensor_value_info("R", TensorProto.FLOAT, [c]),
        ],
        [shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def _values(draw, shape, scale):
    seed = draw(st.integers(0, 2**16))
    return np.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, np.float32)


@pytest.mark.parity
@settings(max_examples=12, deadline=None)
@given(data=st.data(), c=st.integers(1, 4), scale=st.sampled_from([1e-3, 1.0, 50.0]))
def test_minmax_per_channel_equals_onnxruntimes_for_1d_tensors(tmp_path_factory, data, c, scale):
    """Every calibrated tensor, 1-D Constant outputs and means included: the per-channel minmax of
    histocal's per-channel histograms is onnxruntime's per_channel MinMax, shape and dtype included."""
    tmp = tmp_path_factory.mktemp("bn")
    gamma, beta = _values(data.draw, c, scale), _values(data.draw, c, scale)
    feeds = [{"X": _values(data.draw, (2, c, 3, 3), scale)} for _ in range(data.draw(st.integers(1, 3)))]
    path = (tmp / "bn.onnx").as_posix()
    onnx.save(_bn_model(gamma, beta), path)
    ort = OrtMinMax(path, augmented_model_path=(tmp / "o.onnx").as_posix(), per_channel=True)
    ort.augment_graph()
    ort.create_inference_session()

    class Reader:
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    ort.collect_data(Reader())
    expected = ort.compute_data().data
    ours = PercentileCalibrater(path, augmented_model_path=tmp / "h.onnx", per_channel=True, streaming_bins=256)
    ours.augment_graph()
    ours.create_inference_session()
    ours.collect_data(feeds)
    got = ours.state.compute("minmax").data
    assert set(got) == set(expected) >= {"gamma", "beta", "mean", "R"}
    for name, td in expected.items():
        for attr in ("lowest", "highest"):
            a, b = getattr(got[name], attr), getattr(td, attr)
            assert a.shape == b.shape and _same(a, b), (name, attr, a, b)
    assert got["gamma"].lowest.shape == (1,) and got["Y"].lowest.shape == (c,)


@st.composite
def _short_tensors(draw):
    """A tensor without the channel axis: rank 0 to 2 with an axis at or past its rank (or before -rank)."""
    rank = draw(st.integers(0, 2))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    axis = draw(st.one_of(st.integers(rank, rank + 2), st.integers(-rank - 2, -rank - 1)))
    x = _values(draw, shape, draw(st.sampled_from([1e-3, 1.0, 100.0])))
    for i, v in draw(st.lists(st.tuples(st.integers(0, max(x.size - 1, 0)), st.sampled_from([np.nan, np.inf])))):
        x.reshape(-1)[i] = v
    return x, axis


@settings(max_examples=40, deadline=None)
@given(tensor=_short_tensors(), method=st.sampled_from([*METHODS, ("isotone", {})]))
def test_a_tensor_without_the_channel_axis_gets_its_per_tensor_range_as_one_channel(tensor, method):
    x, axis = tensor
    name, options = method
    isotone = name == "isotone"
    ch = ChannelHistograms(256, axis, isotone=isotone)
    stream = _core.StreamHistograms(256, summaries=["isotone"] if isotone else [])
    ch.collect([("t", [x])])
    stream.collect([("t", [x])])
    assert ch.channels == {"t": 1}
    got = CalibrationState(Collection("streaming", stream, channels=ch)).compute(name, **options).data["t"]
    if isotone:
        s = _core.StreamHistograms(256, summaries=["isotone"])
        s.collect([("t", [np.ascontiguousarray(x)])])
        ref = CalibrationState(Collection("streaming", s)).compute(name, **options).data["t"].range_value
    else:
        ref = _per_tensor(x, name, options, bins=256).range_value
    assert got.lowest.shape == got.highest.shape == (1,)
    for value, part in zip((got.lowest, got.highest), ref):
        part = np.asarray(part).reshape(1)
        assert _same(value, part.astype(value.dtype)) and np.signbit(value[0]) == np.signbit(part[0])


def test_1d_tensors_per_channel_through_create_calibrator_state_files_and_cli(tmp_path):
    gamma = np.array([0.5, -2.0, 3.0], np.float32)
    path = (tmp_path / "bn.onnx").as_posix()
    onnx.save(_bn_model(gamma, np.array([0.1, 0.2, -0.3], np.float32)), path)
    rng = np.random.default_rng(0)
    feeds = [{"X": rng.standard_normal((2, 3, 3, 3)).astype(np.float32)} for _ in range(3)]
    for method in ("entropy", "percentile", "distribution", "mse", "isotone"):
        cal = create_calibrator(
            path,
            augmented_model_path=(tmp_path / f"{method}.onnx").as_posix(),
            calibrate_method=method,
            extra_options={"per_channel": True, "StreamingBins": 256},
        )
        cal.collect_data(feeds)
        data = cal.compute_data().data
        assert data["gamma"].lowest.shape == (1,) and data["Y"].lowest.shape == (3,), method
    cal.save_state(tmp_path / "s.npz")
    loaded = CalibrationState.load(tmp_path / "s.npz")
    assert loaded.channels.channels["gamma"] == 1 and loaded.channels.channels["Y"] == 3
    got = loaded.compute("minmax").data["gamma"]
    assert got.lowest.tolist() == [-2.0] and got.highest.tolist() == [3.0]
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for i, f in enumerate(feeds):
        np.save(data_dir / f"b{i}.npy", f["X"])
    cache = tmp_path / "c.json"
    args = ["calibrate", path, "--data", str(data_dir), "--method", "percentile", "--per-channel"]
    assert main([*args, "--streaming-bins", "256", "--cache", str(cache)]) == 0
    written = json.loads(cache.read_text())["data"]
    assert len(written["gamma"]["lowest"]["data"]) == 1 and len(written["Y"]["lowest"]["data"]) == 3


@pytest.mark.parity
def test_ort_refuses_a_scalar_per_channel(tmp_path):
    """What docs/deviations.md says: onnxruntime's per_channel MinMax cannot load its augmented model when a
    calibrated tensor is a scalar (its ReduceMin over axis 0); histocal gives it its per-tensor range."""
    nodes = [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(2.5, np.float32))),
        helper.make_node("Mul", ["X", "k"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "s",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2])],
    )
    path = (tmp_path / "s.onnx").as_posix()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    ort = OrtMinMax(path, augmented_model_path=(tmp_path / "o.onnx").as_posix(), per_channel=True)
    ort.augment_graph()
    with pytest.raises(Exception, match="rank"):
        ort.create_inference_session()
    cal = create_calibrator(
        path, augmented_model_path=(tmp_path / "h.onnx").as_posix(), calibrate_method="kl",
        extra_options={"per_channel": True, "StreamingBins": 256},
    )  # fmt: skip
    cal.collect_data([{"X": np.ones((2, 2), np.float32)}])
    got = cal.state.compute("minmax").data["k"]
    assert got.lowest.tolist() == got.highest.tolist() == [2.5]


# ---------------------------------------------------------------------------------------------
# Memory: a transformer's per-channel histograms are fitted to the limit with defaults


def test_a_transformer_sized_collection_fits_its_bins_to_the_limit(monkeypatch, caplog, tmp_path):
    """A 6-layer BERT has ~300 calibrated [batch, seq, hidden] tensors: ~26000 channels along axis 1 at
    seq 128, 3.3 GiB at 16384 bins, over the 2 GiB default limit (scaled down here: 2400 channels,
    32 MiB). The first collection fits the bins per channel to the limit, with a warning."""
    monkeypatch.setenv(MAX_CHANNEL_BYTES_ENV, str(32 << 20))
    rng = np.random.default_rng(4)
    items = [(f"t{i}", [rng.standard_normal((2, 16, 8)).astype(np.float32)]) for i in range(150)]
    ch = ChannelHistograms(16384, axis=1)
    with caplog.at_level(logging.WARNING, logger="histocal"):
        ch.collect(items)
    assert ch.num_bins == 1024 and ch.held_bytes <= 32 << 20 and ch.stream.num_bins == 1024
    assert "2400 channels in 150 tensors" in caplog.text and "using 1024 bins per channel" in caplog.text
    ch.collect(items)  # later calls keep the fitted bins
    stream = _core.StreamHistograms(16384)
    stream.collect(items)
    state = CalibrationState(Collection("streaming", stream, channels=ch))
    got = state.compute("percentile").data["t3"]
    x = np.concatenate([items[3][1][0]] * 2)
    for c in range(16):
        ref = _per_tensor(np.take(x, c, 1), "percentile", {}, bins=1024).range_value
        assert _same(got.highest[c], np.asarray(ref[1]).reshape(()).astype(got.highest.dtype)), c
    state.save(tmp_path / "s.npz")  # the nested per-channel state keeps its fitted bins
    loaded = CalibrationState.load(tmp_path / "s.npz")
    assert loaded.channels.num_bins == 1024 and loaded.to_bytes() == state.to_bytes()
    # not even the fewest bins fit: refused before any memory is taken, naming the tensor
    monkeypatch.setenv(MAX_CHANNEL_BYTES_ENV, str(1 << 20))
    with pytest.raises(ValueError, match=r"tensor 't\d+': per-channel histograms of its 16 channels x 1024 bins"):
        ChannelHistograms(16384, axis=1).collect(items)


def test_a_transformer_per_channel_along_the_hidden_axis_with_default_bins(monkeypatch, tmp_path):
    """models.transformer (dynamic batch and sequence) per channel along -1 (hidden) with the default
    streaming_bins: fitted to the limit, computed, saved and loaded; along axis 1 (the sequence) batches
    of other lengths are an error naming the tensor."""
    from support import models

    monkeypatch.setenv(MAX_CHANNEL_BYTES_ENV, str(2 << 20))
    path = (tmp_path / "t.onnx").as_posix()
    onnx.save(models.transformer(), path)
    feeds = models.transformer_feeds([6, 6, 6])  # padded to one length: the scores' last axis is the sequence
    cal = create_calibrator(
        path, augmented_model_path=(tmp_path / "a.onnx").as_posix(), calibrate_method="percentile",
        extra_options={"per_channel": True, "channel_axis": -1},
    )  # fmt: skip
    cal.collect_data(feeds)
    data = cal.compute_data().data
    assert data["ffn"].highest.shape == (8,) and data["h"].highest.shape == (16,)
    assert cal.state.channels.num_bins < cal.streaming_bins and cal.state.channels.held_bytes <= 2 << 20
    cal.save_state(tmp_path / "s.npz")
    assert CalibrationState.load(tmp_path / "s.npz").channels.num_bins == cal.state.channels.num_bins
    seq = create_calibrator(
        path, augmented_model_path=(tmp_path / "b.onnx").as_posix(), calibrate_method="percentile",
        extra_options={"per_channel": True, "channel_axis": 1},
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"tensor '\w+': 7 channels along axis 1 in this batch, 5 before"):
        seq.collect_data(models.transformer_feeds([5, 7, 3]))

"""isotone per channel (docs/methods.md, *isotone*): each channel's summary and range equal the numpy
reference of ``isotone_refs.py`` applied to that channel's slice; batching, order and merging never
change the summaries; the nested per-channel state keeps them through save/load; a channel axis that
is the class axis is refused naming the tensor; the calibrator and CLI paths on a small model."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from support import isotone_refs as I
from support.profiles import examples
from support.summaries import isotone_pairs

from histocal import _core
from histocal.state import CalibrationState, Collection
from histocal.state.channels import ChannelHistograms

BINS = 64
QTYPES = ["int8", "uint8", "int16", "uint16"]


def _state(items, axis=1, isotone=True) -> CalibrationState:
    """A streaming state of ``items`` ([(name, [arrays])]) with per-channel histograms (and, with
    ``isotone``, per-channel and per-tensor isotone summaries) along ``axis``."""
    ch = ChannelHistograms(BINS, axis, isotone=isotone)
    stream = _core.StreamHistograms(BINS, summaries=["isotone"] if isotone else [])
    for name, arrays in items:
        ch.collect([(name, arrays)])
        stream.collect([(name, arrays)])
    return CalibrationState(Collection("streaming", stream, channels=ch))


def _summary(stream, key: str) -> tuple:
    r = isotone_pairs(stream, key)
    return r.l1.tolist(), r.l2.tolist(), r.rows.tolist(), r.skipped, r.overflowed


def _summaries(state: CalibrationState) -> list:
    return [(k, _summary(state.channels.stream, k)) for k in state.channels.channel_keys()]


@st.composite
def _batches(draw):
    """Batches of one tensor of rank 2 to 4: a shared channel axis (not the last) with a shared channel
    count, a shared class axis (the last), other axes varied per batch; few distinct values (ties, equal
    pairs), sometimes NaN or infinities."""
    rank = draw(st.integers(2, 4))
    axis = draw(st.integers(0, rank - 2))
    channels = draw(st.integers(1, 3))
    classes = draw(st.integers(1, 5))
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1e-3, 1.0, 50.0]))
    out = []
    for _ in range(draw(st.integers(1, 3))):
        shape = [int(n) for n in rng.integers(0, 4, rank)]
        shape[axis], shape[-1] = channels, classes
        levels = rng.integers(-6, 12, shape) if draw(st.booleans()) else rng.normal(2, 3, shape)
        x = np.asarray(levels * scale, dtype=dtype)
        if x.size and draw(st.integers(0, 4)) == 0:
            x.flat[int(rng.integers(0, x.size))] = rng.choice([np.nan, np.inf, -np.inf])
        out.append(x)
    # the channel axis counted from the end half of the time (numpy's negative axes)
    return out, axis - rank if draw(st.booleans()) else axis


@given(_batches(), st.sampled_from(QTYPES), st.booleans())
@settings(max_examples=examples(80), deadline=None)
def test_each_channel_equals_the_reference_on_its_slice(tensor, qtype, symmetric):
    batches, axis = tensor
    state = _state([("t", batches)], axis)
    channels = batches[0].shape[axis]
    keys = state.channels.channel_keys()
    assert keys == [f"t[{c}]" for c in range(channels)]
    ranges = state.channels.stream.summary_ranges("isotone", keys, qtype=qtype, symmetric=symmetric)
    for c in range(channels):
        slices = [np.take(b, c, axis) for b in batches]
        pairs, skipped = I.top_two(slices)
        l1, l2, rows, got_skipped, _ = _summary(state.channels.stream, keys[c])
        assert sorted((a, b) for a, b, n in zip(l1, l2, rows) for _ in range(n)) == sorted(pairs)
        assert got_skipped == skipped
        # the range in float64, exactly the reference's
        assert ranges[c][:2] == I.isotone_range(slices, qtype, symmetric)
    if batches[0].dtype == np.float64:
        return  # onnxruntime's TensorData holds float16 and float32 only
    got = state.compute("isotone", qtype=qtype, symmetric=symmetric).data["t"]
    assert got.lowest.shape == got.highest.shape == (channels,)
    for c in range(channels):
        # per channel equals the per-tensor method on the channel's slice: same value and type
        alone = _core.StreamHistograms(BINS, summaries=["isotone"])
        alone.collect([("s", [np.ascontiguousarray(np.take(b, c, axis)) for b in batches])])
        want = CalibrationState(Collection("streaming", alone)).compute("isotone", qtype=qtype, symmetric=symmetric)
        for values, part in zip((got.lowest, got.highest), want.data["s"].range_value):
            part = np.asarray(part).reshape(())
            assert values.dtype == part.dtype and values[c] == part


def test_batching_order_and_merging_never_change_the_summaries():
    rng = np.random.default_rng(5)
    # (batch, channels, tokens, classes), few distinct values: repeated pairs and ties
    batches = [rng.integers(-3, 6, (2, 3, 4, 5)).astype(np.float32) * (i + 1) for i in range(6)]
    whole = _state([("a", [np.concatenate(batches)])], axis=1)
    # the same rows, split along the token axis too, in another order
    pieces = [p for b in batches[::-1] for p in np.array_split(b, 3, axis=2)]
    reordered = _state([("a", pieces[::2] + pieces[1::2])], axis=1)
    assert _summaries(reordered) == _summaries(whole)
    first, rest = _state([("a", batches[:2])], axis=1), _state([("a", batches[2:])], axis=1)
    merged = first.merge(rest)
    assert _summaries(merged) == _summaries(rest.merge(first)) == _summaries(whole)
    assert merged.channels.isotone
    a, b = whole.compute("isotone").data["a"], merged.compute("isotone").data["a"]
    assert np.array_equal(a.lowest, b.lowest) and np.array_equal(a.highest, b.highest)
    # a merge with channels that hold no summaries drops them, as per tensor
    plain = _state([("a", batches[:1])], axis=1, isotone=False)
    dropped = whole.merge(plain)
    assert not dropped.channels.isotone and "isotone" not in dropped.channels.stream.summaries
    with pytest.raises(ValueError, match=r'"a\[0\]".*isotone needs per-row'):
        dropped.compute("isotone")


def test_save_load_keeps_the_per_channel_summaries(tmp_path):
    x = np.random.default_rng(6).normal(0, 2, (4, 3, 6)).astype(np.float16)
    state = _state([("a", [x]), ("b", [x[:, :2]])], axis=-2)
    state.save(tmp_path / "s.npz")
    loaded = CalibrationState.load(tmp_path / "s.npz")
    assert loaded.channels.isotone and loaded.channels.channels == {"a": 3, "b": 2}
    assert _summaries(loaded) == _summaries(state)
    assert loaded.to_bytes() == state.to_bytes()
    for symmetric in (False, True):
        a, b = state.compute("isotone", symmetric=symmetric), loaded.compute("isotone", symmetric=symmetric)
        for n in ("a", "b"):
            assert np.array_equal(a.data[n].highest, b.data[n].highest)
    # the nested channel state is a version-2 state with isotone's members
    with np.load(tmp_path / "s.npz") as outer:
        nested = outer["channels"].tobytes()
    inner = CalibrationState.from_bytes(nested)
    assert "isotone" in inner.stream.summaries and inner.names == state.channels.channel_keys()
    # the copy a calibrator takes keeps the summaries
    assert state.channels.copy().isotone


def _edited(raw: bytes, member: str, change) -> bytes:
    """``raw`` (a state file) with ``change`` applied to the bytes of ``member``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(raw)) as zin, zipfile.ZipFile(buf, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == member + ".npy":
                out = io.BytesIO()
                np.save(out, change(np.load(io.BytesIO(data))))
                data = out.getvalue()
            zout.writestr(info, data)
    return buf.getvalue()


def test_corrupted_per_channel_summaries_are_refused():
    x = np.random.default_rng(8).normal(0, 2, (4, 2, 6)).astype(np.float32)
    raw = _state([("a", [x])]).to_bytes()

    def l2_above_l1(pairs: np.ndarray) -> np.ndarray:
        pairs = pairs.copy()
        pairs[0, 1] = pairs[0, 0] + 1.0
        return pairs

    def nested(change):
        return lambda member: np.frombuffer(_edited(member.tobytes(), "isotone_pairs", change), np.uint8)

    with pytest.raises(ValueError, match="Invalid calibration state.*channels.*finite l1 >= l2"):
        CalibrationState.from_bytes(_edited(raw, "channels", nested(l2_above_l1)))
    with pytest.raises(ValueError, match="Invalid calibration state.*isotone_pairs"):
        CalibrationState.from_bytes(_edited(raw, "channels", nested(lambda p: p[:-1])))


def test_a_channel_axis_that_is_the_class_axis_is_refused_naming_the_tensor():
    ch = ChannelHistograms(BINS, -1, isotone=True)
    with pytest.raises(ValueError, match=r"tensor 'probs'.*single class column.*last axis of its shape \(2, 5\)"):
        ch.collect([("probs", [np.zeros((2, 5), np.float32)])])
    with pytest.raises(ValueError, match="tensor 'v'.*single class column"):
        ChannelHistograms(BINS, 0, isotone=True).collect([("v", [np.zeros(4, np.float32)])])
    assert ch.channels == {} and ch.stream.names() == []
    # the histogram methods per channel take that axis
    ChannelHistograms(BINS, -1).collect([("probs", [np.zeros((2, 5), np.float32)])])


def test_collect_channels_adds_each_channel_slice_as_collect_would():
    x = np.random.default_rng(7).normal(0, 1, (3, 4, 2, 5)).astype(np.float32)
    s = _core.StreamHistograms(BINS, summaries=["isotone"])
    s.collect_channels([(["c0", "c1", "c2", "c3"], [x])], 1)
    for c in range(4):
        one = _core.StreamHistograms(BINS, summaries=["isotone"])
        one.collect([(f"c{c}", [np.ascontiguousarray(x[:, c])])])
        assert _summary(s, f"c{c}") == _summary(one, f"c{c}")
    with pytest.raises(ValueError, match="expected 3 channels"):
        s.collect_channels([(["c0", "c1", "c2"], [x])], 1)
    assert _summary(s, "c0") == _summary(_state([("x", [x])]).channels.stream, "x[0]")


# ---------------------------------------------------------------------------------------------
# The calibrator and the CLI, on a model with a (N, heads, classes) output


def _model() -> onnx.ModelProto:
    """X[N,3,6] -MatMul-> logits[N,3,5]: three channels (axis 1) of five-class rows."""
    w = numpy_helper.from_array(np.random.default_rng(1).normal(0, 1, (6, 5)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["logits"])],
        "heads",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3, 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3, 5])],
        initializer=[w],
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


def _feeds() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(2)
    return [{"X": rng.normal(0, 1, (n, 3, 6)).astype(np.float32)} for n in (4, 7, 3)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    import onnxruntime as ort

    tmp = tmp_path_factory.mktemp("isotone_channels")
    path = tmp / "heads.onnx"
    onnx.save(_model(), str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    logits = [session.run(None, f)[0] for f in _feeds()]
    return {"path": path, "tmp": tmp, "logits": logits}


def _want(logits: list[np.ndarray], qtype: str = "int8", symmetric: bool = False) -> np.ndarray:
    ranges = [I.isotone_range([b[:, c] for b in logits], qtype, symmetric) for c in range(logits[0].shape[1])]
    return np.array(ranges, np.float32)


def test_method_calibrater_per_channel(model):
    from histocal.calibrators import MethodCalibrater

    cal = MethodCalibrater(
        str(model["path"]),
        augmented_model_path=str(model["tmp"] / "aug.onnx"),
        method="isotone",
        method_options={"qtype": "uint8"},
        per_channel=True,
    )
    cal.augment_graph()
    cal.create_inference_session()
    cal.collect_data(iter(_feeds()))
    got = cal.compute_data().data["logits"]
    want = _want(model["logits"], "uint8")
    assert np.array_equal(got.lowest, want[:, 0]) and np.array_equal(got.highest, want[:, 1])
    # axis -1 is always the class axis: refused at once; another axis that is the last for some tensor
    # is refused when that tensor is collected, naming it, and the failed collection leaves nothing
    with pytest.raises(ValueError, match="channel axis other than the last"):
        MethodCalibrater(str(model["path"]), method="isotone", per_channel=True, axis=-1)
    late = MethodCalibrater(
        str(model["path"]),
        augmented_model_path=str(model["tmp"] / "aug2.onnx"),
        method="isotone",
        per_channel=True,
        axis=2,
    )
    late.augment_graph()
    late.create_inference_session()
    with pytest.raises(ValueError, match="tensor '(X|logits)'.*single class column"):
        late.collect_data(iter(_feeds()))
    assert late.collection is None
    with pytest.raises(ValueError, match="collected"):
        late.save_state(model["tmp"] / "late.state")
    # the per-tensor result is still there
    per_tensor = cal.state.compute("isotone", per_channel=False, qtype="uint8").data["logits"]
    assert float(per_tensor.highest[0]) == np.float32(I.isotone_range(model["logits"], "uint8")[1])


def test_cli_calibrate_isotone_per_channel(model, tmp_path):
    from histocal.cli.main import main

    data = tmp_path / "data"
    data.mkdir()
    for i, f in enumerate(_feeds()):
        np.save(data / f"b{i}.npy", f["X"])
    cache, state = tmp_path / "c.json", tmp_path / "s.npz"
    args = ["calibrate", str(model["path"]), "--data", str(data), "--method", "isotone", "--per-channel"]
    assert main([*args, "--symmetric", "--cache", str(cache), "--state", str(state)]) == 0
    written = json.loads(cache.read_text())["data"]["logits"]
    want = _want(model["logits"], "int8", True)
    assert np.array_equal(np.array(written["lowest"]["data"], np.float32), want[:, 0])
    assert np.array_equal(np.array(written["highest"]["data"], np.float32), want[:, 1])
    assert CalibrationState.load(state).channels.isotone
    # recomputed from the saved state for uint8 (symmetric: the state's setting)
    again = tmp_path / "again.json"
    assert main(["recompute", str(state), "--method", "isotone", "--qtype", "uint8", "--cache", str(again)]) == 0
    written = json.loads(again.read_text())["data"]["logits"]
    want = _want(model["logits"], "uint8", True)
    assert np.array_equal(np.array(written["highest"]["data"], np.float32), want[:, 1])


def test_isotone_summaries_count_against_the_per_channel_limit():
    """Isotone's per-channel summaries grow with the data: once they and the histograms pass the
    limit, the collection is refused naming the tensor; within it, nothing is refused."""
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (2, 50, 6)).astype(np.float32)  # 2 channels (axis 0) x 50 rows of 6 classes
    hist_bytes = 2 * BINS * 8
    roomy = ChannelHistograms(BINS, 0, max_bytes=hist_bytes + 24 * 100, isotone=True)
    roomy.collect([("logits", [x])])
    assert roomy.stream.summary_bytes("isotone") == 24 * 100  # distinct normal draws: one pair per row
    tight = ChannelHistograms(BINS, 0, max_bytes=hist_bytes + 24 * 99, isotone=True)
    with pytest.raises(ValueError, match=r"tensor 'logits'.*isotone summaries now hold 100 distinct.*over the limit"):
        tight.collect([("logits", [x])])
    # the histograms alone never trigger it
    assert ChannelHistograms(BINS, 0, max_bytes=hist_bytes).stream.summary_bytes("isotone") == 0

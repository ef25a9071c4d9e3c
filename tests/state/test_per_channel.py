"""Per-channel histograms (histocal.state.channels): every method per channel equals the per-tensor
method on that channel's values (numpy slices through histocal's per-tensor path, numpy's nanmin/
nanmax, onnxruntime's own percentile/entropy/distribution code on the same histograms); batching,
order and merging never change them; states save, load and merge; the memory limit and bad shapes
are errors naming the tensor."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnxruntime.quantization import calibrate as ort_calibrate
from onnxruntime.quantization.quant_utils import compute_scale_zp
from support import models

import histocal
from histocal import _core
from histocal.calibrators import PercentileCalibrater, create_calibrator
from histocal.cli import main
from histocal.collector import HistogramCollector
from histocal.state import CalibrationState, Collection
from histocal.state.channels import MAX_CHANNEL_BYTES_ENV, ChannelHistograms

BINS = 256
METHODS = (
    ("minmax", {}),
    ("percentile", {}),
    ("percentile", {"symmetric": False, "percentile": 99.0}),
    ("entropy", {}),
    ("entropy", {"num_bins": 512}),
    ("distribution", {}),
    ("mse", {}),
    ("mse", {"symmetric": True, "qtype": "uint8"}),
    ("kl", {}),
    ("pow2", {"pow2_method": "NonOverflow"}),
    ("auto", {}),
)


def _state(items, axis=1, bins=BINS) -> CalibrationState:
    """A streaming state of ``items`` ([(name, [arrays])]) with per-channel histograms along ``axis``."""
    ch = ChannelHistograms(bins, axis)
    stream = _core.StreamHistograms(bins)
    for name, arrays in items:
        ch.collect([(name, arrays)])
        stream.collect([(name, arrays)])
    return CalibrationState(Collection("streaming", stream, channels=ch))


def _per_tensor(values: np.ndarray, method: str, options: dict, bins=BINS):
    stream = _core.StreamHistograms(bins)
    stream.collect([("t", [np.ascontiguousarray(values)])])
    return CalibrationState(Collection("streaming", stream)).compute(method, **options).data["t"]


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


@st.composite
def _tensors(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    axis = draw(st.integers(-rank, rank - 1))
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    size = int(np.prod(shape))
    scale = draw(st.sampled_from([1e-3, 1.0, 100.0]))
    seed = draw(st.integers(0, 2**16))
    x = (np.random.default_rng(seed).standard_normal(size) * scale).astype(dtype)
    specials = draw(st.lists(st.tuples(st.integers(0, size - 1), st.sampled_from([np.nan, np.inf, -np.inf, 0.0]))))
    for i, v in specials:
        x[i] = v
    return x.reshape(shape), axis


@settings(max_examples=30, deadline=None)
@given(tensor=_tensors(), method=st.sampled_from(METHODS), cut=st.integers(0, 4))
def test_each_channel_equals_the_per_tensor_method_on_its_slice(tensor, method, cut):
    x, axis = tensor
    name, options = method
    # batches: x split along an axis other than the channel axis (batching never matters)
    other = next((a for a in range(x.ndim) if a != axis % x.ndim), None)
    parts = [x] if other is None else [p for p in np.array_split(x, min(cut + 1, x.shape[other]), other) if p.size]
    got = _state([("t", parts)], axis).compute(name, **options).data["t"]
    channels = x.shape[axis]
    assert got.lowest.shape == got.highest.shape == (channels,)
    refs = [_per_tensor(np.take(x, c, axis), name, options).range_value for c in range(channels)]
    for i, values in enumerate((got.lowest, got.highest)):
        parts = [np.asarray(r[i]).reshape(()) for r in refs]
        # one array of the channels' common type: numpy's promotion, which never rounds
        assert values.dtype == np.result_type(*parts), (values.dtype, [p.dtype for p in parts])
        for c, part in enumerate(parts):
            assert np.array_equal(values[c], part.astype(values.dtype), equal_nan=True), (c, values, refs)
            assert np.signbit(values[c]) == np.signbit(part), (c, values, refs)
    for c in range(channels):
        if name == "minmax":  # against numpy directly: nanmin/nanmax of the channel, infinities included
            values = np.take(x, c, axis)
            if not np.all(np.isnan(values)):
                assert got.lowest[c] == np.nanmin(values) and got.highest[c] == np.nanmax(values)


@pytest.mark.parity
@pytest.mark.parametrize(
    "method, ort_options",
    [
        ("percentile", {"symmetric": True, "num_bins": 2048, "percentile": 99.9}),
        ("percentile", {"symmetric": False, "num_bins": 2048, "percentile": 99.0}),
        ("entropy", {"symmetric": False, "num_bins": 128, "num_quantized_bins": 128}),
        ("distribution", {"symmetric": False, "num_bins": 2048, "scenario": "same"}),
    ],
)
def test_ort_methods_per_channel_equal_onnxruntimes_code_on_each_channel(method, ort_options):
    """onnxruntime's own HistogramCollector, given each channel's histogram, computes what the per-channel
    result holds for that channel."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((6, 5, 7)) * np.array([0.1, 1, 10, 3, 0.5])[None, :, None]).astype(np.float32)
    x[0, 3, 0] = 40.0  # an outlier channel
    state = _state([("t", [x[:2], x[2:]])], axis=1)
    settings = {k: v for k, v in ort_options.items() if k in histocal.methods.table.TABLE[method].defaults}
    got = state.compute(method, **settings).data["t"]
    kind = "abs" if method == "percentile" and ort_options["symmetric"] else "value"
    hists = state.channels.stream.to_histograms(kind, ort_options["num_bins"])
    ours = HistogramCollector(
        method, ort_options["symmetric"], ort_options["num_bins"], ort_options.get("num_quantized_bins", 128),
        ort_options.get("percentile", 99.999), ort_options.get("scenario", "same"),
    )  # fmt: skip
    ours.histograms = hists
    ort = ort_calibrate.HistogramCollector(
        method, ort_options["symmetric"], ort_options["num_bins"], ort_options.get("num_quantized_bins", 128),
        ort_options.get("percentile", 99.999), ort_options.get("scenario", "same"),
    )  # fmt: skip
    ort.histogram_dict = {k: tuple(np.array(v, copy=True) for v in t) for k, t in ours.histogram_dict.items()}
    ort_result = ort.compute_collection_result()
    for c in range(x.shape[1]):
        result = ort_result[f"t[{c}]"]  # ORT's collector gives (low, high) tuples, or TensorData for distribution
        lo, hi = result.range_value if hasattr(result, "range_value") else result[:2]
        assert _same(got.lowest[c], np.asarray(lo).reshape(())) and _same(got.highest[c], np.asarray(hi).reshape(()))
        if method == "distribution":
            avg, std = ort_result[f"t[{c}]"].avg_std
            assert _same(got.avg[c], np.asarray(avg).reshape(())) and _same(got.std[c], np.asarray(std).reshape(()))


def _histograms(state: CalibrationState) -> list:
    """Every channel's streaming histogram (bins, extremes, value counts; not the batch count)."""
    out = []
    for key in state.channels.channel_keys():
        e = state.channels.stream.export(key)
        out.append((key, e.dtype, e.level, e.bins.tolist(), e.finite_min, e.finite_max, e.abs_min, e.counts[:4]))
    return out


def test_batching_order_and_merging_never_change_the_histograms():
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((2, 4, 3, 3)) * (i + 1)).astype(np.float32) for i in range(6)]
    whole = _state([("a", [np.concatenate(batches)]), ("b", [np.concatenate(batches)[..., :1]])], axis=-3)
    one_by_one = _state([("a", batches[::-1]), ("b", [b[..., :1] for b in batches])], axis=-3)
    assert _histograms(whole) == _histograms(one_by_one)
    first = _state([("a", batches[:2]), ("b", [b[..., :1] for b in batches[:2]])], axis=-3)
    rest = _state([("a", batches[2:]), ("b", [b[..., :1] for b in batches[2:]])], axis=-3)
    merged = first.merge(rest)
    assert merged.to_bytes() == rest.merge(first).to_bytes() == one_by_one.to_bytes()  # 6 batches each
    assert _histograms(merged) == _histograms(whole)
    for method, options in METHODS:
        a, b = whole.compute(method, **options).data, merged.compute(method, **options).data
        assert all(_same(a[n].lowest, b[n].lowest) and _same(a[n].highest, b[n].highest) for n in a)


def test_states_save_load_and_keep_version_1_for_per_tensor(tmp_path):
    x = np.random.default_rng(2).standard_normal((3, 5, 4)).astype(np.float16)
    state = _state([("a", [x]), ("b", [x[:, :2]])], axis=1)
    state.save(tmp_path / "s.npz")
    loaded = CalibrationState.load(tmp_path / "s.npz")
    assert loaded.channels is not None and loaded.channels.channels == {"a": 5, "b": 2}
    assert loaded.to_bytes() == state.to_bytes()
    assert _same(loaded.compute("kl").data["a"].highest, state.compute("kl").data["a"].highest)
    header = json.loads(np.load(tmp_path / "s.npz")["header"].tobytes())
    assert header["version"] == 2 and header["channels"] == {"axis": 1, "tensors": [["a", 5], ["b", 2]]}
    # a state without channels is written as version 1, as before, and per_channel=False reads the per-tensor part
    plain = CalibrationState(Collection("streaming", state.stream, only=tuple(state.names)))
    plain.save(tmp_path / "p.npz")
    assert json.loads(np.load(tmp_path / "p.npz")["header"].tobytes())["version"] == 1
    assert CalibrationState.load(tmp_path / "p.npz").channels is None
    assert _same(state.compute("mse", per_channel=False).data["a"].lowest, plain.compute("mse").data["a"].lowest)
    with pytest.raises(ValueError, match="per-channel histograms"):
        plain.compute("mse", per_channel=True)
    with pytest.raises(ValueError, match="per-channel histograms"):
        plain.merge(state)


def test_bad_channel_states_are_refused(tmp_path):
    x = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    state = _state([("a", [x])], axis=1)
    raw = state.to_bytes()
    # a header claiming other channel counts than the nested histograms hold
    import io
    import zipfile

    members = dict(np.load(io.BytesIO(raw)))
    header = json.loads(members["header"].tobytes())
    header["channels"]["tensors"] = [["a", 4]]
    members["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for key, array in members.items():
            with zf.open(key + ".npy", "w") as f:
                np.lib.format.write_array(f, array)
    with pytest.raises(ValueError, match="channels"):
        CalibrationState.from_bytes(buf.getvalue())
    header["channels"]["tensors"] = [["nope", 3]]
    members["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for key, array in members.items():
            with zf.open(key + ".npy", "w") as f:
                np.lib.format.write_array(f, array)
    with pytest.raises(ValueError, match="channels.tensors"):
        CalibrationState.from_bytes(buf.getvalue())


def test_memory_limit_and_shapes_are_errors_naming_the_tensor(monkeypatch):
    x = np.zeros((2, 64, 3), np.float32)
    ch = ChannelHistograms(1024, axis=1, max_bytes=64 * 1024 * 8 - 1)
    with pytest.raises(ValueError, match=r"tensor 'big'.*64 channels x 1024 bins.*over the limit"):
        ch.collect([("small", [x[:, :1]]), ("big", [x])])
    assert ch.channels == {} and ch.stream.names() == []  # nothing of the refused call was added
    monkeypatch.setenv(MAX_CHANNEL_BYTES_ENV, str(8 * 1024 * 10))
    ch = ChannelHistograms(1024, axis=1)
    ch.collect([("ten", [x[:, :10]])])
    with pytest.raises(ValueError, match="tensor 'one'.*over the limit"):
        ch.collect([("one", [x[:, :1]])])
    with pytest.raises(ValueError, match=r"tensor 'ten': 9 channels along axis 1 in this batch, 10 before"):
        ch.collect([("ten", [x[:, :9]])])
    with pytest.raises(ValueError, match=r"tensor 's': per-channel histograms of its 1 channels"):
        ch.collect([("s", [np.zeros(3, np.float32)])])  # a 1-D tensor: one channel, the whole tensor
    with pytest.raises(ValueError, match=r"tensor 'e': its channel axis 1 has no channels"):
        ChannelHistograms(64).collect([("e", [np.zeros((2, 0), np.float32)])])
    monkeypatch.setenv(MAX_CHANNEL_BYTES_ENV, "lots")
    with pytest.raises(ValueError, match=MAX_CHANNEL_BYTES_ENV):
        ChannelHistograms(64)


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("pc") / "cnn.onnx"
    onnx.save(models.cnn(), path.as_posix())
    return path.as_posix()


def _feeds(n=4):
    return [{"X": f["X"]} for f in models.cnn_feeds(n, batch=2, seed=7)]


def test_calibrators_collect_per_channel_and_match_the_model_outputs(cnn_path, tmp_path):
    feeds = _feeds()
    cal = PercentileCalibrater(cnn_path, augmented_model_path=tmp_path / "a.onnx", per_channel=True, streaming_bins=512)
    cal.augment_graph()
    cal.create_inference_session()
    cal.collect_data(iter(feeds))
    got = cal.compute_data()
    names = [o.name for o in cal.infer_session.get_outputs() if o.name in cal.tensors_to_calibrate]
    outputs = [cal.infer_session.run(names, f) for f in feeds]
    ref = _state([(n, [o[i] for o in outputs]) for i, n in enumerate(names)], axis=1, bins=512)
    expected = ref.compute("percentile", symmetric=False)
    assert set(got.data) == set(expected.data)
    for n in names:
        assert got.data[n].lowest.shape == (outputs[0][names.index(n)].shape[1],)
        assert _same(got.data[n].lowest, expected.data[n].lowest) and _same(
            got.data[n].highest, expected.data[n].highest
        )
    # the state carries the channels through save/load and loads into a per-channel calibrator only
    cal.save_state(tmp_path / "s.npz")
    state = CalibrationState.load(tmp_path / "s.npz")
    assert _same(state.compute("percentile").data[names[0]].highest, got.data[names[0]].highest)
    other = PercentileCalibrater(cnn_path, augmented_model_path=tmp_path / "b.onnx", streaming_bins=512)
    with pytest.raises(ValueError, match="per-channel"):
        other.load_state(state)


def test_create_calibrator_routes_per_channel_and_axis(cnn_path, tmp_path):
    feeds = _feeds(2)
    for method in ("entropy", "kl"):
        cal = create_calibrator(
            cnn_path,
            augmented_model_path=(tmp_path / f"{method}.onnx").as_posix(),
            calibrate_method=method,
            extra_options={"per_channel": True, "channel_axis": -1, "StreamingBins": 256},
        )
        cal.collect_data(feeds)
        data = cal.compute_data().data
        assert data["X"].lowest.shape == (8,)  # X[N,3,8,8]: the last axis
        assert cal.state.channels.axis == -1
    with pytest.raises(ValueError, match="most-common choice is per tensor only"):
        create_calibrator(
            cnn_path,
            augmented_model_path=(tmp_path / "v.onnx").as_posix(),
            calibrate_method="pow2",
            extra_options={"per_channel": True, "MethodOptions": {"minmse_mode": "MostCommon"}},
        )
    with pytest.raises(ValueError, match="most-common choice is per tensor only"):
        cal.state.compute("pow2", minmse_mode="MostCommon")
    with pytest.raises(ValueError, match="streaming mode only"):
        PercentileCalibrater(cnn_path, augmented_model_path=tmp_path / "x.onnx", per_channel=True, mode="exact")


def test_a_failed_collect_leaves_the_channels_unchanged(cnn_path, tmp_path, monkeypatch):
    cal = create_calibrator(
        cnn_path,
        augmented_model_path=(tmp_path / "f.onnx").as_posix(),
        calibrate_method="percentile",
        extra_options={"per_channel": True, "StreamingBins": 256},
    )
    cal.collect_data(_feeds(2))
    before = cal.state.to_bytes()
    monkeypatch.setenv(MAX_CHANNEL_BYTES_ENV, "1")  # read by the next collection only
    cal.collect_data(_feeds(2))  # the channels exist already: still within what was allowed
    after_two = cal.state.to_bytes()
    assert after_two != before
    bad = [{"X": np.zeros((1, 3, 8, 8), np.float32)}, {"X": np.zeros((1, 2, 8, 8), np.float32)}]
    with pytest.raises(Exception):  # noqa: B017 - ORT or the channel check refuses the second batch
        cal.collect_data(bad)
    assert cal.state.to_bytes() == after_two


def test_cli_calibrate_per_channel_and_recompute(cnn_path, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        np.save(data / f"b{i}.npy", np.random.default_rng(i).normal(size=(2, 3, 8, 8)).astype(np.float32))
    state, cache = tmp_path / "s.npz", tmp_path / "c.json"
    args = ["calibrate", cnn_path, "--data", str(data), "--method", "mse", "--per-channel", "--axis", "1"]
    assert main([*args, "--streaming-bins", "512", "--state", str(state), "--cache", str(cache)]) == 0
    loaded = CalibrationState.load(state)
    assert loaded.channels is not None and loaded.channels.axis == 1
    written = json.loads(cache.read_text())["data"]
    assert written.keys() == set(loaded.names)
    for name, entry in written.items():
        assert len(entry["lowest"]["data"]) == loaded.channels.channels[name] > 1
    again = tmp_path / "again.json"
    assert main(["recompute", str(state), "--method", "percentile", "--cache", str(again)]) == 0
    assert {
        n: len(e["highest"]["data"]) for n, e in json.loads(again.read_text())["data"].items()
    } == loaded.channels.channels


@pytest.mark.parity
def test_onnxruntime_quantizer_takes_one_range_per_activation():
    """What docs/methods.md says: ORT's compute_scale_zp (quantize_static's) accepts a per-channel range of
    one channel and refuses more (its scale check needs a single truth value)."""
    qmin, qmax = np.array(-128, np.int8), np.array(127, np.int8)
    _, scale = compute_scale_zp(np.array([-1.0], np.float32), np.array([2.0], np.float32), qmin, qmax)
    assert scale.shape == (1,)
    with pytest.raises(ValueError, match="truth value"):
        compute_scale_zp(np.array([-1.0, -2.0], np.float32), np.array([2.0, 1.0], np.float32), qmin, qmax)


def test_stream_histograms_keep_first_collected_order_without_repeats():
    """The order bookkeeping per-channel collections rely on (new tensors are added to the order where they
    are known to be new, not by searching it): first-collected order, each name once."""
    x = np.arange(6, dtype=np.float32)
    s = _core.StreamHistograms(64)
    s.collect([("a", [x]), ("b", [x])])
    s.collect([("c", [x]), ("a", [x])])
    s.collect([("d", [x]), ("d", [x])])
    assert s.names() == ["a", "b", "c", "d"]
    e = s.export("b")
    s.restore("b", "float32", e.level, e.bins, e.finite_min, e.finite_max, e.abs_min, e.counts)
    s.restore("e", "float32", e.level, e.bins, e.finite_min, e.finite_max, e.abs_min, e.counts)
    assert s.names() == ["a", "b", "c", "d", "e"]
    with pytest.raises(ValueError, match="dtype must not change"):
        s.collect([("f", [x]), ("a", [x.astype(np.float64)])])  # a changed dtype: nothing changes
    assert s.names() == ["a", "b", "c", "d", "e"]
    assert s.to_histograms("value", 16).names() == s.names()


def test_quantize_static_refuses_per_channel_ranges_naming_the_tensor(cnn_path, tmp_path):
    cal = create_calibrator(
        cnn_path,
        augmented_model_path=(tmp_path / "q.onnx").as_posix(),
        calibrate_method="mse",
        extra_options={"per_channel": True, "StreamingBins": 256},
    )
    cal.collect_data(_feeds(2))
    state = cal.state
    with pytest.raises(ValueError, match=r"tensor '.*': per-channel ranges \(\d+ values\).*one range per activation"):
        histocal.quantize_static(cnn_path, tmp_path / "m.onnx", tensors_range=state.compute("mse"))
    histocal.quantize_static(cnn_path, tmp_path / "m.onnx", tensors_range=state.compute("mse", per_channel=False))
    assert (tmp_path / "m.onnx").is_file()
    state.save(tmp_path / "s.npz")
    out = tmp_path / "cli.onnx"
    assert main(["quantize", cnn_path, str(out), "--state", str(tmp_path / "s.npz"), "--method", "mse"]) == 1
    assert not out.exists()


def test_collect_channels_checks_the_channel_count_naming_the_tensor():
    s = _core.StreamHistograms(64)
    x = np.ones((2, 3, 4), np.float32)
    s.collect_channels([(["t[0]", "t[1]", "t[2]"], [x, x[:1]])], 1)
    assert s.names() == ["t[0]", "t[1]", "t[2]"] and s.counts("t[1]").n_finite == 12
    with pytest.raises(ValueError, match=r'tensor "u\[0\]": expected 2 channels along axis 1, got shape \[2, 3, 4\]'):
        s.collect_channels([(["u[0]", "u[1]"], [x])], 1)
    with pytest.raises(ValueError, match="expected 3 channels along axis 5"):
        s.collect_channels([(["t[0]", "t[1]", "t[2]"], [x])], 5)
    assert s.names() == ["t[0]", "t[1]", "t[2]"]

"""histocal.CalibrationState: save/load, compute for every method, merging, staleness, loader safety."""

from __future__ import annotations

import copy
import functools
import io
import json
import os
import threading
import zipfile

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.calibrate import TensorsData

import histocal
from histocal import CalibrationState, Collection, merge_states

# ----------------------------------------------------------------------------------------------
# model, data, helpers
# ----------------------------------------------------------------------------------------------


def _make_model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.7, (4, 6)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.normal(0, 0.1, (6,)).astype(np.float32), "B1"),
        numpy_helper.from_array(rng.normal(0, 0.5, (6, 3)).astype(np.float32), "W2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["mm1"], name="mm1"),
        helper.make_node("Add", ["mm1", "B1"], ["add1"], name="add1"),
        helper.make_node("Relu", ["add1"], ["relu1"], name="relu1"),
        helper.make_node("MatMul", ["relu1", "W2"], ["Y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "state_test",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3])],
        initializer=inits,
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "model.onnx"
    onnx.save(_make_model(0), path)
    return str(path)


@pytest.fixture(scope="module")
def other_model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model2") / "model.onnx"
    onnx.save(_make_model(1), path)
    return str(path)


def _batches(seed: int, n: int = 6, scale: float = 1.0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"X": (rng.normal(0, scale, (5, 4))).astype(np.float32)} for _ in range(n)]


DATA = _batches(1, 8)
SHARDS = [_batches(10 + i, 3 + i) for i in range(3)]
# every shard starts with the same, dominating batch: all shards then share every tensor's range
ANCHOR = {"X": np.array([[30.0, -30.0, 30.0, -30.0], [-30.0, 30.0, -30.0, 30.0]] * 2, np.float32)}
ANCHORED = [[ANCHOR, *s] for s in SHARDS]

CLASSES = {
    "entropy": histocal.EntropyCalibrater,
    "percentile": histocal.PercentileCalibrater,
    "distribution": histocal.DistributionCalibrater,
}


def _calibrator(method: str, model_path: str, tmp_path, **kw):
    aug = str(tmp_path / f"aug_{method}_{threading.get_ident()}_{np.random.randint(1 << 30)}.onnx")
    if method == "minmax":
        cal = histocal.MinMaxCalibrater(model_path, augmented_model_path=aug, **kw)
    else:
        cal = CLASSES[method](model_path, augmented_model_path=aug, **kw)
    cal.augment_graph()
    cal.create_inference_session()
    return cal


def _calibrate(method, model_path, tmp_path, data, **kw):
    cal = _calibrator(method, model_path, tmp_path, **kw)
    for call in data if isinstance(data, tuple) else (data,):
        cal.collect_data(call)
    return cal


def _assert_same(a: TensorsData, b: TensorsData, ordered: bool = True) -> None:
    assert a.calibration_method == b.calibration_method
    if ordered:
        assert list(a.data) == list(b.data)
    assert sorted(a.data) == sorted(b.data)
    for name in a.data:
        da, db = a.data[name], b.data[name]
        for attr in ("lowest", "highest", "hist", "hist_edges", "avg", "std", "bins"):
            va, vb = getattr(da, attr, None), getattr(db, attr, None)
            assert (va is None) == (vb is None), (name, attr)
            if va is None:
                continue
            assert type(va) is type(vb), (name, attr, type(va), type(vb))
            if isinstance(va, (np.ndarray, np.generic)):
                assert va.dtype == vb.dtype, (name, attr)
                assert np.shape(va) == np.shape(vb), (name, attr)
            np.testing.assert_array_equal(va, vb, err_msg=f"{name}.{attr}")


def _stream_exports(state: CalibrationState) -> dict:
    out = {}
    for n in state.names:
        e = state.stream.export(n)
        out[n] = (e.dtype, e.level, e.bins.tobytes(), e.finite_min, e.finite_max, e.abs_min, e.counts)
    return out


def _exact_exports(state: CalibrationState) -> dict:
    out = {}
    for n in state.names:
        s = state.exact.state(n)
        out[n] = (
            s.hist.tobytes(),
            s.edges.tobytes(),
            str(s.edges.dtype),
            s.min,
            s.max,
            s.threshold,
            s.dtype,
            state.exact.counts(n),
        )
    return out


# every method with non-default settings, as (method, calibrator kwargs)
REQUESTS = [
    ("entropy", dict(num_bins=256, num_quantized_bins=64)),
    ("entropy", dict(num_bins=128, num_quantized_bins=128, symmetric=True)),
    ("percentile", dict(num_bins=2048, percentile=99.9, symmetric=False)),
    ("percentile", dict(num_bins=1024, percentile=99.99, symmetric=True)),
    ("distribution", dict(num_bins=1024, scenario="same")),
    ("distribution", dict(num_bins=512, scenario="p3")),
]

# ----------------------------------------------------------------------------------------------
# round trip and compute
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["streaming", "exact"])
def test_round_trip(model_path, tmp_path, mode):
    cal = _calibrate("percentile", model_path, tmp_path, DATA, mode=mode, streaming_bins=1024)
    path = tmp_path / "state.npz"
    cal.save_state(path, data_fingerprint="data-v1")
    state = CalibrationState.load(path)
    assert state.mode == mode and state.names == cal.state.names
    assert state.model_fingerprint == histocal.model_fingerprint(model_path)
    assert state.data_fingerprint == "data-v1"
    assert state.to_bytes() == CalibrationState.from_calibrator(cal, "data-v1").to_bytes()
    assert _stream_exports(state) == _stream_exports(cal.state)
    if mode == "exact":
        assert _exact_exports(state) == _exact_exports(cal.state)
    _assert_same(state.compute("percentile"), cal.compute_data())
    # compressed files load the same
    cal.save_state(tmp_path / "c.npz", compress=True)
    assert CalibrationState.load(tmp_path / "c.npz").to_bytes() == cal.state.to_bytes()
    assert dict(np.load(path, allow_pickle=False)).keys() >= {"header", "stream_bins"}


def test_exact_mode_keeps_the_streaming_histogram_streaming_mode_builds(model_path, tmp_path):
    # exact mode feeds it from the first read's scans, over two collect_data calls here
    exact = _calibrate("entropy", model_path, tmp_path, (SHARDS[0], SHARDS[1]), mode="exact")
    stream = _calibrate("entropy", model_path, tmp_path, (SHARDS[0], SHARDS[1]), mode="streaming")
    assert _stream_exports(exact.state) == _stream_exports(stream.state)


def test_streaming_state_serves_every_method(model_path, tmp_path):
    cal = _calibrate("entropy", model_path, tmp_path, DATA, mode="streaming")
    cal.save_state(tmp_path / "s.npz")
    state = CalibrationState.load(tmp_path / "s.npz")
    for method, kw in REQUESTS:
        fresh = _calibrate(method, model_path, tmp_path, DATA, mode="streaming", **kw)
        _assert_same(state.compute(method, **kw), fresh.compute_data())
    for sym in (False, True):
        fresh = _calibrate("minmax", model_path, tmp_path, DATA, symmetric=sym)
        _assert_same(state.compute("minmax", symmetric=sym), fresh.compute_data(), ordered=False)


def test_exact_state_serves_every_method(model_path, tmp_path):
    cal = _calibrate("distribution", model_path, tmp_path, DATA, mode="exact", num_bins=1024)
    state = CalibrationState.load(_saved(cal, tmp_path / "e.npz"))
    _assert_same(state.compute("distribution"), cal.compute_data())
    # same histogram kind and num_bins: identical to fresh exact calibrations
    for method, kw in [
        ("entropy", dict(num_bins=1024, num_quantized_bins=128)),
        ("percentile", dict(num_bins=1024, percentile=99.5, symmetric=False)),
        ("distribution", dict(num_bins=1024, scenario="p3")),
    ]:
        fresh = _calibrate(method, model_path, tmp_path, DATA, mode="exact", **kw)
        _assert_same(state.compute(method, **kw), fresh.compute_data())
    # anything else comes from the streaming histogram the exact calibrator kept too
    for method, kw in REQUESTS:
        if kw.get("num_bins") == 1024 and not (method == "percentile" and kw["symmetric"]):
            continue
        fresh = _calibrate(method, model_path, tmp_path, DATA, mode="streaming", **kw)
        _assert_same(state.compute(method, **kw), fresh.compute_data())
    fresh = _calibrate("minmax", model_path, tmp_path, DATA)
    _assert_same(state.compute("minmax"), fresh.compute_data(), ordered=False)


def _saved(cal, path):
    cal.save_state(path)
    return path


def test_compute_errors(model_path, tmp_path):
    cal = _calibrate("percentile", model_path, tmp_path, DATA, mode="exact", num_bins=512)
    state = cal.state
    exact_only = CalibrationState(Collection("exact", exact=state.exact), model_fingerprint=state.model_fingerprint)
    with pytest.raises(ValueError, match="needs value histograms of 128 bins"):
        exact_only.compute("entropy")
    _assert_same(exact_only.compute("percentile", num_bins=512, symmetric=False, percentile=99.999), cal.compute_data())
    with pytest.raises(ValueError, match="unknown calibration method 'klx'"):
        state.compute("klx")
    with pytest.raises(ValueError, match="needs the streaming histogram"):
        exact_only.compute("mse")
    with pytest.raises(ValueError, match="unknown settings"):
        state.compute("entropy", percentile=3)
    with pytest.raises(ValueError, match="percentile"):
        state.compute("percentile", percentile=101)


# ----------------------------------------------------------------------------------------------
# merging and continuing
# ----------------------------------------------------------------------------------------------


def test_streaming_shards_merge_to_one_run(model_path, tmp_path):
    states = [_calibrate("percentile", model_path, tmp_path, s, mode="streaming").state for s in SHARDS]
    whole = _calibrate("percentile", model_path, tmp_path, [b for s in SHARDS for b in s], mode="streaming")
    paths = [_saved_state(s, tmp_path / f"shard{i}.npz") for i, s in enumerate(states)]
    for merged in (
        merge_states(*paths),
        states[2].merge(states[0]).merge(states[1]),
        states[1].merge(states[2].merge(states[0])),
    ):
        assert _stream_exports(merged) == _stream_exports(whole.state)
        for method, kw in REQUESTS:
            _assert_same(merged.compute(method, **kw), whole.state.compute(method, **kw))
        _assert_same(merged.compute("percentile", symmetric=False), whole.compute_data())


def test_merge_states_leaves_the_states_it_is_given_unchanged(model_path, tmp_path):
    # merge_states merges into its running result in place: never into a state it was given.
    states = [_calibrate("percentile", model_path, tmp_path, s, mode="streaming").state for s in SHARDS]
    before = [s.to_bytes() for s in states]
    merged = merge_states(*states)
    assert [s.to_bytes() for s in states] == before
    assert merged.to_bytes() == states[0].merge(states[1]).merge(states[2]).to_bytes()
    assert merge_states(states[0]).to_bytes() == before[0]


def _saved_state(state, path):
    state.save(path)
    return path


def test_exact_shards_with_shared_edges_merge_to_one_run(model_path, tmp_path):
    states = [_calibrate("entropy", model_path, tmp_path, s, mode="exact").state for s in ANCHORED]
    whole = _calibrate("entropy", model_path, tmp_path, [b for s in ANCHORED for b in s], mode="exact")
    for name in states[0].names:  # the anchor makes the edges shared
        assert all(np.array_equal(s.exact.state(name).edges, states[0].exact.state(name).edges) for s in states)
    merged = merge_states([_saved_state(s, tmp_path / f"x{i}.npz") for i, s in enumerate(states)])
    assert _exact_exports(merged) == _exact_exports(whole.state)
    assert _stream_exports(merged) == _stream_exports(whole.state)
    _assert_same(merged.compute("entropy"), whole.compute_data())


def test_exact_merge_with_different_edges_follows_ort_rule(model_path, tmp_path):
    small = _calibrate("entropy", model_path, tmp_path, _batches(3, 4, 0.5), mode="exact").state
    big = _calibrate("entropy", model_path, tmp_path, _batches(4, 4, 3.0), mode="exact").state
    for a, b in ((small, big), (big, small)):
        merged = a.merge(b)
        for name in merged.names:
            s, sa, sb = merged.exact.state(name), a.exact.state(name), b.exact.state(name)
            hist, edges, mn, thr = s.hist, s.edges, s.min, s.threshold
            assert hist.sum() == sa.hist.sum() + sb.hist.sum()
            assert thr[0] >= max(sa.threshold[0], sb.threshold[0])
            assert len(edges) == len(hist) + 1 and len(hist) >= 128
            assert mn[0] == min(sa.min[0], sb.min[0])
        merged.compute("entropy")  # usable
    # percentile symmetric: |x| histograms
    a = _calibrate("percentile", model_path, tmp_path, _batches(3, 4, 0.5), mode="exact", symmetric=True).state
    b = _calibrate("percentile", model_path, tmp_path, _batches(4, 4, 3.0), mode="exact", symmetric=True).state
    m = a.merge(b)
    for name in m.names:
        assert m.exact.state(name).hist.sum() == a.exact.state(name).hist.sum() + b.exact.state(name).hist.sum()
        b_edges = b.exact.state(name).edges
        assert m.exact.state(name).edges[-1] >= (b_edges[-1] + b_edges[-2]) / 2  # holds b's last bin centre
    m.compute("percentile", symmetric=True)


@pytest.mark.parametrize("mode", ["streaming", "exact"])
def test_calibrator_continues_from_loaded_state(model_path, tmp_path, mode):
    first, second = SHARDS[0], SHARDS[1]
    _calibrate("entropy", model_path, tmp_path, first, mode=mode).save_state(tmp_path / "first.npz")
    cont = _calibrator("entropy", model_path, tmp_path, mode=mode)
    cont.load_state(tmp_path / "first.npz")
    cont.collect_data(second)
    ref = _calibrate("entropy", model_path, tmp_path, (first, second), mode=mode)  # two collect_data calls
    _assert_same(cont.compute_data(), ref.compute_data())
    assert _stream_exports(cont.state) == _stream_exports(ref.state)
    # loading into a calibrator that already collected merges
    again = _calibrate("entropy", model_path, tmp_path, second, mode="streaming")
    if mode == "streaming":
        again.load_state(tmp_path / "first.npz")
        assert _stream_exports(again.state) == _stream_exports(ref.state)


@pytest.mark.parametrize("method, kw", [("percentile", dict(symmetric=True)), ("distribution", dict(num_bins=1024))])
def test_exact_histograms_continue_from_loaded_state(model_path, tmp_path, method, kw):
    """A loaded |x| (symmetric percentile) or value histogram grows on wider data exactly as the
    one collected: same edges, counts, min/max, results."""
    first, second = _batches(20, 3, 0.5), _batches(21, 3, 4.0)
    _calibrate(method, model_path, tmp_path, first, mode="exact", **kw).save_state(tmp_path / "first.npz")
    cont = _calibrator(method, model_path, tmp_path, mode="exact", **kw)
    cont.load_state(tmp_path / "first.npz")
    cont.collect_data(second)
    ref = _calibrate(method, model_path, tmp_path, (first, second), mode="exact", **kw)
    assert _exact_exports(cont.state) == _exact_exports(ref.state)
    _assert_same(cont.compute_data(), ref.compute_data())


def test_staleness_errors(model_path, other_model_path, tmp_path):
    cal = _calibrate("entropy", model_path, tmp_path, DATA, mode="streaming", streaming_bins=1024)
    cal.save_state(tmp_path / "s.npz")
    other = _calibrator("entropy", other_model_path, tmp_path, mode="streaming", streaming_bins=1024)
    with pytest.raises(ValueError, match="another model"):
        other.load_state(tmp_path / "s.npz")
    with pytest.raises(ValueError, match="streaming_bins"):
        _calibrator("entropy", model_path, tmp_path, mode="streaming").load_state(tmp_path / "s.npz")
    with pytest.raises(ValueError, match="mode"):
        _calibrator("entropy", model_path, tmp_path, mode="exact", streaming_bins=1024).load_state(tmp_path / "s.npz")
    ex = _calibrate("entropy", model_path, tmp_path, DATA, mode="exact")
    with pytest.raises(ValueError, match="histograms of 2048 bins"):
        _calibrator("percentile", model_path, tmp_path, mode="exact").load_state(ex.state)
    with pytest.raises(ValueError, match="other tensors"):
        _calibrator(
            "entropy", model_path, tmp_path, mode="streaming", streaming_bins=1024, op_types_to_calibrate=["MatMul"]
        ).load_state(tmp_path / "s.npz")
    other_state = _calibrate("entropy", other_model_path, tmp_path, DATA, mode="streaming", streaming_bins=1024).state
    with pytest.raises(ValueError, match="different models"):
        cal.state.merge(other_state)
    with pytest.raises(ValueError, match="streaming_bins"):
        cal.state.merge(_calibrate("entropy", model_path, tmp_path, DATA, mode="streaming").state)
    with pytest.raises(ValueError, match="mode"):
        ex.state.merge(_calibrate("entropy", model_path, tmp_path, DATA, mode="streaming").state)


# ----------------------------------------------------------------------------------------------
# loader safety
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_files(tmp_path_factory, model_path):
    tmp = tmp_path_factory.mktemp("fuzz")
    out = {}
    for mode in ("streaming", "exact"):
        cal = _calibrate("percentile", model_path, tmp, DATA[:2], mode=mode, streaming_bins=16, num_bins=8)
        out[mode] = cal.state.to_bytes()
    return out


@functools.lru_cache(maxsize=8)
def _members(raw: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for n, b in members.items():
            zf.writestr(n, b)
    return buf.getvalue()


def _with_header(raw: bytes, header: object) -> bytes:
    members = dict(_members(raw))
    text = json.dumps(header).encode()
    b = io.BytesIO()
    np.lib.format.write_array(b, np.frombuffer(text, np.uint8))
    members["header.npy"] = b.getvalue()
    return _zip(members)


@functools.lru_cache(maxsize=8)
def _header(raw: bytes) -> dict:
    b = _members(raw)["header.npy"]
    return json.loads(np.load(io.BytesIO(b)).tobytes())


def _must_be_clean(raw: bytes) -> None:
    try:
        CalibrationState.from_bytes(raw, what="fuzz.npz")
    except ValueError as exc:
        msg = str(exc)
        assert msg.startswith("Invalid calibration state fuzz.npz: "), msg
        assert "internal error" not in msg, msg


# Loader inputs: 2200 x 4 (bytes) + 1000 (header values) + 600 (arrays) = 10,400 cases.
FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), database=None)


@settings(FUZZ, max_examples=2200)
@given(
    mode=st.sampled_from(["streaming", "exact"]),
    seed=st.integers(0, 2**32 - 1),
    n_mut=st.integers(1, 8),
    cut=st.integers(0, 1 << 16),
)
def test_fuzz_mutated_bytes(small_files, mode, seed, n_mut, cut):
    """Random byte mutations of a valid file, with and without truncation (4 inputs per example)."""
    rng = np.random.default_rng(seed)
    base = np.frombuffer(small_files[mode], np.uint8)
    for variant in range(4):
        raw = base.copy()
        raw[rng.integers(0, raw.size, n_mut)] = rng.integers(0, 256, n_mut, dtype=np.uint8)
        if variant == 1:
            raw = raw[: cut % (raw.size + 1)]
        elif variant == 2:  # truncation only
            raw = base[: cut % (base.size + 1)]
        elif variant == 3:  # mutations inside the (small) header member only
            raw = base.copy()
            start = small_files[mode].find(b"header.npy") + 10
            raw[start + rng.integers(0, 600, n_mut)] = rng.integers(0, 256, n_mut, dtype=np.uint8)
        _must_be_clean(raw.tobytes())


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


@settings(FUZZ, max_examples=1000)
@given(data=st.data())
def test_fuzz_header_values(small_files, data):
    """Replace (or delete) 1-3 values anywhere in the JSON header by random JSON."""
    raw = small_files[data.draw(st.sampled_from(["streaming", "exact"]))]
    header = copy.deepcopy(_header(raw))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(header) if p]
        path = data.draw(st.sampled_from(paths))
        node = header
        for k in path[:-1]:
            node = node[k]
        if data.draw(st.integers(0, 9)) == 0 and isinstance(node, dict):
            del node[path[-1]]
        else:
            node[path[-1]] = data.draw(_json)
    _must_be_clean(_with_header(raw, header))


@settings(FUZZ, max_examples=600)
@given(data=st.data())
def test_fuzz_arrays(small_files, data):
    """Replace one array member by another array (other dtype/shape/values, NaN included)."""
    raw = small_files[data.draw(st.sampled_from(["streaming", "exact"]))]
    members = dict(_members(raw))
    name = data.draw(st.sampled_from(sorted(n for n in members if n != "header.npy")))
    dtype = data.draw(st.sampled_from(["<u8", "<i8", "<f8", "<f4", "<f2", "u1", ">f8"]))
    shape = data.draw(st.sampled_from([(0,), (3,), (17,), (2, 3), (2, 5), (1, 3), (16,)]))
    values = data.draw(st.lists(st.floats(allow_nan=True, width=16) | st.integers(0, 2**20), min_size=1, max_size=4))
    with np.errstate(all="ignore"):
        arr = np.resize(np.array(values, np.float64), shape).astype(dtype)
    b = io.BytesIO()
    np.lib.format.write_array(b, arr)
    members[name] = b.getvalue()
    if data.draw(st.booleans()):
        members.pop(data.draw(st.sampled_from(sorted(members))))
    _must_be_clean(_zip(members))


def test_loader_rejects_specific_problems(small_files, tmp_path):
    raw = small_files["exact"]
    header = _header(raw)
    cases = {
        "not a zip": b"hello",
        "unexpected zip member": _zip({**_members(raw), "evil.pkl": b"x"}),
        "dtype object": _zip({**_members(raw), "exact_hist.npy": _npy(np.array([1, None], dtype=object))}),
        "nested": _with_header(raw, {**header, "options": [[[[[[[[[[1]]]]]]]]]]}),
        "NaN where a number": _with_header(raw, {**header, "tensors": float("nan")}),
        "zip members": _zip({f"header{i}.npy": b"" for i in range(40)}),
    }
    for problem, data in cases.items():
        with pytest.raises(ValueError, match=problem):
            CalibrationState.from_bytes(data)
    # NaN in a number array
    members = dict(_members(raw))
    scal = np.load(io.BytesIO(members["exact_scalars.npy"])).copy()
    scal[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        CalibrationState.from_bytes(_zip({**members, "exact_scalars.npy": _npy(scal)}))
    # oversized declared size (zip bomb): rejected before decompressing
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("header.npy", _members(raw)["header.npy"])
        with zf.open("stream_bins.npy", "w", force_zip64=True) as f:
            chunk = b"\0" * (1 << 24)
            for _ in range(2):
                f.write(chunk)
    data = bytearray(bomb.getvalue())
    with pytest.raises(ValueError):
        CalibrationState.from_bytes(bytes(data))
    with pytest.raises(FileNotFoundError):
        CalibrationState.load(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="not a regular file"):
        CalibrationState.load(tmp_path)


def _npy(arr) -> bytes:
    b = io.BytesIO()
    np.lib.format.write_array(b, arr, allow_pickle=True)
    return b.getvalue()


# ----------------------------------------------------------------------------------------------
# atomic and concurrent writes
# ----------------------------------------------------------------------------------------------


def test_interrupted_write_keeps_previous_file(model_path, tmp_path, monkeypatch):
    path = tmp_path / "state.npz"
    old = _calibrate("entropy", model_path, tmp_path, DATA, mode="streaming").state
    old.save(path)
    before = path.read_bytes()
    new = _calibrate("entropy", model_path, tmp_path, SHARDS[0], mode="streaming").state

    real_write = os.write
    calls = {"n": 0}

    def interrupted(fd, data):
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise KeyboardInterrupt  # like Ctrl-C half-way through the write

    monkeypatch.setattr(os, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        new.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert CalibrationState.load(path).to_bytes() == old.to_bytes()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".histocal")) == []


def test_concurrent_writers(model_path, tmp_path):
    path = tmp_path / "state.npz"
    states = [_calibrate("entropy", model_path, tmp_path, s, mode="streaming").state for s in SHARDS]
    expected = {s.to_bytes() for s in states}
    states[0].save(path)
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(state):
        try:
            for _ in range(15):
                state.save(path)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader():
        try:
            while not stop.is_set():
                assert CalibrationState.load(path).to_bytes() in expected
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    writers = [threading.Thread(target=writer, args=(s,)) for s in states for _ in range(2)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in writers + readers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not errors, errors
    assert path.read_bytes() in expected
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".histocal")] == []


# ----------------------------------------------------------------------------------------------
# float16 |x| histograms whose edges end in +inf (ORT's extension past 65504)
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def f16_model_path(tmp_path_factory):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["X"], ["Y"], name="relu")],
        "f16_state_test",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT16, ["N", 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, ["N", 2])],
    )
    path = tmp_path_factory.mktemp("f16model") / "model.onnx"
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def _f16_calls(*rows):
    return tuple([{"X": np.array([r], np.float16)}] for r in rows)


# [0, 1664] in 1000 bins, then 54900: ORT's float16 edges end in 73 infinities; then infinities
# (binned in the last bin) and repeated f16 edges.
OPEN_TOP_CALLS = _f16_calls([0, 1664], [-54900, 3], [np.inf, -np.inf], [65504, 1])


def test_f16_open_top_state_round_trips(f16_model_path, tmp_path):
    cal = _calibrate(
        "percentile",
        f16_model_path,
        tmp_path,
        OPEN_TOP_CALLS,
        mode="exact",
        symmetric=True,
        num_bins=1000,
        percentile=99.9,
    )
    hist, edges = cal.state.exact.state("X").hist, cal.state.exact.state("X").edges
    assert edges.dtype == np.float16 and np.isposinf(edges[-1]) and hist[-1] == 2
    assert (edges[1:] == edges[:-1]).any()  # repeated float16 edges
    path = tmp_path / "open_top.npz"
    cal.save_state(path)
    state = CalibrationState.load(path)
    assert _exact_exports(state) == _exact_exports(cal.state)
    _assert_same(state.compute("percentile", symmetric=True, num_bins=1000, percentile=99.9), cal.compute_data())
    # a calibrator continuing from the file holds what one run over all the calls holds
    cont = _calibrator(
        "percentile", f16_model_path, tmp_path, mode="exact", symmetric=True, num_bins=1000, percentile=99.9
    )
    cont.load_state(path)
    cont.collect_data(*_f16_calls([np.inf, 7]))
    ref = _calibrate(
        "percentile",
        f16_model_path,
        tmp_path,
        OPEN_TOP_CALLS + _f16_calls([np.inf, 7]),
        mode="exact",
        symmetric=True,
        num_bins=1000,
        percentile=99.9,
    )
    assert _exact_exports(cont.state) == _exact_exports(ref.state)


def test_f16_open_top_states_merge(f16_model_path, tmp_path):
    kw = dict(mode="exact", symmetric=True, num_bins=1000, percentile=99.9)
    open_top = _calibrate("percentile", f16_model_path, tmp_path, OPEN_TOP_CALLS, **kw).state
    finite = _calibrate("percentile", f16_model_path, tmp_path, _f16_calls([0, 1664], [100, 3000]), **kw).state
    for a, b in ((open_top, finite), (finite, open_top), (open_top, open_top)):
        merged = a.merge(b)
        for name in merged.names:
            hist, edges = merged.exact.state(name).hist, merged.exact.state(name).edges
            held = a.exact.state(name).hist.sum() + b.exact.state(name).hist.sum()
            # b's infinities are kept where the merged edges end in +inf (ORT's rule never extends
            # to an infinity; extending to b's largest finite edge may overflow float16 as in ORT);
            # every finite value lands somewhere
            b_infs = b.exact.state(name).hist[-1] * np.isposinf(b.exact.state(name).edges[-1])
            lost = 0 if np.isposinf(edges[-1]) else b_infs
            assert hist.sum() == held - lost, (name, hist.sum(), held, lost)
            assert edges.dtype == np.float16
        merged.compute("percentile", symmetric=True, num_bins=1000, percentile=99.9)


def test_states_and_caches_share_one_file_mode(model_path, tmp_path):
    """One rule for the files histocal saves: 0600 like onnxruntime's calibration cache, whatever
    the umask and the mode of the file replaced (states were 0644, caches 0600)."""
    from histocal.io import cache

    cal = _calibrate("percentile", model_path, tmp_path, DATA)
    state_path, cache_path = tmp_path / "s.hcs", tmp_path / "c.json"
    for path in (state_path, cache_path):
        path.write_bytes(b"")
        path.chmod(0o644)
    old = os.umask(0o022)
    try:
        cal.save_state(state_path)
        cache.save_tensors_data(cal.compute_data(), cache_path)
    finally:
        os.umask(old)
    assert (state_path.stat().st_mode & 0o777) == (cache_path.stat().st_mode & 0o777) == 0o600

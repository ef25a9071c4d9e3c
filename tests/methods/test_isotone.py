"""isotone (docs/methods.md): histocal's summaries and scale against the numpy reference of
``isotone_refs.py`` (PPQ's observer read literally) on hypothesis-generated tensors; batch, order
and merge invariance of the summaries; the state file (version 2, old files readable); the range
as onnxruntime maps it; the calibrator, state and CLI paths on a small classifier."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from support import isotone_refs as I
from support.method_refs import ort_scale_zp
from support.profiles import examples
from support.summaries import isotone_pairs, restore_isotone

QTYPES = ["int8", "uint8", "int16", "uint16"]
DTYPES = [np.float16, np.float32, np.float64]


def _core():
    from histocal import _core

    return _core


def collected(batches: list[np.ndarray], name: str = "t"):
    s = _core().StreamHistograms(8, summaries=["isotone"])
    if batches:
        s.collect([(name, batches)])
    return s


def pairs_of(stream, name: str = "t") -> tuple[list[tuple[float, float]], int]:
    """The summary expanded back to one pair per row."""
    p = isotone_pairs(stream, name)
    l1, l2, rows, skipped = p.l1, p.l2, p.rows, p.skipped
    return [(a, b) for a, b, n in zip(l1.tolist(), l2.tolist(), rows.tolist()) for _ in range(n)], skipped


@st.composite
def tensors(draw):
    """Batches of one tensor: a shared class axis, varied leading shapes, few distinct values (ties,
    equal pairs across rows), sometimes NaN or infinities, one dtype."""
    dtype = draw(st.sampled_from(DTYPES))
    classes = draw(st.integers(0, 6))
    rank = draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scale = draw(st.sampled_from([1e-3, 1.0, 50.0]))
    out = []
    for _ in range(draw(st.integers(1, 4))):
        lead = tuple(int(x) for x in rng.integers(0, 4, max(rank - 1, 0)))
        shape = () if rank == 0 else (*lead, classes)
        levels = rng.integers(-6, 12, shape) if draw(st.booleans()) else rng.normal(2, 3, shape)
        x = np.asarray(levels * scale, dtype=dtype)
        if x.size and draw(st.integers(0, 4)) == 0:
            x.flat[int(rng.integers(0, x.size))] = rng.choice([np.nan, np.inf, -np.inf])
        out.append(np.asarray(x))
    return out


@given(tensors(), st.sampled_from(QTYPES), st.booleans())
@settings(max_examples=examples(120), deadline=None)
def test_summary_and_range_match_the_reference(batches, qtype, symmetric):
    s = collected(batches)
    want_pairs, want_skipped = I.top_two(batches)
    got_pairs, got_skipped = pairs_of(s)
    assert sorted(got_pairs) == sorted(want_pairs) and got_skipped == want_skipped
    low, high, notes = s.summary_ranges("isotone", qtype=qtype, symmetric=symmetric)[0]
    rows, skipped, fell_back = notes["rows"], notes["skipped"], bool(notes["fell_back"])
    assert (low, high) == I.isotone_range(batches, qtype, symmetric)
    assert rows == len(want_pairs) and skipped == want_skipped
    assert fell_back == (I.isotone_scale(want_pairs, qtype, symmetric) is None and bool(want_pairs))


def same_summary(a, b, name: str = "t") -> bool:
    x, y = isotone_pairs(a, name), isotone_pairs(b, name)
    return x.skipped == y.skipped and all(np.array_equal(getattr(x, k), getattr(y, k)) for k in ("l1", "l2", "rows"))


@given(tensors(), st.integers(0, 2**32 - 1))
@settings(max_examples=examples(60), deadline=None)
def test_batching_order_and_merge_do_not_change_the_summary(batches, seed):
    one = collected(batches)
    # the same rows one per batch, shuffled, one collect call each
    singles = [r[None] for b in batches if b.ndim >= 1 and b.size for r in b.reshape(-1, b.shape[-1])]
    singles += [b for b in batches if b.ndim == 0 or not b.size]
    np.random.default_rng(seed).shuffle(singles)
    split = _core().StreamHistograms(8, summaries=["isotone"])
    for b in singles:
        split.collect([("t", [b])])
    assert same_summary(split, one)
    # merging the collections of two parts gives the collection of all
    half = len(batches) // 2
    if half:
        a, b = collected(batches[:half]), collected(batches[half:])
        a.merge(b)
        assert same_summary(a, one)


@pytest.mark.parity
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("symmetric", [False, True])
def test_onnxruntime_maps_the_range_to_the_scale(qtype, symmetric):
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, (64, 10)).astype(np.float32)
    s = collected([logits])
    low, high, _ = s.summary_ranges("isotone", qtype=qtype, symmetric=symmetric)[0]
    pairs, _ = I.top_two([logits])
    scale = I.isotone_scale(pairs, qtype, symmetric)
    ort_scale, zp = ort_scale_zp(low, high, qtype, symmetric)
    assert np.isclose(ort_scale, scale, rtol=1e-6)
    if not symmetric or qtype in ("int8", "int16"):
        assert zp == 0


def test_limits_and_missing_summaries():
    plain = _core().StreamHistograms(8)
    plain.collect([("t", [np.ones((2, 3), np.float32)])])
    with pytest.raises(ValueError, match='"t".*isotone needs per-row top-two summaries'):
        plain.summary_ranges("isotone")
    assert isotone_pairs(plain, "t") is None
    s = collected([np.ones((2, 3), np.float32)])
    with pytest.raises(ValueError, match='"t".*not sorted'):
        restore_isotone(s, "t", [2.0, 1.0], [0.0, 0.0], [1, 1], 0, False)
    with pytest.raises(ValueError, match='"t".*finite'):
        restore_isotone(s, "t", [1.0], [2.0], [1], 0, False)
    # a merge with a collection that has no summaries drops them (some rows were never summarised)
    s.merge(plain)
    assert "isotone" not in s.summaries


def test_more_distinct_pairs_than_the_summary_holds():
    """Past ISOTONE_MAX_PAIRS distinct pairs a tensor's summary is marked overflowed, whatever the
    batching: collection goes on (other methods still work) and isotone names the tensor."""
    n = _core().ISOTONE_MAX_PAIRS + 1
    rows = np.stack([np.arange(n, dtype=np.float32), np.zeros(n, np.float32)], axis=1)
    whole = collected([rows])
    halves = collected([rows[: n // 2]])
    halves.merge(collected([rows[n // 2 :]]))
    for s in (whole, halves):
        assert isotone_pairs(s, "t").overflowed and not isotone_pairs(s, "t").l1.size
        with pytest.raises(ValueError, match='"t".*more than'):
            s.summary_ranges("isotone")
    assert whole.summary_ranges is not None and whole.counts("t").n_finite == 2 * n
    assert not isotone_pairs(collected([rows[: n - 1]]), "t").overflowed
    # the mark survives the state file
    from histocal.state import CalibrationState, Collection

    loaded = CalibrationState.from_bytes(CalibrationState(Collection("streaming", whole)).to_bytes())
    assert isotone_pairs(loaded.stream, "t").overflowed


# ---------------------------------------------------------------------------------------------
# The Python layer: state file, calibrator, CLI


def _classifier() -> onnx.ModelProto:
    """X[N,6] -MatMul-> logits[N,5] -Softmax-> probs; both are outputs."""
    w = numpy_helper.from_array(np.random.default_rng(1).normal(0, 1, (6, 5)).astype(np.float32), "W")
    nodes = [helper.make_node("MatMul", ["X", "W"], ["logits"]), helper.make_node("Softmax", ["logits"], ["probs"])]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, ["N", 5]) for t in ("probs", "logits")],
        initializer=[w],
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


def _feeds() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(2)
    return [{"X": rng.normal(0, 1, (n, 6)).astype(np.float32)} for n in (4, 7, 3)]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    import onnxruntime as ort

    tmp = tmp_path_factory.mktemp("isotone")
    path = tmp / "classifier.onnx"
    onnx.save(_classifier(), str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    runs = [session.run(None, f) for f in _feeds()]
    outputs = {"probs": [r[0] for r in runs], "logits": [r[1] for r in runs]}
    return {"path": path, "tmp": tmp, "outputs": outputs}


def test_calibrator_state_and_file(classifier):
    import histocal
    from histocal.state import CalibrationState

    cal = histocal.create_calibrator(
        str(classifier["path"]),
        augmented_model_path=str(classifier["tmp"] / "aug.onnx"),
        calibrate_method="isotone",
    )
    cal.collect_data(_feeds())
    got = cal.compute_data()
    want = I.isotone_range(classifier["outputs"]["probs"])
    assert (float(got["probs"].lowest[0]), float(got["probs"].highest[0])) == tuple(np.float32(want))
    state = cal.state
    raw = state.to_bytes()
    loaded = CalibrationState.from_bytes(raw)
    for sym in (False, True):
        a, b = state.compute("isotone", symmetric=sym), loaded.compute("isotone", symmetric=sym)
        assert float(a["probs"].highest[0]) == float(b["probs"].highest[0])
    assert b'"version": 2' in raw
    # a state without the summaries is still version 1 (earlier histocal versions read it), and
    # isotone on it is an error naming the tensor
    plain = histocal.create_calibrator(
        str(classifier["path"]), augmented_model_path=str(classifier["tmp"] / "aug2.onnx"), calibrate_method="mse"
    )
    plain.collect_data(_feeds())
    assert b'"version": 1' in plain.state.to_bytes()
    with pytest.raises(ValueError, match="isotone needs per-row"):
        CalibrationState.from_bytes(plain.state.to_bytes()).compute("isotone")

    # corrupted summaries are refused with the file's problem named
    def edited(member: str, change) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(raw)) as zin, zipfile.ZipFile(buf, "w") as zout:
            for info in zin.infolist():
                data = zin.read(info)
                if info.filename == member:
                    arr = np.load(io.BytesIO(data)).copy()
                    change(arr)
                    out = io.BytesIO()
                    np.save(out, arr)
                    data = out.getvalue()
                zout.writestr(info, data)
        return buf.getvalue()

    def l2_above_l1(a):
        a[0, 1] = a[0, 0] + 1.0

    def too_many_pairs(a):
        a[0, 0] = (1 << 20) + 1

    with pytest.raises(ValueError, match="Invalid calibration state.*isotone.*finite l1 >= l2"):
        CalibrationState.from_bytes(edited("isotone_pairs.npy", l2_above_l1))
    with pytest.raises(ValueError, match="Invalid calibration state.*isotone_tensors"):
        CalibrationState.from_bytes(edited("isotone_tensors.npy", too_many_pairs))


@pytest.mark.parity
def test_cli_calibrate_with_isotone(classifier, tmp_path):
    from onnxruntime.quantization import calibrate as ort_calibrate

    from histocal.cli.main import main

    data = tmp_path / "data"
    data.mkdir()
    for i, f in enumerate(_feeds()):
        np.save(data / f"b{i}.npy", f["X"])
    cache = tmp_path / "iso.json"
    args = ["calibrate", str(classifier["path"]), "--data", str(data), "--method", "isotone", "--qtype", "uint8"]
    assert main([*args, "--cache", str(cache)]) == 0
    got = ort_calibrate.load_tensors_data(str(cache))
    want = I.isotone_range(classifier["outputs"]["probs"], "uint8")
    assert float(np.asarray(got["probs"].highest).reshape(-1)[0]) == float(np.float32(want[1]))


def test_quantize_static_puts_the_isotone_scale_in_the_model(classifier, tmp_path):
    """histocal.quantize_static with isotone: the QDQ scale of ``logits`` is isotone's scale
    (uint8, asymmetric: zero point 0). (onnxruntime fixes a Softmax output's range to (0, 1).)"""
    from onnxruntime.quantization import QuantType

    import histocal

    out = tmp_path / "q.onnx"
    histocal.quantize_static(
        str(classifier["path"]),
        str(out),
        _feeds(),
        calibrate_method="isotone",
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    pairs, _ = I.top_two(classifier["outputs"]["logits"])
    scale = I.isotone_scale(pairs, "uint8", False)
    model = onnx.load(str(out))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    # onnxruntime names a graph output's quantization parameters after it
    got_scale, got_zp = inits["logits_scale"], inits["logits_zero_point"]
    assert np.isclose(float(got_scale), scale, rtol=1e-6) and int(got_zp) == 0

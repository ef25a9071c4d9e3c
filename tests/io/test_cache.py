"""histocal.cache against onnxruntime's own calibration cache code (docs/ort_parity.md, *Calibration cache*).

* writing: byte-identical files and the same 0600 mode as ORT's ``save_tensors_data``, for every method's
  layout, float16/float32, numpy scalars, 0-d and per-channel arrays, NaN/Inf/-0.0;
* reading: histocal <-> ORT loads give the same objects both ways; ORT's ``quantize_static`` accepts a
  histocal-written cache; ``check_cache`` follows quantize_static's hit/miss logic and error texts;
* safety: malformed, oversized, deeply nested and wrongly typed files only ever raise ValueError (fuzzed);
* atomicity: interrupted writes keep the old file and leave no temp files; concurrent writers never corrupt.

Results are compared as maps (ORT's tensor order follows Python set order).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantFormat, quantize_static
from onnxruntime.quantization import calibrate as ort
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData
from support.parity import quiet
from support.profiles import examples

from histocal.io import cache

METHODS = list(CalibrationMethod)
FLOAT_DTYPES = [np.float16, np.float32]


# ----------------------------------------------------------------------------------------------
# Comparing TensorsData
# ----------------------------------------------------------------------------------------------


def canonical(value):
    """Exact, NaN-safe identity of a TensorData attribute: type, dtype, shape and bits."""
    if isinstance(value, np.ndarray):
        return ("ndarray", str(value.dtype), value.shape, value.tobytes())
    if isinstance(value, np.generic):
        return (type(value).__name__, value.tobytes())
    if isinstance(value, float):
        return ("float", np.float64(value).tobytes())
    return (type(value).__name__, value)


def as_map(td: TensorsData) -> dict:
    method = td.calibration_method
    return {
        "method": method if isinstance(method, CalibrationMethod) else ("raw", json.dumps(method)),
        "tensors": {name: [(k, canonical(getattr(d, k))) for k in d._attrs] for name, d in td.items()},
    }


def assert_same(a: TensorsData, b: TensorsData) -> None:
    assert type(a) is TensorsData and type(b) is TensorsData
    assert as_map(a) == as_map(b)


def ort_load(path):
    with quiet():  # ORT warns on overflowing casts
        return ort.load_tensors_data(path)


def temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith((".calibcache_", ".histocal_")))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder for the many-example properties: tmpfs when available (fsync and rename flushes on a disk
    cost milliseconds per example)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        folder = Path(tempfile.mkdtemp(prefix="histocal-test-", dir=shm))
        yield folder
        shutil.rmtree(folder, ignore_errors=True)
    else:
        yield tmp_path_factory.mktemp("cache")


# ----------------------------------------------------------------------------------------------
# TensorsData strategies: each method's layout (section 7.1) with free choices of value forms
# ----------------------------------------------------------------------------------------------


def floats_of(dtype):
    width = 16 if dtype == np.float16 else 32
    return st.floats(width=width, allow_nan=True, allow_infinity=True).map(dtype)


@st.composite
def float_values(draw, dtype, forms=("scalar", "0d", "1", "channels", "nd")):
    """A float attribute: np scalar, 0-d array, shape (1,), per-channel (C,) or (1, C, 1) array."""
    form = draw(st.sampled_from(forms))
    if form == "scalar":
        return draw(floats_of(dtype))
    if form == "0d":
        shape: tuple = ()
    elif form == "1":
        shape = (1,)
    elif form == "channels":
        shape = (draw(st.integers(0, 5)),)
    else:
        shape = (1, draw(st.integers(1, 4)), 1)
    size = math.prod(shape)
    return np.array(draw(st.lists(floats_of(dtype), min_size=size, max_size=size)), dtype).reshape(shape)


def int_arrays(size):
    return st.lists(st.integers(0, 2**63 - 1), min_size=size, max_size=size).map(lambda v: np.array(v, np.int64))


@st.composite
def tensor_datas(draw, method, dtype):
    if method == CalibrationMethod.MinMax:
        return TensorData(lowest=draw(float_values(dtype)), highest=draw(float_values(dtype)))
    n = draw(st.integers(1, 6))
    if method == CalibrationMethod.Entropy:
        return TensorData(
            lowest=draw(float_values(dtype, ("scalar", "0d"))),
            highest=draw(float_values(dtype, ("scalar", "0d"))),
            hist=draw(int_arrays(n)),
            bins=np.array(draw(st.lists(floats_of(dtype), min_size=n + 1, max_size=n + 1)), dtype),
        )
    if method == CalibrationMethod.Percentile:
        count = st.integers(0, 2**63 - 1)
        return TensorData(
            lowest=draw(float_values(dtype, ("scalar", "0d"))),
            highest=draw(float_values(dtype, ("scalar", "0d"))),
            hist=draw(st.one_of(count, count.map(np.int64))),
            bins=draw(st.one_of(count, count.map(np.int64))),
        )
    return TensorData(
        avg=draw(float_values(dtype, ("scalar", "0d"))),
        std=draw(float_values(dtype, ("scalar", "0d"))),
        hist=draw(int_arrays(n)),
        hist_edges=np.array(draw(st.lists(floats_of(dtype), min_size=n + 1, max_size=n + 1)), dtype),
        lowest=draw(float_values(dtype, ("scalar", "0d"))),
        highest=draw(float_values(dtype, ("scalar", "0d"))),
    )


@st.composite
def tensors_datas(draw):
    method = draw(st.sampled_from(METHODS))
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    names = draw(st.lists(st.text(max_size=6), max_size=4, unique=True))
    return TensorsData(method, {name: draw(tensor_datas(method, dtype)) for name in names})


# ----------------------------------------------------------------------------------------------
# Writing and reading, against ORT
# ----------------------------------------------------------------------------------------------


@settings(max_examples=examples(400))
@given(td=tensors_datas(), smooth_quant=st.booleans())
def test_save_load_matches_ort(workdir, td, smooth_quant):
    ours, theirs = workdir / "ours.json", workdir / "theirs.json"
    cache.save_tensors_data(td, ours, smooth_quant=smooth_quant)
    ort.save_tensors_data(td, theirs, smooth_quant=smooth_quant)
    assert ours.read_bytes() == theirs.read_bytes()
    assert (ours.stat().st_mode & 0o777) == (theirs.stat().st_mode & 0o777) == 0o600

    reference = ort_load(theirs)
    assert_same(cache.load_tensors_data(theirs), reference)  # ORT-written -> histocal
    assert_same(ort_load(ours), reference)  # histocal-written -> ORT
    assert_same(cache.load_tensors_data(ours), reference)
    assert temp_files(workdir) == []


def test_load_conversions_like_ort(tmp_path):
    """Section 7.2: np scalars come back as 0-d float32 arrays (f16 too), arrays keep dtype, plain ints stay."""
    td = TensorsData(
        CalibrationMethod.Percentile,
        {
            "a": TensorData(lowest=np.float16(-2.0), highest=np.array(3.5, np.float16), hist=np.int64(7), bins=3),
            "b": TensorData(
                lowest=np.array([1.0, -0.0], np.float32), highest=np.array([[np.inf], [np.nan]], np.float32)
            ),
        },
    )
    path = tmp_path / "c.json"
    cache.save_tensors_data(td, path)
    loaded = cache.load_tensors_data(path)
    assert_same(loaded, ort_load(path))
    a, b = loaded["a"], loaded["b"]
    assert a.lowest.dtype == np.float32 and a.lowest.shape == () and a.lowest == -2.0
    assert a.highest.dtype == np.float16 and a.highest.shape == ()
    assert type(a.hist) is int and type(a.bins) is int
    assert b.highest.shape == (2, 1) and np.isnan(b.highest[1, 0]) and np.signbit(b.lowest[1])
    assert path.read_bytes().count(b"Infinity") == 1 and b"NaN" in path.read_bytes()


def test_literal_example_from_spec(tmp_path):
    td = TensorsData(
        CalibrationMethod.MinMax,
        {"Y": TensorData(lowest=np.array([0.0], np.float32), highest=np.array([3.0], np.float32))},
    )
    cache.save_tensors_data(td, tmp_path / "c.json")
    assert (tmp_path / "c.json").read_text() == (
        '{"CLS": "TensorsData", "data": {"Y": {"lowest": {"data": [0.0], "dtype": "float32", "CLS": "numpy.array"}, '
        '"highest": {"data": [3.0], "dtype": "float32", "CLS": "numpy.array"}, "CLS": "TensorData"}}, '
        '"calibration_method": {"CLS": "CalibrationMethod", "value": "CalibrationMethod.MinMax"}, "smooth_quant": false}'
    )


def test_unserializable_value_raises_like_ort_and_keeps_old_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_bytes(b"old")
    td = TensorsData(CalibrationMethod.Percentile, {"a": TensorData(lowest=np.float32(1), hist=object())})
    with pytest.raises(TypeError) as ours:
        cache.save_tensors_data(td, path)
    with pytest.raises(TypeError) as theirs:
        ort.save_tensors_data(td, path)
    assert str(ours.value) == str(theirs.value)
    assert path.read_bytes() == b"old" and temp_files(tmp_path) == []


def test_save_creates_parent_folders(tmp_path):
    path = tmp_path / "a" / "b" / "c.json"
    cache.save_tensors_data(TensorsData(CalibrationMethod.MinMax, {}), path)
    assert cache.load_tensors_data(path).calibration_method == CalibrationMethod.MinMax


# ----------------------------------------------------------------------------------------------
# Real calibrator output and quantize_static
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def conv_model(tmp_path_factory) -> Path:
    """X -> Conv -> Relu -> Y. IR 10 / opset 17: onnxruntime 1.31 refuses onnx 1.23's default IR version."""
    weights = numpy_helper.from_array(np.random.default_rng(0).standard_normal((2, 1, 3, 3)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["X", "W"], ["C"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["C"], ["Y"])],
        "conv_relu",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2, 4, 4])],
        [weights],
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path_factory.mktemp("model") / "conv.onnx"
    onnx.save(model, path)
    return path


class Reader(ort.CalibrationDataReader):
    def __init__(self, batches: int = 3):
        rng = np.random.default_rng(1)
        self.batches = iter([{"X": rng.standard_normal((1, 1, 4, 4)).astype(np.float32)} for _ in range(batches)])

    def get_next(self):
        return next(self.batches, None)


@pytest.fixture(scope="module")
def calibrated(conv_model, tmp_path_factory) -> dict:
    """ORT's own compute_data() result for every method."""
    folder = tmp_path_factory.mktemp("calib")
    results = {}
    for method in METHODS:
        with quiet():
            calibrator = ort.create_calibrator(
                conv_model, None, augmented_model_path=str(folder / f"aug_{method.name}.onnx"), calibrate_method=method
            )
            calibrator.collect_data(Reader())
            results[method] = calibrator.compute_data()
    return results


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_real_calibration_results_round_trip(calibrated, method, tmp_path):
    td = calibrated[method]
    cache.save_tensors_data(td, tmp_path / "ours.json")
    ort.save_tensors_data(td, tmp_path / "theirs.json")
    assert (tmp_path / "ours.json").read_bytes() == (tmp_path / "theirs.json").read_bytes()
    reference = ort_load(tmp_path / "theirs.json")
    assert_same(cache.load_tensors_data(tmp_path / "theirs.json"), reference)
    assert_same(ort_load(tmp_path / "ours.json"), reference)
    assert set(reference) == {"X", "C", "Y"}


def quantize(model: Path, out: Path, method, cache_path: Path, reader=None) -> bytes:
    with quiet():
        quantize_static(
            model, out, reader, quant_format=QuantFormat.QDQ, calibrate_method=method, calibration_cache_path=cache_path
        )
    return out.read_bytes()


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_ort_quantize_static_uses_histocal_cache(conv_model, calibrated, method, tmp_path):
    """A histocal-written cache is a hit in ORT (no reader needed) and quantizes exactly like ORT's own cache."""
    ours, theirs = tmp_path / "ours.json", tmp_path / "theirs.json"
    cache.save_tensors_data(calibrated[method], ours)
    ort.save_tensors_data(calibrated[method], theirs)
    model_ours = quantize(conv_model, tmp_path / "q_ours.onnx", method, ours)
    model_theirs = quantize(conv_model, tmp_path / "q_theirs.onnx", method, theirs)
    assert model_ours == model_theirs
    assert b"QuantizeLinear" in model_ours


def test_ort_quantize_static_reads_the_cached_ranges(conv_model, tmp_path):
    """The cached values really drive ORT's quantization: a changed range changes Y's scale."""
    scales = []
    for highest in (6.0, 12.0):
        td = TensorsData(
            CalibrationMethod.MinMax,
            {
                name: TensorData(lowest=np.array([-1.0], np.float32), highest=np.array([highest], np.float32))
                for name in "XCY"
            },
        )
        cache.save_tensors_data(td, tmp_path / "c.json")
        quantized = quantize(conv_model, tmp_path / "q.onnx", CalibrationMethod.MinMax, tmp_path / "c.json")
        model = onnx.load_from_string(quantized)
        scales.append(next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "Y_scale"))
    np.testing.assert_allclose(scales, [7 / 255, 13 / 255], rtol=1e-6)  # uint8: (highest - lowest) / 255


def test_ort_written_cache_from_quantize_static_loads(conv_model, tmp_path):
    path = tmp_path / "c.json"
    quantize(conv_model, tmp_path / "q.onnx", CalibrationMethod.MinMax, path, Reader())  # miss: ORT writes
    assert_same(cache.load_tensors_data(path), ort_load(path))
    assert cache.check_cache(path, CalibrationMethod.MinMax, False) is not None


# ----------------------------------------------------------------------------------------------
# check_cache (quantize_static's hit/miss logic, section 7.3)
# ----------------------------------------------------------------------------------------------


def ort_error(conv_model, tmp_path, method, cache_path) -> str:
    with pytest.raises(ValueError) as err:
        quantize(conv_model, tmp_path / "q.onnx", method, cache_path)
    return str(err.value)


def test_check_cache_hit_and_miss(calibrated, tmp_path):
    path = tmp_path / "c.json"
    assert cache.check_cache(path, CalibrationMethod.MinMax, False) is None  # missing: miss
    cache.save_tensors_data(calibrated[CalibrationMethod.MinMax], path, smooth_quant=True)
    hit = cache.check_cache(str(path), CalibrationMethod.MinMax, True)
    assert_same(hit, ort_load(path))


def test_check_cache_missing_smooth_quant_key_means_false(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(
        '{"data": {}, "calibration_method": {"CLS": "CalibrationMethod", "value": "CalibrationMethod.Entropy"}}'
    )
    assert cache.check_cache(path, CalibrationMethod.Entropy, False) is not None
    assert cache.check_cache(path, CalibrationMethod.Entropy, True) is None


def test_check_cache_smooth_quant_mismatch_warns_and_skips_method_check(calibrated, tmp_path, caplog):
    path = tmp_path / "c.json"
    cache.save_tensors_data(calibrated[CalibrationMethod.Percentile], path, smooth_quant=False)
    with caplog.at_level(logging.WARNING, logger="histocal.io.cache"):
        assert cache.check_cache(path, CalibrationMethod.MinMax, True) is None
    assert caplog.messages == [
        f"Calibration cache at {path} was produced with smooth_quant=False; current run uses smooth_quant=True. "
        "Recomputing ranges and overwriting cache."
    ]


def test_check_cache_method_mismatch_error_like_ort(conv_model, calibrated, tmp_path):
    path = tmp_path / "c.json"
    cache.save_tensors_data(calibrated[CalibrationMethod.Percentile], path)
    with pytest.raises(ValueError) as ours:
        cache.check_cache(path, CalibrationMethod.MinMax, False)
    expected = (
        f"Calibration cache at {path} was produced with CalibrationMethod.Percentile, but quantize_static was called "
        "with calibrate_method=CalibrationMethod.MinMax. Delete the cache or pass a matching calibrate_method."
    )
    assert str(ours.value) == expected == ort_error(conv_model, tmp_path, CalibrationMethod.MinMax, path)


def test_check_cache_raw_method_value_kept_like_ort(conv_model, tmp_path):
    """ORT keeps a non-enum calibration_method as is, so it never matches: a method-mismatch error."""
    path = tmp_path / "c.json"
    path.write_text('{"data": {}, "calibration_method": 0, "smooth_quant": false}')
    assert cache.load_tensors_data(path).calibration_method == 0 == ort_load(path).calibration_method
    with pytest.raises(ValueError) as ours:
        cache.check_cache(path, CalibrationMethod.MinMax, False)
    assert str(ours.value) == ort_error(conv_model, tmp_path, CalibrationMethod.MinMax, path)


def test_check_cache_directory_like_ort(conv_model, tmp_path):
    folder = tmp_path / "dir.json"
    folder.mkdir()
    with pytest.raises(ValueError) as ours:
        cache.check_cache(folder, CalibrationMethod.MinMax, False)
    assert str(ours.value) == f"calibration_cache_path is not a file: {folder}"
    assert str(ours.value) == ort_error(conv_model, tmp_path, CalibrationMethod.MinMax, folder)


def test_check_cache_invalid_file_is_value_error(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        cache.check_cache(path, CalibrationMethod.MinMax, True)


# ----------------------------------------------------------------------------------------------
# Loader errors: ORT's texts where ORT has them, ValueError naming the file for everything else
# ----------------------------------------------------------------------------------------------


def test_missing_and_directory_like_ort(tmp_path):
    missing = tmp_path / "nope.json"
    for loader in (cache.load_tensors_data, ort.load_tensors_data):
        with pytest.raises(FileNotFoundError, match=f"^{re.escape(f'Calibration cache not found: {missing}')}$"):
            loader(missing)
        with pytest.raises(ValueError, match=f"^{re.escape(f'Calibration cache path is not a file: {tmp_path}')}$"):
            loader(tmp_path)


VALID = {
    "CLS": "TensorsData",
    "data": {
        "t": {
            "lowest": 1.5,
            "highest": {"data": [2.0, 3.0], "dtype": "float32", "CLS": "numpy.array"},
            "hist": 4,
            "bins": {"data": [1, 2], "dtype": "int64", "CLS": "numpy.array"},
            "CLS": "TensorData",
        }
    },
    "calibration_method": {"CLS": "CalibrationMethod", "value": "CalibrationMethod.Percentile"},
    "smooth_quant": False,
}


def variant(*path, value=None, delete: bool = False) -> dict:
    """VALID with the value at ``path`` replaced (or deleted)."""
    doc = json.loads(json.dumps(VALID))
    node = doc
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


def in_tensor(key: str, value) -> dict:
    return variant("data", "t", key, value=value)


ORT_ERRORS = {  # same text as ORT's ValueError
    "unknown key": in_tensor("foo", 1),
    "list value": in_tensor("lowest", [1.0]),
    "float64 value": in_tensor("lowest", {"data": 1.0, "dtype": "float64", "CLS": "numpy.array"}),
    "string value": in_tensor("lowest", "1.0"),
    "null value": in_tensor("avg", None),
}


@pytest.mark.parametrize("name", ORT_ERRORS)
def test_value_errors_with_ort_text(tmp_path, name):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(ORT_ERRORS[name]))
    with pytest.raises(ValueError) as theirs:
        ort_load(path)
    with pytest.raises(ValueError) as ours:
        cache.load_tensors_data(path)
    assert str(ours.value) == f"Invalid calibration cache {path}: {theirs.value}"


def arr(data, dtype="float32"):
    return {"data": data, "dtype": dtype, "CLS": "numpy.array"}


BAD_DOCUMENTS = {
    # structure
    "top-level list": [VALID],
    "top-level null": None,
    "no data": variant("data", delete=True),
    "no method": variant("calibration_method", delete=True),
    "data is list": variant("data", value=[]),
    "entry is list": variant("data", "t", value=[]),
    "key self": in_tensor("self", 1),  # would be a TypeError in ORT's TensorData(**kwargs)
    "unknown method": variant(
        "calibration_method", value={"CLS": "CalibrationMethod", "value": "CalibrationMethod.Foo"}
    ),
    "method value int": variant("calibration_method", value={"CLS": "CalibrationMethod", "value": 2}),
    "array without dtype": in_tensor("highest", {"data": [1.0], "CLS": "numpy.array"}),
    "array without data": in_tensor("highest", {"dtype": "float32", "CLS": "numpy.array"}),
    # wrong types and values
    "bool as float": in_tensor("lowest", True),
    "float hist": in_tensor("hist", 1.5),
    "nan hist": in_tensor("hist", float("nan")),
    "inf bins": in_tensor("bins", float("inf")),
    "list hist": in_tensor("hist", [1, 2]),
    "string hist": in_tensor("hist", "1"),
    "hist beyond int64": in_tensor("hist", 2**63),
    "float out of f32 range": in_tensor("lowest", 1e39),
    "huge int as float": in_tensor("lowest", 10**80),
    "f16 overflow": in_tensor("highest", arr([70000.0], "float16")),
    "strings in array": in_tensor("highest", arr(["1.5"])),
    "null in array": in_tensor("highest", arr([None])),
    "bool in array": in_tensor("highest", arr([True])),
    "dict in array": in_tensor("highest", arr([{}])),
    "ragged": in_tensor("highest", arr([[1.0], [1.0, 2.0]])),
    "ragged empty": in_tensor("bins", arr([[], [1]], "int64")),
    "float in int array": in_tensor("bins", arr([1.5], "int64")),
    "nan in int array": in_tensor("bins", arr([float("nan")], "int64")),
    "int64 overflow": in_tensor("bins", arr([2**63], "int64")),
    "uint8 overflow": in_tensor("bins", arr([256], "uint8")),
    "negative uint": in_tensor("bins", arr([-1], "uint64")),
    # dtypes numpy accepts but ORT never writes
    **{
        f"dtype {d!r}": in_tensor("bins", arr([1], d))
        for d in [
            "object",
            "O",
            "V8",
            "(1000000000,)float32",
            "(100000,100000)int64",
            "bool",
            "complex64",
            "<U5",
            "M8[s]",
            "<f4",
            "f4",
            "float",
            "S1",
            "",
            5,
            None,
            ["float32"],
        ]
    },
}


@pytest.mark.parametrize("name", BAD_DOCUMENTS)
def test_bad_documents_raise_value_error(tmp_path, name):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(BAD_DOCUMENTS[name]))
    with pytest.raises(ValueError) as err:
        cache.load_tensors_data(path)
    assert type(err.value) is ValueError and str(path) in str(err.value)


BAD_TEXTS = {
    "empty": b"",
    "truncated": json.dumps(VALID).encode()[:-3],
    "garbage": b"\x00\x01{",
    "not utf-8": json.dumps(VALID).encode().replace(b"Percentile", b"Percentil\xe9"),
    "utf-8 bom": b"\xef\xbb\xbf" + json.dumps(VALID).encode(),
    "trailing data": json.dumps(VALID).encode() + b" []",
    "deep arrays": b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "deep unclosed": b"[" * 1_000_000,
    "deep objects": b'{"a": ' * 50_000 + b"1" + b"}" * 50_000,
    "deep in array data": json.dumps(in_tensor("highest", arr("SENTINEL")))
    .encode()
    .replace(b'"SENTINEL"', b"[" * 40 + b"1.0" + b"]" * 40),
    "5000-digit int": json.dumps(in_tensor("hist", "SENTINEL")).encode().replace(b'"SENTINEL"', b"9" * 5000),
    "101-digit int": json.dumps(in_tensor("hist", "SENTINEL")).encode().replace(b'"SENTINEL"', b"9" * 101),
    "lowercase nan": json.dumps(VALID).encode().replace(b"1.5", b"nan"),
}


@pytest.mark.parametrize("name", BAD_TEXTS)
def test_bad_texts_raise_value_error(tmp_path, name):
    path = tmp_path / "c.json"
    path.write_bytes(BAD_TEXTS[name])
    with pytest.raises(ValueError) as err:
        cache.load_tensors_data(path)
    assert type(err.value) is ValueError and str(path) in str(err.value)


def test_brackets_inside_strings_do_not_count_as_nesting(tmp_path):
    name = "a[" * 200 + '"{\\"' + "}" * 300
    td = TensorsData(CalibrationMethod.MinMax, {name: TensorData(lowest=np.float32(1), highest=np.float32(2))})
    cache.save_tensors_data(td, tmp_path / "c.json")
    assert_same(cache.load_tensors_data(tmp_path / "c.json"), ort_load(tmp_path / "c.json"))


def test_nan_and_infinity_tokens_accepted_like_ort(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(in_tensor("highest", arr([float("nan"), float("-inf"), 1e400]))))
    assert b"-Infinity" in path.read_bytes()
    assert_same(cache.load_tensors_data(path), ort_load(path))


def test_oversized_file_rejected_before_reading(tmp_path, monkeypatch):
    path = tmp_path / "big.json"
    with open(path, "wb") as f:  # sparse: no disk space, and reading it would take seconds
        f.truncate(cache.MAX_CACHE_BYTES + 1)
    real_fdopen = os.fdopen

    class NoRead:
        def __init__(self, *args, **kwargs):
            self.file = real_fdopen(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def fileno(self):
            return self.file.fileno()

        def read(self, *args):
            raise AssertionError("the file was read")

    with monkeypatch.context() as patch:
        patch.setattr(os, "fdopen", NoRead)
        with pytest.raises(ValueError, match="more than the limit"):
            cache.load_tensors_data(path)
    monkeypatch.setattr(cache, "MAX_CACHE_BYTES", 100)
    path.write_text(json.dumps(VALID))
    with pytest.raises(ValueError, match="more than the limit of 100"):
        cache.load_tensors_data(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_is_not_a_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a file"):
        cache.load_tensors_data(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        cache.read_json_file(fifo)  # opened non-blocking: must not hang


def test_read_json_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"a": [1, NaN, {"b": "[[[["}]}')
    doc = cache.read_json_file(path, max_bytes=100, max_depth=3)
    assert doc["a"][0] == 1 and math.isnan(doc["a"][1])
    with pytest.raises(ValueError, match="nested 3 levels"):
        cache.read_json_file(path, max_depth=2)
    with pytest.raises(ValueError, match="limit of 10"):
        cache.read_json_file(path, max_bytes=10)
    with pytest.raises(FileNotFoundError):
        cache.read_json_file(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="Invalid JSON file"):
        cache.read_json_file(tmp_path)


# ----------------------------------------------------------------------------------------------
# Fuzzing the loader: only ValueError or success, and every success equals ORT's own load
# ----------------------------------------------------------------------------------------------
# Hypothesis draws a seed (plus the base document); the mutation is built from random.Random(seed), which keeps
# each example cheap. 10,300 loader inputs in total over the five tests below.


def _base_documents() -> list[bytes]:
    f16, f32 = np.float16, np.float32
    docs = [
        TensorsData(
            CalibrationMethod.MinMax,
            {
                "a": TensorData(lowest=np.array([-1.5, 0.25], f32), highest=np.array([[2.0], [3.0]], f32)),
                "b[0]": TensorData(lowest=np.array([np.inf], f32), highest=np.array([-np.inf], f32)),
            },
        ),
        TensorsData(
            CalibrationMethod.Entropy,
            {
                "e": TensorData(
                    lowest=f16(-1), highest=f16(2), hist=np.array([3, 0, 5]), bins=np.array([-1, 0, 1, 2], f16)
                ),
            },
        ),
        TensorsData(
            CalibrationMethod.Percentile,
            {
                "p": TensorData(lowest=f32(-0.5), highest=np.array(7.25, f32), hist=3, bins=1),
            },
        ),
        TensorsData(
            CalibrationMethod.Distribution,
            {
                "d": TensorData(
                    avg=np.array(0.5, f32),
                    std=np.array(np.nan, f32),
                    hist=np.array([1, 2]),
                    hist_edges=np.array([0, 1, 2], f32),
                    lowest=f32(-np.inf),
                    highest=f32(1e-5),
                ),
            },
        ),
    ]
    return [json.dumps(td.to_dict() | {"smooth_quant": False}, cls=cache._CacheEncoder).encode() for td in docs]


BASE_DOCUMENTS = _base_documents()
BASES = st.integers(0, len(BASE_DOCUMENTS) - 1)
SEEDS = st.integers(0, 2**64 - 1)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _paths(child, (*prefix, index))


BASE_PATHS = [list(_paths(json.loads(doc))) for doc in BASE_DOCUMENTS]
DTYPE_NAMES = [
    "float16",
    "float32",
    "float64",
    "int64",
    "int32",
    "uint8",
    "uint64",
    "object",
    "V8",
    "(1000000000,)f4",
    "bool",
    "<f4",
    "complex64",
    "U3",
    "M8[s]",
    "",
    "float128",
]
KEYS = [
    "CLS",
    "data",
    "dtype",
    "lowest",
    "highest",
    "hist",
    "bins",
    "avg",
    "std",
    "hist_edges",
    "value",
    "smooth_quant",
    "calibration_method",
    "self",
    "__class__",
    "",
]
STRINGS = (
    KEYS
    + DTYPE_NAMES
    + [
        "numpy.array",
        "CalibrationMethod",
        "CalibrationMethod.MinMax",
        "Entropy",
        "TensorData",
        "1.5",
        "NaN",
        "\u00e9\u4e2d",
        "\ud800",
    ]
)
FLOATS = [
    0.0,
    -0.0,
    1.5,
    -2.25,
    1e-5,
    5e-324,
    1e39,
    -1e39,
    65504.0,
    65520.0,
    3.4028235677973366e38,
    1e308,
    float("nan"),
    float("inf"),
    float("-inf"),
]
INTS = [0, 1, -1, 7, 255, 256, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**30]
RAW_TOKENS = [
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1e400",
    b"-1e999999999",
    b"9" * 30,
    b"-" + b"9" * 5000,
    b"1" * 101,
    b"0.1e-400",
    b"4.9e-324",
    b"65520.0",
    b"3.4028235677973366e+38",
    b"18446744073709551616",
    b"-0.0",
    b"1" + b"0" * 4400,
    b"0." + b"1" * 10000,
]


def random_number(rng: random.Random):
    roll = rng.random()
    if roll < 0.3:
        return rng.choice(FLOATS)
    if roll < 0.5:
        return rng.choice(INTS)
    return rng.uniform(-1e6, 1e6) if roll < 0.8 else rng.randint(-1000, 1000)


def random_numbers(rng: random.Random, depth: int = 0):
    """A numeric list, usually rectangular, sometimes ragged or with a stray non-number."""
    if depth > 2 or rng.random() < 0.3:
        return random_number(rng) if rng.random() < 0.95 else random_json(rng, 3)
    width = rng.randint(0, 3)
    return [random_numbers(rng, depth + 1) for _ in range(width)]


def random_json(rng: random.Random, depth: int = 0):
    kinds = ["null", "bool", "number", "number", "string"] + ["list", "dict", "array", "array", "method"] * (depth < 3)
    kind = rng.choice(kinds)
    if kind == "null":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "number":
        return random_number(rng)
    if kind == "string":
        return rng.choice(STRINGS)
    if kind == "list":
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "dict":
        return {rng.choice(KEYS): random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if kind == "array":
        array = {"data": random_numbers(rng), "dtype": rng.choice(DTYPE_NAMES), "CLS": "numpy.array"}
        if rng.random() < 0.1:
            del array[rng.choice(list(array))]
        return array
    return {"CLS": "CalibrationMethod", "value": rng.choice(STRINGS) if rng.random() < 0.9 else random_json(rng, 3)}


def substitute(which: int, seed: int, raw_tokens: bool) -> bytes:
    """The base document with one value replaced (or one key added) somewhere."""
    rng = random.Random(seed)
    doc = json.loads(BASE_DOCUMENTS[which])
    path = rng.choice(BASE_PATHS[which])
    value = "@@RAW@@" if raw_tokens else random_json(rng)
    if not path:
        doc = value
    else:
        node = doc
        for key in path[:-1]:
            node = node[key]
        if isinstance(node, dict) and rng.random() < 0.25:
            node[rng.choice(KEYS)] = value
        else:
            node[path[-1]] = value
    text = json.dumps(doc).encode()
    return text.replace(b'"@@RAW@@"', rng.choice(RAW_TOKENS)) if raw_tokens else text


@pytest.fixture(scope="module")
def fuzz_file(workdir) -> Path:
    return workdir / "fuzz.json"


def load_both(path: Path, raw: bytes) -> None:
    """The fuzz oracle: histocal raises ValueError (never anything else) or returns exactly ORT's result."""
    path.write_bytes(raw)
    try:
        ours = cache.load_tensors_data(path)
    except ValueError as exc:
        assert type(exc) is ValueError and str(path) in str(exc)
        return
    assert_same(ours, ort_load(path))


@settings(max_examples=examples(4500))
@given(which=BASES, seed=SEEDS)
def test_fuzz_substituted_values(fuzz_file, which, seed):
    load_both(fuzz_file, substitute(which, seed, raw_tokens=False))


@settings(max_examples=examples(800))
@given(which=BASES, seed=SEEDS)
def test_fuzz_huge_numbers(fuzz_file, which, seed):
    load_both(fuzz_file, substitute(which, seed, raw_tokens=True))


@settings(max_examples=examples(1500))
@given(which=BASES, cut=st.integers(0, 10**6))
def test_fuzz_truncated(fuzz_file, which, cut):
    doc = BASE_DOCUMENTS[which]
    load_both(fuzz_file, doc[: cut % len(doc)])


@settings(max_examples=examples(2500))
@given(which=BASES, seed=SEEDS)
def test_fuzz_byte_edits(fuzz_file, which, seed):
    rng = random.Random(seed)
    raw = bytearray(BASE_DOCUMENTS[which])
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(raw))
        kind = rng.random()
        if kind < 0.5:
            raw[at] = rng.choice(b'[]{}",:\\0123456789.eE-+ aNI\x00\xff') if rng.random() < 0.7 else rng.randrange(256)
        elif kind < 0.75:
            raw[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
        else:
            del raw[at : at + rng.randint(1, 3)]
    load_both(fuzz_file, bytes(raw))


@settings(max_examples=examples(1000))
@given(which=BASES, seed=SEEDS)
def test_fuzz_deep_nesting(fuzz_file, which, seed):
    rng = random.Random(seed)
    doc = BASE_DOCUMENTS[which]
    at = rng.randrange(len(doc) + 1)
    depth = int(10 ** rng.uniform(0, 5))  # 1 .. 100,000, log-uniform
    opener, closer = rng.choice([(b"[", b"]"), (b'{"a": ', b"}"), (b'[{"data": ', b"}]")])
    nest = opener * depth + b"0" + (closer * depth if rng.random() < 0.7 else b"")
    load_both(fuzz_file, doc[:at] + nest + doc[at:])


# ----------------------------------------------------------------------------------------------
# Atomic writes
# ----------------------------------------------------------------------------------------------


def _raising(exc: BaseException):
    def patched(*args, **kwargs):
        raise exc

    return patched


_os_close, _os_write = os.close, os.write  # the tests patch the os module itself


def _close_then_interrupt(fd):
    _os_close(fd)
    raise KeyboardInterrupt


def _partial_write(fd, view):
    _os_write(fd, bytes(view[:10]))  # part of the file lands in the temp file, then the interrupt
    raise KeyboardInterrupt


INTERRUPTIONS = {  # os function patched in histocal.io.files -> replacement
    "write": _partial_write,
    "fsync": _raising(KeyboardInterrupt()),
    "close": _close_then_interrupt,
    "replace": _raising(OSError("No space left on device")),
}


@pytest.mark.parametrize("target", INTERRUPTIONS)
def test_interrupted_write_keeps_old_file(tmp_path, monkeypatch, calibrated, target):
    path = tmp_path / "c.json"
    cache.save_tensors_data(calibrated[CalibrationMethod.MinMax], path)
    old = path.read_bytes()
    with monkeypatch.context() as patch:
        patch.setattr(os, target, INTERRUPTIONS[target])
        with pytest.raises((KeyboardInterrupt, OSError)):
            cache.save_tensors_data(calibrated[CalibrationMethod.Distribution], path)
    assert path.read_bytes() == old
    assert temp_files(tmp_path) == []
    assert_same(cache.load_tensors_data(path), ort_load(path))


def test_atomic_write_bytes_mode_and_content(tmp_path):
    path = tmp_path / "table.bin"
    path.write_bytes(b"old")
    path.chmod(0o644)
    cache.atomic_write_bytes(path, b"abc")
    assert path.read_bytes() == b"abc" and (path.stat().st_mode & 0o777) == 0o600
    cache.atomic_write_bytes(path, b"")
    assert path.read_bytes() == b"" and (path.stat().st_mode & 0o777) == 0o600
    assert temp_files(tmp_path) == []


def _versions(count: int) -> list[TensorsData]:
    """Distinct valid caches of very different sizes, so a torn file could not pass as a complete one."""
    return [
        TensorsData(
            CalibrationMethod.MinMax,
            {
                f"t{i}_{j}": TensorData(lowest=np.float32(-j), highest=np.full(i * 50 + 1, j, np.float32))
                for j in range(i % 4 + 1)
            },
        )
        for i in range(count)
    ]


WRITER_SCRIPT = """
import sys
from histocal.io import cache
path, sources = sys.argv[1], sys.argv[2:]
for _ in range(10):
    for source in sources:
        cache.save_tensors_data(cache.load_tensors_data(source), path)
"""


def test_concurrent_writers(tmp_path):
    """6 threads, then 4 processes, save to one path while a thread keeps loading it: every load sees one
    complete version, and no temp file is left."""
    path = tmp_path / "c.json"
    versions = _versions(12)
    sources = tmp_path / "sources"
    sources.mkdir()
    names = [str(sources / f"v{i}.json") for i in range(len(versions))]
    for name, version in zip(names, versions):
        cache.save_tensors_data(version, name)
    expected = [as_map(cache.load_tensors_data(name)) for name in names]
    stop, seen, errors = threading.Event(), [], []

    def reader():
        while not stop.is_set():
            if not path.exists():  # before the first write
                continue
            try:
                seen.append(as_map(cache.load_tensors_data(path)) in expected)
            except Exception as exc:
                errors.append(exc)

    def writer(offset):
        for k in range(30):
            cache.save_tensors_data(versions[(offset + k) % len(versions)], path)

    threads = [threading.Thread(target=reader, daemon=True)] + [
        threading.Thread(target=writer, args=(n,)) for n in range(6)
    ]
    for t in threads:
        t.start()
    try:
        for t in threads[1:]:
            t.join()
        processes = [
            subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(path), *names[n:], *names[:n]]) for n in range(4)
        ]
        for p in processes:
            p.wait(timeout=120)
    finally:
        stop.set()
        threads[0].join()

    assert all(p.returncode == 0 for p in processes)
    assert errors == [] and len(seen) > 10 and all(seen)
    assert as_map(cache.load_tensors_data(path)) in expected
    assert temp_files(tmp_path) == []

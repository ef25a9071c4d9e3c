"""histocal.cache against onnxruntime's own calibration cache code (docs/ort_parity.md, *Calibration cache*);
the loader's errors and fuzzing are in test_cache_loader.py.

* writing: byte-identical files and the same 0600 mode as ORT's ``save_tensors_data``, for every method's
  layout, float16/float32, numpy scalars, 0-d and per-channel arrays, NaN/Inf/-0.0;
* reading: histocal <-> ORT loads give the same objects both ways; ORT's ``quantize_static`` accepts a
  histocal-written cache; ``check_cache`` follows quantize_static's hit/miss logic and error texts;
* atomicity: interrupted writes keep the old file and leave no temp files; concurrent writers never corrupt.

Results are compared as maps (ORT's tensor order follows Python set order).
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper
from onnxruntime.quantization import QuantFormat, quantize_static
from onnxruntime.quantization import calibrate as ort
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData
from support.caches import METHODS, Reader, as_map, assert_same, ort_load, temp_files
from support.parity import quiet
from support.profiles import examples

from histocal.io import cache

FLOAT_DTYPES = [np.float16, np.float32]


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


@pytest.mark.parity
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


@pytest.mark.parity
@settings(max_examples=examples(200))
@given(td=tensors_datas())
def test_round_trip_is_what_ort_reads_back(workdir, td):
    """``round_trip`` (auto's scoring model, no file) gives what ORT loads from the cache written."""
    path = workdir / "written.json"
    ort.save_tensors_data(td, path)
    assert_same(cache.round_trip(td), ort_load(path))
    path.unlink()


@pytest.mark.parity
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


@pytest.mark.parity
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


@pytest.mark.parity
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


@pytest.mark.parity
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


@pytest.mark.parity
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


@pytest.mark.parity
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


@pytest.mark.parity
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


@pytest.mark.parity
def test_check_cache_smooth_quant_mismatch_warns_and_skips_method_check(calibrated, tmp_path, caplog):
    path = tmp_path / "c.json"
    cache.save_tensors_data(calibrated[CalibrationMethod.Percentile], path, smooth_quant=False)
    with caplog.at_level(logging.WARNING, logger="histocal.io.cache"):
        assert cache.check_cache(path, CalibrationMethod.MinMax, True) is None
    assert caplog.messages == [
        f"Calibration cache at {path} was produced with smooth_quant=False; current run uses smooth_quant=True. "
        "Recomputing ranges and overwriting cache."
    ]


@pytest.mark.parity
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


@pytest.mark.parity
def test_check_cache_raw_method_value_kept_like_ort(conv_model, tmp_path):
    """ORT keeps a non-enum calibration_method as is, so it never matches: a method-mismatch error."""
    path = tmp_path / "c.json"
    path.write_text('{"data": {}, "calibration_method": 0, "smooth_quant": false}')
    assert cache.load_tensors_data(path).calibration_method == 0 == ort_load(path).calibration_method
    with pytest.raises(ValueError) as ours:
        cache.check_cache(path, CalibrationMethod.MinMax, False)
    assert str(ours.value) == ort_error(conv_model, tmp_path, CalibrationMethod.MinMax, path)


@pytest.mark.parity
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


@pytest.mark.parity
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


@pytest.mark.subprocess
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

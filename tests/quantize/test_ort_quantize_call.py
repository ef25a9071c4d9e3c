"""histocal calls onnxruntime's quantize_static through one helper that passes every argument by
name (a reordering of ORT's parameters cannot shift them)."""

import importlib

import pytest
from onnxruntime.quantization import QuantFormat
from onnxruntime.quantization.calibrate import CalibrationMethod

from histocal.quantize.ort import QUANTIZE_ARGUMENTS, ort_quantize_static

ORT_QUANTIZE = importlib.import_module("onnxruntime.quantization.quantize")


def test_every_argument_by_name(monkeypatch):
    calls = []
    monkeypatch.setattr(ORT_QUANTIZE, "quantize_static", lambda *a, **kw: calls.append((a, kw)))
    ort_quantize_static(
        "in.onnx",
        "out.onnx",
        calibrate_method=CalibrationMethod.Entropy,
        calibration_cache_path="c.json",
        quant_format=QuantFormat.QOperator,
        extra_options={"x": 1},
    )
    ((args, kwargs),) = calls
    assert args == ("in.onnx", "out.onnx")
    assert kwargs == {
        "calibration_data_reader": None,
        "calibrate_method": CalibrationMethod.Entropy,
        "calibration_cache_path": "c.json",
        "quant_format": QuantFormat.QOperator,
        "extra_options": {"x": 1},
    }


def test_the_names_are_ort_parameters():
    import inspect

    parameters = inspect.signature(ORT_QUANTIZE.quantize_static).parameters
    assert set(QUANTIZE_ARGUMENTS) <= set(parameters)


def test_unknown_argument_is_a_type_error():
    with pytest.raises(TypeError, match="per_chanel"):
        ort_quantize_static("in.onnx", "out.onnx", calibrate_method=CalibrationMethod.MinMax, per_chanel=True)


def test_calls_on_one_model_file_take_turns(tmp_path):
    """onnxruntime's quantize_static writes ``<name>-inferred.onnx`` beside a model given by path
    and removes it: calls on one file from several threads at once (the recipe builds a scorer
    ahead while another quantizes) take turns, and each writes the model a call alone writes."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import onnx
    from support.models import cnn, cnn_feeds

    import histocal
    from histocal.quantize import ort as ort_module
    from histocal.quantize.ort import quantize_with_ranges

    path = tmp_path / "model.onnx"
    onnx.save(cnn(), path.as_posix())
    ranges = histocal.calibrate(path, cnn_feeds(4, seed=1))
    quantize_with_ranges(path, tmp_path / "alone.onnx", ranges)
    inside, most = [0], [0]
    guard = threading.Lock()
    original = ORT_QUANTIZE.quantize_static

    def counted(*args, **kwargs):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            return original(*args, **kwargs)
        finally:
            with guard:
                inside[0] -= 1

    with pytest.MonkeyPatch.context() as m:
        m.setattr(ORT_QUANTIZE, "quantize_static", counted)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda k: quantize_with_ranges(path, tmp_path / f"q{k}.onnx", ranges), range(8)))
    assert most[0] == 1
    assert not ort_module._model_file_locks  # no entry kept once every call has ended
    for k in range(8):
        assert (tmp_path / f"q{k}.onnx").read_bytes() == (tmp_path / "alone.onnx").read_bytes()

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

"""A model file that is not an ONNX model (0 bytes, random bytes, no graph) is refused by every
Python entry point with a message naming the file (histocal.io.models), never protobuf's
DecodeError or an error about the empty graph it parses to."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import CalibrationMethod

import histocal
from histocal import calibrators
from histocal.diagnose import diagnose
from histocal.io.models import ModelFileError, load_model
from histocal.state.fingerprint import model_fingerprint

RANDOM_BYTES = np.random.default_rng(3).integers(0, 256, 512, dtype=np.uint8).tobytes()
FEEDS = [{"x": np.zeros((1, 3), np.float32)}]


@pytest.fixture(params=["empty", "random", "no_graph"])
def bad_model(request, tmp_path):
    """A file that is not an ONNX model, and what the message says about it."""
    path = tmp_path / f"{request.param}.onnx"
    if request.param == "empty":
        path.write_bytes(b"")
        return path, r"not an ONNX model \(0 bytes\)"
    if request.param == "random":
        path.write_bytes(RANDOM_BYTES)
        return path, r"not an ONNX model \(cannot be parsed: .+\)"
    path.write_bytes(onnx.ModelProto(ir_version=10).SerializeToString())  # parses, no graph
    return path, r"not an ONNX model \(no graph\)"


def _names(path, pattern):
    return rf"^{path}: {pattern}"


def test_load_model_names_the_file(bad_model):
    path, pattern = bad_model
    with pytest.raises(ModelFileError, match=_names(path, pattern)):
        load_model(path)
    with pytest.raises(ValueError, match=_names(path, pattern)):
        model_fingerprint(path)


def test_a_missing_model_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.onnx: no such model file"):
        load_model(tmp_path / "missing.onnx")


@pytest.mark.parametrize("entry", ["create_calibrator", "constructor", "quantize_static", "calibrate", "diagnose"])
def test_python_entry_points_name_the_file(bad_model, tmp_path, entry):
    path, pattern = bad_model
    aug = (tmp_path / "aug.onnx").as_posix()
    calls = {
        "create_calibrator": lambda: histocal.create_calibrator(
            path, [], aug, calibrate_method=CalibrationMethod.Entropy
        ),
        "constructor": lambda: calibrators.PercentileCalibrater(path, [], aug),
        "quantize_static": lambda: histocal.quantize_static(path, tmp_path / "q.onnx", FEEDS),
        "calibrate": lambda: histocal.calibrate(path, FEEDS),
        "diagnose": lambda: diagnose(path, FEEDS),
    }
    with pytest.raises(ValueError, match=_names(path, pattern)):
        calls[entry]()
    assert not (tmp_path / "q.onnx").exists()

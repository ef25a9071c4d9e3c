"""Fixtures of the calibration cache tests (test_cache.py, test_cache_loader.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import calibrate as ort
from support.caches import METHODS, Reader
from support.parity import quiet


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

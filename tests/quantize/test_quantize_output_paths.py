"""``histocal.quantize_static`` writes nothing over the float model's external-data files.

onnxruntime writes ``model_output``'s external data to ``<model_output>.data``: for a model whose
weights are in that file (an export renamed after saving), quantize_static appended the int8
weights to the float model's own weight file. It, an output model over a weight file and a
calibration cache over one are refused before any work with a ValueError naming both files.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import histocal
from histocal.io.outputs import OverwriteError


def _conv_model() -> onnx.ModelProto:
    """X[N,3,8,8] -Conv-> Y, its int8 weight over the 1 KiB from which ORT writes external data."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.5, (64, 3, 3, 3)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["X", "W"], ["Y"], name="conv", pads=[1, 1, 1, 1])],
        "conv",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["N", 64, 8, 8])],
        initializer=[w],
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


class _Reader:
    def __init__(self) -> None:
        self.feeds = iter(
            [{"X": np.random.default_rng(i).normal(size=(1, 3, 8, 8)).astype(np.float32)} for i in range(2)]
        )

    def get_next(self) -> dict | None:
        return next(self.feeds, None)


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "a.onnx"
    onnx.save_model(
        _conv_model(), path.as_posix(), save_as_external_data=True, location="b.onnx.data", size_threshold=0
    )
    return path


def _digests(*paths: Path) -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


@pytest.mark.parametrize(
    "output, options",
    [
        ("b.onnx", {"use_external_data_format": True}),
        ("b.onnx.data", {}),
        ("q.onnx", {"calibration_cache_path": "b.onnx.data"}),
    ],
)
def test_nothing_over_the_models_weights(model, output, options):
    weights = model.parent / "b.onnx.data"
    before = _digests(model, weights)
    options = {k: model.parent / v if k == "calibration_cache_path" else v for k, v in options.items()}
    with pytest.raises(
        OverwriteError, match=r"b\.onnx\.data is the same file as the input model_input's external data"
    ):
        histocal.quantize_static(model, model.parent / output, _Reader(), **options)
    assert _digests(model, weights) == before
    assert sorted(p.name for p in model.parent.iterdir()) == ["a.onnx", "b.onnx.data"]
    ort.InferenceSession(model.as_posix(), providers=["CPUExecutionProvider"])


def test_other_names_still_work(model):
    output = model.parent / "q.onnx"
    histocal.quantize_static(model, output, _Reader(), use_external_data_format=True)
    assert (model.parent / "q.onnx.data").is_file()
    ort.InferenceSession(output.as_posix(), providers=["CPUExecutionProvider"])

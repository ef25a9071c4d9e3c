"""diagnose and ``quantize --auto-exclude`` with 16-bit activations on models below opset 21.

onnxruntime's quantize_static converts such a model to opset 21 before it calibrates and
quantizes (opset 11's Softmax on a non-last axis becomes Flatten, Softmax ``<output>_intermediate``,
Reshape). diagnose calibrated and switched the unconverted model: at opset 11 ORT refused its ranges
("Only an existing tensor can be modified, 'Y_intermediate' is not"), at opset 13 the switched
model's int16 QuantizeLinear did not load (opset 13 has no int16 QuantizeLinear). It now diagnoses
the model ORT quantizes.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import QuantType
from support.graphs import GraphBuilder, tensor
from support.parity import quiet

import histocal
from histocal.cli import main
from histocal.diagnose import diagnose
from histocal.quantize.ort import check_ranges_fit


def softmax_classifier(opset: int) -> onnx.ModelProto:
    """X[N,3,4] -MatMul-Relu-> Softmax over axis 1 (not the last) -> Y[N,3,6]."""
    g = GraphBuilder(3)
    g.const(g.rng.normal(0, 0.7, (4, 6)).astype(np.float32), "W")
    g.node("MatMul", ["X", "W"], output="logits", name="matmul")
    g.node("Relu", ["logits"], output="relu", name="relu")
    g.node("Softmax", ["relu"], output="Y", name="softmax", axis=1)
    return g.model("softmax_classifier", [tensor("X", ["N", 3, 4])], [tensor("Y", ["N", 3, 6])], opset)


FEEDS = [{"X": np.random.default_rng(i).normal(size=(2, 3, 4)).astype(np.float32)} for i in range(8)]


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("activation_type", [QuantType.QInt16, QuantType.QUInt16], ids=lambda t: t.name)
def test_diagnose_16bit_below_opset_21(tmp_path, opset, activation_type):
    model = softmax_classifier(opset)
    with quiet():
        d = diagnose(model, FEEDS, eval_samples=3, activation_type=activation_type, max_excluded_fraction=1.0)
    assert d.quantized_tensors > 0 and np.isfinite(d.sqnr_db)
    if opset == 11:
        assert "Y_intermediate" in d.ranges.data  # a tensor of the converted model
    # the diagnosis's ranges fit the model ORT quantizes, and quantize with its exclusions
    check_ranges_fit(model, d.ranges, "diagnosis", activation_type=activation_type)
    out = tmp_path / "q.onnx"
    with quiet():
        histocal.quantize_static(
            model, out, tensors_range=d.ranges, activation_type=activation_type,
            nodes_to_exclude=list(d.nodes_to_exclude) or None,
        )  # fmt: skip
    assert max(o.version for o in onnx.load(out.as_posix()).opset_import if o.domain in ("", "ai.onnx")) == 21


def test_diagnose_and_auto_exclude_cli_qint16_opset_11(tmp_path, capsys):
    path = tmp_path / "softmax11.onnx"
    onnx.save(softmax_classifier(11), path.as_posix())
    data = tmp_path / "data"
    data.mkdir()
    for i, f in enumerate(FEEDS):
        np.save(data / f"s{i}.npy", f["X"])
    common = ["--data", str(data), "--activation-type", "qint16", "--eval-samples", "3", "--no-progress"]
    assert main(["diagnose", str(path), *common]) == 0, capsys.readouterr().err
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(path), str(out), "--auto-exclude", *common]) == 0, capsys.readouterr().err
    assert out.exists()

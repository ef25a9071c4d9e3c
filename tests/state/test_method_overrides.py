"""Per-tensor method assignment (histocal.state.overrides): isotone for a classifier's logits (by name or by
the op type of the producing node) and another method elsewhere, through create_calibrator, the state,
the CLI and quantize_static; and isotone's warnings where it is not defined (docs/methods.md)."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType
from onnxruntime.quantization import calibrate as ort_calibrate
from support import isotone_refs as I

import histocal
from histocal import _core
from histocal.calibrators import create_calibrator
from histocal.cli.main import main
from histocal.state import CalibrationState, Collection, compute_with_overrides


def _model() -> onnx.ModelProto:
    """X[N,6] -MatMul-> h[N,8] -Relu-> r -MatMul-> logits[N,3] -Softmax-> probs."""
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.normal(0, 1, (6, 8)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.normal(0, 1, (8, 3)).astype(np.float32), "W2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "W2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"]),
    ]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 6])],
        [
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", 8]),
        ],
        inits,
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


def _feeds():
    rng = np.random.default_rng(2)
    return [{"X": rng.normal(0, 1, (n, 6)).astype(np.float32)} for n in (5, 7, 4)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("overrides")
    path = tmp / "m.onnx"
    onnx.save(_model(), str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    runs = [session.run(["logits", "probs", "h"], f) for f in _feeds()]
    outputs = {n: [r[i] for r in runs] for i, n in enumerate(["logits", "probs", "h"])}
    return {"path": str(path), "tmp": tmp, "outputs": outputs}


def _calibrate(model, method, name, **extra):
    cal = create_calibrator(
        model["path"], augmented_model_path=str(model["tmp"] / f"{name}.onnx"), calibrate_method=method,
        extra_options=extra,
    )  # fmt: skip
    cal.collect_data(_feeds())
    return cal


def _range(td):
    return float(np.asarray(td.lowest).reshape(-1)[0]), float(np.asarray(td.highest).reshape(-1)[0])


@pytest.mark.parametrize("mode", ["auto", "streaming"])
def test_isotone_for_the_logits_by_name_and_percentile_elsewhere(model, mode):
    """isotone's summaries are collected beside the streaming histogram: auto collects in streaming mode."""
    cal = _calibrate(model, "percentile", f"n{mode}", CollectionMode=mode, MethodOverrides={"name:logits": "isotone"})
    got = cal.compute_data()
    plain = _calibrate(model, "percentile", f"p{mode}", CollectionMode="streaming").compute_data()
    assert _range(got["logits"]) == tuple(float(np.float32(v)) for v in I.isotone_range(model["outputs"]["logits"]))
    for name in plain.data:
        if name != "logits":
            assert _range(got[name]) == _range(plain[name]), name
    # the state serves the same assignment, and without it the main method everywhere
    state = cal.state
    again = compute_with_overrides(state, "percentile", ["logits=isotone"])
    assert all(_range(again[n]) == _range(got[n]) for n in got.data)
    assert _range(compute_with_overrides(state, "percentile")["logits"]) != _range(got["logits"])


def test_op_type_rules_and_per_channel(model):
    rules = {"op:Softmax": "isotone", "MatMul": ("mse", {"qtype": "uint8"})}
    cal = _calibrate(model, "entropy", "op", MethodOverrides=rules)
    got = cal.compute_data()
    state = cal.state
    iso, mse = state.compute("isotone"), state.compute("mse", qtype="uint8")
    assert _range(got["probs"]) == _range(iso["probs"])
    assert _range(got["h"]) == _range(mse["h"]) and _range(got["logits"]) == _range(mse["logits"])
    assert _range(got["r"]) == _range(state.compute("entropy")["r"])
    # per channel: the assigned method's per-channel arrays
    pc = _calibrate(model, "percentile", "pc", per_channel=True, channel_axis=-1, MethodOverrides={"op:Relu": "kl"})
    got = pc.compute_data()
    want = pc.state.compute("kl")["r"]
    assert np.array_equal(got["r"].highest, want.highest) and got["r"].highest.shape == (8,)


def test_bad_rules_are_errors_naming_them(model, caplog):
    state = _calibrate(model, "percentile", "bad", CollectionMode="streaming").state
    with pytest.raises(ValueError, match="'name:nope'.*not a calibrated tensor"):
        compute_with_overrides(state, "percentile", {"name:nope": "mse"})
    with pytest.raises(ValueError, match="'Softmax'.*needs the model"):
        compute_with_overrides(state, "percentile", {"Softmax": "isotone"})
    with pytest.raises(ValueError, match="KEY=METHOD"):
        compute_with_overrides(state, "percentile", ["logits"])
    with pytest.raises(ValueError, match="'logits'.*unknown"):
        compute_with_overrides(state, "percentile", {"logits": "nonsense"})
    with pytest.raises(ValueError, match="isotone needs per-row"):  # summaries not collected
        compute_with_overrides(state, "percentile", {"logits": "isotone"})
    with caplog.at_level(logging.WARNING):
        compute_with_overrides(state, "percentile", {"op:Conv": "mse"}, model=model["path"])
    assert "'op:Conv': no calibrated tensor is produced by a Conv node" in caplog.text
    with pytest.raises(ValueError, match="streaming collection"):
        _calibrate(model, "percentile", "ex", CollectionMode="exact", MethodOverrides={"logits": "isotone"})
    with pytest.raises(ValueError, match="MethodOverrides.*histogram method"):
        _calibrate(model, "minmax", "mm", MethodOverrides={"logits": "isotone"})


@pytest.mark.parity
def test_cli_method_for(model, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i, f in enumerate(_feeds()):
        np.save(data / f"b{i}.npy", f["X"])
    cache, state = tmp_path / "c.json", tmp_path / "s.npz"
    args = ["calibrate", model["path"], "--data", str(data), "--method", "percentile", "--mode", "streaming"]
    assert main([*args, "--method-for", "op:MatMul=mse", "--method-for", "name:logits=isotone",
                 "--cache", str(cache), "--state", str(state)]) == 0  # fmt: skip
    got = ort_calibrate.load_tensors_data(str(cache))
    loaded = CalibrationState.load(state)
    assert _range(got["logits"]) == _range(loaded.compute("isotone")["logits"])
    assert _range(got["h"]) == _range(loaded.compute("mse")["h"])
    assert _range(got["r"]) == _range(loaded.compute("percentile")["r"])
    again = tmp_path / "again.json"
    assert main(["recompute", str(state), "--method", "percentile", "--method-for", "logits=isotone",
                 "--cache", str(again)]) == 0  # fmt: skip
    data2 = json.loads(again.read_text())["data"]
    assert data2["logits"]["highest"] == json.loads(cache.read_text())["data"]["logits"]["highest"]


def test_quantize_static_with_calib_method_overrides(model, tmp_path):
    out = tmp_path / "q.onnx"
    histocal.quantize_static(
        model["path"], str(out), _feeds(), calibrate_method=ort_calibrate.CalibrationMethod.Percentile,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
        extra_options={"CalibMethodOverrides": {"logits": "isotone"}, "ActivationSymmetric": False},
    )  # fmt: skip
    pairs, _ = I.top_two(model["outputs"]["logits"])
    scale = I.isotone_scale(pairs, "int8", False)  # isotone's default qtype
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(out)).graph.initializer}
    scales = {k: float(v) for k, v in inits.items() if k.startswith("logits") and k.endswith("scale")}
    assert scales and all(np.isclose(v, scale, rtol=1e-6) for v in scales.values()), (scales, scale)


# ---------------------------------------------------------------------------------------------
# isotone where it is not defined: never silently


def _isotone(tensors: dict[str, np.ndarray], **options):
    s = _core.StreamHistograms(64, summaries=["isotone"])
    s.collect([(n, [x]) for n, x in tensors.items()])
    return CalibrationState(Collection("streaming", s)).compute("isotone", **options)


def test_isotone_warns_once_naming_every_tensor_without_a_row(caplog):
    tensors = {
        "all_nan": np.full((4, 3), np.nan, np.float32),
        "inf_top": np.array([[np.inf, 1.0, 0.0]] * 3, np.float32),
        "one_class": np.ones((5, 1), np.float32),
        "fine": np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 0.5]], np.float32),
    }
    with caplog.at_level(logging.WARNING, logger="histocal"):
        got = _isotone(tensors)
    for name in ("all_nan", "inf_top", "one_class"):
        assert _range(got[name]) == (0.0, 0.0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "3 tensor(s) with no row of two finite values" in warnings[0]
    assert all(f"'{n}'" in warnings[0] for n in ("all_nan", "inf_top", "one_class")) and "'fine'" not in warnings[0]


def test_isotone_warns_on_a_zero_scale_and_on_no_separable_row(caplog):
    rng = np.random.default_rng(0)
    # binary logits whose second value is always negative: PPQ's sweep picks scale 0, range [-0, 0]
    binary = np.stack([rng.uniform(1, 5, 20), -rng.uniform(1, 5, 20)], 1).astype(np.float32)
    ties = np.ones((3, 4), np.float32)  # every row's top tied: no scale separates it
    negative = -np.abs(rng.normal(size=(4, 3))).astype(np.float32) - 1  # every top value < 0
    with caplog.at_level(logging.WARNING, logger="histocal"):
        got = _isotone({"binary": binary, "ties": ties, "negative": negative})
    assert _range(got["binary"]) == (0.0, 0.0) and np.signbit(np.asarray(got["binary"].lowest).reshape(-1)[0])
    assert _range(got["negative"]) == (0.0, 0.0) and _range(got["ties"]) == (0.0, 1.0)
    text = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "1 tensor(s) with the scale that keeps the most rows in order is 0" in text and "'binary'" in text
    assert "2 tensor(s) with no row whose top value" in text and "'ties'" in text and "'negative'" in text

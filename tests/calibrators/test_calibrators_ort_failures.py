"""Where onnxruntime's calibrators crash (ragged batches in one call, +-inf activations, float16
with 2048 bins, empty tensors mixed with non-empty, per-channel merges, max_intermediate_outputs
discarding batches): each test shows ORT's failure and checks histocal's result.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnxruntime.quantization.calibrate import TensorsData
from support import models
from support.calibrator_runs import (
    DIST,
    ENT,
    FORMS,
    MM,
    PCT,
    assert_tensors_same,
    chunks_for,
    flat,
    run_histocal,
    run_ort,
    split,
)
from support.parity import assert_same, check_parity, quiet

import histocal

pytestmark = pytest.mark.parity


def _activations(path, feeds, tmp_path, op_types=None):
    """Per tensor, the list of per-batch activations (from the histogram augmented model)."""
    with quiet():
        cal = histocal.create_calibrator(path, op_types, (tmp_path / "acts.onnx").as_posix(), PCT)
    sess = cal.infer_session
    names = [o.name for o in sess.get_outputs() if o.name in cal.tensors_to_calibrate]
    out = {n: [] for n in names}
    for feed in feeds:
        for n, a in zip(names, sess.run(names, feed)):
            out[n].append(a.copy())
    return out


def _collector_cfg(method, opts):
    name = {ENT: "entropy", PCT: "percentile", DIST: "distribution"}[method]
    return dict(
        method=name,
        symmetric=opts.get("symmetric", method == PCT),
        num_bins=opts.get("num_bins", 128 if method == ENT else 2048),
        num_quantized_bins=opts.get("num_quantized_bins", 128),
        percentile=opts.get("percentile", 99.999),
        scenario=opts.get("scenario", "same"),
    )


def assert_sane(td: TensorsData, acts: dict, where: str, contains: bool):
    """Finite ranges within the finite data's [min, max] (containing it when ``contains``)."""
    for name, t in td.data.items():
        lo, hi = np.asarray(t.lowest), np.asarray(t.highest)
        vals = np.concatenate([a.ravel() for a in acts[name]]).astype(np.float64)
        vals = vals[np.isfinite(vals)]
        assert np.isfinite(lo).all() and np.isfinite(hi).all(), f"{where}[{name!r}]: range ({lo}, {hi})"
        if vals.size == 0:
            continue
        mn, mx = vals.min(), vals.max()
        if contains:
            assert (lo <= mn).all() and (hi >= mx).all(), f"{where}[{name!r}]: ({lo}, {hi}) misses [{mn}, {mx}]"
        else:
            tol = 1e-3 * max(1.0, mx - mn)
            assert (lo >= mn - tol).all() and (hi <= mx + tol).all() and (lo <= hi).all(), (
                f"{where}[{name!r}]: ({lo}, {hi}) outside [{mn}, {mx}]"
            )


HIST_FAIL_CONFIGS = {
    "entropy": (ENT, {"num_bins": 128}),
    "percentile-sym": (PCT, {"num_bins": 2048}),
    "percentile-nonsym": (PCT, {"symmetric": False}),
    "distribution-p3": (DIST, {"scenario": "p3"}),
}


def _check_against_collector(path, method, opts, feeds, ours_by_form, tmp_path, op_types=None):
    """histocal's calibrator result (one call) == histocal's HistogramCollector on the same
    activations, whose parity with ORT's collector (run on the finite values flattened, where
    ORT raises) parity.check_parity establishes. Returns the activations."""
    acts = _activations(path, feeds, tmp_path, op_types)
    cfg = _collector_cfg(method, opts)
    check_parity(cfg, [acts])
    hc = histocal.HistogramCollector(**cfg)
    with quiet():
        hc.collect(acts)
        expected = TensorsData(method, hc.compute_collection_result())
    for form, ours in ours_by_form.items():
        assert_tensors_same(expected, ours, form)
    return acts


@pytest.mark.parametrize("cfg", list(HIST_FAIL_CONFIGS))
def test_ragged_sequence_length_in_one_call(paths, tmp_path, cfg):
    """Sequence length changing between batches of one collect_data: ORT's histogram methods
    fail to stack the batches; histocal calibrates (all data forms, and streaming)."""
    method, opts = HIST_FAIL_CONFIGS[cfg]
    feeds = models.transformer_feeds([4, 6, 3, 5])
    with quiet(), pytest.raises(ValueError, match="inhomogeneous"):
        run_ort(paths["transformer"], method, opts, [feeds], tmp_path / "o.onnx")
    ours = {f: run_histocal(paths["transformer"], method, opts, [feeds], tmp_path / "h.onnx", f) for f in FORMS}
    acts = _check_against_collector(paths["transformer"], method, opts, feeds, ours, tmp_path)
    stream = run_histocal(paths["transformer"], method, opts, [feeds], tmp_path / "s.onnx", mode="streaming")
    assert_sane(stream, acts, "streaming", contains=method == DIST)
    assert_sane(ours["list"], acts, "exact", contains=method == DIST)


def test_ragged_minmax_matches_ort(paths, tmp_path):
    """MinMax is unaffected by ragged batches (the Reshape makes every result (1,))."""
    chunks = [models.transformer_feeds([4, 6, 3, 5])]
    ref = run_ort(paths["transformer"], MM, {}, chunks, tmp_path / "o.onnx")
    for form in FORMS:
        assert_tensors_same(ref.td, run_histocal(paths["transformer"], MM, {}, chunks, tmp_path / "h.onnx", form), form)


@pytest.mark.parametrize("cfg", list(HIST_FAIL_CONFIGS))
def test_inf_attention_mask(paths, tmp_path, cfg):
    """-inf in the attention mask (M, and the masked scores): ORT's histogram methods raise on the
    non-finite range; histocal ignores the infinities (ranges of the finite values)."""
    method, opts = HIST_FAIL_CONFIGS[cfg]
    feeds = models.transformer_feeds([5, 5, 5], fill=-np.inf)
    with quiet(), pytest.raises(ValueError, match="not finite"):
        run_ort(paths["transformer"], method, opts, [feeds], tmp_path / "o.onnx")
    ours = {f: run_histocal(paths["transformer"], method, opts, [feeds], tmp_path / "h.onnx", f) for f in FORMS}
    acts = _check_against_collector(paths["transformer"], method, opts, feeds, ours, tmp_path)
    assert_sane(ours["list"], acts, "exact", contains=method == DIST)
    # -inf padding and -1e4 padding give the same probabilities: the softmax output ranges agree.
    ref = run_histocal(paths["transformer"], method, opts, [models.transformer_feeds([5, 5, 5])], tmp_path / "r.onnx")
    for t in ("probs", "ctx", "Y"):
        assert_same(ref.data[t].lowest, ours["list"].data[t].lowest, t)
        assert_same(ref.data[t].highest, ours["list"].data[t].highest, t)


@pytest.mark.parametrize(
    "method,opts",
    [(PCT, {"symmetric": True}), (PCT, {"symmetric": False}), (DIST, {}), (ENT, {"num_bins": 2048})],
    ids=["percentile-sym", "percentile-nonsym", "distribution", "entropy-2048"],
)
def test_float16_2048_bins_ort_fails(paths, tmp_path, method, opts):
    """float16 tensors with 2048 bins (the Percentile/Distribution defaults): ORT raises "Too many bins"."""
    chunks = chunks_for("fp16", 1)
    with quiet(), pytest.raises(ValueError, match="Too many bins"):
        run_ort(paths["fp16"], method, opts, chunks, tmp_path / "o.onnx")
    acts = _activations(paths["fp16"], chunks[0], tmp_path)
    for mode in ("exact", "streaming"):
        ours = run_histocal(paths["fp16"], method, opts, chunks, tmp_path / "h.onnx", mode=mode)
        assert set(ours.data) == set(acts)
        # Documented: where numpy cannot build float16 edges, the histogram continues in float32.
        assert any(np.asarray(t.lowest).dtype == np.float32 for t in ours.data.values())
        for t in ours.data.values():
            assert np.asarray(t.lowest).dtype in (np.float16, np.float32)
            assert np.asarray(t.highest).dtype == np.asarray(t.lowest).dtype
        assert_sane(ours, acts, mode, contains=method == DIST)


@pytest.mark.parametrize("cfg", list(HIST_FAIL_CONFIGS))
def test_empty_batch_mixed_with_nonempty(paths, tmp_path, cfg):
    """A batch of size 0 among non-empty batches in one collect_data: ORT fails to stack; histocal
    gives the result of the non-empty data. MinMax (ORT works) is identical to ORT."""
    method, opts = HIST_FAIL_CONFIGS[cfg]
    feeds = models.vector_feeds(4, seed=5)
    feeds.insert(2, {"X": np.zeros((0, 4), np.float32)})
    with quiet(), pytest.raises(ValueError, match="inhomogeneous"):
        run_ort(paths["empty"], method, opts, [feeds], tmp_path / "o.onnx")
    ours = {f: run_histocal(paths["empty"], method, opts, [feeds], tmp_path / "h.onnx", f) for f in FORMS}
    _check_against_collector(paths["empty"], method, opts, feeds, ours, tmp_path)
    without = [f for f in feeds if f["X"].shape[0]]
    clean = run_histocal(paths["empty"], method, opts, [without], tmp_path / "c.onnx")
    for t in ("X", "r", "cat", "Y"):  # tensors that are non-empty in the other batches
        assert_same(clean.data[t].lowest, ours["list"].data[t].lowest, t)
        assert_same(clean.data[t].highest, ours["list"].data[t].highest, t)
    ref = run_ort(paths["empty"], MM, {}, [feeds], tmp_path / "m.onnx")
    assert_tensors_same(ref.td, run_histocal(paths["empty"], MM, {}, [feeds], tmp_path / "mh.onnx"), "minmax")


def test_empty_later_window_symmetric_percentile(paths, tmp_path):
    """An empty tensor in a later collect_data call on the |x| path: ORT's merge reduces a
    zero-size array (the Slice output is always empty, and a batch of size 0 empties them all)."""
    with quiet(), pytest.raises(ValueError, match="zero-size array"):
        run_ort(paths["empty"], PCT, {}, chunks_for("empty", 3), tmp_path / "o.onnx")
    ours = run_histocal(paths["empty"], PCT, {}, chunks_for("empty", 3), tmp_path / "h.onnx")
    one = run_ort(paths["empty"], PCT, {}, chunks_for("empty", 1), tmp_path / "o1.onnx")
    for t in ("empty", "e"):  # no data at all: the first call's result
        assert_same(one.td.data[t].lowest, ours.data[t].lowest, t)
        assert_same(one.td.data[t].highest, ours.data[t].highest, t)
    chunks = [models.vector_feeds(2, seed=1), [{"X": np.zeros((0, 4), np.float32)}]]
    with quiet(), pytest.raises(ValueError, match="zero-size array"):
        run_ort(paths["empty"], PCT, {}, chunks, tmp_path / "o.onnx")
    ours = run_histocal(paths["empty"], PCT, {}, chunks, tmp_path / "h.onnx")
    first = run_histocal(paths["empty"], PCT, {}, chunks[:1], tmp_path / "f.onnx")
    for t in ("X", "r", "Y"):
        assert_same(first.data[t].lowest, ours.data[t].lowest, t)
        assert_same(first.data[t].highest, ours.data[t].highest, t)


def test_per_channel_merge_across_calls(paths, tmp_path):
    """per_channel MinMax over several collect_data calls without moving_average: ORT raises
    (truth value of an array); histocal merges, giving the one-call result."""
    chunks = chunks_for("cnn", 3)
    opts = {"per_channel": True}
    with quiet(), pytest.raises(ValueError, match="truth value of an array"):
        run_ort(paths["cnn"], MM, opts, chunks, tmp_path / "o.onnx")
    one = run_ort(paths["cnn"], MM, opts, [flat(chunks)], tmp_path / "o1.onnx")
    assert one.td.data["conv1"].lowest.shape == (4,)
    for form in FORMS:
        ours = run_histocal(paths["cnn"], MM, opts, chunks, tmp_path / "h.onnx", form)
        assert_tensors_same(one.td, ours, form)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_max_intermediate_outputs(paths, tmp_path, k):
    """ORT discards each full chunk of max_intermediate_outputs batches (only the last N mod k
    batches count; N mod k == 0 raises). histocal folds the chunks: same as None."""
    feeds = models.cnn_feeds(6, seed=7)
    # Put the largest activations in the first batch, so discarding it is visible.
    feeds[0]["X"] = feeds[0]["X"] * 10
    opts = {"max_intermediate_outputs": k}
    full = run_ort(paths["cnn"], MM, {}, [feeds], tmp_path / "full.onnx")
    if 6 % k == 0:
        with quiet(), pytest.raises(ValueError, match="No data is collected"):
            run_ort(paths["cnn"], MM, opts, [feeds], tmp_path / "o.onnx")
    else:
        bad = run_ort(paths["cnn"], MM, opts, [feeds], tmp_path / "o.onnx")
        lost = run_ort(paths["cnn"], MM, {}, [feeds[6 - 6 % k :]], tmp_path / "l.onnx")
        assert_tensors_same(lost.td, bad.td, "ORT keeps only the last N mod k batches")
        assert bad.td.data["X"].highest < full.td.data["X"].highest
    for form in FORMS:
        ours = run_histocal(paths["cnn"], MM, opts, [feeds], tmp_path / "h.onnx", form)
        assert_tensors_same(full.td, ours, f"k={k}/{form}")
    # Also across several calls and for per-channel ranges.
    ours = run_histocal(paths["cnn"], MM, dict(opts, per_channel=True), split(feeds, [4, 2]), tmp_path / "h2.onnx")
    one = run_ort(paths["cnn"], MM, {"per_channel": True}, [feeds], tmp_path / "o2.onnx")
    assert_tensors_same(one.td, ours, f"k={k}/per_channel")


def test_nan_activations_histogram_methods(paths, tmp_path):
    """NaN (and inf) in the data: ORT's histogram methods raise; histocal's results are finite."""
    feeds = models.cnn_feeds(3, seed=4)
    feeds[0]["X"][0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    feeds[1]["X"][1, 2] = np.nan
    acts = _activations(paths["cnn"], feeds, tmp_path)
    for method, opts in HIST_FAIL_CONFIGS.values():
        with quiet(), pytest.raises(ValueError):
            run_ort(paths["cnn"], method, opts, [feeds], tmp_path / "o.onnx")
        for mode in ("exact", "streaming"):
            ours = run_histocal(paths["cnn"], method, opts, [feeds], tmp_path / "h.onnx", mode=mode)
            assert set(ours.data) == set(acts)
            assert_sane(ours, acts, f"{method.name}/{mode}", contains=method == DIST)

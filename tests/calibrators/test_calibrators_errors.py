"""histocal's calibrators: errors and input validation (no data, bad feeds, readers whose second
read differs, failed collects leaving earlier data unchanged, bounded memory over many batches).
"""

from __future__ import annotations

import logging
import re
import tracemalloc

import numpy as np
import pytest
from onnxruntime.quantization.calibrate import CalibrationMethod
from support import models
from support.calibrator_runs import (
    DIST,
    ENT,
    FORMS,
    MM,
    ORT_CREATE,
    PCT,
    OnceReader,
    RewindReader,
    as_form,
    assert_tensors_same,
    batch_bytes,
    make_histocal,
    run_histocal,
    run_ort,
)
from support.parity import quiet

import histocal


@pytest.mark.parity
@pytest.mark.parametrize("method", [MM, ENT, PCT, DIST], ids=lambda m: m.name)
@pytest.mark.parametrize("mode", ["exact", "streaming", None])
def test_no_data(paths, tmp_path, method, mode):
    with quiet():
        ort_cal = ORT_CREATE(paths["cnn"], None, (tmp_path / "o.onnx").as_posix(), method)
    with pytest.raises(ValueError, match="^No data is collected.$"):
        ort_cal.collect_data(RewindReader([]))
    cal = make_histocal(paths["cnn"], method, {}, tmp_path / "h.onnx", mode=mode)
    for data in ([], RewindReader([]), OnceReader([]), [{}], [None, models.cnn_feeds(1)[0]]):
        with pytest.raises(ValueError, match="^No data is collected.$"):
            cal.collect_data(data)


def _bad_feed_error_(paths, tmp_path, feed, method, mode, form):
    cal = make_histocal(paths["cnn"], method, {}, tmp_path / "h.onnx", mode=mode)
    with pytest.raises(ValueError) as info:
        cal.collect_data(as_form([models.cnn_feeds(1)[0], feed], form))
    return str(info.value)


@pytest.mark.parametrize(
    "method,mode,form",
    [(MM, None, "list"), (PCT, "exact", "list"), (ENT, "exact", "once"), (DIST, "streaming", "rewind")],
    ids=lambda v: getattr(v, "name", v),
)
def test_bad_feeds_name_the_input(paths, tmp_path, method, mode, form):
    good = models.cnn_feeds(1)[0]["X"]

    def _bad_feed_error(paths, tmp_path, feed, method):
        return _bad_feed_error_(paths, tmp_path, feed, method, mode, form)

    msg = _bad_feed_error(paths, tmp_path, {"X": good, "bogus": good}, method)
    assert "bogus" in msg and "batch 1" in msg
    msg = _bad_feed_error(paths, tmp_path, {"Xx": good}, method)
    assert "Xx" in msg
    msg = _bad_feed_error(paths, tmp_path, {"X": good.astype(np.complex64)}, method)
    assert "'X'" in msg and "complex64" in msg and "float32" in msg and "batch 1" in msg
    msg = _bad_feed_error(paths, tmp_path, {"X": np.full(good.shape, 1e39)}, method)  # float64 past float32's range
    assert "'X'" in msg and "outside the range" in msg and "batch 1" in msg
    msg = _bad_feed_error(paths, tmp_path, {"X": np.zeros((2, 3, 9, 8), np.float32)}, method)
    assert "'X'" in msg and "(2, 3, 9, 8)" in msg
    msg = _bad_feed_error(paths, tmp_path, {"X": np.zeros((2, 3, 8), np.float32)}, method)
    assert "'X'" in msg


@pytest.mark.parity
@pytest.mark.parametrize("method", [MM, ENT, PCT, DIST], ids=lambda m: m.name)
def test_feeds_are_cast_by_the_one_rule(paths, tmp_path, method):
    """Feeds of another dtype of the same kind (float64, ints for a float32 input) are cast to
    the model's type, as files are on the command line: the result is ORT's on the cast feeds."""
    feeds = models.cnn_feeds(3)
    wide = [{"X": f["X"].astype(np.float64)} for f in feeds]
    ints = [{"X": np.rint(f["X"] * 10).astype(np.int64)} for f in feeds]
    for given, cast in ((wide, feeds), (ints, [{"X": f["X"].astype(np.float32)} for f in ints])):
        ort_run = run_ort(paths["cnn"], method, {}, [cast], tmp_path / "o.onnx")
        ours = run_histocal(paths["cnn"], method, {}, [given], tmp_path / "h.onnx")
        assert_tensors_same(ort_run.td, ours, f"{method.name} {given[0]['X'].dtype}", ort_run)


@pytest.mark.parametrize("form", FORMS)
def test_a_bare_array_says_what_was_expected(paths, tmp_path, form):
    """An array where a feed dict belongs is a TypeError naming the batch and the expected dict
    (not numpy's "truth value of an array is ambiguous")."""
    x = models.cnn_feeds(2)[1]["X"]
    cal = make_histocal(paths["cnn"], ENT, {}, tmp_path / "h.onnx", mode=None)
    with pytest.raises(TypeError, match=r"batch 1: expected a dict of input name -> array, got a bare numpy array"):
        cal.collect_data(as_form([models.cnn_feeds(1)[0], x], form))
    for data in (x, np.stack([x, x])):  # the data itself an array
        with pytest.raises(TypeError, match=r"calibration data is a numpy array .*expected feed dicts"):
            cal.collect_data(data)
    with pytest.raises(TypeError, match=r"batch 0: expected a dict"):
        histocal.quantize_static(paths["cnn"], (tmp_path / "q.onnx").as_posix(), [x])


def test_progress_bar_total_is_the_known_batch_count(monkeypatch):
    """The progress bar's total: a list's length, a reader's __length_hint__ (what is left of
    it), none for a plain reader or a generator."""
    from histocal.io.readers import DataSource, progress

    monkeypatch.delenv("HISTOCAL_PROGRESS", raising=False)
    feeds = models.cnn_feeds(5)

    class HintedReader(RewindReader):
        def __length_hint__(self):
            return len(self.feeds) - self.i

    hinted = HintedReader(feeds)
    hinted.get_next()
    cases = [(feeds, 5), (lambda: iter(feeds), 5), (RewindReader(feeds), None), (hinted, 4), ((f for f in feeds), None)]
    for data, total in cases:
        bar = progress(DataSource(data).read(), "test", True)
        try:
            assert bar.total == total, data
            assert len(list(bar)) == (4 if data is hinted else 5)
        finally:
            bar.close()


def test_invalid_mode_and_streaming_bins(paths, tmp_path):
    for bad in ("fast", "EXACT", ""):
        with pytest.raises(ValueError, match="mode"):
            make_histocal(paths["cnn"], ENT, {}, tmp_path / "a.onnx", mode=bad)
        with pytest.raises(ValueError, match="mode"):
            histocal.PercentileCalibrater(paths["cnn"], mode=bad)
    for bad in (1000, 4, 0, -16, True, 16.0, "16384"):
        with pytest.raises(ValueError, match="streaming_bins"):
            histocal.create_calibrator(
                paths["cnn"], None, (tmp_path / "b.onnx").as_posix(), DIST, extra_options={"StreamingBins": bad}
            )
        with pytest.raises(ValueError, match="streaming_bins"):
            histocal.EntropyCalibrater(paths["cnn"], streaming_bins=bad)
    # valid non-default streaming_bins works and is batching-independent
    feeds = models.cnn_feeds(4)
    a = run_histocal(paths["cnn"], PCT, {"StreamingBins": 1024}, [feeds], tmp_path / "c.onnx", mode="streaming")
    b = run_histocal(paths["cnn"], PCT, {"StreamingBins": 1024}, [feeds[::-1]], tmp_path / "d.onnx", mode="streaming")
    assert_tensors_same(a, b, "streaming_bins=1024")


@pytest.mark.parity
def test_compute_before_collect(paths, tmp_path):
    for method in (ENT, PCT, DIST):
        with quiet():
            ort_cal = ORT_CREATE(paths["cnn"], None, (tmp_path / "o.onnx").as_posix(), method)
        cal = make_histocal(paths["cnn"], method, {}, tmp_path / "h.onnx")
        with pytest.raises(ValueError) as e_ort:
            ort_cal.compute_data()
        with pytest.raises(ValueError) as e_ours:
            cal.compute_data()
        assert str(e_ours.value) == str(e_ort.value)


@pytest.mark.parametrize("kept", [0, 1])
def test_exact_mode_rejects_a_reader_whose_second_read_differs(paths, tmp_path, kept):
    """A rewindable reader that draws new, wider data on its second read (e.g. random
    augmentation) would silently lose values outside the first read's ranges: an error instead
    (the batches over the memory budget are read again: here all of them, or all but the first)."""

    class Reader:
        def __init__(self):
            self.rng, self.i, self.reads = np.random.default_rng(0), 0, 0

        def get_next(self):
            if self.i == 0:
                self.reads += 1
            self.i += 1
            return {"X": (self.reads * self.rng.normal(0, 1, (4, 4))).astype(np.float32)} if self.i <= 3 else None

        def rewind(self):
            self.i = 0

    cal = histocal.create_calibrator(
        paths["passthrough"],
        None,
        str(tmp_path / "aug.onnx"),
        CalibrationMethod.Distribution,
        extra_options={"CollectionMode": "exact"},
    )
    cal.memory_budget = kept * batch_bytes(cal, (4, 4))
    with pytest.raises(ValueError, match="different data on its second read"):
        cal.collect_data(Reader())
    # the failed second pass was rolled back: nothing is left of it
    with pytest.raises(ValueError, match="No collector"):
        cal.compute_data()
    feeds = [{"X": np.full((4, 4), v, np.float32)} for v in (1.0, -2.0)]
    cal.collect_data(feeds)
    ref = histocal.create_calibrator(
        paths["passthrough"],
        None,
        str(tmp_path / "aug2.onnx"),
        CalibrationMethod.Distribution,
        extra_options={"CollectionMode": "exact"},
    )
    ref.collect_data(feeds)
    assert_tensors_same(cal.compute_data(), ref.compute_data(), "after the rollback")


@pytest.mark.parametrize("mode", ["exact", "streaming"])
def test_a_failed_collect_leaves_earlier_data_unchanged(paths, tmp_path, mode):
    """A collect_data call that fails (here: a bad batch after good ones, in pass 2 of exact
    mode or midway in streaming mode) changes nothing: the calibrator can go on as if it had
    not happened."""
    good = models.cnn_feeds(3)
    bad = [*list(models.cnn_feeds(2)), {"X": np.zeros((1, 2), np.float32)}]
    cal = make_histocal(paths["cnn"], PCT, {}, tmp_path / "a.onnx", mode=mode)
    cal.collect_data(list(good))
    before = cal.compute_data()
    state_before = cal.state
    with pytest.raises(ValueError):
        cal.collect_data(bad)
    assert_tensors_same(cal.compute_data(), before, "after a failed call")
    for name in state_before.names:
        assert cal.state.counts(name) == state_before.counts(name)
    # and it still collects, like a calibrator that never saw the failed call
    cal.collect_data(list(good))
    ref = make_histocal(paths["cnn"], PCT, {}, tmp_path / "b.onnx", mode=mode)
    ref.collect_data(list(good))
    ref.collect_data(list(good))
    assert_tensors_same(cal.compute_data(), ref.compute_data(), "continued")


@pytest.mark.parametrize("max_intermediate_outputs", [None, 1])
def test_minmax_failed_collect_leaves_earlier_data_unchanged(paths, tmp_path, max_intermediate_outputs):
    """MinMax follows the histogram calibrators' rule: a failed collect_data call leaves nothing
    behind (ORT keeps the batches before the failure, and folds them into a later result), also
    when max_intermediate_outputs folded some of them into the range during the call."""
    good = models.cnn_feeds(3)
    bad = [{"X": f["X"] * np.float32(1000)} for f in models.cnn_feeds(2)] + [{"X": np.zeros((1, 2), np.float32)}]
    opts = {"max_intermediate_outputs": max_intermediate_outputs}
    with quiet():
        cal = make_histocal(paths["cnn"], MM, opts, tmp_path / "a.onnx", mode=None)
        cal.collect_data(list(good))
        before = cal.compute_data()
        with pytest.raises(ValueError, match="batch 2"):
            cal.collect_data(list(bad))
        assert cal.intermediate_outputs == []
        assert_tensors_same(before, cal.compute_data(), "after a failed call")
        cal.collect_data(list(good))
        ref = make_histocal(paths["cnn"], MM, opts, tmp_path / "b.onnx", mode=None)
        ref.collect_data(list(good))
        ref.collect_data(list(good))
        assert_tensors_same(ref.compute_data(), cal.compute_data(), "continued")


@pytest.mark.parity
def test_falsy_feed_in_the_middle_ends_the_data_with_a_warning(paths, tmp_path, caplog):
    """ORT's rule ends the data at the first falsy feed; histocal keeps it for every kind of data
    and warns when a list or iterator has items after it (an end marker ends a reader silently)."""
    feeds = models.cnn_feeds(3)
    ref = run_ort(paths["cnn"], PCT, {}, [[feeds[0]]], tmp_path / "o.onnx")
    cases = {
        "list": ([feeds[0], {}, feeds[1], feeds[2]], "the 2 item(s) after it are not used"),
        "iterator": (iter([feeds[0], None, feeds[1]]), "the items after it are not used"),
        "list ending in None": ([feeds[0], None], None),
        "reader": (RewindReader([feeds[0], {}, feeds[1]]), None),
    }
    for name, (data, warning) in cases.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="histocal"):
            ours = run_histocal(paths["cnn"], PCT, {}, [data], tmp_path / "h.onnx", form="as is")
        assert_tensors_same(ref.td, ours, name)
        messages = [r.getMessage() for r in caplog.records if "ends the data" in r.getMessage()]
        if warning is None:
            assert messages == [], name
        else:
            assert len(messages) == 1 and "item 1 is" in messages[0] and warning in messages[0], (name, messages)


class ShapeChangingReader(RewindReader):
    """Its second read has other batch shapes from batch ``k`` on (the values stay in range)."""

    def __init__(self, n: int, k: int | None, second_n: int | None = None):
        super().__init__([{"X": np.ones((1 + i % 2, 4), np.float32)} for i in range(n)])
        self.first, self.k, self.second_n = list(self.feeds), k, second_n

    def rewind(self):
        super().rewind()
        self.feeds = [
            {"X": np.ones((3, 4), np.float32)} if self.k is not None and i >= self.k else f
            for i, f in enumerate(self.first)
        ]
        if self.second_n is not None:
            self.feeds = (self.feeds * 2)[: self.second_n]


@pytest.mark.parametrize("k,kept", [(0, 0), (1, 0), (2, 0), (5, 0), (13, 0), (38, 0), (5, 3), (13, 4), (38, 7)])
def test_second_read_with_other_shapes_names_the_batches(paths, tmp_path, k, kept):
    """Exact mode reads again the batches over the memory budget (all but the first ``kept``)
    and checks every feed of that read, a skipped one's too, against digests of the first read's
    (constant memory per batch): the error names a span of batches that holds the first
    difference, found by batch 2k + 1 (or at the end)."""
    cal = make_histocal(paths["passthrough"], PCT, {"MemoryBudget": 0}, tmp_path / "a.onnx")
    reader = ShapeChangingReader(40, k)
    cal.memory_budget = sum(batch_bytes(cal, f["X"].shape) for f in reader.feeds[:kept])
    with quiet(), pytest.raises(ValueError, match="different data on its second read") as err:
        cal.collect_data(reader)
    text = str(err.value)
    span = re.match(r"batch(?:es)? (\d+)(?: to (\d+))?:", text)
    assert span, text
    first, last = int(span[1]), int(span[2] or span[1])
    assert first <= k <= last and (last <= 2 * k + 1 or last == 39), text


@pytest.mark.parametrize("second_n", [7, 13])
def test_second_read_with_another_batch_count(paths, tmp_path, second_n):
    cal = make_histocal(paths["passthrough"], PCT, {"MemoryBudget": 0}, tmp_path / "a.onnx")
    want = "10 batches on its first read and " + ("7 on its second" if second_n < 10 else "more on its second")
    with quiet(), pytest.raises(ValueError, match=want):
        cal.collect_data(ShapeChangingReader(10, None, second_n))


def test_exact_mode_memory_is_flat_over_many_batches(paths, tmp_path):
    """Exact mode keeps no per-batch record of the first read (it kept every batch's output
    shapes: ~250 bytes a batch here, 1.4 MB over the extra batches below). With a memory
    budget of 0 it keeps no outputs either: every batch runs twice."""
    feed = {"X": np.ones((1, 4), np.float32)}
    cal = make_histocal(paths["passthrough"], PCT, {"MemoryBudget": 0}, tmp_path / "a.onnx")

    def peak_growth(n: int) -> int:
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            cal.collect_data(lambda: (feed for _ in range(n)))  # a callable: read twice, exact mode
            return tracemalloc.get_traced_memory()[1] - start
        finally:
            tracemalloc.stop()

    with quiet():
        cal.collect_data([feed] * 10)  # first-call allocations out of the way
        small, large = peak_growth(200), peak_growth(6000)
    assert cal.state.counts("X")[4] == 6210
    assert large - small < 32 << 10, (small, large)

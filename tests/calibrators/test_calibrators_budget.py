"""Exact mode in one inference pass within a memory budget: the outputs of a call's batches are
kept while they fit (and holding them costs less than running them again), counted from memory,
and only the other batches run again. Whatever the budget and the choice (all batches kept,
some, none, in any pattern), the result is onnxruntime's; read-once data in auto
mode is exact within the budget and streaming beyond it (with a warning); the budget comes from
the keyword, ``extra_options["MemoryBudget"]``, ``HISTOCAL_MEMORY_BUDGET`` or the default.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.calibrator_runs import (
    DIST,
    ENT,
    ORT_QUANTIZE,
    PCT,
    OnceReader,
    RewindReader,
    assert_tensors_same,
    batch_bytes,
    chunks_for,
    flat,
    make_histocal,
    run_ort,
)
from support.parity import quiet
from test_calibrators_errors import ShapeChangingReader
from test_calibrators_exact import _symmetric_merge_drops

import histocal
from histocal.calibrators import budget as hb

HIST_CONFIGS = [
    (ENT, {}),
    (ENT, {"num_bins": 64, "num_quantized_bins": 16}),
    (PCT, {}),
    (PCT, {"symmetric": False, "num_bins": 256, "percentile": 99.5}),
    (DIST, {"num_bins": 512}),
    (DIST, {"num_bins": 512, "scenario": "p3"}),
]


class CountingSession:
    """An inference session that counts its runs (the batches inference was run on)."""

    def __init__(self, session):
        self._session, self.runs = session, 0

    def run(self, *args, **kwargs):
        self.runs += 1
        return self._session.run(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._session, name)


def counting(cal) -> CountingSession:
    cal.infer_session = CountingSession(cal.infer_session)
    return cal.infer_session


def as_source(feeds, form):
    if form == "list":
        return list(feeds)
    if form == "rewind":
        return RewindReader(feeds)
    if form == "callable":
        return lambda: iter(feeds)
    if form == "once":
        return OnceReader(feeds)
    raise AssertionError(form)


@st.composite
def budget_plans(draw):
    """1-3 collect_data calls of 1-4 batches (one batch size per call, as ORT needs), and how
    many of the first call's batches the budget holds (0, some or all), plus slack under one
    more batch."""
    calls = [(draw(st.integers(1, 4)), draw(st.integers(1, 3))) for _ in range(draw(st.integers(1, 3)))]
    kept = draw(st.integers(0, calls[0][0]))
    slack = draw(st.floats(0, 0.99))
    return calls, kept, slack


@pytest.mark.parity
@settings(max_examples=25, deadline=None)
@given(
    cfg=st.sampled_from(range(len(HIST_CONFIGS))),
    plan=budget_plans(),
    form=st.sampled_from(["list", "rewind", "callable", "once"]),
    seed=st.integers(0, 2**16),
)
def test_any_budget_gives_orts_result(paths, tmp_path_factory, cfg, plan, form, seed):
    """exact mode == ORT (as maps) whether the budget keeps every batch, some or none; inference
    runs once per batch plus once per batch over the budget (read-once data: once per batch)."""
    method, opts = HIST_CONFIGS[cfg]
    calls, kept, slack = plan
    rng = np.random.default_rng(seed)
    scale = rng.choice([1e-3, 1.0, 50.0])
    chunks = [[{"X": rng.normal(0, scale, (bs, 4)).astype(np.float32)} for _ in range(nb)] for nb, bs in calls]
    tmp = tmp_path_factory.mktemp("budget")
    ref = run_ort(paths["passthrough"], method, opts, chunks, tmp / "o.onnx")
    cal = make_histocal(paths["passthrough"], method, opts, tmp / "h.onnx")
    first_bs = calls[0][1]
    cal.memory_budget = int((kept + slack) * batch_bytes(cal, (first_bs, 4)))
    session = counting(cal)
    expected_runs = 0
    with quiet():
        for chunk, (nb, bs) in zip(chunks, calls):
            cal.collect_data(as_source(chunk, form))
            fit = min(nb, cal.memory_budget // batch_bytes(cal, (bs, 4)))
            expected_runs += nb + (0 if form == "once" else nb - fit)
        ours = cal.compute_data()
    assert session.runs == expected_runs
    assert cal.collection.mode == "exact"
    deviating = frozenset()
    if method == PCT and opts.get("symmetric", True) and len(chunks) > 1:
        deviating = _symmetric_merge_drops(ref, cal)  # ORT's merge drops values: docs/deviations.md
    where = f"{method.name} {opts} {calls} kept={kept} {form}"
    assert_tensors_same(ref.td, ours, where, ref, opts.get("num_quantized_bins", 128), deviating)


@pytest.mark.parity
@pytest.mark.parametrize("method,opts", [(ENT, {}), (PCT, {}), (DIST, {})], ids=["entropy", "percentile", "dist"])
@pytest.mark.parametrize("kept", [0, 2, 5], ids=["none-kept", "some-kept", "all-kept"])
def test_cnn_budget_kept_none_some_all(paths, tmp_path, method, opts, kept):
    """The CNN's five batches with a budget for none, two or all of them: ORT's result, and
    inference reruns exactly the batches that did not fit."""
    chunks = chunks_for("cnn", 1)
    ref = run_ort(paths["cnn"], method, opts, chunks, tmp_path / "o.onnx")
    cal = make_histocal(paths["cnn"], method, opts, tmp_path / "h.onnx")
    session = counting(cal)
    with quiet():
        cal.collect_data(chunks[0][:1])  # the first call, just to measure a batch's outputs
        one = sum(a.nbytes + hb.KEPT_ARRAY_OVERHEAD for a in session.run(cal.fetch_names(), chunks[0][0]))
        cal.restart()
        cal.memory_budget = kept * one
        session.runs = 0
        cal.collect_data(RewindReader(chunks[0]))
        ours = cal.compute_data()
    assert session.runs == 5 + (5 - kept)
    assert_tensors_same(ref.td, ours, f"{method.name} kept={kept}", ref)


# -- which batches are worth keeping ----------------------------------------------------------------


def test_hold_cost_is_measured_unless_fixed():
    saved, hb._hold_seconds_per_byte = hb._hold_seconds_per_byte, None
    try:
        assert 0 < hb.hold_seconds_per_byte() < 1e-6  # under 1 ms per KB
        hb._hold_seconds_per_byte = 2e-9
        assert hb.hold_seconds_per_byte() == 2e-9
    finally:
        hb._hold_seconds_per_byte = saved


def test_kept_outputs_judge_every_batch_by_the_cheapest_timed_rerun():
    """Holding a byte costs ``hold_cost``; running it again what the cheapest timed batch took per
    byte of its outputs, less what its page faults cost (a rerun reuses freed memory). Both stay
    fixed once measured, so every batch is judged alike: the old per-batch median flipped between
    keeping and not keeping as each batch's time (the previous batch's work in it) came and went."""

    def items(nbytes: int) -> list:
        return [("t", [np.zeros(nbytes // 4, np.float32)])]

    mb = 4_000_000
    size = mb + hb.KEPT_ARRAY_OVERHEAD
    kept = hb.KeptOutputs(1 << 30, hold_cost=1e-9)  # 1 ms per MB
    kept.timed(0, 0.5)  # a cold first run: 125 ns per byte
    assert kept.offer(0, items(mb))
    kept.timed(1, 0.020)  # 5 ns per byte: still worth holding
    assert kept.offer(1, items(mb))
    assert kept.offer(2, items(10 * mb))  # untimed: judged per byte by the same measure
    # 20 ms of which 16.4 ms system time (its page faults): 0.9 ns per byte, under 1 ns
    kept.timed(3, 0.020, faults=977, system=0.0164)
    assert not kept.offer(3, items(mb))
    assert [kept.offer(i, items(mb)) for i in range(4, 7)] == [False] * 3
    assert kept.kept == {0, 1, 2}
    assert abs(kept._rerun - (0.020 - 0.0164) / size) < 1e-15
    # System time past what faulting in the outputs can cost (HOLD_COST_CEILING per byte) is not
    # theirs (a loaded machine's thread wakeups): a rerun pays it too, so it is not discounted.
    small = hb.KeptOutputs(1 << 30, hold_cost=1e-9)
    small.timed(0, 0.001, system=0.001)  # all of 1 ms in system time, for 4 KB of outputs
    assert small.offer(0, items(4000))
    tiny = 4000 + hb.KEPT_ARRAY_OVERHEAD
    assert abs(small._rerun - (0.001 - tiny * hb.HOLD_COST_CEILING) / tiny) < 1e-15
    free = hb.KeptOutputs(1 << 30)  # no cost: the budget alone decides
    free.timed(0, 1e-9)
    assert free.offer(0, items(4000)) and not free.wants_timing(1)
    tight = hb.KeptOutputs(2 * (4000 + hb.KEPT_ARRAY_OVERHEAD))
    assert [tight.offer(i, items(4000)) for i in range(3)] == [True, True, False]
    assert not tight.offer(3, items(4)) and tight.full  # nothing kept after a batch that did not fit
    measured = hb.KeptOutputs(1 << 30, hold_cost=None)
    assert [measured.wants_timing(i) for i in range(5)] == [True, False, True, False, False]
    assert not hb.KeptOutputs(0, hold_cost=None).wants_timing(0)  # two passes whatever is measured


def test_timed_batches_run_alone(paths, tmp_path):
    """A timed batch runs after the previous batch's work is done: its time is inference alone,
    not the CPU the previous batch's histogram work took meanwhile (0.2 s of it here)."""
    from histocal.calibrators.common import run_batches
    from histocal.io.readers import DataSource

    cal = make_histocal(paths["passthrough"], PCT, {}, tmp_path / "a.onnx")
    times: dict[int, float] = {}
    systems: list[float] = []  # the system time's share of each timed batch's seconds

    def busy(i: int, items: list) -> None:
        end = time.process_time() + 0.2
        while time.process_time() < end:
            pass

    feeds = [{"X": np.ones((2, 4), np.float32)}] * 4
    with quiet():
        n = run_batches(
            cal,
            DataSource(feeds),
            cal.fetch_names(),
            busy,
            "t",
            timed=lambda i, s, faults, system: times.__setitem__(i, s) or systems.append(system / s if s else 0.0),
            wants_timing=lambda i: i < 3,
        )
    assert n == 4 and sorted(times) == [0, 1, 2]
    assert max(times.values()) < 0.1, times
    assert all(0 <= share <= 1 for share in systems), systems


@pytest.mark.parity
@settings(max_examples=20, deadline=None)
@given(
    cfg=st.sampled_from(range(len(HIST_CONFIGS))),
    pattern=st.lists(st.booleans(), min_size=1, max_size=7),
    form=st.sampled_from(["list", "rewind", "callable"]),
    seed=st.integers(0, 2**16),
)
def test_any_choice_of_kept_batches_gives_orts_result(paths, tmp_path_factory, cfg, pattern, form, seed):
    """Whichever batches the cost model keeps (any pattern, not only the first ones), the result is
    onnxruntime's and inference runs again exactly the batches not kept."""
    method, opts = HIST_CONFIGS[cfg]
    rng = np.random.default_rng(seed)
    chunk = [{"X": rng.normal(0, rng.choice([1e-3, 1.0, 50.0]), (2, 4)).astype(np.float32)} for _ in pattern]
    tmp = tmp_path_factory.mktemp("pattern")
    ref = run_ort(paths["passthrough"], method, opts, [chunk], tmp / "o.onnx")
    cal = make_histocal(paths["passthrough"], method, opts, tmp / "h.onnx")
    session = counting(cal)
    choices = iter(pattern)
    original = hb.KeptOutputs._worth_holding
    hb.KeptOutputs._worth_holding = lambda self, size: next(choices)
    try:
        with quiet():
            cal.collect_data(as_source(chunk, form))
            ours = cal.compute_data()
    finally:
        hb.KeptOutputs._worth_holding = original
    assert session.runs == len(pattern) + pattern.count(False)
    assert_tensors_same(
        ref.td, ours, f"{method.name} {opts} kept {pattern} {form}", ref, opts.get("num_quantized_bins", 128)
    )


@pytest.mark.parametrize("k", [0, 3, 9, 30])
def test_second_read_of_scattered_batches_names_where_it_differs(paths, tmp_path, k):
    """With every third batch kept, the second read of the others is still checked: a reader
    whose batches change shape from batch ``k`` on fails, naming a span that holds ``k``."""
    cal = make_histocal(paths["passthrough"], PCT, {}, tmp_path / "a.onnx")
    reader = ShapeChangingReader(40, k)
    original = hb.KeptOutputs._worth_holding
    offered = iter(range(40))
    hb.KeptOutputs._worth_holding = lambda self, size: next(offered) % 3 == 0
    try:
        with quiet(), pytest.raises(ValueError, match="different data on its second read") as err:
            cal.collect_data(reader)
    finally:
        hb.KeptOutputs._worth_holding = original
    span = re.match(r"batch(?:es)? (\d+)(?: to (\d+))?:", str(err.value))
    assert span, str(err.value)
    first, last = int(span[1]), int(span[2] or span[1])
    assert first <= max(k, 1) and k <= last, str(err.value)


def test_tiny_outputs_are_kept_without_measuring(paths, tmp_path):
    """Outputs far cheaper to hold than their batch is to run are kept (one pass), as measured."""
    cal = make_histocal(paths["passthrough"], PCT, {}, tmp_path / "a.onnx")
    session = counting(cal)
    saved, hb._hold_seconds_per_byte = hb._hold_seconds_per_byte, None
    try:
        with quiet():
            cal.collect_data(RewindReader([{"X": np.ones((2, 4), np.float32)}] * 6))
    finally:
        hb._hold_seconds_per_byte = saved
    assert session.runs == 6


@pytest.mark.parity
@pytest.mark.parametrize("cost,runs", [(0.0, 5), (float("inf"), 10)], ids=["holding-free", "holding-dear"])
def test_cnn_holds_nothing_where_holding_costs_more(paths, tmp_path, cost, runs):
    """The CNN's five batches within the default budget: all kept where holding costs nothing,
    all run again where it costs more than any rerun; onnxruntime's result either way."""
    chunks = chunks_for("cnn", 1)
    ref = run_ort(paths["cnn"], ENT, {}, chunks, tmp_path / "o.onnx")
    cal = make_histocal(paths["cnn"], ENT, {}, tmp_path / "h.onnx")
    session = counting(cal)
    saved, hb._hold_seconds_per_byte = hb._hold_seconds_per_byte, cost
    try:
        with quiet():
            cal.collect_data(RewindReader(chunks[0]))
            ours = cal.compute_data()
    finally:
        hb._hold_seconds_per_byte = saved
    assert session.runs == runs
    assert_tensors_same(ref.td, ours, f"hold cost {cost}", ref)


@contextlib.contextmanager
def warnings_of(caplog):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="histocal"):
        yield lambda: [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parity
def test_read_once_auto_exact_within_budget_streaming_beyond(paths, tmp_path, caplog):
    """auto mode with a reader without rewind(): ORT's result without a warning while the outputs
    fit; beyond the budget streaming mode's result (nothing lost: the streaming histogram was fed
    from the first batch), with a warning saying how to get the exact result."""
    chunks = chunks_for("cnn", 3)
    ref = run_ort(paths["cnn"], PCT, {}, chunks[:1], tmp_path / "o.onnx")
    with warnings_of(caplog) as messages, quiet():
        cal = make_histocal(paths["cnn"], PCT, {}, tmp_path / "a.onnx", mode=None)
        cal.collect_data(OnceReader(chunks[0]))
        within = cal.compute_data()
    assert cal.collection.mode == "exact" and messages() == []
    assert_tensors_same(ref.td, within, "auto, read once, within the budget")

    streaming = make_histocal(paths["cnn"], PCT, {}, tmp_path / "s.onnx", mode="streaming")
    with quiet():
        for chunk in chunks:
            streaming.collect_data(chunk)
        want = streaming.compute_data()
    # over the budget in the first call, or only in a later call (the earlier calls were exact)
    for over_from_call in (0, 1):
        cal = make_histocal(paths["cnn"], PCT, {}, tmp_path / "b.onnx", mode=None)
        with warnings_of(caplog) as messages, quiet():
            for i, chunk in enumerate(chunks):
                cal.memory_budget = 0 if i >= over_from_call else None
                cal.collect_data(OnceReader(chunk))
            got = cal.compute_data()
        assert cal.collection.mode == "streaming"
        (warning,) = messages()
        for part in ("read only once", "memory budget", "HISTOCAL_MEMORY_BUDGET", "streaming mode", "read again"):
            assert part in warning, warning
        assert_tensors_same(want, got, f"auto, read once, over the budget from call {over_from_call}")


@pytest.mark.parity
def test_read_once_exact_over_budget_keeps_everything(paths, tmp_path, caplog):
    """mode='exact' with read-once data over the budget keeps every batch as ORT does (ORT's
    result), with a warning that names the budget and the ways to stay within it."""
    chunks = chunks_for("transformer", 3)
    ref = run_ort(paths["transformer"], DIST, {}, chunks, tmp_path / "o.onnx")
    cal = make_histocal(paths["transformer"], DIST, {"MemoryBudget": "1k"}, tmp_path / "h.onnx")
    assert cal.memory_budget == 1024
    with warnings_of(caplog) as messages, quiet():
        for chunk in chunks:
            cal.collect_data(OnceReader(chunk))
        ours = cal.compute_data()
    assert cal.collection.mode == "exact"
    assert len(messages()) == 3 and all("like onnxruntime does" in m and "1 KiB" in m for m in messages())
    assert_tensors_same(ref.td, ours, "exact, read once, over the budget")


def test_kept_outputs_stay_within_the_budget(paths, tmp_path):
    """Memory grows with the budget, not with the number of batches: 200 and 6000 batches of a
    re-readable source with a 64 KiB budget peak within a few KiB of each other."""
    feed = {"X": np.ones((1, 4), np.float32)}
    budget = 64 << 10
    cal = make_histocal(paths["passthrough"], PCT, {"MemoryBudget": budget}, tmp_path / "a.onnx")

    def peak_growth(n: int) -> int:
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            cal.collect_data(lambda: (feed for _ in range(n)))
            return tracemalloc.get_traced_memory()[1] - start
        finally:
            tracemalloc.stop()

    with quiet():
        cal.collect_data([feed] * 10)
        small, large = peak_growth(200), peak_growth(6000)
    assert cal.state.counts("X")[4] == 6210
    assert large - small < 32 << 10, (small, large)
    assert large < budget + (128 << 10), large


# -- where the budget comes from ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,size",
    [(0, 0), (123, 123), ("123", 123), ("2k", 2048), ("1.5M", 3 << 19), ("2GiB", 2 << 30), ("4 GB", 4 * 10**9)],
)
def test_sizes(text, size):
    assert hb.parse_size(text, "x") == size


@pytest.mark.parametrize("bad", [-1, True, 1.5, "lots", "2 XB", "", None, "-3M"])
def test_bad_sizes_are_named(bad):
    with pytest.raises(ValueError, match="^memory_budget must be a size in bytes"):
        hb.parse_size(bad, "memory_budget")


def test_budget_precedence(paths, tmp_path, monkeypatch):
    """keyword / extra_options > HISTOCAL_MEMORY_BUDGET > default (min of 25% of available
    memory and 8 GiB); a bad environment value is an error naming the variable."""
    monkeypatch.delenv(hb.MEMORY_BUDGET_ENV, raising=False)
    default = hb.resolve_memory_budget(None)
    available = hb.available_memory()
    assert available is not None and available > 0
    assert 0 < default <= min(available // 4, 8 << 30)
    monkeypatch.setenv(hb.MEMORY_BUDGET_ENV, "3M")
    assert hb.resolve_memory_budget(None) == 3 << 20
    assert hb.resolve_memory_budget(5) == 5
    cal = histocal.create_calibrator(
        paths["passthrough"], None, (tmp_path / "a.onnx").as_posix(), PCT, extra_options={"MemoryBudget": "7k"}
    )
    assert cal.memory_budget == 7 << 10
    assert histocal.PercentileCalibrater(paths["passthrough"], memory_budget=9).memory_budget == 9
    with pytest.raises(ValueError, match="memory_budget must be a size"):
        histocal.PercentileCalibrater(paths["passthrough"], memory_budget="much")
    monkeypatch.setenv(hb.MEMORY_BUDGET_ENV, "much")
    cal = make_histocal(paths["passthrough"], PCT, {}, tmp_path / "b.onnx")
    with pytest.raises(ValueError, match="HISTOCAL_MEMORY_BUDGET must be a size"):
        cal.collect_data([{"X": np.ones((1, 4), np.float32)}])


def test_cgroup_limit_lowers_the_available_memory(tmp_path):
    (tmp_path / "memory.max").write_text("1000000\n")
    (tmp_path / "memory.current").write_text("400000\n")
    assert hb.cgroup_available(tmp_path) == 600000
    (tmp_path / "memory.max").write_text("max\n")
    assert hb.cgroup_available(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("2000\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text("3000\n")
    assert hb.cgroup_available(v1) == 0


# -- under onnxruntime's quantize_static ------------------------------------------------------------


@contextlib.contextmanager
def recording_ranges(results: list):
    """Record the TensorsData of every calibrator ORT's quantize_static creates (ORT's or, when
    patched, histocal's)."""
    create = ORT_QUANTIZE.create_calibrator

    def spy(*args, **kwargs):
        cal = create(*args, **kwargs)
        compute = cal.compute_data

        def recorded():
            results.append(compute())
            return results[-1]

        cal.compute_data = recorded
        return cal

    ORT_QUANTIZE.create_calibrator = spy
    try:
        yield
    finally:
        ORT_QUANTIZE.create_calibrator = create


@pytest.mark.parametrize("model", ["cnn", "transformer"])
@pytest.mark.parametrize("method", [ENT, PCT, DIST], ids=lambda m: m.name)
def test_patched_quantize_static_with_a_read_once_reader_is_orts(paths, tmp_path, monkeypatch, model, method):
    """patch_onnxruntime() + ORT's quantize_static + a CalibrationDataReader without rewind():
    the same ranges (as maps) and the same quantized model as ORT's own; with the budget set to
    0 through the environment (the only way through ORT's quantize_static), streaming with a
    warning instead."""
    monkeypatch.delenv(hb.MEMORY_BUDGET_ENV, raising=False)
    feeds = flat(chunks_for(model, 1))
    ort_ranges: list = []
    ours: list = []
    with quiet(), recording_ranges(ort_ranges):
        ORT_QUANTIZE.quantize_static(
            paths[model], (tmp_path / "o.onnx").as_posix(), OnceReader(feeds), calibrate_method=method
        )
    with quiet(), histocal.patch_onnxruntime(), recording_ranges(ours):
        ORT_QUANTIZE.quantize_static(
            paths[model], (tmp_path / "h.onnx").as_posix(), OnceReader(feeds), calibrate_method=method
        )
        monkeypatch.setenv(hb.MEMORY_BUDGET_ENV, "0")
        ORT_QUANTIZE.quantize_static(
            paths[model], (tmp_path / "s.onnx").as_posix(), OnceReader(feeds), calibrate_method=method
        )
    assert not hasattr(ORT_QUANTIZE.create_calibrator, "__wrapped__")  # ORT's own again, not the patch's
    assert_tensors_same(ort_ranges[0], ours[0], f"{model} {method.name} quantize_static, read once")
    assert (tmp_path / "o.onnx").read_bytes() == (tmp_path / "h.onnx").read_bytes()
    assert set(ours[1].data) == set(ort_ranges[0].data)  # streaming: valid ranges for every tensor

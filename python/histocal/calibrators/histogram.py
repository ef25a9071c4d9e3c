"""ORT-compatible calibrators whose statistics run in histocal's Rust core.

Each class subclasses onnxruntime's own (same constructor, graph augmentation, session and
tensor selection), so it works wherever ORT's does; only data collection and the statistics
change:

* ``MinMaxCalibrater``: ORT's in-graph ReduceMin/ReduceMax, results identical to ORT's, except
  that ``max_intermediate_outputs`` folds each chunk into the range instead of discarding it,
  per-channel ranges merge across ``collect_data`` calls (ORT raises there), and those merges
  ignore NaN as ORT does within a chunk (ORT keeps an earlier all-NaN call's NaN).
* ``EntropyCalibrater``, ``PercentileCalibrater``, ``DistributionCalibrater``: histograms in
  bounded memory, in one of two modes:

  - ``exact``: the same TensorsData as ORT for the same ``collect_data`` calls. Data that can be
    read twice is read twice (global ranges, then fixed-edge counting), one batch at a time;
    data that can only be read once is buffered per call like ORT does, with a warning.
  - ``streaming``: one pass, one batch in memory at a time, and a histogram that does not depend
    on how the data is batched or ordered (a power-of-two-aligned histogram of
    ``streaming_bins`` bins; ORT's methods then run on an ORT-shaped histogram derived from it).
  - ``auto`` (default): ``exact`` when the data can be read twice, else ``streaming``.

Every calibrator serializes its calls with its own lock (shared with its collector), so one
calibrator may be used from several threads: calls run one at a time, and a ``collect_data``
that fails undoes only its own work. Without an ``augmented_model_path`` each calibrator writes
its augmented model to its own temporary folder (removed with the calibrator).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import onnxruntime
from onnxruntime.quantization import calibrate as ort_calibrate
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

from .. import _core, methods
from ..collector import HistogramCollector, copy_histograms, copy_stream
from ..io.readers import DataSource, FeedChecker, progress, run_session
from ..state import CalibrationState, load_into_calibrator

logger = logging.getLogger(__name__)

MODES = ("auto", "exact", "streaming")
DEFAULT_STREAMING_BINS = 16384
MODE_OPTION = "CollectionMode"
STREAMING_BINS_OPTION = "StreamingBins"
METHOD_OPTIONS_OPTION = "MethodOptions"

_METHODS = {
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
    "distribution": CalibrationMethod.Distribution,
}


def _check_mode(mode: str | None) -> str:
    mode = "auto" if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def _check_streaming_bins(n: int | None) -> int:
    n = DEFAULT_STREAMING_BINS if n is None else n
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 8 or n & (n - 1):
        raise ValueError(f"streaming_bins must be a power of two >= 8, got {n!r}")
    return int(n)


def _augmented_model_path(owner: Any, path: str | Path | None) -> str | Path:
    """``path``, or where none is given a file in a temporary folder of ``owner``'s own (removed
    with it): calibrators created at once with ORT's shared default path would write and load
    each other's augmented models."""
    if path is not None:
        return path
    folder = tempfile.mkdtemp(prefix="histocal_augmented_")
    weakref.finalize(owner, shutil.rmtree, folder, ignore_errors=True)
    return os.path.join(folder, "augmented_model.onnx")


def _one_call_at_a_time(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method`` holding the calibrator's lock: calls from several threads take turns."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


def _is_checkpoint(i: int) -> bool:
    return i & (i + 1) == 0  # i = 2^k - 1: batches 0, 1, 3, 7, 15, ...


class _ReadDigest:
    """The output shapes and dtypes of one read's batches in O(log batches) memory: a running
    digest, kept after batches 0, 1, 3, 7, ... (2^k - 1) for a second read to compare with. A
    second read that differs is caught by twice the batch index where it starts differing, and
    the error names the span of batches (between two kept digests) where it does."""

    def __init__(self) -> None:
        self.digest = b""
        self.kept: dict[int, bytes] = {}

    def add(self, items: list[tuple[str, list[np.ndarray]]]) -> None:
        h = hashlib.blake2b(self.digest, digest_size=16)
        for _, arrays in items:
            h.update(f"{arrays[0].dtype.str}{arrays[0].shape};".encode())
        self.digest = h.digest()


def _second_read_differs(first: int, last: int) -> ValueError:
    where = f"batch {last}" if first == last else f"batches {first} to {last}"
    return ValueError(
        f"{where}: the data reader returned different data on its second read "
        "(exact mode reads the data twice; it must yield the same batches each time, "
        "or use mode='streaming')"
    )


def _run_batches(
    calibrator: Any,
    source: DataSource,
    fetch: list[str],
    consume: Callable[[int, list[tuple[str, list[np.ndarray]]]], None],
    desc: str,
) -> int:
    """Run every batch of one read and hand its outputs to ``consume``. ``consume`` (Rust work,
    GIL released) runs on a worker thread while ORT infers the next batch, so at most two
    batches of outputs are alive. Returns the number of batches."""
    session = calibrator.infer_session
    checker = FeedChecker(session)
    inputs = set(checker.inputs)
    pending: Future | None = None
    n = 0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="histocal") as pool:
        for feed in progress(source.read(), desc, calibrator.show_progress):
            outputs = run_session(session, fetch, checker.check(feed, n), n)
            # ORT returns outputs that are also inputs as views of the feed (ORT issue #21922):
            # copy them, as ORT does, since the reader may reuse its buffers for the next batch.
            items = [(name, [a.copy() if name in inputs else a]) for name, a in zip(fetch, outputs)]
            if pending is not None:
                pending.result()
            pending = pool.submit(consume, n, items)
            n += 1
        if pending is not None:
            pending.result()
    return n


def _binned_and_binnable(hist: Any) -> dict[str, tuple[int, int, int, bool]]:
    """Per tensor: values in the histogram, finite values and infinities collected, and whether
    the edges end in +inf (an |x| histogram past float16's range: like ORT, it then bins later
    infinities in its last bin)."""
    out = {}
    for n in hist.names():
        h, edges = hist.state(n)[:2]
        finite, _, posinf, neginf, _ = hist.counts(n)
        out[n] = (int(h.sum()), finite, posinf + neginf, bool(np.isposinf(edges[-1])))
    return out


class _HistogramCalibration:
    """Collection and statistics shared by the histogram calibrators (put before ORT's class)."""

    method: str
    symmetric: bool
    num_bins: int
    num_quantized_bins: int
    percentile: float
    scenario: str
    tensors_to_calibrate: set[str] | None
    collector: HistogramCollector | None

    def _init_histocal(self, mode: str | None, streaming_bins: int | None, show_progress: bool | None) -> None:
        self._lock = threading.RLock()
        self.mode = _check_mode(mode)
        self.streaming_bins = _check_streaming_bins(streaming_bins)
        self.show_progress = show_progress
        self._stream: Any = None
        self._mode_used: str | None = None
        self._new_collector()  # validates the settings now (ORT only does at collect time)

    def _new_collector(self) -> HistogramCollector:
        collector = HistogramCollector(
            method=self.method,
            symmetric=self.symmetric,
            num_bins=self.num_bins,
            num_quantized_bins=self.num_quantized_bins,
            percentile=self.percentile,
            scenario=self.scenario,
        )
        collector._lock = self._lock  # one lock: the calibrator's calls reach into the collector
        return collector

    @_one_call_at_a_time
    def augment_graph(self) -> None:
        super().augment_graph()  # type: ignore[misc]

    @_one_call_at_a_time
    def create_inference_session(self) -> None:
        """ORT's calibration session (graph optimizations off), except that its intra-op threads
        sleep between operators instead of spinning: the Rust work on the previous batch runs
        alongside inference and needs those cycles (benches/bench_overlap.py, 2 cores: streaming
        collection 10% faster; ORT alone is slower this way on an idle machine, faster when
        another process wants a core)."""
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.infer_session = onnxruntime.InferenceSession(
            self.augmented_model_path, sess_options=options, providers=self.execution_providers
        )

    @property
    def _kind(self) -> str:
        return "abs" if self.method == "percentile" and self.symmetric else "value"

    def _fetch_names(self) -> list[str]:
        if self.tensors_to_calibrate is None:
            raise RuntimeError("call augment_graph() and create_inference_session() before collect_data()")
        return [o.name for o in self.infer_session.get_outputs() if o.name in self.tensors_to_calibrate]

    @_one_call_at_a_time
    def collect_data(self, data_reader: Any) -> None:
        """Collect one call's batches; may be called several times (ORT's merge rule applies
        between calls in exact mode; streaming mode treats all calls as one data set). A call
        that fails leaves what earlier calls collected unchanged."""
        saved = self._snapshot()
        try:
            self._collect_call(data_reader)
        except BaseException:
            self._restore(*saved)
            raise

    def _snapshot(self) -> tuple[Any, Any, Any, Any]:
        histograms = None
        if self.collector is not None:
            histograms = _core.Histograms(self._kind, self.collector.num_bins)
            copy_histograms(self.collector._histograms, histograms)
        stream = None if self._stream is None else copy_stream(self._stream)
        return self._mode_used, self.collector, histograms, stream

    def _restore(self, mode_used: Any, collector: Any, histograms: Any, stream: Any) -> None:
        # The same collector object, with its histograms as they were: a caller holding
        # ``calibrator.collector`` sees no trace of the failed call either.
        self._mode_used, self.collector, self._stream = mode_used, collector, stream
        if collector is not None:
            collector._roll_back_to(histograms)

    def _collect_call(self, data_reader: Any) -> None:
        source = DataSource(data_reader)
        if self._mode_used is None:
            self._mode_used = self.mode if self.mode != "auto" else ("exact" if source.rereadable else "streaming")
            logger.info("collection mode: %s", self._mode_used)
        fetch = self._fetch_names()
        if self._mode_used == "streaming":
            n = self._collect_streaming(source, fetch)
        elif source.rereadable:
            n = self._collect_two_pass(source, fetch)
        else:
            n = self._collect_buffered(source, fetch)
        if n == 0:
            raise ValueError("No data is collected.")

    def _collect_streaming(self, source: DataSource, fetch: list[str]) -> int:
        if self._stream is None:
            self._stream = self._new_stream()
        stream = self._stream
        return _run_batches(self, source, fetch, lambda _, items: stream.collect(items), "histocal collect")

    def _collect_two_pass(self, source: DataSource, fetch: list[str]) -> int:
        if self.collector is None:
            self.collector = self._new_collector()
        hist = self.collector._histograms
        stream = self._exact_stream()
        # Constant memory per batch (a long stream must not grow it): the second read is checked
        # against digests of the first, not against a list of every batch's shapes.
        first, second = _ReadDigest(), _ReadDigest()

        def scan(i: int, items: list) -> None:
            first.add(items)
            if _is_checkpoint(i):
                first.kept[i] = first.digest
            # The state's streaming histogram (see state.py) is fed here, from the same scans.
            hist.scan(items, stream)

        def count(i: int, items: list) -> None:
            if i >= n:
                raise ValueError(
                    f"the data reader returned {n} batches on its first read and more on its second "
                    "(exact mode reads the data twice; it must yield the same batches each time)"
                )
            second.add(items)
            if _is_checkpoint(i) and second.digest != first.kept[i]:
                raise _second_read_differs((i + 1) // 2, i)
            hist.count(items)

        before = _binned_and_binnable(hist)
        n = _run_batches(self, source, fetch, scan, "histocal pass 1/2 (ranges)")
        if n == 0:
            return 0
        hist.plan()
        n2 = _run_batches(self, source, fetch, count, "histocal pass 2/2 (histograms)")
        if n2 != n:
            raise ValueError(
                f"the data reader returned {n} batches on its first read and {n2} on its second "
                "(exact mode reads the data twice; it must yield the same batches each time)"
            )
        if second.digest != first.digest:
            raise _second_read_differs(max(first.kept) + 1, n - 1)
        self.collector._refresh()  # its histogram_dict, if handed out, shows this collect
        # Values outside the first read's ranges were not binned: the reader changed its data.
        for name, (binned, finite, infs, _) in _binned_and_binnable(hist).items():
            b0, f0, i0, open_top = before.get(name, (0, 0, 0, False))
            # infinities are binned only where the edges ended in +inf before this collect
            binnable = finite - f0 + (infs - i0 if open_top else 0)
            if binned - b0 != binnable:
                raise ValueError(
                    f"tensor {name!r}: the data reader returned different data on its second read "
                    f"({binnable - (binned - b0)} values fell outside the ranges of the first read); "
                    "exact mode reads the data twice and needs the same batches each time, "
                    "or use mode='streaming'"
                )
        return n

    def _collect_buffered(self, source: DataSource, fetch: list[str]) -> int:
        logger.warning(
            "The calibration data can be read only once, so histocal's exact mode keeps every "
            "batch's outputs in memory like onnxruntime does. To stay in bounded memory, pass a "
            "list, a reader with rewind(), or a callable returning a fresh iterable, or use "
            "mode='streaming'."
        )
        buffered: dict[str, list[np.ndarray]] = {name: [] for name in fetch}

        stream = self._exact_stream()

        def keep(_: int, items: list) -> None:
            stream.collect(items)  # the state's streaming histogram (see state.py)
            for name, arrays in items:
                buffered[name].extend(arrays)

        n = _run_batches(self, source, fetch, keep, "histocal collect")
        if n:
            if self.collector is None:
                self.collector = self._new_collector()
            self.collector.collect(buffered)
        return n

    def _new_stream(self) -> Any:
        return _core.StreamHistograms(self.streaming_bins)

    def _exact_stream(self) -> Any:
        """Exact mode also feeds a streaming histogram, so that its state serves every method."""
        if self._stream is None:
            self._stream = self._new_stream()
        return self._stream

    @_one_call_at_a_time
    def _restart_collection(self) -> None:
        """Forget everything collected, keeping the augmented model, the session and the mode
        already settled on (so that new data is collected the way the first was). ORT's
        ``clear_collected_data`` only drops buffered outputs, and keeps that meaning here."""
        self.collector = None
        self._stream = None

    @property
    def state(self) -> Any:
        """A ``histocal.CalibrationState`` (copy) of what has been collected."""
        return CalibrationState.from_calibrator(self)

    def save_state(self, path: str | Path, data_fingerprint: str | None = None, compress: bool = False) -> None:
        """Save the collected histogram state (see ``histocal.CalibrationState``)."""
        CalibrationState.from_calibrator(self, data_fingerprint).save(path, compress)

    @_one_call_at_a_time
    def load_state(self, state: Any) -> None:
        """Start from (merge in) a ``CalibrationState`` or a state file of this model and options."""
        load_into_calibrator(self, state)

    @_one_call_at_a_time
    def compute_data(self) -> TensorsData:
        method = _METHODS[self.method]
        if self._mode_used == "streaming":
            collector = self._new_collector()
            collector._histograms = self._stream.to_histograms(self._kind, self.num_bins)
            return TensorsData(method, collector.compute_collection_result())
        if self.collector is None:
            raise ValueError("No collector created and can't generate calibration data.")
        return TensorsData(method, self.collector.compute_collection_result())


class EntropyCalibrater(_HistogramCalibration, ort_calibrate.EntropyCalibrater):
    def __init__(
        self,
        model_path: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "entropy",
        symmetric: bool = False,
        num_bins: int = 128,
        num_quantized_bins: int = 128,
        *,
        mode: str | None = None,
        streaming_bins: int | None = None,
        show_progress: bool | None = None,
    ) -> None:
        super().__init__(
            model_path, op_types_to_calibrate, _augmented_model_path(self, augmented_model_path), use_external_data_format,
            method=method, symmetric=symmetric, num_bins=num_bins, num_quantized_bins=num_quantized_bins,
        )
        self._init_histocal(mode, streaming_bins, show_progress)


class PercentileCalibrater(_HistogramCalibration, ort_calibrate.PercentileCalibrater):
    def __init__(
        self,
        model_path: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "percentile",
        symmetric: bool = False,
        num_bins: int = 2048,
        percentile: float = 99.999,
        *,
        mode: str | None = None,
        streaming_bins: int | None = None,
        show_progress: bool | None = None,
    ) -> None:
        super().__init__(
            model_path, op_types_to_calibrate, _augmented_model_path(self, augmented_model_path), use_external_data_format,
            method=method, symmetric=symmetric, num_bins=num_bins, percentile=percentile,
        )
        self._init_histocal(mode, streaming_bins, show_progress)


class DistributionCalibrater(_HistogramCalibration, ort_calibrate.DistributionCalibrater):
    def __init__(
        self,
        model_path: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "distribution",
        num_bins: int = 128,
        scenario: str = "same",
        *,
        mode: str | None = None,
        streaming_bins: int | None = None,
        show_progress: bool | None = None,
    ) -> None:
        super().__init__(
            model_path, op_types_to_calibrate, _augmented_model_path(self, augmented_model_path), use_external_data_format,
            method=method, num_bins=num_bins, scenario=scenario,
        )
        self._init_histocal(mode, streaming_bins, show_progress)


class MethodCalibrater(_HistogramCalibration, ort_calibrate.HistogramCalibrater):
    """histocal's own methods (mse, kl, pow2, auto) and registered ones, from one streaming
    pass: ``compute_data`` returns their ranges as MinMax-style TensorsData (see
    ``histocal.methods``). Always collects in streaming mode (the methods read the streaming
    histogram)."""

    def __init__(
        self,
        model_path: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "mse",
        method_options: dict[str, Any] | None = None,
        *,
        streaming_bins: int | None = None,
        show_progress: bool | None = None,
    ) -> None:
        name = methods.canonical_name(method)
        if name in methods.ORT_METHODS:
            raise ValueError(f"{name} is an onnxruntime method: use its own calibrator (or create_calibrator)")
        self.method_options = methods.check_options(name, dict(method_options or {}))
        super().__init__(model_path, op_types_to_calibrate, _augmented_model_path(self, augmented_model_path), use_external_data_format, method=name)
        self._lock = threading.RLock()
        self.mode = "streaming"
        self.streaming_bins = _check_streaming_bins(streaming_bins)
        self.show_progress = show_progress
        self._stream = None
        self._mode_used = None

    def _new_stream(self) -> Any:
        # pow2 MostCommon needs every batch's vote, collected as the batches come
        votes = self.method == "pow2" and self.method_options.get("minmse_mode") == "MostCommon"
        return _core.StreamHistograms(self.streaming_bins, pow2_votes=votes)

    @_one_call_at_a_time
    def compute_data(self) -> TensorsData:
        if self._stream is None:
            raise ValueError("No collector created and can't generate calibration data.")
        # read the collected histograms in place: no copy of every tensor's bins
        return CalibrationState._of_calibrator(self, None, copy_stream=False).compute(self.method, **self.method_options)


def _nan_min(old: Any, new: Any) -> Any:
    """Python ``min(old, new)`` (ORT's merge: ``old`` on ties, so the same object), except that
    a NaN never wins over a number; elementwise for per-channel arrays."""
    if np.ndim(old) == 0 or np.size(old) == 1:
        return new if new < old or np.isnan(old) else old
    return np.where((new < old) | np.isnan(old), new, old)


def _nan_max(old: Any, new: Any) -> Any:
    if np.ndim(old) == 0 or np.size(old) == 1:
        return new if new > old or np.isnan(old) else old
    return np.where((new > old) | np.isnan(old), new, old)


class MinMaxCalibrater(ort_calibrate.MinMaxCalibrater):
    """ORT's MinMax (in-graph ReduceMin/ReduceMax, identical results), with readers of any kind,
    a progress bar, only the reduced outputs fetched, ``max_intermediate_outputs`` folding
    chunks instead of discarding them, and per-channel ranges that merge across calls, NaN
    ignored: the range is the NaN-ignoring one of all batches, however they are chunked."""

    def __init__(
        self,
        model_path: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        symmetric: bool = False,
        use_external_data_format: bool = False,
        moving_average: bool = False,
        averaging_constant: float = 0.01,
        max_intermediate_outputs: int | None = None,
        per_channel: bool = False,
        *,
        show_progress: bool | None = None,
    ) -> None:
        super().__init__(
            model_path, op_types_to_calibrate, _augmented_model_path(self, augmented_model_path), symmetric=symmetric,
            use_external_data_format=use_external_data_format, moving_average=moving_average,
            averaging_constant=averaging_constant, max_intermediate_outputs=max_intermediate_outputs,
            per_channel=per_channel,
        )
        if max_intermediate_outputs is not None and (
            isinstance(max_intermediate_outputs, bool) or not isinstance(max_intermediate_outputs, (int, np.integer))
            or max_intermediate_outputs < 1
        ):
            raise ValueError(f"max_intermediate_outputs must be a positive integer, got {max_intermediate_outputs!r}")
        self.show_progress = show_progress
        self._lock = threading.RLock()

    augment_graph = _one_call_at_a_time(ort_calibrate.MinMaxCalibrater.augment_graph)
    create_inference_session = _one_call_at_a_time(ort_calibrate.MinMaxCalibrater.create_inference_session)
    compute_data = _one_call_at_a_time(ort_calibrate.MinMaxCalibrater.compute_data)
    clear_collected_data = _one_call_at_a_time(ort_calibrate.MinMaxCalibrater.clear_collected_data)

    @_one_call_at_a_time
    def collect_data(self, data_reader: Any) -> None:
        """ORT's collect_data, except that a call that fails leaves what earlier calls collected
        unchanged, as in the histogram calibrators (ORT keeps the failed call's batches)."""
        # compute_data replaces the range rather than changing it, so a reference is a snapshot
        saved = list(self.intermediate_outputs), self.calibrate_tensors_range
        try:
            self._collect_call(data_reader)
        except BaseException:
            self.intermediate_outputs, self.calibrate_tensors_range = saved
            raise

    def _collect_call(self, data_reader: Any) -> None:
        source = DataSource(data_reader)
        session = self.infer_session
        checker = FeedChecker(session)
        outputs = [o.name for o in session.get_outputs()]
        fetch = outputs[self.num_model_outputs :]
        head = [None] * self.num_model_outputs
        for i, feed in enumerate(progress(source.read(), "histocal collect", self.show_progress)):
            self.intermediate_outputs.append(head + run_session(session, fetch, checker.check(feed, i), i))
            if self.max_intermediate_outputs is not None and len(self.intermediate_outputs) == self.max_intermediate_outputs:
                # ORT discards the chunk here; histocal folds it into the range.
                self.compute_data()
                self.clear_collected_data()
        if len(self.intermediate_outputs) == 0 and self.calibrate_tensors_range is None:
            raise ValueError("No data is collected.")
        self.compute_data()
        self.clear_collected_data()

    def merge_range(self, old_range: Any, new_range: Any) -> Any:
        if not old_range:
            return new_range
        for key, value in old_range.items():
            old_min, old_max = value.range_value if isinstance(value, TensorData) else value
            new = new_range[key]
            new_min, new_max = new.range_value if isinstance(new, TensorData) else new
            if self.moving_average:
                # ORT's arithmetic exactly: a NaN (e.g. an all-NaN chunk's mean) stays NaN, as in ORT
                min_value = old_min + self.averaging_constant * (new_min - old_min)
                max_value = old_max + self.averaging_constant * (new_max - old_max)
            else:
                min_value, max_value = _nan_min(old_min, new_min), _nan_max(old_max, new_max)
            if isinstance(value, TensorData) or isinstance(new, TensorData):
                new_range[key] = TensorData(lowest=min_value, highest=max_value)
            else:
                new_range[key] = (min_value, max_value)
        return new_range


def create_calibrator(
    model: str | Path,
    op_types_to_calibrate: Sequence[str] | None = None,
    augmented_model_path: str | Path | None = None,
    calibrate_method: CalibrationMethod | str = CalibrationMethod.MinMax,
    use_external_data_format: bool = False,
    providers: Sequence[Any] | None = None,
    extra_options: dict[str, Any] | None = None,
) -> Any:
    """onnxruntime's ``create_calibrator`` with histocal's calibrators: same arguments, same
    ``extra_options`` keys and defaults, plus ``CollectionMode`` (auto/exact/streaming) and
    ``StreamingBins`` for the histogram methods. ``calibrate_method`` may also name a histocal
    method (mse, kl, pow2, auto) or a registered one, with its options in
    ``extra_options["MethodOptions"]`` (a dict)."""
    opts = dict(extra_options or {})
    hist_opts = {"mode": opts.get(MODE_OPTION), "streaming_bins": opts.get(STREAMING_BINS_OPTION)}
    common = dict(use_external_data_format=use_external_data_format)
    if isinstance(calibrate_method, str):
        name = methods.canonical_name(calibrate_method)
        if name not in methods.ORT_METHODS:
            calibrator: Any = MethodCalibrater(
                model, op_types_to_calibrate, augmented_model_path, **common,
                method=name, method_options=opts.get(METHOD_OPTIONS_OPTION),
                streaming_bins=opts.get(STREAMING_BINS_OPTION),
            )
            return _prepare(calibrator, providers)
        calibrate_method = CalibrationMethod[{m.name.lower(): m.name for m in CalibrationMethod}[name]]
    if calibrate_method == CalibrationMethod.MinMax:
        calibrator = MinMaxCalibrater(
            model, op_types_to_calibrate, augmented_model_path, **common,
            symmetric=opts.get("symmetric", False),
            moving_average=opts.get("moving_average", False),
            averaging_constant=opts.get("averaging_constant", 0.01),
            max_intermediate_outputs=opts.get("max_intermediate_outputs", None),
            per_channel=opts.get("per_channel", False),
        )
    elif calibrate_method == CalibrationMethod.Entropy:
        calibrator = EntropyCalibrater(
            model, op_types_to_calibrate, augmented_model_path, **common,
            symmetric=opts.get("symmetric", False),
            num_bins=opts.get("num_bins", 128),
            num_quantized_bins=opts.get("num_quantized_bins", 128),
            **hist_opts,
        )
    elif calibrate_method == CalibrationMethod.Percentile:
        calibrator = PercentileCalibrater(
            model, op_types_to_calibrate, augmented_model_path, **common,
            symmetric=opts.get("symmetric", True),
            num_bins=opts.get("num_bins", 2048),
            percentile=opts.get("percentile", 99.999),
            **hist_opts,
        )
    elif calibrate_method == CalibrationMethod.Distribution:
        calibrator = DistributionCalibrater(
            model, op_types_to_calibrate, augmented_model_path, **common,
            num_bins=opts.get("num_bins", 2048),
            scenario=opts.get("scenario", "same"),
            **hist_opts,
        )
    else:
        raise ValueError(f"Unsupported calibration method {calibrate_method}")
    return _prepare(calibrator, providers)


def _prepare(calibrator: Any, providers: Sequence[Any] | None) -> Any:
    calibrator.augment_graph()
    if providers:
        calibrator.execution_providers = providers
    calibrator.create_inference_session()
    return calibrator


__all__ = [
    "MinMaxCalibrater",
    "EntropyCalibrater",
    "PercentileCalibrater",
    "DistributionCalibrater",
    "MethodCalibrater",
    "create_calibrator",
    "MODES",
    "DEFAULT_STREAMING_BINS",
]

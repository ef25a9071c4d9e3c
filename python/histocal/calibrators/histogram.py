"""How the histogram calibrators collect (``HistogramCalibration``; the classes: ``ort_methods``).

Each class subclasses onnxruntime's own (same constructor, graph augmentation, session and
tensor selection), so it works wherever ORT's does; only data collection and the statistics
change:

* ``MinMaxCalibrater``: ORT's in-graph ReduceMin/ReduceMax, results identical to ORT's, except
  that ``max_intermediate_outputs`` folds each chunk into the range instead of discarding it,
  per-channel ranges merge across ``collect_data`` calls (ORT raises there), and those merges
  ignore NaN as ORT does within a chunk (ORT keeps an earlier all-NaN call's NaN).
* ``EntropyCalibrater``, ``PercentileCalibrater``, ``DistributionCalibrater``: histograms in
  bounded memory, in one of two modes:

  - ``exact``: the same TensorsData as ORT for the same ``collect_data`` calls. One inference
    pass scans every batch (global ranges) and keeps a batch's outputs while they fit the
    memory budget (``memory_budget``, see ``histocal.calibrators.budget``) and holding them
    costs less than running the batch again (as measured); the kept batches are then counted
    from memory and only the others run again (data that can be read twice). Data that can be read only once and outgrows the budget is kept whole, as ORT
    does, with a warning.
  - ``streaming``: one pass, one batch in memory at a time, and a histogram that does not depend
    on how the data is batched or ordered (a power-of-two-aligned histogram of
    ``streaming_bins`` bins; ORT's methods then run on an ORT-shaped histogram derived from it).
  - ``auto`` (default): ``exact``, except that data that can be read only once and outgrows the
    budget turns to ``streaming`` (with a warning; nothing is lost, the streaming histogram is
    fed from the start).

Every calibrator serializes its calls with its own lock (shared with its collector), so one
calibrator may be used from several threads: calls run one at a time, and a ``collect_data``
that fails undoes only its own work. Without an ``augmented_model_path`` each calibrator writes
its augmented model to its own temporary folder (removed with the calibrator).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import onnxruntime
from onnxruntime.quantization.calibrate import TensorsData

from .. import _core
from ..collector import HistogramCollector
from ..io.readers import DataSource
from ..methods.settings import CollectionSettings
from ..state import CalibrationState
from ..state.channels import ChannelHistograms
from ..state.collection import Collection
from ..state.compute import check_calibration_memory
from ..state.overrides import (
    MethodRule,
    collection_mode,
    compute_with_overrides,
    parse_method_overrides,
    rule_summaries,
)
from .budget import HOW_TO_SET, KeptOutputs, format_size, resolve_memory_budget
from .common import (
    METHODS,
    ReadCheck,
    ReadDigest,
    binned_and_binnable,
    one_call_at_a_time,
    run_batches,
)
from .cores import calibration_threads, session_options_for
from .state_io import CollectedState

logger = logging.getLogger(__name__)

# Why exact mode reads data again, in the errors of a second read that differs from the first.
_WHY_SECOND_READ = (
    " (exact mode reads again the batches whose outputs it did not keep within its memory budget: the "
    "reader must yield the same feeds in the same order on each read, so a shuffling loader must not "
    f"reshuffle when rewound; or use mode='streaming', or a larger memory budget: {HOW_TO_SET})"
)


class HistogramCalibration(CollectedState):
    """Collection and statistics shared by the histogram calibrators (put before ORT's class;
    what they have collected, in and out: ``state_io.CollectedState``)."""

    memory_budget: int | None = None
    _method_overrides: tuple[MethodRule, ...] = ()
    # set by onnxruntime's CalibraterBase
    augmented_model_path: str
    execution_providers: list[str] | None

    def _init_histocal(self, settings: CollectionSettings) -> None:
        self._lock = threading.RLock()
        self.settings = settings
        # bytes of outputs exact mode may keep to save a second inference pass (None: see .budget)
        self.memory_budget = settings.memory_budget
        self.threads = calibration_threads(settings.num_threads)
        self.session_options = settings.session_options
        self.streaming_bins = settings.streaming_bins
        self.show_progress = settings.show_progress
        self.per_channel, self.axis, self.mode = settings.per_channel, settings.axis, settings.mode
        self._collection: Collection | None = None  # what has been collected (``collection``)
        self._model_fingerprint: str | None = None
        self._check_settings()

    def _check_settings(self) -> None:
        """Refuse bad settings now (ORT only does at collect time): ORT's methods by building
        their collector."""
        self._new_collector()

    def _new_collector(self) -> HistogramCollector:
        collector = HistogramCollector(
            method=self.method,
            symmetric=self.symmetric,
            num_bins=self.num_bins,
            num_quantized_bins=self.num_quantized_bins,
            percentile=self.percentile,
            scenario=self.scenario,
            lock=self._lock,  # one lock: the calibrator's calls work on the collector
        )
        return collector

    @one_call_at_a_time
    def augment_graph(self) -> None:
        """ORT's graph augmentation: the calibrated tensors become outputs of the augmented model."""
        super().augment_graph()  # type: ignore[misc]

    @one_call_at_a_time
    def create_inference_session(self) -> None:
        """ORT's calibration session (graph optimizations off), with the intra-op threads and
        spinning of ``self.threads`` (see ``cores``: the Rust work on the previous batch runs
        alongside inference and needs its share of the cycles); ``session_options``, when
        given, is used as it is."""
        options = self.session_options or session_options_for(self.threads)
        self.infer_session = onnxruntime.InferenceSession(
            self.augmented_model_path, sess_options=options, providers=self.execution_providers
        )

    @property
    def lock(self) -> threading.RLock:
        """The lock each call of this calibrator holds (and its collector's)."""
        return self._lock

    def fetch_names(self) -> list[str]:
        """The session outputs this calibrator collects.

        Returns:
            Their names, in the session's order.

        Raises:
            RuntimeError: no augmented graph and session yet.
        """
        if self.tensors_to_calibrate is None:
            raise RuntimeError("call augment_graph() and create_inference_session() before collect_data()")
        return [o.name for o in self.infer_session.get_outputs() if o.name in self.tensors_to_calibrate]

    @one_call_at_a_time
    def collect_data(self, data_reader: Any) -> None:
        """Collect one call's batches; may be called several times (ORT's merge rule applies
        between calls in exact mode; streaming mode treats all calls as one data set). A call
        that fails leaves what earlier calls collected unchanged.

        Args:
            data_reader: a CalibrationDataReader, an iterable of feed dicts, or a callable
                returning one.

        Raises:
            ValueError: bad data (naming the input and batch), or data that differs between the
                two reads of exact mode.
            MemoryError: the histograms would not fit the memory the process can take.
        """
        collection, collector = self.collection, self.collector
        saved = None if collection is None else collection.copy()
        try:
            self._collect_call(data_reader)
        except BaseException:
            self._roll_back(saved, collector)
            raise

    def _collect_call(self, data_reader: Any) -> None:
        source = DataSource(data_reader)
        if self._collection is None:
            # auto starts exact; a read-once source over the memory budget turns it to streaming
            self._collection = Collection("streaming" if self.mode == "streaming" else "exact")
            logger.info("collection mode: %s", self._collection.mode)
        fetch = self.fetch_names()
        exact = self._collection.mode == "exact"
        if self.method in METHODS:  # the histograms of num_bins bins it will hold, refused up front
            check_calibration_memory(self.method, self.num_bins, len(fetch), exact)
        n = self._collect_exact(source, fetch) if exact else self._collect_streaming(source, fetch)
        if n == 0:
            raise ValueError("No data is collected.")

    def _collect_streaming(self, source: DataSource, fetch: list[str]) -> int:
        collection, stream = self._held()
        if self.per_channel and collection.channels is None:
            collection.channels = self._new_channels()
        channels = collection.channels

        def consume(_: int, items: list) -> None:
            if channels is not None:  # first: its checks refuse a batch before any of it is added
                channels.collect(items)
            stream.collect(items)

        return run_batches(self, source, fetch, consume, "histocal collect")

    def _collect_exact(self, source: DataSource, fetch: list[str]) -> int:
        """ORT's histograms for this call, in one inference pass where the outputs fit the memory
        budget and holding them is cheaper than running them again. Pass 1 scans every batch (ranges,
        and the streaming histogram from the same scan) and keeps the outputs of the batches that
        fit and are worth holding (``KeptOutputs``); between the passes the binning is planned and
        the kept batches are counted from memory, then dropped; only the others are run again, on
        a second read that skips the kept batches' feeds.
        A read-once source cannot be read again: over the budget, ``auto`` mode turns to
        streaming (warning) and ``exact`` keeps every batch as ORT does (warning)."""
        budget = resolve_memory_budget(self.memory_budget)
        if self.collector is None:
            self.collector = self._new_collector()
        hist = self.collector.histograms
        collection, stream = self._held()
        read_once = not source.rereadable
        # read-once data cannot run again: keep what fits; otherwise keep only what is worth it
        kept = KeptOutputs(budget, 0.0 if read_once else None)
        streaming = False  # auto mode, read-once data over the budget: streaming from then on
        # The second read is checked against a digest of the first read's feeds (every batch's,
        # kept or not: each one's place in the read decides whether it is skipped), in constant
        # memory per batch (a long stream must not grow it). Read-once data is never read again.
        first = None if read_once else ReadDigest()

        def scan(i: int, items: list) -> None:
            nonlocal streaming
            if streaming:
                stream.collect(items)
                return
            # The state's streaming histogram (see histocal.state) is fed here, from the same scans.
            hist.scan(items, stream)
            if not kept.offer(i, items) and read_once:
                streaming = self._over_budget(kept, i, items)

        before = binned_and_binnable(hist)
        desc = "histocal exact (ranges)"
        n = run_batches(self, source, fetch, scan, desc, timed=kept.timed, wants_timing=kept.wants_timing, digest=first)
        if n == 0 or streaming:
            if streaming:
                collection.mode, collection.exact, self.collector = "streaming", None, None
            return n
        hist.plan()
        logger.debug("exact mode: %d of %d batches counted from memory", len(kept.kept), n)
        if kept.batches:
            hist.count(kept.by_tensor())
            kept.drop()
        if first is not None and len(kept.kept) < n:  # read-once data keeps every batch (or streams)

            def count(i: int, items: list) -> None:
                hist.count(items)

            desc = "histocal exact (batches not kept)"
            # each feed is checked against the first read's before it runs: a reader that yields
            # the same batches in another order would count some twice and others never
            run_batches(self, source, fetch, count, desc, skip=kept.kept, digest=ReadCheck(first, _WHY_SECOND_READ))
        self.collector.refresh()  # its histogram_dict, if handed out, shows this collect
        # Values outside the first read's ranges were not binned: the reader changed its data.
        for name, (binned, finite, infs, _) in binned_and_binnable(hist).items():
            b0, f0, i0, open_top = before.get(name, (0, 0, 0, False))
            # infinities are binned only where the edges ended in +inf before this collect
            binnable = finite - f0 + (infs - i0 if open_top else 0)
            if binned - b0 != binnable:
                raise ValueError(
                    f"tensor {name!r}: the data reader returned different data on its second read "
                    f"({binnable - (binned - b0)} values fell outside the ranges of the first read); "
                    "exact mode reads again the batches it did not keep and needs the same "
                    "feeds each time, or use mode='streaming'"
                )
        return n

    def _over_budget(self, kept: KeptOutputs, i: int, items: list) -> bool:
        """Read-once data whose outputs outgrow the budget at batch ``i``: ``auto`` mode goes on
        streaming (the streaming histogram already holds every batch so far; returns True),
        ``exact`` keeps every batch as ORT does."""
        how = f"histocal's memory budget ({format_size(kept.budget)}; {HOW_TO_SET})"
        if self.mode == "auto":
            kept.drop()
            logger.warning(
                "The calibration data can be read only once and its outputs exceed %s, so histocal "
                "collects it in streaming mode: its ranges are close to onnxruntime's but not identical. "
                "For onnxruntime's exact result, pass data that can be read again (a list, a reader "
                "with rewind(), or a callable returning a fresh iterable) or raise the budget.",
                how,
            )
            return True
        kept.unbounded = True
        kept.offer(i, items)
        logger.warning(
            "The calibration data can be read only once and its outputs exceed %s; exact mode "
            "keeps every batch's outputs in memory like onnxruntime does. To stay within the "
            "budget, pass data that can be read again (a list, a reader with rewind(), or a "
            "callable returning a fresh iterable), or use mode='streaming'.",
            how,
        )
        return False

    @property
    def method_overrides(self) -> tuple[MethodRule, ...]:
        """Per-tensor method assignment (``histocal.state.overrides``): other methods for the tensors
        these rules reach, in ``compute_data``. Set before ``collect_data`` where a rule's method
        needs data of its own (isotone's summaries, pow2's votes)."""
        return self._method_overrides

    @method_overrides.setter
    def method_overrides(self, rules: Any) -> None:
        self._method_overrides = parse_method_overrides(rules)
        used = None if self._collection is None else self._collection.mode
        self.mode = collection_mode(self._method_overrides, self.mode, used)

    def new_stream(self) -> _core.StreamHistograms:
        """An empty streaming histogram set for this calibrator.

        Returns:
            Histograms that collect what this calibrator's methods need (pow2 votes, isotone pairs).
        """
        return _core.StreamHistograms(self.streaming_bins, summaries=sorted(rule_summaries(self.method_overrides)))

    def _new_channels(self) -> ChannelHistograms:
        return ChannelHistograms(
            self.streaming_bins, self.axis, isotone="isotone" in rule_summaries(self.method_overrides)
        )

    def _held(self) -> tuple[Collection, _core.StreamHistograms]:
        """The collection this call collects into, and its streaming histograms (exact mode feeds
        them too, from the same scans, so that its state serves every method)."""
        collection = self._collection
        assert collection is not None  # set by the call's first step
        if collection.stream is None:
            collection.stream = self.new_stream()
        return collection, collection.stream

    @one_call_at_a_time
    def restart(self) -> None:
        """Forget everything collected, keeping the augmented model, the session and the mode
        already settled on (so that new data is collected the way the first was). ORT's
        ``clear_collected_data`` only drops buffered outputs, and keeps that meaning here."""
        self.collector = None
        if self._collection is not None:
            self._collection = Collection(self._collection.mode)

    @one_call_at_a_time
    def compute_data(self) -> TensorsData:
        """Every method's results from what has been collected. Exact mode: ORT's own computation
        on ORT's exact histograms (edits of ``collector.histogram_dict`` included); otherwise the
        calibration state's ``compute``, reading the calibrator's streaming histograms in place.

        Returns:
            onnxruntime ``TensorsData`` of every calibrated tensor.

        Raises:
            ValueError: nothing collected yet.
        """
        result = None
        collection = self.collection
        if collection is not None and collection.mode == "exact":
            if self.collector is None:
                raise ValueError("No collector created and can't generate calibration data.")
            result = TensorsData(METHODS[self.method], self.collector.compute_collection_result())
            if not self.method_overrides:
                return result
        elif collection is None or collection.stream is None:
            raise ValueError("No collector created and can't generate calibration data.")
        state = CalibrationState.from_collection(
            collection.held(), model_fingerprint=None, method=self.method, settings=self.collection_settings
        )
        options = getattr(self, "method_options", {})
        if result is None:
            result = state.compute(self.method, **options)
        return compute_with_overrides(state, self.method, self.method_overrides, model=self.model, base=result)

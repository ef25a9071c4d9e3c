"""What a histogram calibrator has collected, in and out (``CollectedState``, a base of
``histogram.HistogramCalibration``): its one ``Collection`` (``collection``), the calibration state
(``state``, ``save_state``, ``load_state`` and the checks a loaded state must pass), and putting back
the copy ``collect_data`` rolls back to when a call fails (``_roll_back``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import _core
from ..collector import HistogramCollector
from ..state import CalibrationState, model_fingerprint
from ..state.collection import Collection
from .common import check_channels_loadable, one_call_at_a_time


class CollectedState:
    """What a histogram calibrator has collected, as copies, snapshots and calibration states."""

    # the calibrator's (``HistogramCalibration``'s, ORT's ``CalibraterBase``'s) settings and parts
    method: str
    symmetric: bool
    num_bins: int
    num_quantized_bins: int
    percentile: float
    scenario: str
    mode: str
    streaming_bins: int
    per_channel: bool
    axis: int
    tensors_to_calibrate: set[str] | None
    model: Any
    infer_session: Any
    collector: HistogramCollector | None
    fetch_names: Callable[[], list[str]]
    _new_collector: Callable[[], HistogramCollector]
    _lock: threading.RLock
    _collection: Collection | None
    _model_fingerprint: str | None

    @property
    def kind(self) -> str:
        """The histograms' kind: ``"abs"`` (|x|, symmetric percentile) or ``"value"``."""
        return "abs" if self.method == "percentile" and self.symmetric else "value"

    @property
    def collection(self) -> Collection | None:
        """What has been collected (shared, not copied; None before the first ``collect_data``). In
        exact mode its exact part is the histograms ORT's ``collector`` holds: edits of
        ``collector.histogram_dict`` are part of what was collected."""
        with self._lock:  # not while another thread collects
            c = self._collection
            if c is not None and c.mode == "exact":
                c.exact = None if self.collector is None else self.collector.histograms
            return c

    def _hold(self, collection: Collection) -> None:
        """Hold ``collection`` (not copied) as what has been collected: in exact mode, a new
        ``collector`` holds its exact histograms."""
        with self._lock:
            self._collection = collection
            if collection.mode == "exact":
                self.collector = self._new_collector()
                if collection.exact is not None:
                    self.collector.histograms = collection.exact

    @property
    def model_fingerprint(self) -> str:
        """``histocal.model_fingerprint`` of the calibrated model (computed once)."""
        if self._model_fingerprint is None:
            self._model_fingerprint = model_fingerprint(self.model, getattr(self, "num_model_outputs", None))
        return self._model_fingerprint

    @property
    def collection_settings(self) -> dict[str, Any]:
        """The settings a state records: the histogram settings and the method's options."""
        settings = {
            k: getattr(self, k) for k in ("symmetric", "num_bins", "num_quantized_bins", "percentile", "scenario")
        }
        settings.update(getattr(self, "method_options", {}))
        return settings

    @property
    def state(self) -> Any:
        """A ``histocal.CalibrationState`` (copy) of what has been collected."""
        return CalibrationState.from_calibrator(self)

    def save_state(self, path: str | Path, data_fingerprint: str | None = None, compress: bool = False) -> None:
        """Save the collected histogram state (see ``histocal.CalibrationState``).

        Args:
            path: the state file to write.
            data_fingerprint: the fingerprint of the data collected, recorded in the state.
            compress: deflate the file's members.

        Raises:
            ValueError: nothing collected yet, or a malformed ``data_fingerprint``.
        """
        CalibrationState.from_calibrator(self, data_fingerprint).save(path, compress)

    @one_call_at_a_time
    def load_state(self, state: Any) -> None:
        """Start from (merge in) a ``CalibrationState`` or a state file of this model and options.

        Args:
            state: a ``CalibrationState`` or the path of a state file.

        Raises:
            ValueError: a state of another model, other tensors or incompatible options, or an
                invalid file.
        """
        if not isinstance(state, CalibrationState):
            state = CalibrationState.load(state)
        self._check_loadable(state)
        held = self.collection
        if held is not None and held.names:
            state = CalibrationState.from_calibrator(self).merge(state)
        self._hold(state.collection.copy())

    def _check_loadable(self, state: CalibrationState) -> None:
        fp = self.model_fingerprint
        if state.model_fingerprint is not None and state.model_fingerprint != fp:
            raise ValueError(
                f"the state was collected on another model (fingerprint {state.model_fingerprint}, this model {fp}): "
                "it is stale for this model"
            )
        if self.tensors_to_calibrate is not None:
            wanted = (
                set(self.fetch_names())
                if getattr(self, "infer_session", None) is not None
                else set(self.tensors_to_calibrate)
            )
            if wanted != set(state.names):
                diff = sorted(wanted ^ set(state.names))[:5]
                raise ValueError(f"the state calibrates other tensors than this calibrator (e.g. {diff})")
        check_channels_loadable(state.channels, self.per_channel, self.axis)
        if self.mode != "auto" and self.mode != state.mode:
            raise ValueError(
                f"incompatible options: the state was collected in {state.mode} mode, the calibrator uses mode={self.mode!r}"
            )
        if state.stream is not None and state.streaming_bins != self.streaming_bins:
            raise ValueError(
                f"incompatible options: the state has streaming_bins={state.streaming_bins}, the calibrator {self.streaming_bins}"
            )
        if state.mode == "exact" and state.exact_kind_and_bins != (self.kind, self.num_bins):
            held_kind, held_bins = state.exact_kind_and_bins
            raise ValueError(
                f"incompatible options: the state holds exact {held_kind} histograms of {held_bins} "
                f"bins, this calibrator needs {self.kind} histograms of {self.num_bins} bins (state.compute() can still "
                "serve these settings)"
            )

    def _roll_back(self, saved: Collection | None, collector: HistogramCollector | None) -> None:
        """Put back what a failed call started from: ``saved``, a copy of the collection then, and
        the collector then (the same object, holding ``saved``'s exact histograms, so that a caller
        holding ``calibrator.collector`` sees no trace of the failed call either)."""
        self._collection, self.collector = saved, collector
        if collector is not None:
            held = None if saved is None else saved.exact
            collector.roll_back_to(_core.Histograms(collector.kind, collector.num_bins) if held is None else held)

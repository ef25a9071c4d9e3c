"""What a histogram calibrator has collected, in and out (``CollectedState``, a base of
``histogram.HistogramCalibration``): copies of it (``collected``) and putting one back
(``restore_collected``), the calibration state (``state``, ``save_state``, ``load_state`` and the
checks a loaded state must pass), and the snapshot ``collect_data`` rolls back to when a call fails.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import _core
from ..collector import CollectedData, HistogramCollector
from ..state import CalibrationState, model_fingerprint
from ..state.channels import ChannelHistograms
from .common import check_channels_loadable, one_call_at_a_time

_NOTHING_COLLECTED = "the calibrator has not collected any data yet (call collect_data first)"


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
    _mode_used: str | None
    _stream: _core.StreamHistograms | None
    _channels: ChannelHistograms | None
    _model_fingerprint: str | None

    @property
    def kind(self) -> str:
        """The histograms' kind: ``"abs"`` (|x|, symmetric percentile) or ``"value"``."""
        return "abs" if self.method == "percentile" and self.symmetric else "value"

    def collected(self, *, copy: bool = True) -> CollectedData:
        """What has been collected: the streaming histograms and, in exact mode, ORT's exact ones.

        Args:
            copy: a copy; False: the streaming histograms are shared (only for reading them at once).

        Returns:
            The collected histograms.

        Raises:
            ValueError: nothing was collected yet.
        """
        with self._lock:  # not while another thread collects
            if self._mode_used is None:
                raise ValueError(_NOTHING_COLLECTED)
            stream = self._stream
            if stream is not None and copy:
                stream = stream.copy()
            exact = kind = num_bins = None
            if self._mode_used == "exact" and self.collector is not None and self.collector.histograms.names():
                kind, num_bins = self.kind, int(self.num_bins)
                exact = self.collector.histograms.copy()
            if stream is None and exact is None:
                raise ValueError(_NOTHING_COLLECTED)
            channels = self._channels.copy() if copy and self._channels else self._channels
            return CollectedData(self._mode_used, stream, exact, kind, num_bins, channels)

    def restore_collected(self, data: CollectedData) -> None:
        """Replace what has been collected.

        Args:
            data: the histograms to hold instead (copied).
        """
        with self._lock:
            self._mode_used = data.mode
            self._stream = None if data.stream is None else data.stream.copy()
            self._channels = None if data.channels is None else data.channels.copy()
            if data.mode == "exact":
                self.collector = self._new_collector()
                if data.exact is not None:
                    self.collector.histograms = data.exact.copy()

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
        if self._mode_used is not None:
            state = CalibrationState.from_calibrator(self).merge(state)
        self.restore_collected(state.collected())

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

    def _snapshot(self) -> tuple[Any, Any, Any, Any, Any]:
        histograms = None if self.collector is None else self.collector.histograms.copy()
        stream = None if self._stream is None else self._stream.copy()
        return self._mode_used, self.collector, histograms, stream, self._channels and self._channels.copy()

    def _restore(self, mode_used: Any, collector: Any, histograms: Any, stream: Any, channels: Any) -> None:
        # The same collector object, with its histograms as they were: a caller holding
        # ``calibrator.collector`` sees no trace of the failed call either.
        self._mode_used, self.collector, self._stream, self._channels = mode_used, collector, stream, channels
        if collector is not None:
            collector.roll_back_to(histograms)

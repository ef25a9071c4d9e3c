"""A drop-in for onnxruntime's ``HistogramCollector``, computed by histocal's Rust core.

Same constructor, same ``collect`` / ``compute_collection_result`` / ``histogram_dict``, and the
same result objects down to numpy scalar-vs-0-d-array kinds and dtypes. Where ORT crashes or
silently drops data, histocal returns a result instead (docs/deviations.md).

``histogram_dict`` behaves like ORT's plain attribute: the same dict object every time, updated
in place by ``collect``, assignable, and edits to it (entries set, replaced or deleted, arrays
changed in place) are what the next ``collect`` / ``compute_collection_result`` works from. The
histograms themselves live in Rust; the dict is a view kept in step with them. The results are
``histocal.ort_results``' (which also serves a calibration state), on this collector's histograms.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnxruntime.quantization.calibrate import CalibrationDataCollector

from . import _core
from .ort_results import OrtSettings, histogram_entry, ort_results, ort_settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValueCounts:
    """How many values of a tensor were collected, by kind. Non-finite values are never binned.

    Attributes:
        finite: finite values.
        nan: NaN values.
        posinf: +inf values.
        neginf: -inf values.
        batches: the batches they came in.
    """

    finite: int
    nan: int
    posinf: int
    neginf: int
    batches: int


def _value_counts(c: _core.TensorCounts) -> ValueCounts:
    return ValueCounts(c.n_finite, c.n_nan, c.n_posinf, c.n_neginf, c.batches)


def float_batches(name: str, data: Any) -> list[np.ndarray]:
    """One tensor's data (an array or a list of per-batch arrays) as float arrays Rust can read.

    Batches keep their own shapes (ORT stacks them, which fails for dynamic shapes). Mixed
    float dtypes are promoted like ``np.asarray`` would; non-float data is a TypeError.
    """
    items = list(data) if isinstance(data, (list, tuple)) else [data]
    arrays = [a if isinstance(a, np.ndarray) else np.asarray(a) for a in items]
    for a in arrays:
        if a.dtype.kind != "f" or a.dtype.itemsize not in (2, 4, 8):
            raise TypeError(f"tensor {name!r}: expected float16, float32 or float64 data, got {a.dtype}")
    if len({a.dtype for a in arrays}) > 1:
        common = np.result_type(*arrays)
        arrays = [a.astype(common) for a in arrays]
    return [a if a.dtype.isnative and a.flags.aligned else a.astype(a.dtype.newbyteorder("=")) for a in arrays]


class HistogramCollector(CalibrationDataCollector):
    """ORT's ``HistogramCollector``, identical results, computed in Rust.

    Args:
        method: ``"entropy"``, ``"percentile"`` or ``"distribution"``.
        symmetric: symmetric ranges (percentile: histograms of |x|).
        num_bins: histogram bins.
        num_quantized_bins: entropy's quantized distribution's bins.
        percentile: percentile's percentile, in [0, 100].
        scenario: distribution's ``"same"`` or ``"p3"``.
        lock: the lock every call holds (a calibrator's own); default: a new one.

    Raises:
        ValueError: an unknown method or a bad setting (ORT's messages).
    """

    def __init__(
        self,
        method: str,
        symmetric: bool,
        num_bins: int,
        num_quantized_bins: int,
        percentile: float,
        scenario: str,
        *,
        lock: threading.RLock | None = None,
    ) -> None:
        checked = ort_settings(method, symmetric, num_bins, num_quantized_bins, percentile, scenario)
        # plain attributes, as ORT's: the settings at compute time are these
        self.method = checked.method
        self.symmetric = checked.symmetric
        self.num_bins = checked.num_bins
        self.num_quantized_bins = checked.num_quantized_bins
        self.percentile = checked.percentile
        self.scenario = checked.scenario
        self._kind = checked.kind
        self._hists = _core.Histograms(self._kind, checked.num_bins)
        # The histogram_dict handed out or assigned (None until asked for), and per tensor the
        # tuple object last put in it that matches the Rust state.
        self._dict: MutableMapping[str, tuple] | None = None
        self._handed: dict[str, tuple] = {}
        # One call at a time (``lock``: a calibrator's own, whose calls work on this collector).
        self._lock = threading.RLock() if lock is None else lock

    @property
    def kind(self) -> str:
        """The histograms' kind: ``"abs"`` (|x|, symmetric percentile) or ``"value"``."""
        return self._kind

    @property
    def histograms(self) -> _core.Histograms:
        """The Rust state, with any edits of ``histogram_dict`` applied first."""
        self._sync()
        return self._hists

    @histograms.setter
    def histograms(self, hists: _core.Histograms) -> None:
        """Replace the Rust state; a ``histogram_dict`` handed out is no longer kept in step."""
        self._hists = hists
        self._dict, self._handed = None, {}

    def collect(self, name_to_arr: Mapping[str, Any]) -> None:
        """Add one ``collect`` call's data (ORT's merge rule applies between calls).

        Args:
            name_to_arr: per tensor an array or a list of per-batch arrays.

        Raises:
            ValueError: data that is not floating point (naming the tensor).
            MemoryError: the histograms would not fit the memory the process can take.
        """
        items = [(name, float_batches(name, data)) for name, data in name_to_arr.items()]
        with self._lock:
            self._sync()
            try:
                self._hists.collect(items)
            finally:
                self.refresh(name for name, _ in items)

    @property
    def histogram_dict(self) -> MutableMapping[str, tuple]:
        """ORT's tuples: ``(hist, edges, min, max, threshold)``, or ``(hist, edges, min, max)``
        for the symmetric-percentile |x| histogram. Assignable, like ORT's attribute. Reading
        it costs nothing after the first time; edits are checked by the next collect/compute."""
        with self._lock:
            if self._dict is None:
                self._dict, self._handed = {}, {}
                self.refresh()
            return self._dict

    @histogram_dict.setter
    def histogram_dict(self, value: MutableMapping[str, tuple]) -> None:
        if not isinstance(value, MutableMapping):
            raise TypeError(f"histogram_dict must be a dict of histogram tuples, got {type(value).__name__}")
        with self._lock:
            self._hists = self._load(value)  # a ValueError here changes nothing
            # ORT keeps the caller's dict and tuples as given; so does this view
            self._dict, self._handed = value, dict(value.items())

    def get_histogram_dict(self) -> MutableMapping[str, tuple]:
        """ORT's accessor of ``histogram_dict``.

        Returns:
            The ``histogram_dict`` (ORT's layout; edits reach the Rust state).
        """
        return self.histogram_dict

    @property
    def counts(self) -> dict[str, ValueCounts]:
        """Values collected per tensor, by kind. For an entry assigned through
        ``histogram_dict``, its histogram's total, as finite values of 0 batches."""
        with self._lock:
            hists = self.histograms
            return {n: _value_counts(hists.counts(n)) for n in hists.names()}

    def refresh(self, names: Iterable[str] | None = None) -> None:
        """Write the Rust state into the exposed ``histogram_dict``, in place, as ORT's
        ``collect`` writes its dict.

        Args:
            names: the tensors to write (None: all).
        """
        if self._dict is None:
            return
        held = set(self._hists.names())
        for name in self._hists.names() if names is None else list(names):
            if name in held:
                self._dict[name] = self._handed[name] = histogram_entry(self._hists, name)

    def roll_back_to(self, hists: _core.Histograms) -> None:
        """Put back the Rust state a failed calibrator call started from; a histogram_dict
        handed out shows it too (entries the failed call added are removed).

        Args:
            hists: the histograms to hold (not copied).
        """
        with self._lock:
            self._hists = hists
            if self._dict is not None:
                self._dict.clear()
                self._handed = {}
                self.refresh()

    def _sync(self) -> None:
        """Bring the Rust state in line with the exposed dict after the caller edited it."""
        d = self._dict
        if d is None or not self._edited(d):
            return
        self._hists = self._load(d)
        self._handed = dict(d.items())

    def _edited(self, d: MutableMapping[str, tuple]) -> bool:
        if list(d.keys()) != list(self._handed.keys()):
            return True
        return any(entry is not self._handed[name] or not self._unchanged(name, entry) for name, entry in d.items())

    def _unchanged(self, name: str, entry: tuple) -> bool:
        """Whether an entry handed out still holds the Rust state (arrays not edited in place)."""
        try:
            return self._hists.unchanged(name, *entry)
        except (TypeError, ValueError, OverflowError):
            return False  # not numbers: loading it gives the error

    def _load(self, d: MutableMapping[str, tuple]) -> Any:
        """A new Rust state holding ``d``'s histograms, in ``d``'s order. Entries this collector
        handed out unchanged keep their state (value counts included); others are checked and
        loaded. A ValueError naming the tensor if one cannot be."""
        hists = _core.Histograms(self._kind, self.num_bins)
        current = set(self._hists.names())
        for name, entry in d.items():
            if not isinstance(name, str):
                raise TypeError(f"histogram_dict keys must be tensor names (str), got {name!r}")
            if name in current and entry is self._handed.get(name) and self._unchanged(name, entry):
                restore_exact(hists, name, export_exact(self._hists, name))
            else:
                _restore_entry(hists, self._kind, name, entry)
        return hists

    def compute_collection_result(self) -> dict[str, Any]:
        """ORT's result of the method on the histograms (``histogram_dict`` edits included).

        Returns:
            Per tensor ORT's ``TensorData`` (distribution) or range tuple (entropy, percentile).

        Raises:
            ValueError: nothing collected, or distribution with fewer than 512 bins.
        """
        with self._lock:
            if not self.histograms.names():  # (synced with histogram_dict here, once)
                raise ValueError("Histogram has not been collected. Please run collect() first.")
            logger.info("Finding optimal threshold for each tensor using %r algorithm", self.method)
            settings = OrtSettings(
                self.method, self.symmetric, self.num_bins, self.num_quantized_bins, self.percentile, self.scenario
            )
            entries = self.histogram_dict  # ORT's results share its arrays
            return ort_results(self._hists, settings, entries)


_ENTRY_SHAPES = {"value": "(hist, edges, min, max, threshold)", "abs": "(hist, edges, min, max)"}


def _restore_entry(hists: _core.Histograms, kind: str, name: str, entry: Any) -> None:
    """Load one ORT-style histogram tuple into ``hists``: its counts are taken as finite values
    of 0 batches. The data dtype is the edges', or the min's where that is narrower (float16
    data in float32 edges, histocal's "Too many bins" fallback)."""
    if not isinstance(entry, tuple) or len(entry) != (5 if kind == "value" else 4):
        raise ValueError(f"tensor {name!r}: histogram_dict entries of this collector are {_ENTRY_SHAPES[kind]} tuples")
    hist, edges = np.asarray(entry[0]), np.asarray(entry[1])
    if hist.ndim != 1 or edges.ndim != 1:
        raise ValueError(f"tensor {name!r}: hist and edges must be 1-D arrays")
    if hist.dtype.kind == "f" and np.all(np.isfinite(hist)) and np.all(hist == np.floor(hist)):
        hist = hist.astype(np.int64)
    if hist.dtype.kind not in "iu" or (hist.size and hist.min() < 0):
        raise ValueError(f"tensor {name!r}: hist must hold counts (whole numbers >= 0), got {hist.dtype}")
    if edges.dtype.kind != "f" or edges.dtype.itemsize not in (2, 4, 8):
        raise ValueError(f"tensor {name!r}: edges must be float16, float32 or float64, got {edges.dtype}")
    edges = edges.astype(edges.dtype.newbyteorder("="), copy=False)
    mn = entry[2]
    data = edges.dtype
    if isinstance(mn, (np.ndarray, np.generic)) and mn.dtype.kind == "f" and mn.dtype.itemsize < data.itemsize:
        data = mn.dtype

    def held(v: Any) -> tuple[float, bool]:
        try:
            return float(np.asarray(v, dtype=np.float64).reshape(())), isinstance(v, np.ndarray)
        except (TypeError, ValueError):
            raise ValueError(f"tensor {name!r}: min, max and threshold must be single numbers, got {v!r}") from None

    threshold = held(entry[4]) if kind == "value" else None
    counts = (int(hist.sum()), 0, 0, 0, 0)
    hists.restore(
        name,
        str(data),
        np.ascontiguousarray(hist, np.int64),
        np.ascontiguousarray(edges),
        held(mn),
        held(entry[3]),
        threshold,
        counts,
    )


__all__ = ["HistogramCollector", "ValueCounts", "float_batches"]


# ----------------------------------------------------------------------------------------------
# Exported exact histograms (the state's merge and file use them; copies are ``Histograms.copy``)
# ----------------------------------------------------------------------------------------------


@dataclass
class ExactHistogram:
    """One tensor's exact ORT histogram: what ``Histograms.state``/``counts`` export."""

    dtype: str
    hist: np.ndarray
    edges: np.ndarray
    min: tuple[float, bool]
    max: tuple[float, bool]
    threshold: tuple[float, bool] | None
    counts: tuple[int, ...]  # finite, NaN, +Inf, -Inf, batches


def export_exact(hists: Any, name: str) -> ExactHistogram:
    st, c = hists.state(name), hists.counts(name)
    return ExactHistogram(
        st.dtype,
        st.hist,
        st.edges,
        tuple(st.min),
        tuple(st.max),
        None if st.threshold is None else tuple(st.threshold),
        (c.n_finite, c.n_nan, c.n_posinf, c.n_neginf, c.batches),
    )


def restore_exact(hists: Any, name: str, e: ExactHistogram) -> None:
    hists.restore(
        name,
        e.dtype,
        np.ascontiguousarray(e.hist, np.int64),
        np.ascontiguousarray(e.edges),
        e.min,
        e.max,
        e.threshold,
        e.counts,
    )

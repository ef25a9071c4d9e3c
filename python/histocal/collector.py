"""A drop-in for onnxruntime's ``HistogramCollector``, computed by histocal's Rust core.

Same constructor, same ``collect`` / ``compute_collection_result`` / ``histogram_dict``, and the
same result objects down to numpy scalar-vs-0-d-array kinds and dtypes. Where ORT crashes or
silently drops data, histocal returns a result instead (docs/deviations.md).

``histogram_dict`` behaves like ORT's plain attribute: the same dict object every time, updated
in place by ``collect``, assignable, and edits to it (entries set, replaced or deleted, arrays
changed in place) are what the next ``collect`` / ``compute_collection_result`` works from. The
histograms themselves live in Rust; the dict is a view kept in step with them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnxruntime.quantization.calibrate import CalibrationDataCollector, TensorData

from . import _core

logger = logging.getLogger(__name__)

METHODS = ("entropy", "percentile", "distribution")
SCENARIOS = ("same", "p3")


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


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


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


def _held(value: float, is_array: bool, dtype: np.dtype) -> Any:
    """ORT holds some values as numpy scalars and others as 0-d arrays; mirror which."""
    return np.array(value, dtype=dtype) if is_array else dtype.type(value)


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
        if method not in METHODS:
            raise ValueError("Only 'entropy', 'percentile' or 'distribution' methods are supported")
        num_bins = _check_int("num_bins", num_bins, 1)
        if method == "entropy":
            num_quantized_bins = _check_int("num_quantized_bins", num_quantized_bins, 1)
            if num_bins < num_quantized_bins:
                raise ValueError(f"num_bins ({num_bins}) must be >= num_quantized_bins ({num_quantized_bins})")
        if method == "percentile" and (percentile is None or not 0 <= percentile <= 100 or np.isnan(percentile)):
            raise ValueError("Invalid percentile. Must be in range 0 <= percentile <= 100.")
        if method == "distribution" and scenario not in SCENARIOS:
            raise ValueError("Invalid scenario. Must be in {'same', 'p3'}.")
        self.method = method
        self.symmetric = symmetric
        self.num_bins = num_bins
        self.num_quantized_bins = num_quantized_bins
        self.percentile = percentile
        self.scenario = scenario
        self._kind = "abs" if method == "percentile" and symmetric else "value"
        self._hists = _core.Histograms(self._kind, num_bins)
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

    def _entry(self, name: str) -> tuple:
        st = self._hists.state(name)
        dtype = st.edges.dtype
        entry = (st.hist, st.edges, _held(*st.min, dtype), _held(*st.max, dtype))
        return entry if st.threshold is None else (*entry, _held(*st.threshold, dtype))

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
                self._dict[name] = self._handed[name] = self._entry(name)

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
            if self.method == "entropy":
                result: dict[str, Any] = self._entropy()
            elif self.method == "percentile":
                result = self._percentile()
            else:
                result = self._distribution()
            self._warn_nothing_binned(result)
            return result

    def _warn_nothing_binned(self, result: Mapping[str, Any]) -> None:
        """Name the tensors whose histogram holds no value (empty, or every value NaN or
        infinite): their range is a placeholder, not a measurement. onnxruntime raises on
        NaN/Inf-only data, and on empty data gives an inverted asymmetric-Percentile range."""
        empty = []
        for name in self._hists.names():
            counts = self._hists.counts(name)
            if counts.n_finite == 0 and not self._hists.state(name).hist.any():
                lo, hi = result[name].range_value if isinstance(result[name], TensorData) else result[name][:2]
                kinds = zip((counts.n_nan, counts.n_posinf, counts.n_neginf), ("NaN", "+inf", "-inf"))
                held = ", ".join(f"{n} {kind}" for n, kind in kinds if n) or "no values"
                empty.append(f"{name!r} ({held}: range [{float(lo):g}, {float(hi):g}])")
        if empty:
            shown = ", ".join(empty[:10]) + (f" and {len(empty) - 10} more" if len(empty) > 10 else "")
            logger.warning(
                "%s: %d tensor(s) without a finite value to calibrate on (empty, or all NaN/Inf): %s. "
                "Their ranges are placeholders; check the model and the calibration data.",
                self.method,
                len(empty),
                shown,
            )

    def _narrowed(self, name: str) -> bool:
        """Whether this tensor's histogram was widened to float64 from float16/float32 data
        (numpy could not build its bins in the data's type, e.g. a range of +-3.4e38): its
        results then go out as float32, which onnxruntime's TensorData holds."""
        edges = self.histogram_dict[name][1]
        return edges.dtype == np.float64 and self._hists.state(name).dtype != "float64"

    def _entropy(self) -> dict[str, tuple]:
        hd = self.histogram_dict
        out = {}
        for r in self._hists.entropy(self.num_quantized_bins):
            name = r.name
            hist, edges, mn, mx = hd[name][:4]
            lo, hi = _clip(edges[r.start], edges[r.end], mn, mx)
            if self._narrowed(name):
                lo, hi = _outward_f32(lo, hi)
            out[name] = (lo, hi, hist, edges)
        return out

    def _percentile(self) -> dict[str, tuple]:
        hd = self.histogram_dict
        out = {}
        for r in self._hists.percentile(float(self.percentile), self.symmetric):
            name, i_lo, i_hi = r.name, r.start, r.end
            hist, edges, mn, mx = hd[name][:4]
            if self.symmetric:
                lo, hi = -np.array(edges[i_hi], edges.dtype), np.array(edges[i_hi], edges.dtype)
            else:
                lo, hi = np.array(edges[i_lo], edges.dtype), np.array(edges[i_hi], edges.dtype)
            lo, hi = _clip(lo, hi, mn, mx)
            if hi < lo and not np.any(hist):
                # Nothing binned (an empty tensor; NaN/Inf only, where ORT raises): ORT's cdf is
                # NaN and its range comes out inverted, e.g. (0, -0.5). histocal's is [lo, lo]
                # (docs/deviations.md), ``hi`` of ORT's kind. A constant tensor's range comes out
                # inverted from ORT too, (c, c - w): that one is ORT's result and stays.
                hi = np.array(lo, hi.dtype) if isinstance(hi, np.ndarray) else hi.dtype.type(lo)
            if self._narrowed(name):
                lo, hi = _outward_f32(lo, hi)
            out[name] = (lo, hi, *hist[:2])
        return out

    def _distribution(self) -> dict[str, TensorData]:
        if self.num_bins < 512:
            raise ValueError("Invalid num_bins. Must be in range 512 <= num_bins.")
        hd = self.histogram_dict
        moments: dict[str, tuple[Any, Any]]  # floats from Rust, numpy scalars from numpy
        if self.scenario == "same":
            moments = {m.name: (m.avg, m.std) for m in self._hists.distribution()}
        else:
            moments = {n: _p3_avg_std(*hd[n][:2]) for n in hd}
        out = {}
        for name, (avg, std) in moments.items():
            hist, edges = hd[name][:2]
            if self._narrowed(name):
                edges = _edges_f32(edges)
                avg, std = _nearest_f32(name, "avg", avg), _nearest_f32(name, "std", std)
            elif edges.dtype == np.float64:
                raise ValueError(
                    f"tensor {name!r}: float64 data has no Distribution result "
                    "(onnxruntime's TensorData holds float16/float32 only)"
                )
            out[name] = TensorData(
                avg=np.array(avg, dtype=edges.dtype),
                std=np.array(std, dtype=edges.dtype),
                hist=hist,
                hist_edges=edges,
                lowest=edges.min(),
                highest=edges.max(),
            )
        return out


def _p3_avg_std(hist: np.ndarray, edges: np.ndarray) -> tuple[Any, Any]:
    """ORT's ``_avg_std(power=1/3)``, on the histogram (a few thousand values), with numpy's own
    float ``power``: its SIMD kernel differs from libm and between CPUs, so only numpy itself
    gives ORT's bits on every machine."""
    with np.errstate(all="ignore"):
        values = (edges[:-1] + edges[1:]) * 0.5
        fact = np.abs(values) / values
        fact[np.isnan(fact)] = 1
        fact[np.isinf(fact)] = 1
        values = np.abs(values) ** (1.0 / 3.0) * fact
        avg = (hist * values).sum() / hist.sum()
        std = ((hist * values**2).sum() / hist.sum() - avg**2) ** 0.5
    return avg, std


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


_F32_MAX = float(np.finfo(np.float32).max)


def _f32_outward(x: float, direction: float) -> np.float32:
    """The float32 nearest ``x`` in ``direction`` (-inf: the largest float32 <= x, +inf: the
    smallest >= x), saturating at float32's largest magnitude: no float32 value lies beyond it,
    so the result still bounds every value of a float32 tensor on that side."""
    x = min(max(x, -_F32_MAX), _F32_MAX)
    r = np.float32(x)
    if float(r) != x and (float(r) > x) == (direction < 0):
        r = np.nextafter(r, np.float32(direction))
    return r


def _as_held(value: Any, r: np.float32) -> Any:
    """``r`` held like ``value`` (numpy scalar or 0-d array, as ORT holds each result)."""
    return np.array(r) if isinstance(value, np.ndarray) else r


def _outward_f32(lo: Any, hi: Any) -> tuple[Any, Any]:
    """A float64 range as a float32 one that still covers it (see ``_f32_outward``)."""
    return _as_held(lo, _f32_outward(float(lo), -np.inf)), _as_held(hi, _f32_outward(float(hi), np.inf))


def _edges_f32(edges: np.ndarray) -> np.ndarray:
    """float64 edges as float32: the outer two outward (so they still span the float64 ones:
    Distribution's lowest/highest are their min/max), the inner ones to nearest, all within
    float32's range (bins past it, which an ORT-style merge can add, hold no float32 value)."""
    out = np.clip(edges, -_F32_MAX, _F32_MAX).astype(np.float32)
    out[0] = _f32_outward(float(edges[0]), -np.inf)
    out[-1] = _f32_outward(float(edges[-1]), np.inf)
    return out


def _nearest_f32(name: str, what: str, x: Any) -> np.ndarray:
    """``x`` rounded to the nearest float32 (0-d array); an error naming the tensor past
    float32's range."""
    with np.errstate(over="ignore"):
        r = np.array(x, dtype=np.float32)
    if np.isinf(r) and not np.isinf(x):
        raise ValueError(f"tensor {name!r}: Distribution {what} {float(x)!r} is beyond float32's range")
    return r


def _clip(lo: Any, hi: Any, mn: Any, mx: Any) -> tuple[Any, Any]:
    """ORT's clipping of a threshold pair to the data's min/max (keeping whichever object)."""
    if lo < mn:
        lo = mn
    if hi > mx:
        hi = mx
    return lo, hi


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


@dataclass(frozen=True)
class CollectedData:
    """What a histogram calibrator has collected (``calibrator.collected()``): the calibration
    state is built from it, and ``calibrator.restore_collected`` puts one back."""

    mode: str  # how it was collected: "exact" or "streaming"
    stream: _core.StreamHistograms | None = None  # exact mode feeds one too, so every method can be served
    exact: _core.Histograms | None = None  # ORT's exact histograms (exact mode only)
    exact_kind: str | None = None  # "value" or "abs"
    exact_num_bins: int | None = None
    channels: Any = None  # state.channels.ChannelHistograms: per-channel streaming histograms, when collected

    @property
    def names(self) -> list[str]:
        """The tensors collected, in collection order."""
        if self.stream is not None:
            return list(self.stream.names())
        return [] if self.exact is None else list(self.exact.names())

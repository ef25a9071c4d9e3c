"""onnxruntime's Entropy, Percentile and Distribution results from exact ORT histograms.

``ort_results(histograms, settings)`` gives, per tensor of a ``_core.Histograms``, what ORT's
``HistogramCollector.compute_collection_result`` gives for the same histograms: the
``(low, high, ...)`` tuples of entropy and percentile, distribution's ``TensorData``, down to
numpy scalar-vs-0-d-array kinds and dtypes, ready for ``TensorsData``. Both routes to ORT's
results use it: the drop-in collector (``histocal.collector``, hence every exact calibrator) and a
calibration state computing from its exact or streaming histograms (``histocal.state.compute``).

Why it is exact: the Rust core runs ORT's searches over the histogram's counts with ORT's own
arithmetic (``Histograms.entropy``/``percentile``/``distribution``: numpy's float32 and float64
operations in numpy's order) and returns bin indices or moments; this module only indexes the
tensor's own edges with them, clips to its own min/max in their dtype, and wraps the values as
ORT does. Scenario ``p3`` runs numpy itself (``p3_avg_std``). Where ORT crashes or gives an
inverted range on a histogram that holds nothing, the result is documented in docs/deviations.md.

A histogram widened to float64 from float16/float32 data (numpy could not build its bins in the
data's type) has its results narrowed to float32, which ORT's ``TensorData`` holds: ranges
outward, so that they still cover the data.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnxruntime.quantization.calibrate import TensorData

from . import _core

logger = logging.getLogger(__name__)

METHODS = ("entropy", "percentile", "distribution")
SCENARIOS = ("same", "p3")


@dataclass(frozen=True)
class OrtSettings:
    """One of ORT's histogram methods with its settings (``HistogramCollector``'s arguments).

    Attributes:
        method: ``"entropy"``, ``"percentile"`` or ``"distribution"``.
        symmetric: symmetric ranges (percentile: histograms of |x|).
        num_bins: histogram bins.
        num_quantized_bins: entropy's quantized distribution's bins.
        percentile: percentile's percentile, in [0, 100].
        scenario: distribution's ``"same"`` or ``"p3"``.
    """

    method: str
    symmetric: bool
    num_bins: int
    num_quantized_bins: int
    percentile: float
    scenario: str

    @property
    def kind(self) -> str:
        """The histograms the method reads: ``"abs"`` (|x|, symmetric percentile) or ``"value"``."""
        return "abs" if self.method == "percentile" and self.symmetric else "value"


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def ort_settings(
    method: str, symmetric: bool, num_bins: int, num_quantized_bins: int, percentile: float, scenario: str
) -> OrtSettings:
    """The settings, checked as ORT's ``HistogramCollector`` checks them (its messages).

    Returns:
        The settings, with ``num_bins`` (and entropy's ``num_quantized_bins``) as Python ints.

    Raises:
        ValueError: an unknown method or a bad setting.
    """
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
    return OrtSettings(method, symmetric, num_bins, num_quantized_bins, percentile, scenario)


def _held(value: float, is_array: bool, dtype: np.dtype) -> Any:
    """ORT holds some values as numpy scalars and others as 0-d arrays; mirror which."""
    return np.array(value, dtype=dtype) if is_array else dtype.type(value)


def histogram_entry(hists: _core.Histograms, name: str) -> tuple:
    """One tensor's histogram as ORT's ``histogram_dict`` holds it: ``(hist, edges, min, max,
    threshold)``, or ``(hist, edges, min, max)`` for the |x| histogram."""
    st = hists.state(name)
    dtype = st.edges.dtype
    entry = (st.hist, st.edges, _held(*st.min, dtype), _held(*st.max, dtype))
    return entry if st.threshold is None else (*entry, _held(*st.threshold, dtype))


def ort_results(
    hists: _core.Histograms, settings: OrtSettings, entries: Mapping[str, tuple] | None = None
) -> dict[str, Any]:
    """ORT's result of ``settings``' method on every tensor of ``hists``.

    Args:
        hists: ORT histograms of ``settings.kind``.
        settings: the method and its settings.
        entries: ``hists``' tensors as ``histogram_entry`` gives them, when the caller holds them
            already (the collector's ``histogram_dict``: ORT's results share its arrays); default:
            read from ``hists``.

    Returns:
        Per tensor ORT's ``TensorData`` (distribution) or range tuple (entropy, percentile).

    Raises:
        ValueError: distribution with fewer than 512 bins, or on float64 data.
    """
    if settings.method == "distribution" and settings.num_bins < 512:
        raise ValueError("Invalid num_bins. Must be in range 512 <= num_bins.")
    if entries is None:
        entries = {name: histogram_entry(hists, name) for name in hists.names()}
    if settings.method == "entropy":
        result: dict[str, Any] = _entropy(hists, entries, settings.num_quantized_bins)
    elif settings.method == "percentile":
        result = _percentile(hists, entries, float(settings.percentile), settings.symmetric)
    else:
        result = _distribution(hists, entries, settings.scenario)
    _warn_nothing_binned(hists, entries, result, settings.method)
    return result


def _warn_nothing_binned(
    hists: _core.Histograms, entries: Mapping[str, tuple], result: Mapping[str, Any], method: str
) -> None:
    """Name the tensors whose histogram holds no value (empty, or every value NaN or
    infinite): their range is a placeholder, not a measurement. onnxruntime raises on
    NaN/Inf-only data, and on empty data gives an inverted asymmetric-Percentile range."""
    empty = []
    for name in hists.names():
        counts = hists.counts(name)
        if counts.n_finite == 0 and not entries[name][0].any():
            lo, hi = result[name].range_value if isinstance(result[name], TensorData) else result[name][:2]
            kinds = zip((counts.n_nan, counts.n_posinf, counts.n_neginf), ("NaN", "+inf", "-inf"))
            held = ", ".join(f"{n} {kind}" for n, kind in kinds if n) or "no values"
            empty.append(f"{name!r} ({held}: range [{float(lo):g}, {float(hi):g}])")
    if empty:
        shown = ", ".join(empty[:10]) + (f" and {len(empty) - 10} more" if len(empty) > 10 else "")
        logger.warning(
            "%s: %d tensor(s) without a finite value to calibrate on (empty, or all NaN/Inf): %s. "
            "Their ranges are placeholders; check the model and the calibration data.",
            method,
            len(empty),
            shown,
        )


def _narrowed(hists: _core.Histograms, name: str) -> bool:
    """Whether this tensor's histogram was widened to float64 from float16/float32 data
    (numpy could not build its bins in the data's type, e.g. a range of +-3.4e38): its
    results then go out as float32, which onnxruntime's TensorData holds."""
    data, edges = hists.dtypes(name)
    return edges == "float64" and data != "float64"


def _entropy(hists: _core.Histograms, entries: Mapping[str, tuple], num_quantized_bins: int) -> dict[str, tuple]:
    out = {}
    for r in hists.entropy(num_quantized_bins):
        name = r.name
        hist, edges, mn, mx = entries[name][:4]
        lo, hi = _clip(edges[r.start], edges[r.end], mn, mx)
        if _narrowed(hists, name):
            lo, hi = _outward_f32(lo, hi)
        out[name] = (lo, hi, hist, edges)
    return out


def _percentile(
    hists: _core.Histograms, entries: Mapping[str, tuple], percentile: float, symmetric: bool
) -> dict[str, tuple]:
    out = {}
    for r in hists.percentile(percentile, symmetric):
        name, i_lo, i_hi = r.name, r.start, r.end
        hist, edges, mn, mx = entries[name][:4]
        if symmetric:
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
        if _narrowed(hists, name):
            lo, hi = _outward_f32(lo, hi)
        # ORT appends its histogram's first two counts (``*hist[:2]``), not the histogram
        out[name] = (lo, hi, *hist[:2])
    return out


def _distribution(hists: _core.Histograms, entries: Mapping[str, tuple], scenario: str) -> dict[str, TensorData]:
    moments: dict[str, tuple[Any, Any]]  # floats from Rust, numpy scalars from numpy
    if scenario == "same":
        moments = {m.name: (m.avg, m.std) for m in hists.distribution()}
    else:
        moments = {n: p3_avg_std(*entries[n][:2]) for n in entries}
    out = {}
    for name, (avg, std) in moments.items():
        hist, edges = entries[name][:2]
        if _narrowed(hists, name):
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


def p3_avg_std(hist: np.ndarray, edges: np.ndarray) -> tuple[Any, Any]:
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


__all__ = ["METHODS", "SCENARIOS", "OrtSettings", "histogram_entry", "ort_results", "ort_settings"]

"""A drop-in for onnxruntime's ``HistogramCollector``, computed by histocal's Rust core.

Same constructor, same ``collect`` / ``compute_collection_result`` / ``histogram_dict``, and the
same result objects down to numpy scalar-vs-0-d-array kinds and dtypes. Where ORT crashes or
silently drops data, histocal returns a result instead (see the README's "Deviations").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from onnxruntime.quantization.calibrate import CalibrationDataCollector, TensorData

from . import _core

logger = logging.getLogger(__name__)

METHODS = ("entropy", "percentile", "distribution")
SCENARIOS = ("same", "p3")


@dataclass(frozen=True)
class ValueCounts:
    """How many values of a tensor were collected, by kind. Non-finite values are never binned."""

    finite: int
    nan: int
    posinf: int
    neginf: int
    batches: int


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
            raise TypeError(
                f"tensor {name!r}: expected float16, float32 or float64 data, got {a.dtype}"
            )
    if len({a.dtype for a in arrays}) > 1:
        common = np.result_type(*arrays)
        arrays = [a.astype(common) for a in arrays]
    return [
        a if a.dtype.isnative and a.flags.aligned else a.astype(a.dtype.newbyteorder("="))
        for a in arrays
    ]


def _held(value: float, is_array: bool, dtype: np.dtype) -> Any:
    """ORT holds some values as numpy scalars and others as 0-d arrays; mirror which."""
    return np.array(value, dtype=dtype) if is_array else dtype.type(value)


class HistogramCollector(CalibrationDataCollector):
    """ORT's ``HistogramCollector``, identical results, computed in Rust."""

    def __init__(
        self,
        method: str,
        symmetric: bool,
        num_bins: int,
        num_quantized_bins: int,
        percentile: float,
        scenario: str,
    ) -> None:
        if method not in METHODS:
            raise ValueError("Only 'entropy', 'percentile' or 'distribution' methods are supported")
        num_bins = _check_int("num_bins", num_bins, 1)
        if method == "entropy":
            num_quantized_bins = _check_int("num_quantized_bins", num_quantized_bins, 1)
            if num_bins < num_quantized_bins:
                raise ValueError(
                    f"num_bins ({num_bins}) must be >= num_quantized_bins ({num_quantized_bins})"
                )
        if method == "percentile" and (
            percentile is None or not 0 <= percentile <= 100 or np.isnan(percentile)
        ):
            raise ValueError("Invalid percentile. Must be in range 0 <= percentile <= 100.")
        if method == "distribution" and scenario not in SCENARIOS:
            raise ValueError("Invalid scenario. Must be in {'same', 'p3'}.")
        self.method = method
        self.symmetric = symmetric
        self.num_bins = num_bins
        self.num_quantized_bins = num_quantized_bins
        self.percentile = percentile
        self.scenario = scenario
        kind = "abs" if method == "percentile" and symmetric else "value"
        self._histograms = _core.Histograms(kind, num_bins)
        self._dict: dict[str, tuple] | None = None
        self._data_dtypes: dict[str, str] = {}  # filled with the histogram_dict

    def collect(self, name_to_arr: Mapping[str, Any]) -> None:
        """Add one ``collect`` call's data: per tensor an array or a list of per-batch arrays."""
        items = [(name, float_batches(name, data)) for name, data in name_to_arr.items()]
        self._dict = None
        self._histograms.collect(items)

    @property
    def histogram_dict(self) -> dict[str, tuple]:
        """ORT's tuples: ``(hist, edges, min, max, threshold)``, or ``(hist, edges, min, max)``
        for the symmetric-percentile |x| histogram."""
        if self._dict is None:
            self._data_dtypes = {}
            self._dict = {name: self._entry(name) for name in self._histograms.names()}
        return self._dict

    def get_histogram_dict(self) -> dict[str, tuple]:
        return self.histogram_dict

    @property
    def counts(self) -> dict[str, ValueCounts]:
        return {n: ValueCounts(*self._histograms.counts(n)) for n in self._histograms.names()}

    def _entry(self, name: str) -> tuple:
        hist, edges, mn, mx, threshold, self._data_dtypes[name] = self._histograms.state(name)
        dtype = edges.dtype
        entry = (hist, edges, _held(*mn, dtype), _held(*mx, dtype))
        return entry if threshold is None else (*entry, _held(*threshold, dtype))

    def compute_collection_result(self) -> dict[str, Any]:
        if not self._histograms.names():
            raise ValueError("Histogram has not been collected. Please run collect() first.")
        logger.info("Finding optimal threshold for each tensor using %r algorithm", self.method)
        if self.method == "entropy":
            return self._entropy()
        if self.method == "percentile":
            return self._percentile()
        return self._distribution()

    def _narrowed(self, name: str) -> bool:
        """Whether this tensor's histogram was widened to float64 from float16/float32 data
        (numpy could not build its bins in the data's type, e.g. a range of +-3.4e38): its
        results then go out as float32, which onnxruntime's TensorData holds."""
        edges = self.histogram_dict[name][1]
        return edges.dtype == np.float64 and self._data_dtypes[name] != "float64"

    def _entropy(self) -> dict[str, tuple]:
        hd = self.histogram_dict
        out = {}
        for name, start, end in self._histograms.entropy(self.num_quantized_bins):
            hist, edges, mn, mx = hd[name][:4]
            lo, hi = _clip(edges[start], edges[end], mn, mx)
            if self._narrowed(name):
                lo, hi = _outward_f32(lo, hi)
            out[name] = (lo, hi, hist, edges)
        return out

    def _percentile(self) -> dict[str, tuple]:
        hd = self.histogram_dict
        out = {}
        for name, i_lo, i_hi in self._histograms.percentile(float(self.percentile), self.symmetric):
            hist, edges, mn, mx = hd[name][:4]
            if self.symmetric:
                lo, hi = -np.array(edges[i_hi], edges.dtype), np.array(edges[i_hi], edges.dtype)
            else:
                lo, hi = np.array(edges[i_lo], edges.dtype), np.array(edges[i_hi], edges.dtype)
            lo, hi = _clip(lo, hi, mn, mx)
            if self._narrowed(name):
                lo, hi = _outward_f32(lo, hi)
            out[name] = (lo, hi, *hist[:2])
        return out

    def _distribution(self) -> dict[str, TensorData]:
        if self.num_bins < 512:
            raise ValueError("Invalid num_bins. Must be in range 512 <= num_bins.")
        hd = self.histogram_dict
        if self.scenario == "same":
            moments = {n: (a, s) for n, a, s in self._histograms.distribution()}
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

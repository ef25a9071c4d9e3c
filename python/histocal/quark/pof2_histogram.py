"""Quark 0.13's histogram MinMSE (mode ``All`` with ``num_bins > 0``, its default), its arithmetic.

Collection, one batch at a time: the values as float32, NaN as 0; the first batch makes
``num_bins`` equal bins over ``[min, max]`` (float64 edges; ``[v - 0.5, v + 0.5]`` when every
value is ``v``); a later batch inside the edges is counted in them; one outside widens them by
whole bins of the same width on the side(s) it passes, the new edges being
``linspace(new_lo, new_hi, bins + 1)``. The global min and max are kept in the values' type.

Result: Quark's power-of-two zero point ``z`` and position ``p`` of ``[min, max]``
(:func:`~histocal.quark.pof2.power_of_two`), then among the scales ``2^-(p + i - 1)``, i = 0..4,
the one with the least ``sum(count * (centre - dequantize(quantize(centre)))^2)`` over the bin
centres (the first on ties); ``quantize`` is ``clip(int32(round(centre_f32 / s)) + z, qmin,
qmax)`` with the symmetric ``[qmin, qmax]``. The range is ``((qmin - z) s, (qmax - z) s)`` in the
values' type. Quark computes this for symmetric ranges only. A batch with no values adds
nothing (Quark 0.13 fails on it); a tensor with none at all gets Quark 0.9's MinMSE of no values.

Every set of edges is ``linspace`` of its two ends, so counting with ``np.histogram(bins=n,
range=(lo, hi))`` (numpy's equal-bins path, O(n)) gives the counts of Quark's
``np.histogram(bins=edges)`` (which sorts each batch): numpy defines the two as equal. histocal
counts with its Rust kernel of numpy's equal-bins path (``_core.quark_histogram_counts``, on the
float32 values widened to float64 as Quark's ``astype``: the same counts, bit for bit).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._core import quark_histogram_counts
from . import pof2

# Quark widens the histogram by as many bins as a far outlier needs; past this it would take
# gigabytes (Quark then fails for memory): an error naming the way out instead.
MAX_BINS = 1 << 24


class MinMSEHistogram:
    """One tensor's histogram, merged batch by batch as Quark 0.13 does."""

    def __init__(self, num_bins: int) -> None:
        self.num_bins = int(num_bins)
        self.hist: np.ndarray | None = None
        self.lo = self.hi = 0.0
        self.rmin: np.ndarray | None = None
        self.rmax: np.ndarray | None = None
        self.dtype: Any = None

    def copy(self) -> MinMSEHistogram:
        new = MinMSEHistogram(self.num_bins)
        new.hist = None if self.hist is None else self.hist.copy()
        new.lo, new.hi, new.rmin, new.rmax, new.dtype = self.lo, self.hi, self.rmin, self.rmax, self.dtype
        return new

    def edges(self) -> np.ndarray:
        assert self.hist is not None
        return np.linspace(self.lo, self.hi, len(self.hist) + 1)

    def add(self, x: np.ndarray, qtype: str) -> None:
        if self.dtype is not None and x.dtype != self.dtype:
            raise ValueError(f"values of type {x.dtype} after values of type {self.dtype}")
        self.dtype = x.dtype
        if x.size == 0:  # nothing to count (Quark 0.13 fails on it)
            return
        data = np.ascontiguousarray(np.ravel(x), dtype=np.float32)
        new_min, new_max = float(data.min()), float(data.max())
        if not (math.isfinite(new_min) and math.isfinite(new_max)):  # NaN as 0, +-inf as +-float32 max
            data = np.nan_to_num(data, nan=0.0)
            new_min, new_max = float(data.min()), float(data.max())
        rmin, rmax = np.array(new_min, dtype=x.dtype), np.array(new_max, dtype=x.dtype)
        if self.hist is None:
            lo, hi = (new_min - 0.5, new_max + 0.5) if new_min == new_max else (new_min, new_max)
            self.hist = quark_histogram_counts(data, self.num_bins, lo, hi)
            self.lo, self.hi, self.rmin, self.rmax = float(lo), float(hi), rmin, rmax
            return
        assert self.rmin is not None and self.rmax is not None
        n = len(self.hist)
        if not (new_min >= self.lo and new_max <= self.hi):
            width = float(self.edges()[1] - self.lo)
            left = max(0, int(np.ceil((self.lo - new_min) / width)))
            right = max(0, int(np.ceil((new_max - self.hi) / width)))
            if n + left + right > MAX_BINS:
                raise ValueError(
                    f"a batch's range [{new_min:.6g}, {new_max:.6g}] is {n + left + right} bins of the first "
                    f"batches' width wide (at most {MAX_BINS}); use num_bins=0 (MinMSE on the values)"
                )
            grown = np.zeros(n + left + right, dtype=self.hist.dtype)
            grown[left : left + n] = self.hist
            self.hist, self.lo, self.hi = grown, self.lo - left * width, self.hi + right * width
            n = len(grown)
        self.hist = self.hist + quark_histogram_counts(data, n, self.lo, self.hi)
        self.rmin, self.rmax = np.minimum(self.rmin, rmin), np.maximum(self.rmax, rmax)

    def result(self, qtype: str) -> tuple[Any, Any]:
        if self.dtype is None:
            raise ValueError("no values collected")
        if self.hist is None or self.rmin is None or self.rmax is None:
            # only empty batches: Quark's MinMSE on no values (0.9's result; 0.13 fails)
            pos, zero_point = pof2.min_mse(np.zeros(0, dtype=self.dtype), qtype, True)
            return pof2.value_range(pos, zero_point, qtype, True, self.dtype)
        return min_mse_of_histogram(self.hist, self.edges(), self.rmin, self.rmax, qtype)


def min_mse_of_histogram(
    hist: np.ndarray, edges: np.ndarray, rmin: np.ndarray, rmax: np.ndarray, qtype: str
) -> tuple[Any, Any]:
    """Quark 0.13's symmetric histogram MinMSE: ``(low, high)`` as 0-d arrays of the values' type."""
    if hist.sum() == 0:
        raise ValueError("empty histogram, no data was collected")
    qmin, qmax = pof2.qrange(qtype, True)
    zero_point, pos = pof2.power_of_two(rmin, rmax, qtype, True)
    base = pof2.scale_to_position(float(pof2.position_to_scale(pos, rmax.dtype)))
    centres32 = ((edges[:-1] + edges[1:]) / 2).astype(np.float32)
    centres64 = centres32.astype(np.float64)
    counts = hist.astype(np.float64)
    z, lo, hi = int(zero_point), int(qmin), int(qmax)
    best, best_scale = float("inf"), None
    for i in range(5):
        s = np.array(float(np.power(2.0, -(base + i - 1))), dtype=np.float32)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            q = np.clip(np.round(centres32 / s).astype(np.int32) + z, lo, hi)
            deq = (q.astype(np.float64) - float(z)) * float(s)
            err = float(np.sum(counts * (centres64 - deq) ** 2))
        if err < best:
            best, best_scale = err, s
    if best_scale is None:  # every error NaN: Quark keeps its float scale
        best_scale = pof2.position_to_scale(pos, rmax.dtype)
    with np.errstate(over="ignore"):
        low = np.array((float(qmin) - float(z)) * float(best_scale), dtype=rmin.dtype)
        high = np.array((float(qmax) - float(z)) * float(best_scale), dtype=rmax.dtype)
    return low, high

"""Tensors whose calibration ranges a few values decide, read from a state's streaming histograms.

Two kinds, both about the span an 8-bit grid has to cover:

* **sentinel**: the range reaches the dtype's lowest or highest value, or infinities occur, or a
  cluster of values sits at the extreme of the range apart from all the others: at least
  ``SENTINEL_MIN_SHARE`` of the finite values have ``|x| >= max|x| / 2`` while no value has
  ``max|x| / SENTINEL_GAP <= |x| < max|x| / 2``, and ``max|x| >= SENTINEL_MIN_MAGNITUDE`` (a 0/1
  indicator has such a gap too, and int8 holds it exactly). That is what an additive attention mask leaves
  (0 and -1e4, -1e9 or float32's lowest added to scores): the grid spends its codes between the
  mask value and the real values, and every real value rounds to the same code.
* **outlier**: no such gap, but ``max|x| / p99.99(|x|)`` (the report's outlier ratio) is at
  least ``OUTLIER_RATIO``: 99.99% of the values use at most 1/16 of the grid, 4 bits of int8.

Both are computed from the streaming histogram (uniform bins over ``[-2^level, 2^level]``); the
gap test needs the bins to resolve ``max|x| / SENTINEL_GAP``, which the default 16384 bins do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

SENTINEL_MIN_SHARE = 1e-4
SENTINEL_MIN_MAGNITUDE = 1e3
SENTINEL_GAP = 100.0
OUTLIER_RATIO = 16.0
_PERCENTILE = 99.99


@dataclass(frozen=True)
class RangeFinding:
    """A tensor whose range a few values decide. ``kind``: "sentinel" or "outlier"; ``ratio``:
    max|x| / p99.99(|x|); ``share``: the fraction of finite values at the extreme (sentinels);
    ``detail``: one line saying what was found."""

    tensor: str
    kind: str
    min: float
    max: float
    ratio: float
    share: float
    detail: str


def _extremes(dtype: str) -> tuple[float, float] | None:
    try:
        info = np.finfo(np.dtype(dtype))
    except (TypeError, ValueError):
        return None
    return float(info.min), float(info.max)


def range_findings(state: Any, names: list[str] | None = None) -> list[RangeFinding]:
    """The sentinel and outlier tensors of ``state`` (a ``CalibrationState`` with streaming
    histograms), among ``names`` (default: every tensor); sentinels first, then by ratio.

    Args:
        state: a ``CalibrationState``.
        names: the tensors to look at (default: all).

    Returns:
        The findings, sentinels first, then by outlier ratio.
    """
    stream = state.stream
    if stream is None:
        return []
    found = []
    for name in state.names if names is None else names:
        if name not in state.names:
            continue
        e = stream.export(name)
        finding = _classify(name, e.dtype, e.level, e.bins, e.finite_min, e.finite_max, e.abs_min, e.counts)
        if finding is not None:
            found.append(finding)
    found.sort(key=lambda f: (f.kind != "sentinel", -f.ratio if not math.isnan(f.ratio) else 0.0))
    return found


def _classify(
    name: str, dtype: str, level: int | None, bins: Any, fmin: float | None, fmax: float | None, _: Any, counts: Any
) -> RangeFinding | None:
    finite, _nan, posinf, neginf, _batches = counts
    if fmin is None or fmax is None or level is None or not finite:
        if posinf or neginf:
            return RangeFinding(name, "sentinel", math.nan, math.nan, math.nan, 0.0, "only infinities")
        return None
    bins = np.asarray(bins, np.float64)
    half = bins.size // 2
    width = math.ldexp(1.0, level) / half
    absolute = bins[half:] + bins[:half][::-1]  # |x| histogram, bin j: [j*width, (j+1)*width)
    total = float(absolute.sum())
    amax = max(abs(fmin), abs(fmax))
    cum = np.cumsum(absolute)
    j = int(np.searchsorted(cum, total * _PERCENTILE / 100.0, side="left"))
    p = min((min(j, half - 1) + 1) * width, amax)
    ratio = amax / p if p > 0 else 1.0
    # values at the extreme: |x| >= amax/2 (bins starting at or above it), a gap below them
    top = int(math.floor(amax / 2 / width))
    low = int(math.ceil(amax / SENTINEL_GAP / width))
    share = float(absolute[top:].sum()) / total if total else 0.0
    gap = low < top and not absolute[low:top].any() and absolute[:low].any()
    extremes = _extremes(dtype)
    hits = []
    if extremes is not None and (fmin <= extremes[0] or fmax >= extremes[1]):
        hits.append(f"reaches {dtype}'s {'lowest' if fmin <= extremes[0] else 'highest'} value")
    if posinf or neginf:
        hits.append(f"{posinf + neginf} infinite values")
    if gap and share >= SENTINEL_MIN_SHARE and amax >= SENTINEL_MIN_MAGNITUDE:
        side = fmin if abs(fmin) >= abs(fmax) else fmax
        hits.append(
            f"{share:.2%} of the values sit near {side:.4g}, the rest below {amax / SENTINEL_GAP:.4g} in magnitude"
        )
    if hits:
        return RangeFinding(name, "sentinel", fmin, fmax, ratio, share, "; ".join(hits))
    if ratio >= OUTLIER_RATIO:
        return RangeFinding(
            name, "outlier", fmin, fmax, ratio, share, f"max|x| is {ratio:.0f}x the p99.99 of |x| ({p:.4g})"
        )
    return None

"""What the report shows per tensor: its summary, every method's range and quantization error."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import methods as _methods
from ..methods.scale_rule import SCALE_RULE
from ..methods.table import TABLE

logger = logging.getLogger(__name__)


# The methods with a report colour, in table order (a method reading summaries beside the histogram
# is shown only for states that hold them: report.page).
REPORT_METHODS = tuple(m.name for m in TABLE.values() if m.colour is not None)
LABELS = {m.name: m.report_label for m in TABLE.values() if m.label is not None}
COLOURS: dict[str, str] = {m.name: m.colour for m in TABLE.values() if m.colour is not None}
OUTLIER_THRESHOLD = 4.0  # max|x| / p99.99(|x|) above this is highlighted
OUTLIER_PERCENTILE = 99.99
DISPLAY_BINS = 256
FIG_SIZE = (7.0, 3.3)  # inches
FIG_DPI = 80


# ---------------------------------------------------------------------------------------------
# What is reported per tensor


@dataclass
class TensorRow:
    name: str
    dtype: str
    finite: int
    nan: int
    posinf: int
    neginf: int
    batches: int
    min: float  # NaN without finite values
    max: float
    ratio: float  # outlier ratio; NaN without finite values
    mean_square: float
    counts: np.ndarray  # display histogram (trimmed, coarsened)
    edges: np.ndarray
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)  # method -> mean squared error
    auto_choice: str | None = None
    file: str | None = None  # PNG name under tensors/, when plotted

    def sqnr(self, method: str) -> float | None:
        """SQNR in dB (inf for a lossless range), None when unknown."""
        err = self.errors.get(method)
        if err is None or not self.mean_square > 0:
            return None
        return math.inf if err <= 0 else 10.0 * math.log10(self.mean_square / err)


def summarise(stream: Any, name: str) -> TensorRow:
    e = stream.export(name)
    dtype, level, fmin, fmax = e.dtype, e.level, e.finite_min, e.finite_max
    finite, nan, posinf, neginf, batches = e.counts
    bins = np.asarray(e.bins, dtype=np.uint64)
    nz = np.flatnonzero(bins)
    t = TensorRow(
        name=name,
        dtype=dtype,
        finite=int(finite),
        nan=int(nan),
        posinf=int(posinf),
        neginf=int(neginf),
        batches=int(batches),
        min=math.nan if fmin is None else float(fmin),
        max=math.nan if fmax is None else float(fmax),
        ratio=math.nan,
        mean_square=0.0,
        counts=np.zeros(0, np.uint64),
        edges=np.zeros(0),
    )
    if nz.size == 0 or level is None or fmin is None or fmax is None:
        return t
    half = bins.size // 2
    top = math.ldexp(1.0, level)
    width = top / half
    # mean square of the bins' representative values (centres clamped to [min, max]), as qerror
    lo_i, hi_i = int(nz[0]), int(nz[-1]) + 1
    span = bins[lo_i:hi_i].astype(np.float64)
    centres = np.clip(-top + (np.arange(lo_i, hi_i) + 0.5) * width, fmin, fmax)
    total = span.sum()
    # numpy's own loop, not BLAS's dot, whose rounding follows its thread count (the machine's)
    t.mean_square = float(np.einsum("i,i,i->", span, centres, centres) / total)
    # outlier ratio: max|x| over the p99.99 of |x| (upper edge of the |x| bin reaching it)
    absolute = bins[half:][:half].astype(np.float64) + bins[:half][::-1]
    cum = np.cumsum(absolute)
    j = int(np.searchsorted(cum, total * OUTLIER_PERCENTILE / 100.0, side="left"))
    amax = max(abs(fmin), abs(fmax))
    p = min((min(j, half - 1) + 1) * width, amax)
    t.ratio = amax / p if p > 0 else 1.0
    # display histogram: the occupied span, at most DISPLAY_BINS bins
    k = max(1, -(-span.size // DISPLAY_BINS))
    padded = np.zeros(-(-span.size // k) * k, np.uint64)
    padded[: span.size] = bins[lo_i:hi_i]
    t.counts = padded.reshape(-1, k).sum(axis=1)
    t.edges = -top + (lo_i + np.arange(t.counts.size + 1) * k) * width
    return t


def _pair(td: Any) -> tuple[float, float]:
    return float(np.asarray(td.range_value[0]).reshape(-1)[0]), float(np.asarray(td.range_value[1]).reshape(-1)[0])


def _method_settings(method: str, qtype: str, symmetric: bool) -> dict[str, Any]:
    """The report's ``qtype`` and ``symmetric``, for the methods that take them (others: their defaults)."""
    takes = TABLE[method].defaults
    return {k: v for k, v in (("qtype", qtype), ("symmetric", symmetric)) if k in takes}


def compute_ranges(state: Any, tensors: list[TensorRow], method: str, qtype: str, symmetric: bool) -> str | None:
    """Fill each tensor's range, error (and auto's choice) for ``method``; the problem, if any."""
    names = [t.name for t in tensors]
    settings = _method_settings(method, qtype, symmetric)
    qtypes = TABLE[method].option("qtype").choices if "qtype" in TABLE[method].defaults else None
    if qtypes is not None and qtype not in qtypes:
        return f"{method} has no {qtype} variant (only {', '.join(qtypes)})"
    try:
        if method in _methods.ORT_METHODS:
            data = state.compute(method, **settings).data
            pairs, choices = [_pair(data[n]) for n in names], None
        else:
            pairs, choices = state.method_ranges(method, **settings)
    except Exception as exc:
        logger.warning("report: %s: %s", method, exc)
        return f"{type(exc).__name__}: {exc}"
    for i, (t, pair) in enumerate(zip(tensors, pairs)):
        t.ranges[method] = (float(pair[0]), float(pair[1]))
        if choices is not None:
            t.auto_choice = choices[i]
    finite = [t for t in tensors if all(math.isfinite(v) for v in t.ranges[method])]
    if not finite:
        return None
    try:
        errs = state.stream.qerrors(
            [t.name for t in finite],
            [t.ranges[method] for t in finite],
            scale_rule=SCALE_RULE,
            qtype=qtype,
            symmetric=symmetric,
        )
    except Exception as exc:
        logger.warning("report: %s: quantization error estimate failed: %s", method, exc)
        return f"no error estimate ({type(exc).__name__}: {exc})"
    for t, err in zip(finite, errs):
        t.errors[method] = float(err)
    return None

"""Plain numpy reference implementations of histocal's calibration methods (issue 6).

These are deliberately simple, literal transcriptions of the methods' definitions (the docstrings
of ``histocal/methods.py`` and the Rust kernels' module docs) and are *not* optimised beyond vectorising over bins or candidates: the tests compare the
Rust kernels (``histocal._core.histogram_range`` / ``histogram_qerror`` / ``pow2_error``) against
them. Every histogram is a *uniform signed histogram*: ``counts`` (uint64), ``left`` (left edge of
bin 0), ``width``, and the finite data extremes ``mn <= mx``.

The error model (``qerror``) takes its quantization parameters from the installed onnxruntime
itself: ``get_qmin_qmax_for_qType`` for the integer range and ``compute_scale_zp`` for the scale and
zero point, called with the range as TensorData holds it (in the tensor's type, float32 unless a
``dtype`` says float16). The vectorised version used by the brute-force searches
(``scale_zp_many``, which needs the installed version's degenerate-scale rule spelled out) is
checked against that scalar ORT path by the tests, and so are pow2's exponent bounds.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from onnx import TensorProto
from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType

QTYPES = {
    "int8": TensorProto.INT8,
    "uint8": TensorProto.UINT8,
    "int16": TensorProto.INT16,
    "uint16": TensorProto.UINT16,
}
POW2_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767)}

# ----------------------------------------------------------------------------------------------
# Histogram basics
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hist:
    """A uniform signed histogram as the kernels take it."""

    counts: np.ndarray  # uint64, 1-D
    left: float
    width: float
    mn: float
    mx: float

    @property
    def args(self) -> tuple:
        return (self.counts, self.left, self.width, self.mn, self.mx)

    @property
    def total(self) -> int:
        return int(self.counts.sum(dtype=np.uint64))


def representatives(counts: np.ndarray, left: float, width: float, mn: float, mx: float) -> np.ndarray:
    """Bin centres ``left + (i + 0.5) * width`` clamped into ``[mn, mx]`` (float64)."""
    i = np.arange(len(counts), dtype=np.float64)
    x = left + (i + 0.5) * width
    return np.minimum(np.maximum(x, mn), mx)


def _nonzero(h: Hist) -> tuple[np.ndarray, np.ndarray]:
    """(x, c) of the non-empty bins only (empty bins contribute nothing to any sum)."""
    x = representatives(*h.args)
    nz = h.counts != 0
    return x[nz], h.counts[nz].astype(np.float64)


# ----------------------------------------------------------------------------------------------
# Quantization parameters and error (qerror)
# ----------------------------------------------------------------------------------------------


def qrange(qtype: str, symmetric: bool) -> tuple[int, int]:
    """onnxruntime's integer range for ``qtype`` (reduce_range=False)."""
    qmin, qmax = get_qmin_qmax_for_qType(QTYPES[qtype], reduce_range=False, symmetric=symmetric)
    return int(qmin), int(qmax)


def ort_scale_zp(low: float, high: float, qtype: str, symmetric: bool, dtype: str = "float32") -> tuple[float, int]:
    """Scale (as a Python float) and zero point of the range ``(low, high)``: the installed
    onnxruntime's ``compute_scale_zp`` on the range in ``dtype`` (TensorData's type), exactly as
    quantize_static calls it. A range beyond ``dtype`` has an infinite scale (and zero point 0)."""
    dt = np.dtype(dtype)
    with np.errstate(over="ignore"):
        lo, hi = np.array(low, dt), np.array(high, dt)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return math.inf, 0
    qmin, qmax = get_qmin_qmax_for_qType(QTYPES[qtype], reduce_range=False, symmetric=symmetric)
    zp, scale = compute_scale_zp(lo, hi, qmin, qmax, symmetric)
    assert scale.dtype == dt, scale.dtype
    return float(scale), int(zp)


def scale_zp_many(
    lows: np.ndarray, highs: np.ndarray, qtype: str, symmetric: bool, dtype: str = "float32"
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised :func:`ort_scale_zp`: the same operations as ORT's compute_scale_zp, with the
    installed version's degenerate-scale test (1.32 changed it for float16)."""
    from histocal.methods.scale_rule import SCALE_RULE

    dt = np.dtype(dtype)
    qmin, qmax = qrange(qtype, symmetric)
    with np.errstate(over="ignore"):
        lows = np.asarray(lows, np.float64).astype(dt).astype(np.float64)
        highs = np.asarray(highs, np.float64).astype(dt).astype(np.float64)
    rmin = np.minimum(lows, 0.0)
    rmax = np.maximum(highs, 0.0)
    if symmetric:
        a = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin, rmax = -a, a
    with np.errstate(invalid="ignore"):
        scale64 = (rmax - rmin) / (float(qmax) - float(qmin))
    infinite = ~np.isfinite(scale64)
    if symmetric:
        zp = np.full(scale64.shape, np.round((qmin + qmax) / 2.0))
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            zp = np.round(qmin - rmin / scale64)
    stored = scale64.astype(dt).astype(np.float64)  # the scale in TensorData's type
    if dt == np.float16 and SCALE_RULE == "1.32":
        degenerate = stored < float(np.finfo(np.float16).smallest_subnormal)
    else:
        degenerate = scale64 < float(np.finfo(dt).tiny)
    scale = np.where(degenerate, 1.0, np.where(infinite, np.inf, stored))
    zp = np.where(degenerate | infinite, 0.0, np.clip(zp, qmin, qmax))
    return scale, zp


def dequant(x: np.ndarray, scale, zp, qmin: int, qmax: int) -> np.ndarray:
    """``(clamp(round_half_even(x / scale) + zp, qmin, qmax) - zp) * scale`` in float64."""
    with np.errstate(over="ignore"):
        q = np.clip(np.round(x / scale) + zp, qmin, qmax)
    return (q - zp) * scale


def qerror(
    h: Hist, low: float, high: float, qtype: str = "int8", symmetric: bool = False, dtype: str = "float32"
) -> float:
    """Mean squared error of quantizing the histogram's representative values with the range
    ``(low, high)`` (scale and zero point straight from onnxruntime's compute_scale_zp; an
    infinite scale, for a range beyond ``dtype``, is an infinite error)."""
    x, c = _nonzero(h)
    if c.size == 0:
        return 0.0
    scale, zp = ort_scale_zp(low, high, qtype, symmetric, dtype)
    if scale == math.inf:
        return math.inf
    qmin, qmax = qrange(qtype, symmetric)
    d = x - dequant(x, scale, zp, qmin, qmax)
    return float(np.sum(c * d * d) / np.sum(c))


def qerror_many(
    h: Hist,
    lows: np.ndarray,
    highs: np.ndarray,
    qtype: str = "int8",
    symmetric: bool = False,
    dtype: str = "float32",
    chunk: int = 512,
) -> np.ndarray:
    """:func:`qerror` for many ranges at once (float64 vector), via :func:`scale_zp_many`."""
    x, c = _nonzero(h)
    lows, highs = np.asarray(lows, np.float64), np.asarray(highs, np.float64)
    out = np.zeros(lows.shape, np.float64)
    if c.size == 0:
        return out
    qmin, qmax = qrange(qtype, symmetric)
    scale, zp = scale_zp_many(lows, highs, qtype, symmetric, dtype)
    total = np.sum(c)
    for s in range(0, lows.size, chunk):
        sc, z = scale[s : s + chunk, None], zp[s : s + chunk, None]
        with np.errstate(invalid="ignore"):
            d = x[None, :] - dequant(x[None, :], sc, z, qmin, qmax)
        out[s : s + chunk] = np.sum(c[None, :] * d * d, axis=1) / total
    out[np.isinf(scale)] = np.inf
    return out


# ----------------------------------------------------------------------------------------------
# mse: brute force over the fixed grid
# ----------------------------------------------------------------------------------------------


def mse_grid(mn: float, mx: float, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """The spec's candidate ranges, in grid order (lows, highs)."""
    lo, hi = min(mn, 0.0), max(mx, 0.0)
    a = max(abs(lo), abs(hi))
    lows, highs = [], []
    if a == 0:
        return np.zeros(0), np.zeros(0)
    if symmetric:
        for k in range(1, 1025):
            t = a * k / 1024
            lows.append(-t)
            highs.append(t)
    else:
        for i in range(0, 129):
            if lo == 0 and i > 0:
                break
            for j in range(0, 129):
                if hi == 0 and j > 0:
                    break
                cl, ch = lo * i / 128, hi * j / 128
                if cl == 0 and ch == 0:
                    continue
                lows.append(cl)
                highs.append(ch)
    return np.array(lows, np.float64), np.array(highs, np.float64)


@dataclass
class Search:
    """A brute-force search: every candidate, its error, and the spec's choice."""

    lows: np.ndarray
    highs: np.ndarray
    errors: np.ndarray
    best: int  # index of the spec's choice (-1: no candidate, result (0, 0))

    @property
    def result(self) -> tuple[float, float]:
        if self.best < 0:
            return (0.0, 0.0)
        return float(self.lows[self.best]), float(self.highs[self.best])

    def index_of(self, low: float, high: float) -> np.ndarray:
        return np.flatnonzero((self.lows == low) & (self.highs == high))


def mse_search(h: Hist, qtype: str = "int8", symmetric: bool = False, dtype: str = "float32") -> Search:
    if h.total == 0:
        return Search(np.zeros(0), np.zeros(0), np.zeros(0), -1)
    lows, highs = mse_grid(h.mn, h.mx, symmetric)
    if lows.size == 0:
        return Search(lows, highs, np.zeros(0), -1)
    errors = qerror_many(h, lows, highs, qtype, symmetric, dtype)
    if np.all(np.isinf(errors)):  # every candidate beyond dtype: the whole range, as a candidate
        lo, hi = min(h.mn, 0.0), max(h.mx, 0.0)
        whole = (-max(-lo, hi), max(-lo, hi)) if symmetric else (lo, hi)
        return Search(np.array([whole[0]]), np.array([whole[1]]), np.array([math.inf]), 0)
    return Search(lows, highs, errors, int(np.argmin(errors)))  # argmin: the first minimum


# ----------------------------------------------------------------------------------------------
# kl: TensorRT / MXNet entropy calibration on the |x| histogram
# ----------------------------------------------------------------------------------------------


def abs_histogram(h: Hist, num_bins: int) -> tuple[np.ndarray, float]:
    """(|x| histogram of ``num_bins`` int64 counts over [0, A], A)."""
    A = max(abs(h.mn), abs(h.mx))
    out = np.zeros(num_bins, np.int64)
    x = representatives(*h.args)
    for xi, ci in zip(x, h.counts):
        if ci == 0:
            continue
        b = min(int(math.floor(abs(xi) / A * num_bins)), num_bins - 1)
        out[b] += int(ci)
    return out, A


def smooth(p: np.ndarray, eps: float = 1e-4) -> np.ndarray | None:
    """MXNet's _smooth_distribution in float64; None when p has no non-zero entry."""
    is_zeros = (p == 0).astype(np.float64)
    is_nonzeros = (p != 0).astype(np.float64)
    n_zeros = is_zeros.sum()
    n_nonzeros = p.size - n_zeros
    if not n_nonzeros:
        return None
    eps1 = eps * float(n_zeros) / float(n_nonzeros)
    return p.astype(np.float64) + eps * is_zeros + (-eps1) * is_nonzeros


def entropy_literal(p: np.ndarray, q: np.ndarray) -> float:
    """scipy.stats.entropy(p, q), one element at a time: both normalised to sum 1, then the sum of
    scipy.special.rel_entr (x ln(x/y) for x, y > 0; 0 for x = 0, y >= 0; +inf otherwise)."""
    P = p / np.sum(p)
    Q = q / np.sum(q)
    total = 0.0
    for pk, qk in zip(P, Q):
        if pk > 0 and qk > 0:
            total += pk * math.log(pk / qk)
        elif pk == 0 and qk >= 0:
            continue
        else:
            return math.inf
    return total


def entropy(p: np.ndarray, q: np.ndarray) -> float:
    """:func:`entropy_literal`, vectorised."""
    P = p / np.sum(p)
    Q = q / np.sum(q)
    if np.any((P < 0) | ((P > 0) & (Q <= 0))):
        return math.inf
    m = P > 0
    return float(np.sum(P[m] * np.log(P[m] / Q[m])))


def kl_divergence_literal(hist: np.ndarray, i: int, nq: int) -> float:
    """Divergence of candidate i: the MXNet/TensorRT loop, transcribed statement by statement."""
    sliced = hist[0:i]
    p = sliced.astype(np.float64).copy()
    p[i - 1] += np.sum(hist[i:])
    is_nonzeros = (p != 0).astype(np.int64)
    merged = i // nq
    quantized = np.zeros(nq, np.float64)
    for j in range(nq):
        start, stop = j * merged, (j + 1) * merged
        quantized[j] = sliced[start:stop].sum()
    quantized[-1] += sliced[nq * merged :].sum()
    q = np.zeros(i, np.float64)
    for j in range(nq):
        start = j * merged
        stop = i if j == nq - 1 else start + merged
        norm = is_nonzeros[start:stop].sum()
        if norm != 0:
            q[start:stop] = float(quantized[j]) / float(norm)
    q[p == 0] = 0
    ps, qs = smooth(p), smooth(q)
    if ps is None or qs is None:
        return math.inf
    return entropy_literal(ps, qs)


def kl_divergence(hist: np.ndarray, i: int, nq: int) -> float:
    """:func:`kl_divergence_literal` with the per-group loops as reshapes (same values)."""
    sliced = hist[0:i].astype(np.float64)
    p = sliced.copy()
    p[i - 1] += float(np.sum(hist[i:]))
    nonzero = p != 0
    merged = i // nq
    body = nq * merged
    quantized = sliced[:body].reshape(nq, merged).sum(axis=1)
    quantized[-1] += sliced[body:].sum()
    norm = nonzero[:body].reshape(nq, merged).sum(axis=1)
    norm[-1] += nonzero[body:].sum()
    per = np.where(norm != 0, quantized / np.maximum(norm, 1), 0.0)
    q = np.concatenate([np.repeat(per, merged), np.full(i - body, per[-1])])
    q[~nonzero] = 0
    ps, qs = smooth(p), smooth(q)
    if ps is None or qs is None:
        return math.inf
    return entropy(ps, qs)


def kl_divergences(
    h: Hist, num_bins: int = 2048, num_quantized_bins: int = 128, literal: bool = False
) -> tuple[np.ndarray, float]:
    """(divergence for every i in num_quantized_bins..=num_bins (index i - nq), A)."""
    hist, A = abs_histogram(h, num_bins)
    nq = num_quantized_bins
    f = kl_divergence_literal if literal else kl_divergence
    return np.array([f(hist, i, nq) for i in range(nq, num_bins + 1)], np.float64), A


@dataclass
class KL:
    divergence: np.ndarray  # index i - nq
    A: float
    num_bins: int
    nq: int

    @property
    def best_i(self) -> int:
        return int(np.argmin(self.divergence)) + self.nq  # ties: smallest i

    def threshold(self, i: int) -> float:
        return self.A * i / self.num_bins

    data_min: float = 0.0

    def low(self, t: float) -> float:
        """-t, raised to min(data min, 0): a Relu output's range starts at 0."""
        return max(-t, min(self.data_min, 0.0))

    @property
    def result(self) -> tuple[float, float]:
        if self.A == 0:
            return (0.0, 0.0)
        t = self.threshold(self.best_i)
        return (self.low(t), t)


def kl_search(h: Hist, num_bins: int = 2048, num_quantized_bins: int = 128) -> KL:
    if num_bins < num_quantized_bins:
        raise ValueError("num_bins < num_quantized_bins")
    if h.total == 0 or max(abs(h.mn), abs(h.mx)) == 0:
        return KL(np.zeros(0), 0.0, num_bins, num_quantized_bins)
    div, A = kl_divergences(h, num_bins, num_quantized_bins)
    return KL(div, A, num_bins, num_quantized_bins, h.mn)


# ----------------------------------------------------------------------------------------------
# pow2: power-of-two scales
# ----------------------------------------------------------------------------------------------


def pow2_range(k: int, qtype: str) -> tuple[float, float]:
    qmin, qmax = POW2_RANGES[qtype]
    return math.ldexp(float(qmin), k), math.ldexp(float(qmax), k)


def pow2_error(h: Hist, k: int, qtype: str) -> float:
    """E(k): mean squared error with scale 2^k and zero point 0 over the full integer range."""
    x, c = _nonzero(h)
    if c.size == 0:
        return 0.0
    qmin, qmax = POW2_RANGES[qtype]
    q = np.clip(np.round(np.ldexp(x, -k)), qmin, qmax)
    d = x - np.ldexp(q, k)
    return float(np.sum(c * d * d) / np.sum(c))


def pow2_error_exact(h: Hist, k: int, qtype: str) -> Fraction:
    """E(k) in exact rational arithmetic (every value, level and difference is a dyadic rational):
    decides exact ties, which the spec breaks towards the larger k."""
    x, c = _nonzero(h)
    if c.size == 0:
        return Fraction(0)
    qmin, qmax = POW2_RANGES[qtype]
    q = np.clip(np.round(np.ldexp(x, -k)), qmin, qmax)  # x 2^-k is exact: the rounding is the spec's
    step = Fraction(2) ** k
    total = Fraction(0)
    for xi, qi, ci in zip(x, q, h.counts[h.counts != 0]):
        d = Fraction(float(xi)) - int(qi) * step
        total += int(ci) * d * d
    return total / int(h.counts.sum(dtype=np.uint64))


@functools.cache
def pow2_bounds(qtype: str, dtype: str = "float32") -> tuple[int, int]:
    """The smallest and largest k whose range (qmin 2^k, qmax 2^k) in ``dtype`` the installed
    onnxruntime's compute_scale_zp maps back to scale 2^k, zero point 0 (every k between too)."""
    ks = [
        k
        for k in range(-300, 301)
        if ort_scale_zp(*pow2_range(k, qtype), qtype, False, dtype) == (math.ldexp(1.0, k), 0)
    ]
    assert ks and ks == list(range(ks[0], ks[-1] + 1)) and ks[0] > -300 and ks[-1] < 300, (qtype, dtype, ks)
    return ks[0], ks[-1]


def pow2_nonoverflow_k(h: Hist, qtype: str, dtype: str = "float32") -> int | None:
    """The smallest k whose range holds [mn, mx], by scanning k, clamped to :func:`pow2_bounds`
    (None: the result is (0, 0))."""
    if h.total == 0 or max(abs(h.mn), abs(h.mx)) == 0:
        return None
    if qtype == "uint8" and h.mx <= 0:
        return None
    qmin, qmax = POW2_RANGES[qtype]
    lo, hi = pow2_bounds(qtype, dtype)
    for k in range(-1100, 1100):
        if h.mx <= math.ldexp(qmax, k) and (qtype == "uint8" or h.mn >= math.ldexp(qmin, k)):
            return min(max(k, lo), hi)
    raise AssertionError("no exponent found")


@dataclass
class Pow2Scan:
    ks: np.ndarray
    errors: np.ndarray

    def best(self) -> int:
        """argmin, ties: the larger k."""
        m = np.min(self.errors)
        return int(self.ks[np.flatnonzero(self.errors == m)[-1]])

    def error(self, k: int) -> float:
        return float(self.errors[int(np.flatnonzero(self.ks == k)[0])])


def pow2_scan(h: Hist, qtype: str, lo: int, hi: int) -> Pow2Scan:
    ks = np.arange(lo, hi + 1)
    return Pow2Scan(ks, np.array([pow2_error(h, int(k), qtype) for k in ks]))


def pow2_minmse_k(h: Hist, qtype: str, dtype: str = "float32") -> int | None:
    k0 = pow2_nonoverflow_k(h, qtype, dtype)
    if k0 is None:
        return None
    return pow2_scan(h, qtype, max(k0 - 30, pow2_bounds(qtype, dtype)[0]), k0).best()


def most_common_k(votes: list[tuple[int, int]], bounds: tuple[int, int] = (-1074, 1023)) -> int:
    """The exponent with most votes (each clamped to ``bounds``, counts of equal exponents
    added), ties: the larger one."""
    tally: dict[int, int] = {}
    for k, n in votes:
        k = min(max(int(k), bounds[0]), bounds[1])
        tally[k] = tally.get(k, 0) + int(n)
    best = max(tally.values())
    return max(k for k, n in tally.items() if n == best)


# ----------------------------------------------------------------------------------------------
# A streaming histogram as exported by the state
# ----------------------------------------------------------------------------------------------


def hist_from_export(export: Any) -> Hist | None:
    """``StreamHistograms.export(name)`` -> Hist (None when the tensor has no finite value)."""
    level, bins, fmin, fmax = export.level, export.bins, export.finite_min, export.finite_max
    if level is None:
        return None
    half = len(bins) // 2
    return Hist(
        np.asarray(bins, np.uint64), -math.ldexp(1.0, level), math.ldexp(1.0, level) / half, float(fmin), float(fmax)
    )

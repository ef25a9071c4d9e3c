"""AMD Quark's power-of-two MinMSE, its exact arithmetic (``quark.onnx``, versions 0.6 to 0.9).

For a tensor's values ``x`` (float32 or float16) and an integer type with range ``[qmin, qmax]``
(symmetric: int8 ``[-127, 127]``, int16 ``[-32767, 32767]``; uint8, uint16 and asymmetric:
the full range):

1. Float scale and zero point from ``rmin = min(min x, 0)``, ``rmax = max(max x, 0)`` (symmetric:
   ``-a, a`` with ``a = max(|rmin|, |rmax|)``), in the values' type: ``s = (rmax - rmin) / (qmax -
   qmin)`` in float64, ``z = round(qmin - rmin / s)``; below the type's smallest normal, ``s = 1``
   and ``z = 0``.
2. Its position ``p = rint(-log2 s)`` (s first clamped to ``[2^-127, 2^127]``): the power of
   two **nearest** to ``s`` in log2 (not the smallest one above it, so a range whose ``s`` lies
   just above a power of two clips a little: what Quark calls NonOverflow). The zero point is
   recomputed for ``2^-p``: ``z' = round(qmin - min((qmin - z) 2^-p, 0) / 2^-p)``; uint8
   symmetric moves 127 to 128.
3. MinMSE: among the positions ``p - 1 .. p + 3`` (scales 2s, s, s/2, s/4, s/8), the one with the
   least ``sum((dequantize(quantize(x)) - x)^2)``, the first (largest scale) on ties. quantize is
   ``clip(round(x / scale) + z', qmin', qmax')`` in float32, where ``[qmin', qmax']`` is the
   symmetric range whatever the setting (int8 never reaches -128); dequantize is ``(q - z') scale``.
4. The range is ``((qmin - z') scale, (qmax - z') scale)`` in float32.

Quark sums the squared errors in float32 over all values at once; histocal computes each term in
float32 exactly as Quark does and adds them in float64, so the two choose differently only where
two candidates' errors agree to float32 rounding.

:class:`SymmetricErrors` gets the same choice without keeping the values: the error sum of every
position a batch could be asked about is added up as the batch comes (see its docstring).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._core import quark_pow2_error_sums

# (full range, symmetric range or None, numpy type), per integer type name
_QTYPES: dict[str, tuple[tuple[int, int], tuple[int, int] | None, type]] = {
    "int8": ((-128, 127), (-127, 127), np.int8),
    "uint8": ((0, 255), None, np.uint8),
    "int16": ((-32768, 32767), (-32767, 32767), np.int16),
    "uint16": ((0, 65535), None, np.uint16),
}
CANDIDATES = range(-1, 4)  # positions p - 1 .. p + 3


def qrange(qtype: str, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """Quark's ``get_qmin_qmax_for_qType``: 0-d arrays of the integer type."""
    full, sym, dtype = _QTYPES[qtype]
    lo, hi = sym if symmetric and sym is not None else full
    return np.array(lo, dtype=dtype), np.array(hi, dtype=dtype)


def scale_to_position(scale: float) -> int:
    scale = min(max(scale, 2.0**-127), 2.0**127)
    return int(np.rint(-np.log2(scale)))


def position_to_scale(pos: int, dtype: Any) -> np.ndarray:
    """``2^-pos`` in ``dtype`` (0 or inf where the type cannot hold it, as in Quark)."""
    with np.errstate(over="ignore", under="ignore"):
        return np.array(float(np.power(2.0, -pos)), dtype=dtype)


def float_scale(
    rmin: np.ndarray, rmax: np.ndarray, qtype: str, symmetric: bool, fallback: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Step 1: ``(z, s)``, ``s`` in the values' type (``fallback=False``: no scale 1 for a tiny
    ``s``, and no zero point)."""
    qmin, qmax = qrange(qtype, symmetric)
    rmin = np.minimum(rmin, np.array(0, dtype=rmin.dtype))
    rmax = np.maximum(rmax, np.array(0, dtype=rmax.dtype))
    half = np.finfo(np.float32).max / 2
    with np.errstate(over="ignore"):
        if rmin == -np.inf or rmin < -half:
            rmin = np.full_like(rmin, -half)
        if rmax == np.inf or rmax > half:
            rmax = np.full_like(rmax, half)
        if symmetric:
            absmax = np.maximum(np.abs(rmin), np.abs(rmax))
            rmin, rmax = -absmax, +absmax
        dr = np.array(rmax - rmin, dtype=np.float64)
    scale = np.array(dr / (np.float64(qmax) - np.float64(qmin)))
    if np.isnan(scale):
        raise ValueError("NaN in the range")
    if not fallback:
        return np.array(0, dtype=qmin.dtype), scale.astype(rmax.dtype)
    if scale < np.finfo(rmax.dtype).tiny:
        return np.array(0, dtype=qmin.dtype), np.array(1.0, dtype=rmax.dtype)
    return np.array(np.round(qmin - rmin / scale), dtype=qmin.dtype), scale.astype(rmax.dtype)


def power_of_two(rmin: np.ndarray, rmax: np.ndarray, qtype: str, symmetric: bool) -> tuple[np.ndarray, int]:
    """Steps 1 and 2: Quark's zero point ``z'`` and position ``p`` for the range ``[rmin, rmax]``."""
    qmin, _ = qrange(qtype, symmetric)
    zero_point, scale = float_scale(rmin, rmax, qtype, symmetric)
    pos = scale_to_position(scale.item())
    pof2 = position_to_scale(pos, scale.dtype)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        new_rmin = np.minimum(
            (qmin.astype(np.float32) - zero_point.astype(np.float32)) * pof2, np.array(0, dtype=rmin.dtype)
        )
        new_zero_point = np.array(np.round(qmin - new_rmin / pof2), dtype=qmin.dtype)
    if symmetric and qtype == "uint8" and new_zero_point == 127:
        new_zero_point = np.array(128, dtype=qmin.dtype)
    return new_zero_point, pos


def squared_errors(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, qtype: str) -> np.ndarray:
    """Each value's float32 ``(dequantize(quantize(x)) - x)^2``, Quark's arithmetic."""
    qmin, qmax = qrange(qtype, True)  # Quark's quantize_nparray clips to the symmetric range
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        q = np.asarray((x.astype(np.float32) / scale).round() + zero_point)
        np.clip(q, qmin, qmax, out=q)
        q = q.astype(qmin.dtype)
        deq = ((q.astype(np.float32) - zero_point.astype(np.float32)) * scale).astype(np.float32)
        return (deq - np.asarray(x)) ** 2


def error_sum(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, qtype: str) -> float:
    return float(np.sum(squared_errors(x, scale, zero_point, qtype), dtype=np.float64))


@functools.lru_cache(maxsize=4096)
def _scale(pos: int, dtype: str) -> float:
    """``position_to_scale`` as a Python float (0.0 or inf where the type cannot hold it)."""
    return float(position_to_scale(pos, np.dtype(dtype)))


@functools.lru_cache(maxsize=16)
def symmetric_zero_point(qtype: str, dtype: Any) -> np.ndarray:
    """The zero point of every symmetric range of ``qtype`` (0, or 128 for uint8): read-only."""
    one = np.array(1.0, dtype=dtype)
    zero_point, _ = power_of_two(-one, one, qtype, True)
    zero_point.flags.writeable = False
    return zero_point


def error_sums(
    x: np.ndarray, positions: range, zero_point: np.ndarray, qtype: str, finite: bool | None = None
) -> dict[int, float]:
    """:func:`error_sum` at each position, in one pass of histocal's kernel where the values and
    scales are finite (the same float32 terms; numpy's arithmetic for infinities and scales the
    values' type cannot hold). ``finite``: whether every value is finite, when known."""
    x = np.ravel(x)
    scales = [_scale(pos, x.dtype.str) for pos in positions]
    ok = x.size > 0 and all(math.isfinite(s) and s != 0 for s in scales)
    if ok and finite is None:
        with np.errstate(invalid="ignore"):
            finite = bool(np.isfinite(x.min()) and np.isfinite(x.max()))
    if not (ok and finite):
        return {pos: error_sum(x, position_to_scale(pos, x.dtype), zero_point, qtype) for pos in positions}
    qmin, qmax = qrange(qtype, True)
    sums = quark_pow2_error_sums(
        np.ascontiguousarray(x, dtype=np.float32), scales, float(zero_point), float(qmin), float(qmax)
    )
    return dict(zip(positions, sums))


def choose(errors: dict[int, float], pos: int) -> int:
    """Step 3's choice among the candidates of ``pos``: the least error, the first on ties (a
    NaN or infinite error never wins: Quark then keeps ``pos``)."""
    best, best_error = pos, math.inf
    for i in CANDIDATES:
        if errors[pos + i] < best_error:
            best, best_error = pos + i, errors[pos + i]
    return best


def value_range(pos: int, zero_point: np.ndarray, qtype: str, symmetric: bool, dtype: Any) -> tuple[Any, Any]:
    """Step 4: the range of position ``pos`` as Quark returns it (0-d float32 arrays)."""
    qmin, qmax = qrange(qtype, symmetric)
    scale = position_to_scale(pos, dtype)
    with np.errstate(over="ignore"):
        low = (qmin.astype(np.float32) - zero_point.astype(np.float32)) * scale
        high = (qmax.astype(np.float32) - zero_point.astype(np.float32)) * scale
    return np.asarray(low), np.asarray(high)


def data_range(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(min, max)`` as 0-d arrays of ``x``'s type (0 for no values, as Quark)."""
    if x.size == 0:
        return np.array(0.0, dtype=x.dtype), np.array(0.0, dtype=x.dtype)
    return np.array(x.min(), dtype=x.dtype), np.array(x.max(), dtype=x.dtype)


def min_mse(x: np.ndarray, qtype: str, symmetric: bool) -> tuple[int, np.ndarray]:
    """Quark's MinMSE on the values ``x`` (flattened): ``(position, zero point)``."""
    x = np.ravel(x)
    rmin, rmax = data_range(x)
    zero_point, pos = power_of_two(rmin, rmax, qtype, symmetric)
    errors = error_sums(x, range(pos + CANDIDATES[0], pos + CANDIDATES[-1] + 1), zero_point, qtype)
    return choose(errors, pos), zero_point


def _extended(bound: np.ndarray | None, new: np.ndarray, pick: Any) -> np.ndarray:
    """``pick(bound, new)`` (np.minimum or np.maximum: a NaN wins), ``bound`` itself where it
    stays, so that an unchanged range is the same object."""
    if bound is None:
        return new
    picked = pick(bound, new)
    return bound if picked == bound else np.asarray(picked)


@dataclass
class SymmetricErrors:
    """Step 3's error sums of a symmetric MinMSE over all batches, without keeping the values
    (int8, uint8, int16: their symmetric zero point is the same for every range, 0 or 128).

    A batch with largest magnitude ``a`` adds its exact error sum at every position from
    ``lo_b`` to ``p_run + 3``, where ``p_run`` is the position of the batches so far (this one
    included) and below ``lo_b`` (``a 2^pos < 0.5``) every value rounds to 0, so its error there
    is ``sum(x^2)``, kept once. The position ``p`` of all the data is at most ``p_run`` (a
    larger range, a larger scale), so each candidate ``p - 1 .. p + 3`` is either summed or
    below ``lo_b``: the totals are Quark's on the concatenated values (up to the order of the
    float64 additions). About 12 positions per batch for int8, 20 for int16, all in one pass
    of histocal's kernel (:func:`error_sums`)."""

    qtype: str
    dtype: Any = None
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    sums: dict[int, float] = field(default_factory=dict)
    zeros_below: dict[int, float] = field(default_factory=dict)  # lo_b -> sum(x^2) of its batches
    highest: int | None = None  # the least p_run + 3

    # the top of the window for the range (low, high) it was computed for: most batches leave
    # the range as it was, and its position is then not computed again
    _top_for: tuple[Any, Any, int] | None = None

    def copy(self) -> SymmetricErrors:
        """An independent copy (the range's 0-d arrays are replaced, never changed, so shared)."""
        new = SymmetricErrors(self.qtype, self.dtype, self.low, self.high, dict(self.sums), dict(self.zeros_below))
        new.highest, new._top_for = self.highest, self._top_for
        return new

    def add(self, x: np.ndarray) -> None:
        x = np.ravel(x)
        if self.dtype is None:
            self.dtype = x.dtype
        elif x.dtype != self.dtype:
            raise ValueError(f"values of type {x.dtype} after values of type {self.dtype}")
        rmin, rmax = data_range(x)
        low, high = _extended(self.low, rmin, np.minimum), _extended(self.high, rmax, np.maximum)
        zero_point = symmetric_zero_point(self.qtype, x.dtype)
        # the position of all batches so far, without the fallback to scale 1 (which would break
        # p <= p_b): at most the batch's own, and at least the final p
        if self._top_for is not None and self._top_for[0] is low and self._top_for[1] is high:
            top = self._top_for[2]
        else:
            _, scale = float_scale(low, high, self.qtype, True, fallback=False)
            top = scale_to_position(scale.item()) + CANDIDATES[-1]
        absmax = max(abs(float(rmin)), abs(float(rmax)))
        with np.errstate(over="ignore"):
            squares = float(np.sum(np.square(x.astype(np.float32)), dtype=np.float64))
        # below bottom (absmax 2^pos < 0.5) every value rounds to 0; 0 or inf: nothing to sum
        bottom = -math.frexp(absmax)[1] if 0.0 < absmax < math.inf else top + 1
        sums = error_sums(
            x,
            range(bottom, top + 1),
            zero_point,
            self.qtype,
            finite=math.isfinite(float(rmin)) and math.isfinite(float(rmax)),
        )
        # every step that can fail is done: the state changes from here on
        self.low, self.high, self._top_for = low, high, (low, high, top)
        self.highest = top if self.highest is None else min(self.highest, top)
        self.zeros_below[bottom] = self.zeros_below.get(bottom, 0.0) + squares
        for pos, e in sums.items():
            self.sums[pos] = self.sums.get(pos, 0.0) + e

    def result(self) -> tuple[int, np.ndarray]:
        """``(position, zero point)`` of all the batches added."""
        if self.low is None or self.high is None or self.highest is None:
            raise ValueError("no values collected")
        zero_point, pos = power_of_two(self.low, self.high, self.qtype, True)
        if pos + CANDIDATES[-1] > self.highest:
            raise RuntimeError(f"position {pos} outside the summed window (at most {self.highest - 3})")
        errors = {}
        for p in (pos + i for i in CANDIDATES):
            below = sum(s for lo, s in self.zeros_below.items() if p < lo)
            errors[p] = self.sums.get(p, 0.0) + below
        return choose(errors, pos), zero_point

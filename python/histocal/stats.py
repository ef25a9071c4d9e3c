"""Streaming min/max statistics over numpy arrays (any float dtype, any strides), in Rust."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _core
from .collector import float_batches


@dataclass(frozen=True)
class TensorStats:
    """``nanmin``/``nanmax`` (±Inf included), min/max over finite values, and value counts.
    A bound is None when there is no value of that kind.

    Attributes:
        min: the smallest value, NaN ignored (-inf included).
        max: the largest value, NaN ignored (+inf included).
        finite_min: the smallest finite value.
        finite_max: the largest finite value.
        finite: finite values.
        nan: NaN values.
        posinf: +inf values.
        neginf: -inf values.
    """

    min: float | None
    max: float | None
    finite_min: float | None
    finite_max: float | None
    finite: int
    nan: int
    posinf: int
    neginf: int


def tensor_stats(arr: np.ndarray, name: str = "array") -> TensorStats:
    """A tensor's statistics in one pass (GIL released, parallel over chunks).

    Args:
        arr: a floating-point array (any dtype, any strides).
        name: its name in error messages.

    Returns:
        Its extremes and value counts.

    Raises:
        ValueError: an array that is not floating point (naming it).
    """
    (a,) = float_batches(name, [arr])
    s = _core.tensor_stats(a)
    return TensorStats(s.nanmin, s.nanmax, s.finite_min, s.finite_max, s.n_finite, s.n_nan, s.n_posinf, s.n_neginf)


def channel_min_max(arr: np.ndarray, axis: int = 1, name: str = "array") -> tuple[np.ndarray, np.ndarray]:
    """Per-channel ``nanmin``/``nanmax`` along ``axis`` (NaN for an all-NaN channel), in the
    array's dtype: ORT's per-channel ReduceMin/ReduceMax, NaN-ignoring.

    Args:
        arr: a floating-point array of at least one dimension.
        axis: the channel axis (negative counts from the end).
        name: its name in error messages.

    Returns:
        ``(mins, maxs)``, one value per channel.

    Raises:
        ValueError: a 0-d or non-floating-point array (naming it).
    """
    (a,) = float_batches(name, [arr])
    if a.ndim == 0:
        raise ValueError(f"{name}: per-channel statistics need at least one dimension")
    mins, maxs = _core.channel_min_max(a, axis % a.ndim)
    return mins, maxs


def nanmean_pairwise(values: np.ndarray) -> np.generic:
    """ORT's per-tensor moving-average mean of per-batch values (numpy's pairwise order).

    Args:
        values: the per-batch values (flattened).

    Returns:
        Their NaN-ignoring mean, in their dtype.
    """
    v = np.ascontiguousarray(values).reshape(-1)
    return v.dtype.type(_core.nanmean_pairwise(v))


def nanmean_sequential(values: np.ndarray) -> np.generic:
    """ORT's per-channel moving-average mean of one channel's per-batch values (sequential).

    Args:
        values: one channel's per-batch values (flattened).

    Returns:
        Their NaN-ignoring mean, summed in order, in their dtype.
    """
    v = np.ascontiguousarray(values).reshape(-1)
    return v.dtype.type(_core.nanmean_sequential(v))


def moving_average(old: np.ndarray, new: np.ndarray, averaging_constant: float) -> np.ndarray:
    """ORT's ``merge_range`` EMA, ``old + T(c) * (new - old)`` in the arrays' dtype.

    Args:
        old: the ranges so far.
        new: the new batch's ranges.
        averaging_constant: the constant ``c``.

    Returns:
        The averaged ranges.
    """
    return old + averaging_constant * (new - old)


__all__ = [
    "TensorStats",
    "channel_min_max",
    "moving_average",
    "nanmean_pairwise",
    "nanmean_sequential",
    "tensor_stats",
]

"""Merging two collections (``CalibrationState.merge``, ``merge_states``): their compatibility,
and their histograms merged.

The model fingerprint, the tensor names, the mode and the collection options must match. Streaming
parts merge exactly and in any order (the result is the state of one run over all the data). Exact
parts add their counts when the two histograms have identical edges (then the result equals one
exact run over all the data); otherwise the second state's histogram is merged into the first one by
ORT's rule between two ``collect_data`` calls (``merge_histogram`` for value histograms, bin
extension for |x| histograms), with the second histogram's counts placed at its bin centres: the
approximation is only in where inside a bin a value sits, and (like ORT's rule) the result depends
on the order. A float16 |x| histogram whose edges end in +inf (ORT's extension past 65504) places a
bin ``[e, inf)`` at ``e`` and its ``[inf, inf]`` infinities at inf, kept only where the merged edges
end in +inf too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _core
from ..collector import ExactHistogram as _Exact
from ..collector import export_exact, restore_exact
from .collection import Collection
from .file.errors import fail


def check_compatible(a: Collection, b: Collection) -> None:
    """ValueError naming the difference unless collection ``b`` can be merged into ``a`` (the
    states' model fingerprints are ``CalibrationState.check_compatible``'s)."""
    if set(a.names) != set(b.names):
        diff = sorted(set(a.names) ^ set(b.names))[:5]
        raise ValueError(f"the states calibrate different tensors (e.g. {diff})")
    b_options = b.options
    for key, value in a.options.items():
        if value != b_options[key]:
            raise ValueError(
                f"incompatible collection options: {key} is {value!r} in one state and {b_options[key]!r} in the other"
            )
    if (a.channels is None) != (b.channels is None):
        raise ValueError("incompatible collection options: one state holds per-channel histograms, the other not")
    if a.channels is not None and b.channels is not None:
        a.channels.check_compatible(b.channels)


def merge(a: Collection, b: Collection) -> Collection:
    """Two compatible collections merged (see the module; ``a`` and ``b`` are not changed)."""
    return _merged(a, b, a.stream.copy() if a.stream is not None else None)


def merge_into(a: Collection, b: Collection) -> Collection:
    """``merge(a, b)`` with ``a``'s streaming histograms merged in place: for a collection nothing
    else holds (``merge_states``' running result), which saves copying them at every step."""
    return _merged(a, b, a.stream)


def _merged(a: Collection, b: Collection, stream: Any) -> Collection:
    """``a`` and ``b`` merged, ``a``'s streaming histograms being ``stream`` (changed)."""
    if stream is not None:
        if b.stream is None:
            raise ValueError("incompatible states: one holds streaming histograms, the other not")
        stream.merge(b.stream)
    exact = None
    if a.exact is not None:
        exact = _core.Histograms(a.exact.kind, a.exact.num_bins)
        for name in a.exact.names():
            try:
                merged = merge_exact(export_exact(a.exact, name), export_exact(b.exact, name), a.exact.kind)
                restore_exact(exact, name, merged)
            except ValueError as exc:
                raise ValueError(f"cannot merge tensor {name!r}: {exc}") from None
    channels = None if a.channels is None or b.channels is None else a.channels.merge(b.channels)
    return Collection(a.mode, stream, exact, channels, a.only)


def _held_min(old: tuple[float, bool], new: tuple[float, bool]) -> tuple[float, bool]:
    return new if new[0] < old[0] else old  # Python's min(old, new)


def _held_max(old: tuple[float, bool], new: tuple[float, bool]) -> tuple[float, bool]:
    return new if new[0] > old[0] else old


def _add_counts(a: tuple, b: tuple) -> tuple[int, ...]:
    return tuple(int(x) + int(y) for x, y in zip(a, b))


def merge_exact(a: _Exact, b: _Exact, kind: str) -> _Exact:
    """``b`` merged into ``a``: exact when the edges are identical, else ORT's rule (see module doc)."""
    if a.dtype != b.dtype:
        fail(f"data dtype {a.dtype} in one state and {b.dtype} in the other")
    mn, mx, counts = _held_min(a.min, b.min), _held_max(a.max, b.max), _add_counts(a.counts, b.counts)
    if a.edges.dtype == b.edges.dtype and np.array_equal(a.edges, b.edges):
        return _Exact(a.dtype, a.hist + b.hist, a.edges, mn, mx, a.threshold, counts)
    et = np.result_type(a.edges.dtype, b.edges.dtype)
    with np.errstate(all="ignore"):
        b_edges = b.edges.astype(et)
        centres = (b_edges[:-1] + (b_edges[1:] - b_edges[:-1]) / et.type(2)).astype(et)
        # An |x| histogram whose edges end in +inf (ORT's float16 edges past 65504): a bin
        # [e, inf) holds finite values from e on, the last bin [inf, inf] holds infinities.
        open_bins = np.isposinf(b_edges[1:])
        centres[open_bins] = b_edges[:-1][open_bins]
        weights = b.hist.astype(np.float64)
        old_hist, old_edges = a.hist, a.edges.astype(et)
        if kind == "value":
            if a.threshold is None or b.threshold is None:
                fail("a value histogram without its threshold")
            old_t, new_t = et.type(a.threshold[0]), et.type(b.threshold[0])
            if new_t <= old_t:
                h, _ = np.histogram(centres, len(old_hist), range=(-old_t, old_t), weights=weights)
                hist, edges, thr = old_hist + np.rint(h).astype(np.int64), old_edges, old_t
            elif old_t == 0:
                h, edges = np.histogram(centres, len(old_hist), range=(-new_t, new_t), weights=weights)
                hist, thr = np.rint(h).astype(np.int64) + old_hist, new_t
            else:
                n_old = len(old_hist)
                stride = et.type(2) * old_t / et.type(n_old)
                half = int((new_t - old_t) // stride + 1)
                n_new = n_old + 2 * half
                thr = et.type(half * stride + old_t)
                h, edges = np.histogram(centres, n_new, range=(-thr, thr), weights=weights)
                hist = np.rint(h).astype(np.int64)
                hist[half : n_new - half] += old_hist
            threshold: tuple[float, bool] | None = (float(thr), a.threshold[1])
        else:
            # The largest finite edge: ORT's rule cannot extend to an infinity (it raises), and an
            # open top (old_edges[-1] == inf) is never extended.
            amax = b_edges[np.isfinite(b_edges)][-1]
            if amax > old_edges[-1]:
                width = old_edges[1] - old_edges[0]
                old_edges = np.hstack((old_edges, np.arange(old_edges[-1] + width, amax + width, width).astype(et)))
            h, edges = np.histogram(centres, bins=old_edges, weights=weights)
            hist = np.rint(h).astype(np.int64)
            hist[: len(old_hist)] += old_hist
            threshold = None
    return _Exact(a.dtype, hist, np.asarray(edges, et), mn, mx, threshold, counts)

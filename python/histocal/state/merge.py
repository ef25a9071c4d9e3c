"""Merging two tensors' exact ORT histograms (see :mod:`histocal.state.state`: exact parts add their
counts when the edges are identical, else ORT's rule between two ``collect_data`` calls)."""

from __future__ import annotations

import numpy as np

from ..collector import ExactHistogram as _Exact
from .file.errors import fail


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

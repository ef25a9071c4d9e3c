"""ORT's methods from a state's histograms, in bounded memory, checked against the memory left first.

ORT's entropy, percentile and distribution (``histocal.ort_results``: the code the drop-in collector
computes with, so an exact state's results are its calibrator's, bit for bit) work on ORT-shaped
histograms of ``num_bins`` bins: an exact state's own when they have the kind and bins asked for, else
built from the streaming histograms (``to_histograms``). Those are built a chunk of
tensors at a time (``CONVERT_CHUNK_BYTES`` of them, at least one per thread) and dropped once that
chunk is computed, so only a chunk's Rust histograms are alive at once; per-channel results go through
the same chunks (``ChannelHistograms.compute``), so the channels' histograms are never all alive either.

ORT's per-tensor results carry each tensor's histogram (``hist``, ``hist_edges``), so those stay; the
whole computation's memory (``compute_bytes``: the results' histograms, a chunk's, the method's work
arrays) is estimated and checked against what this process can still take (``io.memory.check_memory``:
available memory, cgroup and address-space limits) before anything is built, and refused with a
``MemoryError`` naming ``num_bins`` and the estimate. Results equal one computation over every tensor:
each tensor's result depends on its own histogram only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

from .. import _core
from ..collector import export_exact
from ..io.memory import check_memory, format_size
from ..ort_results import OrtSettings, ort_results

# One ORT histogram's bytes per bin: its counts (int64) and its edges (at most float64).
HISTOGRAM_BIN_BYTES = 16
# entropy's work per bin of the histogram it searches, per thread at once: float32 counts, two prefix
# tables (int64), four float32 scratch vectors and the candidates' KL values.
ENTROPY_WORK_BIN_BYTES = 56
# percentile/distribution: one running sum per bin.
OTHER_WORK_BIN_BYTES = 8
# A result's objects beyond its arrays (TensorData or tuple, numpy headers, the name).
RESULT_BYTES = 1024
# ORT histograms built from streaming ones at once (the chunk; at least one per thread).
CONVERT_CHUNK_BYTES = 64 << 20


def chunk_size(num_bins: int, count: int) -> int:
    """How many tensors' ORT histograms of ``num_bins`` bins to build at once (Rust's and numpy's)."""
    per = 2 * HISTOGRAM_BIN_BYTES * num_bins
    return max(1, min(count, max(_core.get_num_threads(), CONVERT_CHUNK_BYTES // per)))


def compute_bytes(method: str, num_bins: int, kept: int, at_once: int, parallel: int, values: int = 0) -> int:
    """The bytes an ORT method's computation takes: ``kept`` results holding their histogram's arrays,
    ``at_once`` histograms in Rust (and as numpy arrays) at the same time, the method's work arrays for
    ``parallel`` histograms searched at once (at most one per thread), and ``values`` results that keep
    their values only (per-channel results)."""
    per_bin = ENTROPY_WORK_BIN_BYTES if method == "entropy" else OTHER_WORK_BIN_BYTES
    work = per_bin * num_bins * max(1, min(_core.get_num_threads(), parallel))
    return HISTOGRAM_BIN_BYTES * num_bins * (kept + 2 * at_once) + RESULT_BYTES * (kept + values) + work


def check_compute_memory(
    method: str,
    num_bins: int,
    count: int,
    kept: int,
    at_once: int,
    parallel: int,
    values: int = 0,
    what: str = "tensors",
) -> None:
    """MemoryError naming ``num_bins`` and the estimate unless the computation fits (see the module)."""
    need = compute_bytes(method, num_bins, kept, at_once, parallel, values)
    check_memory(
        need,
        f"{method} with num_bins={num_bins} on {count} {what} (ORT histograms of "
        f"{format_size(HISTOGRAM_BIN_BYTES * num_bins)} each)",
        "lower num_bins or calibrate fewer tensors",
    )


def check_calibration_memory(method: str, num_bins: int, count: int, exact: bool) -> None:
    """Before a calibrator collects: MemoryError unless ``method``'s histograms of ``num_bins`` bins for
    ``count`` tensors fit, with their computation. Exact mode holds every tensor's ORT histogram while it
    collects and numpy copies of them in its results; streaming mode builds them when it computes (the
    results hold them, a chunk at a time in Rust)."""
    if exact:
        check_compute_memory(method, num_bins, count, 2 * count, 0, count)
    else:
        size = chunk_size(num_bins, count)
        check_compute_memory(method, num_bins, count, count, size, size)


def ort_result(settings: OrtSettings, names: Sequence[str], stream: Any, exact: Any) -> dict[str, Any]:
    """ORT's result of ``settings``' method on ``names`` (``ort_results``): from ``exact`` (ORT histograms
    of the kind and bins needed, or None) in place, else from ``stream``'s histograms converted a chunk at
    a time."""
    method, num_bins = settings.method, settings.num_bins
    if exact is not None:
        # the histograms exist already; the results hold numpy copies of them
        check_compute_memory(method, num_bins, len(names), len(names), 0, len(names))
        return ort_results(exact, settings)
    size = chunk_size(num_bins, len(names))
    check_compute_memory(method, num_bins, len(names), len(names), size, size)
    out: dict[str, Any] = {}
    for start in range(0, len(names), size):
        chunk = stream.to_histograms(settings.kind, num_bins, list(names[start : start + size]))
        out.update(ort_results(chunk, settings))
        del chunk  # before the next chunk is built
    return out


def minmax_result(names: Sequence[str], stream: Any, exact: Any, symmetric: bool) -> TensorsData:
    """ORT's MinMax (non per-channel, no moving average) from the streaming histograms' extremes, else the
    exact ones'."""
    out = {}
    for name in names:
        c = (stream if stream is not None else exact).counts(name)
        finite, posinf, neginf = c.n_finite, c.n_posinf, c.n_neginf
        if stream is not None:
            s = stream.summary(name)
            dtype_name, fmin, fmax = s.dtype, s.finite_min, s.finite_max
        else:
            e = export_exact(exact, name)
            dtype_name = e.dtype
            fmin, fmax = (e.min[0], e.max[0]) if finite else (None, None)
        dtype = np.dtype(dtype_name)
        # no value at all: ORT's ReduceMin/ReduceMax of empty tensors, [inf, -inf]; only NaN: NaN
        nothing = math.nan if c.n_nan else math.inf
        lo = -math.inf if neginf else (fmin if fmin is not None else (math.inf if posinf else nothing))
        hi = math.inf if posinf else (fmax if fmax is not None else (-math.inf if neginf else -nothing))
        lo_a, hi_a = np.array([lo], dtype), np.array([hi], dtype)
        if symmetric:
            m = np.max([np.abs(lo_a), np.abs(hi_a)], axis=0)
            lo_a, hi_a = -m, m
        out[name] = TensorData(lowest=lo_a, highest=hi_a)
    return TensorsData(CalibrationMethod.MinMax, out)

"""Calibration state: everything a histogram calibration collected, saved once, reusable and mergeable.

A :class:`CalibrationState` holds, per calibrated tensor:

* the **streaming histogram** (``_core.StreamHistograms``: a power-of-two-aligned histogram of
  ``streaming_bins`` bins, finite min/max, min |x|, counts of finite/NaN/+Inf/-Inf values and the
  number of batches). Streaming-mode calibrators build it; exact-mode calibrators build it too
  (during their counting pass), so that every state can serve every method;
* in exact mode also the **exact ORT histogram** (``_core.Histograms`` of kind ``value`` or ``abs``
  with the calibrator's ``num_bins``: the histogram onnxruntime itself would hold).

``state.compute(method, **settings)`` returns onnxruntime's ``TensorsData`` for ``"minmax"``,
``"entropy"``, ``"percentile"`` or ``"distribution"``, without running the model:

* from the exact histogram when it has the kind and ``num_bins`` the request needs: then the result
  is identical to the exact calibrator's own ``compute_data``;
* otherwise from the streaming histogram (``to_histograms(kind, num_bins)``), identical to a
  streaming-mode calibrator with those settings (for an exact-mode state this is the streaming
  approximation, not ORT's exact histogram);
* ``"minmax"`` gives ORT's MinMax (non per-channel, no moving average) ranges: ``lowest``/``highest``
  as shape-(1,) arrays of the data dtype, NaN ignored, ±Inf included, ``symmetric`` supported.

Settings not given default to the state's own recorded settings when the method is the one it was
collected with, else to ``create_calibrator``'s defaults (entropy 128/128, percentile 2048 bins
99.999 symmetric, distribution 2048 bins "same").

Merging (:meth:`CalibrationState.merge`, :func:`merge_states`): the model fingerprint, the tensor
names, the mode and the collection options must match. Streaming parts merge exactly and in any
order (the result is the state of one run over all the data). Exact parts add their counts when
the two histograms have identical edges (then the result equals one exact run over all the data);
otherwise the second state's histogram is merged into the first one by ORT's rule between two
``collect_data`` calls (``merge_histogram`` for value histograms, bin extension for |x| histograms),
with the second histogram's counts placed at its bin centres: the approximation is only in where
inside a bin a value sits, and (like ORT's rule) the result depends on the order. A float16 |x|
histogram whose edges end in +inf (ORT's extension past 65504) places a bin ``[e, inf)`` at ``e``
and its ``[inf, inf]`` infinities at inf, kept only where the merged edges end in +inf too.

File format (``.npz``-compatible zip, written atomically with ``cache.atomic_write_bytes``): only
plain little-endian numeric ``.npy`` members, never pickles:

* ``header.npy``: uint8, UTF-8 JSON: ``format`` (``"histocal-calibration-state"``), ``version`` (1),
  ``histocal_version``, ``model_fingerprint`` (sha256 hex of the graph, see
  :func:`model_fingerprint`), ``data_fingerprints`` (sorted list of the runs' data fingerprints),
  ``options`` (``mode``, ``streaming_bins``, ``exact_kind``, ``exact_num_bins``, ``method``,
  ``settings``) and ``tensors`` (per tensor: ``name``, ``dtype``, ``stream`` = ``{level, start,
  length}`` (the non-zero span of the bins) or null, ``exact`` = ``{edge_dtype, bins}`` or null);
* ``stream_bins`` (the spans concatenated, as the narrowest of uint8/16/32/64 that holds them), ``stream_stats`` (float64 (n, 3): finite min,
  finite max, min |x|; NaN when there are no finite values), ``stream_counts`` (uint64 (n, 5):
  finite, NaN, +Inf, -Inf, batches), and, when pow2 MostCommon votes were collected,
  ``stream_votes`` (int64 (m, 4): tensor index, type (int8, uint8, int16), exponent, batches);
* ``exact_hist`` (concatenated, int64 or the narrowest of uint8/16/32 that holds the counts), ``exact_edges_float16/32/64`` (edges concatenated per edge
  dtype), ``exact_scalars`` (float64 (n, 3): min, max, threshold (NaN for |x|)), ``exact_flags``
  (uint8 (n, 3): whether ORT holds each as a 0-d array), ``exact_counts`` (uint64 (n, 5)).

Loading treats the file as untrusted and checks every size before taking the memory for it: the file
size (``MAX_STATE_BYTES``), the zip directory (at most ``MAX_ZIP_DIRECTORY`` bytes are read to find and
parse it; members' count, names, compression, declared sizes), the JSON header member (read first, at most
``MAX_HEADER_BYTES``, bounded nesting, every field's type and range validated), the content it declares
(tensors x ``streaming_bins`` + exact bins at most ``MAX_STATE_BINS``, bins and ``num_bins`` settings at
most ``_core.MAX_BINS``), then each other member's declared size against that content before it is
decompressed, read in chunks. Every ``.npy`` header is checked (dtype, shape, size) before its data is used,
and the arrays go through the Rust ``restore`` checks. Every problem is a ``ValueError`` naming the file
and the problem (``FileNotFoundError`` for a missing path), running out of memory included.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterable, NoReturn, Union

import numpy as np
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

from . import _core
from .cache import READ_CHUNK, atomic_write_bytes, open_untrusted_file, parse_bounded_json
from . import methods
from .collector import HistogramCollector

__all__ = ["CalibrationState", "merge_states", "model_fingerprint", "FORMAT_NAME", "FORMAT_VERSION"]

FORMAT_NAME = "histocal-calibration-state"
FORMAT_VERSION = 1
MAX_STATE_BYTES = 4 << 30  # file size, and the members' total uncompressed size
MAX_HEADER_BYTES = 64 << 20  # the JSON header
# Bins a loaded state holds in memory, tensors x streaming_bins + exact bins: 2 GiB of counts (16384 tensors
# at the default 16384 streaming bins). A header declaring more is refused before anything is allocated.
MAX_STATE_BINS = 1 << 28
MAX_JSON_DEPTH = 8
MAX_MEMBERS = 16
MAX_NAME_CHARS = 1 << 16
MAX_NPY_HEADER = 4096  # a member's .npy header (numpy writes 128 bytes)
MAX_ZIP_DIRECTORY = 1 << 20  # what zipfile may read to find and parse the central directory
POW2_EXPONENTS = _core.POW2_EXPONENTS  # the exponents a pow2 vote can have

PathLike = Union[str, "os.PathLike[str]"]

_DTYPES = ("float16", "float32", "float64")
_MODES = ("exact", "streaming")
_KINDS = ("value", "abs")
_ORT_METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
    "distribution": CalibrationMethod.Distribution,
}
# create_calibrator's defaults (what quantize_static uses)
_DEFAULTS: dict[str, dict[str, Any]] = {
    "minmax": {"symmetric": False},
    "entropy": {"symmetric": False, "num_bins": 128, "num_quantized_bins": 128},
    "percentile": {"symmetric": True, "num_bins": 2048, "percentile": 99.999},
    "distribution": {"num_bins": 2048, "scenario": "same"},
}
_FULL = {"symmetric": False, "num_bins": 128, "num_quantized_bins": 128, "percentile": 99.999, "scenario": "same"}
# zip members: name -> (dtype, ndim, columns)
_MEMBERS: dict[str, tuple[str, int, int | None]] = {
    "header": ("u1", 1, None),
    "stream_bins": ("<u8|<u4|<u2|u1", 1, None),
    "stream_stats": ("<f8", 2, 3),
    "stream_counts": ("<u8", 2, 5),
    "stream_votes": ("<i8", 2, 4),
    "exact_hist": ("<i8|<u4|<u2|u1", 1, None),
    "exact_edges_float16": ("<f2", 1, None),
    "exact_edges_float32": ("<f4", 1, None),
    "exact_edges_float64": ("<f8", 1, None),
    "exact_scalars": ("<f8", 2, 3),
    "exact_flags": ("u1", 2, 3),
    "exact_counts": ("<u8", 2, 5),
}


class StateError(ValueError):
    """A problem inside a state; ``load`` prefixes the file name."""


def _fail(problem: str) -> NoReturn:
    raise StateError(problem)


# ----------------------------------------------------------------------------------------------
# Fingerprints
# ----------------------------------------------------------------------------------------------


def model_fingerprint(model: Any, num_outputs: int | None = None) -> str:
    """sha256 (hex) over the model's opset imports and its graph's nodes, inputs, outputs (the first
    ``num_outputs``: a calibrator appends its own) and (sparse) initializers, each serialized
    deterministically. Names, doc strings, metadata and value_info (shape inference) are ignored.
    ``model``: an onnx ModelProto or a path."""
    if isinstance(model, (str, os.PathLike)):
        import onnx

        try:
            model = onnx.load(os.fspath(model))
        except OSError:
            raise
        except Exception as e:  # protobuf's DecodeError names neither the file nor what it expected
            raise ValueError(f"{os.fspath(model)}: not an ONNX model ({' '.join(str(e).split())})") from None
    graph = model.graph
    outputs = list(graph.output)[: num_outputs if num_outputs is not None else None]
    h = hashlib.sha256(b"histocal-model-fingerprint-v1\0")
    for tag, messages in (
        (b"opset", list(model.opset_import)),
        (b"node", list(graph.node)),
        (b"input", list(graph.input)),
        (b"output", outputs),
        (b"initializer", list(graph.initializer)),
        (b"sparse_initializer", list(graph.sparse_initializer)),
    ):
        h.update(tag + len(messages).to_bytes(8, "little"))
        for m in messages:
            raw = m.SerializeToString(deterministic=True)
            h.update(len(raw).to_bytes(8, "little"))
            h.update(raw)
    return h.hexdigest()


def _calibrator_fingerprint(cal: Any) -> str:
    fp = getattr(cal, "_histocal_model_fingerprint", None)
    if fp is None:
        fp = model_fingerprint(cal.model, getattr(cal, "num_model_outputs", None))
        cal._histocal_model_fingerprint = fp
    return fp


def _version() -> str:
    import histocal

    return str(histocal.__version__)


# ----------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------


def _copy_stream(stream: Any) -> Any:
    out = _core.StreamHistograms(stream.num_bins, pow2_votes=stream.pow2_votes)
    out.merge(stream)
    return out


@dataclass
class _Exact:
    """One tensor's exact ORT histogram: what ``Histograms.state``/``counts`` export."""

    dtype: str
    hist: np.ndarray
    edges: np.ndarray
    min: tuple[float, bool]
    max: tuple[float, bool]
    threshold: tuple[float, bool] | None
    counts: tuple[int, int, int, int, int]


def _export_exact(hists: Any, name: str) -> _Exact:
    hist, edges, mn, mx, thr, dtype = hists.state(name)
    return _Exact(dtype, hist, edges, tuple(mn), tuple(mx), None if thr is None else tuple(thr), tuple(hists.counts(name)))


def _restore_exact(hists: Any, name: str, e: _Exact) -> None:
    hists.restore(name, e.dtype, np.ascontiguousarray(e.hist, np.int64), np.ascontiguousarray(e.edges),
                  e.min, e.max, e.threshold, e.counts)


def copy_histograms(source: Any, target: Any) -> None:
    """Put every tensor of one ``_core.Histograms`` into another (empty, same kind and bins)."""
    for name in source.names():
        _restore_exact(target, name, _export_exact(source, name))


def _held_min(old: tuple[float, bool], new: tuple[float, bool]) -> tuple[float, bool]:
    return new if new[0] < old[0] else old  # Python's min(old, new)


def _held_max(old: tuple[float, bool], new: tuple[float, bool]) -> tuple[float, bool]:
    return new if new[0] > old[0] else old


def _add_counts(a: tuple, b: tuple) -> tuple[int, ...]:
    return tuple(int(x) + int(y) for x, y in zip(a, b))


def _merge_exact(a: _Exact, b: _Exact, kind: str) -> _Exact:
    """``b`` merged into ``a``: exact when the edges are identical, else ORT's rule (see module doc)."""
    if a.dtype != b.dtype:
        _fail(f"data dtype {a.dtype} in one state and {b.dtype} in the other")
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


# ----------------------------------------------------------------------------------------------
# The state
# ----------------------------------------------------------------------------------------------


@dataclass
class CalibrationState:
    """Reusable, mergeable histogram state of a calibration (see the module docstring).

    Build it with ``calibrator.state`` / ``CalibrationState.from_calibrator`` or ``load``; use it
    with ``compute``, ``merge``, ``save`` and ``calibrator.load_state``."""

    names: list[str]
    mode: str
    stream: Any = None  # _core.StreamHistograms
    exact: Any = None  # _core.Histograms
    exact_kind: str | None = None
    exact_num_bins: int | None = None
    model_fingerprint: str | None = None
    data_fingerprints: tuple[str, ...] = ()
    method: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    histocal_version: str = field(default_factory=_version)

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_calibrator(cls, cal: Any, data_fingerprint: str | None = None) -> "CalibrationState":
        """A copy of what a histocal Entropy/Percentile/Distribution calibrator has collected."""
        with getattr(cal, "_lock", contextlib.nullcontext()):  # not while another thread collects
            return cls._of_calibrator(cal, data_fingerprint, copy_stream=True)

    @classmethod
    def _of_calibrator(cls, cal: Any, data_fingerprint: str | None, copy_stream: bool) -> "CalibrationState":
        # copy_stream=False shares the calibrator's streaming histograms: only for reading them
        # at once (compute_data), never for a state that outlives further collection.
        mode = getattr(cal, "_mode_used", None)
        if mode is None:
            raise ValueError("the calibrator has not collected any data yet (call collect_data first)")
        stream = None if cal._stream is None else (_copy_stream(cal._stream) if copy_stream else cal._stream)
        exact = kind = nbins = None
        names = list(stream.names()) if stream is not None else []
        if mode == "exact" and cal.collector is not None and cal.collector._histograms.names():
            src = cal.collector._histograms
            kind, nbins = cal._kind, int(cal.num_bins)
            exact = _core.Histograms(kind, nbins)
            copy_histograms(src, exact)
            names = names or list(src.names())
        if stream is None and exact is None:
            raise ValueError("the calibrator has not collected any data yet (call collect_data first)")
        settings = {k: _plain(getattr(cal, k)) for k in ("symmetric", "num_bins", "num_quantized_bins", "percentile", "scenario")}
        settings.update({k: _plain(v) for k, v in getattr(cal, "method_options", {}).items()})
        return cls(
            names=names, mode=mode, stream=stream, exact=exact, exact_kind=kind, exact_num_bins=nbins,
            model_fingerprint=_calibrator_fingerprint(cal),
            data_fingerprints=() if data_fingerprint is None else (_check_fingerprint(data_fingerprint),),
            method=cal.method, settings=settings,
        )

    @property
    def streaming_bins(self) -> int | None:
        return None if self.stream is None else int(self.stream.num_bins)

    @property
    def data_fingerprint(self) -> str | None:
        """The data fingerprint of a single run (None when absent or when merged from several)."""
        return self.data_fingerprints[0] if len(self.data_fingerprints) == 1 else None

    @property
    def options(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "streaming_bins": self.streaming_bins, "exact_kind": self.exact_kind,
            "exact_num_bins": self.exact_num_bins, "method": self.method, "settings": dict(self.settings),
        }

    def counts(self, name: str) -> tuple[int, int, int, int, int]:
        """``(finite, nan, posinf, neginf, batches)`` of a tensor."""
        src = self.stream if self.stream is not None else self.exact
        return tuple(src.counts(name))

    def dtype(self, name: str) -> str:
        if self.stream is not None:
            return self.stream.summary(name)[0]
        return self.exact.state(name)[5]

    # -- results --------------------------------------------------------------------------------

    def compute(self, method: Any, **settings: Any) -> TensorsData:
        """onnxruntime ``TensorsData`` for ``method`` and its settings: ORT's four methods (name or
        CalibrationMethod), histocal's mse/kl/pow2/auto and registered methods (see
        ``histocal.methods``; their ranges travel as MinMax-style TensorsData)."""
        name = methods.canonical_name(method)
        if name in methods.ORT_METHODS:
            return self._compute_ort(name, settings)
        pairs, _ = self.method_ranges(name, **settings)
        return methods.to_tensors_data(self.names, pairs, {n: self.dtype(n) for n in self.names})

    def method_ranges(self, method: Any, **options: Any) -> tuple[list[tuple[float, float]], list[str] | None]:
        """Per-tensor ``(low, high)`` (in ``names`` order) of a histocal or registered method, and
        for ``auto`` the candidate chosen for each tensor."""
        name = methods.canonical_name(method)
        if name in methods.ORT_METHODS:
            raise ValueError(f"{name} is an onnxruntime method: use compute()")
        if name == self.method:
            options = {**{k: self.settings[k] for k in methods.METHOD_OPTIONS.get(name, ()) if k in self.settings}, **options}
        options = methods.check_options(name, options)
        if self.stream is None:
            raise ValueError(f"{name} needs the streaming histogram, and this state holds only exact histograms")
        return methods.ranges(self.stream, self.names, name, options, self._compute_ort)

    def _compute_ort(self, method: str, settings: dict[str, Any]) -> TensorsData:
        allowed = _DEFAULTS[method]
        unknown = set(settings) - set(allowed)
        if unknown:
            raise ValueError(f"unknown settings for {method}: {sorted(unknown)} (allowed: {sorted(allowed)})")
        base = {k: self.settings[k] for k in allowed if k in self.settings} if method == self.method else {}
        s = {**_FULL, **allowed, **base, **settings}
        if method == "minmax":
            return self._minmax(bool(s["symmetric"]))
        collector = HistogramCollector(method, s["symmetric"], s["num_bins"], s["num_quantized_bins"], s["percentile"], s["scenario"])
        kind = "abs" if method == "percentile" and s["symmetric"] else "value"
        if self.exact is not None and self.exact_kind == kind and self.exact_num_bins == collector.num_bins:
            collector._histograms = self.exact
        elif self.stream is not None:
            collector._histograms = self.stream.to_histograms(kind, collector.num_bins)
        else:
            raise ValueError(
                f"this state holds only exact {self.exact_kind} histograms of {self.exact_num_bins} bins; "
                f"{method} with num_bins={collector.num_bins} needs {kind} histograms of {collector.num_bins} bins: "
                "collect with those settings, or keep the streaming histogram (histocal calibrators do)"
            )
        return TensorsData(_ORT_METHODS[method], collector.compute_collection_result())

    def _minmax(self, symmetric: bool) -> TensorsData:
        out = {}
        for name in self.names:
            dtype = np.dtype(self.dtype(name))
            finite, nan, posinf, neginf, _ = self.counts(name)
            if self.stream is not None:
                _, _, fmin, fmax, _, _ = self.stream.summary(name)
            else:
                e = _export_exact(self.exact, name)
                fmin, fmax = (e.min[0], e.max[0]) if finite else (None, None)
            lo = -math.inf if neginf else (fmin if fmin is not None else (math.inf if posinf else math.nan))
            hi = math.inf if posinf else (fmax if fmax is not None else (-math.inf if neginf else math.nan))
            lo_a, hi_a = np.array([lo], dtype), np.array([hi], dtype)
            if symmetric:
                m = np.max([np.abs(lo_a), np.abs(hi_a)], axis=0)
                lo_a, hi_a = -m, m
            out[name] = TensorData(lowest=lo_a, highest=hi_a)
        return TensorsData(CalibrationMethod.MinMax, out)

    # -- merging --------------------------------------------------------------------------------

    def check_compatible(self, other: "CalibrationState") -> None:
        """ValueError unless ``other`` comes from the same model, tensors and collection options."""
        if self.model_fingerprint != other.model_fingerprint:
            raise ValueError(
                f"the states come from different models (fingerprints {self.model_fingerprint} and "
                f"{other.model_fingerprint})"
            )
        if set(self.names) != set(other.names):
            diff = sorted(set(self.names) ^ set(other.names))[:5]
            raise ValueError(f"the states calibrate different tensors (e.g. {diff})")
        for key in ("mode", "streaming_bins", "exact_kind", "exact_num_bins"):
            a, b = getattr(self, key), getattr(other, key)
            if a != b:
                raise ValueError(f"incompatible collection options: {key} is {a!r} in one state and {b!r} in the other")

    def merge(self, other: "CalibrationState") -> "CalibrationState":
        """A new state: ``self`` and ``other`` combined (see the module docstring)."""
        self.check_compatible(other)
        stream = None
        if self.stream is not None:
            stream = _copy_stream(self.stream)
            stream.merge(other.stream)
        exact = None
        if self.exact is not None:
            exact = _core.Histograms(self.exact_kind, self.exact_num_bins)
            for name in self.exact.names():
                try:
                    merged = _merge_exact(_export_exact(self.exact, name), _export_exact(other.exact, name), self.exact_kind)
                    _restore_exact(exact, name, merged)
                except ValueError as exc:
                    raise ValueError(f"cannot merge tensor {name!r}: {exc}") from None
        return CalibrationState(
            names=list(self.names), mode=self.mode, stream=stream, exact=exact, exact_kind=self.exact_kind,
            exact_num_bins=self.exact_num_bins, model_fingerprint=self.model_fingerprint,
            data_fingerprints=tuple(sorted(self.data_fingerprints + other.data_fingerprints)),
            method=self.method, settings=dict(self.settings),
        )

    # -- files ----------------------------------------------------------------------------------

    def to_bytes(self, compress: bool = False) -> bytes:
        arrays: dict[str, list[np.ndarray]] = {k: [] for k in _MEMBERS if k != "header"}
        tensors = []
        for name in self.names:
            entry: dict[str, Any] = {"name": name, "dtype": self.dtype(name), "stream": None, "exact": None}
            if self.stream is not None:
                _, level, bins, fmin, fmax, amin, counts = self.stream.export(name)
                nz = np.flatnonzero(bins)
                start, stop = (int(nz[0]), int(nz[-1]) + 1) if nz.size else (0, 0)
                arrays["stream_bins"].append(bins[start:stop])
                arrays["stream_stats"].append(np.array([[_nan(fmin), _nan(fmax), _nan(amin)]], np.float64))
                arrays["stream_counts"].append(np.array([counts], np.uint64))
                entry["stream"] = {"level": level, "start": start, "length": stop - start}
                votes = self.stream.votes(name)
                if votes:
                    arrays["stream_votes"].append(np.array([(len(tensors), *v) for v in votes], np.int64))
            tensors.append(entry)
        exact_order = None
        if self.exact is not None:
            index = {n: i for i, n in enumerate(self.names)}
            exact_order = [index[n] for n in self.exact.names()]
            for name in self.exact.names():
                entry = tensors[index[name]]
                e = _export_exact(self.exact, name)
                arrays["exact_hist"].append(np.asarray(e.hist, np.int64))
                arrays[f"exact_edges_{e.edges.dtype}"].append(e.edges)
                thr = e.threshold if e.threshold is not None else (math.nan, False)
                arrays["exact_scalars"].append(np.array([[e.min[0], e.max[0], thr[0]]], np.float64))
                arrays["exact_flags"].append(np.array([[e.min[1], e.max[1], thr[1]]], np.uint8))
                arrays["exact_counts"].append(np.array([e.counts], np.uint64))
                entry["exact"] = {"edge_dtype": str(e.edges.dtype), "bins": int(len(e.hist))}
        header = {
            "format": FORMAT_NAME, "version": FORMAT_VERSION, "histocal_version": self.histocal_version,
            "model_fingerprint": self.model_fingerprint, "data_fingerprints": sorted(self.data_fingerprints),
            "options": self.options, "tensors": tensors, "exact_order": exact_order,
        }
        members = {"header": np.frombuffer(json.dumps(header, allow_nan=False).encode("utf-8"), np.uint8)}
        for key, parts in arrays.items():
            dtype, ndim, cols = _MEMBERS[key]
            if parts:
                joined = np.concatenate(parts)
                if "|" in dtype:  # counts: the narrowest unsigned type that holds them (compact files)
                    top = int(joined.max()) if joined.size else 0
                    dtype = next(d for d in ("u1", "<u2", "<u4") if top <= np.iinfo(d).max) if top < 1 << 32 else dtype.split("|")[0]
                members[key] = np.ascontiguousarray(joined.astype(dtype, copy=False))
            elif key == "stream_votes":
                if self.stream is not None and self.stream.pow2_votes:  # the member says votes were collected
                    members[key] = np.zeros((0, cols), dtype)
            elif ndim == 2 and (self.stream is not None if key.startswith("stream") else self.exact is not None):
                members[key] = np.zeros((0, cols), dtype)
        # np.savez's layout (loadable with np.load), with fixed timestamps: equal states give equal bytes
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as zf:
            for key, array in members.items():
                info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zf.compression
                with zf.open(info, "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, array, allow_pickle=False)
        return buf.getvalue()

    def save(self, path: PathLike, compress: bool = False) -> None:
        """Write the state atomically (a temp file renamed over ``path``; mode 0600, like caches)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, self.to_bytes(compress), prefix=".histocal_state_")

    @classmethod
    def load(cls, path: PathLike) -> "CalibrationState":
        """Read a state file (untrusted input: see the module docstring)."""
        path = Path(path)
        with open_untrusted_file(path, MAX_STATE_BYTES, what="calibration state") as (file, size):
            return cls._read(file, size, str(path))

    @classmethod
    def from_bytes(cls, raw: bytes, what: str = "<bytes>") -> "CalibrationState":
        return cls._read(io.BytesIO(raw), len(raw), what)

    @classmethod
    def _read(cls, source: BinaryIO, size: int, what: str) -> "CalibrationState":
        try:
            return _parse(source, size)
        except StateError as exc:
            raise ValueError(f"Invalid calibration state {what}: {exc}") from None
        except (ValueError, TypeError, OverflowError, KeyError, IndexError, EOFError, zipfile.BadZipFile,
                zipfile.LargeZipFile, zlib.error, NotImplementedError, RecursionError, MemoryError, OSError) as exc:
            raise ValueError(f"Invalid calibration state {what}: {type(exc).__name__}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the contract is ValueError; the fuzz test looks for this text
            raise ValueError(f"Invalid calibration state {what}: internal error ({type(exc).__name__}: {exc})") from None


def merge_states(*states: "CalibrationState | PathLike") -> CalibrationState:
    """Merge states (or state files) left to right."""
    if len(states) == 1 and isinstance(states[0], (list, tuple)):
        states = tuple(states[0])
    if not states:
        raise ValueError("merge_states needs at least one state")
    loaded = [s if isinstance(s, CalibrationState) else CalibrationState.load(s) for s in states]
    out = loaded[0]
    for s in loaded[1:]:
        out = out.merge(s)
    return out


# ----------------------------------------------------------------------------------------------
# Calibrator integration (called by the calibrators' save_state / state / load_state)
# ----------------------------------------------------------------------------------------------


def load_into_calibrator(cal: Any, state: "CalibrationState | PathLike") -> None:
    """Make ``cal`` start from ``state`` (merged with anything it already collected)."""
    if not isinstance(state, CalibrationState):
        state = CalibrationState.load(state)
    fp = _calibrator_fingerprint(cal)
    if state.model_fingerprint is not None and state.model_fingerprint != fp:
        raise ValueError(
            f"the state was collected on another model (fingerprint {state.model_fingerprint}, this model {fp}): "
            "it is stale for this model"
        )
    if cal.tensors_to_calibrate is not None:
        wanted = set(cal._fetch_names()) if getattr(cal, "infer_session", None) is not None else set(cal.tensors_to_calibrate)
        if wanted != set(state.names):
            diff = sorted(wanted ^ set(state.names))[:5]
            raise ValueError(f"the state calibrates other tensors than this calibrator (e.g. {diff})")
    if cal.mode != "auto" and cal.mode != state.mode:
        raise ValueError(f"incompatible options: the state was collected in {state.mode} mode, the calibrator uses mode={cal.mode!r}")
    if state.stream is not None and state.streaming_bins != cal.streaming_bins:
        raise ValueError(f"incompatible options: the state has streaming_bins={state.streaming_bins}, the calibrator {cal.streaming_bins}")
    if state.mode == "exact" and (state.exact_kind, state.exact_num_bins) != (cal._kind, cal.num_bins):
        raise ValueError(
            f"incompatible options: the state holds exact {state.exact_kind} histograms of {state.exact_num_bins} "
            f"bins, this calibrator needs {cal._kind} histograms of {cal.num_bins} bins (state.compute() can still "
            "serve these settings)"
        )
    if cal._mode_used is not None:
        state = CalibrationState.from_calibrator(cal).merge(state)
    cal._mode_used = state.mode
    cal._stream = None if state.stream is None else _copy_stream(state.stream)
    if state.mode == "exact":
        cal.collector = cal._new_collector()
        if state.exact is not None:
            copy_histograms(state.exact, cal.collector._histograms)
        cal.collector._dict = None


# ----------------------------------------------------------------------------------------------
# Reading (untrusted input)
# ----------------------------------------------------------------------------------------------


class _BoundedReads:
    """A seekable file that hands out at most ``budget`` more bytes (reads past it return nothing), so that
    zipfile reads (and allocates for) no more than the caller allows: its central directory, one member."""

    def __init__(self, file: BinaryIO, size: int) -> None:
        self._file, self._size, self.budget = file, size, 0

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def read(self, n: int | None = -1) -> bytes:
        allowed = max(0, min(self.budget, self._size - self._file.tell()))
        data = self._file.read(allowed if n is None or n < 0 else min(n, allowed))
        self.budget -= len(data)
        return data


def _deflate_bound(size: int) -> int:
    """The largest deflate stream of ``size`` bytes of data (zlib's compressBound, with slack)."""
    return size + (size >> 12) + (size >> 14) + (size >> 25) + 64


def _zip_members(zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """The members by key (name without ``.npy``), checked from the central directory alone."""
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        _fail(f"{len(infos)} zip members, more than the limit of {MAX_MEMBERS}")
    out: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        key = info.filename[:-4] if info.filename.endswith(".npy") else None
        if key not in _MEMBERS:
            _fail(f"unexpected zip member {info.filename[:100]!r}")
        if key in out:
            _fail("duplicate zip members")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            _fail(f"zip member {info.filename!r}: unsupported compression {info.compress_type}")
        if info.flag_bits & 0x1:
            _fail(f"zip member {info.filename!r} is encrypted")
        stored_size = info.file_size if info.compress_type == zipfile.ZIP_STORED else _deflate_bound(info.file_size)
        if info.compress_size > stored_size:
            _fail(f"zip member {info.filename!r}: {info.compress_size} compressed bytes for {info.file_size} bytes")
        out[key] = info
    total = sum(i.file_size for i in infos)
    if total > MAX_STATE_BYTES:
        _fail(f"declared uncompressed size {total} is more than the limit of {MAX_STATE_BYTES}")
    if "header" not in out:
        _fail("no header member")
    return out


def _read_member(zf: zipfile.ZipFile, reads: _BoundedReads, info: zipfile.ZipInfo, max_data: int) -> np.ndarray:
    """One member, its size checked against ``max_data`` (+ a .npy header) before it is decompressed, then
    read in chunks into a buffer of that size."""
    key = info.filename[:-4]
    limit = max_data + MAX_NPY_HEADER
    if info.file_size > limit:
        _fail(f"zip member {info.filename!r} declares {info.file_size} bytes, more than the {limit} its header allows")
    # the local header (fixed part, name and extra field of at most 64 KiB each), then the data
    reads.budget = 30 + 2 * 0xFFFF + info.compress_size
    data = bytearray(info.file_size)
    filled = 0
    with zf.open(info) as f:
        while filled < len(data):
            chunk = f.read(min(READ_CHUNK, len(data) - filled))
            if not chunk:
                break
            data[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
        if filled != len(data) or f.read(1):
            _fail(f"zip member {info.filename!r}: size does not match its declared size")
    return _parse_npy(key, data)


def _parse_npy(key: str, data: bytearray) -> np.ndarray:
    dtype, ndim, cols = _MEMBERS[key]
    f = io.BytesIO(bytes(data[:MAX_NPY_HEADER]))  # the .npy header, without copying the data
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dt = np.lib.format.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dt = np.lib.format.read_array_header_2_0(f)
        else:
            _fail(f"{key}: unsupported .npy version {version}")
    except StateError:
        raise
    except Exception as exc:  # numpy raises ValueError mostly; be strict about any failure here
        _fail(f"{key}: bad .npy header ({type(exc).__name__}: {exc})")
    allowed = [np.dtype(d) for d in dtype.split("|")]
    if dt not in allowed or dt.hasobject:
        _fail(f"{key}: dtype {dt}, expected {' or '.join(map(str, allowed))}")
    want = dt
    if fortran:
        _fail(f"{key}: Fortran-ordered array")
    if len(shape) != ndim or any(type(s) is not int or s < 0 for s in shape) or (cols is not None and shape[1] != cols):
        _fail(f"{key}: shape {shape}, expected {ndim} dimensions" + (f" with {cols} columns" if cols else ""))
    count = math.prod(shape)
    offset = f.tell()
    if count * want.itemsize != len(data) - offset:
        _fail(f"{key}: {len(data) - offset} data bytes for shape {shape} of {want}")
    return np.frombuffer(data, want, count, offset).reshape(shape)


def _nan(v: float | None) -> float:
    return math.nan if v is None else float(v)


def _plain(v: Any) -> Any:
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    return v


def _check_fingerprint(v: Any) -> str:
    if not isinstance(v, str) or not (1 <= len(v) <= 256):
        raise ValueError(f"data_fingerprint must be a string of 1 to 256 characters, got {str(v)[:100]!r}")
    return v


def _obj(v: Any, where: str, keys: Iterable[str]) -> dict:
    if type(v) is not dict:
        _fail(f"{where}: expected an object, got {type(v).__name__}")
    keys = set(keys)
    if set(v) != keys:
        _fail(f"{where}: keys {sorted(map(str, v))[:10]}, expected {sorted(keys)}")
    return v


def _int(v: Any, where: str, lo: int, hi: int, none: bool = False) -> Any:
    if v is None and none:
        return None
    if type(v) is not int or not lo <= v <= hi:
        _fail(f"{where}: expected an integer in [{lo}, {hi}]{' or null' if none else ''}, got {str(v)[:50]}")
    return v


def _str(v: Any, where: str, choices: Iterable[str] | None = None, none: bool = False, max_len: int = 256) -> Any:
    if v is None and none:
        return None
    if type(v) is not str or len(v) > max_len or (choices is not None and v not in choices):
        _fail(f"{where}: expected {'one of ' + str(sorted(choices)) if choices else 'a string'}, got {str(v)[:50]!r}")
    return v


def _settings(v: Any) -> dict[str, Any]:
    if type(v) is not dict:
        _fail("options.settings: expected an object")
    out: dict[str, Any] = {}
    for key, value in v.items():
        where = f"options.settings.{str(key)[:50]}"
        if key == "symmetric":
            if type(value) is not bool:
                _fail(f"{where}: expected a boolean")
        elif key in ("num_bins", "num_quantized_bins"):
            _int(value, where, 1, _core.MAX_BINS)
        elif key == "percentile":
            if type(value) not in (int, float) or not 0 <= value <= 100:
                _fail(f"{where}: expected a number in [0, 100]")
        elif key == "scenario":
            _str(value, where, ("same", "p3"))
        elif key == "qtype":
            _str(value, where, methods.QTYPES)
        elif key == "pow2_method":
            _str(value, where, ("NonOverflow", "MinMSE"))
        elif key == "minmse_mode":
            _str(value, where, ("All", "MostCommon"))
        else:
            _fail(f"{where}: unknown setting")
        out[key] = value
    return out


@dataclass
class _Tensor:
    """One tensor's entry of the header, validated: its streaming span and exact bins."""

    name: str
    dtype: str
    stream: tuple[int | None, int, int] | None  # level, start, length
    exact: tuple[str, int] | None  # edge dtype, bins


@dataclass
class _Header:
    histocal_version: str
    model_fingerprint: str | None
    data_fingerprints: tuple[str, ...]
    mode: str
    streaming_bins: int | None
    exact_kind: str | None
    exact_num_bins: int | None
    method: str | None
    settings: dict[str, Any]
    tensors: list[_Tensor]
    exact_order: list[int]

    def member_limits(self) -> dict[str, int]:
        """The most data bytes each member can hold for this content (0: the member is not used), and a
        check of the bins the state will hold in memory, before anything is allocated for them."""
        n = len(self.tensors)
        held = n * (self.streaming_bins or 0) + sum(t.exact[1] for t in self.tensors if t.exact)
        if held > MAX_STATE_BINS:
            _fail(f"the state would hold {held} bins (tensors x streaming_bins + exact bins), more than the limit of {MAX_STATE_BINS}")
        limits = dict.fromkeys(_MEMBERS, 0)
        if self.streaming_bins is not None:
            limits["stream_bins"] = 8 * sum(t.stream[2] for t in self.tensors if t.stream)
            limits["stream_stats"] = 8 * 3 * n
            limits["stream_counts"] = 8 * 5 * n
            # stream_votes: limited by the batch counts once they are read (_votes_limit)
        if self.exact_kind is not None:
            limits["exact_hist"] = 8 * sum(t.exact[1] for t in self.tensors if t.exact)
            for edt in _DTYPES:
                limits[f"exact_edges_{edt}"] = np.dtype(edt).itemsize * sum(t.exact[1] + 1 for t in self.tensors if t.exact and t.exact[0] == edt)
            limits["exact_scalars"] = 8 * 3 * n
            limits["exact_flags"] = 3 * n
            limits["exact_counts"] = 8 * 5 * n
        return limits


def _votes_limit(counts: np.ndarray) -> int:
    """The most bytes of pow2 votes: per tensor and type at most one row per batch and exponent."""
    return 8 * 4 * 3 * int(np.minimum(counts[:, 4], POW2_EXPONENTS).sum(dtype=np.uint64)) if counts.size else 0


def _parse_header(text_bytes: bytes) -> _Header:
    h = parse_bounded_json(text_bytes, MAX_JSON_DEPTH, lambda problem: _fail(f"header: {problem}"), constants=False)
    h = _obj(h, "header", ("format", "version", "histocal_version", "model_fingerprint", "data_fingerprints", "options", "tensors", "exact_order"))
    if h["format"] != FORMAT_NAME:
        _fail(f"not a histocal calibration state (format {str(h['format'])[:50]!r})")
    if h["version"] != FORMAT_VERSION or type(h["version"]) is not int:
        _fail(f"unsupported format version {str(h['version'])[:20]} (this histocal reads version {FORMAT_VERSION})")
    hv = _str(h["histocal_version"], "histocal_version")
    fp = _str(h["model_fingerprint"], "model_fingerprint", none=True)
    dfp = h["data_fingerprints"]
    if type(dfp) is not list or len(dfp) > 1 << 20:
        _fail("data_fingerprints: expected a list of strings")
    dfp = tuple(sorted(_str(d, "data_fingerprints[]") for d in dfp))
    o = _obj(h["options"], "options", ("mode", "streaming_bins", "exact_kind", "exact_num_bins", "method", "settings"))
    mode = _str(o["mode"], "options.mode", _MODES)
    sbins = _int(o["streaming_bins"], "options.streaming_bins", 8, 1 << 25, none=True)
    if sbins is not None and sbins & (sbins - 1):
        _fail("options.streaming_bins: not a power of two")
    kind = _str(o["exact_kind"], "options.exact_kind", _KINDS, none=True)
    nbins = _int(o["exact_num_bins"], "options.exact_num_bins", 1, _core.MAX_BINS, none=True)
    if (kind is None) != (nbins is None):
        _fail("options: exact_kind and exact_num_bins must both be given or both be null")
    if mode == "streaming" and (sbins is None or kind is not None):
        _fail("options: a streaming-mode state has streaming histograms and no exact ones")
    if sbins is None and kind is None:
        _fail("options: the state holds no histograms")
    method = _str(o["method"], "options.method", none=True, max_len=64)
    settings = _settings(o["settings"])
    raw_tensors = h["tensors"]
    if type(raw_tensors) is not list or not raw_tensors:
        _fail("tensors: expected a non-empty list")
    tensors: list[_Tensor] = []
    seen: set[str] = set()
    for i, t in enumerate(raw_tensors):
        where = f"tensors[{i}]"
        t = _obj(t, where, ("name", "dtype", "stream", "exact"))
        name = _str(t["name"], f"{where}.name", max_len=MAX_NAME_CHARS)
        if name in seen:
            _fail(f"{where}: duplicate tensor name {name[:100]!r}")
        seen.add(name)
        dtype = _str(t["dtype"], f"{where}.dtype", _DTYPES)
        if (t["stream"] is None) != (sbins is None) or (t["exact"] is None) != (kind is None):
            _fail(f"{where}: its histograms do not match the options")
        stream = exact = None
        if sbins is not None:
            st = _obj(t["stream"], f"{where}.stream", ("level", "start", "length"))
            level = _int(st["level"], f"{where}.stream.level", -2000, 2000, none=True)
            start = _int(st["start"], f"{where}.stream.start", 0, sbins)
            stream = (level, start, _int(st["length"], f"{where}.stream.length", 0, sbins - start))
        if kind is not None:
            e = _obj(t["exact"], f"{where}.exact", ("edge_dtype", "bins"))
            exact = (_str(e["edge_dtype"], f"{where}.exact.edge_dtype", _DTYPES), _int(e["bins"], f"{where}.exact.bins", 1, _core.MAX_BINS))
        tensors.append(_Tensor(name, dtype, stream, exact))
    order = h["exact_order"]
    if kind is None:
        if order is not None:
            _fail("exact_order: given without exact histograms")
        order = []
    elif type(order) is not list or sorted(o if type(o) is int else -1 for o in order) != list(range(len(tensors))):
        _fail(f"exact_order: expected a permutation of 0..{len(tensors) - 1}")
    return _Header(hv, fp, dfp, mode, sbins, kind, nbins, method, settings, tensors, order)


def _parse(source: BinaryIO, size: int) -> CalibrationState:
    """Read a state from an untrusted seekable file of ``size`` bytes. Every size is checked before the memory
    for it is taken: the zip directory (bounded reads), the header member (``MAX_HEADER_BYTES``), the content
    the header declares (``MAX_STATE_BINS``), then each member against that content before it is
    decompressed."""
    reads = _BoundedReads(source, size)
    reads.budget = MAX_ZIP_DIRECTORY
    try:
        zf = zipfile.ZipFile(reads)  # type: ignore[arg-type]  # a file-like object
    except zipfile.BadZipFile as exc:
        _fail(f"not a zip/npz file ({exc})")
    with zf:
        infos = _zip_members(zf)
        text = _read_member(zf, reads, infos["header"], MAX_HEADER_BYTES)
        if text.size > MAX_HEADER_BYTES:
            _fail(f"header of {text.size} bytes, more than the limit of {MAX_HEADER_BYTES}")
        header = _parse_header(text.tobytes())
        limits = header.member_limits()
        arrays: dict[str, np.ndarray] = {}
        for key, info in infos.items():
            if key not in ("header", "stream_votes"):
                arrays[key] = _read_member(zf, reads, info, limits[key])
        if "stream_votes" in infos:
            if header.streaming_bins is None:
                _fail("stream_votes: given without streaming histograms")
            counts = arrays.get("stream_counts")
            if counts is None or len(counts) != len(header.tensors):
                _fail(f"stream_counts: expected {len(header.tensors)} rows")
            arrays["stream_votes"] = _read_member(zf, reads, infos["stream_votes"], _votes_limit(counts))
    return _build(header, arrays)


def _build(header: _Header, arrays: dict[str, np.ndarray]) -> CalibrationState:
    """The state of a validated header and its members, every array checked against the header and by the
    Rust ``restore`` checks."""
    sbins, kind, tensors = header.streaming_bins, header.exact_kind, header.tensors

    def arr(key: str) -> np.ndarray:
        if key not in arrays:
            _fail(f"missing member {key}")
        return arrays[key]

    stream = _core.StreamHistograms(sbins, pow2_votes="stream_votes" in arrays) if sbins is not None else None
    exact = _core.Histograms(kind, header.exact_num_bins) if kind is not None else None
    n = len(tensors)
    names = [t.name for t in tensors]
    if stream is not None:
        s_bins, s_stats, s_counts = arr("stream_bins"), arr("stream_stats"), arr("stream_counts")
        if len(s_stats) != n or len(s_counts) != n:
            _fail(f"stream_stats/stream_counts: expected {n} rows")
        s_off = 0
        for i, t in enumerate(tensors):
            level, start, length = t.stream
            if s_off + length > len(s_bins):
                _fail("stream_bins: shorter than the tensors' spans")
            bins = np.zeros(sbins, np.uint64)
            bins[start : start + length] = s_bins[s_off : s_off + length]  # widens to uint64
            s_off += length
            stats = [None if math.isnan(x) else float(x) for x in s_stats[i]]
            counts = tuple(int(c) for c in s_counts[i])
            try:
                stream.restore(t.name, t.dtype, level, bins, *stats, counts)
            except ValueError as exc:
                _fail(str(exc))
        if s_off != len(s_bins):
            _fail("stream_bins: longer than the tensors' spans")
        if stream.pow2_votes:
            votes = arr("stream_votes")
            if votes.size and not (np.all(np.diff(votes[:, 0]) >= 0) and votes[0, 0] >= 0 and votes[-1, 0] < n):
                _fail("stream_votes: tensor indices out of order or range")
            for i, name in enumerate(names):
                rows = votes[np.searchsorted(votes[:, 0], i, "left") : np.searchsorted(votes[:, 0], i, "right")]
                if np.any(rows[:, 3] <= 0):
                    _fail(f"stream_votes: tensor {name[:100]!r} has a non-positive vote count")
                try:
                    stream.restore_votes(name, [(int(t), int(k), int(c)) for _, t, k, c in rows])
                except (ValueError, OverflowError) as exc:
                    _fail(f"stream_votes: {exc}")
    if exact is not None:
        e_hist, e_scal, e_flags, e_counts = arr("exact_hist"), arr("exact_scalars"), arr("exact_flags"), arr("exact_counts")
        if len(e_scal) != n or len(e_flags) != n or len(e_counts) != n:
            _fail(f"exact_scalars/exact_flags/exact_counts: expected {n} rows")
        if np.any(e_flags > 1):
            _fail("exact_flags: expected 0 or 1")
        h_off = 0
        edge_off = dict.fromkeys(_DTYPES, 0)
        for j, i in enumerate(header.exact_order):
            t = tensors[i]
            where = f"tensors[{i}]"
            edt, nb = t.exact
            edges_all = arr(f"exact_edges_{edt}")
            if h_off + nb > len(e_hist):
                _fail("exact_hist: shorter than the tensors' histograms")
            if edge_off[edt] + nb + 1 > len(edges_all):
                _fail(f"exact_edges_{edt}: shorter than the tensors' edges")
            hist = np.ascontiguousarray(e_hist[h_off : h_off + nb], dtype=np.int64)
            edges = np.ascontiguousarray(edges_all[edge_off[edt] : edge_off[edt] + nb + 1]).astype(edt)
            h_off += nb
            edge_off[edt] += nb + 1
            sc, fl = e_scal[j], e_flags[j]
            if math.isnan(sc[0]) or math.isnan(sc[1]) or (kind == "value") == math.isnan(sc[2]):
                _fail(f"{where}: NaN where a number is required in exact_scalars (or a threshold for |x| histograms)")
            threshold = (float(sc[2]), bool(fl[2])) if kind == "value" else None
            try:
                exact.restore(t.name, t.dtype, hist, edges, (float(sc[0]), bool(fl[0])), (float(sc[1]), bool(fl[1])),
                              threshold, tuple(int(c) for c in e_counts[j]))
            except ValueError as exc:
                _fail(str(exc))
        if h_off != len(e_hist):
            _fail("exact_hist: longer than the tensors' histograms")
        for edt in _DTYPES:
            if edge_off[edt] != len(arrays.get(f"exact_edges_{edt}", ())):
                _fail(f"exact_edges_{edt}: longer than the tensors' edges")
    if stream is not None and exact is not None:
        for name in names:
            if tuple(stream.counts(name)) != tuple(exact.counts(name)):
                _fail(f"tensor {name[:100]!r}: streaming and exact counts differ")
    return CalibrationState(
        names=names, mode=header.mode, stream=stream, exact=exact, exact_kind=kind, exact_num_bins=header.exact_num_bins,
        model_fingerprint=header.model_fingerprint, data_fingerprints=header.data_fingerprints, method=header.method,
        settings=header.settings, histocal_version=header.histocal_version,
    )

"""Writing a calibration state file: its members from a state's histograms and summaries, checked by the
loader's own checks (``read.check_members``) before the bytes are handed back (the file format itself:
:mod:`~histocal.state.file.format`; reading it back: :mod:`~histocal.state.file.read`).

Memory: each tensor's exported histogram is alive only while its span is copied out (in the narrowest type
that holds the span's counts), and each member's parts only until the member is joined, so that writing
holds about the file's content twice besides the state, not every tensor's whole histogram.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from typing import Any

import numpy as np

from ...collector import export_exact
from ..collection import Collection
from . import summaries
from .format import FORMAT_NAME, FORMAT_VERSION
from .read import check_readable

_NARROW = ("u1", "<u2", "<u4")


def _narrowest(top: int, wide: str) -> str:
    """The narrowest unsigned type of a count member that holds ``top`` (``wide`` from 2^32 on)."""
    return next(d for d in _NARROW if top <= np.iinfo(d).max) if top < 1 << 32 else wide


def _narrowed(counts: np.ndarray) -> np.ndarray:
    """A copy of ``counts`` in the narrowest type that holds them (a copy, never a view: a view of an
    export keeps the whole export alive)."""
    top = int(counts.max()) if counts.size else 0
    return counts.astype(_narrowest(top, counts.dtype.str) if top >= 0 else counts.dtype)


def state_bytes(state: Any, compress: bool) -> bytes:
    """The bytes of ``state``'s file (a ``CalibrationState``; equal states give equal bytes), deflated with
    ``compress``. ValueError: a state the loader would refuse (nothing is returned)."""
    table, summary_names = summaries.members(), summaries.summary_member_names()
    arrays: dict[str, list[np.ndarray]] = {k: [] for k in table if k != "header" and k not in summary_names}
    tensors: list[dict[str, Any]] = []
    for name in state.names:
        entry: dict[str, Any] = {"name": name, "dtype": state.dtype(name), "stream": None, "exact": None}
        if state.stream is not None:
            ex = state.stream.export(name)
            nz = np.flatnonzero(ex.bins)
            start, stop = (int(nz[0]), int(nz[-1]) + 1) if nz.size else (0, 0)
            arrays["stream_bins"].append(_narrowed(ex.bins[start:stop]))
            stats = [[ex.finite_min, ex.finite_max, ex.abs_min]]  # None (no such value) reads as NaN
            arrays["stream_stats"].append(np.array(stats, np.float64))
            arrays["stream_counts"].append(np.array([ex.counts], np.uint64))
            entry["stream"] = {"level": ex.level, "start": start, "length": stop - start}
            del ex, nz
        tensors.append(entry)
    exact_order = None
    if state.exact is not None:
        index = {n: i for i, n in enumerate(state.names)}
        exact_order = [index[n] for n in state.exact.names()]
        for name in state.exact.names():
            entry = tensors[index[name]]
            e = export_exact(state.exact, name)
            arrays["exact_hist"].append(_narrowed(np.asarray(e.hist, np.int64)))
            arrays[f"exact_edges_{e.edges.dtype}"].append(e.edges)
            thr = e.threshold if e.threshold is not None else (math.nan, False)
            arrays["exact_scalars"].append(np.array([[e.min[0], e.max[0], thr[0]]], np.float64))
            arrays["exact_flags"].append(np.array([[e.min[1], e.max[1], thr[1]]], np.uint8))
            arrays["exact_counts"].append(np.array([e.counts], np.uint64))
            entry["exact"] = {"edge_dtype": str(e.edges.dtype), "bins": len(e.hist)}
    collected = [
        m for m in summaries.SUMMARY_MEMBERS if state.stream is not None and m.summary in state.stream.summaries
    ]
    summary_members = {k: v for m in collected for k, v in m.write(state.stream, state.names).items()}
    header = {
        "format": FORMAT_NAME,
        "version": max([1] + [m.version for m in collected]),
        "histocal_version": state.histocal_version,
        "model_fingerprint": state.model_fingerprint,
        "data_fingerprints": sorted(state.data_fingerprints),
        "options": state.options,
        "tensors": tensors,
        "exact_order": exact_order,
    }
    nested = None
    if state.channels is not None:  # version 2: the channel histograms as a state file of their own
        ch = state.channels
        header["version"] = FORMAT_VERSION
        header["channels"] = {"axis": ch.axis, "tensors": [[t, n] for t, n in ch.channels.items()]}
        keys = Collection("streaming", ch.stream, only=tuple(ch.channel_keys()))
        inner = type(state)(keys, histocal_version=state.histocal_version)
        try:
            nested = np.frombuffer(state_bytes(inner, compress), np.uint8)
        except ValueError as exc:
            raise ValueError(f"{exc} (in its per-channel histograms: {ch.count} channels)") from None
    members = {"header": np.frombuffer(json.dumps(header, allow_nan=False).encode("utf-8"), np.uint8)}
    del header, tensors
    for key, (dtype, ndim, cols) in table.items():
        parts = arrays.pop(key, None)  # (each member's parts released once it is joined)
        if key in summary_members:
            members[key] = summary_members.pop(key)
        elif key == "channels" and nested is not None:
            members[key], nested = nested, None
        elif parts:
            if "|" in dtype:  # counts: the narrowest unsigned type that holds them (compact files)
                top = max((int(p.max()) for p in parts if p.size), default=0)
                dtype = _narrowest(top, dtype.split("|")[0])
            members[key] = np.ascontiguousarray(np.concatenate(parts, dtype=np.dtype(dtype)))
        elif parts is not None and cols is not None and ndim == 2 and _holds(state, key):
            members[key] = np.zeros((0, cols), dtype)
        del parts
    # np.savez's layout (loadable with np.load), with fixed timestamps: equal states give equal bytes
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as zf:
        for key, array in members.items():
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zf.compression
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, array, allow_pickle=False)
    check_readable(zf, members)  # every state histocal writes it can read back, by the loader's own checks
    del members  # (before the file's bytes are copied out)
    return buf.getvalue()


def _holds(state: Any, member: str) -> bool:
    """Whether the state holds the histograms a file member stores (an empty member is then written)."""
    return state.stream is not None if member.startswith("stream") else state.exact is not None

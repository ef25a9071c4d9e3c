"""Reading a calibration state file back: its members checked against its header and restored
into the Rust histograms (the file format itself: ``file_format``)."""

from __future__ import annotations

import math
import zipfile
import zlib
from typing import Any, BinaryIO

import numpy as np

from .. import _core
from .bounded_io import MemoryFile
from .channels import ChannelHistograms
from .file_format import DTYPES, Header, StateError, fail, five_counts, read_members
from .summary_members import SUMMARY_MEMBERS


def read_state_fields(source: BinaryIO, size: int, what: str) -> dict[str, Any]:
    """Read a state file's ``CalibrationState`` keyword arguments (untrusted input: every failure
    is a ValueError naming ``what``).

    Args:
        source: the file, positioned at its start.
        size: its size in bytes.
        what: the file's name for messages.

    Returns:
        The state's fields by name.

    Raises:
        ValueError: the file is no valid calibration state (the message says why).
    """
    try:
        return state_fields(*read_members(source, size))
    except StateError as exc:
        raise ValueError(f"Invalid calibration state {what}: {exc}") from None
    except (
        ValueError,
        TypeError,
        OverflowError,
        KeyError,
        IndexError,
        EOFError,
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        zlib.error,
        NotImplementedError,
        RecursionError,
        MemoryError,
        OSError,
    ) as exc:
        raise ValueError(f"Invalid calibration state {what}: {type(exc).__name__}: {exc}") from None
    except Exception as exc:
        raise ValueError(f"Invalid calibration state {what}: internal error ({type(exc).__name__}: {exc})") from None


def state_fields(header: Header, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The ``CalibrationState`` keyword arguments of a validated header and its members, every
    array checked against the header and by the Rust ``restore`` checks.

    Args:
        header: the state file's validated header.
        arrays: its members by name (``channels`` is taken out when read).

    Returns:
        The state's fields by name.

    Raises:
        StateError: a member that does not match the header, or that the Rust checks refuse.
    """
    sbins, kind, tensors = header.streaming_bins, header.exact_kind, header.tensors

    def arr(key: str) -> np.ndarray:
        if key not in arrays:
            fail(f"missing member {key}")
        return arrays[key]

    summaries = [m.summary for m in SUMMARY_MEMBERS if m.first in arrays]
    stream = _core.StreamHistograms(sbins, summaries) if sbins else None
    exact = None
    if kind is not None:
        if header.exact_num_bins is None:
            fail("exact_num_bins: missing for exact histograms")
        exact = _core.Histograms(kind, header.exact_num_bins)
    n = len(tensors)
    names = [t.name for t in tensors]
    if stream is not None and sbins is not None:
        s_bins, s_stats, s_counts = arr("stream_bins"), arr("stream_stats"), arr("stream_counts")
        if len(s_stats) != n or len(s_counts) != n:
            fail(f"stream_stats/stream_counts: expected {n} rows")
        s_off = 0
        for i, t in enumerate(tensors):
            if t.stream is None:
                fail(f"tensors[{i}]: no streaming histogram")
            level, start, length = t.stream
            if s_off + length > len(s_bins):
                fail("stream_bins: shorter than the tensors' spans")
            bins = np.zeros(sbins, np.uint64)
            bins[start : start + length] = s_bins[s_off : s_off + length]  # widens to uint64
            s_off += length
            finite_min, finite_max, abs_min = (None if math.isnan(x) else float(x) for x in s_stats[i])
            finite, nan, pos_inf, neg_inf, batches = (int(c) for c in s_counts[i])
            counts = (finite, nan, pos_inf, neg_inf, batches)
            try:
                stream.restore(t.name, t.dtype, level, bins, finite_min, finite_max, abs_min, counts)
            except ValueError as exc:
                fail(str(exc))
        if s_off != len(s_bins):
            fail("stream_bins: longer than the tensors' spans")
        for m in SUMMARY_MEMBERS:
            if m.summary in stream.summaries:
                m.read(stream, names, arrays)
    if exact is not None:
        e_hist, e_scal, e_flags, e_counts = (
            arr(k) for k in ("exact_hist", "exact_scalars", "exact_flags", "exact_counts")
        )
        if len(e_scal) != n or len(e_flags) != n or len(e_counts) != n:
            fail(f"exact_scalars/exact_flags/exact_counts: expected {n} rows")
        if np.any(e_flags > 1):
            fail("exact_flags: expected 0 or 1")
        h_off = 0
        edge_off = dict.fromkeys(DTYPES, 0)
        for j, i in enumerate(header.exact_order):
            t = tensors[i]
            where = f"tensors[{i}]"
            if t.exact is None:
                fail(f"{where}: no exact histogram")
            edt, nb = t.exact
            edges_all = arr(f"exact_edges_{edt}")
            if h_off + nb > len(e_hist):
                fail("exact_hist: shorter than the tensors' histograms")
            if edge_off[edt] + nb + 1 > len(edges_all):
                fail(f"exact_edges_{edt}: shorter than the tensors' edges")
            hist = np.ascontiguousarray(e_hist[h_off : h_off + nb], dtype=np.int64)
            edges = np.ascontiguousarray(edges_all[edge_off[edt] : edge_off[edt] + nb + 1]).astype(edt)
            h_off += nb
            edge_off[edt] += nb + 1
            sc, fl = e_scal[j], e_flags[j]
            if math.isnan(sc[0]) or math.isnan(sc[1]) or (kind == "value") == math.isnan(sc[2]):
                fail(f"{where}: NaN where a number is required in exact_scalars (or a threshold for |x| histograms)")
            threshold = (float(sc[2]), bool(fl[2])) if kind == "value" else None
            try:
                exact.restore(
                    t.name,
                    t.dtype,
                    hist,
                    edges,
                    (float(sc[0]), bool(fl[0])),
                    (float(sc[1]), bool(fl[1])),
                    threshold,
                    five_counts(e_counts[j]),
                )
            except ValueError as exc:
                fail(str(exc))
        if h_off != len(e_hist):
            fail("exact_hist: longer than the tensors' histograms")
        for edt in DTYPES:
            if edge_off[edt] != len(arrays.get(f"exact_edges_{edt}", ())):
                fail(f"exact_edges_{edt}: longer than the tensors' edges")
    if stream is not None and exact is not None:
        for name in names:
            if stream.counts(name) != exact.counts(name):
                fail(f"tensor {name[:100]!r}: streaming and exact counts differ")
    channels = None
    if header.channels is not None:
        raw = arrays.pop("channels", None)
        if raw is None or sbins is None:  # (a header with channels has streaming histograms)
            fail("missing member channels")
        try:  # read in place (no copy); its count, bins and no nesting are checked from its header first
            inner = state_fields(*read_members(MemoryFile(raw), raw.size, (header.channel_count, sbins)))
        except StateError as exc:
            fail(f"channels member: {exc}")
        del raw
        try:
            channels = ChannelHistograms.from_stream(header.channels[0], header.channels[1], inner["stream"])
        except ValueError as exc:
            fail(f"channels: {exc}")
    return dict(
        names=names,
        mode=header.mode,
        stream=stream,
        exact=exact,
        exact_kind=kind,
        exact_num_bins=header.exact_num_bins,
        model_fingerprint=header.model_fingerprint,
        data_fingerprints=header.data_fingerprints,
        method=header.method,
        settings=header.settings,
        histocal_version=header.histocal_version,
        channels=channels,
    )

"""Reading a calibration state file as untrusted input: its zip directory and members, each size checked
before the memory for it is taken (bounded reads of the zip, a channels member read in place), the header
(:mod:`~histocal.state.file.header`) first; then the members checked against the header and restored into
the Rust histograms. The format and its limits: :mod:`~histocal.state.file.format`; the summaries' members:
:mod:`~histocal.state.file.summaries`.
"""

from __future__ import annotations

import io
import math
import zipfile
import zlib
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from ... import _core
from ...io.files import READ_CHUNK
from ..channels import ChannelHistograms
from ..collection import Collection
from . import format as spec
from . import summaries
from .errors import StateError, fail
from .header import Header, parse_header


class BoundedReads:
    """A seekable file that hands out at most ``budget`` more bytes (reads past it return nothing), so that
    zipfile reads (and allocates for) no more than the caller allows: its central directory, one member."""

    def __init__(self, file: BinaryIO | MemoryFile, size: int) -> None:
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


class MemoryFile:
    """A read-only seekable file over an array's bytes, without copying them (a channels member)."""

    def __init__(self, data: np.ndarray) -> None:
        self._view, self._at = data.data.cast("B"), 0

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._at = max(0, offset + (0, self._at, len(self._view))[whence])
        return self._at

    def tell(self) -> int:
        return self._at

    def read(self, n: int | None = -1) -> bytes:
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._at + n)
        data = bytes(self._view[self._at : end])
        self._at = max(self._at, end)
        return data


def deflate_bound(size: int) -> int:
    """The largest deflate stream of ``size`` bytes of data (zlib's compressBound, with slack)."""
    return size + (size >> 12) + (size >> 14) + (size >> 25) + 64


def _zip_members(zf: zipfile.ZipFile, nested: bool) -> dict[str, zipfile.ZipInfo]:
    """The members by key (name without ``.npy``), checked from the central directory alone (``nested``: a
    channels member's state, which has no channels of its own)."""
    infos = zf.infolist()
    if len(infos) > spec.MAX_MEMBERS:
        fail(f"{len(infos)} zip members, more than the limit of {spec.MAX_MEMBERS}")
    table = summaries.members()
    out: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        key = info.filename[:-4] if info.filename.endswith(".npy") else None
        if key not in table:
            fail(f"unexpected zip member {info.filename[:100]!r}")
        if key in out:
            fail("duplicate zip members")
        if nested and key == "channels":
            fail("a channels member's state has a channels member of its own (per-channel states do not nest)")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            fail(f"zip member {info.filename!r}: unsupported compression {info.compress_type}")
        if info.flag_bits & 0x1:
            fail(f"zip member {info.filename!r} is encrypted")
        stored_size = info.file_size if info.compress_type == zipfile.ZIP_STORED else deflate_bound(info.file_size)
        if info.compress_size > stored_size:
            fail(f"zip member {info.filename!r}: {info.compress_size} compressed bytes for {info.file_size} bytes")
        out[key] = info
    total = sum(i.file_size for i in infos)
    if total > spec.MAX_STATE_BYTES:
        fail(f"declared uncompressed size {total} is more than the limit of {spec.MAX_STATE_BYTES}")
    if "header" not in out:
        fail("no header member")
    return out


def _check_declared(info: zipfile.ZipInfo, max_data: int) -> None:
    """A member's declared size against ``max_data`` (+ a .npy header), before anything of it is read."""
    limit = max_data + spec.MAX_NPY_HEADER
    if info.file_size > limit:
        fail(f"zip member {info.filename!r} declares {info.file_size} bytes, more than the {limit} its header allows")


def _read_member(zf: zipfile.ZipFile, reads: BoundedReads, info: zipfile.ZipInfo, max_data: int) -> np.ndarray:
    """One member, its size checked against ``max_data`` (+ a .npy header) before it is decompressed, then
    read in chunks into a buffer of that size."""
    key = info.filename[:-4]
    _check_declared(info, max_data)
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
            fail(f"zip member {info.filename!r}: size does not match its declared size")
    return _parse_npy(key, data)


def _parse_npy(key: str, data: bytearray) -> np.ndarray:
    dtype, ndim, cols = summaries.members()[key]
    f = io.BytesIO(bytes(data[: spec.MAX_NPY_HEADER]))  # the .npy header, without copying the data
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dt = np.lib.format.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dt = np.lib.format.read_array_header_2_0(f)
        else:
            fail(f"{key}: unsupported .npy version {version}")
    except StateError:
        raise
    except Exception as exc:  # numpy raises ValueError mostly; be strict about any failure here
        fail(f"{key}: bad .npy header ({type(exc).__name__}: {exc})")
    allowed = [np.dtype(d) for d in dtype.split("|")]
    if dt not in allowed or dt.hasobject:
        fail(f"{key}: dtype {dt}, expected {' or '.join(map(str, allowed))}")
    want = dt
    if fortran:
        fail(f"{key}: Fortran-ordered array")
    if len(shape) != ndim or any(type(s) is not int or s < 0 for s in shape) or (cols is not None and shape[1] != cols):
        fail(f"{key}: shape {shape}, expected {ndim} dimensions" + (f" with {cols} columns" if cols else ""))
    count = math.prod(shape)
    offset = f.tell()
    if count * want.itemsize != len(data) - offset:
        fail(f"{key}: {len(data) - offset} data bytes for shape {shape} of {want}")
    return np.frombuffer(data, want, count, offset).reshape(shape)


def read_members(
    source: BinaryIO | MemoryFile, size: int, nested: tuple[int, int] | None = None
) -> tuple[Header, dict[str, np.ndarray]]:
    """The validated header and members of a state file: an untrusted seekable file of ``size`` bytes. Every
    size is checked before the memory for it is taken: the zip directory (bounded reads), then what
    ``check_members`` checks. ``nested``: the file is a channels member, which must hold that many tensors of
    that many streaming bins and no channels of its own (checked from its directory and header, before
    anything else is read)."""
    reads = BoundedReads(source, size)
    reads.budget = spec.MAX_ZIP_DIRECTORY
    try:
        zf = zipfile.ZipFile(reads)  # a file-like object (seek, tell, read)
    except zipfile.BadZipFile as exc:
        fail(f"not a zip/npz file ({exc})")
    with zf:
        infos = _zip_members(zf, nested is not None)
        return check_members(infos, lambda key, most: _read_member(zf, reads, infos[key], most), nested)


def check_members(
    infos: dict[str, zipfile.ZipInfo], read: Callable[[str, int], np.ndarray], nested: tuple[int, int] | None = None
) -> tuple[Header, dict[str, np.ndarray]]:
    """The checks of a state file's members, from its zip directory ``infos`` (checked by ``_zip_members``):
    the one function both loading and saving run, so that every state histocal writes it reads back.
    ``read(key, most)`` gives a member of at most ``most`` data bytes, its declared size checked first
    (loading inflates it; saving hands over the array it wrote). The header member is read first (at most
    ``spec.MAX_HEADER_BYTES``), then the content it declares is checked (``MAX_STATE_BINS``), then, from the
    directory alone, what the members that the header cannot pin down may inflate to and hold
    (``_check_directory``), then each member is read against that content (a summary's later members
    against what its members read first declare)."""
    declared = infos["header"].file_size
    if declared > spec.MAX_HEADER_BYTES + spec.MAX_NPY_HEADER:
        fail(f"header of {declared} bytes is over the limit of {spec.MAX_HEADER_BYTES} bytes (with its .npy header)")
    text = read("header", spec.MAX_HEADER_BYTES)
    if text.size > spec.MAX_HEADER_BYTES:
        fail(f"header of {text.size} bytes is over the limit of {spec.MAX_HEADER_BYTES} bytes")
    header = parse_header(text.tobytes())
    del text
    if nested is not None:
        if header.channels is not None:
            fail("a channels member's state has channels of its own (per-channel states do not nest)")
        # (fewer bins where the channels' bins were fitted to the memory limit)
        if header.mode != "streaming" or not 0 < (header.streaming_bins or 0) <= nested[1]:
            fail("not a streaming state of at most the outer state's streaming_bins")
        if len(header.tensors) != nested[0]:
            fail(f"{len(header.tensors)} channel histograms, the outer header declares {nested[0]}")
    limits = header.member_limits()
    for m in summaries.SUMMARY_MEMBERS:
        given = [k for k in m.members if k in infos]
        if given and header.streaming_bins is None:
            fail(f"{given[0]}: given without streaming histograms")
        if given and header.version < m.version:
            fail(f"{given[0]}: given in a version {header.version} state")
        if given and m.first not in infos:
            fail(f"{'/'.join(given)}: given without {m.first}")
    if "channels" in infos and header.channels is None:
        fail("channels: given in a state without per-channel histograms")
    _check_directory(header, infos)
    arrays: dict[str, np.ndarray] = {}
    later = {"header", *(k for m in summaries.SUMMARY_MEMBERS for k in m.later)}
    for key in infos:
        if key not in later:
            arrays[key] = read(key, limits[key])
    for m in summaries.SUMMARY_MEMBERS:
        if m.first in infos:
            for key, most in m.later_limits(arrays, len(header.tensors), header.held_bins).items():
                if key in infos:
                    arrays[key] = read(key, most)
    return header, arrays


def _check_directory(header: Header, infos: dict[str, zipfile.ZipInfo]) -> None:
    """Before any of them is inflated, from the directory alone: the members the header cannot pin down (the
    channels member's state, each summary's members), where deflated, declare at most their ratio times their
    compressed size (+ spec.MEMBER_SLACK); and the summaries' members, as declared, with the state's bins (8 bytes
    each) fit the held-bytes limit (the summaries are held in memory about as large as they are stored)."""
    groups = [(("channels",), spec.MAX_NESTED_RATIO)] + [
        (tuple(m.members), spec.MAX_SUMMARY_RATIO) for m in summaries.SUMMARY_MEMBERS
    ]
    for keys, ratio in groups:
        deflated = [infos[k] for k in keys if k in infos and infos[k].compress_type == zipfile.ZIP_DEFLATED]
        size, compressed = sum(i.file_size for i in deflated), sum(i.compress_size for i in deflated)
        most = ratio * compressed + spec.MEMBER_SLACK
        if size > most:
            names, one = ", ".join(repr(i.filename) for i in deflated), len(deflated) == 1
            fail(
                f"zip member{'' if one else 's'} {names} declare{'s' if one else ''} {size} bytes, more than the "
                f"{most} that {'its' if one else 'their'} {compressed} compressed bytes allow (deflated at most "
                f"{ratio}:1, + {spec.MEMBER_SLACK})"
            )
    limit = spec.MAX_HELD_BYTES
    held = 8 * header.held_bins
    summary_names = summaries.summary_member_names()
    for key in summaries.members():
        if key in summary_names and key in infos:
            held += infos[key].file_size
            if held > limit:
                fail(
                    f"zip member {infos[key].filename!r}: the summaries' members declare {held - 8 * header.held_bins} "
                    f"bytes up to it, which with the state's {header.held_bins} bins (8 bytes each) are more than the "
                    f"limit of {limit} bytes held in memory"
                )


def check_readable(zf: zipfile.ZipFile, members: dict[str, np.ndarray]) -> None:
    """ValueError unless ``read_members`` would accept the zip ``zf`` just written of ``members``: its
    directory, then ``check_members`` on the arrays in hand (a state too large to load, or whose members
    would inflate too far, is refused before it is written)."""
    try:
        infos = _zip_members(zf, False)

        def handed(key: str, most: int) -> np.ndarray:
            _check_declared(infos[key], most)
            return members[key]

        check_members(infos, handed)
    except StateError as exc:
        raise ValueError(
            f"this state is too large to be read back, so it is not written: {exc} (calibrate fewer tensors or "
            "channels per state, or use fewer streaming_bins)"
        ) from None


def five_counts(row: Any) -> tuple[int, int, int, int, int]:
    """A tensor's ``(finite, nan, posinf, neginf, batches)`` counts as Python ints."""
    finite, nan, posinf, neginf, batches = (int(c) for c in row)
    return finite, nan, posinf, neginf, batches


def read_state(source: BinaryIO, size: int, what: str) -> tuple[Collection, dict[str, Any]]:
    """Read a state file's collection and provenance (``CalibrationState``'s other keyword
    arguments; untrusted input: every failure is a ValueError naming ``what``).

    Args:
        source: the file, positioned at its start.
        size: its size in bytes.
        what: the file's name for messages.

    Returns:
        The collection, and the provenance by name.

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


def state_fields(header: Header, arrays: dict[str, np.ndarray]) -> tuple[Collection, dict[str, Any]]:
    """The collection and provenance of a validated header and its members, every array checked
    against the header and by the Rust ``restore`` checks.

    Args:
        header: the state file's validated header.
        arrays: its members by name (``channels`` is taken out when read).

    Returns:
        The collection, and the provenance by name.

    Raises:
        StateError: a member that does not match the header, or that the Rust checks refuse.
    """
    sbins, kind, tensors = header.streaming_bins, header.exact_kind, header.tensors

    def arr(key: str) -> np.ndarray:
        if key not in arrays:
            fail(f"missing member {key}")
        return arrays[key]

    collected = [m.summary for m in summaries.SUMMARY_MEMBERS if m.first in arrays]
    stream = _core.StreamHistograms(sbins, collected) if sbins else None
    exact = None
    if kind is not None:
        if header.exact_bins is None:
            fail("the exact histograms' bin count is missing")
        exact = _core.Histograms(kind, header.exact_bins)
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
        for m in summaries.SUMMARY_MEMBERS:
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
        edge_off = dict.fromkeys(spec.DTYPES, 0)
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
        for edt in spec.DTYPES:
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
            inner, _ = state_fields(*read_members(MemoryFile(raw), raw.size, (header.channel_count, sbins)))
        except StateError as exc:
            fail(f"channels member: {exc}")
        del raw
        try:
            channels = ChannelHistograms.from_stream(header.channels[0], header.channels[1], inner.stream)
        except ValueError as exc:
            fail(f"channels: {exc}")
    provenance = dict(
        model_fingerprint=header.model_fingerprint,
        data_fingerprints=header.data_fingerprints,
        method=header.method,
        settings=header.settings,
        histocal_version=header.histocal_version,
    )
    return Collection(header.mode, stream, exact, channels), provenance

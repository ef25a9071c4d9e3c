"""The calibration state file: writing its members, and reading it as untrusted input.

File format (``.npz``-compatible zip, written atomically with ``cache.atomic_write_bytes``): only
plain little-endian numeric ``.npy`` members, never pickles:

* ``header.npy``: uint8, UTF-8 JSON: ``format`` (``"histocal-calibration-state"``), ``version`` (1, or 2 with isotone's members),
  ``histocal_version``, ``model_fingerprint`` (sha256 hex of the graph, see
  :func:`model_fingerprint`), ``data_fingerprints`` (sorted list of the runs' data fingerprints),
  ``options`` (``mode``, ``streaming_bins``, ``exact_kind``, ``exact_num_bins``, ``method``,
  ``settings``) and ``tensors`` (per tensor: ``name``, ``dtype``, ``stream`` = ``{level, start,
  length}`` (the non-zero span of the bins) or null, ``exact`` = ``{edge_dtype, bins}`` or null);
* ``stream_bins`` (the spans concatenated, as the narrowest of uint8/16/32/64 that holds them), ``stream_stats`` (float64 (n, 3): finite min,
  finite max, min |x|; NaN when there are no finite values), ``stream_counts`` (uint64 (n, 5):
  finite, NaN, +Inf, -Inf, batches);
* ``exact_hist`` (concatenated, int64 or the narrowest of uint8/16/32 that holds the counts), ``exact_edges_float16/32/64`` (edges concatenated per edge
  dtype), ``exact_scalars`` (float64 (n, 3): min, max, threshold (NaN for |x|)), ``exact_flags``
  (uint8 (n, 3): whether ORT holds each as a 0-d array), ``exact_counts`` (uint64 (n, 5)).

The summaries collected beside the streaming histograms (pow2's votes, isotone's pairs) add their
members, each as its :class:`~histocal.state.summary_format.SummaryMembers` in
:mod:`histocal.state.summary_members` says (``stream_votes`` after ``stream_counts``, version 1;
isotone's after ``channels``, version 2), present exactly when the summary was collected.

Version 2 adds per-channel histograms (:mod:`histocal.state.channels`); a state without them is written
as version 1, byte for byte as before, and both versions are read. A version-2 header has one more
key, ``channels``: ``{axis, tensors: [[name, channels], ...]}``, and the member ``channels`` (uint8)
holds a complete state file of the channel histograms (streaming mode, one tensor per channel key
``name[c]``, in order; version 1, or 2 with isotone's members when they were collected per channel, but
never with channels of its own), read with the same checks as the outer file, in place: its directory and
header are checked first (no channels member or key, exactly the declared channel count of the outer
``streaming_bins``), and its declared size is bounded by the header (and, deflated, by ``MAX_NESTED_RATIO``).

Loading treats the file as untrusted and checks every size before taking the memory for it: the file
size (``MAX_STATE_BYTES``), the zip directory (at most ``MAX_ZIP_DIRECTORY`` bytes are read to find and
parse it; members' count, names, compression, declared sizes), the JSON header member (read first, at most
``MAX_HEADER_BYTES``, bounded nesting, every field's type and range validated), the content it declares
(tensors x ``streaming_bins`` + exact bins + channels x ``streaming_bins`` at most ``MAX_STATE_BINS``, bins
and ``num_bins`` settings at most ``_core.MAX_BINS``), then, from the zip directory alone, the members the
header cannot pin down (the channels member, each summary's members): deflated, at most
``MAX_NESTED_RATIO`` (channels) or ``MAX_SUMMARY_RATIO`` (a summary's members together) times their compressed
size + ``MEMBER_SLACK``, and the summaries' declared bytes with the bins (8 bytes each) within
``summary_format.MAX_HELD_BYTES``; then each other member's declared size against
the content before it is decompressed, read in chunks (a summary's later members, such as isotone's pairs,
against what its members read first declare). ``check_members`` is these checks, run by loading and by
saving (``check_readable``, on the zip just written, so that every state histocal writes it reads back). Every
``.npy`` header is checked (dtype, shape, size) before its data is used,
and the arrays go through the Rust ``restore`` checks. Every problem is a ``ValueError`` naming the file
and the problem (``FileNotFoundError`` for a missing path), running out of memory included.
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from .. import _core
from ..io.files import READ_CHUNK, parse_bounded_json
from ..methods.table import ALL_OPTIONS, QTYPES
from . import summary_format
from .bounded_io import BoundedReads, MemoryFile, deflate_bound
from .state_error import StateError, fail
from .summary_format import MAX_HELD_BYTES
from .summary_members import SUMMARY_MEMBERS

FORMAT_NAME = "histocal-calibration-state"
# Version 2 adds optional content: per-channel histograms (the header key and member ``channels``)
# and summaries whose members need it (isotone's). A state with neither is written as version 1,
# which earlier histocal versions read.
FORMAT_VERSION = 2
FORMAT_VERSIONS = (1, 2)
MAX_STATE_BYTES = 4 << 30  # file size, and the members' total uncompressed size
MAX_HEADER_BYTES = 64 << 20  # the JSON header
# Bins a loaded state holds in memory, tensors x streaming_bins + exact bins: 2 GiB of counts (16384 tensors
# at the default 16384 streaming bins). A header declaring more is refused before anything is allocated.
MAX_STATE_BINS = MAX_HELD_BYTES // 8
# Deflated members whose size the header cannot pin down may declare at most so many times their compressed
# size (plus MEMBER_SLACK), so that a small file cannot make the loader inflate gigabytes (deflate reaches
# 1032:1 on zeros). A channels member is a state file compressed as its outer file is (histocal writes both
# with the same ``compress``): 4. A summary's members together (pow2's votes; isotone's pairs with their row
# counts, which alone deflate up to 1000:1 when most pairs are seen once): histocal's reach about 15:1
# (votes 9-14, isotone's 3 for float32 data to 15 for a grid of float16 pairs), so 64 leaves room.
MAX_NESTED_RATIO = 4
MAX_SUMMARY_RATIO = 64
MEMBER_SLACK = 1 << 20
MAX_JSON_DEPTH = 8
MAX_MEMBERS = 16
MAX_NAME_CHARS = 1 << 16
MAX_NPY_HEADER = 4096  # a member's .npy header (numpy writes 128 bytes)
MAX_ZIP_DIRECTORY = 1 << 20  # what zipfile may read to find and parse the central directory

DTYPES = ("float16", "float32", "float64")
_MODES = ("exact", "streaming")
_KINDS = ("value", "abs")
# zip members: name -> (dtype, ndim, columns), in the order a file holds them (each summary's after the
# member it names)
_BASE_MEMBERS: dict[str, tuple[str, int, int | None]] = {
    "header": ("u1", 1, None),
    "stream_bins": ("<u8|<u4|<u2|u1", 1, None),
    "stream_stats": ("<f8", 2, 3),
    "stream_counts": ("<u8", 2, 5),
    "exact_hist": ("<i8|<u4|<u2|u1", 1, None),
    "exact_edges_float16": ("<f2", 1, None),
    "exact_edges_float32": ("<f4", 1, None),
    "exact_edges_float64": ("<f8", 1, None),
    "exact_scalars": ("<f8", 2, 3),
    "exact_flags": ("u1", 2, 3),
    "exact_counts": ("<u8", 2, 5),
    "channels": ("u1", 1, None),
}
MEMBERS: dict[str, tuple[str, int, int | None]] = {}
for _key, _spec in _BASE_MEMBERS.items():
    MEMBERS[_key] = _spec
    for _summary in SUMMARY_MEMBERS:
        if _summary.after == _key:
            MEMBERS.update(_summary.members)
SUMMARY_MEMBER_NAMES = frozenset(k for m in SUMMARY_MEMBERS for k in m.members)


# ----------------------------------------------------------------------------------------------
# Reading (untrusted input)
# ----------------------------------------------------------------------------------------------


def _zip_members(zf: zipfile.ZipFile, nested: bool) -> dict[str, zipfile.ZipInfo]:
    """The members by key (name without ``.npy``), checked from the central directory alone (``nested``: a
    channels member's state, which has no channels of its own)."""
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        fail(f"{len(infos)} zip members, more than the limit of {MAX_MEMBERS}")
    out: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        key = info.filename[:-4] if info.filename.endswith(".npy") else None
        if key not in MEMBERS:
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
    if total > MAX_STATE_BYTES:
        fail(f"declared uncompressed size {total} is more than the limit of {MAX_STATE_BYTES}")
    if "header" not in out:
        fail("no header member")
    return out


def _check_declared(info: zipfile.ZipInfo, max_data: int) -> None:
    """A member's declared size against ``max_data`` (+ a .npy header), before anything of it is read."""
    limit = max_data + MAX_NPY_HEADER
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
    dtype, ndim, cols = MEMBERS[key]
    f = io.BytesIO(bytes(data[:MAX_NPY_HEADER]))  # the .npy header, without copying the data
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


def plain_value(v: Any) -> Any:
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    return v


def check_fingerprint(v: Any) -> str:
    if not isinstance(v, str) or not (1 <= len(v) <= 256):
        raise ValueError(f"data_fingerprint must be a string of 1 to 256 characters, got {str(v)[:100]!r}")
    return v


def _obj(v: Any, where: str, keys: Iterable[str]) -> dict:
    if type(v) is not dict:
        fail(f"{where}: expected an object, got {type(v).__name__}")
    keys = set(keys)
    if set(v) != keys:
        fail(f"{where}: keys {sorted(map(str, v))[:10]}, expected {sorted(keys)}")
    return v


def _int(v: Any, where: str, lo: int, hi: int, none: bool = False) -> Any:
    if v is None and none:
        return None
    if type(v) is not int or not lo <= v <= hi:
        fail(f"{where}: expected an integer in [{lo}, {hi}]{' or null' if none else ''}, got {str(v)[:50]}")
    return v


def _str(v: Any, where: str, choices: Iterable[str] | None = None, none: bool = False, max_len: int = 256) -> Any:
    if v is None and none:
        return None
    if type(v) is not str or len(v) > max_len or (choices is not None and v not in choices):
        fail(f"{where}: expected {'one of ' + str(sorted(choices)) if choices else 'a string'}, got {str(v)[:50]!r}")
    return v


def _settings(v: Any) -> dict[str, Any]:
    if type(v) is not dict:
        fail("options.settings: expected an object")
    out: dict[str, Any] = {}
    for key, value in v.items():
        where = f"options.settings.{str(key)[:50]}"
        if key == "symmetric":
            if type(value) is not bool:
                fail(f"{where}: expected a boolean")
        elif key in ("num_bins", "num_quantized_bins"):
            _int(value, where, 1, _core.MAX_BINS)
        elif key == "percentile":
            if type(value) not in (int, float) or not 0 <= value <= 100:
                fail(f"{where}: expected a number in [0, 100]")
        elif key == "qtype":
            _str(value, where, QTYPES)
        elif key in ALL_OPTIONS and ALL_OPTIONS[key].choices is not None:
            _str(value, where, ALL_OPTIONS[key].choices)
        else:
            fail(f"{where}: unknown setting")
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
class Header:
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
    channels: tuple[int, dict[str, int]] | None = None  # axis, channels per tensor (version 2)
    version: int = FORMAT_VERSION

    def member_limits(self) -> dict[str, int]:
        """The most data bytes each member can hold for this content (0: the member is not used), and a
        check of the bins the state will hold in memory, before anything is allocated for them."""
        n = len(self.tensors)
        held = self.held_bins
        if held > MAX_STATE_BINS:
            what = "tensors x streaming_bins + exact bins" + (" + channels x streaming_bins" if self.channels else "")
            fail(f"the state would hold {held} bins ({what}), more than the limit of {MAX_STATE_BINS}")
        limits = dict.fromkeys(MEMBERS, 0)
        if self.streaming_bins is not None:
            limits["stream_bins"] = 8 * sum(t.stream[2] for t in self.tensors if t.stream)
            limits["stream_stats"] = 8 * 3 * n
            limits["stream_counts"] = 8 * 5 * n
            # the summaries' later members: limited by what is read first (SummaryMembers.later_limits)
            for m in SUMMARY_MEMBERS:
                if self.version >= m.version and m.first not in m.later:
                    limits[m.first] = m.first_limit(n)
        if self.exact_kind is not None:
            limits["exact_hist"] = 8 * sum(t.exact[1] for t in self.tensors if t.exact)
            for edt in DTYPES:
                limits[f"exact_edges_{edt}"] = np.dtype(edt).itemsize * sum(
                    t.exact[1] + 1 for t in self.tensors if t.exact and t.exact[0] == edt
                )
            limits["exact_scalars"] = 8 * 3 * n
            limits["exact_flags"] = 3 * n
            limits["exact_counts"] = 8 * 5 * n
        if self.channels is not None and self.streaming_bins is not None:
            # a state file of channel_count tensors (read with its own checks): its header, its members'
            # .npy and zip headers, its bins and rows, and its summaries within what the bins leave
            c = self.channel_count
            rows = 8 * self.streaming_bins * c + (24 + 40 + 24) * c
            summaries = sum(m.nested_bytes(c, summary_format.MAX_HELD_BYTES - 8 * held) for m in SUMMARY_MEMBERS)
            overhead = MAX_MEMBERS * (MAX_NPY_HEADER + 30 + 46 + 2 * 64 + 40) + 22
            limits["channels"] = MAX_HEADER_BYTES + rows + summaries + overhead
        return limits

    @property
    def held_bins(self) -> int:
        """The bins the state holds in memory once loaded (the channels' histograms included)."""
        per_tensor = len(self.tensors) * (self.streaming_bins or 0) + sum(t.exact[1] for t in self.tensors if t.exact)
        return per_tensor + self.channel_count * (self.streaming_bins or 0)

    @property
    def channel_count(self) -> int:
        return sum(self.channels[1].values()) if self.channels else 0


def _parse_header(text_bytes: bytes) -> Header:
    h = parse_bounded_json(text_bytes, MAX_JSON_DEPTH, lambda problem: fail(f"header: {problem}"), constants=False)
    keys = ["format", "version", "histocal_version", "model_fingerprint", "data_fingerprints", "options", "tensors"]
    version = h.get("version") if type(h) is dict else None
    has_channels = version == 2 and type(h) is dict and "channels" in h
    h = _obj(h, "header", [*keys, "exact_order"] + (["channels"] if has_channels else []))
    if h["format"] != FORMAT_NAME:
        fail(f"not a histocal calibration state (format {str(h['format'])[:50]!r})")
    if version not in FORMAT_VERSIONS or type(version) is not int:
        fail(f"unsupported format version {str(version)[:20]} (this histocal reads versions 1 and 2)")
    hv = _str(h["histocal_version"], "histocal_version")
    fp = _str(h["model_fingerprint"], "model_fingerprint", none=True)
    dfp = h["data_fingerprints"]
    if type(dfp) is not list or len(dfp) > 1 << 20:
        fail("data_fingerprints: expected a list of strings")
    dfp = tuple(sorted(_str(d, "data_fingerprints[]") for d in dfp))
    o = _obj(h["options"], "options", ("mode", "streaming_bins", "exact_kind", "exact_num_bins", "method", "settings"))
    mode = _str(o["mode"], "options.mode", _MODES)
    sbins = _int(o["streaming_bins"], "options.streaming_bins", 8, 1 << 25, none=True)
    if sbins is not None and sbins & (sbins - 1):
        fail("options.streaming_bins: not a power of two")
    kind = _str(o["exact_kind"], "options.exact_kind", _KINDS, none=True)
    nbins = _int(o["exact_num_bins"], "options.exact_num_bins", 1, _core.MAX_BINS, none=True)
    if (kind is None) != (nbins is None):
        fail("options: exact_kind and exact_num_bins must both be given or both be null")
    if mode == "streaming" and (sbins is None or kind is not None):
        fail("options: a streaming-mode state has streaming histograms and no exact ones")
    if sbins is None and kind is None:
        fail("options: the state holds no histograms")
    method = _str(o["method"], "options.method", none=True, max_len=64)
    settings = _settings(o["settings"])
    raw_tensors = h["tensors"]
    if type(raw_tensors) is not list or not raw_tensors:
        fail("tensors: expected a non-empty list")
    tensors: list[_Tensor] = []
    seen: set[str] = set()
    for i, t in enumerate(raw_tensors):
        where = f"tensors[{i}]"
        t = _obj(t, where, ("name", "dtype", "stream", "exact"))
        name = _str(t["name"], f"{where}.name", max_len=MAX_NAME_CHARS)
        if name in seen:
            fail(f"{where}: duplicate tensor name {name[:100]!r}")
        seen.add(name)
        dtype = _str(t["dtype"], f"{where}.dtype", DTYPES)
        if (t["stream"] is None) != (sbins is None) or (t["exact"] is None) != (kind is None):
            fail(f"{where}: its histograms do not match the options")
        stream = exact = None
        if sbins is not None:
            st = _obj(t["stream"], f"{where}.stream", ("level", "start", "length"))
            level = _int(st["level"], f"{where}.stream.level", -2000, 2000, none=True)
            start = _int(st["start"], f"{where}.stream.start", 0, sbins)
            stream = (level, start, _int(st["length"], f"{where}.stream.length", 0, sbins - start))
        if kind is not None:
            e = _obj(t["exact"], f"{where}.exact", ("edge_dtype", "bins"))
            exact = (
                _str(e["edge_dtype"], f"{where}.exact.edge_dtype", DTYPES),
                _int(e["bins"], f"{where}.exact.bins", 1, _core.MAX_BINS),
            )
        tensors.append(_Tensor(name, dtype, stream, exact))
    order = h["exact_order"]
    if kind is None:
        if order is not None:
            fail("exact_order: given without exact histograms")
        order = []
    elif type(order) is not list or sorted(o if type(o) is int else -1 for o in order) != list(range(len(tensors))):
        fail(f"exact_order: expected a permutation of 0..{len(tensors) - 1}")
    channels = None
    if has_channels:
        c = _obj(h["channels"], "channels", ("axis", "tensors"))
        axis = _int(c["axis"], "channels.axis", -64, 63)
        if type(c["tensors"]) is not list or not c["tensors"] or len(c["tensors"]) > len(tensors):
            fail("channels.tensors: expected a non-empty list of at most one entry per tensor")
        counts: dict[str, int] = {}
        for i, entry in enumerate(c["tensors"]):
            if type(entry) is not list or len(entry) != 2:
                fail(f"channels.tensors[{i}]: expected [name, channels]")
            name = _str(entry[0], f"channels.tensors[{i}][0]", seen, max_len=MAX_NAME_CHARS)
            if name in counts:
                fail(f"channels.tensors[{i}]: duplicate tensor name {name[:100]!r}")
            counts[name] = _int(entry[1], f"channels.tensors[{i}][1]", 1, MAX_STATE_BINS)
        if sbins is None:
            fail("channels: per-channel histograms are streaming histograms, and the state has none")
        channels = (axis, counts)
    return Header(hv, fp, dfp, mode, sbins, kind, nbins, method, settings, tensors, order, channels, version)


def read_members(
    source: BinaryIO | MemoryFile, size: int, nested: tuple[int, int] | None = None
) -> tuple[Header, dict[str, np.ndarray]]:
    """The validated header and members of a state file: an untrusted seekable file of ``size`` bytes. Every
    size is checked before the memory for it is taken: the zip directory (bounded reads), then what
    ``check_members`` checks. ``nested``: the file is a channels member, which must hold that many tensors of
    that many streaming bins and no channels of its own (checked from its directory and header, before
    anything else is read)."""
    reads = BoundedReads(source, size)
    reads.budget = MAX_ZIP_DIRECTORY
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
    ``MAX_HEADER_BYTES``), then the content it declares is checked (``MAX_STATE_BINS``), then, from the
    directory alone, what the members that the header cannot pin down may inflate to and hold
    (``_check_directory``), then each member is read against that content (a summary's later members, such
    as isotone's pairs, against what its members read first declare)."""
    declared = infos["header"].file_size
    if declared > MAX_HEADER_BYTES + MAX_NPY_HEADER:
        fail(f"header of {declared} bytes is over the limit of {MAX_HEADER_BYTES} bytes (with its .npy header)")
    text = read("header", MAX_HEADER_BYTES)
    if text.size > MAX_HEADER_BYTES:
        fail(f"header of {text.size} bytes is over the limit of {MAX_HEADER_BYTES} bytes")
    header = _parse_header(text.tobytes())
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
    for m in SUMMARY_MEMBERS:
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
    later = {"header", *(k for m in SUMMARY_MEMBERS for k in m.later)}
    for key in infos:
        if key not in later:
            arrays[key] = read(key, limits[key])
    for m in SUMMARY_MEMBERS:
        if m.first in infos:
            for key, most in m.later_limits(arrays, len(header.tensors), header.held_bins).items():
                if key in infos:
                    arrays[key] = read(key, most)
    return header, arrays


def _check_directory(header: Header, infos: dict[str, zipfile.ZipInfo]) -> None:
    """Before any of them is inflated, from the directory alone: the members the header cannot pin down (the
    channels member's state, each summary's members), where deflated, declare at most their ratio times their
    compressed size (+ MEMBER_SLACK); and the summaries' members, as declared, with the state's bins (8 bytes
    each) fit the held-bytes limit (the summaries are held in memory about as large as they are stored)."""
    groups = [(("channels",), MAX_NESTED_RATIO)] + [(tuple(m.members), MAX_SUMMARY_RATIO) for m in SUMMARY_MEMBERS]
    for keys, ratio in groups:
        deflated = [infos[k] for k in keys if k in infos and infos[k].compress_type == zipfile.ZIP_DEFLATED]
        size, compressed = sum(i.file_size for i in deflated), sum(i.compress_size for i in deflated)
        most = ratio * compressed + MEMBER_SLACK
        if size > most:
            names, one = ", ".join(repr(i.filename) for i in deflated), len(deflated) == 1
            fail(
                f"zip member{'' if one else 's'} {names} declare{'s' if one else ''} {size} bytes, more than the "
                f"{most} that {'its' if one else 'their'} {compressed} compressed bytes allow (deflated at most "
                f"{ratio}:1, + {MEMBER_SLACK})"
            )
    limit = summary_format.MAX_HELD_BYTES
    held = 8 * header.held_bins
    for key in MEMBERS:
        if key in SUMMARY_MEMBER_NAMES and key in infos:
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

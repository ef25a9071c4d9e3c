"""A state file's JSON header, read as untrusted input: every field's type and range checked
(:func:`parse_header`), and the sizes of the members it lets a file hold (:meth:`Header.member_limits`),
known before any other member is read. The format and its limits: :mod:`~histocal.state.file.format`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import _core
from ...io.files import parse_bounded_json
from ...methods.table import ALL_OPTIONS, QTYPES
from . import format as spec
from . import summaries
from .errors import fail


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
    exact_bins: int | None
    method: str | None
    settings: dict[str, Any]
    tensors: list[_Tensor]
    exact_order: list[int]
    channels: tuple[int, dict[str, int]] | None = None  # axis, channels per tensor (version 2)
    version: int = spec.FORMAT_VERSION

    def member_limits(self) -> dict[str, int]:
        """The most data bytes each member can hold for this content (0: the member is not used), and a
        check of the bins the state will hold in memory, before anything is allocated for them."""
        n = len(self.tensors)
        held = self.held_bins
        if held > spec.MAX_STATE_BINS:
            what = "tensors x streaming_bins + exact bins" + (" + channels x streaming_bins" if self.channels else "")
            fail(f"the state would hold {held} bins ({what}), more than the limit of {spec.MAX_STATE_BINS}")
        limits = dict.fromkeys(summaries.members(), 0)
        if self.streaming_bins is not None:
            limits["stream_bins"] = 8 * sum(t.stream[2] for t in self.tensors if t.stream)
            limits["stream_stats"] = 8 * 3 * n
            limits["stream_counts"] = 8 * 5 * n
            # the summaries' later members: limited by what is read first (SummaryMembers.later_limits)
            for m in summaries.SUMMARY_MEMBERS:
                if self.version >= m.version and m.first not in m.later:
                    limits[m.first] = m.first_limit(n)
        if self.exact_kind is not None:
            limits["exact_hist"] = 8 * sum(t.exact[1] for t in self.tensors if t.exact)
            for edt in spec.DTYPES:
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
            nested = sum(m.nested_bytes(c, spec.MAX_HELD_BYTES - 8 * held) for m in summaries.SUMMARY_MEMBERS)
            overhead = spec.MAX_MEMBERS * (spec.MAX_NPY_HEADER + 30 + 46 + 2 * 64 + 40) + 22
            limits["channels"] = spec.MAX_HEADER_BYTES + rows + nested + overhead
        return limits

    @property
    def held_bins(self) -> int:
        """The bins the state holds in memory once loaded (the channels' histograms included)."""
        per_tensor = len(self.tensors) * (self.streaming_bins or 0) + sum(t.exact[1] for t in self.tensors if t.exact)
        return per_tensor + self.channel_count * (self.streaming_bins or 0)

    @property
    def channel_count(self) -> int:
        return sum(self.channels[1].values()) if self.channels else 0


def parse_header(text_bytes: bytes) -> Header:
    h = parse_bounded_json(text_bytes, spec.MAX_JSON_DEPTH, lambda problem: fail(f"header: {problem}"), constants=False)
    keys = ["format", "version", "histocal_version", "model_fingerprint", "data_fingerprints", "options", "tensors"]
    version = h.get("version") if type(h) is dict else None
    has_channels = version == 2 and type(h) is dict and "channels" in h
    h = _obj(h, "header", [*keys, "exact_order"] + (["channels"] if has_channels else []))
    if h["format"] != spec.FORMAT_NAME:
        fail(f"not a histocal calibration state (format {str(h['format'])[:50]!r})")
    if version not in spec.FORMAT_VERSIONS or type(version) is not int:
        fail(f"unsupported format version {str(version)[:20]} (this histocal reads versions 1 and 2)")
    hv = _str(h["histocal_version"], "histocal_version")
    fp = _str(h["model_fingerprint"], "model_fingerprint", none=True)
    dfp = h["data_fingerprints"]
    if type(dfp) is not list or len(dfp) > 1 << 20:
        fail("data_fingerprints: expected a list of strings")
    dfp = tuple(sorted(_str(d, "data_fingerprints[]") for d in dfp))
    o = _obj(h["options"], "options", ("mode", "streaming_bins", "exact_kind", "exact_num_bins", "method", "settings"))
    mode = _str(o["mode"], "options.mode", spec.MODES)
    sbins = _int(o["streaming_bins"], "options.streaming_bins", 8, 1 << 25, none=True)
    if sbins is not None and sbins & (sbins - 1):
        fail("options.streaming_bins: not a power of two")
    kind = _str(o["exact_kind"], "options.exact_kind", spec.KINDS, none=True)
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
        name = _str(t["name"], f"{where}.name", max_len=spec.MAX_NAME_CHARS)
        if name in seen:
            fail(f"{where}: duplicate tensor name {name[:100]!r}")
        seen.add(name)
        dtype = _str(t["dtype"], f"{where}.dtype", spec.DTYPES)
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
                _str(e["edge_dtype"], f"{where}.exact.edge_dtype", spec.DTYPES),
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
            name = _str(entry[0], f"channels.tensors[{i}][0]", seen, max_len=spec.MAX_NAME_CHARS)
            if name in counts:
                fail(f"channels.tensors[{i}]: duplicate tensor name {name[:100]!r}")
            counts[name] = _int(entry[1], f"channels.tensors[{i}][1]", 1, spec.MAX_STATE_BINS)
        if sbins is None:
            fail("channels: per-channel histograms are streaming histograms, and the state has none")
        channels = (axis, counts)
    return Header(hv, fp, dfp, mode, sbins, kind, nbins, method, settings, tensors, order, channels, version)

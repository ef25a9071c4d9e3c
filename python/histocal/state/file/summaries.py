"""The summaries a state file stores: one :class:`~histocal.state.file.format.SummaryMembers` class per
summary (the Rust ``collection::summary``), and their registry ``SUMMARY_MEMBERS``. A new summary: its members
class here and one entry in ``SUMMARY_MEMBERS`` (reading and writing look the registry up when they run).

**pow2's votes** (for its most-common choice, per batch):

Member ``stream_votes`` (int64 (m, 4): tensor index, type (int8, uint8, int16), exponent, batches), sorted
by tensor index, present exactly when the votes were collected (empty when no batch voted). Written after
``stream_counts``, in format version 1. The Rust ``restore_summary`` checks each tensor's votes (types,
exponents, no repeats, no more votes of a type than batches). The batch counts only narrow the member's
size: what bounds its memory is checked from the zip directory (``read.check_members``: its deflate
ratio, and its declared size with the bins within the held-bytes limit), whatever counts the file declares.
Deflated, histocal's votes reach 9-14:1 (within ``format.MAX_SUMMARY_RATIO``).

**isotone's pairs** (its per-row top-two summaries, format version 2):

Members, present exactly when the summaries were collected (``StreamHistograms(..., summaries=["isotone"])``),
written after ``channels``:

* ``isotone_tensors``: uint64 (n, 3), per tensor in the header's order: its number of distinct
  pairs, its number of skipped rows, and 1 if its rows had more distinct pairs than a summary
  holds (then it has no pairs), else 0;
* ``isotone_pairs``: float64 (m, 2), the pairs ``(l1, l2)`` of all tensors concatenated in that
  order, each tensor's sorted and distinct; ``m`` is the sum of the first column above;
* ``isotone_rows``: uint64 (m,), the number of rows that had each pair.

``isotone_tensors`` is read first; the pairs' size is bounded by its counts (at most
``ISOTONE_MAX_PAIRS`` per tensor, and with the state's bins within ``MAX_HELD_BYTES``) before they are
read (and, like every summary's members, from the zip directory before any is read: see
``read.check_members``). The Rust ``restore_summary`` checks each tensor's pairs (finite,
``l1 >= l2``, sorted, distinct, no ``-0.0``, positive row counts, at most ``MAX_PAIRS``). Deflated, the
members together reach 3:1 (float32 data) to 15:1 (a grid of float16 pairs) in histocal's files; the row
counts alone up to 1000:1 when most pairs are seen once (within ``format.MAX_SUMMARY_RATIO``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ... import _core
from . import format as spec
from .errors import fail
from .format import MemberSpec, SummaryMembers, member_table


class Pow2VotesMembers(SummaryMembers):
    summary = "pow2_votes"
    members: ClassVar[dict[str, MemberSpec]] = {"stream_votes": ("<i8", 2, 4)}
    after = "stream_counts"
    version = 1
    first = "stream_votes"
    later = ("stream_votes",)

    def later_limits(self, arrays: dict[str, np.ndarray], tensors: int, held_bins: int) -> dict[str, int]:
        """Per tensor and type at most one row per batch and exponent."""
        counts = arrays.get("stream_counts")
        if counts is None or len(counts) != tensors:
            fail(f"stream_counts: expected {tensors} rows")
        most = (
            8 * 4 * 3 * int(np.minimum(counts[:, 4], _core.POW2_EXPONENTS).sum(dtype=np.uint64)) if counts.size else 0
        )
        return {"stream_votes": most}

    def write(self, stream: Any, names: list[str]) -> dict[str, np.ndarray]:
        rows = []
        for i, name in enumerate(names):
            v = stream.export_summary(name, self.summary)
            n = len(v["type"])
            if n:
                rows.append(
                    np.stack([np.full(n, i, np.int64), v["type"], v["exponent"], v["batches"].astype(np.int64)], 1)
                )
        votes = np.concatenate(rows) if rows else np.zeros((0, 4), np.int64)
        return {"stream_votes": np.ascontiguousarray(votes, "<i8")}

    def read(self, stream: Any, names: list[str], arrays: dict[str, np.ndarray]) -> None:
        votes = arrays["stream_votes"]
        if votes.size and not (np.all(np.diff(votes[:, 0]) >= 0) and votes[0, 0] >= 0 and votes[-1, 0] < len(names)):
            fail("stream_votes: tensor indices out of order or range")
        for i, name in enumerate(names):
            rows = votes[np.searchsorted(votes[:, 0], i, "left") : np.searchsorted(votes[:, 0], i, "right")]
            if np.any(rows[:, 3] <= 0):
                fail(f"stream_votes: tensor {name[:100]!r} has a non-positive vote count")
            parts = {"type": rows[:, 1].copy(), "exponent": rows[:, 2].copy(), "batches": rows[:, 3].astype(np.uint64)}
            try:
                stream.restore_summary(name, self.summary, parts)
            except (ValueError, OverflowError) as exc:
                fail(f"stream_votes: {exc}")


POW2_VOTES = Pow2VotesMembers()


ISOTONE_MEMBERS = ("isotone_tensors", "isotone_pairs", "isotone_rows")
ISOTONE_PAIR_BYTES = 24  # one distinct (l1, l2, rows) pair, in memory


def _declared_pairs(tensors: np.ndarray, n: int, held_bins: int) -> int:
    """The pairs ``isotone_tensors`` declares, checked before the pairs are read."""
    if len(tensors) != n:
        fail(f"isotone_tensors: expected {n} rows")
    if tensors.size and int(tensors[:, 0].max()) > _core.ISOTONE_MAX_PAIRS:
        fail(f"isotone_tensors: more than {_core.ISOTONE_MAX_PAIRS} pairs for one tensor")
    pairs = int(tensors[:, 0].sum(dtype=np.uint64)) if tensors.size else 0
    limit = spec.MAX_HELD_BYTES  # (read here: one limit for every check, read's too)
    if ISOTONE_PAIR_BYTES * pairs + 8 * held_bins > limit:
        fail(
            f"isotone_tensors: {pairs} pairs ({ISOTONE_PAIR_BYTES} bytes each) with {held_bins} bins (8 bytes each) "
            f"are more than the limit of {limit} bytes"
        )
    return pairs


class IsotoneMembers(SummaryMembers):
    summary = "isotone"
    members: ClassVar[dict[str, MemberSpec]] = {
        "isotone_tensors": ("<u8", 2, 3),
        "isotone_pairs": ("<f8", 2, 2),
        "isotone_rows": ("<u8", 1, None),
    }
    after = "channels"
    version = 2
    first = "isotone_tensors"
    later = ("isotone_pairs", "isotone_rows")

    def first_limit(self, tensors: int) -> int:
        return 8 * 3 * tensors

    def later_limits(self, arrays: dict[str, np.ndarray], tensors: int, held_bins: int) -> dict[str, int]:
        pairs = _declared_pairs(arrays["isotone_tensors"], tensors, held_bins)
        return {"isotone_pairs": 16 * pairs, "isotone_rows": 8 * pairs}

    def nested_bytes(self, channels: int, bytes_left: int) -> int:
        return ISOTONE_PAIR_BYTES * min(_core.ISOTONE_MAX_PAIRS * channels, max(0, bytes_left) // ISOTONE_PAIR_BYTES)

    def write(self, stream: Any, names: list[str]) -> dict[str, np.ndarray]:
        tensors, pairs, rows = [], [], []
        for name in names:
            p = stream.export_summary(name, self.summary)
            tensors.append((len(p["l1"]), int(p["skipped"][0]), int(p["overflowed"][0])))
            pairs.append(np.stack([p["l1"], p["l2"]], axis=1))
            rows.append(p["rows"])
        return {
            "isotone_tensors": np.array(tensors, np.uint64).reshape(-1, 3),
            "isotone_pairs": np.ascontiguousarray(np.concatenate(pairs), np.float64).reshape(-1, 2),
            "isotone_rows": np.concatenate(rows).astype(np.uint64),
        }

    def read(self, stream: Any, names: list[str], arrays: dict[str, np.ndarray]) -> None:
        missing = [k for k in ISOTONE_MEMBERS if k not in arrays]
        if missing:
            fail(f"missing member {missing[0]}")
        tensors, pairs, rows = (arrays[k] for k in ISOTONE_MEMBERS)
        if len(tensors) != len(names):  # (read_members checked the counts before reading the pairs)
            fail(f"isotone_tensors: expected {len(names)} rows")
        if len(pairs) != len(rows) or len(pairs) != int(tensors[:, 0].sum(dtype=np.uint64)):
            fail("isotone_pairs/isotone_rows: lengths differ from what isotone_tensors declares")
        offset = 0
        if tensors.size and int(tensors[:, 2].max()) > 1:
            fail("isotone_tensors: the overflow mark must be 0 or 1")
        for name, (count, skipped, overflowed) in zip(names, tensors):
            part = slice(offset, offset + int(count))
            offset += int(count)
            summary = {
                "l1": np.ascontiguousarray(pairs[part, 0], np.float64),
                "l2": np.ascontiguousarray(pairs[part, 1], np.float64),
                "rows": np.ascontiguousarray(rows[part], np.uint64),
                "skipped": np.array([skipped], np.uint64),
                "overflowed": np.array([overflowed], np.uint64),
            }
            try:
                stream.restore_summary(name, self.summary, summary)
            except (ValueError, OverflowError) as exc:
                fail(f"isotone: {exc}")


ISOTONE = IsotoneMembers()


SUMMARY_MEMBERS: tuple[SummaryMembers, ...] = (POW2_VOTES, ISOTONE)


def members() -> dict[str, MemberSpec]:
    """Every member a file may hold, in order, with the registered summaries' (looked up when called)."""
    return member_table(SUMMARY_MEMBERS)


def summary_member_names() -> frozenset[str]:
    """The registered summaries' members."""
    return frozenset(k for m in SUMMARY_MEMBERS for k in m.members)

"""isotone's per-row top-two summaries in a state file (format version 2).

Members, present exactly when the summaries were collected (``StreamHistograms(..., isotone=True)``):

* ``isotone_tensors``: uint64 (n, 3), per tensor in the header's order: its number of distinct
  pairs, its number of skipped rows, and 1 if its rows had more distinct pairs than a summary
  holds (then it has no pairs), else 0;
* ``isotone_pairs``: float64 (m, 2), the pairs ``(l1, l2)`` of all tensors concatenated in that
  order, each tensor's sorted and distinct; ``m`` is the sum of the first column above;
* ``isotone_rows``: uint64 (m,), the number of rows that had each pair.

The Rust ``restore_isotone`` checks each tensor's pairs (finite, ``l1 >= l2``, sorted, distinct, no
``-0.0``, positive row counts, at most ``MAX_PAIRS``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .file_format import fail

ISOTONE_MEMBERS = ("isotone_tensors", "isotone_pairs", "isotone_rows")


def isotone_members(stream: Any, names: list[str]) -> dict[str, np.ndarray]:
    """The isotone members of ``stream``'s tensors ``names`` (none when not collected)."""
    if stream is None or not stream.isotone:
        return {}
    tensors, pairs, rows = [], [], []
    for name in names:
        p = stream.isotone_pairs(name)
        tensors.append((len(p.l1), p.skipped, int(p.overflowed)))
        pairs.append(np.stack([p.l1, p.l2], axis=1))
        rows.append(p.rows)
    return {
        "isotone_tensors": np.array(tensors, np.uint64).reshape(-1, 3),
        "isotone_pairs": np.ascontiguousarray(np.concatenate(pairs), np.float64).reshape(-1, 2),
        "isotone_rows": np.concatenate(rows).astype(np.uint64),
    }


def restore_isotone(stream: Any, names: list[str], arrays: dict[str, np.ndarray]) -> None:
    """Put the members' summaries, if any, into ``stream`` (made with ``isotone=True``), checked."""
    if "isotone_tensors" not in arrays:
        return
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
        try:
            stream.restore_isotone(name, pairs[part, 0], pairs[part, 1], rows[part], int(skipped), bool(overflowed))
        except (ValueError, OverflowError) as exc:
            fail(f"isotone: {exc}")

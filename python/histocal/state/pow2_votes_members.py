"""pow2's per-batch votes (for its most-common choice) in a state file.

Member ``stream_votes`` (int64 (m, 4): tensor index, type (int8, uint8, int16), exponent, batches), sorted
by tensor index, present exactly when the votes were collected (empty when no batch voted). Written after
``stream_counts``, in format version 1. The Rust ``restore_summary`` checks each tensor's votes (types,
exponents, no repeats, no more votes of a type than batches). The batch counts only narrow the member's
size: what bounds its memory is checked from the zip directory (``file_format.check_members``: its deflate
ratio, and its declared size with the bins within the held-bytes limit), whatever counts the file declares.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .. import _core
from .state_error import fail
from .summary_format import SummaryMembers


class Pow2VotesMembers(SummaryMembers):
    summary = "pow2_votes"
    members: ClassVar[dict[str, tuple[str, int, int | None]]] = {"stream_votes": ("<i8", 2, 4)}
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

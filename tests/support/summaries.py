"""The summaries a streaming collection keeps beside its histograms, read and put back through the
core's one generic interface (``export_summary`` / ``restore_summary``), in the shapes tests compare."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class IsotonePairs:
    """A tensor's isotone summary: its distinct top-two pairs ``(l1[k], l2[k])``, sorted, the rows
    that had each, the rows left out, and whether there were more pairs than it holds."""

    l1: np.ndarray
    l2: np.ndarray
    rows: np.ndarray
    skipped: int
    overflowed: bool


def isotone_pairs(stream: Any, name: str) -> IsotonePairs | None:
    parts = stream.export_summary(name, "isotone")
    if parts is None:
        return None
    return IsotonePairs(parts["l1"], parts["l2"], parts["rows"], int(parts["skipped"][0]), bool(parts["overflowed"][0]))


def restore_isotone(
    stream: Any,
    name: str,
    l1: Sequence[float],
    l2: Sequence[float],
    rows: Sequence[int],
    skipped: int,
    overflowed: bool,
) -> None:
    stream.restore_summary(
        name,
        "isotone",
        {
            "l1": np.asarray(l1, np.float64),
            "l2": np.asarray(l2, np.float64),
            "rows": np.asarray(rows, np.uint64),
            "skipped": np.array([skipped], np.uint64),
            "overflowed": np.array([int(overflowed)], np.uint64),
        },
    )


def pow2_votes(stream: Any, name: str) -> list[tuple[int, int, int]] | None:
    """A tensor's pow2 votes, ``[(type index (int8, uint8, int16), exponent, batches)]``."""
    parts = stream.export_summary(name, "pow2_votes")
    if parts is None:
        return None
    return list(zip(parts["type"].tolist(), parts["exponent"].tolist(), parts["batches"].tolist(), strict=True))

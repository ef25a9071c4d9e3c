"""isotone: PPQ's order-preserving calibration, from the per-row top-two summaries.

The last axis of a tensor is its class axis and every other position is a row. Collection keeps,
per tensor, the exact multiset of the rows' (largest, second largest) value pairs (the Rust
``methods::isotone`` module states the arithmetic); the scale is the one under which the most
rows keep their top value at least half a level above the second, without the second reaching the
clipping level. The range returned is the one onnxruntime's rule maps to that scale (zero point 0
when asymmetric). docs/methods.md gives the definition.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)


def isotone_ranges(stream: Any, names: Sequence[str], options: Mapping[str, Any]) -> list[tuple[float, float]]:
    """Per-tensor isotone ranges; a tensor with rows but none that any scale can separate falls back
    to ``(0, max(largest top value, 0))``, with a warning naming it."""
    out = []
    results = stream.isotone_ranges(list(names), qtype=options["qtype"], symmetric=bool(options["symmetric"]))
    for name, r in zip(names, results):
        if r.fell_back:
            logger.warning(
                "isotone: no scale keeps the top two values of any row of tensor %r apart (%d rows); "
                "using the range (0, largest top value)",
                name,
                r.rows,
            )
        else:
            logger.debug(
                "isotone: tensor %r: %d of %d rows kept in order (%d skipped)", name, r.satisfied, r.rows, r.skipped
            )
        out.append((r.low, r.high))
    return out

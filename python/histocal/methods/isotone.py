"""isotone: PPQ's order-preserving calibration, from the per-row top-two summaries.

The last axis of a tensor is its class axis and every other position is a row. Collection keeps,
per tensor, the exact multiset of the rows' (largest, second largest) value pairs (the Rust
``methods::isotone`` module states the arithmetic); the scale is the one under which the most
rows keep their top value at least half a level above the second, without the second reaching the
clipping level. The range returned is the one onnxruntime's rule maps to that scale (zero point 0
when asymmetric). docs/methods.md gives the definition.

Where isotone is not defined for a tensor its range is still PPQ's (or histocal's documented fallback),
but never silently: one warning per kind of case lists every tensor in it (see ``isotone_ranges``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

# Why isotone has no order-preserving scale for a tensor, and what its range is then.
NO_ROWS = (
    "no row of two finite values (every row NaN or infinite somewhere, or a single class, or no data): range (0, 0)"
)
NOT_SEPARABLE = (
    "no row whose top value any scale keeps apart from its second (ties, or a top value <= 0): "
    "range (0, max(largest top value, 0))"
)
ZERO_SCALE = (
    "the scale that keeps the most rows in order is 0 (their second values are all <= 0), "
    "so the range is (0, 0) (or (-0, 0))"
)
ADVICE = (
    "isotone is meant for classification outputs: give it to those tensors only (method_overrides / "
    "extra_options['MethodOverrides'] / --method-for, e.g. --method-for name:logits=isotone) and another "
    "method to the rest"
)


def isotone_ranges(stream: Any, names: Sequence[str], options: Mapping[str, Any]) -> list[tuple[float, float]]:
    """Per-tensor isotone ranges (docs/methods.md). A tensor with rows but none that any scale can
    separate falls back to ``(0, max(largest top value, 0))``; one without any row gets ``(0, 0)``;
    a zero scale gives ``(qmin * 0, qmax * 0)``. Each of these logs one warning per kind, naming every
    tensor of that kind (a model-wide isotone may have hundreds)."""
    out = []
    undefined: dict[str, list[str]] = {NO_ROWS: [], NOT_SEPARABLE: [], ZERO_SCALE: []}
    results = stream.summary_ranges(
        "isotone", list(names), qtype=options["qtype"], symmetric=bool(options["symmetric"])
    )
    for name, (low, high, notes) in zip(names, results):
        rows, skipped = notes["rows"], notes["skipped"]
        if rows == 0:
            undefined[NO_ROWS].append(f"{name!r} ({skipped} rows skipped)" if skipped else repr(name))
        elif notes["fell_back"]:
            undefined[NOT_SEPARABLE].append(repr(name))
        elif high == 0:
            undefined[ZERO_SCALE].append(repr(name))
        logger.debug(
            "isotone: tensor %r: %d of %d rows kept in order (%d skipped)", name, notes["satisfied"], rows, skipped
        )
        out.append((low, high))
    for why, tensors in undefined.items():
        if tensors:
            logger.warning("isotone: %d tensor(s) with %s: %s. %s", len(tensors), why, ", ".join(tensors), ADVICE)
    return out

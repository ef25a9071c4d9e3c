"""What Quark 0.13 does to a model's outputs before it calibrates on them (Quark 0.9 takes them
as they are): its ``sanitize_model_outputs``."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..calibrators.reduce_outputs import GatheredOutputs

logger = logging.getLogger(__name__)


def sanitized(name: str, batches: Any) -> Any:
    """Quark 0.13's ``sanitize_model_outputs`` on a tensor's outputs: with non-finite values, NaN
    becomes 0 and +-inf the largest / smallest value (NaN aside, so infinities stay: Quark's
    arithmetic); with no finite value at all, every value 0. An empty array stays as it is."""
    out = []
    for x in batches if isinstance(batches, (list, tuple)) else [batches]:
        x = np.asarray(x)
        if x.dtype.kind == "f" and x.size and not np.isfinite(x).all():
            logger.warning("tensor %r: non-finite values replaced as Quark 0.13 does (NaN by 0)", name)
            if np.isfinite(x).any():
                x = np.nan_to_num(x, nan=0.0, posinf=np.nanmax(x), neginf=np.nanmin(x))
            else:
                x = np.zeros_like(x)
        out.append(x)
    return out


def sanitize_first_batch(
    intermediate_outputs: list[Any], names: list[str], gathered: GatheredOutputs | None = None
) -> None:
    """Quark 0.13's MinMax calibrator: ``sanitize_model_outputs`` on the first batch a
    ``collect_data`` call buffered (only that one, in place), before onnxruntime's
    ``compute_data``. The batch's ReduceMin / ReduceMax outputs hold one value each (per tensor),
    so a non-finite one becomes 0: a tensor with no elements (ReduceMin +inf, ReduceMax -inf)
    gets the range (0, 0), and an infinity or NaN in the first batch's extremes counts as 0.
    ``names``: the outputs' names, for the warning (``None`` entries are left alone);
    ``gathered``: how the session gathered the per-tensor outputs, if it did (each element then
    one output's value)."""
    if not intermediate_outputs:
        return
    first = intermediate_outputs[0]
    if gathered is not None:
        # each element is one tensor's ReduceMin or ReduceMax, as ORT's one-value outputs
        start = len(first) - len(gathered.names)
        for k, members in enumerate(gathered.members):
            value = np.asarray(first[start + k])
            bad = ~np.isfinite(value)
            if bad.any():
                for j in np.flatnonzero(bad):
                    logger.warning("tensor %r: non-finite values replaced as Quark 0.13 does (NaN by 0)", members[j])
                first[start + k] = np.where(bad, np.zeros((), value.dtype), value)
        return
    for i, value in enumerate(first):
        if value is not None:
            first[i] = sanitized(names[i] if i < len(names) else str(i), [value])[0]

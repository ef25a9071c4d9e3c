"""A plain numpy reference for isotone (docs/methods.md, *isotone*): PPQ's observer read literally.

Rows: the tensor moved to ``(-1, classes)`` (the last axis is the class axis); each row's two largest
values by sorting it; rows with fewer than two values or a non-finite value are left out. Candidates:
Python's ``sorted`` of ``(scale, "min")`` / ``(scale, "max")`` tuples, one pair per separable row,
then PPQ's sweep. The range is the one onnxruntime's rule maps to that scale.
"""

from __future__ import annotations

import numpy as np

from .method_refs import qrange


def top_two(batches: list[np.ndarray]) -> tuple[list[tuple[float, float]], int]:
    """Every row's ``(largest, second largest)`` as float64, and the number of rows left out."""
    pairs, skipped = [], 0
    for batch in batches:
        a = np.asarray(batch)
        if a.ndim == 0:
            skipped += 1
            continue
        rows = a.reshape(-1, a.shape[-1]) if a.shape[-1] else np.zeros((0, 0), a.dtype)
        for row in rows.astype(np.float64):
            if len(row) < 2 or not np.all(np.isfinite(row)):
                skipped += 1
                continue
            top = np.sort(row)[::-1]
            pairs.append((float(top[0]) + 0.0, float(top[1]) + 0.0))
    return pairs, skipped


def positive_levels(qtype: str, symmetric: bool) -> int:
    qmin, qmax = qrange(qtype, symmetric)
    return qmax - int(np.round((qmin + qmax) / 2)) if symmetric else qmax


def isotone_scale(pairs: list[tuple[float, float]], qtype: str, symmetric: bool) -> float | None:
    """PPQ's choice: the first candidate in sorted order whose running count beats every earlier one."""
    q = positive_levels(qtype, symmetric)
    candidates = []
    for l1, l2 in pairs:
        if symmetric:
            l1, l2 = abs(l1), abs(l2)
        scale_min = max(l2, 0.0) / (q - 0.51)
        scale_max = 2 * (l1 - max(l2, 0.0))
        if scale_max > scale_min and l1 > 0:
            candidates += [(scale_min, "min"), (scale_max, "max")]
    if not candidates:
        return None
    best, best_scale, satisfied = 0, None, 0
    for value, kind in sorted(candidates):
        satisfied += 1 if kind == "min" else -1
        if satisfied > best:
            best, best_scale = satisfied, value
    return best_scale


def isotone_range(batches: list[np.ndarray], qtype: str = "int8", symmetric: bool = False) -> tuple[float, float]:
    pairs, _ = top_two(batches)
    scale = isotone_scale(pairs, qtype, symmetric)
    if scale is None:
        if not pairs:
            return 0.0, 0.0
        top = max(abs(p[0]) if symmetric else p[0] for p in pairs)
        return 0.0, max(top, 0.0)
    qmin, qmax = qrange(qtype, symmetric)
    if symmetric:
        a = scale * (qmax - qmin) / 2
        return -a, a
    return qmin * scale, qmax * scale

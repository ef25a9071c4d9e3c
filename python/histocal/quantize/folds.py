"""auto's evidence: the calibration feeds held back for scoring, and the candidates fitted without
each fold of them (shared by model-level auto and the recipe, which score the same folds)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnxruntime.quantization.calibrate import TensorsData

from ..io.readers import DataSource
from ..state import merge_states
from . import selection


def withholding_first(data: Any, kept: list[dict[str, np.ndarray]], limit: int) -> Iterator[Any]:
    """The feeds of one read of ``data`` except the first ``limit`` (over all reads), which are
    copied into ``kept`` instead: the reader's own buffers may be reused for its next feed."""
    for feed in DataSource(data).read():
        if len(kept) < limit and isinstance(feed, Mapping):
            kept.append({name: np.array(value, copy=True) for name, value in feed.items()})
        else:
            yield feed


def collect_unless_empty(calibrator: Any, feeds: Iterator[Any]) -> bool:
    """``calibrator.collect_data(feeds)`` unless ``feeds`` is empty (then it would raise); whether it collected."""
    end = object()
    first = next(feeds, end)
    if first is end:
        return False
    calibrator.collect_data(itertools.chain([first], feeds))
    return True


@dataclass(frozen=True)
class Folds:
    """The candidates and the feeds they are scored on.

    Attributes:
        candidates: every candidate's ranges from all the calibration data.
        folds: (candidates fitted without these feeds, the feeds) pairs.
        cross_validated: whether the folds are out of sample (two kept feeds or more).
    """

    candidates: Mapping[str, TensorsData]
    folds: Sequence[tuple[Mapping[str, TensorsData], Sequence[Any]]]
    cross_validated: bool


def fold_candidates(
    calibrator: Any, rest_collected: bool, kept: list[dict[str, np.ndarray]], folds: int, qtype: str, symmetric: bool
) -> Folds:
    """The candidates of ``calibrator`` (which collected the feeds beyond ``kept`` when
    ``rest_collected``), and per fold of ``kept`` (feed i in fold i mod ``folds``) the candidates
    fitted on all the data but that fold (one streaming pass over each fold; states merge exactly).
    With fewer than two kept feeds, one in-sample fold."""
    if not kept and not rest_collected:
        raise ValueError("No data is collected.")
    rest = calibrator.state if rest_collected else None
    fold_feeds = [kept[k :: min(folds, len(kept))] for k in range(min(folds, len(kept)))]
    fold_states = []
    for feeds in fold_feeds:
        calibrator.restart()
        calibrator.collect_data(iter(feeds))  # an iterator: streaming, like the pass over the reader
        fold_states.append(calibrator.state)
    if len(fold_feeds) >= 2:
        lazy, per_fold = selection.cross_validation_candidates(rest, fold_states, qtype, symmetric)
        return Folds(lazy, list(zip(per_fold, fold_feeds)), True)
    states = [s for s in [rest, *fold_states] if s is not None]
    candidates = selection.state_candidates(merge_states(*states), qtype, symmetric)
    return Folds(candidates, [(candidates, kept)], False)


__all__ = ["Folds", "collect_unless_empty", "fold_candidates", "withholding_first"]

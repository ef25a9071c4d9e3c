"""Choosing calibration ranges by the quantized model's output.

A candidate range set is scored by the model quantized with it (the caller's quantization settings;
computed on one shared scoring model, see Cost below), run on evaluation feeds, and comparing its outputs with the float
model's: the output SQNR

    10 log10(sum y^2 / sum (y - y_q)^2)

over every numeric graph output of every feed (y: float model, y_q: quantized model). Identical
outputs score +inf; a candidate whose quantized model fails to build or run, or gives a
non-finite output where the float model's is finite, scores -inf (so it loses). The highest
score wins; ties go to the earlier candidate. Within one set of feeds, candidates whose ranges
equal an earlier candidate's are not quantized again.

``select_ranges`` scores in sample: the candidates are scored on the feeds given, which may be
the feeds they were fitted on. ``select_ranges_cross_validated`` scores out of sample: each fold's
candidates were fitted without that fold's feeds, and a candidate's SQNR is pooled over the folds
(sum of signal energy over sum of error energy). Ranges scored on their own fitting data favour
tight clipping (a percentile that clips exactly the outliers it saw), which new inputs punish.

Cost, per set of feeds: one float-model run over them (whose outputs are kept while that set is
scored), then per distinct candidate one run over them on the shared scoring model
(``scoring``; one ``quantize_static`` per candidate where it cannot express one); cross-validated,
a candidate is run only while it can still pass the rule's sign test (``rule.cannot_qualify``).
Only running sums are kept per candidate.

``state_candidates`` computes auto's model-level candidates (``methods.MODEL_AUTO_CANDIDATES``)
from one calibration state. ``histocal.quantize_static(calibrate_method="auto")`` and the CLI's
``quantize --method auto --data`` use it with K-fold cross-validation (see
``histocal.quantize.integration.calibrate_and_select``).
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnxruntime.quantization.calibrate import TensorsData

from ..io.readers import Feed
from .candidates import LazyCandidates, cross_validation_candidates, state_candidates
from .ort import QUANTIZE_ARGUMENTS, QuantizationArgs, model_file
from .rule import (
    ALL_DATA_CANDIDATES,
    DEFAULT_CANDIDATE,
    GAIN_CAP_DB,
    MIN_GAIN_DB,
    SIGN_TEST_ALPHA,
    STANDARD_ERRORS,
    Decision,
    Evidence,
    cannot_qualify,
    choose_pooled,
    choose_robust,
    decide,
    evidence,
    feed_gains_db,
    min_informative,
    range_widths,
    sign_test_p,
)
from .runs import sqnr_db
from .scorer import SharedScoring

logger = logging.getLogger(__name__)

# quantize_static arguments the selection sets itself (the ranges come from each candidate).
_OWN_ARGUMENTS = (
    "model_input",
    "model_output",
    "calibration_data_reader",
    "calibrate_method",
    "calibration_cache_path",
    "tensors_range",
    "num_bins",
    "num_quantized_bins",
    "scenario",
    "mode",
    "streaming_bins",
    "method_options",
)


Fold = tuple[Mapping[str, TensorsData], Sequence[Feed]]  # (candidates fitted without these feeds, the feeds)


@dataclass(frozen=True)
class Selection:
    """The outcome of a selection: the chosen candidate's label and ranges, and every candidate's
    output SQNR (dB, candidate order; -inf for a failed candidate), cross-validated or in-sample.

    Attributes:
        label: the chosen candidate.
        ranges: its ranges.
        sqnr_db: every candidate's output SQNR (dB).
        eval_samples: the evaluation feeds scored.
        seconds: how long the scoring took.
        folds: cross-validation folds (0: scored in sample).
        feed_sqnr_db: per candidate, its SQNR on each evaluation feed, in fold order.
        range_widths: per candidate, how wide its ranges are.
        reason: why this candidate.
        quantizations: the onnxruntime quantizations the scoring made.
    """

    label: str
    ranges: TensorsData
    sqnr_db: dict[str, float]
    eval_samples: int
    seconds: float
    folds: int = 0  # cross-validation folds; 0: scored in sample
    # Per candidate, the output SQNR (dB) on each evaluation feed, in fold order (-inf where the
    # candidate failed); the cross-validated choice reads these (``choose_robust``).
    feed_sqnr_db: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # ``range_widths`` (how wide the ranges from all the data are) of the candidates the rule compares
    # by width: cross-validated, those that qualify (the others' all-data ranges are not computed).
    range_widths: dict[str, float] = field(default_factory=dict)
    reason: str = ""  # why this candidate (``decide``'s reason)
    quantizations: int = 0  # onnxruntime quantize_static calls the scoring made
    # Candidates scored on fewer feeds than ``eval_samples`` (it could no longer pass the sign test:
    # ``rule.cannot_qualify``), and on how many; their SQNR is over those feeds, NaN on the rest.
    stopped: dict[str, int] = field(default_factory=dict)

    @property
    def cross_validated(self) -> bool:
        """Whether the candidates were scored out of sample."""
        return self.folds > 0

    @property
    def scoring(self) -> str:
        """How the candidates were scored, in words."""
        return f"{self.folds}-fold cross-validated" if self.folds else "in-sample"

    def table(self) -> str:
        """The SQNR of every candidate, one line each, the chosen one marked.

        Returns:
            The table's text.
        """
        width = max(len(label) for label in self.sqnr_db)
        return "\n".join(
            f"{'*' if label == self.label else ' '} {label:<{width}}  {sqnr:8.2f} dB"
            + (
                f"  (scored on {self.stopped[label]} of {self.eval_samples} feeds: it could no longer qualify)"
                if label in self.stopped
                else ""
            )
            for label, sqnr in self.sqnr_db.items()
        )


def select_ranges(
    model_input: str | Path | onnx.ModelProto,
    feeds: Sequence[Feed],
    candidates: Mapping[str, TensorsData],
    *,
    providers: Sequence[Any] | None = None,
    **quantize_kwargs: Any,
) -> Selection:
    """In-sample selection: quantize ``model_input`` with each candidate's ranges and choose the
    candidate whose quantized model's outputs on ``feeds`` have the highest SQNR against the float
    model's (see the module docstring). ``quantize_kwargs`` are ``histocal.quantize_static``'s
    quantization arguments (quant_format, activation_type, weight_type, per_channel, reduce_range,
    op_types_to_quantize, nodes_to_quantize, nodes_to_exclude, use_external_data_format,
    extra_options, calibration_providers); ``providers`` run the float and quantized models
    (default: the CPU execution provider).

    Args:
        model_input: the float model (path or ModelProto).
        feeds: the evaluation feeds.
        candidates: the candidates' ranges by label.
        providers: onnxruntime execution providers.
        **quantize_kwargs: quantization arguments.

    Returns:
        The ``Selection``.

    Raises:
        ValueError: no feeds, no candidates, or every candidate failed to quantize or run.
        TypeError: an unknown quantization argument.
    """
    feeds = list(feeds)
    if not feeds:
        raise ValueError("select_ranges needs at least one evaluation feed")
    quantization = selection_arguments(quantize_kwargs)
    return select(model_input, [(candidates, feeds)], candidates, providers, quantization, cross_validated=False)


def select_ranges_cross_validated(
    model_input: str | Path | onnx.ModelProto,
    folds: Sequence[Fold],
    candidates: Mapping[str, TensorsData],
    *,
    providers: Sequence[Any] | None = None,
    **quantize_kwargs: Any,
) -> Selection:
    """Out-of-sample selection. Each fold is (candidate ranges fitted without its feeds, its
    feeds), with the labels of ``candidates``; a candidate's score is its output SQNR pooled over
    the folds (the sums of signal and error energy over every fold's feeds), so ranges are never
    scored on the data they were fitted on. The chosen candidate's ranges are returned from
    ``candidates`` (typically fitted on all the data).

    Args:
        model_input: the float model (path or ModelProto).
        folds: per fold, (its candidates' ranges by label, its feeds).
        candidates: the candidates' ranges (from all the data) by label.
        providers: onnxruntime execution providers.
        **quantize_kwargs: quantization arguments, as ``select_ranges``'s.

    Returns:
        The ``Selection``.

    Raises:
        ValueError: no folds, a fold without feeds or with other candidates, no candidates, or
            every candidate failed to quantize or run.
        TypeError: an unknown quantization argument.
    """
    fold_feeds = [(fold_candidates, list(feeds)) for fold_candidates, feeds in folds]
    if not fold_feeds or any(not feeds for _, feeds in fold_feeds):
        raise ValueError("select_ranges_cross_validated needs folds with at least one evaluation feed each")
    for fold_candidates, _ in fold_feeds:
        if list(fold_candidates) != list(candidates):
            raise ValueError(f"a fold's candidates {list(fold_candidates)} are not the candidates {list(candidates)}")
    quantization = selection_arguments(quantize_kwargs)
    return select(model_input, fold_feeds, candidates, providers, quantization, cross_validated=True)


def select(
    model_input: str | Path | onnx.ModelProto,
    folds: Sequence[Fold],
    candidates: Mapping[str, TensorsData],
    providers: Sequence[Any] | None,
    quantization: QuantizationArgs,
    cross_validated: bool,
    shared: SharedScoring | None = None,
) -> Selection:
    """``select_ranges``'s and ``select_ranges_cross_validated``'s selection, with the quantization
    arguments checked (``selection_arguments``): ``folds`` are (candidates, feeds) pairs.
    ``shared``: what selections on the same float model share (``scorer.SharedScoring``, whose
    model ``model_input`` then is); None: this selection's own."""
    if not candidates:
        raise ValueError("select_ranges needs at least one candidate range set")
    providers = list(providers) if providers else ["CPUExecutionProvider"]
    start = time.perf_counter()
    per_feed: dict[str, list[tuple[float, float]]] = {label: [] for label in candidates}  # (signal, noise)
    failures: dict[str, BaseException | None] = {}  # None: quantized, but its outputs cannot be compared
    left_out: set[str] = set()  # a fold's data cannot give it (``LazyCandidates``): as if never a candidate
    n = sum(len(feeds) for _, feeds in folds)
    default = DEFAULT_CANDIDATE if DEFAULT_CANDIDATE in candidates else next(iter(candidates))
    with tempfile.TemporaryDirectory(prefix="histocal.select.") if shared is None else nullcontext("") as tmp:
        if shared is None:
            shared = SharedScoring(model_file(model_input, Path(tmp)), providers, Path(tmp))
        scorer = shared.scorer(candidates, quantization)
        scored = 0
        for fold_candidates, feeds in folds:
            # Cross-validated, a candidate that fails the sign test whatever the feeds left say is
            # not scored on them (``cannot_qualify``): the choice is the same, at fewer runs.
            # Checked before the fold and after each of its feeds; the default is scored first.
            def hopeless(
                label: str, fold_scores: list[tuple[float, float]], fold_default: Any, before: int = scored
            ) -> bool:
                if not cross_validated or label == default or default in failures or fold_default is None:
                    return False  # a failed default: every candidate beats it
                done = per_feed[label] + fold_scores
                return _cannot_qualify(done, per_feed[default] + fold_default, n - before - len(fold_scores))

            # A fold's ranges are computed only for the candidates scored on it (``LazyCandidates``).
            active = {}
            for label in [default, *(label for label in fold_candidates if label != default)]:
                if label not in fold_candidates or label in failures or label in left_out:
                    continue
                if label != default and hopeless(label, [], []):
                    continue
                try:
                    active[label] = fold_candidates[label]
                except ValueError as not_given:
                    logger.warning("auto: candidate %r left out: %s", label, not_given)
                    left_out.add(label)
            # One fold's float outputs at a time: memory is that of the largest fold.
            energies = scorer.energies(list(feeds), active, hopeless)
            scored += len(feeds)
            for label, energy in energies.items():
                if isinstance(energy, list):
                    per_feed[label].extend(energy)
                elif failures.get(label) is None:  # an exception, if any, is the one to report
                    failures[label] = energy
    labels = [label for label in candidates if label not in left_out]
    sqnr = {
        label: -math.inf
        if label in failures
        else sqnr_db(sum(s for s, _ in per_feed[label]), sum(e for _, e in per_feed[label]))
        if per_feed[label]
        else math.nan
        for label in labels
    }
    # NaN: a feed a candidate was not scored on (it could no longer qualify): no evidence either way.
    feed_sqnr = {
        label: (-math.inf,) * n
        if label in failures
        else tuple(sqnr_db(s, e) for s, e in per_feed[label]) + (math.nan,) * (n - len(per_feed[label]))
        for label in labels
    }
    raised = {label: exc for label, exc in failures.items() if exc is not None}
    if len(raised) == len(sqnr):
        first, exc = next(iter(raised.items()))
        raise ValueError(f"auto: every candidate failed to quantize or run; {first!r}: {exc}") from exc
    if cross_validated:
        # Widths (and so the all-data ranges) only of the candidates the rule compares by them.
        qualifying = [
            label for label, e in evidence(feed_sqnr, default).items() if e.qualifies(SIGN_TEST_ALPHA, STANDARD_ERRORS)
        ]
        available = _computable(candidates, qualifying)
        feed_sqnr_known = {k: v for k, v in feed_sqnr.items() if k not in qualifying or k in available}
        widths = range_widths(available)
        decision = decide(feed_sqnr_known, default=default, widths=widths)
        chosen, reason = decision.label, decision.reason
    else:
        widths = range_widths(candidates)
        chosen, reason = choose_pooled(sqnr), "in sample: the highest pooled SQNR"
    selection = Selection(
        chosen,
        candidates[chosen],
        sqnr,
        n,
        time.perf_counter() - start,
        len(folds) if cross_validated else 0,
        feed_sqnr,
        widths,
        reason,
        scorer.new_quantizations(),  # a shared scorer's build: by the selection that built it
        {label: len(per_feed[label]) for label in labels if label not in failures and len(per_feed[label]) < n},
    )
    logger.info(
        "auto: output SQNR of each candidate, %s on %d evaluation feeds (chosen: %s, %.1f s: %s)\n%s",
        selection.scoring,
        n,
        chosen,
        selection.seconds,
        reason,
        selection.table(),
    )
    return selection


def _computable(candidates: Mapping[str, TensorsData], labels: Sequence[str]) -> dict[str, TensorsData]:
    """The ranges of these candidates (``LazyCandidates`` computes them now); one the data cannot
    give is left out with a warning (it cannot be chosen)."""
    out = {}
    for label in labels:
        try:
            out[label] = candidates[label]
        except ValueError as exc:
            logger.warning("auto: candidate %r left out: %s", label, exc)
    return out


def _cannot_qualify(scores: list[tuple[float, float]], default: list[tuple[float, float]], remaining: int) -> bool:
    """``rule.cannot_qualify`` on a candidate's (signal, noise) per feed so far against the default's."""
    gains = feed_gains_db(
        {"default": [sqnr_db(*e) for e in default[: len(scores)]], "candidate": [sqnr_db(*e) for e in scores]},
        "default",
    )["candidate"]
    return cannot_qualify(gains, remaining)


def selection_arguments(quantize_kwargs: Mapping[str, Any]) -> QuantizationArgs:
    """The quantization arguments a selection passes through, checked once (TypeError for a
    quantize_static argument the selection sets itself, or one that is none)."""
    own = sorted(set(quantize_kwargs) & set(_OWN_ARGUMENTS))
    if own:
        raise TypeError(f"auto's model-level choice sets {own} itself (the ranges come from the candidates)")
    unknown = sorted(set(quantize_kwargs) - set(QUANTIZE_ARGUMENTS))
    if unknown:
        raise TypeError(f"auto's model-level choice: unknown quantize_static arguments {unknown}")
    return QuantizationArgs(**quantize_kwargs)


__all__ = [
    "ALL_DATA_CANDIDATES",
    "DEFAULT_CANDIDATE",
    "GAIN_CAP_DB",
    "MIN_GAIN_DB",
    "SIGN_TEST_ALPHA",
    "STANDARD_ERRORS",
    "Decision",
    "Evidence",
    "LazyCandidates",
    "Selection",
    "cannot_qualify",
    "choose_pooled",
    "choose_robust",
    "cross_validation_candidates",
    "decide",
    "evidence",
    "feed_gains_db",
    "min_informative",
    "range_widths",
    "select_ranges",
    "select_ranges_cross_validated",
    "sign_test_p",
    "sqnr_db",
    "state_candidates",
]

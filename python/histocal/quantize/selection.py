"""Choosing calibration ranges by the quantized model's output.

A candidate range set is scored by quantizing the model with it (onnxruntime's ``quantize_static``
through ``histocal.quantize_static(tensors_range=...)``, with the caller's quantization settings),
running the quantized model on evaluation feeds, and comparing its outputs with the float
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
scored), then per distinct candidate one ``quantize_static`` and one run over them; only running
sums are kept per candidate.

``state_candidates`` computes auto's model-level candidates (``methods.MODEL_AUTO_CANDIDATES``)
from one calibration state. ``histocal.quantize_static(calibrate_method="auto")`` and the CLI's
``quantize --method auto --data`` use it with K-fold cross-validation (see
``histocal.quantize.integration.calibrate_and_select``).
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

from .. import methods
from ..io.readers import Feed, run_session
from .ort import QUANTIZE_ARGUMENTS, model_file, quantize_with_ranges

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
    output SQNR (dB, candidate order; -inf for a failed candidate), cross-validated or in-sample."""

    label: str
    ranges: TensorsData
    sqnr_db: dict[str, float]
    eval_samples: int
    seconds: float
    folds: int = 0  # cross-validation folds; 0: scored in sample
    # Per candidate, the output SQNR (dB) on each evaluation feed, in fold order (-inf where the
    # candidate failed); the cross-validated choice reads these (``choose_robust``).
    feed_sqnr_db: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # Per candidate, ``range_widths``: how wide its ranges (from all the data) are.
    range_widths: dict[str, float] = field(default_factory=dict)

    @property
    def cross_validated(self) -> bool:
        return self.folds > 0

    @property
    def scoring(self) -> str:
        return f"{self.folds}-fold cross-validated" if self.folds else "in-sample"

    def table(self) -> str:
        """The SQNR of every candidate, one line each, the chosen one marked."""
        width = max(len(label) for label in self.sqnr_db)
        return "\n".join(
            f"{'*' if label == self.label else ' '} {label:<{width}}  {sqnr:8.2f} dB"
            for label, sqnr in self.sqnr_db.items()
        )


def state_candidates(state: Any, qtype: str, symmetric: bool) -> dict[str, TensorsData]:
    """auto's model-level candidates (``methods.MODEL_AUTO_CANDIDATES``, with this qtype and
    symmetry) computed from one ``CalibrationState``, by label, in tie-breaking order. Each is a
    MinMax-style TensorsData (lowest/highest only), the way auto's ranges travel through ORT and
    its cache whichever candidate wins. A candidate the state cannot give (pow2 without clipping on a
    tensor whose range needs a scale its type cannot hold, such as a -3.4e38 attention-mask
    sentinel) is left out with a warning: the others can still be chosen."""
    out = {}
    for label, method, options in methods.model_candidate_options(qtype, symmetric):
        try:
            td = state.compute(method, **options)
        except ValueError as exc:
            logger.warning("auto: candidate %r left out: %s", label, exc)
            continue
        out[label] = TensorsData(
            CalibrationMethod.MinMax,
            {name: TensorData(lowest=d.lowest, highest=d.highest) for name, d in td.data.items()},
        )
    return out


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
    (default: the CPU execution provider)."""
    feeds = list(feeds)
    if not feeds:
        raise ValueError("select_ranges needs at least one evaluation feed")
    return _select(model_input, [(candidates, feeds)], candidates, providers, quantize_kwargs, cross_validated=False)


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
    ``candidates`` (typically fitted on all the data). Arguments as ``select_ranges``."""
    fold_feeds = [(fold_candidates, list(feeds)) for fold_candidates, feeds in folds]
    if not fold_feeds or any(not feeds for _, feeds in fold_feeds):
        raise ValueError("select_ranges_cross_validated needs folds with at least one evaluation feed each")
    for fold_candidates, _ in fold_feeds:
        if list(fold_candidates) != list(candidates):
            raise ValueError(f"a fold's candidates {list(fold_candidates)} are not the candidates {list(candidates)}")
    return _select(model_input, fold_feeds, candidates, providers, quantize_kwargs, cross_validated=True)


def choose_pooled(sqnr_db: Mapping[str, float]) -> str:
    """The first candidate of the highest pooled SQNR (the in-sample choice)."""
    chosen = next(iter(sqnr_db))
    for label, value in sqnr_db.items():
        if value > sqnr_db[chosen]:
            chosen = label
    return chosen


# The cross-validated choice's rule (see ``choose_robust``), chosen by benches/bench_auto_real.py.
DEFAULT_CANDIDATE = "minmax"  # ORT's default method: the widest ranges, which clip nothing seen
STANDARD_ERRORS = 1.0  # a candidate must beat the default by this many standard errors of its mean gain
GAIN_CAP_DB = 100.0  # per-feed gains are clipped to +-this (an exact or failed output is +-inf)


def feed_gains_db(feed_sqnr_db: Mapping[str, Sequence[float]], default: str) -> dict[str, np.ndarray]:
    """Per candidate, its SQNR minus the default's on each evaluation feed (dB; the signal is the
    same float output for both, so this is 10 log10 of the default's error energy over the
    candidate's). Both exact (+inf): 0; other infinities clipped to +-``GAIN_CAP_DB``."""
    base = np.asarray(feed_sqnr_db[default], np.float64)
    out = {}
    for label, values in feed_sqnr_db.items():
        v = np.asarray(values, np.float64)
        if v.shape != base.shape:
            raise ValueError(f"candidate {label!r} has {v.size} feed scores, the default {base.size}")
        with np.errstate(invalid="ignore"):
            gain = np.where(v == base, 0.0, v - base)  # inf - inf: equal scores gain nothing
        out[label] = np.clip(np.nan_to_num(gain, nan=0.0), -GAIN_CAP_DB, GAIN_CAP_DB)
    return out


def choose_robust(
    feed_sqnr_db: Mapping[str, Sequence[float]],
    *,
    default: str | None = None,
    standard_errors: float = STANDARD_ERRORS,
    widths: Mapping[str, float] | None = None,
) -> str:
    """The cross-validated choice: stay with the default candidate (``DEFAULT_CANDIDATE`` if it
    is one, else the first) unless another beats it consistently on the held-out feeds. Per
    candidate, the per-feed gains g_i over the default (``feed_gains_db``) give a lower confidence
    bound ``mean(g) - standard_errors * se`` (``se = sd(g) / sqrt(n)``); a candidate qualifies when
    that bound is above 0. A candidate with a failed feed (-inf) never qualifies. Of the qualifying
    candidates, the one of the highest bound is the best (ties: candidate order); with ``widths``
    (``range_widths`` of the candidates), the widest of the qualifying candidates whose mean gain
    is within one standard error of the best's mean is chosen instead (the one-standard-error
    rule toward the most conservative ranges; ties: candidate order). Why: the pooled SQNR over
    8-16 feeds ranks a candidate first on a gain that a few feeds carry, or on differences smaller
    than the feeds' spread, and new inputs then reverse the order; a bound on the paired gain keeps
    the choice on the default's wide ranges unless the gain is steady across feeds, and between
    candidates whose gains cross-validation cannot tell apart, the wider ranges clip less of what
    new inputs bring (measured: docs/methods.md, BENCHMARKS.md)."""
    if not feed_sqnr_db:
        raise ValueError("choose_robust needs at least one candidate")
    if default is None:
        default = DEFAULT_CANDIDATE if DEFAULT_CANDIDATE in feed_sqnr_db else next(iter(feed_sqnr_db))
    gains = feed_gains_db(feed_sqnr_db, default)
    qualifying: dict[str, tuple[float, float, float]] = {}  # label -> (bound, mean, standard error)
    for label, gain in gains.items():
        if label == default or not len(gain) or any(v == -math.inf for v in feed_sqnr_db[label]):
            continue
        se = float(gain.std(ddof=1)) / math.sqrt(len(gain)) if len(gain) > 1 else 0.0
        mean = float(gain.mean())
        if mean - standard_errors * se > 0.0:
            qualifying[label] = (mean - standard_errors * se, mean, se)
    if not qualifying:
        return default
    best = max(qualifying, key=lambda label: qualifying[label][0])  # the first of equal bounds
    if widths is None:
        return best
    _, best_mean, best_se = qualifying[best]
    near = [label for label, (_, mean, _) in qualifying.items() if mean >= best_mean - best_se]
    return max(near, key=lambda label: widths.get(label, -math.inf))


def range_widths(candidates: Mapping[str, TensorsData]) -> dict[str, float]:
    """Per candidate, how wide its ranges are: the mean over tensors of ``log2(max(high, 0) -
    min(low, 0))`` (the span a quantizer's range must cover, zero included), over the tensors
    whose span is finite and positive. Comparable between candidates of the same tensors."""
    out = {}
    for label, ranges in candidates.items():
        logs = []
        for d in ranges.data.values():
            low, high = float(np.min(d.lowest)), float(np.max(d.highest))
            span = max(high, 0.0) - min(low, 0.0)
            if 0.0 < span < math.inf:
                logs.append(math.log2(span))
        out[label] = float(np.mean(logs)) if logs else -math.inf
    return out


def _select(
    model_input: str | Path | onnx.ModelProto,
    folds: list[tuple[Mapping[str, TensorsData], list[Feed]]],
    candidates: Mapping[str, TensorsData],
    providers: Sequence[Any] | None,
    quantize_kwargs: Mapping[str, Any],
    cross_validated: bool,
) -> Selection:
    check_quantize_arguments(quantize_kwargs)
    if not candidates:
        raise ValueError("select_ranges needs at least one candidate range set")
    providers = list(providers) if providers else ["CPUExecutionProvider"]
    start = time.perf_counter()
    per_feed: dict[str, list[tuple[float, float]]] = {label: [] for label in candidates}  # (signal, noise)
    failures: dict[str, BaseException | None] = {}  # None: quantized, but its outputs cannot be compared
    with tempfile.TemporaryDirectory(prefix="histocal.select.") as tmp:
        model_path = model_file(model_input, Path(tmp))
        for fold_candidates, feeds in folds:
            # One fold's float outputs at a time: memory is that of the largest fold.
            energies = _energies(model_path, feeds, fold_candidates, providers, quantize_kwargs, Path(tmp))
            for label, energy in energies.items():
                if isinstance(energy, list):
                    per_feed[label].extend(energy)
                elif failures.get(label) is None:  # an exception, if any, is the one to report
                    failures[label] = energy
    sqnr = {
        label: -math.inf
        if label in failures
        else _sqnr_db(sum(s for s, _ in per_feed[label]), sum(e for _, e in per_feed[label]))
        for label in candidates
    }
    n = sum(len(feeds) for _, feeds in folds)
    feed_sqnr = {
        label: (-math.inf,) * n if label in failures else tuple(_sqnr_db(s, e) for s, e in per_feed[label])
        for label in candidates
    }
    raised = {label: exc for label, exc in failures.items() if exc is not None}
    if len(raised) == len(sqnr):
        first, exc = next(iter(raised.items()))
        raise ValueError(f"auto: every candidate failed to quantize or run; {first!r}: {exc}") from exc
    widths = range_widths(candidates)
    chosen = choose_robust(feed_sqnr, widths=widths) if cross_validated else choose_pooled(sqnr)
    selection = Selection(
        chosen,
        candidates[chosen],
        sqnr,
        n,
        time.perf_counter() - start,
        len(folds) if cross_validated else 0,
        feed_sqnr,
        widths,
    )
    logger.info(
        "auto: output SQNR of each candidate, %s on %d evaluation feeds (chosen: %s, %.1f s)\n%s",
        selection.scoring,
        n,
        chosen,
        selection.seconds,
        selection.table(),
    )
    return selection


def _energies(
    model_path: Path,
    feeds: list[Feed],
    candidates: Mapping[str, TensorsData],
    providers: list[Any],
    quantize_kwargs: Mapping[str, Any],
    tmp: Path,
) -> dict[str, list[tuple[float, float]] | BaseException | None]:
    """Per candidate, (sum y^2, sum (y - y_q)^2) of each feed of ``feeds``; the exception if its model failed
    to build or run; None if its outputs cannot be compared (see ``squared_sums``). Candidates
    whose ranges equal an earlier one's are not quantized again."""
    reference = _Reference(model_path, feeds, providers)
    out: dict[str, list[tuple[float, float]] | BaseException | None] = {}
    seen: list[tuple[Any, str]] = []  # (ranges key, label) of the candidates evaluated
    for i, (label, ranges) in enumerate(candidates.items()):
        key = _ranges_key(ranges)
        same = next((other for k, other in seen if k == key), None)
        if same is not None:
            logger.debug("auto: candidate %r has the ranges of %r", label, same)
            out[label] = out[same]
            continue
        seen.append((key, label))
        workdir = tmp / f"candidate{i}"
        workdir.mkdir()
        try:
            quantized = workdir / "model.onnx"
            quantize_with_ranges(model_path, quantized, ranges, **quantize_kwargs)
            out[label] = reference.feed_energies(quantized)
        except Exception as exc:  # ORT's quantizer or session on this candidate's ranges
            logger.warning("auto: candidate %r failed, it cannot be chosen: %s", label, exc)
            out[label] = exc
        finally:
            shutil.rmtree(workdir, ignore_errors=True)  # disk: one quantized model at a time
    return out


def _sqnr_db(signal: float, noise: float) -> float:
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def check_quantize_arguments(quantize_kwargs: Mapping[str, Any]) -> None:
    """TypeError unless these are quantize_static arguments a selection may pass through."""
    own = sorted(set(quantize_kwargs) & set(_OWN_ARGUMENTS))
    if own:
        raise TypeError(f"auto's model-level choice sets {own} itself (the ranges come from the candidates)")
    unknown = sorted(set(quantize_kwargs) - set(QUANTIZE_ARGUMENTS))
    if unknown:
        raise TypeError(f"auto's model-level choice: unknown quantize_static arguments {unknown}")


def _ranges_key(ranges: TensorsData) -> tuple:
    """What the quantizer reads from a TensorsData: the method and each tensor's lowest/highest."""
    items = []
    for name in sorted(ranges.data):
        d = ranges.data[name]
        items.append((name, *(np.asarray(getattr(d, a, np.nan)).tobytes() for a in ("lowest", "highest"))))
    return (str(ranges.calibration_method), tuple(items))


def _session(path: Path, providers: list[Any]) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(path.as_posix(), options, providers=providers)


class _Reference:
    """The float model's outputs on the evaluation feeds, and the SQNR of a quantized model's."""

    def __init__(self, model_path: Path, feeds: list[Feed], providers: list[Any]) -> None:
        self.feeds = feeds
        self.providers = providers
        session = _session(model_path, providers)
        names = [o.name for o in session.get_outputs()]
        self.outputs: list[list[np.ndarray]] = []
        numeric: list[str] | None = None
        for i, feed in enumerate(feeds):
            arrays = dict(zip(names, run_session(session, names, feed, i)))
            if numeric is None:
                # Sequences, maps and strings have no SQNR: only numeric tensors count.
                numeric = [n for n in names if isinstance(arrays[n], np.ndarray) and arrays[n].dtype.kind in "biuf"]
                if not numeric:
                    raise ValueError(f"auto: the model has no numeric tensor output to compare (outputs {names})")
            self.outputs.append([arrays[n] for n in numeric])
        self.names = numeric or []

    def feed_energies(self, quantized: Path) -> list[tuple[float, float]] | None:
        """Per feed, (sum y^2, sum (y - y_q)^2) over a quantized model's outputs; None if they
        cannot be compared."""
        session = _session(quantized, self.providers)
        out = []
        for i, (feed, reference) in enumerate(zip(self.feeds, self.outputs)):
            got = run_session(session, self.names, feed, i)
            signal = noise = 0.0
            for name, y, yq in zip(self.names, reference, got):
                part = squared_sums(y, yq)
                if part is None:
                    logger.debug("auto: %s output %r of sample %d differs where it must not", quantized, name, i)
                    return None
                signal += part[0]
                noise += part[1]
            out.append((signal, noise))
        return out


def squared_sums(reference: np.ndarray, quantized: Any) -> tuple[float, float] | None:
    """(sum y^2, sum (y - y_q)^2) over the finite values of the reference; None when the outputs
    cannot be compared: another shape, a non-finite quantized value where the reference is finite,
    or a different value where the reference is not finite."""
    y = np.asarray(reference, np.float64).ravel()
    yq = np.asarray(quantized)
    if yq.shape != reference.shape or yq.dtype.kind not in "biuf":
        return None
    yq = yq.astype(np.float64).ravel()
    finite = np.isfinite(y)
    if not finite.all():
        if not np.array_equal(y[~finite], yq[~finite], equal_nan=True):
            return None
        y, yq = y[finite], yq[finite]
    if not np.isfinite(yq).all():
        return None
    diff = y - yq
    return float(np.dot(y, y)), float(np.dot(diff, diff))


__all__ = ["Selection", "select_ranges", "select_ranges_cross_validated", "state_candidates"]

"""Scoring candidate range sets on feeds (``selection``'s runs), and what several selections on
one float model share.

A ``Scorer`` scores on one ``scoring.ScoringModel`` session (the QDQ model with its range-dependent
initializers as inputs, built once from the base candidate) where it can, else by one
``quantize_static`` per candidate.

``SharedScoring`` is what the recipe's selections share (issue 37): it scores every placement on
the default candidate, then every candidate under the chosen placement, all on the same float model
and the same folds. Each of those selections used to build its own scoring model (one
``quantize_static`` of the whole model, per-channel weights included: most of the recipe's time on
MiniLM) and run the float model on every fold again. Shared, the float session and its outputs on
each set of feeds are computed once, and a scorer is built once per (quantization arguments, base
ranges): the chosen placement's scorer from its placement pass scores its other candidates. The
scores are the same: the scorer for a key is the one a selection would build itself (the same
quantization of the same ranges), and the float outputs of a feed are the same run to run.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np
from onnxruntime.quantization.calibrate import TensorsData

from ..io.models import written_files
from ..io.readers import Feed
from . import runs
from .ort import QuantizationArgs, quantize_with_ranges
from .rule import DEFAULT_CANDIDATE
from .scoring import ScoringModel, build_scoring_model, quantize_base

logger = logging.getLogger(__name__)

Energies = list[tuple[float, float]]


class SharedScoring:
    """The float model's session, its outputs per set of feeds, and the scorers, shared by the
    selections on ``model_path`` (module docstring). ``tmp`` must outlive it."""

    def __init__(self, model_path: Path, providers: list[Any], tmp: Path) -> None:
        self.model_path = model_path
        self.providers = providers
        self.tmp = tmp
        self._float_session: Any = None
        # Keyed by the feeds' identities; the feeds are kept with their outputs, so that an
        # identity is never reused while its entry lives.
        self._references: dict[tuple[int, ...], tuple[list[Feed], runs.ReferenceOutputs]] = {}
        self._scorers: dict[tuple[str, tuple], Scorer] = {}
        self._built = 0

    def reference(self, feeds: list[Feed], pool: Executor | None) -> runs.ReferenceOutputs:
        """The float model's outputs on ``feeds`` (run once per set of feeds)."""
        key = tuple(id(f) for f in feeds)
        if key not in self._references:
            if self._float_session is None:
                self._float_session = runs.session(self.model_path, self.providers)
            self._references[key] = (feeds, runs.ReferenceOutputs(self._float_session, feeds, pool))
        return self._references[key][1]

    def scorer(self, candidates: Mapping[str, TensorsData], quantization: QuantizationArgs) -> Scorer:
        """The scorer of ``quantization`` whose scoring model is built on ``candidates``' base
        candidate (the default, else the first): built on first use."""
        base = _base(candidates)
        key = (repr(quantization), ranges_key(candidates[base]))
        if key not in self._scorers:
            self._built += 1
            workdir = self.tmp / f"scorer{self._built}"
            workdir.mkdir()
            self._scorers[key] = Scorer(self, candidates[base], quantization, workdir)
        return self._scorers[key]

    def built_twin(self, scorer: Scorer) -> Scorer | None:
        """A scorer already built (its scoring model made) on ``scorer``'s base ranges whose base
        QDQ model's files are ``scorer``'s, byte for byte; None if none is."""
        return next(
            (
                other
                for other in self._scorers.values()
                if other is not scorer
                and other.twin is None
                and other.base_key == scorer.base_key
                and other.base_files() == scorer.base_files()  # sizes first: a digest reads every byte
                and other.base_digest() is not None
                and other.base_digest() == scorer.base_digest()
            ),
            None,
        )

    def keep_only(self, *quantizations: QuantizationArgs) -> None:
        """Drops the scorers of other quantization arguments than ``quantizations`` (their sessions'
        and dequantized weights' memory: the recipe keeps the best placement's so far and the next
        ones'), and their files."""
        kept = {repr(q) for q in quantizations}
        for key in [k for k in self._scorers if k[0] not in kept]:
            shutil.rmtree(self._scorers.pop(key).tmp, ignore_errors=True)


class Scorer:
    """Scores candidate range sets on feeds: on one ``scoring.ScoringModel`` session where it can,
    else by one ``quantize_static`` per candidate (``quantizations`` counts them all).

    Its base QDQ model (onnxruntime's, under the base ranges) is written first. Where it is, byte
    for byte, the base QDQ model of a scorer already built on the same base ranges (a placement
    whose operator types change nothing on this model: on MTCNN's ONet onnxruntime's and the compute
    operators' placements give the same graph), the base ranges' scores are that scorer's, and the
    scoring model and its session are built only if other ranges are asked for."""

    def __init__(self, shared: SharedScoring, base: TensorsData, quantization: QuantizationArgs, tmp: Path) -> None:
        self.shared = shared
        self.quantization = quantization
        self.tmp = tmp
        self.quantizations = 0
        self._reported = 0
        self.lock = threading.Lock()
        # The energies of a first candidate, by its ranges and the feeds' identities (which the
        # shared references keep alive).
        self._complete: dict[tuple[Any, tuple[int, ...]], Energies | BaseException | None] = {}
        self._workdir = tmp / "scoring"
        self._workdir.mkdir()
        self._base = base
        self.base_key = ranges_key(base)
        self._base_digest: bytes | None = None
        self._qdq: Path | None = None
        self._model: ScoringModel | None = None
        self._session: Any = None
        self._weights: dict[str, np.ndarray] = {}
        self._built = False
        self.twin: Scorer | None = None
        self._build_lock = threading.Lock()  # not ``lock``: ``_score`` holds that one when it asks
        try:
            self._qdq = quantize_base(shared.model_path, base, self._workdir, quantization)
            if self._qdq is not None:  # QOperator: no scoring model, nothing quantized yet
                self.quantizations += 1
        except Exception as exc:  # the base candidate's quantization: each candidate gets its own try
            logger.warning("auto: no shared scoring model (%s): every candidate is quantized on its own", exc)
            self._built = True
            return
        if self._qdq is not None:
            self.twin = shared.built_twin(self)
        if self.twin is None:
            self._build()

    def base_files(self) -> tuple[tuple[str, int], ...]:
        """The base QDQ model's files (name and size; none written: empty)."""
        return () if self._qdq is None else tuple((f.name, f.stat().st_size) for f in written_files(self._qdq))

    def base_digest(self) -> bytes | None:
        """SHA-256 of the base QDQ model's files (None: none written), read when first asked: only
        where another scorer has the same base ranges."""
        if self._base_digest is None and self._qdq is not None:
            self._base_digest = _files_digest(self._qdq)
        return self._base_digest

    def _build(self) -> None:
        """The scoring model and its session, on first need."""
        with self._build_lock:
            if self._built:
                return
            try:
                self._model = build_scoring_model(
                    self.shared.model_path, self._base, self._workdir, self.quantization, self._qdq
                )
                if self._model is not None:
                    self._session = runs.session(self._model.path, self.shared.providers, quantized=True)
                    self._weights = self._model.weights
            except Exception as exc:
                logger.warning("auto: no shared scoring model (%s): every candidate is quantized on its own", exc)
                self._model = None
            self._built = True

    @property
    def model(self) -> ScoringModel | None:
        """The scoring model (None: every candidate quantized on its own)."""
        self._build()
        return self._model

    @property
    def session(self) -> Any:
        """The scoring model's session."""
        self._build()
        return self._session

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """The scoring model's dequantized weights, fed with every run."""
        self._build()
        return self._weights

    def new_quantizations(self) -> int:
        """The ``quantize_static`` calls made since the last time this was asked."""
        new, self._reported = self.quantizations - self._reported, self.quantizations
        return new

    def energies(
        self,
        feeds: list[Feed],
        candidates: Mapping[str, TensorsData],
        hopeless: Callable[[str, Energies, Any], bool] | None = None,
    ) -> dict[str, Energies | BaseException | None]:
        """Per candidate, (sum y^2, sum (y - y_q)^2) of each feed; the exception if its model
        failed to build or run; None if its outputs cannot be compared (see ``squared_sums``).
        Candidates whose ranges equal an earlier one's are scored once. ``hopeless(label, its
        energies so far, the first candidate's)``: stop scoring it on the rest of the feeds
        (its list is then shorter). The runs go on ``runs.run_threads()`` threads: the first
        candidate's feeds at once, then the others side by side, each over its feeds in order,
        so that where it stops depends on its own energies and the first's alone. Only the base
        ranges, on a scorer whose base model is a twin's: the twin's scores (class docstring)."""
        if (
            self.twin is not None
            and not self._built
            and all(ranges_key(r) == self.base_key for r in candidates.values())
        ):
            return self.twin.energies(feeds, candidates, hopeless)
        pool = runs.run_pool()
        reference = self.shared.reference(feeds, pool)
        distinct: dict[str, tuple[int, TensorsData]] = {}
        same_as: dict[str, str] = {}
        seen: list[tuple[Any, str]] = []  # (ranges key, label) of the candidates evaluated
        keys: dict[str, Any] = {}
        # Compared on the tensors the scoring model reads: the recipe computes some candidates
        # only for those (``LazyCandidates.restricted``), and one equal to another there is
        # the same quantized model.
        tensors = self.model.range_tensors if self.model is not None else None
        for i, (label, ranges) in enumerate(candidates.items()):
            key = keys[label] = ranges_key(ranges, tensors)
            same = next((other for k, other in seen if k == key), None)
            if same is not None:
                logger.debug("auto: candidate %r has the ranges of %r", label, same)
                same_as[label] = same
            else:
                seen.append((key, label))
                distinct[label] = (i, ranges)
        done: dict[str, Energies | BaseException | None] = {}
        first_label = next(iter(distinct), None)
        if first_label is not None:  # never stopped: there is no first candidate to compare it with
            # Scored on every feed: kept, since the recipe scores the default candidate of the
            # chosen placement on the same folds twice (its placement pass, then its methods).
            complete = (keys[first_label], tuple(id(f) for f in feeds))
            if complete not in self._complete:
                self._complete[complete] = self._score(reference, first_label, *distinct[first_label], None, pool)
            done[first_label] = self._complete[complete]
        first = done.get(first_label) if first_label is not None else None
        rest = [label for label in distinct if label != first_label]

        def score(label: str) -> Energies | BaseException | None:
            def until(scores: Energies) -> bool:
                return hopeless is not None and hopeless(label, scores, first if isinstance(first, list) else None)

            return self._score(reference, label, *distinct[label], until, None)

        done.update(zip(rest, runs.run_all(pool, lambda k: score(rest[k]), len(rest))))
        return {label: done[same_as.get(label, label)] for label in candidates}

    def biased_energies(
        self, feeds: list[Feed], ranges: TensorsData, biases: Mapping[str, np.ndarray] | None
    ) -> Energies | None:
        """Per feed, (sum y^2, sum (y - y_q)^2) of the model quantized with ``ranges`` and float
        biases ``biases`` (by initializer name; the others the model's) in place of its own, on the
        scoring model; None where it cannot express them (no scoring model, a weight scale onnxruntime
        would enlarge, outputs that cannot be compared)."""
        if self.model is None:
            return None
        with self.lock:
            parameters = self.model.parameters(ranges, biases)
        if parameters is None:
            return None
        pool = runs.run_pool()
        reference = self.shared.reference(feeds, pool)
        return reference.feed_energies(self.session, {**parameters, **self.weights}, None, pool)

    def _score(
        self,
        reference: runs.ReferenceOutputs,
        label: str,
        i: int,
        ranges: TensorsData,
        until: Callable[[Energies], bool] | None,
        pool: Executor | None,
    ) -> Energies | BaseException | None:
        try:
            with self.lock:  # the parameter arithmetic and onnxruntime's quantizer are not thread-safe
                parameters = self.model.parameters(ranges) if self.model is not None else None
                if parameters is None:
                    workdir = self.tmp / f"candidate{i}"
                    workdir.mkdir(exist_ok=True)
                    try:
                        quantized = workdir / "model.onnx"
                        quantize_with_ranges(self.shared.model_path, quantized, ranges, self.quantization)
                        self.quantizations += 1
                        session = runs.session(quantized, self.shared.providers, quantized=True)
                    finally:
                        shutil.rmtree(workdir, ignore_errors=True)  # disk: the session holds the model
            if parameters is not None:
                return reference.feed_energies(self.session, {**parameters, **self.weights}, until, pool)
            return reference.feed_energies(session, {}, until, pool)
        except Exception as exc:  # ORT's quantizer or session on this candidate's ranges
            logger.warning("auto: candidate %r failed, it cannot be chosen: %s", label, exc)
            return exc


def _files_digest(model: Path) -> bytes:
    """SHA-256 over ``written_files(model)``, names and contents."""
    digest = hashlib.sha256()
    for path in written_files(model):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.digest()


def _base(candidates: Mapping[str, TensorsData]) -> str:
    return DEFAULT_CANDIDATE if DEFAULT_CANDIDATE in candidates else next(iter(candidates))


def ranges_key(ranges: TensorsData, tensors: Collection[str] | None = None) -> tuple:
    """What the quantizer reads from a TensorsData: the method and each tensor's lowest/highest
    (of ``tensors`` only, if given: those a scoring model's parameters come from)."""
    items = []
    for name in sorted(ranges.data):
        if tensors is not None and name not in tensors:
            continue
        d = ranges.data[name]
        items.append((name, *(np.asarray(getattr(d, a, np.nan)).tobytes() for a in ("lowest", "highest"))))
    return (str(ranges.calibration_method), tuple(items))


__all__ = ["Scorer", "SharedScoring", "ranges_key"]

"""``recipe="best"``: the best int8 QDQ model histocal can find, in onnxruntime's own format.

The steps (docs/methods.md, "The recipe"), each a measurement on the calibration feeds only:

1. **Keep** the first ``eval_samples`` calibration feeds in memory (auto's evidence).
2. **Prepare** the model (``preparation``): Constant-node weights to initializers, opset 13,
   onnxruntime's pre-processing (BatchNorm folded), its outputs checked against the float model's
   on the kept feeds.
3. **Calibrate** the prepared model once (one streaming pass over the rest of the reader, one per
   fold of the kept feeds), giving auto's candidates (``folds``).
4. **Score** every candidate under every placement (``placement``: onnxruntime's, the compute
   operators', and NNCF's transformer placement where a Softmax reads attention scores), with
   symmetric per-channel weights, cross-validated on the kept feeds, on the pre-activation logits
   where the outputs are Softmax or Sigmoid (``logits``). Per placement auto's rule chooses the
   method (never below minmax without evidence); a placement other than onnxruntime's is kept only
   if its choice beats the one kept so far (onnxruntime's first, in ``placements``' order) by
   ``MIN_GAIN_DB`` pooled.
5. **Correct the biases** (``bias_correction``): each Conv, ConvTranspose and Gemm's own mean output
   error under the chosen placement and ranges moved into its bias, kept only if auto's evidence
   rule prefers it on the held-out folds.
6. **Leave in float** the few nodes whose quantization still costs most (``exclusion``, diagnose's
   search, on the kept feeds, on the corrected model under the chosen placement and ranges): each
   group of nodes must gain ``EXCLUSION_MIN_GAIN_DB`` on the switched model and all of them together
   on onnxruntime's model, at most ``EXCLUSION_MAX_FRACTION`` of the quantized nodes. A node left in
   float keeps its own bias (it has no quantization error to correct).

The result (the prepared model, the ranges, the quantization arguments) goes to
``quantize_with_ranges`` like every other route's.
"""

from __future__ import annotations

import itertools
import logging
import math
import tempfile
import time
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData

from .. import calibrators
from ..io.models import load_model, save_model
from ..methods.settings import METHOD_OPTIONS_KEY, CollectionSettings
from . import runs, selection
from .bias_correction import CORRECTED, BiasCorrection, correct_biases, twin_session, write_corrected
from .candidates import LazyCandidates
from .exclusion import DiagnosisRun
from .folds import Folds, fold_candidates, withholding_first
from .logits import logits_model
from .ort import QuantizationArgs, quantize_with_ranges
from .placement import Placement, placements
from .preparation import Preparation, prepare_model
from .rule import DEFAULT_CANDIDATE, MIN_GAIN_DB, decide
from .scorer import Scorer, SharedScoring
from .switches import quantized_nodes
from .weight_memo import shared_weight_quantization

logger = logging.getLogger(__name__)

RECIPES = ("ort", "best")  # "ort": onnxruntime's quantization as given (the default)
# Calibration feeds kept for scoring when the caller gives no eval_samples: half of auto's 16, so
# the recipe's scoring stays within a few times onnxruntime's quantize_static (BENCHMARKS.md).
RECIPE_EVAL_SAMPLES = 8
# The evidence step (``_left_in_float``): a group of nodes stays float only for a clear gain of its
# own, half a decibel (leaving an operator in float gives up its int8 weights and kernel: five times
# auto's MIN_GAIN_DB), for few nodes, on a short screen (a dominant tensor is found in about
# log2(n) runs).
EXCLUSION_MIN_GAIN_DB = 0.5
EXCLUSION_MAX_FRACTION = 0.05
EXCLUSION_SCREEN_SAMPLES = 2
EXCLUSION_SCREEN_RUNS = 32
EXCLUSION_CHECKS = 8
EXCLUSION_EXACT_CHECKS = 2
# The screen splits only groups whose quantization noise could still hold such a gain: leaving one
# tensor in float removes its share f of the noise, -10 log10(1 - f) dB, which reaches
# EXCLUSION_MIN_GAIN_DB at f = 11%; half of that, since a node left in float also returns its
# neighbouring tensors to float. diagnose ranks tensors down to 0.2% (``exclusion.SCREEN_MIN_SHARE``).
EXCLUSION_SCREEN_MIN_SHARE = (1 - 10 ** (-EXCLUSION_MIN_GAIN_DB / 10)) / 2
QUANTIZED, IN_FLOAT = "quantized", "left in float"


@dataclass(frozen=True)
class Recipe:
    """What ``recipe="best"`` chose.

    Attributes:
        model: the prepared model's file (the one quantized), its biases corrected where
            ``bias_correction`` says so.
        ranges: the chosen ranges (from all the calibration data), of the tensors the chosen
            placement's parameters come from (minmax and distribution: of every tensor).
        quantization: the quantization arguments the model is quantized with.
        preparation: what preparing the model did.
        placement: the chosen placement's label.
        method: auto's chosen candidate under it.
        sqnr_db: per placement, the default candidate's (minmax) cross-validated SQNR on the kept
            feeds (dB), and under ``"chosen"`` the chosen method's under the chosen placement.
        scored_on_logits: whether the scores are on the pre-activation logits.
        left_in_float: the nodes the evidence step leaves in float (also in
            ``quantization.nodes_to_exclude``).
        bias_correction: whether the biases were corrected, and why.
    """

    model: Path
    ranges: TensorsData
    quantization: QuantizationArgs
    preparation: Preparation
    placement: str
    method: str
    sqnr_db: dict[str, float]
    scored_on_logits: bool
    left_in_float: tuple[str, ...]
    bias_correction: BiasCorrection


def check_recipe(recipe: str) -> str:
    """``recipe`` if it is one of ``RECIPES``; ValueError otherwise."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe {recipe!r}: expected one of {', '.join(map(repr, RECIPES))}")
    return recipe


def _save(model: onnx.ModelProto, path: Path) -> Path:
    save_model(model, path)
    return path


def _chosen(scores: Mapping[str, tuple[Placement, QuantizationArgs, Any]]) -> str:
    """onnxruntime's placement (the first) unless another's choice beats it by ``MIN_GAIN_DB``."""
    labels = list(scores)
    best = labels[0]
    for label in labels[1:]:
        if _sqnr(scores[label][2]) > _sqnr(scores[best][2]) + MIN_GAIN_DB:
            best = label
    return best


def _sqnr(chosen: Any) -> float:
    value = chosen.sqnr_db.get(chosen.label, float("nan"))
    return -float("inf") if np.isnan(value) else value


def _left_in_float(
    searched: Path,
    float_model: onnx.ModelProto,
    ranges: TensorsData,
    kept: list[dict[str, np.ndarray]],
    providers: Any,
    placed: QuantizationArgs,
    workdir: Path,
    quantized: onnx.ModelProto | None,
) -> tuple[list[str], Path | None]:
    """The nodes the exclusion search (``exclusion``, diagnose's) leaves in float under the chosen
    placement and ranges, on the kept feeds: each group of nodes must gain ``EXCLUSION_MIN_GAIN_DB``
    on the switched model and the whole onnxruntime's quantized model, at most
    ``EXCLUSION_MAX_FRACTION`` of the quantized nodes; then auto's rule (``rule.decide``: the sign
    test over the feeds and the standard error) must prefer onnxruntime's model with them in float
    to the one without, feed by feed. ``searched``: the model searched (biases corrected, if so);
    ``float_model``: its model, loaded. ``quantized``: onnxruntime's QDQ model of ``searched`` under
    ``placed`` and ``ranges`` if known (``DiagnosisRun``'s), which also tells when the bound leaves
    nothing to search. Returns the nodes, and the file of onnxruntime's model of ``searched``
    with them in float where the search quantized it (removed with ``workdir``)."""
    if quantized is not None:
        nodes = len(quantized_nodes(quantized))
        if math.floor(EXCLUSION_MAX_FRACTION * nodes + 1e-9) == 0:
            logger.info(
                "recipe: no node left in float: %d quantized nodes, %.0f%% of them less than one",
                nodes,
                100 * EXCLUSION_MAX_FRACTION,
            )
            return [], None
    workdir.mkdir()
    run = DiagnosisRun(
        searched,
        float_model,
        ranges,
        kept,
        list(providers or ["CPUExecutionProvider"]),
        placed,
        workdir,
        quantized,
    )
    _, excluded, sqnr, sqnr_excluded, counts, screen_runs, *_ = run.diagnose(
        None,
        screen_samples=EXCLUSION_SCREEN_SAMPLES,
        max_screen_runs=EXCLUSION_SCREEN_RUNS,
        max_checks=EXCLUSION_CHECKS,
        max_exact_checks=EXCLUSION_EXACT_CHECKS,
        min_gain_db=EXCLUSION_MIN_GAIN_DB,
        target=None,
        max_fraction=EXCLUSION_MAX_FRACTION,
        seconds={},
        screen_min_share=EXCLUSION_SCREEN_MIN_SHARE,
    )
    reason = ""
    if excluded:
        # Each feed on its own, as the recipe's other choices: auto's rule on onnxruntime's models.
        measured = run.feed_sqnr_db
        decision = decide(
            {QUANTIZED: measured[()], IN_FLOAT: measured[tuple(excluded)]}, default=QUANTIZED, feeds="kept feeds"
        )
        reason = decision.reason
        if decision.label != IN_FLOAT:
            excluded, sqnr_excluded = [], sqnr
    logger.info(
        "recipe: %d of %d quantized nodes left in float by evidence (%.2f -> %.2f dB on %d kept feeds, %d screen runs)"
        "%s%s",
        len(excluded),
        counts["nodes"],
        sqnr,
        sqnr_excluded,
        len(kept),
        screen_runs,
        f": {', '.join(excluded)}" if excluded else "",
        f" ({reason})" if reason else "",
    )
    return list(excluded), run.checked_model(excluded) if excluded else None


def _quantized_model(
    scorer: Scorer, ranges: TensorsData, correction: BiasCorrection, searched: onnx.ModelProto
) -> onnx.ModelProto | None:
    """onnxruntime's QDQ model of ``searched`` (the scorer's model with ``correction`` written in)
    under the scorer's quantization and ``ranges``, from the scorer's scoring model
    (``ScoringModel.quantized_model``); None where it cannot give it: no scoring model, or a
    corrected bias that ``write_corrected`` gave its own initializer (one other nodes read too),
    which onnxruntime's model of ``searched`` names otherwise."""
    if scorer.model is None:
        return None
    nodes = {n.name: n for n in searched.graph.node if n.name}
    for name, (node, _, _) in correction.biases.items():
        reader = nodes.get(node)
        if reader is None or len(reader.input) < 3 or reader.input[2] != name:
            return None
    return scorer.model.quantized_model(ranges, {name: values for name, (_, _, values) in correction.biases.items()})


def _placement_candidates(scored: Folds, scorer: Scorer) -> tuple[Mapping[str, TensorsData], list[Any]]:
    """``scored``'s candidates and folds, computed only for the tensors whose ranges the chosen
    placement's parameters come from (``ScoringModel.range_tensors``; a placement other than
    onnxruntime's quantizes a fraction of them) where the scorer has a scoring model and the
    candidates are computed when asked for (cross-validated)."""
    if scorer.model is None or not isinstance(scored.candidates, LazyCandidates):
        return scored.candidates, list(scored.folds)
    tensors = scorer.model.range_tensors
    folds = [(c.restricted(tensors) if isinstance(c, LazyCandidates) else c, feeds) for c, feeds in scored.folds]
    return scored.candidates.restricted(tensors), folds


def best_recipe(
    model_input: str | Path | onnx.ModelProto,
    calibration_data_reader: Any,
    quantization: QuantizationArgs,
    settings: CollectionSettings,
    tmp: Path,
    *,
    auto_options: dict[str, Any],
    eval_samples: int,
    folds: int,
) -> tuple[Recipe, onnx.ModelProto | None]:
    """The recipe's choice for ``model_input`` (module docstring); the prepared model is written
    into ``tmp``, which must outlive the quantization.

    Args:
        model_input: the float model (path or ModelProto).
        calibration_data_reader: the calibration data (read once).
        quantization: the caller's quantization arguments (per_channel is set on).
        settings: the collection settings.
        tmp: a folder for the prepared and scoring models.
        auto_options: auto's checked ``qtype`` and ``symmetric``.
        eval_samples: calibration feeds kept for scoring (and for the preparation's check).
        folds: cross-validation folds over them.

    Returns:
        The ``Recipe``, and onnxruntime's QDQ model of it where the recipe already has it (scored
        on the outputs and no node left in float: the evidence step's), else None.

    Raises:
        ValueError: no data, a preparation that changes the outputs, or no candidate.
    """
    start = time.perf_counter()
    extra = dict(quantization.extra_options or {})
    extra.setdefault("WeightSymmetric", True)
    quantization = replace(quantization, per_channel=True, extra_options=extra)
    kept: list[dict[str, np.ndarray]] = []
    rest = withholding_first(calibration_data_reader, kept, eval_samples)
    end = object()
    first = next(rest, end)  # reads until the kept feeds are in memory
    if not kept:
        raise ValueError("recipe: no calibration data (the recipe needs calibration feeds)")
    providers = quantization.calibration_providers
    preparation = prepare_model(model_input, kept, tmp, per_channel=True, providers=providers)
    prepared = preparation.path
    calibrator = calibrators.create_calibrator(
        prepared,
        None,  # every tensor: the placements quantize different sets
        augmented_model_path=(tmp / "augmented_model.onnx").as_posix(),
        calibrate_method="auto",
        use_external_data_format=quantization.use_external_data_format,
        providers=providers,
        extra_options={METHOD_OPTIONS_KEY: auto_options},
        settings=settings,
    )
    if first is not end:
        calibrator.collect_data(itertools.chain([first], rest))
    scored = fold_candidates(
        calibrator, first is not end, kept, folds, auto_options["qtype"], auto_options["symmetric"]
    )
    calibrator = None  # its session's memory, before the candidates' sessions
    if not scored.candidates:
        raise ValueError("recipe: no candidate range set could be computed from the calibration data")
    on_logits = logits_model(preparation.model)
    scoring = prepared if on_logits is None else _save(on_logits, tmp / "scoring.onnx")
    # The placement first, on the default candidate's ranges (one scoring run per placement), then
    # auto's method for the chosen placement only: the choices interact little, and this halves the cost.
    default = (
        {DEFAULT_CANDIDATE: scored.candidates[DEFAULT_CANDIDATE]} if DEFAULT_CANDIDATE in scored.candidates else None
    )
    scores: dict[str, tuple[Placement, QuantizationArgs, Any]] = {}
    # One float session and float outputs per fold, one scoring model per placement, for every
    # selection below (``scorer.SharedScoring``): the chosen placement's is built once.
    (tmp / "shared").mkdir()
    shared = SharedScoring(scoring, list(providers) if providers else ["CPUExecutionProvider"], tmp / "shared")
    found = placements(preparation.model, quantization.op_types_to_quantize)
    scored_placements = found if default is not None and len(found) > 1 else found[:1]
    placement_candidates = default or scored.candidates
    placement_folds = (
        [({DEFAULT_CANDIDATE: c[DEFAULT_CANDIDATE]}, feeds) for c, feeds in scored.folds] if default else scored.folds
    )
    # Each placement's scorer (a quantize_static and its scoring model: Python, one core) is built
    # ahead, while the one before is scored (onnxruntime's runs, the GIL released): the same
    # scorers, built one after the other in placement order, each before its placement's selection
    # asks for it, and none while ``keep_only`` runs.
    arguments = [p.arguments(quantization) for p in scored_placements]
    with runs.ahead(shared.scorer, placement_candidates, arguments[0]) as first:
        for _, fold in placement_folds:  # the float outputs every selection scores against
            shared.reference(list(fold), runs.run_pool())
    built = first.result()
    for k, placement in enumerate(scored_placements):
        placed = arguments[k]
        more = k + 1 < len(arguments)
        with runs.ahead(shared.scorer, placement_candidates, arguments[k + 1]) if more else nullcontext() as following:
            chosen = selection.select(
                scoring, placement_folds, placement_candidates, providers, placed, scored.cross_validated, shared
            )
        built = following.result() if following is not None else built
        scores[placement.label] = (placement, placed, chosen)
        # memory: the best so far and the next (while a placement is scored: and the one after it)
        shared.keep_only(scores[_chosen(scores)][1], built.quantization)
        logger.info(
            "recipe: placement %r (%s): %s, %.2f dB", placement.label, placement.pattern, chosen.label, _sqnr(chosen)
        )
    label = _chosen(scores)
    placement, placed, _ = scores[label]
    chosen_scorer = shared.scorer(scored.candidates, placed)
    candidates, chosen_folds = _placement_candidates(scored, chosen_scorer)
    (tmp / "bias").mkdir()
    # The bias correction's twin model does not depend on the ranges: made while they are chosen.
    with runs.ahead(twin_session, chosen_scorer, tmp / "bias") as twin:
        chosen = selection.select(scoring, chosen_folds, candidates, providers, placed, scored.cross_validated, shared)
    correction = correct_biases(
        chosen_scorer,
        chosen.label,
        chosen.ranges,
        chosen_folds,
        tmp / "bias",
        chosen.feed_sqnr_db.get(chosen.label) if chosen.cross_validated else None,
        twin.result,
    )
    del twin  # the twin session's memory
    logger.info(
        "recipe: bias correction of %d layers: %s (%s; %.2f dB corrected, cross-validated)",
        correction.layers,
        "applied" if correction.biases else "not applied",
        correction.reason,
        correction.sqnr_db.get(CORRECTED, float("nan")),
    )
    uncorrected, searched = prepared, scoring
    if correction.biases:
        prepared = write_corrected(uncorrected, correction.biases, tmp / "corrected.onnx")
        searched = prepared if on_logits is None else write_corrected(scoring, correction.biases, tmp / "scored.onnx")
    searched_model = load_model(searched)
    quantized = _quantized_model(chosen_scorer, chosen.ranges, correction, searched_model)
    del shared, chosen_scorer, built, first, following  # the scoring sessions' memory
    in_float, checked = _left_in_float(
        searched, searched_model, chosen.ranges, kept, providers, placed, tmp / "exclusion", quantized
    )
    if in_float:
        placed = replace(placed, nodes_to_exclude=[*(placed.nodes_to_exclude or []), *in_float])
        kept_correction = correction.without(in_float)
        if kept_correction.biases.keys() != correction.biases.keys():  # a corrected node is now float
            correction, checked = kept_correction, None  # ``checked`` is of another file
            prepared = (
                write_corrected(uncorrected, correction.biases, tmp / "corrected_kept.onnx")
                if correction.biases
                else uncorrected
            )
    recipe = Recipe(
        prepared,
        chosen.ranges,
        placed,
        preparation,
        label,
        chosen.label,
        {**{k: _sqnr(v[2]) for k, v in scores.items()}, "chosen": _sqnr(chosen)},
        on_logits is not None,
        tuple(in_float),
        correction,
    )
    logger.info(
        "recipe: placement %r, ranges %s, per-channel symmetric weights%s%s (%.2f dB %s on %d kept feeds, %.1f s)",
        label,
        chosen.label,
        f", {len(in_float)} nodes left in float" if in_float else "",
        ", biases corrected" if correction.biases else "",
        recipe.sqnr_db["chosen"],
        "on the pre-activation logits" if on_logits is not None else "on the outputs",
        len(kept),
        time.perf_counter() - start,
    )
    # onnxruntime's model of the recipe, where the evidence step has it: scored on the outputs (the
    # file searched is the one written), the scorer's if no node is left in float, else the check's.
    known = None
    if on_logits is None and not in_float:
        known = quantized
    elif on_logits is None and checked is not None:
        known = load_model(checked)
    return recipe, known


def quantize_best(
    model_input: str | Path | onnx.ModelProto,
    model_output: str | Path,
    calibration_data_reader: Any,
    quantization: QuantizationArgs,
    settings: CollectionSettings,
    *,
    auto_options: dict[str, Any],
    eval_samples: int,
    folds: int,
) -> Recipe:
    """``recipe="best"`` from the float model to the int8 QDQ model written to ``model_output``:
    the one route of the Python API and the CLI. The weights' quantization is computed once over
    the recipe's ``quantize_static`` calls and the last one (``weight_memo``); the model is written
    by ``quantize_with_ranges``, from the evidence step's model where it is the one to write (the
    scorer's ``quantized_model``, onnxruntime's bytes) instead of quantizing again. Arguments as
    ``best_recipe``'s; the returned ``Recipe.model`` names a file removed once written."""
    with tempfile.TemporaryDirectory(prefix="histocal.recipe.") as tmp, shared_weight_quantization():
        recipe, quantized = best_recipe(
            model_input, calibration_data_reader, quantization, settings, Path(tmp),
            auto_options=auto_options, eval_samples=eval_samples, folds=folds,
        )  # fmt: skip
        quantize_with_ranges(
            recipe.model,
            model_output,
            recipe.ranges,
            recipe.quantization,
            calibrate_method=CalibrationMethod.MinMax,
            quantized=quantized,
        )
    return recipe


__all__ = ["RECIPES", "RECIPE_EVAL_SAMPLES", "Recipe", "best_recipe", "check_recipe", "quantize_best"]

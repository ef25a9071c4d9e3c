"""Using histocal in place of onnxruntime's quantization entry points (patching ORT's own:
``histocal.quantize.patch``).

* ``calibrate(...)`` calibrates as ORT's ``quantize_static`` does, with histocal's calibrators.
* ``quantize_static(...)`` takes ORT's arguments and the histogram settings ORT's own
  ``quantize_static`` cannot pass (num_bins, num_quantized_bins, scenario, mode, ...), patches
  nothing: it calibrates with histocal, hands the ranges to ORT's ``quantize_static`` through an
  ORT-format calibration cache, and writes the user's ``calibration_cache_path`` if given.
  With ``calibrate_method="auto"`` it chooses the ranges by the quantized model's output
  (``calibrate_and_select``, see ``histocal.quantize.selection``).
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnxruntime.quantization import QuantFormat, QuantType
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData

from .. import calibrators, methods
from ..io.cache import check_cache, save_tensors_data
from ..methods.settings import (
    METHOD_OPTIONS_KEY,
    METHOD_OVERRIDES_KEY,
    QUANTIZE_METHOD_OVERRIDES_KEY,
    CollectionKwargs,
    CollectionSettings,
    settings_for,
)
from ..methods.table import TABLE
from . import selection
from .folds import collect_unless_empty, fold_candidates, withholding_first
from .ort import (
    SMOOTH_QUANT_NEEDS_ORT,
    QuantizationArgs,
    check_per_channel,
    check_ranges_fit,
    model_file,
    model_ort_quantizes,
    ort_quantize_static,
    quantize_with_ranges,
    refuse_overwriting_weights,
)
from .patch import patch_onnxruntime
from .recipe import RECIPE_EVAL_SAMPLES, Recipe, check_recipe, quantize_best
from .selection import Selection

if TYPE_CHECKING:  # typing.Unpack is Python 3.11's
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)

_CALIB_KEYS = (
    ("CalibTensorRangeSymmetric", "symmetric"),
    ("CalibMovingAverage", "moving_average"),
    ("CalibMovingAverageConstant", "averaging_constant"),
    ("CalibMaxIntermediateOutputs", "max_intermediate_outputs"),
    ("CalibPercentile", "percentile"),
    (QUANTIZE_METHOD_OVERRIDES_KEY, METHOD_OVERRIDES_KEY),  # histocal: other methods for chosen tensors
)


def calibrate(
    model_input: str | Path | onnx.ModelProto,
    calibration_data_reader: Any,
    calibrate_method: CalibrationMethod | str = CalibrationMethod.MinMax,
    op_types_to_quantize: list[str] | None = None,
    extra_options: dict[str, Any] | None = None,
    calibration_providers: list[Any] | None = None,
    use_external_data_format: bool = False,
    *,
    num_bins: int | None = None,
    num_quantized_bins: int | None = None,
    scenario: str | None = None,
    method_options: dict[str, Any] | None = None,
    settings: CollectionSettings | None = None,
    **collection: Unpack[CollectionKwargs],
) -> TensorsData:
    """Calibrate as ORT's ``quantize_static`` does, with histocal's calibrators.

    Same option mapping as ORT's ``quantize_static`` (CalibStridedMinMax included).

    Args:
        model_input: the float model (path or ModelProto).
        calibration_data_reader: a CalibrationDataReader, an iterable of feed dicts, or a
            callable returning one.
        calibrate_method: an ORT ``CalibrationMethod``, or a histocal or registered method's
            name (``"auto"`` gives its per-tensor estimate; the model-level choice is
            ``quantize_static``'s).
        op_types_to_quantize: as ORT's (limits the calibrated tensors).
        extra_options: ORT's ``quantize_static`` extra_options (``Calib*`` keys).
        calibration_providers: onnxruntime execution providers for calibration.
        use_external_data_format: as ORT's.
        num_bins, num_quantized_bins, scenario: the histogram methods' settings (None: ORT's).
        method_options: a histocal method's options.
        settings: the collection settings as one ``methods.settings.CollectionSettings``, instead
            of their keywords.
        **collection: the collection settings as keywords (``methods.settings.CollectionKwargs``,
            one per row of ``methods.settings.SETTINGS``; None: the default); those the method's
            calibrator does not read are ignored.

    Returns:
        onnxruntime ``TensorsData`` of the calibrated tensors.

    Raises:
        ValueError: an unknown method or option, or bad data (naming the input and batch).
        MemoryError: the histograms would not fit the memory the process can take.
    """
    extra = dict(extra_options or {})
    options = {key: extra[name] for name, key in _CALIB_KEYS if name in extra}
    histogram = dict(num_bins=num_bins, num_quantized_bins=num_quantized_bins, scenario=scenario)
    options.update({k: v for k, v in {**histogram, METHOD_OPTIONS_KEY: method_options}.items() if v is not None})
    if settings is None:
        # the keywords the method's calibrator reads (create_calibrator ignores the others' keys)
        reads = {s.name for s in settings_for(methods.canonical_name(calibrate_method))}
        given = {k: v for k, v in collection.items() if v is not None and k in reads}
        settings = CollectionSettings.from_keywords(**given)
    else:
        settings = CollectionSettings.of(settings, **{k: v for k, v in collection.items() if v is not None})
    with tempfile.TemporaryDirectory(prefix="histocal.") as tmp:
        model_input = model_file(model_input, Path(tmp))
        calibrator = calibrators.create_calibrator(
            Path(model_input),
            op_types_to_quantize,
            augmented_model_path=Path(tmp, "augmented_model.onnx").as_posix(),
            calibrate_method=calibrate_method,
            use_external_data_format=use_external_data_format,
            providers=calibration_providers,
            extra_options=options,
            settings=settings,
        )
        _collect(calibrator, calibration_data_reader, extra.get("CalibStridedMinMax"))
        result = calibrator.compute_data()
        del calibrator
    return result


def _collect(calibrator: Any, reader: Any, stride: int | None, collect: Callable[[Any], Any] | None = None) -> None:
    """ORT's collection loop (CalibStridedMinMax included); ``collect`` collects one read of the
    reader (default: ``calibrator.collect_data``)."""
    collect = collect or calibrator.collect_data
    if stride:
        total = len(reader)
        if total % stride != 0:
            raise ValueError(f"Total data size ({total}) is not divisible by stride size ({stride}).")
        for start in range(0, total, stride):
            reader.set_range(start_index=start, end_index=start + stride)
            collect(reader)
    else:
        collect(reader)


def calibrate_and_select(
    model_input: str | Path | onnx.ModelProto,
    calibration_data_reader: Any,
    *,
    eval_samples: int = methods.AUTO_SELECTION_OPTIONS["eval_samples"],
    folds: int = methods.AUTO_SELECTION_OPTIONS["folds"],
    method_options: dict[str, Any] | None = None,
    streaming_bins: int | None = None,
    show_progress: bool | None = None,
    **quantize_kwargs: Any,
) -> Selection:
    """auto's model-level choice: calibrate once (one streaming pass over the reader, any kind of
    reader), keeping the first ``eval_samples`` feeds; choose among ``methods.MODEL_AUTO_CANDIDATES``
    the candidate whose quantized model's output is closest to the float model's, scored out of
    sample by ``folds``-fold cross-validation on the kept feeds (each fold scored with candidates
    calibrated on all the calibration data but that fold's feeds; in sample, with a warning, with
    fewer than 2 kept feeds). Memory: the kept feeds plus the float model's outputs on one fold, and
    one calibration state per fold. Cost: the augmented model runs once per feed, as in one
    calibration (streaming states merge exactly, so each fold's training state and the full state are
    merges); per fold the candidates are computed from its training state
    (``candidates.cross_validation_candidates``), and each distinct candidate runs on the fold's feeds
    while it can still be chosen. More: docs/methods.md, "auto: the model-level choice".

    Args:
        model_input: the float model (path or ModelProto).
        calibration_data_reader: a CalibrationDataReader, an iterable of feed dicts, or a callable
            returning one.
        eval_samples: feeds kept for scoring.
        folds: cross-validation folds (kept feed i is in fold i mod ``folds``).
        method_options: auto's ``qtype`` and ``symmetric`` (default: ``activation_type`` and
            ``extra_options["ActivationSymmetric"]``).
        streaming_bins: the streaming histograms' bins.
        show_progress: a progress bar (None: when the output is a terminal).
        **quantize_kwargs: ``quantize_static``'s quantization arguments (``QUANTIZE_ARGUMENTS``):
            the candidates are quantized with them.

    Returns:
        The ``Selection``: the chosen candidate's ranges computed from all the calibration data,
        and every candidate's score.

    Raises:
        ValueError: bad options, SmoothQuant, no data, or no candidate computable from the data.
        TypeError: an unknown quantization argument.
    """
    quantization = selection.selection_arguments(quantize_kwargs)  # before the calibration pass, not after
    settings = CollectionSettings.from_keywords(streaming_bins=streaming_bins, show_progress=show_progress)
    return choose_by_model(
        model_input, calibration_data_reader, quantization, settings, eval_samples=eval_samples, folds=folds,
        method_options=method_options,
    )  # fmt: skip


def choose_by_model(
    model_input: str | Path | onnx.ModelProto,
    calibration_data_reader: Any,
    quantization: QuantizationArgs,
    settings: CollectionSettings,
    *,
    eval_samples: int = methods.AUTO_SELECTION_OPTIONS["eval_samples"],
    folds: int = methods.AUTO_SELECTION_OPTIONS["folds"],
    method_options: dict[str, Any] | None = None,
) -> Selection:
    """``calibrate_and_select`` on its arguments built and checked once (``quantize_static``'s)."""
    check_per_channel(model_input, quantization)
    select = methods.check_selection_options({"eval_samples": eval_samples, "folds": folds})
    eval_samples, folds = select["eval_samples"], select["folds"]
    extra = dict(quantization.extra_options or {})
    if extra.get("SmoothQuant", False):
        raise ValueError("SmoothQuant recalibrates a rewritten model inside onnxruntime: use one of ORT's methods")
    options = methods.check_options(
        "auto",
        default_method_options("auto", method_options, quantization.activation_type, extra),
    )
    kept: list[dict[str, np.ndarray]] = []
    upgraded = model_ort_quantizes(model_input, quantization.weight_type, quantization.activation_type, extra)
    with tempfile.TemporaryDirectory(prefix="histocal.") as tmp:
        model_input = model_file(model_input, Path(tmp))
        # The model ORT calibrates (an opset it converts the model to adds tensors); the candidates
        # are scored by quantizing model_input, as ORT does.
        if upgraded is None:
            calibrated = model_input
        else:
            Path(tmp, "converted").mkdir()
            calibrated = model_file(upgraded, Path(tmp, "converted"))
        calibrator = calibrators.create_calibrator(
            Path(calibrated),
            quantization.op_types_to_quantize,
            augmented_model_path=Path(tmp, "augmented_model.onnx").as_posix(),
            calibrate_method="auto",
            use_external_data_format=quantization.use_external_data_format,
            providers=quantization.calibration_providers,
            extra_options={METHOD_OPTIONS_KEY: options},
            settings=settings,
        )
        start = time.perf_counter()
        rest_collected = []  # per read: whether feeds beyond the kept ones reached the calibrator
        _collect(
            calibrator,
            calibration_data_reader,
            extra.get("CalibStridedMinMax"),
            lambda data: rest_collected.append(
                collect_unless_empty(calibrator, withholding_first(data, kept, eval_samples))
            ),
        )
        scored = fold_candidates(calibrator, any(rest_collected), kept, folds, options["qtype"], options["symmetric"])
        calibrator = None  # its session's memory, before the candidates' sessions
        candidates, cross_validate = scored.candidates, scored.cross_validated
        if not candidates:
            raise ValueError("auto: no candidate range set could be computed from the calibration data")
        logger.info(
            "auto: calibrated and computed %d candidates (and %d folds' candidates) in %.2f s",
            len(candidates),
            len(scored.folds) if cross_validate else 0,
            time.perf_counter() - start,
        )
        providers = quantization.calibration_providers
        if not cross_validate:
            logger.warning(
                "auto: %d evaluation feed is too few to cross-validate: the candidates are scored in "
                "sample, on the feed they were fitted on (which favours tight clipping)",
                len(kept),
            )
        return selection.select(model_input, scored.folds, candidates, providers, quantization, cross_validate)


def quantize_static(
    model_input: str | Path | onnx.ModelProto,
    model_output: str | Path,
    calibration_data_reader: Any = None,
    quant_format: Any = QuantFormat.QDQ,
    op_types_to_quantize: list[str] | None = None,
    per_channel: bool = False,
    reduce_range: bool = False,
    activation_type: Any = QuantType.QInt8,
    weight_type: Any = QuantType.QInt8,
    nodes_to_quantize: list[str] | None = None,
    nodes_to_exclude: list[str] | None = None,
    use_external_data_format: bool = False,
    calibrate_method: CalibrationMethod | str = CalibrationMethod.MinMax,
    calibration_providers: list[Any] | None = None,
    extra_options: dict[str, Any] | None = None,
    calibration_cache_path: str | Path | None = None,
    *,
    num_bins: int | None = None,
    num_quantized_bins: int | None = None,
    scenario: str | None = None,
    mode: str | None = None,
    streaming_bins: int | None = None,
    method_options: dict[str, Any] | None = None,
    tensors_range: TensorsData | None = None,
    memory_budget: int | str | None = None,
    recipe: str = "ort",
) -> None:
    """ORT's ``quantize_static`` with histocal calibration, without patching anything.

    The positional arguments are ORT's; the keyword-only ones set what ORT's cannot (None keeps
    ORT's defaults). The calibration cache follows ORT's rules (reuse on a hit, a method
    mismatch is an error, a smooth_quant mismatch recomputes). Histocal methods' ranges reach
    ORT (and the cache) as MinMax results, so a cache made with one histocal method is a hit for
    every other one. As ORT's, it calibrates the model ORT quantizes: converted first when its
    opset cannot express the quantization (16-bit types: opset 21), a conversion that can add
    tensors.

    Args:
        model_input, model_output, calibration_data_reader, quant_format, op_types_to_quantize,
            per_channel, reduce_range, activation_type, weight_type, nodes_to_quantize,
            nodes_to_exclude, use_external_data_format, calibration_providers, extra_options,
            calibration_cache_path: as ORT's ``quantize_static``.
        calibrate_method: an ORT ``CalibrationMethod``, or a histocal method's name (the rows of
            ``methods.table.TABLE``) or a registered one's. ``"auto"`` chooses one method for the model by
            the quantized model's output, cross-validated (docs/methods.md, "auto: the
            model-level choice"); the chosen ranges are written to ``calibration_cache_path``, and
            a cache hit is reused either way.
        num_bins, num_quantized_bins, scenario: the histogram methods' settings.
        mode: the collection mode, ``"auto"`` (default), ``"exact"`` or ``"streaming"``.
        streaming_bins: bins of the streaming histogram (a power of two, default 16384).
        method_options: a histocal method's options; ``qtype``/``symmetric`` default to
            ``activation_type`` and ``extra_options["ActivationSymmetric"]``. For auto:
            ``eval_samples``, ``folds``, ``per_tensor_estimate``.
        tensors_range: skip calibration and quantize with these ranges (e.g.
            ``CalibrationState.compute(...)``).
        memory_budget: exact mode's budget (bytes, or e.g. ``"2GiB"``).
        recipe: ``"ort"`` (default): onnxruntime's quantization with the arguments as given.
            ``"best"``: the best int8 model histocal finds (docs/methods.md, "The recipe"): the
            model prepared (Constant weights to initializers, opset 13, onnxruntime's
            pre-processing, outputs checked), symmetric per-channel weights, the placement and
            auto's method chosen on the calibration feeds, the biases corrected and the few
            nodes whose quantization costs most left in float where the evidence holds; ``calibrate_method`` must be left at
            its default or be ``"auto"`` (``method_options``: auto's), with no
            ``tensors_range`` or ``calibration_cache_path``.

    Returns:
        None; the quantized model is written to ``model_output``.

    Raises:
        ValueError: bad options or data, or given ranges (a cache hit, ``tensors_range``) that
            do not fit the model (tensors it does not have, no range for a Softmax output ORT
            quantizes), naming their source; before any work, an ``OverwriteError`` (a
            ``ValueError``) when ``model_output``, its external data (``<model_output>.data``) or
            ``calibration_cache_path`` is one of ``model_input``'s external-data files, or the
            cache is ``model_input`` or ``model_output``.
        MemoryError: calibration would not fit the memory the process can take.
    """
    refuse_overwriting_weights(model_input, model_output, use_external_data_format, calibration_cache_path)
    if check_recipe(recipe) == "best":
        _refuse_with_recipe(calibrate_method, tensors_range, calibration_cache_path, extra_options)
        calibrate_method = "auto"
        given_select = {k: v for k, v in (method_options or {}).items() if k in methods.AUTO_SELECTION_OPTIONS}
        recipe_select = methods.check_selection_options({"eval_samples": RECIPE_EVAL_SAMPLES, **given_select})
    extra = dict(extra_options or {})
    smooth_quant = bool(extra.get("SmoothQuant", False))
    method_arg: CalibrationMethod | str = calibrate_method
    name = methods.canonical_name(calibrate_method)
    select: dict[str, Any] | None = None  # auto's model-level options, when it chooses by the model
    if name == "auto":
        given = dict(method_options or {})
        select = methods.check_selection_options(
            {k: given.pop(k) for k in list(given) if k in methods.AUTO_SELECTION_OPTIONS}
        )
        method_options = given
        if select["per_tensor_estimate"] or tensors_range is not None:
            select = None
    if name not in methods.ORT_METHODS:
        method_arg = name
        method_options = default_method_options(name, method_options, activation_type, extra)
        calibrate_method = CalibrationMethod.MinMax  # how the ranges travel through ORT
    else:
        if method_options:
            raise ValueError(f"method_options are for histocal's methods; {name} takes ORT's options")
        calibrate_method = TABLE[name].ort or calibrate_method  # a name ("percentile") as ORT's enum
    if smooth_quant and (tensors_range is not None or name not in methods.ORT_METHODS):
        raise ValueError(SMOOTH_QUANT_NEEDS_ORT)
    settings = CollectionSettings.from_keywords(mode=mode, streaming_bins=streaming_bins, memory_budget=memory_budget)
    quantization = QuantizationArgs(
        quant_format=quant_format,
        op_types_to_quantize=op_types_to_quantize,
        per_channel=per_channel,
        reduce_range=reduce_range,
        activation_type=activation_type,
        weight_type=weight_type,
        nodes_to_quantize=nodes_to_quantize,
        nodes_to_exclude=nodes_to_exclude,
        use_external_data_format=use_external_data_format,
        calibration_providers=calibration_providers,
        extra_options=extra,
    )
    if recipe == "best":
        if calibration_data_reader is None:
            raise ValueError('recipe="best" needs a calibration_data_reader')
        _quantize_best(
            model_input, model_output, calibration_data_reader, quantization, settings, method_options, recipe_select
        )
        return
    check_per_channel(model_input, quantization)
    if smooth_quant:
        # SmoothQuant rewrites the model before calibrating inside ORT: calibrate there.
        with patch_onnxruntime():
            ort_quantize_static(
                model_input,
                model_output,
                calibrate_method=calibrate_method,
                calibration_data_reader=calibration_data_reader,
                calibration_cache_path=calibration_cache_path,
                **quantization.keywords(),
            )
        return
    if tensors_range is not None:
        ranges = tensors_range
        calibrate_method = ranges.calibration_method
        check_ranges_fit(model_input, ranges, "tensors_range", **quantization.keywords())
    else:
        ranges = None
        if calibration_cache_path is not None:
            ranges = check_cache(calibration_cache_path, calibrate_method, smooth_quant)
            if ranges is not None:
                check_ranges_fit(model_input, ranges, str(calibration_cache_path), **quantization.keywords())
        if ranges is None:
            if calibration_data_reader is None:
                raise ValueError(
                    "Either calibration_data_reader or an existing calibration_cache_path must be provided."
                )
            if select is not None:
                ranges = choose_by_model(
                    model_input,
                    calibration_data_reader,
                    quantization,
                    settings,
                    eval_samples=select["eval_samples"],
                    folds=select["folds"],
                    method_options=method_options,
                ).ranges
            else:
                # ORT calibrates the model it quantizes: converted to another opset, if it converts it.
                upgraded = model_ort_quantizes(model_input, weight_type, activation_type, extra)
                ranges = calibrate(
                    model_input if upgraded is None else upgraded,
                    calibration_data_reader,
                    method_arg,
                    op_types_to_quantize,
                    extra,
                    calibration_providers,
                    use_external_data_format,
                    num_bins=num_bins,
                    num_quantized_bins=num_quantized_bins,
                    scenario=scenario,
                    method_options=method_options,
                    settings=settings,
                )
            if calibration_cache_path is not None:
                save_tensors_data(ranges, calibration_cache_path, smooth_quant=smooth_quant)
    quantize_with_ranges(model_input, model_output, ranges, quantization, calibrate_method=calibrate_method)


def _refuse_with_recipe(
    calibrate_method: Any, tensors_range: Any, calibration_cache_path: Any, extra_options: dict[str, Any] | None
) -> None:
    """What ``recipe="best"`` decides or cannot take: a ValueError naming it."""
    name = methods.canonical_name(calibrate_method)
    if name not in ("minmax", "auto"):
        raise ValueError(
            f'recipe="best" chooses the method (auto); calibrate_method {name!r} cannot be combined with it'
        )
    if tensors_range is not None or calibration_cache_path is not None:
        raise ValueError(
            'recipe="best" prepares the model, so its ranges name the prepared model\'s tensors: '
            "no tensors_range or calibration_cache_path"
        )
    if (extra_options or {}).get("SmoothQuant", False):
        raise ValueError('recipe="best" does not apply SmoothQuant (it recalibrates inside onnxruntime)')


def _quantize_best(
    model_input: str | Path | onnx.ModelProto,
    model_output: str | Path,
    calibration_data_reader: Any,
    quantization: QuantizationArgs,
    settings: CollectionSettings,
    method_options: dict[str, Any] | None,
    select: dict[str, Any],
) -> Recipe:
    """``recipe="best"`` with quantize_static's arguments (``recipe.quantize_best``)."""
    extra = dict(quantization.extra_options or {})
    options = methods.check_options(
        "auto", default_method_options("auto", method_options, quantization.activation_type, extra)
    )
    return quantize_best(
        model_input, model_output, calibration_data_reader, quantization, settings,
        auto_options=options, eval_samples=select["eval_samples"], folds=select["folds"],
    )  # fmt: skip


def default_method_options(
    name: str, given: dict[str, Any] | None, activation_type: Any, extra: dict[str, Any]
) -> dict[str, Any]:
    options = dict(given or {})
    allowed = methods.METHOD_OPTIONS.get(name, {})
    if "qtype" in allowed:
        options.setdefault("qtype", methods.qtype_of(activation_type))
    if "symmetric" in allowed:
        options.setdefault("symmetric", bool(extra.get("ActivationSymmetric", False)))
    return options


__all__ = ["calibrate", "calibrate_and_select", "choose_by_model", "quantize_static"]

"""``histocal quantize``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..diagnose import DEFAULTS as DIAGNOSE_DEFAULTS
from ..io.outputs import external_data_output
from ..methods.settings import METHOD_OPTIONS_KEY
from .arguments import fold_count, positive_int
from .calibrate import load_state, ranges_from_state
from .calibration import check_model, open_data, run_calibrator, write_outputs
from .diagnose import add_exclusion_options, auto_exclude
from .errors import CliError, UsageError
from .options import (
    AUTO_EVAL_SAMPLES,
    AUTO_FOLDS,
    METHODS,
    add_data_options,
    add_method_options,
    calibrator_options,
    display,
    histocal_option_names,
    method_enum,
    method_key,
)
from .quantization import add_quantization_options, quant_type, quantization_arguments
from .same_file import inputs as command_inputs
from .same_file import refuse_overwriting

if TYPE_CHECKING:
    from ..quantize.ort import QuantizationArgs

logger = logging.getLogger("histocal.cli")


# ---------------------------------------------------------------------------------------------
# Quantization


def _default_error_model(args: argparse.Namespace) -> None:
    """histocal's methods minimize the error of the quantization that will be applied: their
    qtype and symmetry default to the activation type and --symmetric-activations."""
    from .. import methods

    options = histocal_option_names(args.method) if args.method else ()
    if "qtype" in options and args.qtype is None:
        try:
            args.qtype = methods.qtype_of(quant_type(args.activation_type))
        except ValueError as exc:
            raise CliError(f"--method {args.method}: {exc}") from None
    if "symmetric" in options and args.symmetric is None and args.symmetric_activations is not None:
        args.symmetric = args.symmetric_activations


def _model_level_auto(args: argparse.Namespace) -> bool:
    return args.method == "auto" and not args.per_tensor_estimate


def _select_auto(args: argparse.Namespace, model: Path, data: Any, quantization: QuantizationArgs) -> Any:
    """auto's model-level choice (see histocal.quantize.selection): the chosen candidate's ranges."""
    from .. import methods
    from ..quantize.integration import choose_by_model

    options, settings = calibrator_options(args)  # warns about options that do not apply to auto
    eval_samples = args.eval_samples or methods.AUTO_SELECTION_OPTIONS["eval_samples"]
    folds = args.folds or methods.AUTO_SELECTION_OPTIONS["folds"]
    start = time.perf_counter()
    chosen = choose_by_model(
        model,
        data,
        quantization,
        settings.replace(show_progress=False if args.no_progress else None),
        eval_samples=eval_samples,
        folds=folds,
        method_options=options.get(METHOD_OPTIONS_KEY),
    )
    logger.info(
        "auto chose %s (output SQNR %.2f dB, %s on %d batches) in %.2f s",
        chosen.label,
        chosen.sqnr_db[chosen.label],
        chosen.scoring,
        chosen.eval_samples,
        time.perf_counter() - start,
    )
    args.auto_choice = chosen.label
    return chosen.ranges


def _model_to_calibrate(model: Path, quantization: QuantizationArgs, tmp: str) -> Path:
    """``model``, or the model onnxruntime converts it to (another opset) before it quantizes,
    saved in ``tmp``: ranges must name that model's tensors."""
    from ..io.models import save_model
    from ..quantize.ort import model_ort_quantizes

    converted = model_ort_quantizes(
        model, quantization.weight_type, quantization.activation_type, quantization.extra_options
    )
    if converted is None:
        return model
    path = Path(tmp, "converted", model.name)
    path.parent.mkdir()
    save_model(converted, path)
    return path


def _state_of(model: Path, path: str, quantization: QuantizationArgs) -> Any:
    """The state in ``path``, refused when it was collected on another model than ``model`` (or
    than the model onnxruntime converts it to for this quantization)."""
    from ..quantize.ort import model_ort_quantizes
    from ..state import model_fingerprint

    state = load_state(path)
    expected = model_fingerprint(model)
    if state.model_fingerprint in (None, expected):
        return state
    converted = model_ort_quantizes(
        model, quantization.weight_type, quantization.activation_type, quantization.extra_options
    )
    if converted is None or model_fingerprint(converted) != state.model_fingerprint:
        raise CliError(
            f"{path}: a state of another model (model fingerprint {state.model_fingerprint}, {model} has {expected})"
        )
    return state


def _refuse_with_recipe(args: argparse.Namespace) -> None:
    """What --recipe best decides itself or cannot take: a UsageError naming the option."""
    if args.data is None:
        raise UsageError("--recipe best calibrates: give --data")
    for flag, value in (
        ("--state", args.state),
        ("--cache", args.cache),
        ("--auto-exclude", args.auto_exclude or None),
    ):
        if value is not None:
            raise UsageError(
                f"--recipe best prepares the model (its ranges name the prepared model's tensors): no {flag}"
            )
    if args.method not in (None, "auto"):
        raise UsageError(f"--recipe best chooses the method (auto): no --method {args.method}")
    if args.per_tensor_estimate:
        raise UsageError("--recipe best scores the candidates on the model: no --per-tensor-estimate")


def _best_recipe(args: argparse.Namespace, model: Path, quantization: QuantizationArgs, output: Path) -> Any:
    """``recipe="best"`` (``histocal.quantize.recipe.quantize_best``) on the command line's data,
    its model written to ``output``: the ``Recipe``."""
    from .. import methods
    from ..quantize.integration import default_method_options
    from ..quantize.recipe import RECIPE_EVAL_SAMPLES, quantize_best

    args.method = "auto"
    options, settings = calibrator_options(args)
    extra = dict(quantization.extra_options or {})
    auto_options = methods.check_options(
        "auto", default_method_options("auto", options.get(METHOD_OPTIONS_KEY), quantization.activation_type, extra)
    )
    return quantize_best(
        model,
        output,
        open_data(args, model),
        quantization,
        settings.replace(show_progress=False if args.no_progress else None),
        auto_options=auto_options,
        eval_samples=args.eval_samples or RECIPE_EVAL_SAMPLES,
        folds=args.folds or methods.AUTO_SELECTION_OPTIONS["folds"],
    )


def cmd_quantize(args: argparse.Namespace) -> int:
    from ..io.cache import check_cache, load_tensors_data
    from ..quantize.ort import check_ranges_fit, quantize_with_ranges

    sources = [s for s in ("data", "state") if getattr(args, s) is not None]
    if len(sources) > 1:
        raise UsageError("give either --data or --state, not both")
    if not sources and args.cache is None:
        raise UsageError("give --data, --cache or --state")
    model = shown = check_model(args.model)
    output = Path(args.output)
    cache = Path(args.cache) if args.cache else None
    # with --data, --cache is written (or reused); without, it is read
    read: list[tuple[str, str | Path | None]] = [("--state", args.state)]
    outputs: list[tuple[str, str | Path | None]] = [("OUTPUT", output)]
    if args.external_data:  # onnxruntime writes the weights next to OUTPUT, whatever the model's were called
        outputs.append(("OUTPUT's external data (--external-data)", external_data_output(output)))
    (outputs if args.data is not None else read).append(("--cache", cache))
    inputs = command_inputs(model, [("--data", args.data)], read)
    refuse_overwriting(outputs, inputs)
    write_cache = False
    given = None  # the file the ranges come from, when not calibrated here
    _default_error_model(args)
    quantization = quantization_arguments(args)
    if args.recipe == "best":
        _refuse_with_recipe(args)
    else:
        from ..quantize.ort import check_per_channel

        check_per_channel(model, quantization)  # before calibrating

    # removed however the command ends (an error included)
    with tempfile.TemporaryDirectory(prefix="histocal.") as staging:
        recipe = None
        if args.recipe == "best":
            ranges = None  # the recipe calibrates, and writes its model itself (below)
        elif args.auto_exclude:
            args.method = args.method or "minmax"
            ranges, model, quantization = auto_exclude(args, model, quantization, Path(staging))
        elif args.state is not None:
            given = args.state
            ranges = ranges_from_state(args, _state_of(model, args.state, quantization))
        elif args.data is None:  # --cache alone: reuse it
            if cache is None:
                raise UsageError("give --data, --cache or --state")
            if not cache.is_file():
                raise CliError(f"{cache}: no such calibration cache" if not cache.exists() else f"{cache}: not a file")
            ranges = load_tensors_data(cache)
            given = str(cache)
            cached = method_key(ranges.calibration_method)
            if args.method is None:
                args.method = cached if cached in METHODS else "minmax"
            elif args.method != cached:
                raise CliError(f"{cache}: cache made with {ranges.calibration_method}, not --method {args.method}")
        else:
            args.method = args.method or "minmax"
            data = open_data(args, model)
            ranges = check_cache(cache, method_enum(args.method), False) if cache is not None else None
            if ranges is not None:
                logger.info("reusing calibration cache %s", cache)
                given = str(cache)
            elif _model_level_auto(args):
                ranges = _select_auto(args, model, data, quantization)
                write_cache = cache is not None
            else:
                ranges, _ = run_calibrator(
                    args, _model_to_calibrate(model, quantization, staging), data, want_state=False
                )
                write_cache = cache is not None
        if not args.auto_exclude:
            for flag, value in (
                ("--target-sqnr", args.target_sqnr),
                ("--max-excluded-fraction", args.max_excluded_fraction),
            ):
                if value is not None:
                    logger.warning("option %s applies only to --auto-exclude; ignored", flag)
        if (
            (args.method != "auto" or args.data is None or args.per_tensor_estimate)
            and not args.auto_exclude
            and args.recipe != "best"
        ):
            for flag, value in (
                ("--eval-samples", args.eval_samples),
                ("--folds", args.folds),
                ("--per-tensor-estimate", args.per_tensor_estimate or None),
            ):
                if value is not None:
                    logger.warning("option %s applies only to --method auto with --data; ignored", flag)

        if given is not None:
            try:
                check_ranges_fit(model, ranges, given, **quantization.keywords())
            except ValueError as exc:
                raise CliError(str(exc)) from None
        output.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{output.name}.", dir=output.parent) as tmp:
            staged = Path(tmp, "out", output.name)
            staged.parent.mkdir()
            if args.recipe == "best":
                recipe = _best_recipe(args, model, quantization, staged)
            else:
                quantize_with_ranges(model, staged, ranges, quantization)
            # Side files (external data) first, the model last: a reader never sees a model
            # without its data. The check above knows the external-data file onnxruntime names; any
            # other side file is checked here, before anything (the cache too) is written.
            written = sorted(staged.parent.iterdir(), key=lambda f: f.name == output.name)
            side = [("side file", output.parent / f.name) for f in written if f.name != output.name]
            refuse_overwriting([s for s in side if s[1] not in {p for _, p in outputs}], [*inputs, *outputs])
            if write_cache:
                write_outputs(ranges, cache, None, None)
            for f in written:
                os.replace(f, output.parent / f.name)
    logger.info("wrote %s", output)
    how = display(args.method) + (f" ({args.auto_choice})" if getattr(args, "auto_choice", None) else "") + " ranges"
    if recipe is not None:
        corrected = ", biases corrected" if recipe.bias_correction.biases else ""
        in_float = f", {len(recipe.left_in_float)} nodes in float" if recipe.left_in_float else ""
        how = f"recipe best: {recipe.method} ranges, placement {recipe.placement}, per-channel weights{in_float}{corrected}"
    sys.stdout.write(
        f"quantized {shown} -> {output} ({how}, {args.format}, "
        f"activations {args.activation_type}, weights {args.weight_type})\n"
    )
    return 0


def register(sub: Any) -> None:
    """The ``quantize`` command's parser."""
    p = sub.add_parser(
        "quantize",
        help="calibrate (or reuse a cache / state) and write a quantized model",
        description="Quantize MODEL into OUTPUT with onnxruntime's quantize_static, calibrated by "
        "histocal on --data, or from an existing ORT cache (--cache) or a histocal "
        "state (--state). With --data and --cache, the cache is reused if it exists "
        "and written otherwise (ORT's rule).",
    )
    p.add_argument("model", metavar="MODEL", help="ONNX model (float)")
    p.add_argument("output", metavar="OUTPUT", help="quantized model to write")
    add_data_options(p, required=False)
    g = p.add_argument_group("calibration source (one of --data, --cache, --state)")
    g.add_argument("--cache", metavar="FILE", help="ORT calibration cache to reuse (or to write, with --data)")
    g.add_argument("--state", metavar="FILE", help="histocal state to compute the ranges from")
    add_method_options(
        p,
        default_method=None,
        per_channel=False,
        default_help="with --data minmax; with --cache or --state the method they were made with",
    )
    add_quantization_options(p)
    p.add_argument(
        "--recipe",
        choices=["ort", "best"],
        default="ort",
        help="ort (default): onnxruntime's quantization with the options as given; best: the best int8 model "
        "histocal finds: the model prepared (Constant weights to initializers, opset 13, onnxruntime's "
        "pre-processing, outputs checked), symmetric per-channel weights, placement and method (auto) chosen "
        "on the calibration data, biases corrected and the few nodes whose quantization costs most left in "
        "float, each where the evidence holds (docs/methods.md, 'The recipe')",
    )
    g = p.add_argument_group("auto (--method auto with --data)")
    g.add_argument(
        "--eval-samples",
        type=positive_int,
        metavar="N",
        help="auto: choose the range set (per-tensor estimate or one method's) whose quantized model's "
        "output is closest to the float model's, cross-validated (--folds) on the first N calibration "
        f"batches (of --batch-size items), kept in memory (default {AUTO_EVAL_SAMPLES}); --auto-exclude: "
        f"the batches held back to measure the quantized model (default {DIAGNOSE_DEFAULTS['eval_samples']})",
    )
    g.add_argument(
        "--folds",
        type=fold_count,
        metavar="K",
        help="auto: K-fold cross-validation on those batches (batch i in fold i mod K; each fold scored "
        f"with ranges calibrated on all the other data) (default {AUTO_FOLDS})",
    )
    g.add_argument(
        "--per-tensor-estimate",
        action="store_true",
        help="auto: per tensor, the candidate with the least estimated error; no model evaluation",
    )
    add_exclusion_options(p.add_argument_group("auto-exclude (with --data)"), auto_exclude=True)
    p.set_defaults(func=cmd_quantize)

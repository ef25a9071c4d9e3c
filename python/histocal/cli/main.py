"""histocal's command line: ``histocal calibrate | quantize | inspect | recompute | report | demo``.

Exit codes: 0 success, 1 failure (bad data, unreadable file, calibration or quantization error),
2 usage error. Diagnostics go through :mod:`logging` to stderr (``histocal: error: ...``, one
line); results (tables, JSON) go to stdout. Bad calibration data is detected before any output
file is created, and every output (cache, state, quantized model) is written atomically, so a
failed run leaves nothing behind and never a partial file.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import logging
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Sequence

import numpy as np

logger = logging.getLogger("histocal.cli")

METHODS = ("minmax", "entropy", "percentile", "distribution")
HISTOGRAM_METHODS = METHODS[1:]
HISTOCAL_METHODS = ("mse", "kl", "pow2", "auto")
_METHOD_NAMES = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile", "distribution": "Distribution"}
# Options of histocal's own methods (mse, kl, pow2, auto), passed as MethodOptions.
_METHOD_OPTION_KEYS = ("qtype", "pow2_method", "minmse_mode")
# histocal.methods.AUTO_SELECTION_OPTIONS["eval_samples"] and ["folds"] (not imported: fast --help)
AUTO_EVAL_SAMPLES = 16
AUTO_FOLDS = 2
QUANT_TYPES = ("qint8", "quint8", "qint16", "quint16", "qint4", "quint4", "qfloat8e4m3fn")
FORMATS = ("qdq", "qoperator")


class CliError(Exception):
    """A failure to report as one line on stderr (exit code 1)."""


class _UsageError(Exception):
    """Raised by a subcommand for an invalid option combination found after parsing (exit 2)."""


def _did_you_mean(word: str, candidates: Sequence[str]) -> str:
    """" (did you mean X?)" for the closest candidate, or ""."""
    import difflib

    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class _Parser(argparse.ArgumentParser):
    """argparse with short usage errors: a one-line usage, the error, a pointer to --help, and
    "did you mean" for misspelled subcommands, choices and options (argparse's own
    suggest_on_error needs Python 3.14)."""

    def short_usage(self) -> str:
        parts = []
        for action in self._actions:
            if not action.option_strings:
                parts.append(f"{action.metavar or action.dest.upper()}"
                             + (" ..." if isinstance(action, argparse._SubParsersAction) else ""))
        for action in self._actions:
            if action.option_strings and action.required:
                parts.append(f"{action.option_strings[0]} {action.metavar or action.dest.upper()}"
                             + (" ..." if action.nargs in ("+", "*") else ""))
        options = ["[options]"] if any(a.option_strings and not a.required for a in self._actions) else []
        return " ".join([f"usage: {self.prog}", *options, *parts])

    def error(self, message: str) -> "NoReturn":
        self.exit(2, f"{self.short_usage()}\n{self.prog}: error: {message}\n"
                     f"Run '{self.prog} --help' for the full usage.\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            choices = [str(c) for c in action.choices]
            hint = _did_you_mean(str(value), choices) or f" (choose from {', '.join(choices)})"
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint}")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            # Unknown options of a subcommand reach the top parser: report them as the subcommand's.
            parser = self._subcommand(parsed) or self
            options = [o for a in parser._actions for o in a.option_strings]
            hints = [_did_you_mean(e.partition("=")[0], options) for e in extras if e.startswith("-")]
            parser.error(f"unrecognized arguments: {' '.join(extras)}" + next((h for h in hints if h), ""))
        return parsed

    def _subcommand(self, parsed: argparse.Namespace) -> "_Parser | None":
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action.choices.get(getattr(parsed, action.dest, None))
        return None


# ---------------------------------------------------------------------------------------------
# Small helpers


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _display(method: str) -> str:
    return _METHOD_NAMES.get(method, method)


def _check_method(args: argparse.Namespace) -> None:
    """Resolve --method (after --plugin imports) to its canonical name; usage error if unknown."""
    from .. import methods

    if getattr(args, "method", None) is None:
        return
    try:
        args.method = methods.canonical_name(args.method)
    except ValueError as exc:
        raise _UsageError(f"{exc}{_did_you_mean(args.method.lower(), methods.method_names())}") from None


def _load_plugins(args: argparse.Namespace) -> None:
    """--plugin MODULE (its import registers methods) or MODULE:FUNC (FUNC registered as FUNC)."""
    import importlib

    from .. import methods

    for spec in getattr(args, "plugin", None) or ():
        module_name, _, attr = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
            if attr:
                methods.register_method(attr, getattr(module, attr), replace=True)
        except Exception as exc:  # a user's module: report it as one line
            raise CliError(f"--plugin {spec}: {exc!r}") from None


def _method_enum(name: str) -> Any:
    """ORT's CalibrationMethod for ORT's methods; histocal's methods travel as MinMax."""
    from onnxruntime.quantization.calibrate import CalibrationMethod

    if name not in _METHOD_NAMES:
        return CalibrationMethod.MinMax

    return CalibrationMethod[_METHOD_NAMES[name]]


def _method_key(method: Any) -> str:
    """CalibrationMethod (or its name / str()) -> 'minmax' | 'entropy' | ..."""
    text = getattr(method, "name", None) or str(method).split(".")[-1]
    return text.lower()


def _int_at_least(minimum: int, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(1, text)


def _folds(text: str) -> int:
    return _int_at_least(2, text)


def _count(text: str) -> int:
    return _int_at_least(0, text)


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _percentile(text: str) -> float:
    value = _float(text)
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected a percentile in [0, 100], got {value}")
    return value


def _shape(text: str) -> str:
    dims = [d.strip() for d in text.split(",")]
    for d in dims:
        if d not in ("?", "None"):
            try:
                int(d)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"expected comma-separated ints ('?' or <= 0: dynamic), got {text!r}"
                ) from None
    return text


def _check_model(path: str) -> Path:
    model = Path(path)
    if not model.is_file():
        raise CliError(f"{model}: no such model file" if not model.exists() else f"{model}: not a file")
    return model


@contextlib.contextmanager
def _staged(final: Path, suffix: str = "") -> Iterator[Path]:
    """A temp path next to ``final``; the caller writes it, ``_commit`` moves it into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=f".tmp{suffix}")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


# ---------------------------------------------------------------------------------------------
# Options shared by several subcommands


def _add_method_options(p: argparse.ArgumentParser, *, default_method: str | None, minmax: bool = True,
                        per_channel: bool = True, collection: bool = True, required: bool = False) -> None:
    """Method options; ``minmax=False``: only the options a state's ``compute`` takes."""
    g = p.add_argument_group("calibration method")
    g.add_argument("--method", metavar="METHOD", default=default_method, required=required,
                   help=f"{', '.join(METHODS + HISTOCAL_METHODS)} or a method registered by --plugin "
                        f"(default: {default_method or 'see below'})")
    g.add_argument("--plugin", action="append", metavar="MODULE[:FUNC]",
                   help="import MODULE (which calls histocal.register_method), or register MODULE's FUNC "
                        "as method FUNC; repeatable")
    g.add_argument("--num-bins", type=_positive_int, metavar="N",
                   help="histogram bins (ORT defaults: entropy 128, percentile/distribution 2048)")
    g.add_argument("--num-quantized-bins", type=_positive_int, metavar="N",
                   help="entropy: quantized bins (default 128)")
    g.add_argument("--percentile", type=_percentile, metavar="P", help="percentile: the percentile (default 99.999)")
    g.add_argument("--symmetric", action=argparse.BooleanOptionalAction, default=None,
                   help="symmetric ranges (ORT defaults: percentile yes, others no)")
    g.add_argument("--scenario", choices=("same", "p3"), help="distribution: scenario (default same)")
    g.add_argument("--qtype", choices=("int8", "uint8", "int16", "uint16"),
                   help="mse/pow2/auto: target type of the error model (default int8; quantize: the activation type)")
    g.add_argument("--pow2-method", choices=("NonOverflow", "MinMSE"), help="pow2: scale choice (default MinMSE)")
    g.add_argument("--minmse-mode", choices=("All", "MostCommon"),
                   help="pow2 MinMSE: over all data, or the most common per-batch choice (default All)")
    if minmax:
        g.add_argument("--moving-average", action="store_true", default=None, help="minmax: moving average of ranges")
        g.add_argument("--averaging-constant", type=_float, metavar="C",
                       help="minmax: moving-average constant (default 0.01)")
        g.add_argument("--max-intermediate-outputs", type=_positive_int, metavar="K",
                       help="minmax: fold ranges every K batches")
        if per_channel:
            g.add_argument("--per-channel", action="store_true", default=None, help="minmax: per-channel ranges")
    if collection:
        g.add_argument("--mode", choices=("auto", "exact", "streaming"),
                       help="histogram collection: exact (ORT-identical, reads the data twice), streaming "
                            "(one pass), auto (default: exact when the data can be read twice)")
        g.add_argument("--streaming-bins", type=_positive_int, metavar="N",
                       help="streaming mode: bins of the batch-invariant histogram (power of two, default 16384)")


def _add_data_options(p: argparse.ArgumentParser, *, required: bool) -> None:
    g = p.add_argument_group("calibration data")
    g.add_argument("--data", nargs="+", metavar="PATH", required=required,
                   help="data files or folders: .npy, .npz, model-zoo .pb or images (.jpg .png .bmp)")
    g.add_argument("--batch-size", type=_positive_int, default=1, metavar="N",
                   help="data items per batch: files, or one file per input of a multi-input model; a file "
                        "holding a batch of k samples adds k rows (default 1)")
    g.add_argument("--preprocess", choices=("none", "mobilenet", "resnet", "caffe2"), default="none",
                   help="image preprocessing preset (default none)")
    g.add_argument("--input-shape", type=_shape, metavar="DIMS",
                   help="override the input shape, e.g. 1,3,224,224 ('?' or <= 0: dynamic)")
    g.add_argument("--layout", choices=("NCHW", "NHWC"), type=str.upper, help="image layout (default: from the model)")
    g.add_argument("--providers", nargs="+", metavar="EP", help="execution providers for calibration inference")
    g.add_argument("--op-types", nargs="+", metavar="OP", help="only calibrate/quantize these op types")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def _calibrator_options(args: argparse.Namespace) -> dict[str, Any]:
    """create_calibrator extra_options for the chosen method (options for other methods are
    ignored with a warning)."""
    method = args.method
    given = {
        "num_bins": getattr(args, "num_bins", None),
        "num_quantized_bins": getattr(args, "num_quantized_bins", None),
        "percentile": getattr(args, "percentile", None),
        "symmetric": getattr(args, "symmetric", None),
        "scenario": getattr(args, "scenario", None),
        "moving_average": getattr(args, "moving_average", None),
        "averaging_constant": getattr(args, "averaging_constant", None),
        "max_intermediate_outputs": getattr(args, "max_intermediate_outputs", None),
        "per_channel": getattr(args, "calib_per_channel", None),
        "CollectionMode": getattr(args, "mode", None),
        "StreamingBins": getattr(args, "streaming_bins", None),
        **{k: getattr(args, k, None) for k in _METHOD_OPTION_KEYS},
    }
    applies = {
        "minmax": {"symmetric", "moving_average", "averaging_constant", "max_intermediate_outputs", "per_channel"},
        "entropy": {"num_bins", "num_quantized_bins", "symmetric", "CollectionMode", "StreamingBins"},
        "percentile": {"num_bins", "percentile", "symmetric", "CollectionMode", "StreamingBins"},
        "distribution": {"num_bins", "scenario", "CollectionMode", "StreamingBins"},
    }.get(method) or {"StreamingBins", *_histocal_option_names(method)}
    options: dict[str, Any] = {}
    for key, value in given.items():
        if value is None:
            continue
        if key in applies:
            options[key] = value
        else:
            logger.warning("option %s does not apply to --method %s; ignored", _flag(key), method)
    if method not in _METHOD_NAMES:
        options["MethodOptions"] = {k: options.pop(k) for k in list(options) if k != "StreamingBins"}
    return options


def _histocal_option_names(method: str) -> tuple[str, ...]:
    from .. import methods

    return tuple(methods.METHOD_OPTIONS.get(method, ()))


def _compute_settings(args: argparse.Namespace) -> dict[str, Any]:
    """CalibrationState.compute keyword settings for the chosen histogram method."""
    applies = {
        "minmax": ("symmetric",),
        "entropy": ("num_bins", "num_quantized_bins", "symmetric"),
        "percentile": ("num_bins", "percentile", "symmetric"),
        "distribution": ("num_bins", "scenario"),
    }.get(args.method) or _histocal_option_names(args.method)
    settings = {}
    for key in ("num_bins", "num_quantized_bins", "percentile", "symmetric", "scenario", "moving_average",
                "averaging_constant", "max_intermediate_outputs", "mode", "streaming_bins", *_METHOD_OPTION_KEYS):
        value = getattr(args, key, None)
        if value is None:
            continue
        if key in applies:
            settings[key] = value
        else:
            logger.warning("option %s does not apply to --method %s computed from a state; ignored", _flag(key),
                           args.method)
    return settings


def _flag(key: str) -> str:
    return {"CollectionMode": "--mode", "StreamingBins": "--streaming-bins", "per_channel": "--per-channel"}.get(
        key, "--" + key.replace("_", "-")
    )


# ---------------------------------------------------------------------------------------------
# Calibration


def _open_data(args: argparse.Namespace, model: Path) -> Any:
    from ..io.data import open_calibration_data

    data = open_calibration_data(
        model, args.data, batch_size=args.batch_size, preprocess=args.preprocess,
        input_shape=args.input_shape, layout=args.layout, validate=True,
    )
    return data


def _calibrate(args: argparse.Namespace, model: Path, data: Any, *, want_state: bool) -> tuple[Any, Any]:
    """Run histocal's calibrator on ``data``: (TensorsData, calibrator). The calibrator is kept
    (for ``save_state``) only when ``want_state``."""
    from .. import calibrators

    options = _calibrator_options(args)
    with tempfile.TemporaryDirectory(prefix="histocal.") as tmp:
        calibrator = calibrators.create_calibrator(
            model,
            args.op_types,
            augmented_model_path=Path(tmp, "augmented_model.onnx").as_posix(),
            calibrate_method=args.method,
            providers=args.providers,
            extra_options=options,
        )
        if args.no_progress:
            calibrator.show_progress = False
        if want_state and not callable(getattr(calibrator, "save_state", None)):
            raise CliError(f"--state: {args.method} calibration keeps no histograms; calibrate with a histogram "
                           "method (entropy, percentile, distribution): its state also computes minmax ranges")
        start = time.perf_counter()
        calibrator.collect_data(data)
        ranges = calibrator.compute_data()
        logger.info("calibrated %d tensors with %s in %.2f s", len(ranges.data), args.method,
                    time.perf_counter() - start)
        if not want_state:
            del calibrator
            calibrator = None
        return ranges, calibrator


def _data_fingerprint(files: Sequence[Path]) -> str:
    """sha256 over the data files' names and contents, in feed order."""
    import hashlib

    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode("utf-8", "surrogateescape") + b"\0")
        with open(f, "rb") as fp:
            for chunk in iter(lambda: fp.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return "sha256:" + digest.hexdigest()


def _write_outputs(ranges: Any, cache: Path | None, calibrator: Any, state: Path | None,
                   fingerprint: str | None = None) -> None:
    """Stage every output next to its destination, then move them all into place."""
    from ..io.cache import save_tensors_data

    with contextlib.ExitStack() as stack:
        moves = []
        if state is not None:
            tmp_state = stack.enter_context(_staged(state, state.suffix))
            calibrator.save_state(tmp_state, data_fingerprint=fingerprint)
            moves.append((tmp_state, state))
        if cache is not None:
            tmp_cache = stack.enter_context(_staged(cache, ".json"))
            save_tensors_data(ranges, tmp_cache)
            moves.append((tmp_cache, cache))
        for tmp, final in moves:
            os.replace(tmp, final)
            logger.info("wrote %s", final)


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.cache is None and args.state is None:
        raise _UsageError("give --cache and/or --state (where to write the result)")
    model = _check_model(args.model)
    data = _open_data(args, model)
    ranges, calibrator = _calibrate(args, model, data, want_state=args.state is not None)
    fingerprint = _data_fingerprint(data.files) if args.state else None
    _write_outputs(ranges, args.cache and Path(args.cache), calibrator, args.state and Path(args.state), fingerprint)
    sys.stdout.write(
        f"calibrated {len(ranges.data)} tensors ({_display(args.method)}, {data.num_samples} samples "
        f"in {len(data.files)} files)"
        + (f"; cache: {args.cache}" if args.cache else "")
        + (f"; state: {args.state}" if args.state else "")
        + "\n"
    )
    return 0


# ---------------------------------------------------------------------------------------------
# States


def _state_class() -> Any:
    try:
        from ..state import CalibrationState
    except ImportError as e:
        raise CliError(f"histocal states are not available in this build ({e})") from None
    return CalibrationState


def _load_state(path: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise CliError(f"{p}: no such state file" if not p.exists() else f"{p}: not a file")
    return _state_class().load(p)


def _ranges_from_state(args: argparse.Namespace, state: Any) -> Any:
    if args.method is None:
        stored = getattr(state, "method", None)
        if stored is None:
            raise _UsageError("--method is required with --state")
        args.method = _method_key(stored) if stored in METHODS else stored
        _check_method(args)
    return state.compute(args.method, **_compute_settings(args))


def cmd_recompute(args: argparse.Namespace) -> int:
    state = _load_state(args.state)
    ranges = _ranges_from_state(args, state)
    _write_outputs(ranges, Path(args.cache), None, None)
    sys.stdout.write(f"computed {len(ranges.data)} tensors ({_display(args.method)}) from {args.state}; "
                     f"cache: {args.cache}\n")
    return 0


# ---------------------------------------------------------------------------------------------
# Quantization


def _quant_type(name: str) -> Any:
    from onnxruntime.quantization import QuantType

    members = {m.lower(): m for m in QuantType.__members__}
    return QuantType[members[name]]


def _default_error_model(args: argparse.Namespace) -> None:
    """histocal's methods minimize the error of the quantization that will be applied: their
    qtype and symmetry default to the activation type and --symmetric-activations."""
    from .. import methods

    options = _histocal_option_names(args.method) if args.method else ()
    if "qtype" in options and args.qtype is None:
        try:
            args.qtype = methods.qtype_of(_quant_type(args.activation_type))
        except ValueError as exc:
            raise CliError(f"--method {args.method}: {exc}") from None
    if "symmetric" in options and args.symmetric is None and args.symmetric_activations is not None:
        args.symmetric = args.symmetric_activations


def _quantization_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """quantize_static's quantization arguments from the command line (also those auto's
    model-level choice quantizes its candidates with)."""
    from onnxruntime.quantization import QuantFormat

    extra_options = {}
    if args.symmetric_activations is not None:
        extra_options["ActivationSymmetric"] = args.symmetric_activations
    if args.symmetric_weights is not None:
        extra_options["WeightSymmetric"] = args.symmetric_weights
    return dict(
        quant_format=QuantFormat.QDQ if args.format == "qdq" else QuantFormat.QOperator,
        op_types_to_quantize=args.op_types,
        per_channel=args.per_channel,
        reduce_range=args.reduce_range,
        activation_type=_quant_type(args.activation_type),
        weight_type=_quant_type(args.weight_type),
        nodes_to_quantize=args.nodes_to_quantize,
        nodes_to_exclude=args.nodes_to_exclude,
        use_external_data_format=args.external_data,
        calibration_providers=args.providers,
        extra_options=extra_options,
    )


def _model_level_auto(args: argparse.Namespace) -> bool:
    return args.method == "auto" and not args.per_tensor_estimate


def _select_auto(args: argparse.Namespace, model: Path, data: Any, quantization: dict[str, Any]) -> Any:
    """auto's model-level choice (see histocal.selection): the chosen candidate's ranges."""
    from .. import methods
    from ..quantize.integration import calibrate_and_select

    options = _calibrator_options(args)  # warns about options that do not apply to auto
    eval_samples = args.eval_samples or methods.AUTO_SELECTION_OPTIONS["eval_samples"]
    folds = args.folds or methods.AUTO_SELECTION_OPTIONS["folds"]
    start = time.perf_counter()
    chosen = calibrate_and_select(
        model, data, eval_samples=eval_samples, folds=folds, method_options=options.get("MethodOptions"),
        streaming_bins=options.get("StreamingBins"), show_progress=False if args.no_progress else None,
        **quantization,
    )
    logger.info("auto chose %s (output SQNR %.2f dB, %s on %d batches) in %.2f s", chosen.label,
                chosen.sqnr_db[chosen.label], chosen.scoring, chosen.eval_samples, time.perf_counter() - start)
    args.auto_choice = chosen.label
    return chosen.ranges


def cmd_quantize(args: argparse.Namespace) -> int:
    from ..io.cache import check_cache, load_tensors_data, save_tensors_data
    from ..quantize.integration import quantize_static

    sources = [s for s in ("data", "state") if getattr(args, s) is not None]
    if len(sources) > 1:
        raise _UsageError("give either --data or --state, not both")
    if not sources and args.cache is None:
        raise _UsageError("give --data, --cache or --state")
    model = _check_model(args.model)
    output = Path(args.output)
    cache = Path(args.cache) if args.cache else None
    write_cache = False
    _default_error_model(args)
    quantization = _quantization_arguments(args)

    if args.state is not None:
        ranges = _ranges_from_state(args, _load_state(args.state))
    elif args.data is None:  # --cache alone: reuse it
        if not cache.is_file():
            raise CliError(f"{cache}: no such calibration cache" if not cache.exists() else f"{cache}: not a file")
        ranges = load_tensors_data(cache)
        cached = _method_key(ranges.calibration_method)
        if args.method is None:
            args.method = cached if cached in METHODS else "minmax"
        elif args.method != cached:
            raise CliError(f"{cache}: cache made with {ranges.calibration_method}, not --method {args.method}")
    else:
        args.method = args.method or "minmax"
        data = _open_data(args, model)
        ranges = check_cache(cache, _method_enum(args.method), False) if cache is not None else None
        if ranges is not None:
            logger.info("reusing calibration cache %s", cache)
        elif _model_level_auto(args):
            ranges = _select_auto(args, model, data, quantization)
            write_cache = cache is not None
        else:
            ranges, _ = _calibrate(args, model, data, want_state=False)
            write_cache = cache is not None
    if args.method != "auto" or args.data is None or args.per_tensor_estimate:
        for flag, value in (("--eval-samples", args.eval_samples), ("--folds", args.folds),
                            ("--per-tensor-estimate", args.per_tensor_estimate or None)):
            if value is not None:
                logger.warning("option %s applies only to --method auto with --data; ignored", flag)

    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{output.name}.", dir=output.parent) as tmp:
        ranges_file = Path(tmp, "ranges.json")
        save_tensors_data(ranges, ranges_file)
        staged = Path(tmp, "out", output.name)
        staged.parent.mkdir()
        quantize_static(model, staged, None, calibrate_method=ranges.calibration_method,
                        calibration_cache_path=ranges_file, **quantization)
        if write_cache:
            _write_outputs(ranges, cache, None, None)
        # Side files (external data) first, the model last: a reader never sees a model
        # without its data.
        for f in sorted(staged.parent.iterdir(), key=lambda f: f.name == output.name):
            os.replace(f, output.parent / f.name)
    logger.info("wrote %s", output)
    how = _display(args.method) + (f" ({args.auto_choice})" if getattr(args, "auto_choice", None) else "")
    sys.stdout.write(f"quantized {model} -> {output} ({how} ranges, {args.format}, "
                     f"activations {args.activation_type}, weights {args.weight_type})\n")
    return 0


# ---------------------------------------------------------------------------------------------
# Inspect


def _jsonable(value: Any) -> Any:
    """Strict JSON: non-finite floats become the strings 'NaN', 'Infinity', '-Infinity'."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (np.floating, float)):
        v = float(value)
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return v
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "name") and hasattr(value, "value") and not isinstance(value, (str, int)):  # enums
        return value.name
    return value


def _scalar_or_list(a: Any) -> Any:
    arr = np.asarray(a)
    return arr.item() if arr.size == 1 else arr


def _tensor_entry(td: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("lowest", "highest", "avg", "std"):
        if hasattr(td, key):
            out[key] = _scalar_or_list(getattr(td, key))
    hist = getattr(td, "hist", None)
    if isinstance(hist, np.ndarray):  # the histogram itself is summarised by its size
        out["hist_bins"] = int(hist.size)
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, np.ndarray):
        if value.size == 0:
            return "[]"
        with np.errstate(all="ignore"):
            return f"[{value.size}] {np.nanmin(value):.6g}..{np.nanmax(value):.6g}"
    if isinstance(value, float):
        return f"{value:.9g}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines) + "\n"


def _inspect_cache(path: Path) -> dict[str, Any]:
    from ..io.cache import load_tensors_data, read_json_file

    ranges = load_tensors_data(path)
    document = read_json_file(path, what="calibration cache")
    return {
        "kind": "ort-cache",
        "path": str(path),
        "method": _METHOD_NAMES.get(_method_key(ranges.calibration_method), str(ranges.calibration_method)),
        "smooth_quant": bool(document.get("smooth_quant", False)),
        "num_tensors": len(ranges.data),
        "tensors": {name: _tensor_entry(td) for name, td in ranges.data.items()},
    }


def _inspect_state(path: Path, state: Any) -> dict[str, Any]:
    """Header facts of a CalibrationState, and per tensor: dtype, value counts (finite, NaN,
    +-Inf, batches), the data range (MinMax) and the ranges of the state's own method."""
    names = list(state.names)
    out: dict[str, Any] = {
        "kind": "histocal-state",
        "path": str(path),
        "method": state.method,
        "mode": state.mode,
        "model_fingerprint": state.model_fingerprint,
        "data_fingerprints": list(state.data_fingerprints),
        "histocal_version": state.histocal_version,
        "options": state.options,
        "num_tensors": len(names),
    }
    tensors: dict[str, dict[str, Any]] = {}
    for name in names:
        finite, nan, posinf, neginf, batches = state.counts(name)
        tensors[name] = {"dtype": state.dtype(name), "finite": int(finite), "nan": int(nan), "posinf": int(posinf),
                         "neginf": int(neginf), "batches": int(batches)}
    with np.errstate(all="ignore"):
        for name, td in state.compute("minmax").data.items():
            tensors[name]["min"] = _scalar_or_list(td.lowest)
            tensors[name]["max"] = _scalar_or_list(td.highest)
        if state.method in HISTOGRAM_METHODS:
            try:
                ranges = state.compute(state.method)
            except Exception as e:  # noqa: BLE001 - the facts above are still worth showing
                logger.warning("cannot compute %s ranges from %s: %s", state.method, path, e)
            else:
                for name, td in ranges.data.items():
                    tensors[name]["lowest"] = _scalar_or_list(td.lowest)
                    tensors[name]["highest"] = _scalar_or_list(td.highest)
    out["tensors"] = tensors
    return out


def _load_any(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise CliError(f"{path}: no such file")
    if not path.is_file():
        raise CliError(f"{path}: not a file")
    try:
        return _inspect_cache(path)
    except ValueError as cache_error:
        try:
            CalibrationState = _state_class()
        except CliError:
            raise cache_error from None
        try:
            state = CalibrationState.load(path)
        except Exception as state_error:  # noqa: BLE001 - reported with both reasons
            raise CliError(
                f"{path}: neither an ORT calibration cache ({_one_line(cache_error)}) nor a histocal state "
                f"({_one_line(state_error)})"
            ) from None
        return _inspect_state(path, state)


def _range_text(low: Any, high: Any) -> str:
    """"[low, high]"; per-channel ranges as the span of all channels and their count."""
    low, high = np.asarray(low), np.asarray(high)
    if low.size == 1 and high.size == 1:
        return f"[{_fmt(float(low.item()))}, {_fmt(float(high.item()))}]"
    if low.size == 0 or high.size == 0:
        return "[]"
    with np.errstate(all="ignore"):
        return f"[{_fmt(float(np.nanmin(low)))}, {_fmt(float(np.nanmax(high)))}] over {low.size} channels"


_COLUMNS = ["dtype", "data range", "range", "avg", "std", "hist_bins", "finite", "nan", "posinf", "neginf", "batches"]


def _table_row(entry: dict[str, Any]) -> dict[str, str]:
    """One tensor's table cells: the data range (a state's min/max) and the method's range
    (lowest/highest) each as one "[low, high]" cell, the method's marked when it is the data range."""
    row = {k: _fmt(v) for k, v in entry.items() if k not in ("lowest", "highest", "min", "max")}
    if "min" in entry:
        row["data range"] = _range_text(entry["min"], entry["max"])
    if "lowest" in entry:
        row["range"] = _range_text(entry["lowest"], entry["highest"])
        if row["range"] == row.get("data range"):
            row["range"] = "= data range"
    return row


def cmd_inspect(args: argparse.Namespace) -> int:
    info = _load_any(Path(args.file))
    if args.json:
        sys.stdout.write(json.dumps(_jsonable(info), indent=2, allow_nan=False) + "\n")
        return 0
    head = [f"{info['kind']}: {info['path']}"]
    for key, value in info.items():
        if key in ("kind", "path", "tensors"):
            continue
        text = json.dumps(_jsonable(value), allow_nan=False) if isinstance(value, (dict, list)) else _fmt(value)
        head.append(f"{key}: {text}")
    rows = {name: _table_row(entry if isinstance(entry, dict) else {"value": entry})
            for name, entry in info["tensors"].items()}
    columns = sorted({k for row in rows.values() for k in row}, key=lambda k: (_COLUMNS + [k]).index(k))
    titles = [f"{_display(str(info['method']).lower())} range" if c == "range" else c for c in columns]
    table = [[name] + [row.get(c, "") for c in columns] for name, row in rows.items()]
    sys.stdout.write("\n".join(head) + "\n\n" + _table(["tensor", *titles], table))
    return 0


# ---------------------------------------------------------------------------------------------
# Demo


def _demo_model(seed: int = 0) -> Any:
    """A small CNN: X[N,3,32,32] -> 3 convs (ReLU) -> global average pool -> Gemm -> Y[N,10]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def w(name: str, *shape: int) -> Any:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        return numpy_helper.from_array((rng.normal(0, 1, shape) * np.sqrt(2 / fan_in)).astype(np.float32), name)

    inits = [
        w("W1", 16, 3, 3, 3), numpy_helper.from_array(np.zeros(16, np.float32), "B1"),
        w("W2", 32, 16, 3, 3), numpy_helper.from_array(np.full(32, 0.01, np.float32), "B2"),
        w("W3", 32, 32, 3, 3), numpy_helper.from_array(np.zeros(32, np.float32), "B3"),
        w("Wfc", 10, 32), numpy_helper.from_array(np.zeros(10, np.float32), "Bfc"),
    ]
    nodes = [
        helper.make_node("Conv", ["X", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "W3", "B3"], ["c3"], pads=[1, 1, 1, 1], name="conv3"),
        helper.make_node("Add", ["c3", "r2"], ["res"], name="residual"),
        helper.make_node("Relu", ["res"], ["r3"], name="relu3"),
        helper.make_node("GlobalAveragePool", ["r3"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "Wfc", "Bfc"], ["Y"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes, "histocal_demo_cnn",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 10])],
        initializer=inits,
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _release_free_memory() -> None:
    """Give freed heap memory back to the OS (glibc), so that RSS growth measures one run."""
    import gc

    gc.collect()
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)


class _PeakRss:
    """Peak resident-set growth while active, sampled from /proc/self/statm (Linux; else None)."""

    _PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.peak: int | None = None

    @classmethod
    def _rss(cls) -> int | None:
        try:
            with open("/proc/self/statm", "rb") as f:
                return int(f.read().split()[1]) * cls._PAGE
        except (OSError, ValueError, IndexError):
            return None

    def __enter__(self) -> "_PeakRss":
        _release_free_memory()
        self._base = self._rss()
        self._max = self._base
        self._stop = threading.Event()
        if self._base is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            rss = self._rss()
            if rss is not None and rss > self._max:
                self._max = rss

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._base is not None:
            self._thread.join()
            rss = self._rss() or 0
            self.peak = max(self._max, rss) - self._base


def _run_calibrator(factory: Callable[..., Any], model: Path, tmp: Path, method: Any, options: dict[str, Any],
                    data: Any) -> tuple[Any, float, int | None]:
    data.rewind()
    with contextlib.redirect_stdout(io.StringIO()), np.errstate(all="ignore"), _PeakRss() as mem:
        start = time.perf_counter()
        calibrator = factory(model, None, augmented_model_path=str(tmp / "augmented.onnx"),
                             calibrate_method=method, extra_options=options)
        if hasattr(calibrator, "show_progress"):
            calibrator.show_progress = False
        calibrator.collect_data(data)
        ranges = calibrator.compute_data()
        elapsed = time.perf_counter() - start
        del calibrator
    return ranges, elapsed, mem.peak


def _same_ranges(a: Any, b: Any) -> bool:
    """Same tensors and bit-identical (lowest, highest) for each (NaN equal to NaN)."""
    if set(a.data) != set(b.data):
        return False
    for name, ta in a.data.items():
        for x, y in zip(ta.range_value, b.data[name].range_value):
            x, y = np.asarray(x), np.asarray(y)
            if x.dtype != y.dtype or x.shape != y.shape:
                return False
            if not np.array_equal(x, y, equal_nan=True):
                return False
    return True


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{max(n, 0) / 2**20:.0f} MiB"


def cmd_demo(args: argparse.Namespace) -> int:
    import onnx
    from onnxruntime.quantization import calibrate as ort_calibrate
    from onnxruntime.quantization.calibrate import CalibrationMethod

    from .. import calibrators
    from ..io.data import open_calibration_data

    runs = [
        ("Entropy", CalibrationMethod.Entropy, {"num_bins": 2048, "num_quantized_bins": 128}),
        ("Percentile", CalibrationMethod.Percentile, {"num_bins": 2048, "percentile": 99.99}),
        ("Distribution", CalibrationMethod.Distribution, {"num_bins": 2048}),
    ]
    if args.methods:
        runs = [r for r in runs if r[0].lower() in args.methods]
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="histocal-demo.") as tmp_name:
        tmp = Path(tmp_name)
        model = tmp / "cnn.onnx"
        onnx.save_model(_demo_model(), model.as_posix())
        folder = tmp / "data"
        folder.mkdir()
        for i in range(args.samples):
            x = rng.normal(0, 1, (3, 32, 32)).astype(np.float32) * rng.uniform(0.5, 2.0)
            np.save(folder / f"sample_{i:04d}.npy", x)
        data = open_calibration_data(model, folder, batch_size=args.batch_size)
        sys.stdout.write(
            f"histocal demo: CNN [N,3,32,32] (3 conv + residual + fc), {args.samples} samples in "
            f"{len(data)} batches of {args.batch_size}, exact mode\n\n"
        )
        # Warm-up (untimed): library loading and ORT's first-session costs are not a method's.
        _run_calibrator(calibrators.create_calibrator, model, tmp, CalibrationMethod.MinMax, {}, data)
        rows = []
        all_same = True
        for label, method, options in runs:
            ours, t_ours, m_ours = _run_calibrator(
                calibrators.create_calibrator, model, tmp, method, {**options, "CollectionMode": "exact"}, data)
            ort, t_ort, m_ort = _run_calibrator(ort_calibrate.create_calibrator, model, tmp, method, options, data)
            same = _same_ranges(ort, ours)
            all_same &= same
            settings = ", ".join(f"{k}={v}" for k, v in options.items())
            rows.append([
                f"{label} ({settings})", str(len(ours.data)), f"{t_ort:.2f} s", f"{t_ours:.2f} s",
                f"{t_ort / t_ours:.1f}x" if t_ours > 0 else "-", _mib(m_ort), _mib(m_ours),
                "yes" if same else "NO",
            ])
            sys.stdout.flush()
    sys.stdout.write(_table(
        ["method", "tensors", "ORT", "histocal", "speedup", "ORT peak mem", "histocal peak mem", "identical ranges"],
        rows,
    ))
    sys.stdout.write("\n(time: calibrator creation + collect_data + compute_data; peak mem: resident-set "
                     "growth during the run, approximate)\n")
    if not all_same:
        logger.error("ranges differ from onnxruntime's")
        return 1
    return 0


# ---------------------------------------------------------------------------------------------
# Report


def _report_parser(sub: Any) -> None:
    from ..methods import QTYPES
    from ..report import REPORT_METHODS

    p = sub.add_parser("report", help="HTML report of a histocal state: histograms, every method's range and error",
                       description="Write DIR/index.html (a table of every tensor, worst outliers first: counts, "
                                   "NaN/Inf, min/max, outlier ratio, each method's range and estimated SQNR, "
                                   "auto's choice) and one histogram image per tensor (DIR/tensors/*.png) with "
                                   "each method's range marked. Needs matplotlib: pip install matplotlib (or "
                                   "pip install '.[report]' in histocal's source folder).")
    p.add_argument("state", metavar="STATE", help="histocal state file")
    p.add_argument("--out", metavar="DIR", required=True, help="output directory (created if missing)")
    p.add_argument("--qtype", choices=QTYPES, default="int8", help="target type of the ranges and errors (default int8)")
    p.add_argument("--symmetric", action=argparse.BooleanOptionalAction, default=False,
                   help="symmetric quantization (default: asymmetric)")
    p.add_argument("--methods", nargs="+", choices=REPORT_METHODS, metavar="METHOD",
                   help=f"only these methods ({' '.join(REPORT_METHODS)}; default all)")
    p.add_argument("--max-tensors", type=_count, metavar="N",
                   help="plot only the N tensors with the largest outlier ratios (the table lists all)")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from ..report import require_matplotlib, write_report

    require_matplotlib()
    state = _load_state(args.state)
    index = write_report(state, Path(args.out), qtype=args.qtype, symmetric=args.symmetric, methods=args.methods,
                         max_tensors=args.max_tensors, source=args.state)
    plotted = len(state.names) if args.max_tensors is None else min(args.max_tensors, len(state.names))
    logger.info("wrote %s", index)
    sys.stdout.write(f"report of {len(state.names)} tensors ({plotted} plotted): {index}\n")
    return 0


# ---------------------------------------------------------------------------------------------
# Parser and entry point


def _add_verbosity(parser: argparse.ArgumentParser, *, default: bool) -> None:
    """-v / -q; without defaults (``default=False``) they set nothing unless given."""
    unset = argparse.SUPPRESS
    parser.add_argument("-v", "--verbose", action="count", default=0 if default else unset,
                        help="more logging (-vv: debug)")
    parser.add_argument("-q", "--quiet", action="store_true", default=False if default else unset,
                        help="errors only")


def build_parser() -> argparse.ArgumentParser:
    from .._version import __version__

    parser = _Parser(
        prog="histocal",
        description="ORT-identical, faster calibration for ONNX post-training quantization.",
    )
    parser.add_argument("--version", action="version", version=f"histocal {__version__}")
    _add_verbosity(parser, default=True)
    verbosity = argparse.ArgumentParser(add_help=False)
    _add_verbosity(verbosity, default=False)
    # -v / -q also after the subcommand: every subparser takes them (without defaults of its own,
    # which would replace the values given before the subcommand).
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=functools.partial(_Parser, parents=[verbosity]))

    p = sub.add_parser("calibrate", help="calibrate a model: write an ORT calibration cache and/or a histocal state",
                       description="Calibrate MODEL on calibration data; write ONNX Runtime's JSON calibration "
                                   "cache (--cache) and/or a histocal state (--state) from which other "
                                   "histogram methods can be computed without inference (histocal recompute).")
    p.add_argument("model", metavar="MODEL", help="ONNX model")
    _add_data_options(p, required=True)
    _add_method_options(p, default_method="minmax", per_channel=False)
    p.add_argument("--per-channel", dest="calib_per_channel", action="store_true", default=None,
                   help="minmax: per-channel ranges")
    g = p.add_argument_group("outputs (at least one)")
    g.add_argument("--cache", metavar="ORT_CACHE.json", help="write ONNX Runtime's calibration cache here")
    g.add_argument("--state", metavar="STATE", help="write the histocal state here (histogram methods)")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("quantize", help="calibrate (or reuse a cache / state) and write a quantized model",
                       description="Quantize MODEL into OUTPUT with onnxruntime's quantize_static, calibrated by "
                                   "histocal on --data, or from an existing ORT cache (--cache) or a histocal "
                                   "state (--state). With --data and --cache, the cache is reused if it exists "
                                   "and written otherwise (ORT's rule).")
    p.add_argument("model", metavar="MODEL", help="ONNX model (float)")
    p.add_argument("output", metavar="OUTPUT", help="quantized model to write")
    _add_data_options(p, required=False)
    g = p.add_argument_group("calibration source (one of --data, --cache, --state)")
    g.add_argument("--cache", metavar="FILE", help="ORT calibration cache to reuse (or to write, with --data)")
    g.add_argument("--state", metavar="FILE", help="histocal state to compute the ranges from")
    _add_method_options(p, default_method=None, per_channel=False)
    g = p.add_argument_group("quantization")
    g.add_argument("--format", choices=FORMATS, default="qdq", help="QDQ or QOperator model (default qdq)")
    g.add_argument("--per-channel", action="store_true", help="quantize weights per channel")
    g.add_argument("--activation-type", choices=QUANT_TYPES, type=str.lower, default="qint8",
                   help="activation type (default qint8)")
    g.add_argument("--weight-type", choices=QUANT_TYPES, type=str.lower, default="qint8",
                   help="weight type (default qint8)")
    g.add_argument("--reduce-range", action="store_true", help="7-bit weights (for older CPUs)")
    g.add_argument("--symmetric-activations", action=argparse.BooleanOptionalAction, default=None,
                   help="ORT extra option ActivationSymmetric")
    g.add_argument("--symmetric-weights", action=argparse.BooleanOptionalAction, default=None,
                   help="ORT extra option WeightSymmetric")
    g.add_argument("--nodes-to-quantize", nargs="+", metavar="NODE", help="quantize only these nodes")
    g.add_argument("--nodes-to-exclude", nargs="+", metavar="NODE", help="do not quantize these nodes")
    g.add_argument("--external-data", action="store_true", help="write weights as external data")
    g = p.add_argument_group("auto (--method auto with --data)")
    g.add_argument("--eval-samples", type=_positive_int, metavar="N",
                   help="auto: choose the range set (per-tensor estimate or one method's) whose quantized model's "
                        "output is closest to the float model's, cross-validated (--folds) on the first N calibration "
                        f"batches (of --batch-size items), kept in memory (default {AUTO_EVAL_SAMPLES})")
    g.add_argument("--folds", type=_folds, metavar="K",
                   help="auto: K-fold cross-validation on those batches (batch i in fold i mod K; each fold scored "
                        f"with ranges calibrated on all the other data) (default {AUTO_FOLDS})")
    g.add_argument("--per-tensor-estimate", action="store_true",
                   help="auto: per tensor, the candidate with the least estimated error; no model evaluation")
    p.set_defaults(func=cmd_quantize)

    p = sub.add_parser("inspect", help="show what an ORT calibration cache or a histocal state holds",
                       description="Show the method, tensors and ranges of an ORT calibration cache, or of a "
                                   "histocal state (plus model fingerprint, non-finite counts, options).")
    p.add_argument("file", metavar="FILE", help="ORT calibration cache (JSON) or histocal state")
    p.add_argument("--json", action="store_true", help="machine-readable JSON instead of a table")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("recompute", help="compute another histogram method from a histocal state (no inference)",
                       description="Compute ranges for a histogram method from a histocal STATE (written by "
                                   "'histocal calibrate --state') and write ONNX Runtime's calibration cache.")
    p.add_argument("state", metavar="STATE", help="histocal state file")
    _add_method_options(p, default_method=None, minmax=False, collection=False, required=True)
    p.add_argument("--cache", metavar="OUT", required=True, help="ORT calibration cache to write")
    p.set_defaults(func=cmd_recompute)
    _report_parser(sub)

    p = sub.add_parser("demo", help="compare histocal with onnxruntime on a small CNN (time, memory, ranges)",
                       description="Build a small CNN and synthetic data in a temp folder, calibrate with "
                                   "onnxruntime and with histocal (exact mode) and print time, peak memory and "
                                   "whether the ranges are identical.")
    p.add_argument("--samples", type=_positive_int, default=64, metavar="N", help="calibration samples (default 64)")
    p.add_argument("--batch-size", type=_positive_int, default=8, metavar="N", help="batch size (default 8)")
    p.add_argument("--methods", nargs="+", choices=HISTOGRAM_METHODS, metavar="METHOD",
                   help="only these methods (entropy percentile distribution; default all)")
    p.set_defaults(func=cmd_demo)
    return parser


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            message = _one_line(message)
        return f"histocal: {record.levelname.lower()}: {message}"


def _ort_noise(record: logging.LogRecord) -> bool:
    """onnxruntime's quantize_static advice to pre-process the model, on every run: debug only."""
    return not (record.name == "root" and str(record.msg).startswith("Please consider"))


@contextlib.contextmanager
def _logging(level: int) -> Iterator[None]:
    """Log to the current stderr for the duration of one command (also when called in-process)."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    handler.setLevel(level)
    if level > logging.DEBUG:
        handler.addFilter(_ort_noise)
    saved = root.level
    root.addHandler(handler)
    root.setLevel(min(level, saved) if saved else level)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(saved)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version (0) and usage errors (2)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    level = logging.ERROR if args.quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    with _logging(level):
        try:
            _load_plugins(args)
            _check_method(args)
            return args.func(args)
        except _UsageError as e:
            subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            sub = subparsers[0].choices.get(args.command, parser) if subparsers else parser
            try:
                sub.error(str(e))
            except SystemExit as exit_:
                return exit_.code if isinstance(exit_.code, int) else 2
            return 2
        except KeyboardInterrupt:
            logger.error("interrupted")
            return 130
        except Exception as e:  # noqa: BLE001 - every failure is one line on stderr, exit 1
            logger.debug("traceback", exc_info=True)
            text = str(e) or type(e).__name__
            if isinstance(e, (OSError,)) and getattr(e, "filename", None) and str(e.filename) not in text:
                text = f"{e.filename}: {text}"
            logger.error("%s", _one_line(text))
            return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

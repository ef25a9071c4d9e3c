"""What the commands share: errors, the parser class, argument types, method and data options,
one calibration run and its outputs."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ..methods.table import HISTOCAL_METHODS, HISTOCAL_TABLE, ORT_METHODS, ORT_TABLE, QTYPES, TABLE

ALL_ORT_OPTIONS = {o.name for m in ORT_TABLE for o in m.options}

logger = logging.getLogger("histocal.cli")


METHODS = ORT_METHODS
HISTOGRAM_METHODS = tuple(m.name for m in ORT_TABLE if m.histogram == "exact")
_METHOD_NAMES = {m.name: m.ort.name for m in ORT_TABLE if m.ort is not None}
# Options of histocal's own methods only (mse, kl, pow2, auto), passed as MethodOptions.
_METHOD_OPTION_KEYS = tuple(
    dict.fromkeys(o.name for m in HISTOCAL_TABLE for o in m.options if o.name not in ALL_ORT_OPTIONS)
)
# histocal.methods.AUTO_SELECTION_OPTIONS["eval_samples"] and ["folds"] (not imported: fast --help)
AUTO_EVAL_SAMPLES = 16
AUTO_FOLDS = 4


class CliError(Exception):
    """A failure to report as one line on stderr (exit code 1)."""


class _UsageError(Exception):
    """Raised by a subcommand for an invalid option combination found after parsing (exit 2)."""


def _did_you_mean(word: str, candidates: Sequence[str]) -> str:
    """ " (did you mean X?)" for the closest candidate, or ""."""
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
                parts.append(
                    f"{action.metavar or action.dest.upper()}"
                    + (" ..." if isinstance(action, argparse._SubParsersAction) else "")
                )
        for action in self._actions:
            if action.option_strings and action.required:
                parts.append(
                    f"{action.option_strings[0]} {action.metavar or action.dest.upper()}"
                    + (" ..." if action.nargs in ("+", "*") else "")
                )
        options = ["[options]"] if any(a.option_strings and not a.required for a in self._actions) else []
        return " ".join([f"usage: {self.prog}", *options, *parts])

    def error(self, message: str) -> NoReturn:
        self.exit(
            2, f"{self.short_usage()}\n{self.prog}: error: {message}\nRun '{self.prog} --help' for the full usage.\n"
        )

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

    def _subcommand(self, parsed: argparse.Namespace) -> _Parser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                name = getattr(parsed, action.dest, None)
                return action.choices.get(name) if isinstance(name, str) else None
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


# The largest integer an option takes: what the Rust kernels and numpy index with (int64).
_MAX_INT = 2**63 - 1


def _int_at_least(minimum: int, text: str, maximum: int = _MAX_INT) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum and maximum == _MAX_INT:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
    if not minimum <= value <= maximum:
        raise argparse.ArgumentTypeError(f"expected an integer in [{minimum}, {maximum}], got {value}")
    return value


def _bins(text: str) -> int:
    """A histogram's bin count: at most what histocal's histograms take (``_core.MAX_BINS``)."""
    from .._core import MAX_BINS

    return _int_at_least(1, text, MAX_BINS)


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


def _add_method_options(
    p: argparse.ArgumentParser,
    *,
    default_method: str | None,
    minmax: bool = True,
    per_channel: bool = True,
    collection: bool = True,
    required: bool = False,
    default_help: str | None = None,
) -> None:
    """Method options; ``minmax=False``: only the options a state's ``compute`` takes.
    ``default_help``: what --method defaults to, when not one method."""
    g = p.add_argument_group("calibration method")
    g.add_argument(
        "--method",
        metavar="METHOD",
        default=default_method,
        required=required,
        help=f"{', '.join(METHODS + HISTOCAL_METHODS)} or a method registered by --plugin"
        + ("" if required else f" (default: {default_method or default_help})"),
    )
    g.add_argument(
        "--plugin",
        action="append",
        metavar="MODULE[:FUNC]",
        help="import MODULE (which calls histocal.register_method), or register MODULE's FUNC "
        "as method FUNC; repeatable",
    )
    g.add_argument(
        "--method-for",
        action="append",
        metavar="KEY=METHOD",
        help="another method for chosen tensors; KEY: name:TENSOR, op:OPTYPE (the op type of the node producing "
        "them; needs the model) or either; repeatable (e.g. --method-for name:logits=isotone)",
    )
    g.add_argument(
        "--num-bins",
        type=_bins,
        metavar="N",
        help="histogram bins (ORT defaults: entropy 128, percentile/distribution 2048)",
    )
    g.add_argument("--num-quantized-bins", type=_bins, metavar="N", help="entropy: quantized bins (default 128)")
    g.add_argument("--percentile", type=_percentile, metavar="P", help="percentile: the percentile (default 99.999)")
    g.add_argument(
        "--symmetric",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="symmetric ranges (ORT defaults: percentile yes, others no)",
    )
    scenario = TABLE["distribution"].option("scenario")
    g.add_argument(
        "--scenario", choices=scenario.choices, help=f"distribution: {scenario.help} (default {scenario.default})"
    )
    g.add_argument(
        "--qtype",
        choices=QTYPES,
        help="mse/pow2/auto: target type of the error model (default int8; quantize: the activation type)",
    )
    for name in _METHOD_OPTION_KEYS:
        if name == "qtype":
            continue
        users = [m for m in HISTOCAL_TABLE if any(o.name == name for o in m.options)]
        option = users[0].option(name)
        g.add_argument(
            f"--{name.replace('_', '-')}",
            choices=option.choices,
            help=f"{'/'.join(m.name for m in users)}: {option.help} (default {option.default})",
        )
    if minmax:
        g.add_argument("--moving-average", action="store_true", default=None, help="minmax: moving average of ranges")
        g.add_argument(
            "--averaging-constant", type=_float, metavar="C", help="minmax: moving-average constant (default 0.01)"
        )
        g.add_argument(
            "--max-intermediate-outputs", type=_positive_int, metavar="K", help="minmax: fold ranges every K batches"
        )
        if per_channel:
            g.add_argument("--per-channel", action="store_true", default=None, help="minmax: per-channel ranges")
    if collection:
        g.add_argument(
            "--mode",
            choices=("auto", "exact", "streaming"),
            help="histogram collection: exact (ORT-identical; one inference pass while the outputs fit "
            "the memory budget, the rest run again), streaming (one pass, bounded memory), auto (default: "
            "exact, but streaming for data read once whose outputs outgrow the budget)",
        )
        g.add_argument(
            "--memory-budget",
            metavar="SIZE",
            help="exact mode: outputs kept to save a second inference pass, in bytes or e.g. 512M, 2GiB "
            "(default: HISTOCAL_MEMORY_BUDGET, else the lesser of 25%% of available memory and 8 GiB)",
        )
        g.add_argument(
            "--streaming-bins",
            type=_bins,
            metavar="N",
            help="streaming mode: bins of the batch-invariant histogram (power of two, default 16384)",
        )


def _add_data_options(p: argparse.ArgumentParser, *, required: bool) -> None:
    g = p.add_argument_group("calibration data")
    g.add_argument(
        "--data",
        nargs="+",
        metavar="PATH",
        required=required,
        help="data files or folders: .npy, .npz, model-zoo .pb or images (.jpg .png .bmp)",
    )
    g.add_argument(
        "--batch-size",
        type=_positive_int,
        default=1,
        metavar="N",
        help="data items per batch: files, or one file per input of a multi-input model; a file "
        "holding a batch of k samples adds k rows (default 1)",
    )
    g.add_argument(
        "--preprocess",
        choices=("none", "mobilenet", "resnet", "caffe2"),
        default="none",
        help="image preprocessing preset (default none)",
    )
    g.add_argument(
        "--input-shape",
        type=_shape,
        metavar="DIMS",
        help="override the input shape, e.g. 1,3,224,224 ('?' or <= 0: dynamic)",
    )
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
        "channel_axis": getattr(args, "calib_axis", None),
        "CollectionMode": getattr(args, "mode", None),
        "StreamingBins": getattr(args, "streaming_bins", None),
        "MemoryBudget": getattr(args, "memory_budget", None),
        **{k: getattr(args, k, None) for k in _METHOD_OPTION_KEYS},
    }
    channels = {"per_channel", "channel_axis"}  # per-channel histograms: every histogram method
    applies = {
        "minmax": {"symmetric", "moving_average", "averaging_constant", "max_intermediate_outputs", "per_channel"},
        "entropy": {
            "num_bins",
            "num_quantized_bins",
            "symmetric",
            "CollectionMode",
            "StreamingBins",
            "MemoryBudget",
            *channels,
        },
        "percentile": {
            "num_bins",
            "percentile",
            "symmetric",
            "CollectionMode",
            "StreamingBins",
            "MemoryBudget",
            *channels,
        },
        "distribution": {"num_bins", "scenario", "CollectionMode", "StreamingBins", "MemoryBudget", *channels},
    }.get(method) or {"StreamingBins", *channels, *_histocal_option_names(method)}
    options: dict[str, Any] = {}
    for key, value in given.items():
        if value is None:
            continue
        if key in applies:
            options[key] = value
        else:
            logger.warning("option %s does not apply to --method %s; ignored", _flag(key), method)
    if method not in _METHOD_NAMES:
        kept = {"StreamingBins", *channels}
        options["MethodOptions"] = {k: options.pop(k) for k in list(options) if k not in kept}
    if getattr(args, "method_for", None):
        options["MethodOverrides"] = args.method_for
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
    for key in (
        "num_bins",
        "num_quantized_bins",
        "percentile",
        "symmetric",
        "scenario",
        "moving_average",
        "averaging_constant",
        "max_intermediate_outputs",
        "mode",
        "streaming_bins",
        *_METHOD_OPTION_KEYS,
    ):
        value = getattr(args, key, None)
        if value is None:
            continue
        if key in applies:
            settings[key] = value
        else:
            logger.warning(
                "option %s does not apply to --method %s computed from a state; ignored", _flag(key), args.method
            )
    return settings


def _flag(key: str) -> str:
    flags = {
        "CollectionMode": "--mode",
        "StreamingBins": "--streaming-bins",
        "MemoryBudget": "--memory-budget",
        "per_channel": "--per-channel",
        "channel_axis": "--axis",
    }
    return flags.get(key, "--" + key.replace("_", "-"))


# ---------------------------------------------------------------------------------------------
# Calibration


def _open_data(args: argparse.Namespace, model: Path) -> Any:
    from ..io.data import open_calibration_data

    data = open_calibration_data(
        model,
        args.data,
        batch_size=args.batch_size,
        preprocess=args.preprocess,
        input_shape=args.input_shape,
        layout=args.layout,
        validate=True,
    )
    return data


def _calibrate(args: argparse.Namespace, model: Path, data: Any, *, want_state: bool) -> tuple[Any, Any]:
    """Run histocal's calibrator on ``data``: (TensorsData, calibrator). The calibrator is kept
    (for ``save_state``) only when ``want_state``."""
    from .. import calibrators

    quark = getattr(args, "quark", False)
    if quark and want_state:
        raise CliError("--state: --quark calibration keeps no histocal state; write --cache")
    options = _calibrator_options(args) if not (quark and args.method == "pow2") else {}
    with tempfile.TemporaryDirectory(prefix="histocal.") as tmp:
        augmented = Path(tmp, "augmented_model.onnx").as_posix()
        if quark:
            from .quark import QUARK_METHODS, quark_calibrator

            if args.method not in QUARK_METHODS:
                raise _UsageError(f"--quark takes --method {', '.join(QUARK_METHODS)}; got {args.method}")
            calibrator = quark_calibrator(args, model, augmented, options)
        else:
            calibrator = calibrators.create_calibrator(
                model,
                args.op_types,
                augmented_model_path=augmented,
                calibrate_method=args.method,
                providers=args.providers,
                extra_options=options,
            )
        if args.no_progress:
            calibrator.show_progress = False
        if want_state and not callable(getattr(calibrator, "save_state", None)):
            raise CliError(
                f"--state: {args.method} calibration keeps no histograms; calibrate with a histogram "
                "method (entropy, percentile, distribution): its state also computes minmax ranges"
            )
        start = time.perf_counter()
        calibrator.collect_data(data)
        ranges = calibrator.compute_data()
        logger.info(
            "calibrated %d tensors with %s in %.2f s", len(ranges.data), args.method, time.perf_counter() - start
        )
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


def _write_outputs(
    ranges: Any, cache: Path | None, calibrator: Any, state: Path | None, fingerprint: str | None = None
) -> None:
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

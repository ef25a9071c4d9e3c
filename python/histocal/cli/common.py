"""What the commands share: errors, the parser class, argument types, method and data options,
one calibration run and its outputs."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import math
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ..methods.settings import (
    AXIS,
    MEMORY_BUDGET,
    METHOD_OPTIONS_KEY,
    METHOD_OVERRIDES_KEY,
    MODE,
    PER_CHANNEL,
    STREAMING_BINS,
    CollectionSettings,
    flag_of,
)
from ..methods.table import ALL_OPTIONS, HISTOCAL_METHODS, ORT_METHODS, ORT_TABLE, TABLE, Option

logger = logging.getLogger("histocal.cli")


METHODS = ORT_METHODS
HISTOGRAM_METHODS = tuple(m.name for m in ORT_TABLE if m.histogram == "exact")
METHOD_NAMES = {m.name: m.ort.name for m in ORT_TABLE if m.ort is not None}
# Every method option's flag comes from the table; MinMax's other ORT options (not in a state) are the CLI's own.
_TABLE_OPTIONS: dict[str, Option] = ALL_OPTIONS
_MINMAX_OPTIONS = ("moving_average", "averaging_constant", "max_intermediate_outputs")
# histocal.methods.AUTO_SELECTION_OPTIONS["eval_samples"] and ["folds"] (not imported: fast --help)
AUTO_EVAL_SAMPLES = 16
AUTO_FOLDS = 4


class CliError(Exception):
    """A failure to report as one line on stderr (exit code 1)."""


class UsageError(Exception):
    """Raised by a subcommand for an invalid option combination found after parsing (exit 2)."""


def _did_you_mean(word: str, candidates: Sequence[str]) -> str:
    """ " (did you mean X?)" for the closest candidate, or ""."""
    import difflib

    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class Parser(argparse.ArgumentParser):
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

    def _subcommand(self, parsed: argparse.Namespace) -> Parser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                name = getattr(parsed, action.dest, None)
                return action.choices.get(name) if isinstance(name, str) else None
        return None


# ---------------------------------------------------------------------------------------------
# Small helpers


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def display(method: str) -> str:
    return METHOD_NAMES.get(method, method)


def check_method(args: argparse.Namespace) -> None:
    """Resolve --method (after --plugin imports) to its canonical name; usage error if unknown."""
    from .. import methods

    if getattr(args, "method", None) is None:
        return
    try:
        args.method = methods.canonical_name(args.method)
    except ValueError as exc:
        raise UsageError(f"{exc}{_did_you_mean(args.method.lower(), methods.method_names())}") from None


def load_plugins(args: argparse.Namespace) -> None:
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


def method_enum(name: str) -> Any:
    """ORT's CalibrationMethod for ORT's methods; histocal's methods travel as MinMax."""
    from onnxruntime.quantization.calibrate import CalibrationMethod

    if name not in METHOD_NAMES:
        return CalibrationMethod.MinMax

    return CalibrationMethod[METHOD_NAMES[name]]


def method_key(method: Any) -> str:
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


def positive_int(text: str) -> int:
    return _int_at_least(1, text)


def fold_count(text: str) -> int:
    return _int_at_least(2, text)


def non_negative_int(text: str) -> int:
    return _int_at_least(0, text)


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _number_in(bounds: tuple[float, float] | None, what: str, text: str) -> float:
    value = finite_float(text)
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        raise argparse.ArgumentTypeError(f"expected a {what} in [{bounds[0]}, {bounds[1]}], got {value}")
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


def check_model(path: str) -> Path:
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


def add_method_options(
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
    for option in _TABLE_OPTIONS.values():
        _add_option(g, option)
    if minmax:
        g.add_argument("--moving-average", action="store_true", default=None, help="minmax: moving average of ranges")
        g.add_argument(
            "--averaging-constant",
            type=finite_float,
            metavar="C",
            help="minmax: moving-average constant (default 0.01)",
        )
        g.add_argument(
            "--max-intermediate-outputs", type=positive_int, metavar="K", help="minmax: fold ranges every K batches"
        )
        if per_channel:
            g.add_argument(PER_CHANNEL.flag, action="store_true", default=None, help="minmax: per-channel ranges")
    if collection:
        CollectionSettings.add_cli_arguments(g, (MODE, MEMORY_BUDGET, STREAMING_BINS), {STREAMING_BINS.name: _bins})


def _option_type(option: Option) -> Any:
    """The argparse type of a table option: its kind within its bounds."""
    if option.kind is int:
        low, high = option.bounds or (1, _MAX_INT)
        return functools.partial(_int_at_least, int(low), maximum=int(high))
    if option.kind is float:
        return functools.partial(_number_in, option.bounds, option.name)
    return None


def _add_option(g: Any, option: Option) -> None:
    """One table option's flag: its users and defaults in the help, its kind and bounds or choices as the type."""
    users = [m for m in TABLE.values() if any(o.name == option.name for o in m.options)]
    defaults = {m.name: m.option(option.name).default for m in users}
    if len(set(map(str, defaults.values()))) == 1:
        default = f"default {_shown(option.default)}"
    else:
        default = "defaults: " + ", ".join(f"{m} {_shown(d)}" for m, d in defaults.items())
    help = f"{'/'.join(defaults)}: {option.help} ({default})"
    if option.kind is bool:
        g.add_argument(option.flag, action=argparse.BooleanOptionalAction, default=None, help=help)
    else:
        metavar = None if option.choices else "N" if option.kind is int else option.name[0].upper()
        g.add_argument(
            option.flag,
            type=_option_type(option),
            choices=option.choices,
            metavar=metavar,
            help=help.replace("%", "%%"),
        )


def _shown(value: Any) -> str:
    return ("yes" if value else "no") if isinstance(value, bool) else str(value)


def add_data_options(p: argparse.ArgumentParser, *, required: bool) -> None:
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
        type=positive_int,
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


def calibrator_options(args: argparse.Namespace) -> dict[str, Any]:
    """create_calibrator extra_options for the chosen method (options for other methods are
    ignored with a warning)."""
    method = args.method
    given = {
        **{name: getattr(args, name, None) for name in (*_TABLE_OPTIONS, *_MINMAX_OPTIONS)},
        **CollectionSettings.extra_options_from_cli(args),
    }
    channels = {s.extra_key for s in (PER_CHANNEL, AXIS)}  # per-channel histograms: every histogram method
    if method == "minmax":
        applies = {*TABLE[method].defaults, *_MINMAX_OPTIONS, PER_CHANNEL.extra_key}
    elif method in HISTOGRAM_METHODS:
        applies = {*TABLE[method].defaults, *(s.extra_key for s in (MODE, STREAMING_BINS, MEMORY_BUDGET)), *channels}
    else:
        applies = {STREAMING_BINS.extra_key, *channels, *histocal_option_names(method)}
    options: dict[str, Any] = {}
    for key, value in given.items():
        if value is None:
            continue
        if key in applies:
            options[key] = value
        else:
            logger.warning("option %s does not apply to --method %s; ignored", _flag(key), method)
    if method not in METHOD_NAMES:
        kept = {STREAMING_BINS.extra_key, *channels}
        options[METHOD_OPTIONS_KEY] = {k: options.pop(k) for k in list(options) if k not in kept}
    if getattr(args, "method_for", None):
        options[METHOD_OVERRIDES_KEY] = args.method_for
    return options


def histocal_option_names(method: str) -> tuple[str, ...]:
    from .. import methods

    return tuple(methods.METHOD_OPTIONS.get(method, ()))


def compute_settings(args: argparse.Namespace) -> dict[str, Any]:
    """CalibrationState.compute keyword settings for the chosen histogram method."""
    applies = tuple(TABLE[args.method].defaults) if args.method in ORT_METHODS else histocal_option_names(args.method)
    settings = {}
    for key in (*_TABLE_OPTIONS, *_MINMAX_OPTIONS, MODE.name, STREAMING_BINS.name):
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
    return flag_of(key)


# ---------------------------------------------------------------------------------------------
# Calibration


def open_data(args: argparse.Namespace, model: Path) -> Any:
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


def run_calibrator(args: argparse.Namespace, model: Path, data: Any, *, want_state: bool) -> tuple[Any, Any]:
    """Run histocal's calibrator on ``data``: (TensorsData, calibrator). The calibrator is kept
    (for ``save_state``) only when ``want_state``."""
    from .. import calibrators

    quark = getattr(args, "quark", False)
    if quark and want_state:
        raise CliError("--state: --quark calibration keeps no histocal state; write --cache")
    options = calibrator_options(args) if not (quark and args.method == "pow2") else {}
    with tempfile.TemporaryDirectory(prefix="histocal.") as tmp:
        augmented = Path(tmp, "augmented_model.onnx").as_posix()
        if quark:
            from .quark import QUARK_METHODS, quark_calibrator

            if args.method not in QUARK_METHODS:
                raise UsageError(f"--quark takes --method {', '.join(QUARK_METHODS)}; got {args.method}")
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


def fingerprint_files(files: Sequence[Path]) -> str:
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


def write_outputs(
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

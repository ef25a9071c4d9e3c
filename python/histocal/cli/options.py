"""The options several commands share: the calibration method and its options (their flags from
the method table), the calibration data, and what they become (create_calibrator's
``extra_options`` and ``CollectionSettings``, ``CalibrationState.compute``'s settings)."""

from __future__ import annotations

import argparse
import functools
import logging
from typing import Any

from ..methods.registry import AUTO_SELECTION_OPTIONS
from ..methods.settings import (
    COLLECTION_FLAGS,
    METHOD_OPTIONS_KEY,
    METHOD_OVERRIDES_KEY,
    MODE,
    PER_CHANNEL,
    SETTINGS,
    STREAMING_BINS,
    CollectionSettings,
    flag_of,
    settings_for,
)
from ..methods.table import ALL_OPTIONS, COLLECT_OPTIONS, HISTOCAL_METHODS, ORT_METHODS, ORT_TABLE, TABLE, Option
from .arguments import MAX_INT, bin_count, input_shape, int_at_least, number_in, positive_int
from .errors import CliError, UsageError, did_you_mean

logger = logging.getLogger("histocal.cli")


METHODS = ORT_METHODS
HISTOGRAM_METHODS = tuple(m.name for m in ORT_TABLE if m.histogram == "exact")
METHOD_NAMES = {m.name: m.ort.name for m in ORT_TABLE if m.ort is not None}
# Every method option's flag comes from the table, also those a state does not hold (MinMax's others).
_TABLE_OPTIONS: dict[str, Option] = ALL_OPTIONS
# model-level auto's defaults, shown in --help
AUTO_EVAL_SAMPLES = AUTO_SELECTION_OPTIONS["eval_samples"]
AUTO_FOLDS = AUTO_SELECTION_OPTIONS["folds"]


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
        raise UsageError(f"{exc}{did_you_mean(args.method.lower(), methods.method_names())}") from None


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
        "them; needs the model) or either; repeatable (e.g. --method-for op:Softmax=mse)",
    )
    for option in _TABLE_OPTIONS.values():
        _add_option(g, option)
    if minmax:
        for option in COLLECT_OPTIONS.values():
            _add_option(g, option)
        if per_channel:
            g.add_argument(PER_CHANNEL.flag, action="store_true", default=None, help="minmax: per-channel ranges")
    if collection:
        CollectionSettings.add_cli_arguments(g, COLLECTION_FLAGS, {STREAMING_BINS.name: bin_count})


def _option_type(option: Option) -> Any:
    """The argparse type of a table option: its kind within its bounds."""
    if option.kind is int:
        low, high = option.bounds or (1, MAX_INT)
        return functools.partial(int_at_least, int(low), maximum=int(high))
    if option.kind is float:
        return functools.partial(number_in, option.bounds, option.name)
    return None


def _add_option(g: Any, option: Option) -> None:
    """One table option's flag: its users and defaults in the help, its kind and bounds or choices as the type."""
    users = [m for m in TABLE.values() if option.name in m.calibrator_defaults]
    defaults = {m.name: m.calibrator_defaults[option.name] for m in users}
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
    return ("yes" if value else "no") if isinstance(value, bool) else "none" if value is None else str(value)


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
        type=input_shape,
        metavar="DIMS",
        help="override the input shape, e.g. 1,3,224,224 ('?' or <= 0: dynamic)",
    )
    g.add_argument("--layout", choices=("NCHW", "NHWC"), type=str.upper, help="image layout (default: from the model)")
    g.add_argument("--providers", nargs="+", metavar="EP", help="execution providers for calibration inference")
    g.add_argument("--op-types", nargs="+", metavar="OP", help="only calibrate/quantize these op types")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def calibrator_options(args: argparse.Namespace) -> tuple[dict[str, Any], CollectionSettings]:
    """create_calibrator's ``extra_options`` for the chosen method (its options: ORT's keys, or
    histocal's under ``MethodOptions``; ``MethodOverrides``) and the ``CollectionSettings`` of the
    flags given. Options and settings that do not apply to the method are ignored with a warning."""
    method = args.method
    ort = method in METHOD_NAMES
    applies = TABLE[method].calibrator_defaults if ort else histocal_option_names(method)
    reads = settings_for(method)
    options: dict[str, Any] = {}
    for name in (*_TABLE_OPTIONS, *COLLECT_OPTIONS):
        value = getattr(args, name, None)
        if value is not None and name in applies:
            options[name] = value
        elif value is not None:
            logger.warning("option %s does not apply to --method %s; ignored", flag_of(name), method)
    for s in SETTINGS:
        if s.flag and s not in reads and getattr(args, s.dest, None) is not None:
            logger.warning("option %s does not apply to --method %s; ignored", s.flag, method)
    if not ort:
        options = {METHOD_OPTIONS_KEY: options}
    if getattr(args, "method_for", None):
        options[METHOD_OVERRIDES_KEY] = args.method_for
    return options, CollectionSettings.from_cli(args, reads)


def histocal_option_names(method: str) -> tuple[str, ...]:
    from .. import methods

    return tuple(methods.METHOD_OPTIONS.get(method, ()))


def compute_settings(args: argparse.Namespace) -> dict[str, Any]:
    """CalibrationState.compute keyword settings for the chosen histogram method."""
    applies = tuple(TABLE[args.method].defaults) if args.method in ORT_METHODS else histocal_option_names(args.method)
    settings = {}
    for key in (*_TABLE_OPTIONS, *COLLECT_OPTIONS, MODE.name, STREAMING_BINS.name):
        value = getattr(args, key, None)
        if value is None:
            continue
        if key in applies:
            settings[key] = value
        else:
            logger.warning(
                "option %s does not apply to --method %s computed from a state; ignored", flag_of(key), args.method
            )
    return settings

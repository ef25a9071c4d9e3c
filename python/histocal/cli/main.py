"""histocal's command line: ``histocal calibrate | quantize | diagnose | inspect | recompute | report | demo``.

Exit codes: 0 success, 1 failure (bad data, unreadable file, calibration or quantization error),
2 usage error. Diagnostics go through :mod:`logging` to stderr (``histocal: error: ...``, one
line); results (tables, JSON) go to stdout. Bad calibration data is detected before any output
file is created, and every output (cache, state, quantized model) is written atomically, so a
failed run leaves nothing behind and never a partial file.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from ..diagnose import DEFAULTS as DIAGNOSE_DEFAULTS
from ..methods.settings import AXIS, PER_CHANNEL, CollectionSettings
from ..methods.table import NON_OVERFLOW
from .calibrate import cmd_calibrate, cmd_recompute, positive_seconds
from .common import (
    AUTO_EVAL_SAMPLES,
    AUTO_FOLDS,
    HISTOGRAM_METHODS,
    Parser,
    UsageError,
    add_data_options,
    add_method_options,
    check_method,
    fold_count,
    load_plugins,
    one_line,
    positive_int,
)
from .demo import cmd_demo
from .diagnose import add_exclusion_options, diagnose_parser
from .inspect import cmd_inspect
from .quantization import FORMATS, QUANT_TYPES
from .quantize import cmd_quantize
from .report import report_parser

logger = logging.getLogger("histocal.cli")


# ---------------------------------------------------------------------------------------------
# Parser and entry point


def _add_verbosity(parser: argparse.ArgumentParser, *, default: bool) -> None:
    """-v / -q; without defaults (``default=False``) they set nothing unless given."""
    unset = argparse.SUPPRESS
    parser.add_argument(
        "-v", "--verbose", action="count", default=0 if default else unset, help="more logging (-vv: debug)"
    )
    parser.add_argument("-q", "--quiet", action="store_true", default=False if default else unset, help="errors only")


def _add_quantization_options(p: argparse.ArgumentParser) -> None:
    """quantize_static's quantization arguments (quantize, diagnose)."""
    g = p.add_argument_group("quantization")
    g.add_argument("--format", choices=FORMATS, default="qdq", help="QDQ or QOperator model (default qdq)")
    g.add_argument("--per-channel", action="store_true", help="quantize weights per channel")
    g.add_argument(
        "--activation-type",
        choices=QUANT_TYPES,
        type=str.lower,
        default="qint8",
        help="activation type (default qint8)",
    )
    g.add_argument(
        "--weight-type", choices=QUANT_TYPES, type=str.lower, default="qint8", help="weight type (default qint8)"
    )
    g.add_argument("--reduce-range", action="store_true", help="7-bit weights (for older CPUs)")
    g.add_argument(
        "--symmetric-activations",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ORT extra option ActivationSymmetric",
    )
    g.add_argument(
        "--symmetric-weights",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ORT extra option WeightSymmetric",
    )
    g.add_argument("--nodes-to-quantize", nargs="+", metavar="NODE", help="quantize only these nodes")
    g.add_argument("--nodes-to-exclude", nargs="+", metavar="NODE", help="do not quantize these nodes")
    g.add_argument("--external-data", action="store_true", help="write weights as external data")


def build_parser() -> argparse.ArgumentParser:
    from .._version import __version__

    parser = Parser(
        prog="histocal",
        description="ORT-identical, faster calibration for ONNX post-training quantization.",
    )
    parser.add_argument("--version", action="version", version=f"histocal {__version__}")
    _add_verbosity(parser, default=True)
    verbosity = argparse.ArgumentParser(add_help=False)
    _add_verbosity(verbosity, default=False)

    # -v / -q also after the subcommand: every subparser takes them (without defaults of its own,
    # which would replace the values given before the subcommand).
    class _SubcommandParser(Parser):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(parents=[verbosity], **kwargs)

    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_SubcommandParser)

    p = sub.add_parser(
        "calibrate",
        help="calibrate a model: write an ORT calibration cache and/or a histocal state",
        description="Calibrate MODEL on calibration data; write ONNX Runtime's JSON calibration "
        "cache (--cache) and/or a histocal state (--state) from which other "
        "histogram methods can be computed without inference (histocal recompute).",
    )
    p.add_argument("model", metavar="MODEL", help="ONNX model")
    add_data_options(p, required=True)
    add_method_options(p, default_method="minmax", per_channel=False)
    CollectionSettings.add_cli_arguments(p, (PER_CHANNEL, AXIS))
    p.add_argument(
        "--quark",
        action="store_true",
        help="AMD Quark's calibrators (histocal.quark): minmax, entropy, percentile, distribution with "
        f"Quark's defaults, or pow2 with Quark's power-of-two (--pow2-method, default {NON_OVERFLOW}; "
        "--minmse-mode, --symmetric, --qtype); writes --cache only",
    )
    g = p.add_argument_group("outputs (at least one)")
    g.add_argument("--cache", metavar="ORT_CACHE.json", help="write ONNX Runtime's calibration cache here")
    g.add_argument("--state", metavar="STATE", help="write the histocal state here (histogram methods)")
    g = p.add_argument_group("distributed (needs Ray: shards of the data on Ray workers, merged exactly)")
    g.add_argument(
        "--workers", type=positive_int, metavar="N", help="calibrate on N Ray workers (a local Ray unless --address)"
    )
    g.add_argument(
        "--address",
        metavar="ADDRESS",
        help="an existing Ray cluster (ray://HOST:10001, or auto); its workers must see the --data paths",
    )
    g.add_argument(
        "--shards",
        type=positive_int,
        metavar="K",
        help="split the data into K shards of whole batches (default: 4 per worker, at most one per batch)",
    )
    g.add_argument(
        "--shard-timeout",
        type=positive_seconds,
        metavar="SECONDS",
        help="a shard running longer is stopped (its worker killed) and redone elsewhere, at most 3 tries "
        "in all (default: no limit)",
    )
    p.set_defaults(func=cmd_calibrate)

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
    _add_quantization_options(p)
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

    p = sub.add_parser(
        "inspect",
        help="show what an ORT calibration cache or a histocal state holds",
        description="Show the method, tensors and ranges of an ORT calibration cache, or of a "
        "histocal state (plus model fingerprint, non-finite counts, options).",
    )
    p.add_argument("file", metavar="FILE", help="ORT calibration cache (JSON) or histocal state")
    p.add_argument("--json", action="store_true", help="machine-readable JSON instead of a table")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "recompute",
        help="compute another histogram method from a histocal state (no inference)",
        description="Compute ranges for a histogram method from a histocal STATE (written by "
        "'histocal calibrate --state') and write ONNX Runtime's calibration cache.",
    )
    p.add_argument("state", metavar="STATE", help="histocal state file")
    add_method_options(p, default_method=None, minmax=False, collection=False, required=True)
    p.add_argument("--cache", metavar="OUT", required=True, help="ORT calibration cache to write")
    p.set_defaults(func=cmd_recompute)
    report_parser(sub)
    diagnose_parser(sub, _add_quantization_options)

    p = sub.add_parser(
        "demo",
        help="compare histocal with onnxruntime on a small CNN (time, memory, ranges)",
        description="Build a small CNN and synthetic data in a temp folder, calibrate with "
        "onnxruntime and with histocal (exact mode) and print time, peak memory and "
        "whether the ranges are identical.",
    )
    p.add_argument("--samples", type=positive_int, default=64, metavar="N", help="calibration samples (default 64)")
    p.add_argument("--batch-size", type=positive_int, default=8, metavar="N", help="batch size (default 8)")
    p.add_argument(
        "--methods",
        nargs="+",
        choices=HISTOGRAM_METHODS,
        metavar="METHOD",
        help="only these methods (entropy percentile distribution; default all)",
    )
    p.set_defaults(func=cmd_demo)
    return parser


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            message = one_line(message)
        text = f"histocal: {record.levelname.lower()}: {message}"
        if record.exc_info:  # -vv's "traceback" record: the traceback itself
            text += "\n" + self.formatException(record.exc_info)
        return text


PRE_PROCESS_HINT = (
    "the model is not pre-processed; onnxruntime advises `python -m onnxruntime.quantization.preprocess "
    "--input MODEL --output MODEL_PRE` first (shape inference, graph optimization; symbolic shape inference "
    "needs sympy, else add --skip_symbolic_shape True). It matters for weights held in Constant nodes: "
    "quantize_static does not quantize them as weights (the quantized model can come out larger than the "
    "float one); pre-processing makes them initializers"
)


class _OncePreProcessHint(logging.Filter):
    """onnxruntime's quantize_static advises pre-processing twice per call (and auto, diagnose and
    --auto-exclude call it many times): say it once per command, in histocal's words."""

    def __init__(self) -> None:
        super().__init__()
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.name == "root" and str(record.msg).startswith("Please consider")):
            return True
        if self.said:
            return False
        self.said = True
        record.msg, record.args = PRE_PROCESS_HINT, ()
        return True


@contextlib.contextmanager
def _logging(level: int) -> Iterator[None]:
    """Log to the current stderr for the duration of one command (also when called in-process)."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    handler.setLevel(level)
    handler.addFilter(_OncePreProcessHint())
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
            load_plugins(args)
            check_method(args)
            return args.func(args)
        except UsageError as e:
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
        except Exception as e:
            logger.debug("traceback", exc_info=True)
            text = str(e) or type(e).__name__
            if isinstance(e, (OSError,)) and getattr(e, "filename", None) and str(e.filename) not in text:
                text = f"{e.filename}: {text}"
            logger.error("%s", one_line(text))
            return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

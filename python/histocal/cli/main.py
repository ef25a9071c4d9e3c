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

from . import calibrate, demo, diagnose, inspect, quantize, report
from .errors import UsageError, one_line
from .options import check_method, load_plugins
from .parser import Parser

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
    # each command's module registers its parser (in the order `histocal --help` lists them)
    for register in (
        calibrate.register_calibrate,
        quantize.register,
        inspect.register,
        calibrate.register_recompute,
        report.register,
        diagnose.register,
        demo.register,
    ):
        register(sub)

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

"""``histocal report``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from .arguments import non_negative_int
from .calibrate import load_state
from .same_file import report_inputs

logger = logging.getLogger("histocal.cli")


# ---------------------------------------------------------------------------------------------
# Report


def register(sub: Any) -> None:
    """The ``report`` command's parser."""
    from ..methods import QTYPES
    from ..report import REPORT_METHODS

    p = sub.add_parser(
        "report",
        help="HTML report of a histocal state: histograms, every method's range and error",
        description="Write DIR/index.html (a table of every tensor, worst outliers first: counts, "
        "NaN/Inf, min/max, outlier ratio, each method's range and estimated SQNR, "
        "auto's choice) and one histogram image per tensor (DIR/tensors/*.png) with "
        "each method's range marked. Needs matplotlib: pip install matplotlib (or "
        "pip install '.[report]' in histocal's source folder).",
    )
    p.add_argument("state", metavar="STATE", help="histocal state file")
    p.add_argument("--out", metavar="DIR", required=True, help="output directory (created if missing)")
    p.add_argument(
        "--qtype", choices=QTYPES, default="int8", help="target type of the ranges and errors (default int8)"
    )
    p.add_argument(
        "--symmetric",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="symmetric quantization (default: asymmetric)",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        choices=REPORT_METHODS,
        metavar="METHOD",
        help=f"only these methods ({' '.join(REPORT_METHODS)}; default all)",
    )
    p.add_argument(
        "--max-tensors",
        type=non_negative_int,
        metavar="N",
        help="plot only the N tensors with the largest outlier ratios (the table lists all)",
    )
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from ..report import require_matplotlib, write_report

    require_matplotlib()
    report_inputs(args.out, [("STATE", args.state)])
    state = load_state(args.state)
    index = write_report(
        state,
        Path(args.out),
        qtype=args.qtype,
        symmetric=args.symmetric,
        methods=args.methods,
        max_tensors=args.max_tensors,
        source=args.state,
    )
    plotted = len(state.names) if args.max_tensors is None else min(args.max_tensors, len(state.names))
    logger.info("wrote %s", index)
    sys.stdout.write(f"report of {len(state.names)} tensors ({plotted} plotted): {index}\n")
    return 0

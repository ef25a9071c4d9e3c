"""``histocal diagnose`` and ``histocal quantize --auto-exclude``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .arguments import finite_float, positive_int
from .calibration import check_model, open_data
from .errors import UsageError
from .options import add_data_options, add_method_options, compute_settings
from .quantization import add_quantization_options, quantization_arguments
from .same_file import inputs, report_inputs

if TYPE_CHECKING:
    from ..quantize.ort import QuantizationArgs

logger = logging.getLogger("histocal.cli")


def _fraction(text: str) -> float:
    value = finite_float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def add_exclusion_options(g: Any, *, auto_exclude: bool) -> None:
    """--target-sqnr, --max-excluded-fraction (and --auto-exclude for quantize)."""
    from ..diagnose import DEFAULTS

    if auto_exclude:
        g.add_argument(
            "--auto-exclude",
            action="store_true",
            help="diagnose the quantized model (histocal diagnose) and leave the nodes it suggests in float; "
            "the first --eval-samples batches of --data are held back to measure it",
        )
    g.add_argument(
        "--target-sqnr",
        type=finite_float,
        metavar="DB",
        help="stop leaving nodes in float once the output SQNR reaches DB (default: take every exclusion "
        "that gains, within --max-excluded-fraction)",
    )
    g.add_argument(
        "--max-excluded-fraction",
        type=_fraction,
        metavar="F",
        help=f"leave at most this fraction of the quantized nodes in float (default {DEFAULTS['max_excluded_fraction']})",
    )


def register(sub: Any) -> None:
    """The ``diagnose`` command's parser."""
    from ..diagnose import DEFAULTS

    p = sub.add_parser(
        "diagnose",
        help="what breaks the quantized model, and which nodes to leave in float",
        description="Calibrate MODEL on --data (holding back its first --eval-samples batches, unless "
        "--eval-data is given), quantize it, and report: the output SQNR against the float model on the "
        "held-back batches; per quantized tensor, how much leaving it in float recovers (a group screen, "
        "then checks of the best candidates); tensors whose ranges sentinels (attention-mask "
        "values, the dtype's extremes) or outliers decide; and a suggested nodes_to_exclude.",
    )
    p.add_argument("model", metavar="MODEL", help="ONNX model (float)")
    add_data_options(p, required=True)
    p.add_argument(
        "--eval-data", nargs="+", metavar="PATH", help="held-back data files or folders (default: see --eval-samples)"
    )
    add_method_options(p, default_method=DEFAULTS["method"], minmax=False, collection=False)
    add_quantization_options(p)
    g = p.add_argument_group("diagnosis")
    g.add_argument(
        "--eval-samples",
        type=positive_int,
        metavar="N",
        help=f"hold back the first N batches of --data for evaluation (default {DEFAULTS['eval_samples']})",
    )
    add_exclusion_options(g, auto_exclude=False)
    g.add_argument(
        "--screen-samples",
        type=positive_int,
        metavar="N",
        help=f"held-back batches the screen runs on (default {DEFAULTS['screen_samples']})",
    )
    g.add_argument(
        "--max-screen-runs",
        type=positive_int,
        metavar="N",
        help=f"model runs the screen may make (default {DEFAULTS['max_screen_runs']})",
    )
    g.add_argument(
        "--max-checks",
        type=positive_int,
        metavar="N",
        help=f"candidate checks, one screen-sized run each (default {DEFAULTS['max_checks']})",
    )
    g.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    g.add_argument(
        "--report", metavar="DIR", help="also write the HTML report of the calibration state with the diagnosis"
    )
    p.set_defaults(func=cmd_diagnose)


def run_diagnosis(args: argparse.Namespace, model: Path, quantization: QuantizationArgs) -> Any:
    """``histocal.diagnose.diagnose`` with the command line's data, method and limits."""
    from ..diagnose import DEFAULTS, diagnose
    from ..io.data import open_calibration_data

    data = open_data(args, model)
    eval_paths = getattr(args, "eval_data", None)
    eval_data = None
    if eval_paths:
        eval_data = open_calibration_data(
            model,
            eval_paths,
            batch_size=args.batch_size,
            preprocess=args.preprocess,
            input_shape=args.input_shape,
            layout=args.layout,
            validate=True,
        )
    limits = {
        "eval_samples": args.eval_samples,
        "screen_samples": getattr(args, "screen_samples", None),
        "max_screen_runs": getattr(args, "max_screen_runs", None),
        "max_checks": getattr(args, "max_checks", None),
        "max_excluded_fraction": args.max_excluded_fraction,
    }
    return diagnose(
        model,
        data,
        eval_data,
        method=args.method or DEFAULTS["method"],
        method_options=compute_settings(args),
        target_sqnr_db=args.target_sqnr,
        show_progress=False if args.no_progress else None,
        **{k: v for k, v in limits.items() if v is not None},
        **quantization.keywords(),
    )


def cmd_diagnose(args: argparse.Namespace) -> int:
    model = check_model(args.model)
    if args.report is not None:
        from ..report import require_matplotlib

        require_matplotlib()
        report_inputs(args.report, inputs(model, [("--data", args.data), ("--eval-data", args.eval_data)]), "--report")
    diagnosis = run_diagnosis(args, model, quantization_arguments(args))
    if args.report is not None:
        from ..report import write_report

        index = write_report(diagnosis.state, Path(args.report), diagnosis=diagnosis, source=str(model))
        logger.info("wrote %s", index)
    if args.json:
        sys.stdout.write(json.dumps(diagnosis.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(diagnosis.summary() + "\n")
    return 0


def auto_exclude(
    args: argparse.Namespace, model: Path, quantization: QuantizationArgs, tmp: Path
) -> tuple[Any, Path, QuantizationArgs]:
    """``quantize --auto-exclude``: the diagnosis's ranges, the model to quantize (the given one, or
    a copy whose unnamed nodes got the diagnosis's names), and ``quantization`` with the diagnosis's
    nodes_to_exclude added."""

    from ..diagnose import name_nodes
    from ..io.models import load_model, save_model

    if args.data is None or args.state is not None or args.cache is not None:
        raise UsageError("--auto-exclude calibrates and measures on --data (not --cache or --state)")
    if args.method == "auto" and not args.per_tensor_estimate:
        raise UsageError(
            "--auto-exclude takes one method's ranges: give --method (or --method auto --per-tensor-estimate)"
        )
    diagnosis = run_diagnosis(args, model, quantization)
    named, count = name_nodes(load_model(model))
    if count:  # the names the diagnosis gave the unnamed nodes, on a copy
        copy = tmp / model.name
        save_model(named, copy)
        model = copy
    excluded = [*(quantization.nodes_to_exclude or []), *diagnosis.nodes_to_exclude]
    quantization = dataclasses.replace(quantization, nodes_to_exclude=excluded)
    target = "" if diagnosis.target_sqnr_db is None else (
        f", target {diagnosis.target_sqnr_db:g} dB {'reached' if diagnosis.target_reached else 'not reached'}"
    )  # fmt: skip
    sys.stdout.write(
        f"auto-exclude: output SQNR {diagnosis.sqnr_db:.2f} dB -> {diagnosis.sqnr_excluded_db:.2f} dB on "
        f"{diagnosis.eval_samples} held-back batches, {len(diagnosis.nodes_to_exclude)} of "
        f"{diagnosis.quantized_nodes} quantized nodes in float ({diagnosis.excluded_fraction:.1%}){target}\n"
    )
    if diagnosis.nodes_to_exclude:
        sys.stdout.write("auto-exclude: nodes_to_exclude " + " ".join(diagnosis.nodes_to_exclude) + "\n")
    return diagnosis.ranges, model, quantization

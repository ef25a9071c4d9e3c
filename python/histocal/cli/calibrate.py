"""``histocal calibrate`` and ``histocal recompute``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from ..methods.settings import AXIS, PER_CHANNEL, CollectionSettings
from ..methods.table import NON_OVERFLOW
from .arguments import int_at_least, positive_int
from .calibration import check_model, fingerprint_files, open_data, run_calibrator, write_outputs
from .errors import CliError, UsageError
from .options import (
    METHODS,
    add_data_options,
    add_method_options,
    calibrator_options,
    check_method,
    compute_settings,
    display,
    method_key,
)
from .quark import QUARK_VERSIONS
from .same_file import inputs, refuse_overwriting

logger = logging.getLogger("histocal.cli")


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.cache is None and args.state is None:
        raise UsageError("give --cache and/or --state (where to write the result)")
    for flag, value in (("--shards", args.shards), ("--shard-timeout", args.shard_timeout)):
        if value is not None and args.workers is None and args.address is None:
            raise UsageError(f"{flag} applies with --workers or --address")
    model = check_model(args.model)
    refuse_overwriting([("--cache", args.cache), ("--state", args.state)], inputs(model, [("--data", args.data)]))
    data = open_data(args, model)
    if args.workers is not None or args.address is not None:
        return _calibrate_distributed(args, model, data)
    ranges, calibrator = run_calibrator(args, model, data, want_state=args.state is not None)
    fingerprint = fingerprint_files(data.files) if args.state else None
    write_outputs(ranges, args.cache and Path(args.cache), calibrator, args.state and Path(args.state), fingerprint)
    sys.stdout.write(
        f"calibrated {len(ranges.data)} tensors ({display(args.method)}, {data.num_samples} samples "
        f"in {len(data.files)} files)"
        + (f"; cache: {args.cache}" if args.cache else "")
        + (f"; state: {args.state}" if args.state else "")
        + "\n"
    )
    return 0


def positive_seconds(text: str) -> float:
    """--shard-timeout's value: seconds > 0 within calibrate_distributed's bound, or inf (no limit)."""
    from ..distributed.settings import MAX_TIMEOUT_S, check_seconds

    try:
        value = float(text)
        check_seconds("--shard-timeout", value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected seconds in (0, {MAX_TIMEOUT_S:g}] or inf (no limit), got {text!r}"
        ) from None
    return value


def worker_count(text: str) -> int:
    """--workers' value: what calibrate_distributed takes as num_workers."""
    from ..distributed.settings import MAX_COUNT

    return int_at_least(1, text, MAX_COUNT)


def _calibrate_distributed(args: argparse.Namespace, model: Path, data: Any) -> int:
    """--workers / --address: shards of whole batches on Ray workers, merged exactly."""
    from ..distributed import calibrate_distributed

    batches = len(data)
    workers = args.workers
    count = min(batches, args.shards or 4 * (workers or 1))
    # contiguous runs of whole batches, as even as they come
    bounds = [batches * k // count for k in range(count + 1)]
    shards = [[str(f) for b in range(bounds[k], bounds[k + 1]) for f in data.batch_files(b)] for k in range(count)]
    data_options = {
        "batch_size": args.batch_size,
        "preprocess": args.preprocess,
        "input_shape": args.input_shape,
        "layout": args.layout,
    }
    options, settings = calibrator_options(args)
    state = calibrate_distributed(
        model,
        shards,
        calibrate_method=args.method,
        extra_options=options,
        settings=settings,
        num_workers=workers,
        address=args.address,
        op_types_to_calibrate=args.op_types,
        providers=args.providers,
        data_options=data_options,
        shard_timeout=args.shard_timeout,
        show_progress=False if args.no_progress else None,
    )
    from ..state.overrides import compute_with_overrides

    ranges = compute_with_overrides(state, state.method, getattr(args, "method_for", None), model=model)
    fingerprint = fingerprint_files(data.files) if args.state else None
    write_outputs(
        ranges, args.cache and Path(args.cache), _SavesState(state), args.state and Path(args.state), fingerprint
    )
    sys.stdout.write(
        f"calibrated {len(ranges.data)} tensors ({display(args.method)}, {data.num_samples} samples "
        f"in {len(data.files)} files, {count} shards on Ray)"
        + (f"; cache: {args.cache}" if args.cache else "")
        + (f"; state: {args.state}" if args.state else "")
        + "\n"
    )
    return 0


class _SavesState:
    """A merged state where ``write_outputs`` expects a calibrator."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def save_state(self, path: Path, data_fingerprint: str | None = None) -> None:
        import dataclasses

        fingerprints = () if data_fingerprint is None else (data_fingerprint,)
        dataclasses.replace(self.state, data_fingerprints=fingerprints).save(path)


# ---------------------------------------------------------------------------------------------
# States


def state_class() -> Any:
    try:
        from ..state import CalibrationState
    except ImportError as e:
        raise CliError(f"histocal states are not available in this build ({e})") from None
    return CalibrationState


def load_state(path: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise CliError(f"{p}: no such state file" if not p.exists() else f"{p}: not a file")
    return state_class().load(p)


def ranges_from_state(args: argparse.Namespace, state: Any) -> Any:
    if args.method is None:
        stored = getattr(state, "method", None)
        if stored is None:
            raise UsageError("--method is required with --state")
        args.method = method_key(stored) if stored in METHODS else stored
        check_method(args)
    from ..state.overrides import compute_with_overrides

    rules, model = getattr(args, "method_for", None), getattr(args, "model", None)
    if model is None:
        _refuse_op_rules(rules, state)
    return compute_with_overrides(state, args.method, rules, model=model, **compute_settings(args))


def _refuse_op_rules(rules: Any, state: Any) -> None:
    """Without the model (recompute takes a state only): a --method-for rule keyed by op type, or a
    bare key that names no tensor of the state, is refused naming what the command can do. A state
    records its tensors' names and its model's fingerprint, not which op type produced each tensor."""
    from ..state.overrides import parse_method_overrides

    for rule in parse_method_overrides(rules):
        if rule.by == "op" or (rule.by == "any" and rule.target not in state.names):
            bare = "" if rule.by == "op" else f" ({rule.target!r} is no tensor of the state, so an op type)"
            raise UsageError(
                f"--method-for {rule.key}={rule.method}{bare}: op:-keyed --method-for needs the model; recompute "
                "works on a state only: name tensors instead (name:TENSOR=METHOD), or use calibrate or quantize "
                "with the model"
            )


def cmd_recompute(args: argparse.Namespace) -> int:
    refuse_overwriting([("--cache", args.cache)], [("STATE", args.state)])
    state = load_state(args.state)
    ranges = ranges_from_state(args, state)
    write_outputs(ranges, Path(args.cache), None, None)
    sys.stdout.write(
        f"computed {len(ranges.data)} tensors ({display(args.method)}) from {args.state}; cache: {args.cache}\n"
    )
    return 0


def register_calibrate(sub: Any) -> None:
    """The ``calibrate`` command's parser."""
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
    p.add_argument(
        "--quark-version",
        choices=QUARK_VERSIONS,
        help="with --quark: the Quark version whose defaults and results to reproduce "
        "(0.13: histocal.quark, the default; 0.9: histocal.quark.v0_9)",
    )
    g = p.add_argument_group("outputs (at least one)")
    g.add_argument("--cache", metavar="ORT_CACHE.json", help="write ONNX Runtime's calibration cache here")
    g.add_argument("--state", metavar="STATE", help="write the histocal state here (histogram methods)")
    g = p.add_argument_group("distributed (needs Ray: shards of the data on Ray workers, merged exactly)")
    g.add_argument(
        "--workers", type=worker_count, metavar="N", help="calibrate on N Ray workers (a local Ray unless --address)"
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
        "in all (at most 1e9; default or inf: no limit)",
    )
    p.set_defaults(func=cmd_calibrate)


def register_recompute(sub: Any) -> None:
    """The ``recompute`` command's parser."""
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

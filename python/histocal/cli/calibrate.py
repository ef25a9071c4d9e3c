"""``histocal calibrate`` and ``histocal recompute``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from .common import (
    METHODS,
    CliError,
    _calibrate,
    _check_method,
    _check_model,
    _compute_settings,
    _data_fingerprint,
    _display,
    _method_key,
    _open_data,
    _UsageError,
    _write_outputs,
)

logger = logging.getLogger("histocal.cli")


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
    sys.stdout.write(
        f"computed {len(ranges.data)} tensors ({_display(args.method)}) from {args.state}; cache: {args.cache}\n"
    )
    return 0

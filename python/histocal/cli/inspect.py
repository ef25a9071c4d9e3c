"""``histocal inspect``: a cache or state file as a table or JSON."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .calibrate import state_class
from .errors import CliError, one_line
from .options import HISTOGRAM_METHODS, METHOD_NAMES, display, method_key

logger = logging.getLogger("histocal.cli")


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


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
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
        "method": METHOD_NAMES.get(method_key(ranges.calibration_method), str(ranges.calibration_method)),
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
        tensors[name] = {
            "dtype": state.dtype(name),
            "finite": int(finite),
            "nan": int(nan),
            "posinf": int(posinf),
            "neginf": int(neginf),
            "batches": int(batches),
        }
    with np.errstate(all="ignore"):
        for name, td in state.compute("minmax").data.items():
            tensors[name]["min"] = _scalar_or_list(td.lowest)
            tensors[name]["max"] = _scalar_or_list(td.highest)
        if state.method in HISTOGRAM_METHODS:
            try:
                ranges = state.compute(state.method)
            except Exception as e:
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
            CalibrationState = state_class()
        except CliError:
            raise cache_error from None
        try:
            state = CalibrationState.load(path)
        except Exception as state_error:
            raise CliError(
                f"{path}: neither an ORT calibration cache ({one_line(cache_error)}) nor a histocal state "
                f"({one_line(state_error)})"
            ) from None
        return _inspect_state(path, state)


def _range_text(low: Any, high: Any) -> str:
    """ "[low, high]"; per-channel ranges as the span of all channels and their count."""
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
    rows = {
        name: _table_row(entry if isinstance(entry, dict) else {"value": entry})
        for name, entry in info["tensors"].items()
    }
    columns = sorted({k for row in rows.values() for k in row}, key=lambda k: ([*_COLUMNS, k]).index(k))
    titles = [f"{display(str(info['method']).lower())} range" if c == "range" else c for c in columns]
    table = [[name] + [row.get(c, "") for c in columns] for name, row in rows.items()]
    sys.stdout.write("\n".join(head) + "\n\n" + format_table(["tensor", *titles], table))
    return 0


def register(sub: Any) -> None:
    """The ``inspect`` command's parser."""
    p = sub.add_parser(
        "inspect",
        help="show what an ORT calibration cache or a histocal state holds",
        description="Show the method, tensors and ranges of an ORT calibration cache, or of a "
        "histocal state (plus model fingerprint, non-finite counts, options).",
    )
    p.add_argument("file", metavar="FILE", help="ORT calibration cache (JSON) or histocal state")
    p.add_argument("--json", action="store_true", help="machine-readable JSON instead of a table")
    p.set_defaults(func=cmd_inspect)

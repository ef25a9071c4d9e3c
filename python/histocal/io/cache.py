"""Calibration cache: ONNX Runtime's JSON format (``save_tensors_data`` / ``load_tensors_data``), both ways.

Writing is byte-identical to onnxruntime's writer (same ``json.dump`` defaults, so Python float repr and bare
``NaN``/``Infinity`` tokens) and the file gets the same 0600 mode. Reading returns onnxruntime's own
``TensorsData`` objects with the same arrays, dtypes and scalar conversions as onnxruntime's loader, but treats
the file as untrusted input: it never executes code, bounds size and nesting before parsing, and reports every
problem as a ``ValueError`` naming the file (``FileNotFoundError`` only for a missing path). Memory: the file's
size is checked (``MAX_CACHE_BYTES``) before anything is read, nothing is reserved ahead, a byte that JSON never
allows (a control character: a sparse or binary file) stops the reading at its chunk, and the checks before
parsing hold about twice the file.
docs/ort_parity.md (*Calibration cache*) describes the format and the rules matched.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

from .files import MAX_NUMBER_DIGITS as MAX_NUMBER_DIGITS
from .files import ContentError as _CacheError
from .files import (
    StrPath,
    atomic_write_bytes,
    parse_bounded_json,
    read_bounded_file,
    reject_control_characters,
)

__all__ = [
    "MAX_CACHE_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_NUMBER_DIGITS",
    "atomic_write_bytes",
    "check_cache",
    "load_tensors_data",
    "read_json_file",
    "round_trip",
    "save_tensors_data",
]

logger = logging.getLogger(__name__)


MAX_CACHE_BYTES = 1 << 30  # 1 GiB; a real cache is a few KiB per tensor
MAX_JSON_DEPTH = 32  # a cache needs 4 object levels plus the array rank

# dtype names onnxruntime writes (str(ndarray.dtype)). float64 is accepted here so that TensorData reports
# onnxruntime's own "Unexpected dtype float64" error for the float keys.
_FLOAT_DTYPES = frozenset({"float16", "float32", "float64"})
_INT_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})
_INT64 = np.iinfo(np.int64)


def read_json_file(
    path: StrPath, max_bytes: int = MAX_CACHE_BYTES, max_depth: int = MAX_JSON_DEPTH, *, what: str = "JSON file"
) -> Any:
    """Parse an untrusted JSON file with bounded size and nesting; ``NaN``/``Infinity`` tokens are accepted.

    Raises FileNotFoundError if ``path`` does not exist, otherwise ValueError naming the file for anything
    else: not a regular file, unreadable, too large (checked before reading), a control character (checked
    while reading), not UTF-8, too deep, bad JSON.
    """

    def fail(problem: object) -> NoReturn:
        raise ValueError(f"Invalid {what} {path}: {problem}") from None

    try:
        raw = read_bounded_file(path, max_bytes, what=what, check=reject_control_characters)
    except _CacheError as exc:
        fail(exc)
    return parse_bounded_json(raw, max_depth, fail)


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------


class _CacheEncoder(json.JSONEncoder):
    """Same conversions as onnxruntime's ``CalibrationCacheEncoder`` (which older onnxruntime lacks)."""

    def default(self, o: Any) -> Any:
        if isinstance(o, (TensorData, TensorsData)):
            return o.to_dict()
        if isinstance(o, np.ndarray):
            return {"data": o.tolist(), "dtype": str(o.dtype), "CLS": "numpy.array"}
        if isinstance(o, CalibrationMethod):
            return {"CLS": o.__class__.__name__, "value": str(o)}
        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        return super().default(o)


def save_tensors_data(tensors_data: TensorsData, path: StrPath, smooth_quant: bool = False) -> None:
    """Write ``tensors_data`` as onnxruntime's JSON calibration cache (byte-identical, mode 0600, atomic).

    Args:
        tensors_data: the ranges (or histograms) to write.
        path: the cache file.
        smooth_quant: the ``smooth_quant`` flag the cache records.

    Raises:
        TypeError: an unserializable value (onnxruntime's error); the previous file is then kept.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = tensors_data.to_dict()
    payload["smooth_quant"] = smooth_quant  # stored as given, like onnxruntime
    # json.dumps emits exactly what onnxruntime's json.dump streams (ASCII only: ensure_ascii is on).
    atomic_write_bytes(path, json.dumps(payload, cls=_CacheEncoder).encode("ascii"), prefix=".calibcache_")
    logger.debug("Saved calibration cache for %d tensors to %s", len(tensors_data.data), path)


# ----------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------


def _leaves_are(node: Any, types: frozenset[type]) -> bool:
    """Nested lists whose leaves all have one of ``types``, exactly: JSON true/false must not pass as 1/0.
    A list mixing lists and leaves is ragged anyway. Recursion is bounded by MAX_JSON_DEPTH."""
    if type(node) is not list:
        return type(node) in types
    kinds = set(map(type, node))
    if list in kinds:
        return kinds == {list} and all(_leaves_are(item, types) for item in node)
    return kinds <= types


_NUMBERS, _INTS = frozenset({int, float}), frozenset({int})


def _float_array(data: Any, dtype: str, key: str) -> np.ndarray:
    """``np.array(data, dtype)`` like onnxruntime, refusing strings/None/bools and finite values that overflow."""
    if not _leaves_are(data, _NUMBERS):
        raise _CacheError(f"{key!r}: array data must be numbers or rectangular lists of numbers")
    try:
        with np.errstate(all="ignore"):  # overflow to inf is detected below
            array = np.array(data, dtype=dtype)
    except (ValueError, OverflowError, TypeError, MemoryError) as exc:
        raise _CacheError(f"{key!r}: cannot make a {dtype} array ({exc})") from None
    infinite = np.isinf(array)
    if infinite.any() and np.isfinite(np.array(data, dtype=np.float64)[infinite]).any():
        raise _CacheError(f"{key!r}: finite value out of {dtype} range")
    return array


def _int_array(data: Any, dtype: str, key: str) -> np.ndarray:
    if not _leaves_are(data, _INTS):
        raise _CacheError(f"{key!r}: {dtype} array data must be integers or rectangular lists of integers")
    try:
        return np.array(data, dtype=dtype)
    except (ValueError, OverflowError, TypeError, MemoryError) as exc:
        raise _CacheError(f"{key!r}: cannot make a {dtype} array ({exc})") from None


def _tensor_value(key: str, value: Any) -> Any:
    """One TensorData attribute, converted exactly like onnxruntime's ``TensorData.from_dict``."""
    if type(value) is dict and value.get("CLS") == "numpy.array":
        if "data" not in value or "dtype" not in value:
            raise _CacheError(f"{key!r}: numpy.array entry needs 'data' and 'dtype'")
        dtype = value["dtype"] if type(value["dtype"]) is str else None
        if dtype in _FLOAT_DTYPES:
            return _float_array(value["data"], dtype, key)
        if dtype in _INT_DTYPES:
            return _int_array(value["data"], dtype, key)
        raise _CacheError(f"{key!r}: unsupported dtype {str(value['dtype'])[:100]!r}")
    if key in TensorData._floats:
        if type(value) in (int, float):
            return _float_array(value, "float32", key)  # onnxruntime: plain number -> 0-d float32 array
        return value  # TensorData reports onnxruntime's "Unexpected type ..." error
    # hist / bins: onnxruntime writes plain ints (Percentile counts) or arrays; it keeps anything, we don't.
    if type(value) is int and _INT64.min <= value <= _INT64.max:
        return value
    raise _CacheError(f"{key!r}: expected an int64 integer or a numpy.array entry, got {type(value).__name__}")


def _tensor_data(name: str, entry: Any) -> TensorData:
    if type(entry) is not dict:
        raise _CacheError(f"tensor {name!r}: expected an object, got {type(entry).__name__}")
    kwargs = {}
    for key, value in entry.items():
        if key == "CLS":  # ignored (not checked) by onnxruntime too
            continue
        if key not in TensorData._allowed:  # before TensorData(**kwargs): a key like 'self' would be a TypeError
            raise _CacheError(f"Unexpected value {key!r} not in {TensorData._allowed}.")
        kwargs[key] = _tensor_value(key, value)
    return TensorData(**kwargs)  # its own dtype/type checks raise onnxruntime's ValueError texts


def _calibration_method(value: Any) -> Any:
    if type(value) is dict and value.get("CLS") == "CalibrationMethod":
        name = value.get("value")
        member = CalibrationMethod.__members__.get(name.split(".")[-1]) if type(name) is str else None
        if member is None:
            raise _CacheError(f"unknown calibration_method {str(name)[:100]!r}")
        return member
    return value  # onnxruntime keeps any other value as is; quantize_static then reports a method mismatch


def _tensors_data_from_json(document: Any) -> TensorsData:
    if type(document) is not dict:
        raise _CacheError(f"expected a JSON object at the top level, got {type(document).__name__}")
    for key in ("calibration_method", "data"):
        if key not in document:
            raise _CacheError(f"missing key {key!r}")
    tensors = document["data"]
    if type(tensors) is not dict:
        raise _CacheError(f"'data' must be an object, got {type(tensors).__name__}")
    method = _calibration_method(document["calibration_method"])
    return TensorsData(method, {name: _tensor_data(name, entry) for name, entry in tensors.items()})


def _read_cache_document(path: Path) -> Any:
    """The parsed JSON of an existing cache file. FileNotFoundError / ValueError texts as in onnxruntime."""
    try:
        exists, is_file = path.exists(), path.is_file()
    except (OSError, ValueError) as exc:  # e.g. permission denied on a parent, NUL in the path
        raise _invalid_cache(path, exc) from None
    if not exists:
        raise FileNotFoundError(f"Calibration cache not found: {path}")
    if not is_file:
        raise ValueError(f"Calibration cache path is not a file: {path}")
    return read_json_file(path, MAX_CACHE_BYTES, MAX_JSON_DEPTH, what="calibration cache")


def _invalid_cache(path: Path, problem: object) -> ValueError:
    return ValueError(f"Invalid calibration cache {path}: {problem}")


def _to_tensors_data(document: Any, path: Path) -> TensorsData:
    try:
        tensors_data = _tensors_data_from_json(document)
    except ValueError as exc:  # _CacheError and TensorData's own checks
        raise _invalid_cache(path, exc) from None
    logger.debug("Loaded calibration cache for %d tensors from %s", len(tensors_data.data), path)
    return tensors_data


def load_tensors_data(path: StrPath) -> TensorsData:
    """Read a calibration cache written by onnxruntime's or histocal's ``save_tensors_data``.

    Same results as onnxruntime's loader: arrays keep their dtype, a plain number under
    lowest/highest/avg/std/hist_edges becomes a 0-d float32 array, a plain int under hist/bins stays an int.

    Args:
        path: the cache file.

    Returns:
        onnxruntime ``TensorsData``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: anything else wrong with it (naming the file).
    """
    path = Path(path)
    return _to_tensors_data(_read_cache_document(path), path)


def round_trip(tensors_data: TensorsData) -> TensorsData:
    """``tensors_data`` as ``load_tensors_data`` reads back the cache ``save_tensors_data`` writes
    of it (the values onnxruntime quantizes with), without a file."""
    payload = tensors_data.to_dict()
    payload["smooth_quant"] = False
    document = json.loads(json.dumps(payload, cls=_CacheEncoder))
    try:
        return _tensors_data_from_json(document)
    except ValueError as exc:
        raise ValueError(f"Invalid calibration ranges: {exc}") from None


def check_cache(path: StrPath, calibrate_method: CalibrationMethod, smooth_quant: bool) -> TensorsData | None:
    """onnxruntime ``quantize_static``'s cache lookup: the cached ranges on a hit, None when they must be computed.

    A directory raises ValueError. A cache made with a different smooth_quant setting logs a warning and is a
    miss (its method is not checked). Otherwise a different calibration method raises onnxruntime's ValueError.
    """
    path = Path(path)
    try:
        exists, is_file = path.exists(), path.is_file()
    except (OSError, ValueError) as exc:
        raise _invalid_cache(path, exc) from None
    if exists and not is_file:
        raise ValueError(f"calibration_cache_path is not a file: {path}")
    if not is_file:
        return None
    document = _read_cache_document(path)  # parsed once; onnxruntime reads the file twice
    if type(document) is not dict:  # onnxruntime: AttributeError on .get
        raise _invalid_cache(path, f"expected a JSON object at the top level, got {type(document).__name__}")
    cached_smooth_quant = bool(document.get("smooth_quant", False))  # truthiness, like onnxruntime
    if cached_smooth_quant != bool(smooth_quant):
        logger.warning(
            "Calibration cache at %s was produced with smooth_quant=%s; "
            "current run uses smooth_quant=%s. Recomputing ranges and overwriting cache.",
            path,
            cached_smooth_quant,
            bool(smooth_quant),
        )
        return None
    tensors_data = _to_tensors_data(document, path)
    if tensors_data.calibration_method != calibrate_method:
        raise ValueError(
            f"Calibration cache at {path} was produced with "
            f"{tensors_data.calibration_method}, but quantize_static was called "
            f"with calibrate_method={calibrate_method}. Delete the cache or "
            f"pass a matching calibrate_method."
        )
    return tensors_data

"""Calibration data sources: ORT ``CalibrationDataReader``s, iterables of feed dicts, and
callables returning a fresh iterable; whether they can be read twice; feed validation."""

from __future__ import annotations

import logging
import operator
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

Feed = Mapping[str, Any]

# ONNX tensor(elem) type strings as ORT reports them -> numpy dtypes.
_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(int16)": np.int16,
    "tensor(uint16)": np.uint16,
    "tensor(int32)": np.int32,
    "tensor(uint32)": np.uint32,
    "tensor(int64)": np.int64,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
}


class DataSource:
    """One calibration data source. ``read()`` gives the feed dicts of one read; ORT's rule
    ends a read at the first falsy item (a warning says so when items follow it in a list or
    iterable; a reader's falsy ``get_next()`` is its normal end). ``rereadable`` says whether a second read gives the
    same data again (lists and tuples, readers with ``rewind()``, zero-argument callables)."""

    def __init__(self, data: Any) -> None:
        self._data = data
        if isinstance(data, np.ndarray) and data.dtype != object:
            # Iterating it would give rows, each then refused as "not a dict": say it now.
            raise TypeError(
                f"calibration data is a numpy array {data.shape}; expected feed dicts "
                "{input_name: array}, e.g. [{'input': batch} for batch in batches]"
            )
        if hasattr(data, "get_next") and callable(data.get_next):
            self.rereadable = callable(getattr(data, "rewind", None))
        elif (isinstance(data, (Sequence, np.ndarray)) and not isinstance(data, (str, bytes))) or callable(data):
            self.rereadable = True
        elif isinstance(data, Iterable):
            # A re-iterable container (not an iterator) reads again from its start.
            self.rereadable = not isinstance(data, Iterator)
        else:
            raise TypeError(
                "calibration data must be a CalibrationDataReader, an iterable of feed dicts, "
                f"or a callable returning one; got {type(data).__name__}"
            )
        self._reads = 0

    def read(self) -> Read:
        """Feed dicts of the next read (rewinding a reader before a second read)."""
        data = self._data
        if self._reads and hasattr(data, "get_next"):
            data.rewind()
        self._reads += 1
        if hasattr(data, "get_next") and callable(data.get_next):
            # A reader's len() is not what is left of it (set_range, a partial read): only
            # its own __length_hint__ says how many batches this read gives.
            hint = getattr(type(data), "__length_hint__", None)
            return Read(_until_exhausted(data.get_next), hint(data) if hint else 0)
        items = data() if callable(data) and not isinstance(data, Iterable) else data
        # a falsy item in the middle is worth a warning, once (not again on exact mode's 2nd read)
        return Read(iter(items), operator.length_hint(items), items if self._reads == 1 else None)


def _until_exhausted(get_next: Any) -> Iterator[Any]:
    """A reader's items; :class:`Read` ends at the first falsy one (``iter(get_next, sentinel)``
    would compare each item with ``==``, which an array answers elementwise)."""
    while True:
        yield get_next()


class Read:
    """The feed dicts of one read of a :class:`DataSource`, ended at the first falsy item;
    ``operator.length_hint`` gives the number of batches where the source knows it (else 0)."""

    def __init__(self, items: Iterator[Any], expected: int, warn_for: Any = None) -> None:
        self._items = items
        self._expected = expected
        self._warn_for = warn_for  # the list or iterable read, to warn about items a falsy one leaves out

    def __length_hint__(self) -> int:
        return self._expected

    def __iter__(self) -> Iterator[Feed]:
        for batch, item in enumerate(self._items):
            if isinstance(item, np.ndarray):
                raise TypeError(
                    f"batch {batch}: expected a dict of input name -> array, got a bare numpy array "
                    f"{item.shape}; pass {{input_name: array}}"
                )
            try:
                ends = not item
            except (ValueError, TypeError, RuntimeError):  # e.g. a tensor with no single truth value
                raise TypeError(
                    f"batch {batch}: expected a dict of input name -> array, got {type(item).__name__}"
                ) from None
            if ends:
                if self._warn_for is not None:
                    _warn_if_items_follow(batch, item, self._warn_for, self._items)
                return
            yield item


def _warn_if_items_follow(i: int, item: Any, items: Any, it: Iterator[Any]) -> None:
    """ORT's rule ends the data at a falsy item; one in the middle of a list is more likely a
    mistake than an end marker, so say what is left out (peeking one item of an iterator)."""
    if isinstance(items, Sized):
        after = len(items) - i - 1
        left_out = f"the {after} item(s) after it are not used" if after else ""
    else:
        left_out = "" if next(it, _END) is _END else "the items after it are not used"
    if left_out:
        logger.warning(
            "calibration data item %d is %s, which ends the data (onnxruntime's rule: a falsy feed ends it); %s",
            i,
            _short(item),
            left_out,
        )


_END = object()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class FeedChecker:
    """Checks feed dicts against a session's inputs before running, so a bad batch gets an
    error that names the input and the batch instead of an ORT error without either."""

    def __init__(self, session: Any) -> None:
        self.inputs = {
            i.name: (_ORT_TYPES.get(i.type), [d if isinstance(d, int) else None for d in i.shape])
            for i in session.get_inputs()
        }
        self._cast: set[str] = set()  # inputs whose feeds were cast (logged once each)

    def check(self, feed: Feed, batch: int) -> dict[str, Any]:
        if not isinstance(feed, Mapping):
            raise TypeError(f"batch {batch}: expected a dict of input name -> array, got {type(feed).__name__}")
        unknown = sorted(set(feed) - set(self.inputs))
        if unknown:
            raise ValueError(
                f"batch {batch}: unknown input name(s) {unknown}; the model's inputs are {sorted(self.inputs)}"
            )
        missing = sorted(set(self.inputs) - set(feed))
        if missing:
            raise ValueError(f"batch {batch}: missing input(s) {missing}")
        out = {}
        for name, value in feed.items():
            arr = value if isinstance(value, np.ndarray) else np.asarray(value)
            dtype, shape = self.inputs[name]
            if dtype is not None and arr.dtype != dtype:
                given = arr.dtype
                arr = cast_to_input(arr, np.dtype(dtype), f"batch {batch}: input {name!r}")
                if name not in self._cast:
                    self._cast.add(name)
                    logger.info("input %r: %s data cast to %s, the model's input type", name, given, arr.dtype)
            if len(arr.shape) != len(shape) or any(d is not None and d != s for d, s in zip(shape, arr.shape)):
                declared = tuple("?" if d is None else d for d in shape)
                raise ValueError(f"batch {batch}: input {name!r} has shape {arr.shape}, the model expects {declared}")
            out[name] = arr
        return out


def cast_to_input(arr: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """The one dtype rule for feeds, from Python or from files: data is cast to the input's type
    where numpy casts within the same kind (float64 -> float32, int -> float, int64 -> int32)
    and every value survives it; anything else raises ``ValueError`` starting with ``what``.
    Refused: other kinds (float -> int, complex, strings, objects), integers outside the target
    range, finite values that would overflow to +-inf."""
    if arr.dtype == dtype:
        return arr
    if arr.dtype.kind in "OSUVMm" or not np.can_cast(arr.dtype, dtype, "same_kind"):
        raise ValueError(f"{what} has dtype {arr.dtype}, which cannot be cast to the model's {dtype}")
    if dtype.kind in "iu" and not np.can_cast(arr.dtype, dtype) and arr.size:
        info = np.iinfo(dtype)
        if arr.min() < info.min or arr.max() > info.max:
            raise ValueError(f"{what} has {arr.dtype} values outside the range of the model's {dtype}")
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(arr, dtype=dtype)
    if dtype.kind == "f" and np.isinf(out).any() and (np.isinf(out) & ~np.isinf(arr)).any():
        raise ValueError(f"{what} has {arr.dtype} values outside the range of the model's {dtype}")
    return out


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no stream, or a closed one
        return False


def progress(iterable: Iterable[Any], desc: str, enabled: bool | None) -> Iterable[Any]:
    """A tqdm bar over batches: off when disabled, when HISTOCAL_PROGRESS=0, or when stderr is
    not a terminal (tqdm's ``disable=None``). Its total is the iterable's length hint, if any."""
    if enabled is False or os.environ.get("HISTOCAL_PROGRESS", "") == "0":
        return iterable
    if enabled is None and not _is_terminal(sys.stderr):
        return iterable  # what tqdm's disable=None decides, without importing it (~10 ms)
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return iterable
    return tqdm(
        iterable,
        desc=desc,
        unit="batch",
        total=operator.length_hint(iterable) or None,
        disable=None if enabled is None else not enabled,
        leave=False,
    )


def run_session(session: Any, output_names: list[str] | None, feed: Feed, batch: int) -> list[np.ndarray]:
    try:
        return session.run(output_names, feed)
    except Exception as e:  # ORT raises its own types (Fail, InvalidArgument, ...)
        raise RuntimeError(f"batch {batch}: onnxruntime failed to run the model: {e}") from e

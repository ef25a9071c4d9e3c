"""Safe file I/O: atomic writes, and bounded reads of untrusted files (size, nesting and number
lengths checked before anything is parsed). The ORT cache and the state file use them."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, Union

import numpy as np

StrPath = Union[str, "os.PathLike[str]"]


class ContentError(ValueError):
    """A problem in an untrusted file's content (the reader adds the file name)."""


MAX_NUMBER_DIGITS = 100  # longer digit runs are rejected before int()/float() see them (quadratic int parsing)
READ_CHUNK = 1 << 20  # untrusted files are read (and checked) this much at a time


def atomic_write_bytes(path: StrPath, data: bytes, *, prefix: str = ".histocal_") -> None:
    """Replace ``path`` with ``data`` atomically: readers and concurrent writers only ever see a complete file.

    The bytes go to a temp file in the same folder (so ``os.replace`` cannot cross file systems), are fsynced,
    and then renamed over ``path``. On any failure, KeyboardInterrupt included, the temp file is removed and
    the previous ``path`` is untouched. Concurrent writers each use their own temp file; the last rename wins.
    The file's mode is 0600 (owner only, whatever the umask), as onnxruntime writes its calibration cache:
    histocal's one rule for the files it saves (caches and states).
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable; best effort (not possible on Windows or some file systems)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# A JSON string, possibly unterminated (then it runs to the end). Linear: the two branches cannot overlap.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_DIGITS_AS_ZEROS = bytes(ord("0") if b in b"0123456789" else ord(" ") for b in range(256))
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_CHUNK = 1 << 22


def _json_depth(outside_strings: bytes) -> int:
    """Deepest ``[``/``{`` nesting of JSON text with its strings emptied: an upper bound of the recursion depth
    ``json.loads`` needs (its valid prefix never closes more than it opened)."""
    depth = deepest = 0
    for start in range(0, len(outside_strings), _DEPTH_CHUNK):  # chunked: bounded memory for huge inputs
        chunk = np.frombuffer(
            outside_strings[start : start + _DEPTH_CHUNK].translate(None, _NOT_BRACKETS), dtype=np.uint8
        )
        if chunk.size:
            levels = depth + np.cumsum(np.where((chunk == ord("[")) | (chunk == ord("{")), 1, -1))
            deepest = max(deepest, int(levels.max()))
            depth = int(levels[-1])
    return deepest


@contextlib.contextmanager
def open_untrusted_file(path: StrPath, max_bytes: int, *, what: str) -> Iterator[tuple[io.FileIO, int]]:
    """An untrusted regular file of at most ``max_bytes`` opened for reading (unbuffered), and its size.

    The size is checked with ``fstat`` before anything is read. FileNotFoundError if ``path`` does not exist,
    otherwise ValueError ``Invalid <what> <path>: ...`` (not a regular file, unreadable, too large)."""
    path = Path(path)

    def fail(problem: object) -> NoReturn:
        raise ValueError(f"Invalid {what} {path}: {problem}") from None

    try:
        # O_NONBLOCK: opening a FIFO must not hang; fstat below rejects it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {path}") from None
    except (OSError, ValueError) as exc:
        fail(exc)
    try:
        try:
            info = os.fstat(fd)
        except OSError as exc:
            fail(exc)
        if not stat.S_ISREG(info.st_mode):
            fail("not a regular file")
        if info.st_size > max_bytes:
            fail(f"file is {info.st_size} bytes, more than the limit of {max_bytes}")
        file = os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
    with file:
        yield file, info.st_size


def read_bounded_file(
    path: StrPath, max_bytes: int, *, what: str, check: Callable[[memoryview, int], None] | None = None
) -> bytearray:
    """The bytes of an untrusted regular file of at most ``max_bytes`` (checked before reading).

    Read in chunks of ``READ_CHUNK`` (a file that grows meanwhile is read on up to the limit): nothing is
    reserved ahead, and ``check(chunk, offset)`` sees each chunk as it arrives and may raise to stop there.
    FileNotFoundError if ``path`` does not exist, otherwise ValueError ``Invalid <what> <path>: ...`` (not a
    regular file, unreadable, too large)."""

    def fail(problem: object) -> NoReturn:
        raise ValueError(f"Invalid {what} {path}: {problem}") from None

    raw = bytearray()
    chunk = bytearray(READ_CHUNK)
    with open_untrusted_file(path, max_bytes, what=what) as (file, _), memoryview(chunk) as view:
        try:
            while n := file.readinto(view):
                if len(raw) + n > max_bytes:
                    fail(f"file is more than the limit of {max_bytes} bytes")
                if check is not None:
                    check(view[:n], len(raw))
                raw += view[:n]
        except OSError as exc:
            fail(exc)
    return raw


_JSON_NEVER = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")  # control characters: never valid in JSON text


def reject_control_characters(chunk: memoryview, offset: int) -> None:
    found = _JSON_NEVER.search(chunk)
    if found is not None:
        raise ContentError(
            f"byte {offset + found.start()} is the control character {found.group()!r}, which JSON never allows"
        )


def parse_bounded_json(
    raw: bytes | bytearray, max_depth: int, fail: Callable[[str], NoReturn], *, constants: bool = True
) -> Any:
    """Parse untrusted JSON bytes with bounded nesting and number length; ``constants``: accept
    ``NaN``/``Infinity``. Every problem goes to ``fail``."""
    # The checks first (they hold a copy of the text without its strings), the decoded text after.
    outside_strings = _JSON_STRING.sub(b'""', raw)
    depth = _json_depth(outside_strings)
    if depth > max_depth:
        fail(f"JSON nested {depth} levels deep, more than the limit of {max_depth}")
    # int() is quadratic and sys.int_max_str_digits may be off. (translate + find: a regex is slow here;
    # in chunks that overlap by a longest allowed run, so that no run is missed and no full copy is made)
    too_long = b"0" * (MAX_NUMBER_DIGITS + 1)
    for start in range(0, len(outside_strings), _DEPTH_CHUNK):
        piece = outside_strings[max(0, start - MAX_NUMBER_DIGITS) : start + _DEPTH_CHUNK]
        if too_long in piece.translate(_DIGITS_AS_ZEROS):
            fail(f"a number with more than {MAX_NUMBER_DIGITS} digits")
    del outside_strings
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(f"not UTF-8 ({exc})")

    def reject(token: str) -> NoReturn:
        fail(f"{token} where a number is required")

    try:
        return json.loads(text) if constants else json.loads(text, parse_constant=reject)
    except (ValueError, RecursionError, MemoryError) as exc:  # RecursionError/MemoryError: defence in depth
        fail(f"malformed JSON ({type(exc).__name__}: {exc})")

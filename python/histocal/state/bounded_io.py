"""Bounded reads of an untrusted zip file: what ``zipfile`` may read (and allocate for), and a channels
member's bytes read as a file in place."""

from __future__ import annotations

from typing import BinaryIO

import numpy as np


class BoundedReads:
    """A seekable file that hands out at most ``budget`` more bytes (reads past it return nothing), so that
    zipfile reads (and allocates for) no more than the caller allows: its central directory, one member."""

    def __init__(self, file: BinaryIO | MemoryFile, size: int) -> None:
        self._file, self._size, self.budget = file, size, 0

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def read(self, n: int | None = -1) -> bytes:
        allowed = max(0, min(self.budget, self._size - self._file.tell()))
        data = self._file.read(allowed if n is None or n < 0 else min(n, allowed))
        self.budget -= len(data)
        return data


class MemoryFile:
    """A read-only seekable file over an array's bytes, without copying them (a channels member)."""

    def __init__(self, data: np.ndarray) -> None:
        self._view, self._at = data.data.cast("B"), 0

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._at = max(0, offset + (0, self._at, len(self._view))[whence])
        return self._at

    def tell(self) -> int:
        return self._at

    def read(self, n: int | None = -1) -> bytes:
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._at + n)
        data = bytes(self._view[self._at : end])
        self._at = max(self._at, end)
        return data


def deflate_bound(size: int) -> int:
    """The largest deflate stream of ``size`` bytes of data (zlib's compressBound, with slack)."""
    return size + (size >> 12) + (size >> 14) + (size >> 25) + 64

"""Shards: the parts of the calibration data one task collects, and the error naming a bad one.

A shard is what the CLI's ``--data`` accepts (a data file or folder, or a list of them), opened on
the worker with :func:`histocal.io.data.open_calibration_data`, or a zero-argument picklable
callable returning an iterable of feed dicts (called once per read: exact mode reads it twice).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..io.data import open_calibration_data

T = TypeVar("T")


class ShardError(RuntimeError):
    """A shard's data (or the work on it) failed: the message names the shard and, for data files,
    the file. Carries ``shard``, the shard's index."""

    def __init__(self, message: str, shard: int | None = None) -> None:
        super().__init__(message, shard)  # both in args: the error crosses processes by pickle
        self.shard = shard

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of the data: ``paths`` (data files or folders) or a ``source`` callable."""

    index: int
    paths: tuple[str, ...] = ()
    source: Callable[[], Any] | None = None
    data_options: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        if self.source is not None:
            func = getattr(self.source, "func", self.source)  # functools.partial: its function
            return f"shard {self.index} ({getattr(func, '__qualname__', type(func).__name__)})"
        return f"shard {self.index} ({', '.join(self.paths)})"

    def open(self, model: str) -> Any:
        """The shard's data source for ``model`` (its files' headers checked now)."""
        if self.source is not None:
            return self.source
        return open_calibration_data(model, list(self.paths), validate=True, **self.data_options)

    def run(self, work: Callable[[], T]) -> T:
        """``work()``, with any failure raised as a :class:`ShardError` naming this shard (a data
        error's message already starts with its file)."""
        try:
            return work()
        except ShardError:
            raise
        except Exception as exc:
            raise ShardError(f"{self.describe()}: {type(exc).__name__}: {exc}", self.index) from exc


def make_shards(shards: Sequence[Any], data_options: dict[str, Any] | None = None) -> list[Shard]:
    """Check and number ``shards`` (see the module docstring)."""
    if isinstance(shards, (str, os.PathLike)) or not isinstance(shards, Sequence):
        raise TypeError("shards must be a list: each item a data path, a list of paths, or a zero-argument callable")
    if not shards:
        raise ValueError("shards is empty: give at least one shard of calibration data")
    out = []
    for i, s in enumerate(shards):
        if isinstance(s, (str, os.PathLike)):
            out.append(Shard(i, (os.fspath(s),), data_options=dict(data_options or {})))
        elif isinstance(s, (list, tuple)) and s and all(isinstance(p, (str, os.PathLike)) for p in s):
            out.append(Shard(i, tuple(os.fspath(p) for p in s), data_options=dict(data_options or {})))
        elif callable(s):
            out.append(Shard(i, source=s))
        else:
            raise TypeError(
                f"shard {i}: expected a data path, a list of paths or a zero-argument callable, got {type(s).__name__}"
            )
    return out

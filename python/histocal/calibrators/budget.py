"""The memory budget of exact collection: how many bytes of fetched outputs one ``collect_data``
call may keep so that it needs only one inference pass.

The budget comes from the calibrator's ``memory_budget`` keyword (``extra_options
["MemoryBudget"]``), else the ``HISTOCAL_MEMORY_BUDGET`` environment variable, else the lesser
of a quarter of the memory available now (lowered to what is left under a cgroup limit and under
the address-space limit, ``ulimit -v``) and 8 GiB. Sizes are bytes, or a number with a unit:
``k``/``M``/``G``/``T`` and ``KiB``/``MiB``/``GiB``/``TiB`` are powers of 1024, ``kB``/``MB``/
``GB``/``TB`` powers of 1000.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import numpy as np

from ..io.memory import _cgroup_available, available_memory, format_size, memory_left  # noqa: F401 (tests)

logger = logging.getLogger(__name__)

MEMORY_BUDGET_ENV = "HISTOCAL_MEMORY_BUDGET"
DEFAULT_BUDGET_CAP = 8 << 30
DEFAULT_BUDGET_FRACTION = 0.25
# When the available memory cannot be read at all (no /proc, no sysconf, no Windows API).
UNKNOWN_MEMORY_BUDGET = 1 << 30
# What a kept array costs beyond its data (the array object, its tuple and list): counted so
# that many tiny batches stay within the budget too.
KEPT_ARRAY_OVERHEAD = 256

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
    "t": 1 << 40,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def parse_size(value: Any, what: str) -> int:
    """A size in bytes from an int or a string such as ``"512M"`` or ``"2 GB"``; ValueError
    naming ``what`` for anything else (negative, bool, an unknown unit)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        if value < 0:
            raise ValueError(f"{what} must be a size in bytes >= 0, got {value}")
        return int(value)
    if isinstance(value, str):
        match = _SIZE.fullmatch(value)
        unit = _UNITS.get(match.group(2).lower()) if match else None
        if match and unit is not None:
            return int(float(match.group(1)) * unit)
    raise ValueError(
        f"{what} must be a size in bytes (an int >= 0, or a string like '512M', '2GiB', '4 GB'), got {value!r}"
    )


def check_memory_budget(value: Any) -> int | None:
    """The keyword's value in bytes, or None (not set: the environment or the default decides)."""
    return None if value is None else parse_size(value, "memory_budget")


def resolve_memory_budget(keyword: int | None) -> int:
    """The budget for one call: the keyword, else the environment variable, else the default."""
    if keyword is not None:
        return keyword
    env = os.environ.get(MEMORY_BUDGET_ENV, "").strip()
    if env:
        return parse_size(env, MEMORY_BUDGET_ENV)
    # an address-space limit (ulimit -v) fails allocations past it whatever memory is free
    available = memory_left()
    if available is None:
        logger.info("available memory unknown: memory budget %d bytes", UNKNOWN_MEMORY_BUDGET)
        return UNKNOWN_MEMORY_BUDGET
    return min(int(available * DEFAULT_BUDGET_FRACTION), DEFAULT_BUDGET_CAP)


class KeptOutputs:
    """The outputs of a call's first batches, kept (as ORT returned them, no copy) while their
    total stays within ``budget`` bytes: exact mode counts them from memory instead of running
    them again."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.batches: list[list[tuple[str, list[np.ndarray]]]] = []
        self.nbytes = 0
        self.full_at: int | None = None  # the first batch that did not fit; it and later ones are not kept
        self.unbounded = False  # keep every batch whatever the budget (exact mode, read-once data)

    def offer(self, i: int, items: list[tuple[str, list[np.ndarray]]]) -> bool:
        """Keep batch ``i`` if it fits; once one did not, no later batch is kept."""
        if self.full_at is not None and not self.unbounded:
            return False
        size = sum(a.nbytes + KEPT_ARRAY_OVERHEAD for _, arrays in items for a in arrays)
        if not self.unbounded and self.nbytes + size > self.budget:
            self.full_at = i
            return False
        self.batches.append(items)
        self.nbytes += size
        return True

    def by_tensor(self) -> list[tuple[str, list[np.ndarray]]]:
        """Every kept batch's arrays per tensor (one call counts them all, tensors in parallel)."""
        if not self.batches:
            return []
        return [(name, [a for b in self.batches for a in b[t][1]]) for t, (name, _) in enumerate(self.batches[0])]

    def drop(self) -> None:
        self.batches.clear()
        self.nbytes = 0

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

import numpy as np

from ..io.memory import available_memory, cgroup_available, format_size, memory_left, parse_size  # noqa: F401 (tests)
from ..methods.settings import MEMORY_BUDGET

logger = logging.getLogger(__name__)

MEMORY_BUDGET_ENV = MEMORY_BUDGET.env
DEFAULT_BUDGET_CAP = 8 << 30
DEFAULT_BUDGET_FRACTION = 0.25
# When the available memory cannot be read at all (no /proc, no sysconf, no Windows API).
UNKNOWN_MEMORY_BUDGET = 1 << 30
# What a kept array costs beyond its data (the array object, its tuple and list): counted so
# that many tiny batches stay within the budget too.
KEPT_ARRAY_OVERHEAD = 256

# Where a message tells how to raise the budget.
HOW_TO_SET = f"{MEMORY_BUDGET.name}=, extra_options['{MEMORY_BUDGET.extra_key}'] or {MEMORY_BUDGET_ENV}"


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


def second_read_differs(first: int, last: int) -> ValueError:
    where = f"batch {last}" if first == last else f"batches {first} to {last}"
    return ValueError(
        f"{where}: the data reader returned different data on its second read "
        "(exact mode reads again the batches over its memory budget; it must yield the same "
        "batches each time, or use mode='streaming')"
    )

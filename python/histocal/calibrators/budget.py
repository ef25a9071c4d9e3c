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
import mmap
import os
import statistics
import time
from collections import deque

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


# Holding outputs costs the kernel's faulting in and zeroing of fresh pages (and unmapping them):
# measured on this many bytes of fresh anonymous memory, in CPU seconds (a loaded machine's wall
# time is mostly waiting), the least of three, once per call that needs it (a few ms).
HOLD_PROBE_BYTES = 4 << 20
# No machine holds memory slower than this (seconds per byte): a batch whose holding costs under
# a tenth of its rerun even at this rate is kept without measuring.
HOLD_COST_CEILING = 20e-9
# Batches whose rerun cost is judged from the median of the last few batches' times (one slow or
# fast batch, a first one warming up, does not decide alone).
RERUN_WINDOW = 7
# Set (tests, benchmarks) to fix the cost of holding a byte instead of measuring it.
_hold_seconds_per_byte: float | None = None


def hold_seconds_per_byte() -> float:
    """What holding one byte of fresh outputs costs on this machine, in CPU seconds."""
    if _hold_seconds_per_byte is not None:
        return _hold_seconds_per_byte
    best = float("inf")
    for _ in range(3):
        t0 = time.thread_time()
        with mmap.mmap(-1, HOLD_PROBE_BYTES) as memory:
            pages = np.frombuffer(memory, np.uint8)
            pages[:: mmap.PAGESIZE] = 1  # one write faults in (and zeroes) each page
            del pages
        best = min(best, time.thread_time() - t0)
    logger.debug("holding outputs costs %.3g s per GB now", best / HOLD_PROBE_BYTES * 1e9)
    return best / HOLD_PROBE_BYTES


class KeptOutputs:
    """The outputs of a call's batches kept (as ORT returned them, no copy) while their total
    stays within ``budget`` bytes and keeping them costs less than running them again: exact mode
    counts them from memory instead of running them a second time.

    The choice is a cost model of what the pass measures: a batch of ``m`` bytes of outputs costs
    ``hold_cost * m`` seconds to hold (``hold_seconds_per_byte``), and running it again costs
    what reading and running it took (``timed``: CPU or wall seconds, the lesser; the median over
    the last ``RERUN_WINDOW`` batches, less what the held memory cost their own run). Which batches are kept changes no
    result: kept and re-run batches are counted alike."""

    def __init__(self, budget: int, hold_cost: float | None = 0.0) -> None:
        self.budget = budget
        # seconds per byte held; 0: keep whatever fits; None: measure when a batch needs it
        self.hold_cost = hold_cost
        self.batches: list[list[tuple[str, list[np.ndarray]]]] = []
        self.kept: set[int] = set()  # the kept batches' indices: the second read skips them
        self.nbytes = 0
        self.full = False  # a batch did not fit: no later batch is kept
        self.unbounded = False  # keep every batch whatever the budget (exact mode, read-once data)
        self._runs: deque[float] = deque(maxlen=RERUN_WINDOW)  # recent batches' rerun seconds
        self._seconds: float | None = None  # the batch being offered: its read and run
        self._held_before = False  # whether the previous batch was kept

    def timed(self, i: int, seconds: float) -> None:
        """Batch ``i`` took ``seconds`` to read and run (``_run_batches`` tells before ``offer``)."""
        self._seconds = seconds

    def offer(self, i: int, items: list[tuple[str, list[np.ndarray]]]) -> bool:
        """Keep batch ``i`` if it fits and is worth holding; once one did not fit, no later
        batch is kept."""
        if self.full and not self.unbounded:
            return False
        size = sum(a.nbytes + KEPT_ARRAY_OVERHEAD for _, arrays in items for a in arrays)
        if not self.unbounded:
            if self.nbytes + size > self.budget:
                self.full = True
                return False
            if not self._worth_holding(size):
                return False
        self.batches.append(items)
        self.kept.add(i)
        self.nbytes += size
        return True

    def _worth_holding(self, size: int) -> bool:
        """Whether holding ``size`` bytes costs less than running their batch again."""
        if self.hold_cost == 0:
            return True
        held, seconds = self._held_before, self._seconds
        self._seconds = None
        if seconds is not None:
            # a run after a kept batch faulted in fresh pages for its outputs: not a rerun's cost
            extra = (self.hold_cost or 0.0) * size if held else 0.0
            self._runs.append(max(0.0, seconds - extra))
        if not self._runs:
            self._held_before = True
            return True
        rerun = statistics.median(self._runs)
        pinned = _hold_seconds_per_byte is not None
        if self.hold_cost is None and (pinned or HOLD_COST_CEILING * size >= 0.1 * rerun):
            self.hold_cost = hold_seconds_per_byte()
        self._held_before = (self.hold_cost or 0.0) * size < rerun
        return self._held_before

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

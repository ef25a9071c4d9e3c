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
import time

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
HOW_TO_SET = MEMORY_BUDGET.how_to_set


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
# Batches whose read and run are timed alone (the previous batch's Rust work waited for first, so
# that it is not counted): the cheapest of them, per byte of outputs, is what a rerun costs. The
# first is the session's first run (cold, nothing to wait for); the third reuses the first's
# memory where that was not kept (no page faults to discount) and costs the overlap of one
# batch's work.
TIMED_BATCHES = (0, 2)
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

    The choice is a cost model of what the pass measures, per byte of outputs: holding a byte
    costs ``hold_cost`` seconds (``hold_seconds_per_byte``: faulting in and zeroing fresh
    pages); running its batch again costs what reading and running the batches of
    ``TIMED_BATCHES`` took alone (``timed``) less their system time (mostly their page faults: a
    rerun reuses the memory of the batches before it; at most ``HOLD_COST_CEILING`` per byte of
    outputs, what the slowest faults cost), per byte, the cheapest of them. Both are
    fixed once measured, so every batch is judged alike (kept while it fits, or none): the
    schedule is one pass or two, the better by the model, never a mix that flips with the noise
    of each batch (the median of recent batches' times it replaces counted the previous batch's
    Rust work in them, which came and went). The system time of the faults themselves is not
    used as the holding cost: it leaves out what holding gigabytes costs later (their release,
    the memory taken from the page cache); on an OCR detector holding 4.9 GB it chose one pass,
    1.3-1.6x the time of two, where the probe's figure chooses two. Which batches are kept changes no result: kept and re-run
    batches are counted alike."""

    def __init__(self, budget: int, hold_cost: float | None = 0.0) -> None:
        self.budget = budget
        # seconds per byte held; 0: keep whatever fits; None: measure when a batch needs it
        self.hold_cost = hold_cost
        self.batches: list[list[tuple[str, list[np.ndarray]]]] = []
        self.kept: set[int] = set()  # the kept batches' indices: the second read skips them
        self.nbytes = 0
        self.full = False  # a batch did not fit: no later batch is kept
        self.unbounded = False  # keep every batch whatever the budget (exact mode, read-once data)
        self._rerun: float | None = None  # seconds per byte of output to run a batch again
        self._timing: tuple[float, int, float] | None = None  # the batch being offered: see timed

    def wants_timing(self, i: int) -> bool:
        """Whether batch ``i`` is to be timed alone (``run_batches``): one of ``TIMED_BATCHES``,
        while the choice may still depend on it."""
        return i in TIMED_BATCHES and self.budget > 0 and self.hold_cost != 0 and not (self.full or self.unbounded)

    def timed(self, i: int, seconds: float, faults: int = 0, system: float = 0.0) -> None:
        """Batch ``i`` took ``seconds`` to read and run alone, with ``faults`` page faults,
        ``system`` of those seconds in system CPU time (``run_batches`` tells before ``offer``,
        for the batches ``wants_timing``)."""
        self._timing = (seconds, faults, system)

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
        timing, self._timing = self._timing, None
        if timing is not None:
            seconds, _, system = timing
            # less the faults of fresh memory for its outputs (a rerun's outputs reuse freed
            # memory), at most what faulting in ``size`` bytes can cost: system time beyond that
            # (thread-pool wakeups on a loaded machine) is paid by a rerun too, and discounting it
            # made a few small batches look free to rerun, so they were read twice
            run = max(0.0, seconds - min(system, size * HOLD_COST_CEILING)) / size
            self._rerun = run if self._rerun is None else min(self._rerun, run)
        if self._rerun is None:
            return True  # never timed (a caller without timing): the budget decides
        pinned = _hold_seconds_per_byte is not None
        if self.hold_cost is None and (pinned or 0.1 * self._rerun <= HOLD_COST_CEILING):
            self.hold_cost = hold_seconds_per_byte()
        hold = self.hold_cost or 0.0
        return hold == 0 or hold < self._rerun

    def by_tensor(self) -> list[tuple[str, list[np.ndarray]]]:
        """Every kept batch's arrays per tensor (one call counts them all, tensors in parallel)."""
        if not self.batches:
            return []
        return [(name, [a for b in self.batches for a in b[t][1]]) for t, (name, _) in enumerate(self.batches[0])]

    def drop(self) -> None:
        self.batches.clear()
        self.nbytes = 0

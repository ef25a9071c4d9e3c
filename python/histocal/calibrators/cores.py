"""The CPUs calibration may use, and how it shares them between onnxruntime and histocal's pool.

``usable_cpus()`` counts what this process may actually run on: the CPUs of its affinity mask,
capped by a cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``,
the tightest along the cgroup's path), never ``os.cpu_count()`` alone (a container limited to
2 CPUs on a 64-core host sees 64 there). The Rust pool's default (``std::thread::
available_parallelism``) reads the same two limits.

``calibration_threads()`` splits them (see ``_split`` for the measurements behind it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..methods.settings import NUM_THREADS

NUM_THREADS_VAR = NUM_THREADS.env


def _quota_v2(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _quota_v1(folder: Path) -> float | None:
    try:
        q = int((folder / "cpu.cfs_quota_us").read_text())
        p = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return q / p if q > 0 and p > 0 else None


def _tightest(base: Path, rel: str, read: Callable[[Path], float | None]) -> float | None:
    """The smallest quota on ``rel``'s path below ``base`` (a parent's quota caps its children);
    inside a container the cgroup path is often not visible, and ``base`` itself is then its own."""
    quotas = []
    parts = [p for p in rel.strip("/").split("/") if p]
    for depth in range(len(parts) + 1):
        folder = base.joinpath(*parts[:depth])
        if folder.is_dir():
            q = read(folder)
            if q is not None:
                quotas.append(q)
    return min(quotas) if quotas else None


def cgroup_cpu_quota(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> float | None:
    """This process's cgroup CPU quota in CPUs (e.g. 1.5), or None where there is none."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, rel = fields
        if controllers == "":  # v2: one unified hierarchy (under unified/ on a hybrid mount)
            unified = root / "unified"
            q = _tightest(unified if unified.is_dir() else root, rel, _quota_v2)
        elif "cpu" in controllers.split(","):
            # v1: mounted as cpu, cpu,cpuacct or cpuacct,cpu
            folders = [root / name for name in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu")]
            q = next((x for f in folders if f.is_dir() and (x := _tightest(f, rel, _quota_v1)) is not None), None)
        else:
            continue
        if q is not None:
            quotas.append(q)
    return min(quotas) if quotas else None


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by its cgroup's CPU quota (rounded
    down, at least 1), as Rust's ``available_parallelism`` counts them."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    return max(1, n)


def threads_from_env() -> int | None:
    """``HISTOCAL_NUM_THREADS`` (None: unset, empty or 0; an error names a bad value)."""
    raw = os.environ.get(NUM_THREADS_VAR, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(
            f"{NUM_THREADS_VAR} must be a whole number of threads >= 0 (0 or unset: one per core), got {raw!r}"
        )
    return n or None


@dataclass(frozen=True)
class CalibrationThreads:
    """How a calibration shares ``total`` CPUs: onnxruntime's intra-op threads for the
    calibration session, whether they spin between operators, and histocal's pool threads that
    bin the previous batch meanwhile."""

    total: int
    ort_threads: int
    ort_spinning: bool
    pool_threads: int


def _split(total: int) -> CalibrationThreads:
    """Measured by the former thread-split benchmark (benches/NOTES.md keeps its results): on 2 CPUs both pools on every core with onnxruntime's threads sleeping between
    operators was the fastest streaming split and within 13% of the fastest exact one (a
    spinning onnxruntime takes the cycles the binning needs: 2.3x slower streaming). On 16
    CPUs (issue 15's measurement; no such machine was at hand to repeat it), 12 spinning
    onnxruntime threads and a pool of 4 beat both pools on every core (1.27 vs 1.61 times the
    inference pass, streaming). Below 8 CPUs the first rule, from 8 up the second: the pool
    gets a quarter of the cores."""
    if total < 8:
        return CalibrationThreads(total, total, False, total)
    pool = max(2, total // 4)
    return CalibrationThreads(total, total - pool, True, pool)


def calibration_threads(num_threads: int | None = None) -> CalibrationThreads:
    """The split for ``num_threads`` CPUs (a calibrator's keyword), else for
    ``HISTOCAL_NUM_THREADS``, else for ``usable_cpus()``."""
    if num_threads is not None and (
        isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 0
    ):
        raise ValueError(f"num_threads must be a whole number of threads >= 0 (0: automatic), got {num_threads!r}")
    total = num_threads or threads_from_env() or usable_cpus()
    return _split(total)


def session_options_for(threads: CalibrationThreads) -> Any:
    """ORT's calibration session options (graph optimizations off, as ORT's calibrators) with
    ``threads``' intra-op threads and spinning."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = threads.ort_threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if threads.ort_spinning else "0")
    return options


def pool_threads_for(threads: CalibrationThreads | None) -> int:
    """The Rust pool size for a calibration's worker thread: 0 (the shared pool, sized by
    ``set_num_threads`` / ``HISTOCAL_NUM_THREADS`` / the usable CPUs) unless ``threads`` splits
    the cores."""
    if threads is None or threads.pool_threads == threads.total:
        return 0
    return threads.pool_threads

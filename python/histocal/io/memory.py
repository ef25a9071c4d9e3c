"""How much memory this process can still take, and the check that refuses work before it starts.

``available_memory``: the system's available memory (``MemAvailable``), lowered to what is left under a
cgroup (container) limit. ``memory_left`` also lowers it to what is left of the address-space limit
(``RLIMIT_AS``, ``ulimit -v``), where an allocation past it fails (and in Rust aborts). Where the kernel
overcommits, an allocation that does not fit succeeds and the process is killed later, so work whose size
is known in advance (histograms of ``num_bins`` bins per tensor or channel) is estimated and refused up
front by ``check_memory``, with an error naming the option and the estimate.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

try:
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None  # type: ignore[assignment]

# What work whose size is estimated leaves to everything else (the interpreter, other arrays).
MEMORY_MARGIN = 64 << 20


def available_memory() -> int | None:
    """Bytes of memory this process can still take: the system's available memory, lowered to
    what is left under a cgroup (container) limit; None where neither can be read."""
    found = [m for m in (_system_available(), cgroup_available()) if m is not None]
    return min(found) if found else None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, ValueError):
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _system_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if sys.platform == "win32":
        return _windows_available()
    for pages in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):  # macOS has only the total
        try:
            return int(os.sysconf(pages)) * int(os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            continue
    return None


def _windows_available() -> int | None:  # pragma: no cover - exercised on Windows only
    import ctypes

    class MemoryStatus(ctypes.Structure):
        _fields_ = [
            ("dwLength", ctypes.c_ulong),
            ("dwMemoryLoad", ctypes.c_ulong),
            ("ullTotalPhys", ctypes.c_ulonglong),
            ("ullAvailPhys", ctypes.c_ulonglong),
            ("ullTotalPageFile", ctypes.c_ulonglong),
            ("ullAvailPageFile", ctypes.c_ulonglong),
            ("ullTotalVirtual", ctypes.c_ulonglong),
            ("ullAvailVirtual", ctypes.c_ulonglong),
            ("ullAvailExtendedVirtual", ctypes.c_ulonglong),
        ]

    status = MemoryStatus()
    status.dwLength = ctypes.sizeof(MemoryStatus)
    if not ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):  # type: ignore[attr-defined]
        return None
    return int(status.ullAvailPhys)


def cgroup_available(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """What is left under this process's cgroup memory limit (v2, else v1); None without one."""
    for limit_file, usage_file in (
        ("memory.max", "memory.current"),
        ("memory.limit_in_bytes", "memory.usage_in_bytes"),
    ):
        folder = _own_cgroup(root, limit_file)
        if folder is None:
            continue
        limit = _read_int(folder / limit_file)
        if limit is None or limit >= 1 << 60:  # v1 writes a huge number for no limit
            return None
        usage = _read_int(folder / usage_file) or 0
        return max(limit - usage, 0)
    return None


def _own_cgroup(root: Path, limit_file: str) -> Path | None:
    """The folder of this process's cgroup holding ``limit_file`` (inside a container the
    cgroup root is the process's own cgroup)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, path = parts[1], parts[2].lstrip("/")
        # cgroup v2's line has no controllers; v1 names the memory controller
        if (controllers == "") == (limit_file == "memory.max") and (
            controllers == "" or "memory" in controllers.split(",")
        ):
            for base in (root / path, root / "memory" / path, root, root / "memory"):
                if (base / limit_file).is_file():
                    return base
    for base in (root, root / "memory"):
        if (base / limit_file).is_file():
            return base
    return None


def address_space_left() -> int | None:
    """What is left under RLIMIT_AS (``ulimit -v``): the limit less this process's mapped size."""
    if resource is None:  # pragma: no cover - Windows
        return None
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return max(soft - int(line.split()[1]) * 1024, 0)
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_left() -> int | None:
    """What this process can still allocate: the least of ``available_memory`` and what is left under
    RLIMIT_AS; None where none of them can be read."""
    found = [m for m in (available_memory(), address_space_left()) if m is not None]
    return min(found) if found else None


def format_size(n: int) -> str:
    """``n`` bytes for a message: "512 MiB", "8 GiB", "100 bytes"."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def check_memory(need: int, what: str, advice: str) -> None:
    """MemoryError unless ``need`` bytes (an estimate of work about to start) fit in ``memory_left``
    (with ``MEMORY_MARGIN`` to spare). ``what`` says what needs it; ``advice`` how to need less."""
    left = memory_left()
    if left is not None and need + MEMORY_MARGIN > left:
        raise MemoryError(
            f"{what} needs about {format_size(need)} of memory, more than the {format_size(left)} this process "
            f"can still take (available memory, cgroup limit and address-space limit): {advice}"
        )


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

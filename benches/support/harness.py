"""The benchmarks' one measuring layer: interleaved side-by-side timing in one process (the order
rotates every round, so a drift of the machine's speed falls on every subject alike), the floor
of calibration (one warm pass of the augmented model over the same feeds), peak memory, the
environment and the machine's load, and one JSON record per measurement, written to
``benches/results/<bench>.json`` (what BENCHMARKS.md is generated from; ``support/report.py``).

Why our own layer rather than pytest-benchmark: the figures this project reports are *ratios
within one run* (histocal over onnxruntime, a mode over the floor measured around the same
round) on a shared, loaded machine. pytest-benchmark times one callable at a time in isolation
and compares runs across sessions; it has no notion of rounds interleaving several subjects, of a
floor measured between them, or of peak RSS per subject. The layer here is about 300 lines.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benches" / "results"

Record = dict[str, Any]


def load_average() -> float:
    """The 1-minute load average (the machine is shared: every record carries it)."""
    return round(os.getloadavg()[0], 2)


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota (rounded
    down, at least 1), as histocal's thread pool counts them (n of the floor's B)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(quota) // int(period)))
    return max(1, n)


def environment() -> dict[str, Any]:
    """The machine and the versions a result was measured with."""
    import numpy
    import onnx
    import onnxruntime

    import histocal

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        found = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
        cpu = found.group(1).strip() if found else cpu
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "histocal": histocal.__version__,
        "histocal_threads": histocal.get_num_threads(),
        "commit": commit.stdout.strip() or None,
    }


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def per_round_ratio(numerator: list[float], denominator: list[float]) -> float:
    """The median over rounds of numerator / denominator measured in the same round."""
    return median([a / b for a, b in zip(numerator, denominator)])


@dataclass
class Interleaved:
    """Each subject's seconds per round; the floor's values (W, C, R, B) measured before the
    first round and after each, and each subject's ratio to the floor around its round."""

    seconds: dict[str, list[float]]
    floors: list[dict[str, float]] = field(default_factory=list)
    to_floor: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def median(self, subject: str) -> float:
        return median(self.seconds[subject])

    def ratio(self, subject: str, reference: str) -> float:
        return per_round_ratio(self.seconds[subject], self.seconds[reference])

    def floor(self) -> dict[str, float]:
        return {k: median([f[k] for f in self.floors]) for k in self.floors[0]} if self.floors else {}


def interleave(
    runs: Mapping[str, Callable[[], float]],
    repeat: int,
    warmup: int = 1,
    floor: Callable[[], dict[str, float]] | None = None,
) -> Interleaved:
    """``warmup`` unmeasured rounds, then ``repeat`` rounds of every run, round r starting at
    the r-th subject (rotating order). Each run returns its own seconds (it excludes its setup)."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()  # first-time imports, allocations, page faults
    result = Interleaved({name: [] for name in names})
    if floor:
        result.floors.append(floor())
    for r in range(repeat):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            result.seconds[name].append(runs[name]())
        if floor:
            result.floors.append(floor())
            around = {k: (result.floors[-2][k] + result.floors[-1][k]) / 2 for k in ("W", "B")}
            for name in names:
                ratios = result.to_floor.setdefault(name, {"W": [], "B": []})
                for k in ("W", "B"):
                    ratios[k].append(result.seconds[name][-1] / around[k])
    return result


def timed(fn: Callable[[], object]) -> float:
    """Wall seconds of fn(), after a collection so an earlier run's garbage is not charged."""
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _status_kib(key: str) -> int:
    found = re.search(rf"{key}:\s+(\d+)", Path("/proc/self/status").read_text())
    return int(found.group(1)) if found else 0


@contextlib.contextmanager
def peak_rss() -> Iterator[dict[str, float]]:
    """Peak resident memory of this process during the block, in MB above what it held at the
    start (Linux: the high-water mark is reset through /proc/self/clear_refs). Yields a dict
    filled on exit: ``peak_mb`` (absolute) and ``above_start_mb``."""
    gc.collect()
    out: dict[str, float] = {}
    try:
        Path("/proc/self/clear_refs").write_text("5")
        start = _status_kib("VmRSS")
    except OSError:  # not Linux: the process's lifetime peak
        start = 0
    yield out
    peak = _status_kib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out["peak_mb"] = round(peak / 1024, 1)
    out["above_start_mb"] = round((peak - start) / 1024, 1)


def isolated(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a fresh process (a module-level function): for peak memory that no earlier
    measurement's heap may hide."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


class Floor:
    """The floor of calibration on an augmented model (every calibrated tensor an output), over
    the feeds a calibration reads: W, the wall time of one warm inference pass with each
    sample's outputs dropped as produced (the faster of ORT's intra-op threads sleeping and
    spinning, compared once); C, that pass's CPU time; R, the CPU time of reading every output
    once (numpy max, one thread); n, the usable CPUs; B = max(W, (C + R) / n), below which no
    schedule that reads every value can go."""

    def __init__(self, augmented: str, feeds: list[dict[str, Any]]) -> None:
        import onnxruntime

        def session(spinning: bool) -> Any:
            options = onnxruntime.SessionOptions()
            options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
            options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
            return onnxruntime.InferenceSession(augmented, sess_options=options, providers=["CPUExecutionProvider"])

        self.feeds, self.cpus = feeds, usable_cpus()
        self.sleeping, self.spinning = session(False), session(True)
        self.names = [o.name for o in self.sleeping.get_outputs()]
        first = self.sleeping.run(self.names, feeds[0])  # warm: the first run faults in ORT's buffers
        self.spinning.run(self.names, feeds[0])
        self.outputs, self.bytes_per_sample = len(first), sum(a.nbytes for a in first)
        self.spin_ratio: float | None = None

    def _pass(self, sess: Any) -> tuple[float, float]:
        cpu0, t0 = time.process_time(), time.perf_counter()
        for feed in self.feeds:
            out = sess.run(self.names, feed)
            del out
        return time.perf_counter() - t0, time.process_time() - cpu0

    def _read(self) -> float:
        total = 0.0
        for feed in self.feeds:
            out = self.sleeping.run(self.names, feed)
            t0 = time.thread_time()
            for a in out:
                if a.size:  # an empty output has no max
                    a.max()
            total += time.thread_time() - t0
        return total

    def measure(self) -> dict[str, float]:
        wall, cpu = self._pass(self.sleeping)
        if self.spin_ratio is None:  # spinning is timed once: on a loaded machine it can be slow
            self.spin_ratio = self._pass(self.spinning)[0] / wall
        w = wall * min(1.0, self.spin_ratio)
        r = self._read()
        return {"W": w, "C": cpu, "R": r, "B": max(w, (cpu + r) / self.cpus)}


class ListReader:
    """A read-once CalibrationDataReader over a list (onnxruntime's calibrators take only readers)."""

    def __init__(self, feeds: list[dict[str, Any]]) -> None:
        self.it = iter(feeds)

    def get_next(self) -> dict[str, Any] | None:
        return next(self.it, None)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """onnxruntime's calibrators print() progress: keep it out of the report."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield


@dataclass
class Run:
    """One benchmark's run: its records, written as one JSON file with the command, settings,
    environment and the load at start and end."""

    bench: str
    question: str
    command: str
    size: str
    settings: dict[str, Any]
    records: list[Record] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.environment = environment()
        self.load_start = load_average()
        self.started = datetime.datetime.now(datetime.timezone.utc)

    def add(self, subject: str, case: Mapping[str, Any], **values: Any) -> Record:
        """One measurement: a subject (histocal streaming, ORT Entropy, ...) on one case (model,
        method, samples, ...), its values (seconds, ratios, MB ...) and the load when taken."""
        record = {"subject": subject, "case": dict(case), **values, "load": load_average()}
        self.records.append(record)
        print(f"  {subject} {dict(case)}: {_brief(values)}", file=sys.stderr, flush=True)
        return record

    def result(self) -> dict[str, Any]:
        return {
            "bench": self.bench,
            "question": self.question,
            "command": self.command,
            "size": self.size,
            "settings": self.settings,
            "date": self.started.strftime("%Y-%m-%d"),
            "minutes": round((datetime.datetime.now(datetime.timezone.utc) - self.started).total_seconds() / 60, 1),
            "environment": {**self.environment, "load_start": self.load_start, "load_end": load_average()},
            "records": self.records,
        }

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.bench}.json"
        path.write_text(json.dumps(self.result(), indent=1, default=_jsonable) + "\n", encoding="utf-8")
        return path


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _brief(values: Mapping[str, Any]) -> str:
    shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in values.items() if not isinstance(v, list)}
    return ", ".join(f"{k} {v}" for k, v in shown.items())


def load_result(bench: str, folder: Path = RESULTS) -> dict[str, Any] | None:
    path = folder / f"{bench}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

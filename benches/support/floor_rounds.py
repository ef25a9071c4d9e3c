"""What the floor benchmarks share (bench_floor.py, bench_adaptive_exact.py): interleaved rounds of
timed runs with the floor B measured around each round, and the report's command lines, floor
line and output."""

from __future__ import annotations

import shlex
import statistics
import sys
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass
class Rounds(Generic[K]):
    """Each run's seconds per round, its ratios to the floors B and W measured around that round,
    and the floor's medians (W, C, R, B, ...) over every measurement."""

    times: dict[K, list[float]]
    to_b: dict[K, list[float]]
    to_w: dict[K, list[float]]
    floor: dict[str, float]


def interleaved_rounds(
    runs: Mapping[K, Callable[[], float]], measure_floor: Callable[[], dict[str, float]], repeat: int, warmup: int
) -> Rounds[K]:
    """``warmup`` unmeasured rounds of every run, then ``repeat`` rounds; the floor is measured
    before the first round and after each, and a run's ratios in a round are to the mean of the
    floors around it (the machine's speed drifts)."""
    for _ in range(warmup):
        for run in runs.values():
            run()  # first-time imports and allocations
    floors = [measure_floor()]
    times: dict[K, list[float]] = {k: [] for k in runs}
    to_b: dict[K, list[float]] = {k: [] for k in runs}
    to_w: dict[K, list[float]] = {k: [] for k in runs}
    for _ in range(repeat):
        for key, run in runs.items():
            times[key].append(run())
        floors.append(measure_floor())
        around = {k: (floors[-2][k] + floors[-1][k]) / 2 for k in ("B", "W")}
        for key in runs:
            to_b[key].append(times[key][-1] / around["B"])
            to_w[key].append(times[key][-1] / around["W"])
    return Rounds(times, to_b, to_w, {k: statistics.median(f[k] for f in floors) for k in floors[0]})


def floor_line(label: str, floor: Mapping[str, float]) -> str:
    """The floor's W, C, R and B on one line (for stderr)."""
    return f"{label}: W {floor['W']:.3f} C {floor['C']:.3f} R {floor['R']:.3f} B {floor['B']:.3f}"


def command_lines(script: str, argv: list[str]) -> list[str]:
    """A report's opening: the command that made it, from the repository root."""
    return [
        "Command (from the repository root):",
        "",
        "```",
        "python3 " + " ".join(shlex.quote(a) for a in [script, *argv]),
        "```",
        "",
    ]


def write_report(lines: list[str], out: str | None) -> None:
    """The report to stdout, and to ``out`` when given."""
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if out:
        Path(out).write_text(text)

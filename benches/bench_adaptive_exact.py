#!/usr/bin/env python3
"""Exact mode's adaptive schedule against its two fixed ones, as multiples of the floor B.

Exact mode keeps a batch's outputs (one inference pass) only while holding them costs less than
running the batch again (``histocal.calibrators.budget.KeptOutputs``). This benchmark times, in
one process over the same feeds, interleaved round by round (medians over ``--repeat`` rounds;
each round's ratios to the mean of the floors measured around it, as ``bench_floor.py`` does):

* default: the adaptive schedule (list input, default memory budget);
* one pass: every batch kept within the budget, as before the cost model (holding cost set to 0);
* two passes: ``MemoryBudget`` 0 (nothing kept, every batch runs twice);
* streaming: ``CollectionMode`` streaming (one pass, one batch of outputs alive at a time);

for Entropy and Percentile (``collect_data`` + ``compute_data``; setup not counted), with W, C,
R, B of ``bench_floor.py`` from the same run, the process CPU seconds of each schedule and their
ratio to two passes' in the same round (the choice's cost, robust to the machine's load), and how
many batches the default kept.

Usage:
    python3 benches/bench_adaptive_exact.py --model det.onnx --shape x=1x3x320x320 --samples 32
    python3 benches/bench_adaptive_exact.py --cnn 224 --samples 64    # bench_floor.py's CNN
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_calibrate as bc
import bench_floor as bf
from support.floor_rounds import command_lines, floor_line, interleaved_rounds, write_report

SCHEDULES = ("default (adaptive)", "one pass (keep all)", "two passes (budget 0)", "streaming")


def timed_collect(model: str, aug: str, feeds: list[dict], method: Any, schedule: str) -> tuple[float, float, int]:
    """Wall and process CPU seconds of collect_data + compute_data, and the batches kept (counted
    from memory)."""
    import histocal
    from histocal.calibrators import budget as hb

    extra: dict[str, Any] = {"MemoryBudget": 0} if schedule.startswith("two") else {}
    if schedule == "streaming":
        extra = {"CollectionMode": "streaming"}
    kept: list[int] = []
    original_drop = hb.KeptOutputs.drop

    def drop(self: Any) -> None:
        kept.append(len(self.kept))
        original_drop(self)

    saved = hb.hold_seconds_per_byte()
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        cal = histocal.create_calibrator(model, augmented_model_path=aug, calibrate_method=method, extra_options=extra)
        gc.collect()
        hb.KeptOutputs.drop = drop  # type: ignore[method-assign]
        if schedule.startswith("one"):
            hb._hold_seconds_per_byte = 0.0
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            cal.collect_data(feeds)
            cal.compute_data()
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        finally:
            hb._hold_seconds_per_byte = saved
            hb.KeptOutputs.drop = original_drop  # type: ignore[method-assign]
    del cal
    gc.collect()
    return seconds, cpu, sum(kept)


def bench_model(label: str, model: str, args: argparse.Namespace, work: Path) -> list[str]:
    from onnxruntime.quantization.calibrate import CalibrationMethod

    import histocal
    from histocal.calibrators.budget import hold_seconds_per_byte
    from histocal.calibrators.cores import usable_cpus

    feeds = bf.make_feeds(model, args.samples, args)
    aug, mode_aug = str(work / "floor.onnx"), str(work / "mode.onnx")
    histocal.create_calibrator(model, augmented_model_path=aug, calibrate_method=CalibrationMethod.Entropy)
    floor = bf.Floor(aug, feeds)
    n = usable_cpus()
    methods = {m: getattr(CalibrationMethod, m) for m in args.methods}
    runs = [(m, s) for m in methods for s in SCHEDULES]
    kept: dict[tuple[str, str], list[int]] = {r: [] for r in runs}
    cpus: dict[tuple[str, str], list[float]] = {r: [] for r in runs}

    def runner(r: tuple[str, str]) -> Callable[[], float]:
        def run() -> float:
            t, c, k = timed_collect(model, mode_aug, feeds, methods[r[0]], r[1])
            cpus[r].append(c)
            kept[r].append(k)
            return t

        return run

    rounds = interleaved_rounds({r: runner(r) for r in runs}, lambda: floor.measure(n), args.repeat, args.warmup)
    kept = {r: k[len(k) - args.repeat :] for r, k in kept.items()}  # the measured rounds'
    cpus = {r: c[len(c) - args.repeat :] for r, c in cpus.items()}
    times, ratios, f = rounds.times, rounds.to_b, rounds.floor
    hold = hold_seconds_per_byte()
    print(floor_line(label, f), file=sys.stderr)
    rows = [
        f"| {label} | {floor.outputs} / {floor.values * 4 / 1e6:.0f} MB | {f['W']:.3f} s | {f['C']:.3f} s "
        f"| {f['R']:.3f} s | {f['B']:.3f} s | {hold * 1e9:.2f} s/GB | | | | | | |"
    ]
    for method in methods:
        two = statistics.median(ratios[(method, SCHEDULES[2])])
        for s in SCHEDULES:
            r = (method, s)
            rb = statistics.median(ratios[r])
            # CPU seconds against two passes' in the same round (a load-robust check of the choice)
            cpu = statistics.median(c / c2 for c, c2 in zip(cpus[r], cpus[(method, SCHEDULES[2])]))
            rows.append(
                f"| | | | | | | | {method} {s} | {statistics.median(times[r]):.3f} s | **{rb:.2f}** "
                f"| {rb / two:.2f} | {statistics.median(cpus[r]):.3f} s | {cpu:.2f} | {'/'.join(map(str, kept[r]))} |"
            )
    return rows


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", default=[], help="an ONNX model (repeatable)")
    ap.add_argument("--cnn", type=int, nargs="*", default=[], help="bench_calibrate's CNN at these input sizes too")
    ap.add_argument("--samples", type=int, default=32, help="feeds, one batch each (default 32)")
    ap.add_argument("--dim", type=int, default=1, help="value for symbolic input dims (default 1)")
    ap.add_argument("--shape", action="append", default=[], help="an input's shape, NAME=1x3x320x320 (repeatable)")
    ap.add_argument(
        "--methods", nargs="+", default=["Entropy", "Percentile"], help="methods (default Entropy Percentile)"
    )
    ap.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1)")
    ap.add_argument("--out", help="write the markdown table to this file")
    args = ap.parse_args(argv)

    import histocal
    from histocal.calibrators.cores import usable_cpus

    lines = [
        *command_lines("benches/bench_adaptive_exact.py", argv),
        *[f"- {m}" for m in bc.machine_info()],
        f"- usable CPUs {usable_cpus()}; {args.samples} samples; load average at start {bc.loadavg()}",
        "",
        "| model | outputs / size per sample | W | C | R | B | hold cost | schedule | time | x B | x two passes "
        "| CPU | CPU x two passes | batches kept |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="bench_adaptive.") as tmp:
        import onnx

        models = [(Path(m).name, m) for m in args.model]
        for size in args.cnn:
            path = str(Path(tmp) / f"cnn{size}.onnx")
            onnx.save(bc.build_cnn(size, (5, 8, 14, 6), 32, 0), path)
            models.append((f"CNN {size}x{size}", path))
        for label, path in models:
            lines += bench_model(label, path, args, Path(tmp))
    lines.append(f"\nload average at end {bc.loadavg()}; histocal {histocal.__version__}")
    write_report(lines, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])

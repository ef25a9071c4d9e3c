#!/usr/bin/env python3
"""Every collection mode's time as a multiple of the physical floor of calibration.

The floor is what any calibration that reads every activation must at least spend, measured in
the same process over the same feeds:

* W: the warm inference pass of the augmented model (every calibrated output fetched, each
  sample's outputs dropped as soon as they are produced), wall seconds; the faster of a session
  with ORT's intra-op threads sleeping and one with them spinning (compared once);
* C: the CPU time of that pass with the threads sleeping (spinning CPU is not work);
* R: the CPU time to read every fetched activation once (numpy ``max`` over each output, one
  thread);
* n: the CPUs this process may use (affinity and cgroup quota);
* B = max(W, (C + R) / n): no schedule that reads every value can beat it.

Each mode is ``collect_data`` + ``compute_data`` on a calibrator made beforehand (setup, i.e.
graph augmentation and session creation, is not counted, as it is not in W), with feeds given as
a list: histocal streaming and exact (Entropy, 128 bins): the default (one inference pass while the
outputs fit the memory budget), the same with a read-once reader, and the two-pass schedule
(``MemoryBudget`` 0, what data beyond the budget costs), histocal MinMax, and onnxruntime's MinMax,
Entropy and Percentile for comparison (onnxruntime's histogram calibrators keep every output of
every sample, so they run only at ``--ort-samples`` samples or fewer and only at the default
size). Each round runs every mode once; the floor is measured before the first round and after
each, and a mode's ratios in a round are to the mean of the floors around it (the machine's
speed drifts); the table gives medians over ``--repeat`` rounds.

Usage:
    python3 benches/bench_floor.py                                  # CNN at 224 and 640, 8 and 64 samples
    python3 benches/bench_floor.py --sizes 224 --samples 8 --repeat 1   # quick
    python3 benches/bench_floor.py --model a.onnx --model b.onnx --sizes   # only given models
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_calibrate as bc
from support.floor_rounds import command_lines, floor_line, interleaved_rounds, write_report


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def floor_session(path: str, spinning: bool) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return onnxruntime.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


def inference_pass(sess: Any, names: list[str], feeds: list[dict]) -> tuple[float, float]:
    """(wall, process CPU) of one pass; each sample's outputs are dropped before the next runs."""
    c0, t0 = cpu_seconds(), time.perf_counter()
    for feed in feeds:
        out = sess.run(names, feed)
        del out
    return time.perf_counter() - t0, cpu_seconds() - c0


def read_pass(sess: Any, names: list[str], feeds: list[dict]) -> float:
    """CPU seconds (this thread) of a numpy max over every output of every sample."""
    total = 0.0
    for feed in feeds:
        out = sess.run(names, feed)
        t0 = time.thread_time()
        for a in out:
            if a.size:  # a model may have empty outputs (no identity for max)
                a.max()
        total += time.thread_time() - t0
        del out
    return total


class Floor:
    """The floor's sessions (intra-op threads sleeping, and spinning) on the augmented model."""

    def __init__(self, aug: str, feeds: list[dict]) -> None:
        self.feeds = feeds
        self.sessions = {s: floor_session(aug, s) for s in (False, True)}
        self.names = [o.name for o in self.sessions[False].get_outputs()]
        for sess in self.sessions.values():
            sess.run(self.names, feeds[0])  # warm: the first runs fault in ORT's buffers
        first = self.sessions[False].run(self.names, feeds[0])
        self.outputs, self.values = len(first), sum(a.size for a in first)

    def measure(self, n: int) -> dict[str, float]:
        """W, C (the sleeping session's CPU), R and B, one pass each. The spinning session is
        timed on the first call only (on a loaded machine it can take several times as long);
        later W are the sleeping session's, scaled by the first call's spinning / sleeping
        ratio where spinning was the faster."""
        w_sleep, c = inference_pass(self.sessions[False], self.names, self.feeds)
        if not hasattr(self, "spin_ratio"):
            w_spin, _ = inference_pass(self.sessions[True], self.names, self.feeds)
            self.spin_ratio = w_spin / w_sleep
        r = read_pass(self.sessions[False], self.names, self.feeds)
        w = w_sleep * min(1.0, self.spin_ratio)
        return {
            "W": w,
            "W_sleep": w_sleep,
            "W_spin": w_sleep * self.spin_ratio,
            "C": c,
            "R": r,
            "B": max(w, (c + r) / n),
        }


class ListReader:
    """A CalibrationDataReader over a list (read once)."""

    def __init__(self, feeds: list[dict]) -> None:
        self.it = iter(feeds)

    def get_next(self) -> dict | None:
        return next(self.it, None)


def mode_runners(model: str, work: Path, feeds: list[dict], with_ort: bool) -> dict[str, Callable[[], float]]:
    """name -> a function making a calibrator, then timing its collect_data + compute_data."""
    import onnxruntime.quantization.calibrate as ort_calibrate
    from onnxruntime.quantization.calibrate import CalibrationMethod

    import histocal

    def runner(create: Any, method: Any, extra: dict[str, Any], read_once: bool = False) -> Callable[[], float]:
        ort = create is ort_calibrate.create_calibrator

        def run() -> float:
            with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):  # ORT print()s
                cal = create(
                    model, augmented_model_path=str(work / "mode.onnx"), calibrate_method=method, extra_options=extra
                )
                gc.collect()
                t0 = time.perf_counter()
                cal.collect_data(ListReader(feeds) if ort or read_once else feeds)  # onnxruntime takes only readers
                cal.compute_data()
                seconds = time.perf_counter() - t0
            del cal
            gc.collect()
            return seconds

        return run

    E, P, M = CalibrationMethod.Entropy, CalibrationMethod.Percentile, CalibrationMethod.MinMax
    runners = {
        "histocal streaming (Entropy)": runner(histocal.create_calibrator, E, {"CollectionMode": "streaming"}),
        "histocal default, list input (exact, Entropy)": runner(histocal.create_calibrator, E, {}),
        "histocal default, read-once reader (exact, Entropy)": runner(histocal.create_calibrator, E, {}, True),
        "histocal exact, two passes (MemoryBudget 0, Entropy)": runner(
            histocal.create_calibrator, E, {"MemoryBudget": 0}
        ),
        "histocal exact (Percentile)": runner(histocal.create_calibrator, P, {"CollectionMode": "exact"}),
        "histocal MinMax": runner(histocal.create_calibrator, M, {}),
        "onnxruntime MinMax": runner(ort_calibrate.create_calibrator, M, {}),
    }
    if with_ort:
        runners["onnxruntime Entropy"] = runner(ort_calibrate.create_calibrator, E, {})
        runners["onnxruntime Percentile"] = runner(ort_calibrate.create_calibrator, P, {})
    return runners


def input_specs(model: str, args: argparse.Namespace) -> list[tuple[str, tuple[int, ...], str]]:
    """bench_calibrate's specs, with ``--shape NAME=AxBxC`` overriding an input's shape."""
    shapes = dict(s.split("=", 1) for s in args.shape)
    specs = bc.input_specs(model, args.dim)
    return [(n, tuple(int(d) for d in shapes[n].split("x")) if n in shapes else s, t) for n, s, t in specs]


def make_feeds(model: str, samples: int, args: argparse.Namespace) -> list[dict]:
    reader = bc.SyntheticReader(input_specs(model, args), samples, 0)
    return [reader.sample(i) for i in range(samples)]


def candidate_splits(n: int) -> list[Any]:
    """(ORT threads, spinning, pool threads) to compare on n CPUs: each pool on every core, on
    about three quarters and on half of them."""
    from histocal.calibrators.cores import CalibrationThreads

    sizes = sorted({n, max(1, n - n // 4), max(1, n // 2), max(1, n // 4)}, reverse=True)
    return [CalibrationThreads(n, o, spin, p) for o in sizes for spin in (False, True) for p in sizes]


def bench_splits(model: str, samples: int, args: argparse.Namespace, work: Path) -> list[str]:
    """Streaming and exact Entropy collect_data + compute_data under each candidate split."""
    from onnxruntime.quantization.calibrate import CalibrationMethod

    import histocal
    from histocal.calibrators.cores import usable_cpus

    feeds = make_feeds(model, samples, args)
    splits = candidate_splits(usable_cpus())
    times: dict[tuple[Any, str], list[float]] = {}
    for r in range(args.repeat + 1):  # the first round warms up
        for split in splits:
            for mode in ("streaming", "exact"):
                cal = histocal.create_calibrator(
                    model,
                    augmented_model_path=str(work / "split.onnx"),
                    calibrate_method=CalibrationMethod.Entropy,
                    extra_options={"CollectionMode": mode},
                )
                cal.threads = split
                cal.create_inference_session()
                t0 = time.perf_counter()
                cal.collect_data(feeds)
                cal.compute_data()
                if r:
                    times.setdefault((split, mode), []).append(time.perf_counter() - t0)
                del cal
    best = {m: min(statistics.median(v) for (s, mm), v in times.items() if mm == m) for m in ("streaming", "exact")}
    rows = [
        f"| {s.ort_threads} | {'yes' if s.ort_spinning else 'no'} | {s.pool_threads} "
        f"| {statistics.median(times[(s, 'streaming')]):.3f} s ({statistics.median(times[(s, 'streaming')]) / best['streaming']:.2f}) "
        f"| {statistics.median(times[(s, 'exact')]):.3f} s ({statistics.median(times[(s, 'exact')]) / best['exact']:.2f}) |"
        for s in splits
    ]
    return [
        "",
        f"Thread splits on {usable_cpus()} CPUs, {Path(model).name}, {samples} samples (medians of {args.repeat}; "
        "in brackets: time over the best of the column):",
        "",
        "| ORT intra-op threads | ORT spinning | histocal pool threads | streaming | exact |",
        "|---:|---|---:|---:|---:|",
        *rows,
    ]


def bench_one(label: str, model: str, samples: int, args: argparse.Namespace, work: Path) -> list[str]:
    """The floor is measured before each round of the modes and after the last; each mode's
    ratio in a round is to the mean of the floors around it (the machine's speed drifts), and
    the table gives medians over rounds."""
    from onnxruntime.quantization.calibrate import CalibrationMethod

    import histocal
    from histocal.calibrators.cores import usable_cpus

    feeds = make_feeds(model, samples, args)
    aug = str(work / "floor.onnx")
    histocal.create_calibrator(model, augmented_model_path=aug, calibrate_method=CalibrationMethod.Entropy)
    floor = Floor(aug, feeds)
    n = usable_cpus()
    with_ort = (samples <= args.ort_samples and label.endswith("(default size)")) or samples <= args.ort_samples_any
    runners = mode_runners(model, work, feeds, with_ort)
    rounds = interleaved_rounds(runners, lambda: floor.measure(n), args.repeat, args.warmup)
    f = rounds.floor
    print(floor_line(f"{label}, {samples} samples", f), file=sys.stderr)
    rows = [
        f"| {label} | {samples} | {floor.outputs} / {floor.values * 4 / 1e6:.0f} MB | {f['W']:.3f} s "
        f"(spinning / sleeping {floor.spin_ratio:.2f}) | {f['C']:.3f} s | {f['R']:.3f} s | {n} "
        f"| {f['B']:.3f} s | | | | |"
    ]
    for name, t in rounds.times.items():
        rb = statistics.median(rounds.to_b[name])
        rw = statistics.median(rounds.to_w[name])
        rows.append(f"| | | | | | | | | {name} | {statistics.median(t):.3f} s | **{rb:.2f}** | {rw:.2f} |")
    return rows


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", default=[], help="an ONNX model to measure too (repeatable)")
    ap.add_argument("--sizes", type=int, nargs="*", default=[224, 640], help="CNN input sizes (default 224 640)")
    ap.add_argument("--samples", type=int, nargs="+", default=[8, 64], help="sample counts (default 8 64)")
    ap.add_argument("--dim", type=int, default=1, help="value for symbolic input dims (default 1)")
    ap.add_argument("--shape", action="append", default=[], help="an input's shape, NAME=1x3x320x320 (repeatable)")
    ap.add_argument("--splits", type=int, default=0, help="also compare thread splits at this many samples (0: no)")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions; medians are reported (default 3)")
    ap.add_argument(
        "--ort-samples",
        type=int,
        default=8,
        help="run onnxruntime's histogram calibrators on the CNN's default size up to this many samples (default 8)",
    )
    ap.add_argument(
        "--ort-samples-any", type=int, default=0, help="... and on every model up to this many samples (default 0)"
    )
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured rounds of every mode first (default 1)")
    ap.add_argument("--out", help="write the markdown table to this file")
    args = ap.parse_args(argv)

    import onnx

    import histocal
    from histocal.calibrators.cores import calibration_threads, usable_cpus

    lines = [
        *command_lines("benches/bench_floor.py", argv),
        *[f"- {m}" for m in bc.machine_info()],
        f"- usable CPUs {usable_cpus()}; calibration threads {calibration_threads()}; load average at start "
        f"{bc.loadavg()}",
        "",
        "| model | samples | outputs / size per sample | W | C | R | n | B | mode | time | x B | x W |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="bench_floor.") as tmp:
        work = Path(tmp)
        models: list[tuple[str, str]] = []
        for size in args.sizes:
            path = str(work / f"cnn{size}.onnx")
            onnx.save(bc.build_cnn(size, (5, 8, 14, 6), 32, 0), path)
            models.append((f"CNN {size}x{size}" + (" (default size)" if size == 224 else ""), path))
        models += [(Path(m).name, m) for m in args.model]
        for label, path in models:
            for samples in args.samples:
                lines += bench_one(label, path, samples, args, work)
        if args.splits:
            for _, path in models:
                lines += bench_splits(path, args.splits, args, work)
    lines.append(f"\nload average at end {bc.loadavg()}; histocal {histocal.__version__}")
    write_report(lines, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python3
"""What each collection schedule must cost at least, from the measured cost of its parts.

``bench_floor.py`` times every mode against the floor B = max(W, (C + R) / n). This benchmark
says how close to B each schedule can get on this machine and model, whatever the scheduling:
it measures, in one process over the same feeds (medians over ``--repeat`` rounds),

* W, C, R, B as bench_floor.py does (its ``Floor``);
* S: the CPU seconds of histocal's streaming collect (scan and streaming histogram, Rust, every
  pool thread) over each sample's outputs right after ORT produced them;
* P: the same for exact mode's first pass (the scan, feeding the streaming histogram too), and
  the scan alone;
* X: the CPU seconds of exact mode's count (ORT's histograms, planned from the scans) over every
  sample's outputs kept in memory;
* K: the extra wall seconds of an inference pass that keeps every output (a fresh session, so
  its allocator takes fresh memory, as in a calibration), over W: what holding the outputs
  costs (the kernel faulting in and zeroing the pages).

and prints the lower bound of each schedule with the work it does, all cores busy and every
overlap perfect:

* streaming: max(W, (C + S) / n);
* exact in one pass: max(W, (C + P) / n) + K + X / n (the count needs the final ranges, so it
  follows the pass; the outputs must be held until then);
* the same without the streaming histogram: P replaced by the scan alone;
* exact in two passes: max(W, (C + P) / n) + max(W, (C + X) / n).

and, for MinMax (ORT's in-graph ReduceMin/ReduceMax, which histocal keeps), the inference pass
of MinMax's own augmented model (the reductions fetched, outputs dropped), W_minmax, next to
histocal's and onnxruntime's MinMax ``collect_data`` + ``compute_data`` on the same feeds.

Usage:
    python3 benches/bench_bounds.py                       # CNN 224x224, 64 samples
    python3 benches/bench_bounds.py --size 640 --samples 32 --repeat 1
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
from pathlib import Path
from typing import Any

import bench_calibrate as bc
import bench_floor as bf
from support.floor_rounds import command_lines, write_report


def items_of(names: list[str], outputs: list[Any]) -> list[tuple[str, list[Any]]]:
    return [(name, [a]) for name, a in zip(names, outputs)]


def collect_cpu(sess: Any, names: list[str], feeds: list[dict], work: Any) -> float:
    """Process CPU seconds of ``work(items)`` summed over the samples (inference not counted)."""
    total = 0.0
    for feed in feeds:
        items = items_of(names, sess.run(names, feed))
        c0 = bf.cpu_seconds()
        work(items)
        total += bf.cpu_seconds() - c0
        del items
    return total


def measure_parts(aug: str, feeds: list[dict], floor: bf.Floor, bins: int, w_sleep: float) -> dict[str, float]:
    from histocal import _core

    sess, names = floor.sessions[False], floor.names
    parts: dict[str, float] = {}
    stream = _core.StreamHistograms(bins)
    parts["S"] = collect_cpu(sess, names, feeds, stream.collect)
    scans = _core.Histograms("value", 2048)
    parts["scan"] = collect_cpu(sess, names, feeds, lambda items: scans.scan(items, None))
    first = _core.Histograms("value", 2048)
    fed = _core.StreamHistograms(bins)
    parts["P"] = collect_cpu(sess, names, feeds, lambda items: first.scan(items, fed))
    # K: a fresh session keeps every output, as a one-pass exact calibration (or ORT's) does.
    fresh = bf.floor_session(aug, False)
    fresh.run(names, feeds[0])
    gc.collect()
    t0 = time.perf_counter()
    kept = [fresh.run(names, feed) for feed in feeds]
    parts["K"] = max(0.0, time.perf_counter() - t0 - w_sleep)  # the same pass, its outputs dropped
    first.plan()
    by_tensor = [(name, [out[i] for out in kept]) for i, name in enumerate(names)]
    c0 = bf.cpu_seconds()
    first.count(by_tensor)
    parts["X"] = bf.cpu_seconds() - c0
    del by_tensor, kept, fresh
    gc.collect()
    return parts


def minmax_parts(model: str, work: Path, feeds: list[dict]) -> dict[str, float]:
    """W_minmax, and histocal's and ORT's MinMax calibration (calibrator made beforehand)."""
    from onnxruntime.quantization import calibrate as ort_calibrate
    from onnxruntime.quantization.calibrate import CalibrationMethod

    import histocal

    aug = str(work / "minmax.onnx")
    histocal.create_calibrator(model, augmented_model_path=aug, calibrate_method=CalibrationMethod.MinMax)
    sess = bf.floor_session(aug, False)
    names = [o.name for o in sess.get_outputs()]
    sess.run(names, feeds[0])
    out = {"W_minmax": bf.inference_pass(sess, names, feeds)[0]}
    for key, create in (
        ("histocal MinMax", histocal.create_calibrator),
        ("ORT MinMax", ort_calibrate.create_calibrator),
    ):
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):  # ORT print()s
            cal = create(model, augmented_model_path=str(work / "mm.onnx"), calibrate_method=CalibrationMethod.MinMax)
            gc.collect()
            t0 = time.perf_counter()
            cal.collect_data(bf.ListReader(feeds))
            cal.compute_data()
            out[key] = time.perf_counter() - t0
        del cal
    return out


def bounds(f: dict[str, float], n: int) -> dict[str, float]:
    w, c = f["W"], f["C"]
    return {
        "streaming": max(w, (c + f["S"]) / n),
        "exact, one pass": max(w, (c + f["P"]) / n) + f["K"] + f["X"] / n,
        "exact, one pass, no streaming histogram": max(w, (c + f["scan"]) / n) + f["K"] + f["X"] / n,
        "exact, two passes": max(w, (c + f["P"]) / n) + max(w, (c + f["X"]) / n),
    }


TARGETS = {"streaming": 1.2, "exact, one pass": 1.4, "exact, one pass, no streaming histogram": 1.4}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=224, help="CNN input size (default 224)")
    ap.add_argument("--samples", type=int, default=64, help="samples (default 64)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported (default 3)")
    ap.add_argument("--model", help="an ONNX model instead of the CNN")
    ap.add_argument("--dim", type=int, default=1, help="value for symbolic input dims (default 1)")
    ap.add_argument("--out", help="write the markdown table to this file")
    args = ap.parse_args(argv)
    args.shape = []

    import onnx
    from onnxruntime.quantization.calibrate import CalibrationMethod

    import histocal
    from histocal.calibrators.cores import usable_cpus

    n = usable_cpus()
    with tempfile.TemporaryDirectory(prefix="bench_bounds.") as tmp:
        model = args.model or str(Path(tmp, "cnn.onnx"))
        if not args.model:
            onnx.save(bc.build_cnn(args.size, (5, 8, 14, 6), 32, 0), model)
        label = Path(args.model).name if args.model else f"CNN {args.size}x{args.size}"
        feeds = bf.make_feeds(model, args.samples, args)
        aug = str(Path(tmp, "aug.onnx"))
        cal = histocal.create_calibrator(model, augmented_model_path=aug, calibrate_method=CalibrationMethod.Entropy)
        bins = int(cal.streaming_bins)
        del cal
        floor = bf.Floor(aug, feeds)
        rounds = []
        for _ in range(args.repeat):
            f = floor.measure(n)
            f.update(measure_parts(aug, feeds, floor, bins, f["W_sleep"]))
            f.update(minmax_parts(model, Path(tmp), feeds))
            rounds.append(f)
        f = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    lb = bounds(f, n)
    lines = [
        *command_lines("benches/bench_bounds.py", argv),
        *[f"- {m}" for m in bc.machine_info()],
        f"- {label}, {args.samples} samples, {floor.outputs} outputs, {floor.values * 4 / 1e6:.0f} MB per sample; "
        f"usable CPUs {n}; medians of {args.repeat} rounds; load average at end {bc.loadavg()}",
        "",
        "| part | seconds | ns per value |",
        "|---|---:|---:|",
    ]
    values = floor.values * args.samples
    for key, what in (
        ("W", "W: inference pass, wall"),
        ("C", "C: its CPU"),
        ("R", "R: numpy max over every output, CPU"),
        ("B", "B = max(W, (C + R) / n)"),
        ("S", "S: streaming collect, CPU"),
        ("P", "P: exact pass 1 (scan + streaming histogram), CPU"),
        ("scan", "scan alone, CPU"),
        ("X", "X: exact count from memory, CPU"),
        ("K", "K: holding every output (extra wall of a pass that keeps them)"),
    ):
        lines.append(f"| {what} | {f[key]:.3f} | {f[key] / values * 1e9:.2f} |")
    lines += ["", "| schedule | lower bound | x B | target |", "|---|---:|---:|---:|"]
    for name, seconds in lb.items():
        target = TARGETS.get(name)
        lines.append(
            f"| {name} | {seconds:.3f} s | **{seconds / f['B']:.2f}** | {'' if target is None else f'{target:.1f}'} |"
        )
    lines += [
        "",
        f"MinMax: W_minmax (its augmented model's pass) {f['W_minmax']:.3f} s = {f['W_minmax'] / f['W']:.2f} W; "
        f"histocal MinMax {f['histocal MinMax']:.3f} s = {f['histocal MinMax'] / f['W']:.2f} W "
        f"({f['histocal MinMax'] / f['W_minmax']:.2f} W_minmax); onnxruntime MinMax {f['ORT MinMax']:.3f} s = "
        f"{f['ORT MinMax'] / f['W']:.2f} W ({f['ORT MinMax'] / f['W_minmax']:.2f} W_minmax); target 1.1 W",
    ]
    write_report(lines, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python3
"""Where streaming calibration's time beyond inference comes from: CPU budgets, measured apart.

Streaming collection runs the Rust work on batch n while onnxruntime infers batch n+1. On a
machine whose cores ORT already keeps busy, that work can only hide in the CPU time ORT leaves
idle; the rest lengthens the run. This benchmark measures both sides separately, in one process,
on the built-in CNN of ``bench_calibrate.py`` (or ``--model``):

* ORT: the augmented model's inference per sample (wall, and process CPU from ``getrusage``),
  with the session histocal's histogram calibrators use (optimizations off, intra-op threads
  not spinning) and with ORT's calibrators' session (spinning);
* Rust: ``StreamHistograms.collect`` on the saved outputs of a few samples (wall and CPU per
  sample, 1 thread and all threads), default 16384 streaming bins;
* streaming ``collect_data`` as a whole with histocal's session and with a spinning one;

and derives the least time beyond inference any schedule could reach: per sample, a run can
beat neither its session's own inference nor all the CPU work (ORT's plus the Rust work's)
spread over every core; that bound is compared with the inference of ORT's calibrators' session
(the benchmarks' baseline). Medians over ``--repeat`` passes.

Usage:
    python3 benches/bench_overlap.py                  # built-in CNN, 8 samples
    python3 benches/bench_overlap.py --model m.onnx --samples 16 --out RESULTS_overlap.md
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_calibrate as bc
from support.floor_rounds import command_lines, write_report


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def timed(fn: Any) -> tuple[float, float]:
    """(wall, process CPU) seconds of fn()."""
    c0, t0 = cpu_seconds(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, cpu_seconds() - c0


def run_dropping(sess: Any, names: list[str], feeds: list[dict]) -> None:
    for feed in feeds:
        out = sess.run(names, feed)
        del out


def session(path: str, spinning: bool) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


def augmented(model: str, workdir: Path) -> str:
    from onnxruntime.quantization import CalibrationMethod

    import histocal

    path = str(workdir / "augmented.onnx")
    histocal.create_calibrator(model, augmented_model_path=path, calibrate_method=CalibrationMethod.Entropy)
    return path


def collect_ab(model: str, work: Path, feeds: list[dict], repeat: int) -> dict[bool, float]:
    """Streaming Entropy collect_data over the feeds, seconds (median), with histocal's session
    (threads sleeping) and with the same calibrator on a spinning session, alternating."""
    from onnxruntime.quantization import CalibrationMethod

    import histocal

    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeat):
        for spinning in (False, True):
            cal = histocal.create_calibrator(
                model,
                augmented_model_path=str(work / "ab.onnx"),
                calibrate_method=CalibrationMethod.Entropy,
                extra_options={"CollectionMode": "streaming"},
            )
            if spinning:
                cal.infer_session = session(cal.augmented_model_path, True)
            t0 = time.perf_counter()
            cal.collect_data(feeds)
            times[spinning].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="an ONNX model (default: bench_calibrate.py's built-in CNN)")
    ap.add_argument("--dim", type=int, default=1, help="value for symbolic input dims (default 1)")
    ap.add_argument("--samples", type=int, default=8, help="inference samples per pass (default 8)")
    ap.add_argument("--saved", type=int, default=4, help="samples whose outputs the Rust passes reuse (default 4)")
    ap.add_argument("--repeat", type=int, default=5, help="passes per measurement; medians are reported (default 5)")
    ap.add_argument("--out", help="write the markdown report to this file")
    args = ap.parse_args(argv)

    import onnx

    import histocal
    from histocal import _core
    from histocal.calibrators.cores import usable_cpus

    with tempfile.TemporaryDirectory(prefix="bench_overlap.") as tmp:
        work = Path(tmp)
        model = args.model
        if model is None:
            model = str(work / "cnn.onnx")
            onnx.save(bc.build_cnn(224, (5, 8, 14, 6), 32, 0), model)
        aug = augmented(model, work)
        reader = bc.SyntheticReader(bc.input_specs(model, args.dim), args.samples, 0)
        feeds = [reader.sample(i) for i in range(args.samples)]
        cores = usable_cpus()
        rows: list[tuple[str, float, float]] = []  # (what, wall ms per sample, CPU ms per sample)
        ort_wall: dict[bool, float] = {}
        ort_cpu: dict[bool, float] = {}
        for spinning in (False, True):
            sess = session(aug, spinning)
            names = [o.name for o in sess.get_outputs()]
            sess.run(names, feeds[0])  # warm: the first runs fault in ORT's buffers
            # each sample's outputs are dropped before the next runs: keeping them all alive
            # would add their allocation and page faults to the baseline
            passes = [timed(lambda: run_dropping(sess, names, feeds)) for _ in range(args.repeat)]
            ort_wall[spinning] = statistics.median(w for w, _ in passes) / args.samples
            ort_cpu[spinning] = statistics.median(c for _, c in passes) / args.samples
            label = "ORT inference, " + (
                "spinning threads (ORT's calibrators)" if spinning else "non-spinning threads (histocal's)"
            )
            rows.append((label, ort_wall[spinning], ort_cpu[spinning]))
        sess = session(aug, False)
        names = [o.name for o in sess.get_outputs()]
        saved = [[(n, [a]) for n, a in zip(names, sess.run(names, feeds[i % len(feeds)]))] for i in range(args.saved)]
        values = sum(a[0].size for _, a in saved[0])
        rust_wall: dict[int, float] = {}
        rust_cpu: dict[int, float] = {}
        for threads in sorted({1, cores}):
            _core.set_num_threads(threads)
            stream = _core.StreamHistograms(histocal.DEFAULT_STREAMING_BINS)
            for items in saved:
                stream.collect(items)  # levels settle and pages are faulted in: steady state
            passes = [timed(lambda: [stream.collect(items) for items in saved]) for _ in range(args.repeat)]
            rust_wall[threads] = statistics.median(w for w, _ in passes) / args.saved
            rust_cpu[threads] = statistics.median(c for _, c in passes) / args.saved
            rows.append(
                (
                    f"Rust streaming collect, {threads} thread{'s' if threads > 1 else ''}",
                    rust_wall[threads],
                    rust_cpu[threads],
                )
            )
        _core.set_num_threads(0)
        collect = collect_ab(model, work, feeds, args.repeat)

    # Per sample, no schedule beats the session's own inference, nor all the CPU work (ORT's and
    # the Rust work's) spread over every core; the baseline is ORT's calibrators' session.
    rust = rust_cpu[1]
    baseline = ort_wall[True]
    best = {spinning: max(ort_wall[spinning], (ort_cpu[spinning] + rust) / cores) for spinning in (False, True)}
    floor = {spinning: best[spinning] / baseline - 1 for spinning in (False, True)}
    serial = (ort_wall[True] + rust_wall[cores]) / baseline - 1
    lines = [
        "## Streaming collection: CPU budgets of inference and of the Rust work",
        "",
        *command_lines("benches/bench_overlap.py", argv),
        f"- {cores} usable CPUs; onnxruntime threads: default; model: {'built-in CNN (bench_calibrate.py)' if args.model is None else args.model}; "
        f"{len(names)} calibrated outputs, {values / 1e6:.1f}M values ({values * 4 / 1e6:.0f} MB as float32) per sample",
        f"- medians of {args.repeat} passes; inference over {args.samples} samples (after one warm-up run), Rust over the saved outputs of {args.saved}",
        "",
        "| what | wall per sample | CPU per sample | cores busy |",
        "|---|---:|---:|---:|",
        *[f"| {what} | {wall * 1e3:.1f} ms | {cpu * 1e3:.1f} ms | {cpu / wall:.2f} |" for what, wall, cpu in rows],
        "",
        f"- The Rust work needs {rust * 1e3:.1f} ms of CPU per sample (1 thread). Against the inference of ORT's calibrators' "
        f"session ({baseline * 1e3:.1f} ms per sample), the least time beyond inference any overlap could reach is "
        f"max(inference, (ORT CPU + Rust CPU) / {cores} cores) / {baseline * 1e3:.1f} ms - 1: "
        f"**{floor[True] * 100:.0f}%** with ORT's threads spinning, **{floor[False] * 100:.0f}%** with them sleeping "
        f"(spinning CPU counts as busy: an upper bound on what ORT needs); with no overlap at all (Rust after each "
        f"inference, {cores} threads): {serial * 100:.0f}%.",
        f"- Streaming collect_data (Entropy) of the {args.samples} samples, fresh calibrator each time, alternating: "
        f"{collect[False] * 1e3:.0f} ms with histocal's session (threads sleeping), {collect[True] * 1e3:.0f} ms with ORT's "
        f"threads spinning (ratio {collect[False] / collect[True]:.2f}).",
    ]
    write_report(lines, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])

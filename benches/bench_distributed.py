#!/usr/bin/env python3
"""histocal.distributed on this machine: wall time against workers, shard state size, merge cost.

* wall time: ``calibrate_distributed`` over ``--shards`` shards of ``--samples`` samples (one
  sample per batch) with 1..``--max-workers`` workers on a local Ray started once
  (``ray.init(num_cpus=--max-workers)``, its start not timed; the workers' start is, and shown
  apart), and the single-process calibrator on the same data for reference, with histocal's
  default threads and with a worker's one thread; streaming and exact mode (Entropy);
* state size: one shard's state (``CalibrationState.to_bytes``, what a worker sends the driver),
  per calibrated tensor, streaming and exact;
* merge cost: what the driver spends per shard state: reading its bytes (``from_bytes``, checked
  as untrusted) and one ``merge``; median of ``--repeat`` runs, per tensor.

The model is bench_calibrate.py's CNN (203 calibrated tensors at 224x224 by default). Inputs are
synthetic (normal), generated per shard from ``--seed`` by the zero-argument callables the
shards are.

Usage:
    python3 benches/bench_distributed.py                 # 32 samples, 8 shards, 1-2 workers
    python3 benches/bench_distributed.py --quick         # tiny model, a few seconds
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_calibrate import build_cnn


def shard_feeds(seed: int, n: int, size: int, name: str) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{name: rng.normal(0, 1, (1, 3, size, size)).astype(np.float32)} for _ in range(n)]


def median_s(f, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny model, 8 samples")
    ap.add_argument("--samples", type=int, default=None, help="samples (default 32; --quick 8)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--max-workers", type=int, default=2)
    ap.add_argument("--size", type=int, default=None, help="input size (default 224; --quick 32)")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each merge measurement (median)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    samples = args.samples or (8 if args.quick else 32)
    size = args.size or (32 if args.quick else 224)

    import onnx
    import ray

    import histocal
    from histocal import CalibrationState
    from histocal.distributed import calibrate_distributed

    logging.basicConfig(level=logging.WARNING)
    workdir = Path(tempfile.mkdtemp(prefix="histocal_bench_distributed_"))
    model_path = (workdir / "cnn.onnx").as_posix()
    depth, width = ((1, 1, 1, 1), 8) if args.quick else ((5, 8, 14, 6), 32)
    onnx.save(build_cnn(size, depth, width, args.seed), model_path)
    input_name = onnx.load(model_path).graph.input[0].name
    bounds = [samples * k // args.shards for k in range(args.shards + 1)]
    shards = [
        functools.partial(shard_feeds, args.seed + k, bounds[k + 1] - bounds[k], size, input_name)
        for k in range(args.shards)
    ]
    all_feeds = [f for s in shards for f in s()]
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; model {model_path}", file=sys.stderr)

    default_threads = histocal.get_num_threads()
    started: list[float] = []  # when the driver logs that its workers answered

    class WorkersStarted(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "calibration workers started" in record.getMessage():
                started.append(time.perf_counter())

    driver_log = logging.getLogger("histocal.distributed")  # the pool logs it
    driver_log.setLevel(logging.INFO)
    driver_log.addHandler(WorkersStarted())
    driver_log.propagate = False
    rows = []
    states = {}
    for mode in ("streaming", "exact"):
        options = {"CollectionMode": mode}
        for threads in (None, 1):
            cal = histocal.create_calibrator(model_path, calibrate_method="entropy", extra_options=options)
            cal.show_progress = False
            if threads:  # a worker's share: one ORT intra-op thread, one histocal thread
                cal.intra_op_num_threads = threads
                cal.create_inference_session()
                histocal.set_num_threads(threads)
            t = time.perf_counter()
            cal.collect_data(all_feeds)
            single = time.perf_counter() - t
            histocal.set_num_threads(default_threads)
            tensors = len(cal.collection.names)
            rows.append((mode, f"single process, {threads or default_threads} thread(s)", single, None))
        ray.init(num_cpus=args.max_workers, include_dashboard=False, logging_level=logging.WARNING)
        try:
            for workers in range(1, args.max_workers + 1):
                started.clear()
                t = time.perf_counter()
                state = calibrate_distributed(
                    model_path,
                    shards,
                    calibrate_method="entropy",
                    extra_options=options,
                    num_workers=workers,
                    show_progress=False,
                )
                rows.append((mode, f"{workers} worker(s)", time.perf_counter() - t, started[0] - t))
        finally:
            ray.shutdown()
        # one shard's state, as a worker sends it
        one = histocal.create_calibrator(model_path, calibrate_method="entropy", extra_options=options)
        one.show_progress = False
        one.collect_data(shards[0]())
        states[mode] = (one.state.to_bytes(), state.to_bytes(), tensors)

    print(f"\n{samples} samples of 1x3x{size}x{size} in {args.shards} shards, Entropy, {tensors} tensors\n")
    print("| mode | run | wall | of which workers' start |\n|---|---|---:|---:|")
    for mode, run, wall, start in rows:
        print(f"| {mode} | {run} | {wall:.2f} s | {'' if start is None else f'{start:.2f} s'} |")
    print(
        "\n| mode | shard state | per tensor | from_bytes + merge per state | per tensor |\n|---|---:|---:|---:|---:|"
    )
    for mode, (shard_raw, merged_raw, tensors) in states.items():
        merged = CalibrationState.from_bytes(merged_raw)

        def read_and_merge(raw=shard_raw, into=merged):
            into.merge(CalibrationState.from_bytes(raw))

        cost = median_s(read_and_merge, args.repeat)
        print(
            f"| {mode} | {len(shard_raw) / 1e6:.2f} MB | {len(shard_raw) / tensors / 1e3:.1f} kB | "
            f"{cost * 1e3:.0f} ms | {cost / tensors * 1e6:.0f} us |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-channel histograms: collection time and memory per channel, against per-tensor collection.

For each shape (a CNN activation, channels on axis 1; a transformer activation, channels on the last,
strided, axis) synthetic float32 batches are collected into ``ChannelHistograms`` (one streaming
histogram per channel) and, for comparison, into one per-tensor ``_core.StreamHistograms``; then
every per-channel method is computed. Memory: the histograms' bytes (channels x bins x 8) and the
process's resident-set growth while collecting.

    python3 benches/bench_per_channel.py [--streaming-bins 2048] [--batches 8] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from histocal import _core
from histocal.state import CalibrationState
from histocal.state.channels import ChannelHistograms

# (label, batch shape, channel axis)
SHAPES = (
    ("cnn 8x64x56x56, axis 1", (8, 64, 56, 56), 1),
    ("cnn 8x256x14x14, axis 1", (8, 256, 14, 14), 1),
    ("transformer 8x128x768, axis -1", (8, 128, 768), -1),
)
METHODS = ("minmax", "percentile", "entropy", "mse", "kl")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def median_time(f, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streaming-bins", type=int, default=2048)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    print(
        f"streaming_bins={args.streaming_bins}, {args.batches} batches, median of {args.runs} runs, {_core.get_num_threads()} threads"
    )
    print(
        "| tensor | channels | per-tensor collect | per-channel collect | per channel | histograms | RSS growth | methods (per channel) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, shape, axis in SHAPES:
        batches = [rng.standard_normal(shape).astype(np.float32) for _ in range(args.batches)]
        channels = shape[axis]

        def per_tensor() -> None:
            s = _core.StreamHistograms(args.streaming_bins)
            for b in batches:
                s.collect([("t", [b])])

        before = rss()
        holder: list[ChannelHistograms] = []

        def per_channel() -> None:
            ch = ChannelHistograms(args.streaming_bins, axis)
            for b in batches:
                ch.collect([("t", [b])])
            holder[:] = [ch]

        t_tensor = median_time(per_tensor, args.runs)
        t_channel = median_time(per_channel, args.runs)
        grown = rss() - before
        ch = holder[0]
        state = CalibrationState(["t"], "streaming", _core.StreamHistograms(args.streaming_bins), channels=ch)
        state.stream.collect([("t", batches[:1])])
        t_methods = {m: median_time(lambda m=m: state.compute(m), 1) for m in METHODS}
        methods = ", ".join(f"{m} {1e6 * t / channels:.0f} µs" for m, t in t_methods.items())
        print(
            f"| {label} | {channels} | {1e3 * t_tensor:.1f} ms | {1e3 * t_channel:.1f} ms | "
            f"{1e6 * t_channel / channels:.1f} µs | {ch.held_bytes / 2**20:.1f} MiB | {grown / 2**20:.1f} MiB | {methods} |"
        )


if __name__ == "__main__":
    main()

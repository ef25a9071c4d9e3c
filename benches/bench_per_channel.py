"""Per-channel histograms: collection time and memory per channel, against per-tensor collection.

For each shape (a CNN activation, channels on axis 1; a transformer activation, channels on the last,
strided, axis) synthetic float32 batches are collected into ``ChannelHistograms`` (one streaming
histogram per channel) and, for comparison, into one per-tensor ``_core.StreamHistograms``; then
every per-channel method is computed; then isotone per channel on classifier-like outputs (its row
summaries collected beside the per-channel histograms). Memory: the histograms' bytes (channels x bins x 8) and the
process's resident-set growth while collecting.

    python3 benches/bench_per_channel.py [--streaming-bins 2048] [--batches 8] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from histocal import _core
from histocal.state import CalibrationState, Collection
from histocal.state.channels import ChannelHistograms

# (label, batch shape, channel axis)
SHAPES = (
    ("cnn 8x64x56x56, axis 1", (8, 64, 56, 56), 1),
    ("cnn 8x256x14x14, axis 1", (8, 256, 14, 14), 1),
    ("transformer 8x128x768, axis -1", (8, 128, 768), -1),
)
METHODS = ("minmax", "percentile", "entropy", "mse", "kl")
# isotone per channel: (label, batch shape, channel axis); the last axis holds the classes
ISOTONE_SHAPES = (
    ("heads 32x16x1000, axis 1", (32, 16, 1000), 1),
    ("heads 8x12x64x100, axis 1", (8, 12, 64, 100), 1),
)


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
        "| tensor | channels | per-tensor collect | per-channel collect | per channel and batch | histograms | RSS growth | methods (per channel) |"
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
        state = CalibrationState(
            Collection("streaming", _core.StreamHistograms(args.streaming_bins), channels=ch, only=("t",))
        )
        state.stream.collect([("t", batches[:1])])
        t_methods = {m: median_time(lambda m=m: state.compute(m), 1) for m in METHODS}
        methods = ", ".join(f"{m} {1e6 * t / channels:.0f} µs" for m, t in t_methods.items())
        print(
            f"| {label} | {channels} | {1e3 * t_tensor:.1f} ms | {1e3 * t_channel:.1f} ms | "
            f"{1e6 * t_channel / channels / args.batches:.1f} µs | {ch.held_bytes / 2**20:.1f} MiB | {grown / 2**20:.1f} MiB | {methods} |"
        )

    # Many channels in one collection: the per-channel cost must not grow with the channels already held.
    print()
    print(
        "| tensors x channels (1x16x768 each, axis -1) | held | collect per batch | per channel-batch | percentile per channel | save | load |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in (10, 50):
        xs = [rng.standard_normal((1, 16, 768)).astype(np.float32) for _ in range(n)]
        ch = ChannelHistograms(256, -1)
        ch.collect([(f"t{i}", [x]) for i, x in enumerate(xs)])
        t_batch = median_time(lambda: ch.collect([(f"t{i}", [x]) for i, x in enumerate(xs)]), args.runs)
        names = [f"t{i}" for i in range(n)]
        state = CalibrationState(Collection("streaming", _core.StreamHistograms(256), channels=ch, only=tuple(names)))
        state.stream.collect([(name, [x]) for name, x in zip(names, xs)])
        t_pct = median_time(lambda: state.compute("percentile"), 1)
        raw = state.to_bytes()
        t_save = median_time(state.to_bytes, 1)
        t_load = median_time(lambda: CalibrationState.from_bytes(raw), 1)
        k = n * 768
        print(
            f"| {n} x 768 = {k} | {ch.held_bytes / 2**20:.0f} MiB | {1e3 * t_batch:.0f} ms | {1e6 * t_batch / k:.1f} µs | "
            f"{1e6 * t_pct / k:.0f} µs | {t_save:.2f} s | {t_load:.2f} s |"
        )

    # isotone per channel: its row summaries collected beside the per-channel histograms.
    print()
    print(
        "| isotone tensor | channels | rows per channel | per-channel collect | with isotone | summaries | isotone (per channel) |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, shape, axis in ISOTONE_SHAPES:
        batches = [rng.standard_normal(shape).astype(np.float32) for _ in range(args.batches)]
        channels = shape[axis]
        held: list[ChannelHistograms] = []

        def collect(isotone: bool) -> None:
            ch = ChannelHistograms(args.streaming_bins, axis, isotone=isotone)
            for b in batches:
                ch.collect([("t", [b])])
            held[:] = [ch]

        t_plain = median_time(lambda: collect(False), args.runs)
        t_isotone = median_time(lambda: collect(True), args.runs)
        ch = held[0]
        pairs = ch.stream.summary_bytes("isotone") // 24  # 24 bytes a distinct pair
        state = CalibrationState(
            Collection("streaming", _core.StreamHistograms(args.streaming_bins), channels=ch, only=("t",))
        )
        state.stream.collect([("t", batches[:1])])
        t_choose = median_time(lambda: state.compute("isotone"), args.runs)
        rows = args.batches * int(np.prod(shape)) // channels // shape[-1]
        print(
            f"| {label} | {channels} | {rows} | {1e3 * t_plain:.1f} ms | {1e3 * t_isotone:.1f} ms | "
            f"{pairs} pairs, {24 * pairs / 2**20:.2f} MiB | {1e6 * t_choose / channels:.0f} µs |"
        )


if __name__ == "__main__":
    main()

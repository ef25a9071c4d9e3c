#!/usr/bin/env python3
"""Per-channel collection time against per-tensor collection time on the same batches, in one process.

For each shape, one batch at a time goes into a per-tensor ``_core.StreamHistograms`` and into a
``ChannelHistograms`` (one streaming histogram per channel); the two are timed in turn, round after
round, and the table gives the medians and their ratio. Single collection thread by default
(``--threads``), so that the ratio is per CPU.

    python3 benches/bench_channel_ratio.py [--streaming-bins 16384] [--batches 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from histocal import _core
from histocal.state.channels import ChannelHistograms

SHAPES = (
    ("cnn 8x64x56x56, axis 1", (8, 64, 56, 56), 1),
    ("cnn 8x256x14x14, axis 1", (8, 256, 14, 14), 1),
    ("cnn 1x32x160x160, axis 1", (1, 32, 160, 160), 1),
    ("transformer 8x128x768, axis -1", (8, 128, 768), -1),
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streaming-bins", type=int, default=16384)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    _core.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"streaming_bins={args.streaming_bins}, {args.batches} batches, median of {args.rounds} rounds, "
          f"{_core.get_num_threads()} threads")  # fmt: skip
    print("| tensor | channels | per-tensor collect | per-channel collect | ratio |")
    print("|---|---|---|---|---|")
    for label, shape, axis in SHAPES:
        batches = [rng.standard_normal(shape).astype(np.float32) for _ in range(args.batches)]

        def per_tensor() -> None:
            s = _core.StreamHistograms(args.streaming_bins)
            for b in batches:
                s.collect([("t", [b])])

        def per_channel() -> None:
            ch = ChannelHistograms(args.streaming_bins, axis)
            for b in batches:
                ch.collect([("t", [b])])

        times: dict[str, list[float]] = {"tensor": [], "channel": []}
        for _ in range(args.rounds):
            for key, f in (("tensor", per_tensor), ("channel", per_channel)):
                t = time.process_time()
                f()
                times[key].append(time.process_time() - t)
        t_tensor, t_channel = (statistics.median(times[k]) for k in ("tensor", "channel"))
        print(f"| {label} | {shape[axis]} | {1e3 * t_tensor:.1f} ms | {1e3 * t_channel:.1f} ms | "
              f"{t_channel / t_tensor:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()

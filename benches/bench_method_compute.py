"""Time to compute histocal's methods for every tensor of a large state, and the cost of
collecting pow2 MostCommon's per-batch votes.

    python3 benches/bench_method_compute.py

* 700 tensors of a 16384-bin streaming histogram (20k float32 values each: normal at random
  scales, Relu-like, one outlier): ``StreamHistograms.ranges`` for mse (asymmetric and
  symmetric int8), kl (2048/128), pow2 MinMSE (int8, int16) and ``qerrors`` (auto's scoring);
  median of 5 runs each.
* collection of 200 tensors x 8 batches x 50k float32 values with and without
  ``pow2_votes=True``; median of 7 runs.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from histocal import _core
from histocal.methods.scale_rule import SCALE_RULE


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def method_times(tensors: int = 700, values: int = 20_000) -> list[str]:
    rng = np.random.default_rng(0)
    stream = _core.StreamHistograms(16384)
    items = []
    for t in range(tensors):
        x = rng.normal(scale=10 ** rng.uniform(-2, 2), size=values).astype(np.float32)
        if t % 3 == 1:
            x = np.maximum(x, 0)
        elif t % 3 == 2:
            x[rng.integers(x.size)] *= 50
        items.append((f"t{t}", [x]))
    stream.collect(items)
    names = stream.names()
    mse = stream.ranges("mse", scale_rule=SCALE_RULE)
    rows = []
    for label, method, options in [
        ("mse, asymmetric int8", "mse", {}),
        ("mse, symmetric int8", "mse", {"symmetric": True}),
        ("kl, 2048/128", "kl", {}),
        ("pow2 MinMSE, int8", "pow2", {}),
        ("pow2 MinMSE, int16", "pow2", {"qtype": "int16"}),
    ]:
        rows.append(
            f"| {label} | {median_time(lambda: stream.ranges(method, scale_rule=SCALE_RULE, **options), 5):.3f} |"
        )
    rows.append(
        f"| qerrors of {tensors} ranges | {median_time(lambda: stream.qerrors(names, mse, scale_rule=SCALE_RULE), 5):.3f} |"
    )
    return rows


def votes_cost(tensors: int = 200, batches_count: int = 8) -> str:
    rng = np.random.default_rng(1)
    batches = [
        [(f"t{i}", [rng.normal(0, 1 + i % 7, 50_000).astype(np.float32)]) for i in range(tensors)]
        for _ in range(batches_count)
    ]

    def collect(votes: bool) -> None:
        stream = _core.StreamHistograms(16384, summaries=["pow2_votes"] if votes else [])
        for b in batches:
            stream.collect(b)

    plain, voting = median_time(lambda: collect(False), 7), median_time(lambda: collect(True), 7)
    return (
        f"collection without votes {plain * 1e3:.0f} ms, with pow2 votes {voting * 1e3:.0f} ms ({voting / plain:.2f}x)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--smoke", action="store_true", help="20 tensors, 2 batches: the code paths in seconds (tests' benches smoke)"
    )
    smoke = ap.parse_args().smoke
    tensors = 20 if smoke else 700
    out = sys.stdout
    out.write(f"threads: {_core.get_num_threads()}\n\n| {tensors} tensors, 16384 bins | median (s) |\n|---|---:|\n")
    out.write("\n".join(method_times(tensors, 2_000 if smoke else 20_000)) + "\n\n")
    out.write((votes_cost(20, 2) if smoke else votes_cost()) + "\n")


if __name__ == "__main__":
    main()

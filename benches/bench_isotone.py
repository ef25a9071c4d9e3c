"""Cost of collecting isotone's per-row top-two summaries beside the streaming histogram, their
size, and the time to choose the scale.

    python3 benches/bench_isotone.py [--out benches/RESULTS_isotone.md]

* classifier logits: 40 batches of float32 ``[256, 1000]`` (10,240 rows, 10.2M values), collected
  with ``StreamHistograms(16384)`` and with ``isotone=True``; median of 5 runs;
* a dense activation (what isotone sees when every tensor of a CNN is calibrated with it): 8 batches
  of float32 ``[8, 64, 56, 56]`` (229,376 rows of 56), same comparison, median of 3 runs;
* ``summary_ranges("isotone")`` (int8, asymmetric) on each summary; median of 5 runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

from histocal import _core


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def case(label: str, batches: list[np.ndarray], repeat: int) -> str:
    def collect(isotone: bool):
        s = _core.StreamHistograms(16384, summaries=["isotone"] if isotone else [])
        for b in batches:
            s.collect([("t", [b])])
        return s

    plain = median_time(lambda: collect(False), repeat)
    with_tops = median_time(lambda: collect(True), repeat)
    s = collect(True)
    pairs = s.export_summary("t", "isotone")
    choose = median_time(lambda: s.summary_ranges("isotone", qtype="int8"), 5)
    rows = int(pairs["rows"].sum())
    return (
        f"| {label} | {rows:,} | {len(pairs['l1']):,} | {24 * len(pairs['l1']) / 2**20:.2f} | {plain:.3f} | "
        f"{with_tops:.3f} | {choose * 1e3:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--smoke", action="store_true", help="tiny tensors, one run: the code paths in seconds")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n_logits, logit_shape, n_dense, dense_shape = (
        (2, (16, 100), 1, (2, 4, 8, 8)) if args.smoke else (40, (256, 1000), 8, (8, 64, 56, 56))
    )
    logits = [rng.normal(0, 3, logit_shape).astype(np.float32) for _ in range(n_logits)]
    dense = [np.maximum(rng.normal(0, 1, dense_shape), 0).astype(np.float32) for _ in range(n_dense)]
    lines = [
        "## isotone: collection cost and summary size",
        "",
        "Command (from the repository root):",
        "",
        "```",
        "python3 benches/bench_isotone.py --out benches/RESULTS_isotone.md",
        "```",
        "",
        f"- {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs; Python "
        f"{platform.python_version()}, numpy {np.__version__}, histocal threads {_core.get_num_threads()}",
        "- collect: one `StreamHistograms(16384)` fed batch by batch, without and with `isotone=True` "
        '(median wall time); choose: `summary_ranges("isotone", qtype="int8")` (median)',
        "",
        "| data | rows | distinct pairs | summary (MiB) | collect (s) | collect with isotone (s) | choose (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        case(f"logits, {n_logits} x {list(logit_shape)} float32", logits, 1 if args.smoke else 5),
        case(f"dense activation, {n_dense} x {list(dense_shape)} float32 (Relu)", dense, 1 if args.smoke else 3),
    ]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""histocal.quark's power-of-two MinMSE: time and peak memory against Quark's way of computing it.

Quark's ``PowOfTwoCalibrater`` keeps every batch's outputs and runs its MinMSE on all of them
concatenated. histocal.quark's ``PowOfTwoCollector`` takes the batches one at a time: mode All
(symmetric int8/int16) keeps a few error sums per tensor, MostCommon one vote per batch. This
script feeds both the same batches of one tensor (normal values, a few outliers) and reports the
wall time and the peak of Python-tracked memory (tracemalloc: numpy's buffers included) above
what the batches themselves need while being generated. "Quark's way" is Quark's arithmetic
(``histocal.quark.pof2.min_mse``, the transcription tested against a numpy reference of Quark's
code) on the kept, concatenated batches: Quark itself is not needed. Both must give the same
range; the script checks it.

Usage:
    python3 benches/bench_quark.py                        # 32 batches of 8x64x32x32 float32
    python3 benches/bench_quark.py --batches 8 --shape 2x16x16x16   # quick
    python3 benches/bench_quark.py --out benches/RESULTS_quark.md
"""

from __future__ import annotations

import argparse
import platform
import time
import tracemalloc
from collections.abc import Callable, Iterator

import numpy as np

from histocal import __version__
from histocal.quark import PowOfTwoCollector
from histocal.quark.pof2 import min_mse, value_range


def batches(n: int, shape: tuple[int, ...], seed: int) -> Iterator[np.ndarray]:
    rng = np.random.default_rng(seed)
    for _ in range(n):
        x = rng.normal(0, 1, shape).astype(np.float32)
        x.flat[rng.integers(0, x.size, 4)] *= 20  # a few outliers
        yield x


def measure(fn: Callable[[], object]) -> tuple[object, float, int]:
    tracemalloc.start()
    tracemalloc.reset_peak()
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return result, seconds, peak


def histocal_way(args: argparse.Namespace, qtype: str, mode: str) -> object:
    c = PowOfTwoCollector(activation_type={"int8": "QInt8", "int16": "QInt16"}[qtype], minmse_mode=mode, num_bins=0)
    for x in batches(args.batches, args.shape, args.seed):
        c.collect({"t": [x]})
    return c.compute_collection_result()["t"]


def quark_way(args: argparse.Namespace, qtype: str) -> object:
    kept = list(batches(args.batches, args.shape, args.seed))  # Quark keeps every batch's outputs
    x = np.array(kept).flatten()
    pos, zero_point = min_mse(x, qtype, True)
    return value_range(pos, zero_point, qtype, True, x.dtype)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=32)
    p.add_argument("--shape", default="8x64x32x32", help="one batch's shape, e.g. 8x64x32x32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the results (markdown) here")
    args = p.parse_args()
    args.shape = tuple(int(d) for d in args.shape.split("x"))
    values = int(np.prod(args.shape))
    batch_mib = values * 4 / 2**20
    lines = [
        "## histocal.quark: power-of-two MinMSE, time and peak memory",
        "",
        "Command (from the repository root):",
        "",
        "```",
        f"python3 benches/bench_quark.py --batches {args.batches} --shape {'x'.join(map(str, args.shape))}",
        "```",
        "",
        f"- {platform.processor() or platform.machine()}; Python {platform.python_version()}, "
        f"numpy {np.__version__}, histocal {__version__}",
        f"- one float32 tensor, {args.batches} batches of {args.shape} ({batch_mib:.1f} MiB each, "
        f"{args.batches * batch_mib:.0f} MiB in all); peak = tracemalloc's peak during the run",
        "",
        "| qtype | mode | way | time (s) | peak memory (MiB) | same range |",
        "|---|---|---|---:|---:|---|",
    ]
    for qtype in ("int8", "int16"):
        ref, t_ref, m_ref = measure(lambda q=qtype: quark_way(args, q))
        ours, t_ours, m_ours = measure(lambda q=qtype: histocal_way(args, q, "All"))
        same = all(np.array_equal(a, b) for a, b in zip(ours, ref))  # type: ignore[call-overload]
        lines.append(f"| {qtype} | All | Quark's (keep all, then MinMSE) | {t_ref:.2f} | {m_ref / 2**20:.1f} | |")
        lines.append(f"| {qtype} | All | histocal.quark (per batch) | {t_ours:.2f} | {m_ours / 2**20:.1f} | {same} |")
        _, t_mc, m_mc = measure(lambda q=qtype: histocal_way(args, q, "MostCommon"))
        lines.append(f"| {qtype} | MostCommon | histocal.quark (per batch) | {t_mc:.2f} | {m_mc / 2**20:.1f} | |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()

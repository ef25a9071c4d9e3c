"""How does histocal compare with peer calibration libraries?

AMD Quark's power-of-two MinMSE (``PowOfTwoCalibrater``) keeps every batch's outputs and runs its
MinMSE on them concatenated; ``histocal.quark``'s ``PowOfTwoCollector`` takes the batches one at a
time (mode All: a few error sums per tensor). Both are fed the same batches of one tensor (normal
values, a few outliers) and interleaved; "Quark's way" is Quark's arithmetic
(``histocal.quark.pof2.min_mse``, the transcription tested against a numpy reference of Quark's
code) on the kept, concatenated batches, so Quark itself is not needed. Peak memory: tracemalloc's
peak (numpy's buffers included) above the batches being generated. Quark itself, side by side,
needs amd-quark and torch, which are not installed here (benches/NOTES.md: its last results).
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from benches.support.harness import Run, interleave, timed
from benches.support.report import fmt, table

TITLE = "Peers: Quark's power-of-two MinMSE"
QUESTION = (
    "What do time and memory of Quark's power-of-two MinMSE (every batch kept) become when histocal.quark "
    "computes the same ranges one batch at a time?"
)
SIZES = {
    "smoke": {"batches": 2, "shape": [2, 4, 8, 8], "repeat": 1},
    "quick": {"batches": 32, "shape": [8, 64, 32, 32], "repeat": 3},
    "full": {"batches": 64, "shape": [8, 64, 32, 32], "repeat": 5},
}


def batches(n: int, shape: list[int], seed: int = 0) -> Iterator[np.ndarray]:
    rng = np.random.default_rng(seed)
    for _ in range(n):
        x = rng.normal(0, 1, shape).astype(np.float32)
        x.flat[rng.integers(0, x.size, 4)] *= 20  # a few outliers
        yield x


def histocal_way(settings: dict[str, Any], qtype: str) -> Any:
    from histocal.quark import PowOfTwoCollector

    c = PowOfTwoCollector(activation_type={"int8": "QInt8", "int16": "QInt16"}[qtype], minmse_mode="All", num_bins=0)
    for x in batches(settings["batches"], settings["shape"]):
        c.collect({"t": [x]})
    return c.compute_collection_result()["t"]


def quark_way(settings: dict[str, Any], qtype: str) -> Any:
    from histocal.quark.pof2 import min_mse, value_range

    x = np.array(list(batches(settings["batches"], settings["shape"]))).flatten()  # Quark keeps every batch
    pos, zero_point = min_mse(x, qtype, True)
    return value_range(pos, zero_point, qtype, True, x.dtype)


def peak_mib(fn: Callable[[], Any]) -> tuple[Any, float]:
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def run(run: Run, settings: dict[str, Any]) -> None:
    for qtype in ("int8", "int16"):
        ways = {"Quark's way (keep every batch)": quark_way, "histocal.quark (per batch)": histocal_way}
        rounds = interleave(
            {k: (lambda f=f: timed(lambda: f(settings, qtype))) for k, f in ways.items()}, settings["repeat"], 0
        )
        results = {k: peak_mib(lambda f=f: f(settings, qtype)) for k, f in ways.items()}
        ref = results["Quark's way (keep every batch)"][0]
        case = {
            "qtype": qtype,
            "mode": "All",
            "batches": settings["batches"],
            "shape": "x".join(map(str, settings["shape"])),
        }
        for k in ways:
            same = all(np.array_equal(a, b) for a, b in zip(results[k][0], ref))
            run.add(k, case, median_s=rounds.median(k), peak_mib=round(results[k][1], 1), same_range=same,
                    x_quark=rounds.ratio(k, "Quark's way (keep every batch)"))  # fmt: skip


def section(result: dict[str, Any]) -> list[str]:
    case = result["records"][0]["case"]
    rows = [[r["case"]["qtype"], r["subject"], f"{r['median_s']:.2f} s", f"{fmt(r['peak_mib'])} MiB", r["same_range"]]
            for r in result["records"]]  # fmt: skip
    return [
        f"One float32 tensor, {case['batches']} batches of {case['shape']}, MinMSE mode All.",
        "",
        *table(["qtype", "way", "time", "peak memory", "same range"], rows, "llrrl"),
    ]


def summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    ours = [r for r in result["records"] if r["subject"].startswith("histocal")]
    theirs = [r for r in result["records"] if not r["subject"].startswith("histocal")]
    return [
        (
            "Quark's power-of-two MinMSE, int8 / int16",
            f"{' / '.join(fmt(r['peak_mib']) for r in ours)} MiB, {' / '.join(fmt(r['x_quark']) for r in ours)}x the "
            f"time; Quark's way {' / '.join(fmt(r['peak_mib']) for r in theirs)} MiB; same ranges: "
            f"{all(r['same_range'] for r in ours)}",
        )
    ]

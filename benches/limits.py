"""How do searches and long streams stay bounded on hostile inputs?

* the entropy search's cost per bin evaluation, histocal against onnxruntime's collector on the
  same histogram (interleaved), and histocal alone at bin counts onnxruntime would take hours on;
* a float16 tensor with an outlier (a histogram of millions of bins): how soon it is refused by
  the work limit (``HISTOCAL_MAX_SEARCH_WORK``) rather than searched;
* peak memory over a long stream of tiny batches (a fresh process per point): flat in the number
  of batches, in exact mode (two passes, budget 0) and in streaming mode.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benches.support.harness import Run, interleave, isolated, peak_rss
from benches.support.report import fmt, table

TITLE = "Hostile inputs: search time and long streams"
QUESTION = (
    "How fast is the entropy search per bin evaluation, how soon is a search too large to finish refused, and does "
    "memory stay flat over a long stream of batches?"
)
SIZES = {
    "smoke": {"shared_bins": 2048, "large_bins": [4096], "repeat": 1, "tensors": 4, "batches": [10, 100]},
    "quick": {
        "shared_bins": 5000,
        "large_bins": [47536, 144456],
        "repeat": 3,
        "tensors": 100,
        "batches": [1000, 10000],
    },
    "full": {
        "shared_bins": 20000,
        "large_bins": [47536, 144456, 346000],
        "repeat": 3,
        "tensors": 100,
        "batches": [1000, 10000, 100000],
    },
}


def entropy_work(bins: int, quantized: int = 128) -> int:
    """Bin evaluations of the entropy search over ``bins`` bins (each threshold's KL over its bins)."""
    zero_bin, half = bins // 2, quantized // 2
    return (zero_bin + 1) ** 2 - half**2 - (bins % 2 == 0)


def search_seconds(collector_class: Any, bins: int, data: np.ndarray) -> float:
    collector = collector_class("entropy", False, bins, 128, 99.999, "same")
    collector.collect({"x": [data]})
    start = time.perf_counter()
    collector.compute_collection_result()
    return time.perf_counter() - start


def long_stream(model: str, mode: str, batches: int) -> dict[str, float]:
    """In a fresh process: one collect_data over ``batches`` 1x4 feeds."""
    import histocal

    feed = {"X": np.ones((1, 4), np.float32)}
    cal = histocal.PercentileCalibrater(model, mode=mode, show_progress=False, memory_budget=0)
    cal.augment_graph()
    cal.create_inference_session()
    with peak_rss() as memory:
        start = time.perf_counter()
        cal.collect_data(lambda: (feed for _ in range(batches)))
        seconds = time.perf_counter() - start
    return {**memory, "seconds": seconds}


def chain_model(path: Path, tensors: int) -> str:
    import onnx

    from benches.support.graphs import GraphBuilder, tensor

    g, prev = GraphBuilder(), "X"
    for i in range(tensors - 1):
        prev = g.node("Relu" if i % 2 == 0 else "Neg", [prev], output=f"t{i}")
    onnx.save(g.model("chain", [tensor("X", ["N", 4])], [tensor(prev, ["N", 4])]), path.as_posix())
    return str(path)


def run(run: Run, settings: dict[str, Any]) -> None:
    from onnxruntime.quantization.calibrate import HistogramCollector as OrtCollector

    import histocal

    os.environ.pop("HISTOCAL_MAX_SEARCH_WORK", None)
    logging.disable(logging.INFO)  # onnxruntime's collector logs every threshold range
    data = np.random.default_rng(0).normal(0, 1, 1_000_000).astype(np.float32)
    bins = settings["shared_bins"]
    rounds = interleave(
        {
            "histocal": lambda: search_seconds(histocal.HistogramCollector, bins, data),
            "onnxruntime": lambda: search_seconds(OrtCollector, bins, data),
        },
        settings["repeat"],
        warmup=0,
    )
    for subject in ("histocal", "onnxruntime"):
        s = rounds.median(subject)
        run.add(
            subject, {"search": "entropy", "bins": bins}, median_s=s, ns_per_evaluation=s / entropy_work(bins) * 1e9
        )
    run.add(
        "histocal vs onnxruntime", {"search": "entropy", "bins": bins}, speedup=rounds.ratio("onnxruntime", "histocal")
    )
    for large in settings["large_bins"]:
        s = search_seconds(histocal.HistogramCollector, large, data)
        run.add(
            "histocal",
            {"search": "entropy", "bins": large},
            median_s=s,
            ns_per_evaluation=s / entropy_work(large) * 1e9,
        )

    collector = histocal.HistogramCollector("entropy", False, 128, 128, 99.999, "same")
    collector.collect({"x": data[:4000].astype(np.float16)})
    collector.collect({"x": np.array([65504, 1.0], np.float16)})  # the outlier widens to millions of bins
    outlier_bins = len(collector.histogram_dict["x"][0])
    start = time.perf_counter()
    try:
        collector.compute_collection_result()
        outcome = "searched"
    except ValueError:
        outcome = "refused"
    run.add(
        "histocal",
        {"search": "entropy, float16 outlier", "bins": outlier_bins},
        outcome=outcome,
        evaluations=entropy_work(outlier_bins),
        ms=(time.perf_counter() - start) * 1e3,
    )

    with tempfile.TemporaryDirectory(prefix="bench_limits.") as tmp:
        model = chain_model(Path(tmp) / "chain.onnx", settings["tensors"])
        for mode in ("exact", "streaming"):
            for batches in settings["batches"]:
                point = isolated(long_stream, model, mode, batches)
                run.add(
                    f"histocal {mode}",
                    {"stream": "1x4 feeds", "tensors": settings["tensors"], "batches": batches},
                    **point,
                )


def _records(result: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return [r for r in result["records"] if key in r["case"]]


def section(result: dict[str, Any]) -> list[str]:
    searches = [r for r in _records(result, "search") if "ns_per_evaluation" in r]
    refusal = next(r for r in _records(result, "search") if "outcome" in r)
    streams = _records(result, "stream")
    return [
        *table(
            ["search", "bins", "bin evaluations", "time", "ns per evaluation"],
            [
                [
                    r["subject"],
                    f"{r['case']['bins']:,}",
                    f"{entropy_work(r['case']['bins']):.3g}",
                    f"{r['median_s']:.2f} s",
                    fmt(r["ns_per_evaluation"]),
                ]
                for r in searches
            ],
            "llrrr",
        ),
        "",
        f"A float16 tensor with one outlier (65504): {refusal['case']['bins']:,} bins, {refusal['evaluations']:.3g} "
        f"bin evaluations: **{refusal['outcome']}** after {refusal['ms']:.2f} ms.",
        "",
        f"Long streams, {streams[0]['case']['tensors'] if streams else 0} calibrated tensors, one 1x4 feed per batch, "
        "PercentileCalibrater, a fresh process per row; peak RSS above the start of collect_data:",
        "",
        *table(
            ["mode", "batches", "peak above start", "collect_data"],
            [
                [r["subject"], f"{r['case']['batches']:,}", f"{r['above_start_mb']:.1f} MB", f"{r['seconds']:.1f} s"]
                for r in streams
            ],
            "lrrr",
        ),
    ]


def summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    ns = [
        r["ns_per_evaluation"]
        for r in _records(result, "search")
        if r["subject"] == "histocal" and "ns_per_evaluation" in r
    ]
    ort = next(r for r in _records(result, "search") if r["subject"] == "onnxruntime")
    refusal = next(r for r in _records(result, "search") if "outcome" in r)
    streams = _records(result, "stream")
    first, last = streams[0]["case"]["batches"], streams[-1]["case"]["batches"]
    growth = max(r["above_start_mb"] for r in streams if r["case"]["batches"] == last) - max(
        r["above_start_mb"] for r in streams if r["case"]["batches"] == first
    )
    return [
        (
            "entropy search; float16 outlier; long streams",
            f"{fmt(min(ns))}-{fmt(max(ns))} ns per bin evaluation (onnxruntime {fmt(ort['ns_per_evaluation'])} ns); "
            f"outlier {refusal['outcome']} in {refusal['ms']:.1f} ms; {first:,} -> {last:,} batches: peak {growth:+.1f} MB",
        ),
    ]

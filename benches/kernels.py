"""How fast are the collector's kernels, against onnxruntime's HistogramCollector?

* collect: one float32 tensor into the entropy collector's 2048-bin histogram, histocal's
  ``HistogramCollector`` drop-in and onnxruntime's, interleaved (GB/s of input);
* compute: the entropy search on 2048-bin histograms (per tensor), both collectors, interleaved;
* the Rust kernels alone (``benches/rust/kernels.rs``, a ``cargo bench`` target): the streaming
  histogram's add, onnxruntime's histogram counting, the KL search; their JSON lines are recorded
  here as they are (skipped, and said so, where cargo is not installed).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from typing import Any

import numpy as np

from benches.support.harness import ROOT, Run, interleave, timed
from benches.support.report import fmt, table

TITLE = "Collector kernels"
QUESTION = (
    "How fast does histocal's HistogramCollector collect and search compared with onnxruntime's, and how fast are "
    "the Rust kernels on their own?"
)
SIZES = {
    "smoke": {"values": 1 << 16, "tensors": 2, "repeat": 1, "rust": True, "rust_quick": True},
    "quick": {"values": 1 << 24, "tensors": 4, "repeat": 3, "rust": True, "rust_quick": True},
    "full": {"values": 1 << 26, "tensors": 8, "repeat": 5, "rust": True, "rust_quick": False},
}
ARGS = ("entropy", False, 2048, 128, 99.999, "same")


def rust_kernels(quick: bool) -> list[dict[str, Any]]:
    """The cargo bench target's records ([] without cargo)."""
    if shutil.which("cargo") is None:
        return []
    env = {**os.environ, "CARGO_TARGET_DIR": os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))}
    done = subprocess.run(
        ["cargo", "bench", "--quiet", "--bench", "kernels", "--", *(["--quick"] if quick else [])],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def run(run: Run, settings: dict[str, Any]) -> None:
    from onnxruntime.quantization.calibrate import HistogramCollector as OrtCollector

    import histocal

    logging.disable(logging.INFO)  # onnxruntime's collector logs every threshold range
    rng = np.random.default_rng(0)
    data = rng.standard_normal(settings["values"], dtype=np.float32)
    classes = {"histocal": histocal.HistogramCollector, "onnxruntime": OrtCollector}
    rounds = interleave(
        {name: (lambda c=c: timed(lambda: c(*ARGS).collect({"t": [data]}))) for name, c in classes.items()},
        settings["repeat"],
    )
    case = {"kernel": "collect", "values": data.size, "bins": 2048}
    for name in classes:
        run.add(name, case, median_s=rounds.median(name), gb_per_s=data.nbytes / 1e9 / rounds.median(name))
    run.add("histocal vs onnxruntime", case, speedup=rounds.ratio("onnxruntime", "histocal"))

    tensors = {f"t{i}": [rng.standard_normal(1 << 16, dtype=np.float32) * (i + 1)] for i in range(settings["tensors"])}
    filled = {}
    for name, c in classes.items():
        filled[name] = c(*ARGS)
        filled[name].collect(tensors)
    rounds = interleave(
        {name: (lambda c=c: timed(c.compute_collection_result)) for name, c in filled.items()}, settings["repeat"], 0
    )
    case = {"kernel": "entropy compute", "tensors": len(tensors), "bins": 2048}
    for name in classes:
        run.add(name, case, median_s=rounds.median(name), ms_per_tensor=rounds.median(name) * 1e3 / len(tensors))
    run.add("histocal vs onnxruntime", case, speedup=rounds.ratio("onnxruntime", "histocal"))

    if settings["rust"]:
        lines = rust_kernels(settings["rust_quick"])
        for line in lines:
            run.add("rust", {"kernel": line["kernel"], "case": line["case"], "threads": line["threads"]},
                    value=line["value"], unit=line["unit"])  # fmt: skip
        if not lines:
            run.add("rust", {"kernel": "all"}, skipped="cargo is not installed")


def _find(result: dict[str, Any], subject: str, kernel: str) -> dict[str, Any]:
    return next(r for r in result["records"] if r["subject"] == subject and r["case"]["kernel"] == kernel)


def section(result: dict[str, Any]) -> list[str]:
    rows = []
    for kernel, key, unit in (("collect", "gb_per_s", "GB/s"), ("entropy compute", "ms_per_tensor", "ms per tensor")):
        ours, theirs = _find(result, "histocal", kernel), _find(result, "onnxruntime", kernel)
        speedup = _find(result, "histocal vs onnxruntime", kernel)["speedup"]
        size = (
            f"{ours['case']['values']:,} values" if "values" in ours["case"] else f"{ours['case']['tensors']} tensors"
        )
        rows.append([kernel, size, f"{fmt(ours[key])} {unit}", f"{fmt(theirs[key])} {unit}", f"**{fmt(speedup)}x**"])
    rust = [r for r in result["records"] if r["subject"] == "rust" and "value" in r]
    return [
        "HistogramCollector (entropy, 2048 bins into 128), float32 N(0, 1):",
        "",
        *table(["kernel", "size", "histocal", "onnxruntime", "histocal faster by"], rows, "llrrr"),
        "",
        f"Rust kernels alone (`cargo bench --bench kernels{' -- --quick' if result['settings']['rust_quick'] else ''}`, "
        "medians; one thread: thread CPU time):",
        "",
        *table(
            ["kernel", "case", "threads", "result"],
            [
                [r["case"]["kernel"], r["case"]["case"], r["case"]["threads"], f"{fmt(r['value'])} {r['unit']}"]
                for r in rust
            ],
            "llrr",
        ),
    ]


def summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    collect, compute = (_find(result, "histocal vs onnxruntime", k) for k in ("collect", "entropy compute"))
    ours = _find(result, "histocal", "collect")
    per_tensor = _find(result, "histocal", "entropy compute")
    return [
        (
            "HistogramCollector drop-in, 2048 bins",
            f"collect {fmt(ours['gb_per_s'])} GB/s ({fmt(collect['speedup'])}x onnxruntime); entropy "
            f"{fmt(per_tensor['ms_per_tensor'])} ms per tensor ({fmt(compute['speedup'])}x)",
        )
    ]

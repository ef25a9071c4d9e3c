"""What does per-channel collection cost against per-tensor collection?

The same calibration (``MethodCalibrater``, method ``mse``, streaming histograms) with and
without ``per_channel`` (one histogram per channel along axis 1), collect_data (the ratio) and
compute_data timed apart on a calibrator made beforehand, interleaved in rotating order with the floor measured around each
round.
"""

from __future__ import annotations

import gc
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benches.support import models
from benches.support.harness import Floor, Run, interleave, quiet
from benches.support.report import fmt, table

TITLE = "Per-channel against per-tensor collection"
QUESTION = "How much longer does a calibration take with per-channel histograms than with per-tensor ones?"
SIZES = {
    "smoke": {"models": ["cnn32"], "bins": 2048, "samples": 2, "repeat": 1, "warmup": 0},
    "quick": {"models": ["cnn224", "ppocr_det"], "bins": 2048, "samples": 8, "repeat": 3, "warmup": 1},
    "full": {"models": ["cnn224", "ppocr_det", "nudenet"], "bins": 2048, "samples": 16, "repeat": 5, "warmup": 1},
}


def collection(model: str, feeds: list[dict[str, Any]], augmented: str, per_channel: bool, bins: int) -> Any:
    import histocal

    def run() -> float:
        gc.collect()
        with quiet():
            cal = histocal.MethodCalibrater(
                model, augmented_model_path=augmented, method="mse", per_channel=per_channel, streaming_bins=bins
            )
            cal.augment_graph()
            cal.create_inference_session()
            start = time.perf_counter()
            cal.collect_data(feeds)
            collected = time.perf_counter()
            cal.compute_data()
            run.compute_seconds.append(time.perf_counter() - collected)  # type: ignore[attr-defined]
            return collected - start

    run.compute_seconds = []  # type: ignore[attr-defined]
    return run


def run(run: Run, settings: dict[str, Any]) -> None:
    import histocal

    with tempfile.TemporaryDirectory(prefix="bench_per_channel.") as tmp:
        folder = Path(tmp)
        for name in settings["models"]:
            path, feeds, _ = models.model_and_feeds(name, folder, settings["samples"])
            augmented = str(folder / "floor.onnx")
            histocal.create_calibrator(path, augmented_model_path=augmented, calibrate_method="entropy")
            floor = Floor(augmented, feeds)
            runs = {
                "per tensor": collection(path, feeds, str(folder / "t.onnx"), False, settings["bins"]),
                "per channel": collection(path, feeds, str(folder / "c.onnx"), True, settings["bins"]),
            }
            rounds = interleave(runs, settings["repeat"], settings["warmup"], floor.measure)
            case = {"model": name, "samples": len(feeds), "outputs": floor.outputs}
            for subject in runs:
                compute = runs[subject].compute_seconds[-settings["repeat"] :]  # type: ignore[attr-defined]
                run.add(subject, case, seconds=rounds.seconds[subject], median_s=rounds.median(subject),
                        x_B=float(np.median(rounds.to_floor[subject]["B"])), compute_s=float(np.median(compute)))  # fmt: skip
            run.add("per channel / per tensor", case, ratio=rounds.ratio("per channel", "per tensor"))


def section(result: dict[str, Any]) -> list[str]:
    rows = []
    for r in [r for r in result["records"] if r["subject"] == "per channel / per tensor"]:
        t, c = (
            next(x for x in result["records"] if x["case"] == r["case"] and x["subject"] == s)
            for s in ("per tensor", "per channel")
        )
        rows.append([r["case"]["model"], r["case"]["outputs"], r["case"]["samples"], f"{t['median_s']:.3f} s ({fmt(t['x_B'])} B)",
                     f"{c['median_s']:.3f} s ({fmt(c['x_B'])} B)", f"**{fmt(r['ratio'])}x**",
                     f"{t['compute_s']:.3f} / {c['compute_s']:.3f} s"])  # fmt: skip
    return [
        f"MethodCalibrater, mse, streaming histograms of {result['settings']['bins']} bins; B: the floor (see the ratio-to-the-floor section).",
        "",
        *table(
            [
                "model",
                "tensors",
                "samples",
                "collect per tensor",
                "collect per channel",
                "ratio",
                "mse compute: tensor / channel",
            ],
            rows,
        ),
    ]


def summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    ratios = [r for r in result["records"] if r["subject"] == "per channel / per tensor"]
    return [
        (
            "per-channel histograms, " + " / ".join(r["case"]["model"] for r in ratios),
            " / ".join(f"{fmt(r['ratio'])}x" for r in ratios)
            + " a per-tensor collection's time (onnxruntime: per-channel MinMax only)",
        )
    ]

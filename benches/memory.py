"""How does peak memory grow with the number of calibration samples?

Each point (subject, samples) runs in a fresh process, so no earlier measurement's heap hides its
peak: the synthetic CNN, feeds made on demand (a read-once reader for onnxruntime, a callable
returning a fresh generator for histocal: the inputs themselves are never all held), and the peak resident memory during create_calibrator + collect_data +
compute_data above what the process held before it (the interpreter, onnxruntime, the model).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benches.support import models
from benches.support.harness import Run, isolated, peak_rss, quiet, timed
from benches.support.report import fmt, table

TITLE = "Peak memory against the number of samples"
QUESTION = (
    "How does peak memory grow from a few to many calibration samples, for histocal's collection modes and for "
    "onnxruntime's Entropy calibrator (which keeps every output of every sample)?"
)
SIZES = {
    "smoke": {"size": 32, "samples": [2, 4]},
    "quick": {"size": 224, "samples": [8, 16, 32, 64]},
    "full": {"size": 224, "samples": [8, 16, 32, 64, 128]},
}
# subject -> (library, method, extra_options)
SUBJECTS = {
    "onnxruntime Entropy": ("ort", "Entropy", {}),
    "histocal default (exact)": ("histocal", "Entropy", {}),
    "histocal exact, two passes": ("histocal", "Entropy", {"MemoryBudget": 0}),
    "histocal streaming": ("histocal", "Entropy", {"CollectionMode": "streaming"}),
    "histocal MinMax": ("histocal", "MinMax", {}),
}


class OnDemandReader:
    """A read-once reader making sample i when asked (no input is kept by the reader): what
    onnxruntime's calibrators take."""

    def __init__(self, size: int, samples: int) -> None:
        self.size, self.samples, self.i = size, samples, 0

    def get_next(self) -> dict[str, Any] | None:
        if self.i == self.samples:
            return None
        self.i += 1
        return _sample(self.size, self.i - 1)


def _sample(size: int, i: int) -> dict[str, Any]:
    import numpy as np

    return {"input": models.image_like(np.random.default_rng([0, i]), (1, 3, size, size))}


def one_point(subject: str, size: int, samples: int) -> dict[str, float]:
    """In a fresh process: peak RSS of one calibration (called through harness.isolated)."""
    import onnxruntime.quantization.calibrate as ort_calibrate
    from onnxruntime.quantization import CalibrationMethod

    import histocal

    library, method, extra = SUBJECTS[subject]
    create = histocal.create_calibrator if library == "histocal" else ort_calibrate.create_calibrator
    with tempfile.TemporaryDirectory(prefix="bench_memory.") as tmp:
        model = models.save_cnn(Path(tmp), size)
        _sample(size, 0)  # numpy's first allocations, not the calibration's
        with quiet(), peak_rss() as memory:
            cal = create(
                model,
                augmented_model_path=str(Path(tmp) / "aug.onnx"),
                calibrate_method=CalibrationMethod[method],
                extra_options=extra,
            )
            # histocal takes a callable returning a fresh iterable: data it may read twice (two passes).
            data: Any = (
                OnDemandReader(size, samples)
                if library == "ort"
                else lambda: (_sample(size, i) for i in range(samples))
            )
            seconds = timed(lambda: (cal.collect_data(data), cal.compute_data()))
    return {**memory, "seconds": seconds}


def run(run: Run, settings: dict[str, Any]) -> None:
    for samples in settings["samples"]:
        for subject in SUBJECTS:
            point = isolated(one_point, subject, settings["size"], samples)
            run.add(subject, {"size": settings["size"], "samples": samples}, **point)


def _series(result: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for r in result["records"]:
        out.setdefault(r["subject"], []).append((r["case"]["samples"], r["above_start_mb"]))
    return out


def growth(points: list[tuple[int, float]]) -> float:
    """Percent growth of the peak from the fewest to the most samples."""
    return 100 * (points[-1][1] / points[0][1] - 1)


def section(result: dict[str, Any]) -> list[str]:
    series = _series(result)
    samples = [n for n, _ in next(iter(series.values()))]
    rows = [[s, *[fmt(mb, 0) for _, mb in points], f"{growth(points):+.0f}%"] for s, points in series.items()]
    size = result["settings"]["size"]
    return [
        f"Peak resident memory (MB) above the process's before the calibration, synthetic CNN {size}x{size} "
        "(203 calibrated tensors), one fresh process per cell. histocal's default exact mode keeps the outputs "
        "while they fit its memory budget and its adaptive schedule judges one pass cheaper than two, so its peak "
        "follows onnxruntime's until the budget (or the schedule) turns to two passes; the two-pass and streaming "
        "rows are what data beyond the budget costs.",
        "",
        *table(["subject", *[f"{n} samples" for n in samples], "growth"], rows),
    ]


def summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    series = _series(result)
    first, last = series["histocal streaming"][0][0], series["histocal streaming"][-1][0]
    flat = [f"{growth(series[s]):+.0f}%" for s in ("histocal streaming", "histocal exact, two passes")]
    return [
        (
            f"peak memory, {first} -> {last} samples",
            f"streaming {flat[0]}, exact in two passes {flat[1]}; onnxruntime Entropy "
            f"{growth(series['onnxruntime Entropy']):+.0f}%",
        )
    ]


def plot(result: dict[str, Any], folder: Path | None) -> list[tuple[str, str]]:
    file, caption = "memory_vs_samples.png", "Peak memory against samples: histocal's modes and onnxruntime"
    if folder is None:
        return [(file, caption)]
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=80)
    for subject, points in _series(result).items():
        ax.plot([n for n, _ in points], [mb for _, mb in points], marker="o", label=subject)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("calibration samples")
    ax.set_ylabel("peak RSS above start (MB)")
    ax.set_title(f"Synthetic CNN {result['settings']['size']}x{result['settings']['size']}, 203 tensors", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / file)
    plt.close(fig)
    return [(file, caption)]

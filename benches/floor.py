"""What does each collection mode cost as a multiple of the floor of calibration?

The floor (support/harness.py ``Floor``) is one warm inference pass of the augmented model over the
same feeds with each sample's outputs dropped as produced (W), its CPU time (C), the CPU time of
reading every output once (R), and B = max(W, (C + R) / n) on n usable CPUs. Each mode is
collect_data + compute_data on a calibrator made beforehand (setup is not in W either), feeds as
a list; the floor is measured before the first round and after each, and each ratio is to the
mean of the floors around its round.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benches.support import models
from benches.support.harness import Floor, Run, interleave
from benches.support.report import fmt, table

TITLE = "Ratio to the floor per collection mode"
QUESTION = (
    "How close does each collection mode come to the floor of calibration (one inference pass of the augmented "
    "model that reads every output), and where does onnxruntime stand?"
)
SIZES = {
    "smoke": {"models": ["cnn32"], "samples": 2, "repeat": 1, "warmup": 0, "ort_histograms": True},
    "quick": {"models": ["cnn224", "ppocr_det"], "samples": 8, "repeat": 3, "warmup": 1, "ort_histograms": True},
    "full": {"models": ["cnn224", "ppocr_det"], "samples": 32, "repeat": 5, "warmup": 1, "ort_histograms": False},
}
# mode -> (library, method, extra_options, histocal takes the list as given)
MODES = {
    "histocal streaming": ("histocal", "Entropy", {"CollectionMode": "streaming"}, True),
    "histocal default (exact)": ("histocal", "Entropy", {}, True),
    "histocal default, read-once reader": ("histocal", "Entropy", {}, False),
    "histocal exact, two passes": ("histocal", "Entropy", {"MemoryBudget": 0}, True),
    "histocal MinMax": ("histocal", "MinMax", {}, True),
    "onnxruntime MinMax": ("ort", "MinMax", {}, True),
}
ORT_HISTOGRAMS = {"onnxruntime Entropy": ("ort", "Entropy", {}, True)}


def run(run: Run, settings: dict[str, Any]) -> None:
    from onnxruntime.quantization import CalibrationMethod

    import histocal

    with tempfile.TemporaryDirectory(prefix="bench_floor.") as tmp:
        folder = Path(tmp)
        for name in settings["models"]:
            path, feeds, _ = models.model_and_feeds(name, folder, settings["samples"])
            augmented = str(folder / "floor.onnx")
            histocal.create_calibrator(path, augmented_model_path=augmented, calibrate_method=CalibrationMethod.Entropy)
            floor = Floor(augmented, feeds)
            modes = {**MODES, **(ORT_HISTOGRAMS if settings["ort_histograms"] else {})}
            runs = {
                mode: models.calibration(
                    library,
                    path,
                    CalibrationMethod[method],
                    feeds,
                    str(folder / "mode.onnx"),
                    extra,
                    with_setup=False,
                    list_input=as_list,
                )
                for mode, (library, method, extra, as_list) in modes.items()
            }
            rounds = interleave(runs, settings["repeat"], settings["warmup"], floor.measure)
            case = {"model": name, "samples": len(feeds), "outputs": floor.outputs}
            run.add("floor", case, **{k: round(v, 4) for k, v in rounds.floor().items()}, cpus=floor.cpus)
            for mode in modes:
                run.add(
                    mode,
                    case,
                    seconds=rounds.seconds[mode],
                    median_s=rounds.median(mode),
                    x_B=float(np.median(rounds.to_floor[mode]["B"])),
                    x_W=float(np.median(rounds.to_floor[mode]["W"])),
                )


def section(result: dict[str, Any]) -> list[str]:
    out = []
    for floor in [r for r in result["records"] if r["subject"] == "floor"]:
        case = floor["case"]
        rows = [
            [r["subject"], f"{r['median_s']:.3f} s", f"**{fmt(r['x_B'])}**", fmt(r["x_W"])]
            for r in result["records"]
            if r["case"] == case and r["subject"] != "floor"
        ]
        out += [
            f"**{case['model']}**, {case['samples']} samples, {case['outputs']} calibrated outputs: "
            f"W {floor['W']:.3f} s, C {floor['C']:.3f} s, R {floor['R']:.3f} s, n {floor['cpus']}, B {floor['B']:.3f} s.",
            "",
            *table(["mode (Entropy, 128 bins, unless MinMax)", "time", "x B", "x W"], rows),
            "",
        ]
    return out


def summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    def ratios(subject: str) -> str:
        return " / ".join(fmt(r["x_B"]) for r in result["records"] if r["subject"] == subject)

    names = " / ".join(r["case"]["model"] for r in result["records"] if r["subject"] == "floor")
    return [
        (
            f"ratio to the floor B, {names}",
            f"streaming {ratios('histocal streaming')}, exact {ratios('histocal default (exact)')}, "
            f"MinMax {ratios('histocal MinMax')}; onnxruntime MinMax {ratios('onnxruntime MinMax')}",
        )
    ]


def plot(result: dict[str, Any], folder: Path | None) -> list[tuple[str, str]]:
    file, caption = "ratio_to_floor.png", "Each mode's time as a multiple of the floor B"
    if folder is None:
        return [(file, caption)]
    import matplotlib.pyplot as plt

    floors = [r["case"] for r in result["records"] if r["subject"] == "floor"]
    modes = [r["subject"] for r in result["records"] if r["case"] == floors[0] and r["subject"] != "floor"]
    fig, ax = plt.subplots(figsize=(6.5, 3.6), dpi=80)
    width = 0.8 / len(floors)
    for i, case in enumerate(floors):
        values = {r["subject"]: r["x_B"] for r in result["records"] if r["case"] == case and "x_B" in r}
        ax.barh(np.arange(len(modes)) + i * width, [values.get(m, 0) for m in modes], width, label=f"{case['model']}")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(np.arange(len(modes)) + width * (len(floors) - 1) / 2, modes, fontsize=7)
    ax.set_xlabel("time / floor B (1 = the floor)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / file)
    plt.close(fig)
    return [(file, caption)]

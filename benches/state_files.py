"""How long do calibration state files take to save and load, and how large are they?

A state is collected from a real calibration of the synthetic CNN (203 tensors), in exact mode
(Percentile's 2048-bin histograms beside the streaming histograms every calibrator keeps) and in
streaming mode; each is saved and loaded through the public ``CalibrationState`` API, saving and
loading interleaved over rounds.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benches.support import models
from benches.support.harness import Run, interleave, timed
from benches.support.report import fmt, table

TITLE = "Calibration state files"
QUESTION = "How long does a calibration state take to save and to load, and how large is its file?"
SIZES = {
    "smoke": {"size": 32, "samples": 2, "repeat": 1},
    "quick": {"size": 224, "samples": 4, "repeat": 5},
    "full": {"size": 224, "samples": 16, "repeat": 9},
}
MODES = {"exact (Percentile, 2048 bins)": "exact", "streaming": "streaming"}


def run(run: Run, settings: dict[str, Any]) -> None:
    import histocal

    with tempfile.TemporaryDirectory(prefix="bench_state.") as tmp:
        folder = Path(tmp)
        model = models.save_cnn(folder, settings["size"])
        feeds = models.cnn_feeds(settings["size"], settings["samples"])
        runs = {}
        for label, mode in MODES.items():
            cal = histocal.create_calibrator(
                model,
                augmented_model_path=str(folder / "aug.onnx"),
                calibrate_method="percentile",
                extra_options={"CollectionMode": mode},
            )
            cal.collect_data(feeds)
            state = cal.state
            path = folder / f"{mode}.hcs"
            runs[f"save {label}"] = lambda s=state, p=path: timed(lambda: s.save(p))
            runs[f"load {label}"] = lambda p=path: timed(lambda: histocal.CalibrationState.load(p))
            runs[f"save {label}"]()
            tensors = len(state.names)
        rounds = interleave(runs, settings["repeat"], warmup=1)
        for label, mode in MODES.items():
            size_mb = (folder / f"{mode}.hcs").stat().st_size / 1e6
            case = {"model": f"CNN {settings['size']}", "tensors": tensors, "state": label}
            for op in ("save", "load"):
                key = f"{op} {label}"
                run.add(op, case, seconds=rounds.seconds[key], median_s=rounds.median(key), file_mb=round(size_mb, 2))


def section(result: dict[str, Any]) -> list[str]:
    rows: dict[str, list[Any]] = {}
    for r in result["records"]:
        row = rows.setdefault(
            r["case"]["state"], [r["case"]["state"], r["case"]["tensors"], "", "", f"{fmt(r['file_mb'])} MB"]
        )
        row[2 if r["subject"] == "save" else 3] = f"{r['median_s'] * 1e3:.0f} ms"
    return table(["state", "tensors", "save", "load", "file"], list(rows.values()))


def summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    exact = [r for r in result["records"] if r["case"]["state"].startswith("exact")]
    save, load = (next(r for r in exact if r["subject"] == op) for op in ("save", "load"))
    return [
        (
            f"state files, {save['case']['tensors']} tensors, exact",
            f"save {save['median_s'] * 1e3:.0f} ms, load {load['median_s'] * 1e3:.0f} ms, {fmt(save['file_mb'])} MB; "
            "no onnxruntime counterpart",
        )
    ]

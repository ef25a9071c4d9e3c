"""How long does a MinMax calibrator take to set up, as the graph grows, and MinMax end to end?

Growth: ``create_calibrator(MinMax)`` on chains of N unary ops (N + 1 calibrated tensors) by
histocal and by onnxruntime, and histocal's two parts apart: the augmented graph (ORT's
ReduceMin/ReduceMax outputs, built in one pass) and the inference session onnxruntime builds of it.
Microseconds per tensor show what grows faster than the graph. onnxruntime's set-up is quadratic,
so it is timed once and only up to ``ort_max`` tensors; histocal's parts are the median of
``repeat`` runs.

Real models: MinMax whole (create_calibrator, collect_data over the feeds, compute_data) and the
set-up alone, histocal and onnxruntime interleaved in rotating order; ratios are medians of the
per-round ratios, and the ranges are compared bit for bit.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benches.support import models
from benches.support.harness import Run, interleave, quiet
from benches.support.report import fmt, table

TITLE = "MinMax set-up against the graph's size"
QUESTION = (
    "How long does creating a MinMax calibrator take with histocal and with onnxruntime as the graph grows, "
    "and how long does MinMax take end to end on real models?"
)
SIZES = {
    "smoke": {"chains": [50, 100], "ort_max": 100, "models": ["cnn32"], "samples": 2, "repeat": 1},
    "quick": {
        "chains": [1000, 2000, 4000, 8000],
        "ort_max": 2000,
        "models": ["open_nsfw", "ppocr_det"],
        "samples": 8,
        "repeat": 3,
    },
    "full": {
        "chains": [1000, 2000, 4000, 8000, 16000],
        "ort_max": 4000,
        "models": ["open_nsfw", "ppocr_det"],
        "samples": 8,
        "repeat": 5,
    },
}


def save_chain(n: int, path: Path) -> str:
    """A chain of ``n`` unary float ops on a [1, 8] input: n + 1 calibrated tensors."""
    import onnx
    from onnx import TensorProto, helper

    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node(("Relu", "Neg", "Abs", "Sigmoid")[i % 4], [prev], [f"t{i}"], name=f"n{i}"))
        prev = f"t{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 8])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10), path)
    return str(path)


def seconds(fn: Any) -> float:
    start = time.perf_counter()
    with quiet():
        fn()
    return time.perf_counter() - start


def growth(run: Run, settings: dict[str, Any], folder: Path) -> None:
    import onnxruntime.quantization.calibrate as ort_calibrate

    import histocal
    from histocal.calibrators import MinMaxCalibrater

    augmented = str(folder / "aug.onnx")
    for n in settings["chains"]:
        path = save_chain(n, folder / f"chain{n}.onnx")
        parts: dict[str, list[float]] = {"augment": [], "session": [], "create_calibrator": []}
        for _ in range(settings["repeat"]):  # the median of a few: one run on a loaded machine misleads
            calibrator = MinMaxCalibrater(path, augmented_model_path=augmented)
            parts["augment"].append(seconds(calibrator.augment_graph))
            parts["session"].append(seconds(calibrator.create_inference_session))
            del calibrator
            parts["create_calibrator"].append(
                seconds(lambda p=path: histocal.create_calibrator(p, augmented_model_path=augmented))
            )
        case = {"tensors": n + 1}
        for part, runs in parts.items():
            s = statistics.median(runs)
            run.add(f"histocal {part}", case, seconds=s, runs=runs, us_per_tensor=1e6 * s / (n + 1))
        if n + 1 <= settings["ort_max"] + 1:
            s = seconds(lambda p=path: ort_calibrate.create_calibrator(p, augmented_model_path=augmented))
            run.add("ort create_calibrator", case, seconds=s, us_per_tensor=1e6 * s / (n + 1))


def set_up(library: str, path: str, augmented: str) -> Any:
    """A function timing ``create_calibrator(MinMax)`` alone by ``library``."""
    import onnxruntime.quantization.calibrate as ort_calibrate

    import histocal

    create = histocal.create_calibrator if library == "histocal" else ort_calibrate.create_calibrator
    return lambda: seconds(lambda: create(path, augmented_model_path=augmented))


def end_to_end(run: Run, settings: dict[str, Any], folder: Path) -> None:
    from onnxruntime.quantization import CalibrationMethod

    for name in settings["models"]:
        path, feeds, _ = models.model_and_feeds(name, folder, settings["samples"])
        runs = {}
        for library in ("histocal", "ort"):
            augmented = str(folder / f"{library}.onnx")
            runs[f"{library} MinMax"] = models.calibration(library, path, CalibrationMethod.MinMax, feeds, augmented)
            runs[f"{library} set-up"] = set_up(library, path, augmented)
        rounds = interleave(runs, settings["repeat"], warmup=1)
        same, compared = models.same_ranges(runs["histocal MinMax"].ranges, runs["ort MinMax"].ranges)  # type: ignore[attr-defined]
        case = {"model": name, "samples": len(feeds)}
        for key in runs:
            run.add(key, case, seconds=rounds.seconds[key], median_s=rounds.median(key))
        run.add(
            "histocal vs ort",
            case,
            set_up_ratio=rounds.ratio("histocal set-up", "ort set-up"),
            end_to_end_ratio=rounds.ratio("histocal MinMax", "ort MinMax"),
            identical=same,
            tensors=compared,
        )


def run(run: Run, settings: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="bench_setup.") as tmp:
        growth(run, settings, Path(tmp))
        end_to_end(run, settings, Path(tmp))


def _records(result: dict[str, Any], subject: str) -> list[dict[str, Any]]:
    return [r for r in result["records"] if r["subject"] == subject]


def section(result: dict[str, Any]) -> list[str]:
    chains: dict[int, dict[str, dict[str, Any]]] = {}
    for r in result["records"]:
        if "tensors" in r["case"] and "model" not in r["case"]:
            chains.setdefault(r["case"]["tensors"], {})[r["subject"]] = r

    def cell(row: dict[str, dict[str, Any]], subject: str) -> str:
        r = row.get(subject)
        return "" if r is None else f"{fmt(r['seconds'])} s ({r['us_per_tensor']:.0f} µs)"

    lines = [
        "Chains of unary ops: seconds (µs per tensor); histocal's the median of the runs, onnxruntime's one run.",
        "",
    ]
    lines += table(
        [
            "tensors",
            "onnxruntime create_calibrator",
            "histocal create_calibrator",
            "histocal graph",
            "histocal session",
        ],
        [
            [
                f"{n:,}",
                cell(row, "ort create_calibrator"),
                cell(row, "histocal create_calibrator"),
                cell(row, "histocal augment"),
                cell(row, "histocal session"),
            ]
            for n, row in sorted(chains.items())
        ],
    )
    lines += ["", "Real models, MinMax: medians of the interleaved rounds.", ""]
    rows = []
    for c in _records(result, "histocal vs ort"):
        median = {r["subject"]: r["median_s"] for r in result["records"] if r["case"] == c["case"] and "median_s" in r}
        rows.append(
            [
                c["case"]["model"],
                f"{fmt(median['histocal set-up'])} s",
                f"{fmt(median['ort set-up'])} s",
                f"**{c['set_up_ratio']:.2f}x**",
                f"{fmt(median['histocal MinMax'])} s",
                f"{fmt(median['ort MinMax'])} s",
                f"**{c['end_to_end_ratio']:.2f}x**",
                f"{c['identical']} / {c['tensors']}",
            ]
        )
    lines += table(
        [
            "model",
            "histocal set-up",
            "onnxruntime set-up",
            "ratio",
            "histocal MinMax",
            "onnxruntime MinMax",
            "ratio",
            "identical",
        ],
        rows,
    )
    return lines


def summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    real = _records(result, "histocal vs ort")
    chains = sorted(_records(result, "histocal create_calibrator"), key=lambda r: r["case"]["tensors"])
    if not real or not chains:
        return []
    setup = "-".join(sorted({f"{r['set_up_ratio']:.2f}" for r in real}))
    whole = "-".join(sorted({f"{r['end_to_end_ratio']:.2f}" for r in real}))
    first, last = chains[0], chains[-1]
    differ = sum(r["tensors"] - r["identical"] for r in real)
    ranges = "ranges identical" if differ == 0 else f"{differ} ranges differ"
    return [
        (
            f"MinMax set-up, {len(real)} real models; chains {first['case']['tensors']:,} -> {last['case']['tensors']:,} tensors",
            f"set-up {setup}x, end to end {whole}x onnxruntime's, {ranges}; "
            f"{first['us_per_tensor']:.0f} -> {last['us_per_tensor']:.0f} µs per tensor",
        )
    ]

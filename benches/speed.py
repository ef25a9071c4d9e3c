"""How much faster than onnxruntime is each calibration method, on real models?

For each model and histogram size, every method's calibration by histocal (exact mode, the
default: ORT's ranges) and by onnxruntime is timed whole (create_calibrator, collect_data over
the feeds, compute_data), all subjects interleaved in one process in rotating order; the ratio is
the median of the per-round ratios. The floor W (one warm inference pass of the augmented model
over the same feeds) is measured around each round, so each time is also a multiple of it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benches.support import models
from benches.support.harness import Floor, Run, interleave
from benches.support.report import fmt, table

TITLE = "Speed against onnxruntime per method on real models"
QUESTION = (
    "How long does each method's calibration take with histocal and with onnxruntime, on real pretrained "
    "models, at onnxruntime's 128 bins and at 2048 bins, and are the ranges identical?"
)
SIZES = {
    "smoke": {"models": ["cnn32"], "samples": 2, "bins": [128], "repeat": 1, "warmup": 0},
    "quick": {"models": ["mtcnn_onet", "nudenet"], "samples": 8, "bins": [128, 2048], "repeat": 3, "warmup": 1},
    "full": {
        "models": ["mtcnn_onet", "nudenet", "ddddocr"],
        "samples": 16,
        "bins": [128, 2048],
        "repeat": 5,
        "warmup": 1,
    },
}
METHODS = ["MinMax", "Entropy", "Percentile", "Distribution"]


def methods_at(bins: int, first: bool) -> list[str]:
    """MinMax has no bins (timed once); Distribution needs 512 bins or more (onnxruntime's check)."""
    return [m for m in METHODS if (m != "MinMax" or first) and (m != "Distribution" or bins >= 512)]


def run(run: Run, settings: dict[str, Any]) -> None:
    from onnxruntime.quantization import CalibrationMethod

    import histocal

    with tempfile.TemporaryDirectory(prefix="bench_speed.") as tmp:
        folder = Path(tmp)
        for name in settings["models"]:
            path, feeds, what = models.model_and_feeds(name, folder, settings["samples"])
            augmented = str(folder / "floor.onnx")
            histocal.create_calibrator(path, augmented_model_path=augmented, calibrate_method=CalibrationMethod.Entropy)
            floor = Floor(augmented, feeds)
            for bins in settings["bins"]:
                methods = methods_at(bins, first=bins == settings["bins"][0])
                runs = {}
                for method in methods:
                    extra = {} if method == "MinMax" else {"num_bins": bins}
                    if method == "Entropy":
                        extra["num_quantized_bins"] = 128
                    for library in ("histocal", "ort"):
                        runs[f"{library} {method}"] = models.calibration(
                            library, path, CalibrationMethod[method], feeds, str(folder / f"{library}.onnx"), extra
                        )
                rounds = interleave(runs, settings["repeat"], settings["warmup"], floor.measure)
                w = rounds.floor()["W"]
                for method in methods:
                    ours, theirs = runs[f"histocal {method}"], runs[f"ort {method}"]
                    same, compared = models.same_ranges(ours.ranges, theirs.ranges)  # type: ignore[attr-defined]
                    case = {"model": name, "what": what, "bins": bins, "method": method, "samples": len(feeds)}
                    for library in ("histocal", "ort"):
                        key = f"{library} {method}"
                        run.add(
                            library,
                            case,
                            seconds=rounds.seconds[key],
                            median_s=rounds.median(key),
                            x_W=float(np.median(rounds.to_floor[key]["W"])),
                        )
                    run.add(
                        "histocal vs ort",
                        case,
                        speedup=rounds.ratio(f"ort {method}", f"histocal {method}"),
                        identical=same,
                        tensors=compared,
                        W_s=w,
                        outputs=floor.outputs,
                    )


def comparisons(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in result["records"] if r["subject"] == "histocal vs ort"]


def _time(result: dict[str, Any], library: str, case: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in result["records"] if r["subject"] == library and r["case"] == case)


def section(result: dict[str, Any]) -> list[str]:
    rows = []
    for c in comparisons(result):
        ours, theirs = _time(result, "histocal", c["case"]), _time(result, "ort", c["case"])
        rows.append(
            [
                c["case"]["model"],
                c["case"]["method"],
                c["case"]["bins"] if c["case"]["method"] != "MinMax" else "",
                f"{ours['median_s']:.3f} s ({fmt(ours['x_W'])} W)",
                f"{theirs['median_s']:.3f} s ({fmt(theirs['x_W'])} W)",
                f"**{fmt(c['speedup'])}x**",
                f"{c['identical']} / {c['tensors']}",
            ]
        )
    first = comparisons(result)[0] if comparisons(result) else {"case": {"samples": 0}}
    return [
        f"Median of the rounds; W: the floor, one warm inference pass of the augmented model over the same "
        f"{first['case']['samples']} feeds. Identical: tensors whose (low, high) equal onnxruntime's bit for bit.",
        "",
        *table(
            ["model", "method", "bins", "histocal", "onnxruntime", "histocal faster by", "identical"], rows, "lllrrrr"
        ),
    ]


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{fmt(low)}x" if fmt(low) == fmt(high) else f"{fmt(low)}-{fmt(high)}x"


def summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    """One row per histogram size: each method's span over the models, ranges identical or not."""
    rows = comparisons(result)
    names = sorted({r["case"]["model"] for r in rows})
    out = []
    for bins in sorted({r["case"]["bins"] for r in rows}):
        at = [r for r in rows if r["case"]["bins"] == bins]
        spans = {}
        for method in METHODS:
            of = [r["speedup"] for r in at if r["case"]["method"] == method]
            if of:
                spans.setdefault(_span(of), []).append(method)
        identical = all(r["identical"] == r["tensors"] for r in at)
        out.append(
            (
                f"{bins} bins{' (onnxruntime default)' if bins == 128 else ''}, {len(names)} real models",
                "; ".join(f"{' '.join(methods)} {span}" for span, methods in spans.items())
                + " faster; ranges "
                + ("identical" if identical else "not all identical (see the section)"),
            )
        )
    return out


def plot(result: dict[str, Any], folder: Path | None) -> list[tuple[str, str]]:
    file, caption = "speed_vs_ort.png", "Calibration time, histocal and onnxruntime, per method and model (log scale)"
    if folder is None:
        return [(file, caption)]
    import matplotlib.pyplot as plt

    rows = comparisons(result)
    labels = [
        f"{r['case']['model']}\n{r['case']['method']}"
        + (f" {r['case']['bins']}" if r["case"]["method"] != "MinMax" else "")
        for r in rows
    ]
    ours = [_time(result, "histocal", r["case"])["median_s"] for r in rows]
    theirs = [_time(result, "ort", r["case"])["median_s"] for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows)), 3.6), dpi=80)
    ax.bar(x - 0.2, theirs, 0.4, label="onnxruntime", color="#bbbbbb")
    ax.bar(x + 0.2, ours, 0.4, label="histocal (exact: same ranges)", color="#1f77b4")
    for i, r in enumerate(rows):
        ax.text(i, max(ours[i], theirs[i]) * 1.15, f"{r['speedup']:.1f}x", ha="center", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("seconds (median)")
    ax.set_xticks(x, labels, fontsize=6, rotation=90)
    ax.legend(fontsize=7)
    ax.set_title(f"Calibration time, {rows[0]['case']['samples']} samples", fontsize=9)
    fig.tight_layout()
    fig.savefig(folder / file)
    plt.close(fig)
    return [(file, caption)]

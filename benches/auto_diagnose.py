"""What do model-level auto and diagnose cost, and what do they gain?

* auto: ``histocal.quantize_static(..., calibrate_method="auto")`` (the method chosen by the
  quantized model's output, cross-validated on the calibration feeds) against onnxruntime's own
  ``quantize_static`` with MinMax (its default), Entropy and Percentile, interleaved: the time of
  each, and the output SQNR of each quantized model against the float model on held-back feeds;
* diagnose: ``histocal.diagnose.diagnose`` (at most 10% of nodes left in float) against one
  histocal MinMax calibration of the same feeds, interleaved; the SQNR before and after.
"""

from __future__ import annotations

import logging
import math
import tempfile
from pathlib import Path
from typing import Any

from benches.support import models
from benches.support.harness import ListReader, Run, interleave, quiet, timed
from benches.support.report import fmt, table

TITLE = "Model-level auto and diagnose: cost and quality"
QUESTION = (
    "How long do model-level auto and diagnose take against onnxruntime's quantize_static and a MinMax calibration, "
    "and how much output SQNR do they gain?"
)
SIZES = {
    "smoke": {"models": ["cnn32"], "samples": 2, "held": 2, "repeat": 1},
    "quick": {"models": ["mtcnn_onet", "ddddocr"], "samples": 16, "held": 8, "repeat": 3},
    "full": {"models": ["mtcnn_onet", "ddddocr", "nudenet"], "samples": 32, "held": 16, "repeat": 5},
}
ORT_METHODS = ["MinMax", "Entropy", "Percentile"]


def run(run: Run, settings: dict[str, Any]) -> None:
    import onnxruntime.quantization as oq

    import histocal
    from histocal.diagnose import diagnose

    logging.getLogger("root").setLevel(logging.ERROR)  # onnxruntime's pre-processing advice
    quant = {
        "quant_format": oq.QuantFormat.QDQ,
        "activation_type": oq.QuantType.QInt8,
        "weight_type": oq.QuantType.QInt8,
    }
    with tempfile.TemporaryDirectory(prefix="bench_auto.") as tmp:
        folder = Path(tmp)
        for name in settings["models"]:
            model, feeds, _ = models.model_and_feeds(name, folder, settings["samples"], seed=1)
            held = models.model_and_feeds(name, folder, settings["held"], seed=2)[1]
            failed: dict[str, str] = {}

            def ort_run(method: str) -> float:
                def quantize() -> None:
                    with quiet():
                        oq.quantize_static(model, str(folder / f"ort_{method}.onnx"), ListReader(feeds),
                                           calibrate_method=oq.CalibrationMethod[method], **quant)  # fmt: skip

                try:
                    return timed(quantize)
                except Exception as exc:  # onnxruntime's histogram calibrators fail on batches of different shapes
                    failed[method] = f"{type(exc).__name__}: {str(exc)[:80]}"
                    return math.nan

            def auto() -> None:
                histocal.quantize_static(model, str(folder / "auto.onnx"), feeds, calibrate_method="auto", **quant)

            runs = {f"onnxruntime {m}": (lambda m=m: ort_run(m)) for m in ORT_METHODS}
            runs["histocal auto"] = lambda: timed(auto)
            runs["histocal MinMax calibration"] = lambda: timed(lambda: histocal.calibrate(model, feeds, "minmax"))
            diagnoses: list[Any] = []
            runs["histocal diagnose"] = lambda: timed(
                lambda: diagnoses.append(diagnose(model, feeds, held, max_excluded_fraction=0.1, show_progress=False))
            )
            rounds = interleave(runs, settings["repeat"], warmup=0)
            case = {"model": name, "samples": len(feeds), "held_back": len(held)}
            for subject in runs:
                quantized = {"histocal auto": "auto.onnx", **{f"onnxruntime {m}": f"ort_{m}.onnx" for m in ORT_METHODS}}
                method = subject.removeprefix("onnxruntime ")
                values: dict[str, Any] = {"seconds": rounds.seconds[subject]}
                if method in failed:
                    values["error"] = failed[method]
                else:
                    values["median_s"] = rounds.median(subject)
                    if subject in quantized:
                        values["sqnr_db"] = round(models.output_sqnr(model, str(folder / quantized[subject]), held), 2)
                run.add(subject, case, **values)
            d = diagnoses[-1]
            run.add("diagnose result", case, sqnr_db=round(d.sqnr_db, 2), sqnr_excluded_db=round(d.sqnr_excluded_db, 2),
                    excluded_fraction=round(d.excluded_fraction, 3),
                    x_minmax=rounds.ratio("histocal diagnose", "histocal MinMax calibration"))  # fmt: skip
            if "MinMax" not in failed:
                run.add("auto vs onnxruntime MinMax", case, x_time=rounds.ratio("histocal auto", "onnxruntime MinMax"))


def _by(result: dict[str, Any], model: str) -> dict[str, dict[str, Any]]:
    return {r["subject"]: r for r in result["records"] if r["case"]["model"] == model}


def section(result: dict[str, Any]) -> list[str]:
    out = []
    for model in dict.fromkeys(r["case"]["model"] for r in result["records"]):
        by = _by(result, model)
        d = by["diagnose result"]
        rows = [
            [
                s,
                f"{r['median_s']:.2f} s" if "median_s" in r else "fails: " + r["error"].split(".")[0],
                fmt(r.get("sqnr_db")),
            ]
            for s, r in by.items()
            if "seconds" in r
        ]
        case = d["case"]
        out += [
            f"**{model}**, {case['samples']} calibration feeds, {case['held_back']} held-back feeds (SQNR: int8 QDQ "
            f"model's outputs against the float model's). Diagnose: {fmt(d['sqnr_db'])} -> {fmt(d['sqnr_excluded_db'])} "
            f"dB with {d['excluded_fraction']:.1%} of nodes in float, {fmt(d['x_minmax'])}x one MinMax calibration; "
            + (
                f"auto: {fmt(by['auto vs onnxruntime MinMax']['x_time'])}x onnxruntime's MinMax quantize_static."
                if "auto vs onnxruntime MinMax" in by
                else ""
            ),
            "",
            *table(["subject", "time (median)", "output SQNR (dB)"], rows),
            "",
        ]
    return out


def summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    models_ = list(dict.fromkeys(r["case"]["model"] for r in result["records"]))
    auto, best_gap, diag = [], [], []
    for model in models_:
        by = _by(result, model)
        if "auto vs onnxruntime MinMax" in by:
            auto.append(fmt(by["auto vs onnxruntime MinMax"]["x_time"]))
        ort_best = max((by[f"onnxruntime {m}"].get("sqnr_db", -math.inf) for m in ORT_METHODS), default=-math.inf)
        best_gap.append(f"{by['histocal auto']['sqnr_db'] - ort_best:+.2f}")
        d = by["diagnose result"]
        diag.append(f"{fmt(d['sqnr_db'])} -> {fmt(d['sqnr_excluded_db'])} dB ({fmt(d['x_minmax'])}x)")
    names = " / ".join(models_)
    return [
        (
            f"model-level auto, {names}",
            f"{' / '.join(auto)}x onnxruntime MinMax quantize_static's time; SQNR {' / '.join(best_gap)} dB vs its best method",
        ),
        (f"diagnose, {names}", f"{'; '.join(diag)} a MinMax calibration's time"),
    ]

"""What does ``recipe="best"`` gain over onnxruntime's default, and what does it cost?

``histocal.quantize_static(..., recipe="best")`` (preparation, symmetric per-channel weights,
placement and auto's method chosen on the calibration feeds; docs/methods.md, "The recipe") against
onnxruntime's own ``quantize_static`` with its defaults (MinMax, per-tensor, every operator),
interleaved: the time of each, and the output SQNR of each int8 QDQ model against the float model on
held-back feeds the calibration never saw (the recipe's choices use only the calibration feeds).
NNCF and AIMET run in their own environments, never here: their figures, where measured, are in
benches/NOTES.md.
"""

from __future__ import annotations

import gc
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from benches.support import models
from benches.support.harness import ListReader, Run, interleave, median, per_round_ratio, quiet, timed
from benches.support.report import fmt, table

TITLE = "The recipe"
QUESTION = (
    'How much held-back output SQNR does recipe="best" gain over onnxruntime\'s default quantize_static, '
    "and at what multiple of its time?"
)
ORT = "onnxruntime MinMax (default)"
BEST = 'histocal recipe="best"'
SIZES = {
    "smoke": {"models": ["cnn32"], "samples": 4, "held": 2, "repeat": 1},
    "quick": {"models": ["mtcnn_onet", "minilm", "ddddocr"], "samples": 16, "held": 8, "repeat": 2},
    "full": {
        "models": ["mtcnn_onet", "minilm", "ddddocr", "captcha_crnn", "nudenet"],
        "samples": 32,
        "held": 16,
        "repeat": 3,
    },
}


def run(run: Run, settings: dict[str, Any]) -> None:
    import onnxruntime.quantization as oq

    import histocal
    from histocal.calibrators.cores import usable_cpus

    logging.getLogger("root").setLevel(logging.ERROR)  # onnxruntime's pre-processing advice
    chosen: list[str] = []

    class Remember(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("recipe: placement") and "ranges" in record.getMessage():
                chosen.append(record.getMessage())

    recipe_log = logging.getLogger("histocal.quantize.recipe")
    recipe_log.setLevel(logging.INFO)
    recipe_log.addHandler(handler := Remember())
    try:
        with tempfile.TemporaryDirectory(prefix="bench_recipe.") as tmp:
            folder = Path(tmp)
            for name in settings["models"]:
                model, feeds, _ = models.model_and_feeds(name, folder, settings["samples"], seed=1)
                held = models.model_and_feeds(name, folder, settings["held"], seed=2)[1]
                ort_out, best_out = str(folder / f"{name}_ort.onnx"), str(folder / f"{name}_best.onnx")

                def ort_default() -> None:
                    with quiet():
                        oq.quantize_static(model, ort_out, ListReader(feeds))

                def best() -> None:
                    histocal.quantize_static(model, best_out, feeds, recipe="best")

                cpu: dict[str, list[float]] = {ORT: [], BEST: []}
                runs = {ORT: lambda: _timed(ort_default, cpu[ORT]), BEST: lambda: _timed(best, cpu[BEST])}
                rounds = interleave(runs, settings["repeat"], warmup=0)
                case = {"model": name, "samples": len(feeds), "held_back": len(held)}
                for subject, out in zip(runs, (ort_out, best_out)):
                    run.add(subject, case, seconds=rounds.seconds[subject], median_s=rounds.median(subject),
                            cpu_seconds=cpu[subject], median_cpu_s=median(cpu[subject]),
                            sqnr_db=round(models.output_sqnr(model, out, held), 2), task=task(name, out))  # fmt: skip
                run.add("float model", case, task=task(name, model))
                # The recipe's CPU time spread evenly over every core this process may use, over
                # onnxruntime's time in the same round: the multiple no scheduling of today's work
                # can go below on this machine.
                cores = usable_cpus()
                run.add("recipe vs onnxruntime", case, x_time=rounds.ratio(BEST, ORT), cores=cores,
                        x_time_all_cores=per_round_ratio([c / cores for c in cpu[BEST]], rounds.seconds[ORT]),
                        choice=chosen[-1].removeprefix("recipe: ") if chosen else "")  # fmt: skip
    finally:
        recipe_log.removeHandler(handler)


def _timed(fn: Any, cpu_seconds: list[float]) -> float:
    """``timed(fn)``, the process's CPU seconds over the call (every thread's: onnxruntime's,
    histocal's Rust pool, the Python threads) appended to ``cpu_seconds``."""
    gc.collect()  # ``timed``'s own collection then finds nothing to charge
    before = sum(os.times()[:2])
    seconds = timed(fn)
    cpu_seconds.append(sum(os.times()[:2]) - before)
    return seconds


def task(name: str, path: str) -> str:
    """The real model's task check on ``path`` (real_models' check: rendered captchas read, face
    against texture probability, paraphrase against unrelated cosine), "" for a synthetic model."""
    from benches.support import real_models

    spec = real_models.MODELS.get(name)
    return "" if spec is None else spec.check(Path(path))[1]


def _by(result: dict[str, Any], model: str) -> dict[str, dict[str, Any]]:
    return {r["subject"]: r for r in result["records"] if r["case"]["model"] == model}


def section(result: dict[str, Any]) -> list[str]:
    rows = []
    for model in dict.fromkeys(r["case"]["model"] for r in result["records"]):
        by = _by(result, model)
        ort_, best = by[ORT], by[BEST]
        vs = by["recipe vs onnxruntime"]
        rows.append([model, fmt(ort_["sqnr_db"]), fmt(best["sqnr_db"]), f"{best['sqnr_db'] - ort_['sqnr_db']:+.2f}",
                     f"{ort_['median_s']:.2f} s", f"{best['median_s']:.2f} s", fmt(vs["x_time"]),
                     f"{best['median_cpu_s']:.2f} s", fmt(vs["x_time_all_cores"]), vs["choice"]])  # fmt: skip
    return [
        "Output SQNR (dB) of each int8 QDQ model against the float model on held-back feeds; times are medians of the "
        "interleaved rounds, x: the recipe's time over onnxruntime's per round. recipe CPU: the process's CPU time "
        "over a recipe (every thread); x at full cores: that CPU time divided by the cores the process may use, "
        "over onnxruntime's time per round, the multiple no scheduling of the same work can go below on this "
        "machine.",
        "",
        *table(
            [
                "model",
                "onnxruntime default",
                'recipe="best"',
                "gain",
                "onnxruntime time",
                "recipe time",
                "x",
                "recipe CPU",
                "x at full cores",
                "recipe's choice",
            ],
            rows,
        ),
        "",
        *_tasks(result),
    ]


def _tasks(result: dict[str, Any]) -> list[str]:
    """The task checks of the float and both int8 models, where the model has one."""
    rows = []
    for model in dict.fromkeys(r["case"]["model"] for r in result["records"]):
        by = _by(result, model)
        if by.get("float model", {}).get("task"):
            rows.append([model, by["float model"]["task"], by[ORT]["task"], by[BEST]["task"]])
    if not rows:
        return []
    return [
        "The task checks (benches/support/real_models.py) on held-out rendered inputs:",
        "",
        *table(["model", "float model", "onnxruntime default", 'recipe="best"'], rows),
        "",
    ]


def summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    models_ = list(dict.fromkeys(r["case"]["model"] for r in result["records"]))
    gains, times = [], []
    for model in models_:
        by = _by(result, model)
        gains.append(f"{by[BEST]['sqnr_db'] - by[ORT]['sqnr_db']:+.1f}")
        times.append(fmt(by["recipe vs onnxruntime"]["x_time"]))
    return [
        (
            f'recipe="best", {" / ".join(models_)}',
            f"{' / '.join(gains)} dB over ORT's default; {' / '.join(times)}x its time",
        )
    ]

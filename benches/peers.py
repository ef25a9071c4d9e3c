"""How does histocal compare with peer calibration libraries?

AMD Quark's power-of-two MinMSE (``PowOfTwoCalibrater``) keeps every batch's outputs and runs its
MinMSE on them concatenated; ``histocal.quark``'s ``PowOfTwoCollector`` takes the batches one at a
time (mode All: a few error sums per tensor). Both are fed the same batches of one tensor (normal
values, a few outliers) and interleaved; "Quark's way" is Quark's arithmetic
(``histocal.quark.pof2.min_mse``, the transcription tested against a numpy reference of Quark's
code) on the kept, concatenated batches, so Quark itself is not needed. Peak memory: tracemalloc's
peak (numpy's buffers included) above the batches being generated.

Where amd-quark is importable (0.13, or 0.9; it needs torch), Quark itself side by side on real
models: its ``create_calibrator_power_of_two`` with MinMSE mode All against histocal.quark's
identical call (factory, ``collect_data`` and the ranges: what a user waits for), same model and
feeds, interleaved, int8 and int16; Quark 0.13 with its default histogram (2048 bins) and with
``num_bins=0`` (the MinMSE on the values, Quark 0.9's), Quark 0.9 with its MinMSE on the values
(histocal ``num_bins=0``). Quark runs with ``optimize_mem=False`` (its outputs in memory: its
faster way, and float32 as histocal; by default 0.13 caches them on disk, as float16 where it
keeps every batch). Without Quark these cases are left out (a line on stderr says why).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import sys
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benches.support.harness import Run, interleave, timed
from benches.support.report import fmt, table

TITLE = "Peers: Quark's power-of-two MinMSE"
QUESTION = (
    "What do time and memory of Quark's power-of-two MinMSE (every batch kept) become when histocal.quark "
    "computes the same ranges one batch at a time?"
)
# models: Quark side by side (real models, benches/support/real_models.py), where Quark is installed
MODELS = ["mtcnn_onet", "mtcnn_pnet", "ddddocr", "open_nsfw", "ppocr_det"]
SIZES = {
    "smoke": {"batches": 2, "shape": [2, 4, 8, 8], "repeat": 1, "models": ["mtcnn_pnet"], "feeds": 2},
    "quick": {"batches": 32, "shape": [8, 64, 32, 32], "repeat": 3, "models": MODELS, "feeds": 8},
    "full": {"batches": 64, "shape": [8, 64, 32, 32], "repeat": 5, "models": MODELS, "feeds": 32},
}


def batches(n: int, shape: list[int], seed: int = 0) -> Iterator[np.ndarray]:
    rng = np.random.default_rng(seed)
    for _ in range(n):
        x = rng.normal(0, 1, shape).astype(np.float32)
        x.flat[rng.integers(0, x.size, 4)] *= 20  # a few outliers
        yield x


def histocal_way(settings: dict[str, Any], qtype: str) -> Any:
    from histocal.quark import PowOfTwoCollector

    c = PowOfTwoCollector(activation_type={"int8": "QInt8", "int16": "QInt16"}[qtype], minmse_mode="All", num_bins=0)
    for x in batches(settings["batches"], settings["shape"]):
        c.collect({"t": [x]})
    return c.compute_collection_result()["t"]


def quark_way(settings: dict[str, Any], qtype: str) -> Any:
    from histocal.quark.pof2 import min_mse, value_range

    x = np.array(list(batches(settings["batches"], settings["shape"]))).flatten()  # Quark keeps every batch
    pos, zero_point = min_mse(x, qtype, True)
    return value_range(pos, zero_point, qtype, True, x.dtype)


def peak_mib(fn: Callable[[], Any]) -> tuple[Any, float]:
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


SYNTHETIC = ("Quark's way (keep every batch)", "histocal.quark (per batch)")


def run(run: Run, settings: dict[str, Any]) -> None:
    for qtype in ("int8", "int16"):
        ways = {SYNTHETIC[0]: quark_way, SYNTHETIC[1]: histocal_way}
        rounds = interleave(
            {k: (lambda f=f: timed(lambda: f(settings, qtype))) for k, f in ways.items()}, settings["repeat"], 0
        )
        results = {k: peak_mib(lambda f=f: f(settings, qtype)) for k, f in ways.items()}
        ref = results[SYNTHETIC[0]][0]
        case = {
            "qtype": qtype,
            "mode": "All",
            "batches": settings["batches"],
            "shape": "x".join(map(str, settings["shape"])),
        }
        for k in ways:
            same = all(np.array_equal(a, b) for a, b in zip(results[k][0], ref))
            run.add(k, case, median_s=rounds.median(k), peak_mib=round(results[k][1], 1), same_range=same,
                    x_quark=rounds.ratio(k, SYNTHETIC[0]))  # fmt: skip
    found = installed_quark()
    if isinstance(found, str):
        print(f"  Quark side by side left out: {found}", file=sys.stderr)
        return
    for model in settings["models"]:
        side_by_side(run, settings, found, model)


# ---------------------------------------------------------------------------------------------
# Quark itself, side by side
# ---------------------------------------------------------------------------------------------


class SizedReader:
    """A read-once reader with len() (Quark 0.13's calibrator asks for it)."""

    def __init__(self, feeds: list[dict[str, Any]]) -> None:
        self.feeds, self.i = feeds, 0

    def __len__(self) -> int:
        return len(self.feeds)

    def get_next(self) -> dict[str, Any] | None:
        self.i += 1
        return self.feeds[self.i - 1] if self.i <= len(self.feeds) else None


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Quark prints (its ScreenLogger, tqdm bars on stderr): keep them out of the bench's output."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


def installed_quark() -> dict[str, Any] | str:
    """The installed amd-quark's version, power-of-two factory, MinMSE and int8 / int16 types, or
    why there is none to compare with."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("amd-quark")
    except PackageNotFoundError:
        return "amd-quark is not installed"
    try:
        with silenced():
            try:  # Quark 0.13
                from onnxruntime.quantization.quant_utils import QuantType as QType
                from quark.onnx.calibration import PowerOfTwoMethod, create_calibrator_power_of_two

                # (label, Quark's extra_options, histocal's): the same call
                keep = {"optimize_mem": False}
                values = {"num_bins": 0, "optimize_mem": False}
                variants = [("histogram, 2048 bins", keep, keep), ("values, num_bins=0", values, values)]
            except ImportError:  # Quark 0.9: its MinMSE is on the values; it calibrates ORT's QInt16 as int8
                from quark.onnx.calibrate import create_calibrator_power_of_two  # type: ignore[no-redef, unused-ignore]
                from quark.onnx.quant_utils import ExtendedQuantType as QType  # type: ignore[no-redef, unused-ignore]
                from quark.onnx.quant_utils import PowerOfTwoMethod  # type: ignore[no-redef, unused-ignore]

                variants = [("values", {}, {"num_bins": 0})]
    except Exception as e:  # torch missing, an onnx too new for it: nothing to compare with
        return f"amd-quark {found} does not import: {type(e).__name__}: {e}"
    return {
        "version": found,
        "factory": create_calibrator_power_of_two,
        "method": PowerOfTwoMethod.MinMSE,
        "qtypes": {"int8": QType.QInt8, "int16": QType.QInt16},
        "variants": variants,
    }


def calibrate(factory: Any, model: str, feeds: list[dict[str, Any]], qtype: Any, method: Any, extra: dict) -> dict:
    """One whole power-of-two calibration (factory, collect_data, ranges): {tensor: (low, high)}."""
    with tempfile.TemporaryDirectory() as d, silenced():
        cal = factory(model, None, str(Path(d) / "augmented.onnx"), qtype, method, extra_options=extra)
        cal.collect_data(SizedReader(feeds))
        try:
            ranges = {k: v.range_value for k, v in cal.compute_data().data.items()}
        except NotImplementedError:  # Quark 0.9's PowOfTwoCalibrater has compute_range only
            ranges = cal.compute_range()
    return {k: (np.asarray(lo), np.asarray(hi)) for k, (lo, hi) in ranges.items()}


def identical(theirs: dict, ours: dict) -> int:
    """The tensors whose (low, high) are the same values of the same type on both sides."""
    return sum(
        k in ours and all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(v, ours[k]))
        for k, v in theirs.items()
    )


def side_by_side(run: Run, settings: dict[str, Any], quark: dict[str, Any], name: str) -> None:
    from benches.support.models import model_and_feeds

    with tempfile.TemporaryDirectory(prefix="peers-") as work:
        model, feeds, _ = model_and_feeds(name, Path(work), settings["feeds"])
        compare(run, settings, quark, name, model, feeds)


def compare(run: Run, settings: dict[str, Any], quark: dict[str, Any], name: str, model: str, feeds: list) -> None:
    from histocal import quark as hq

    subjects = (f"Quark {quark['version']}", "histocal.quark")
    for qname, qtype in quark["qtypes"].items():
        for variant, theirs_extra, ours_extra in quark["variants"]:
            sides = {
                subjects[0]: (quark["factory"], quark["method"], theirs_extra),
                subjects[1]: (hq.create_calibrator_power_of_two, "MinMSE", ours_extra),
            }
            ranges: dict[str, Any] = {}

            def once(subject: str) -> float:
                factory, method, options = sides[subject]
                return timed(lambda: ranges.update({subject: calibrate(factory, model, feeds, qtype, method, options)}))

            case = {"model": name, "qtype": qname, "mode": "All", "variant": variant, "feeds": len(feeds),
                    "quark": quark["version"]}  # fmt: skip
            try:
                once(subjects[0])  # unmeasured: Quark's failure is a result too
            except Exception as e:
                error = f"{type(e).__name__}: {e}".splitlines()[0][:120]
                rounds = interleave({subjects[1]: functools.partial(once, subjects[1])}, settings["repeat"], 1)
                run.add(subjects[0], case, error=error)
                run.add(subjects[1], {**case, "tensors": len(ranges[subjects[1]])}, median_s=rounds.median(subjects[1]))
                continue
            once(subjects[1])
            rounds = interleave({s: functools.partial(once, s) for s in subjects}, settings["repeat"], 0)
            theirs, ours = ranges[subjects[0]], ranges[subjects[1]]
            case["tensors"] = len(theirs)
            run.add(subjects[0], case, median_s=rounds.median(subjects[0]))
            run.add(subjects[1], {**case, "tensors": len(ours)}, median_s=rounds.median(subjects[1]),
                    x_quark=rounds.ratio(subjects[1], subjects[0]), identical=identical(theirs, ours),
                    same_tensors=set(theirs) == set(ours))  # fmt: skip


def section(result: dict[str, Any]) -> list[str]:
    records = [r for r in result["records"] if r["subject"] in SYNTHETIC]
    case = records[0]["case"]
    rows = [[r["case"]["qtype"], r["subject"], f"{r['median_s']:.2f} s", f"{fmt(r['peak_mib'])} MiB", r["same_range"]]
            for r in records]  # fmt: skip
    lines = [
        f"One float32 tensor, {case['batches']} batches of {case['shape']}, MinMSE mode All.",
        "",
        *table(["qtype", "way", "time", "peak memory", "same range"], rows, "llrrl"),
    ]
    return lines + side_by_side_section(result)


def quark_pairs(result: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(Quark's record, histocal's) of each side-by-side case."""
    records = [r for r in result["records"] if r["subject"] not in SYNTHETIC]
    return list(zip(records[::2], records[1::2]))


def side_by_side_section(result: dict[str, Any]) -> list[str]:
    pairs = quark_pairs(result)
    if not pairs:
        return ["", "Quark itself side by side: not measured in this run (amd-quark and torch not installed)."]
    rows = []
    for theirs, ours in pairs:
        c = ours["case"]
        quark_time = f"fails: {theirs['error']}" if "error" in theirs else f"{theirs['median_s']:.2f} s"
        same = f"{ours['identical']}/{theirs['case']['tensors']}" if "identical" in ours else ""
        ratio = fmt(1 / ours["x_quark"]) + "x" if "x_quark" in ours else ""
        rows.append([c["model"], c["tensors"], c["qtype"], c["variant"], quark_time, f"{ours['median_s']:.2f} s",
                     ratio, same])  # fmt: skip
    version = pairs[0][0]["case"]["quark"]
    return [
        "",
        f"AMD Quark {version} itself side by side: `create_calibrator_power_of_two` with MinMSE mode All "
        f"(factory, collect_data, ranges), {pairs[0][1]['case']['feeds']} feeds per model"
        + ("" if version == "0.9" else ", Quark with `optimize_mem=False`")
        + ", histocal.quark's identical call; speed-up = Quark's time / histocal's "
        "(median of per-round ratios); identical: tensors with the same (low, high), value and type.",
        "",
        *table(
            ["model", "tensors", "qtype", "MinMSE", f"Quark {version}", "histocal", "speed-up", "identical"],
            rows,
            "lrllrrrr",
        ),
    ]


def summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    ours = [r for r in result["records"] if r["subject"] == SYNTHETIC[1]]
    pairs = [(t, o) for t, o in quark_pairs(result) if "x_quark" in o]
    if pairs:  # one row (the summary has at most 15): Quark itself
        speed = [1 / o["x_quark"] for _, o in pairs]
        same = sum(o["identical"] for _, o in pairs), sum(t["case"]["tensors"] for t, _ in pairs)
        fails = sorted({t["case"]["model"] for t, _ in quark_pairs(result) if "error" in t})
        return [
            (
                f"Quark {pairs[0][0]['case']['quark']}'s power-of-two MinMSE All, {len({o['case']['model'] for _, o in pairs})} "
                "real models, int8 / int16",
                f"{fmt(min(speed))}-{fmt(max(speed))}x Quark's speed; ranges identical {same[0]}/{same[1]}; "
                f"one tensor, 32 batches: {' / '.join(fmt(r['peak_mib']) for r in ours)} MiB"
                + (f"; Quark fails on {', '.join(fails)}" if fails else ""),
            )
        ]
    theirs = [r for r in result["records"] if r["subject"] == SYNTHETIC[0]]
    return [
        (
            "Quark's power-of-two MinMSE, int8 / int16",
            f"{' / '.join(fmt(r['peak_mib']) for r in ours)} MiB, {' / '.join(fmt(r['x_quark']) for r in ours)}x the "
            f"time; Quark's way {' / '.join(fmt(r['peak_mib']) for r in theirs)} MiB; same ranges: "
            f"{all(r['same_range'] for r in ours)}",
        )
    ]

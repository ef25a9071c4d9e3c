#!/usr/bin/env python3
"""Quantization quality of every calibration method: output SQNR of int8 QDQ models.

Two models are built here with tests/support/graphs.py (IR version 10, opset 17):

* ``cnn``: a small ResNet-like CNN (stem Conv+Relu, residual Conv-Relu-Conv + Add + Relu blocks,
  MaxPool, wider blocks, GlobalAveragePool, Gemm head), input 1x3xSIZExSIZE;
* ``transformer``: two pre-LN encoder blocks (LayerNormalization, MatMul Q/K/V, Softmax
  attention, residual Add, Erf-GELU feed-forward) plus a final LayerNormalization and MatMul
  head, input 1xSEQxDIM, whose residual stream has a few *outlier channels* (50-100x larger
  magnitude, fixed channels, as observed in LLMs by LLM.int8()): the LayerNormalization outputs
  that feed the MatMuls then carry outlier channels too.

For each model: seeded calibration inputs and separate (seeded differently) held-back inputs;
one histocal state collected once (EntropyCalibrater in streaming mode: the streaming histogram
every method reads); then for every method:

1. ``state.compute(method, **options)`` for all tensors (timed),
2. quantize: ``histocal.quantize_static(model, out, tensors_range=ranges, quant_format=QDQ,
   activation_type=QInt8, weight_type=QInt8)`` (when the installed histocal has no
   ``tensors_range`` keyword yet: onnxruntime's quantize_static with the ranges in an ORT JSON
   calibration cache written by ``histocal.io.cache``, which is the same thing),
3. run the quantized model on the held-back inputs with onnxruntime and report the output SQNR
   ``10 log10(sum y^2 / sum (y - yq)^2)`` (dB, over all outputs of all held-back inputs) against
   the float model.

Methods: minmax, entropy (ORT's, 128 bins), entropy with 2048 bins, percentile (99.999,
symmetric), distribution (float8 only in ORT: reported as not applicable to int8), mse, kl,
pow2 NonOverflow, pow2 MinMSE, auto's per-tensor estimate (``state.compute("auto")``), and auto
as ``histocal.quantize_static(calibrate_method="auto")`` does it: calibrate on the calibration
inputs, keep the first 16 of them, score every candidate (the per-tensor estimate and each
single method) by its output SQNR 2-fold cross-validated *on those calibration inputs* (ranges
fitted on 8 of them, scored on the other 8, both ways), and use the best one's ranges from the
full calibration; its SQNR is then measured on the held-back inputs like every other row (the
held-back inputs play no part in the choice). A method the installed histocal does not know is reported as such (the
harness runs against any build).

Usage:
    python3 benches/bench_methods.py                 # both models (a few minutes on 2 cores)
    python3 benches/bench_methods.py --quick         # smaller models and fewer inputs
    python3 benches/bench_methods.py --models transformer --out RESULTS_methods.md
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import logging
import math
import os
import platform
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

AUTO_MODEL = "auto (model-level)"  # not a state method: see run_auto
# (label, method, options); options go to state.compute
METHODS: list[tuple[str, str, dict[str, Any]]] = [
    ("minmax", "minmax", {}),
    ("entropy (128)", "entropy", {"num_bins": 128, "num_quantized_bins": 128}),
    ("entropy (2048)", "entropy", {"num_bins": 2048, "num_quantized_bins": 128}),
    ("percentile 99.999", "percentile", {"percentile": 99.999, "symmetric": True}),
    ("distribution", "distribution", {}),  # float8 only (avg/std): reported, not quantized
    ("mse", "mse", {"qtype": "int8", "symmetric": False}),
    ("kl", "kl", {"num_bins": 2048, "num_quantized_bins": 128}),
    ("pow2 NonOverflow", "pow2", {"qtype": "int8", "pow2_method": "NonOverflow"}),
    ("pow2 MinMSE", "pow2", {"qtype": "int8", "pow2_method": "MinMSE", "minmse_mode": "All"}),
    ("auto (per-tensor estimate)", "auto", {"qtype": "int8", "symmetric": False}),
    ("auto", AUTO_MODEL, {}),  # quantize_static(calibrate_method="auto"): chosen by the model's output
]


def log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


# ----------------------------------------------------------------------------------------------
# models


def build_cnn(size: int, width: int, seed: int) -> Any:
    from support.graphs import GraphBuilder, tensor

    g = GraphBuilder(seed)
    x = g.conv("X", 3, width)
    x = g.basic_block(x, width, width, gain=0.5)
    x = g.basic_block(x, width, width, gain=0.5)
    x = g.node("MaxPool", [x], "pool", kernel_shape=[2, 2], strides=[2, 2])
    x = g.conv(x, width, 2 * width)
    x = g.basic_block(x, 2 * width, 2 * width, gain=0.5)
    x = g.basic_block(x, 2 * width, 2 * width, gain=0.5)
    x = g.node("MaxPool", [x], "pool", kernel_shape=[2, 2], strides=[2, 2])
    x = g.conv(x, 2 * width, 4 * width)
    x = g.basic_block(x, 4 * width, 4 * width, gain=0.5)
    x = g.node("GlobalAveragePool", [x], "gap")
    x = g.node("Flatten", [x], "flat", axis=1)
    w = (g.rng.standard_normal((10, 4 * width)) / math.sqrt(4 * width)).astype(np.float32)
    g.node(
        "Gemm",
        [x, g.const(w, prefix="fc"), g.const(np.zeros(10, np.float32), prefix="fcb")],
        output="Y",
        name="head",
        transB=1,
    )
    return g.model("cnn", [tensor("X", [1, 3, size, size])], [tensor("Y", [1, 10])])


def outlier_channels(dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(channel indices, signed magnitudes 50..100) of the residual stream's outlier channels."""
    rng = np.random.default_rng(seed + 1000)
    k = max(2, dim // 16)
    return rng.choice(dim, k, replace=False), rng.uniform(50, 100, k) * rng.choice([-1.0, 1.0], k)


def build_transformer(seq: int, dim: int, ff: int, layers: int, seed: int) -> Any:
    from support.graphs import GraphBuilder, tensor

    g = GraphBuilder(seed)
    ch, _ = outlier_channels(dim, seed)
    # LN outputs carry the outlier channels (~50-100x): their weight rows are scaled down so that
    # projections stay O(1), as in trained LLMs, without removing the outliers' contribution.
    rows = np.ones(dim)
    rows[ch] = 0.1
    inv_sqrt = g.const(np.array(1 / math.sqrt(dim), np.float32), prefix="s")
    sqrt2, one, half = (g.const(np.array(v, np.float32), prefix="k") for v in (math.sqrt(2), 1.0, 0.5))
    x = "X"
    for _ in range(layers):
        h = g.layernorm(x, dim)
        q, k, v = (g.linear(h, dim, dim, rows=rows) for _ in range(3))
        kt = g.node("Transpose", [k], "kt", perm=[0, 2, 1])
        scores = g.node("Mul", [g.node("MatMul", [q, kt], "scores"), inv_sqrt], "scaled")
        probs = g.node("Softmax", [scores], "probs", axis=-1)
        ctx = g.node("MatMul", [probs, v], "ctx")
        x = g.node("Add", [x, g.linear(ctx, dim, dim, gain=0.5)], "res")
        h = g.layernorm(x, dim)
        u = g.linear(h, dim, ff, rows=rows)
        erf = g.node("Erf", [g.node("Div", [u, sqrt2], "div")], "erf")
        gelu = g.node("Mul", [g.node("Mul", [u, g.node("Add", [erf, one], "erf1")], "mul"), half], "gelu")
        x = g.node("Add", [x, g.linear(gelu, ff, dim, gain=0.5)], "res")
    h = g.layernorm(x, dim)
    w = (g.rng.standard_normal((dim, dim)) / math.sqrt(dim) * rows[:, None]).astype(np.float32)
    g.node("MatMul", [h, g.const(w, prefix="head")], output="Y", name="head")
    return g.model("transformer", [tensor("X", [1, seq, dim])], [tensor("Y", [1, seq, dim])])


def cnn_inputs(n: int, size: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Smooth random images (low-frequency noise upsampled, plus fine noise), per-image contrast."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        coarse = rng.standard_normal((1, 3, size // 4, size // 4))
        img = np.repeat(np.repeat(coarse, 4, axis=2), 4, axis=3) + 0.3 * rng.standard_normal((1, 3, size, size))
        out.append({"X": (img * rng.uniform(0.5, 1.5) + rng.normal(0, 0.2)).astype(np.float32)})
    return out


def transformer_inputs(n: int, seq: int, dim: int, seed: int, model_seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    ch, mag = outlier_channels(dim, model_seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((1, seq, dim))
        x[..., ch] = mag * (1 + 0.3 * rng.standard_normal((1, seq, len(ch))))
        out.append({"X": x.astype(np.float32)})
    return out


# ----------------------------------------------------------------------------------------------
# running


def session(path: str) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run_all(path: str, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    sess = session(path)
    return np.concatenate([np.concatenate([o.ravel() for o in sess.run(None, f)]) for f in feeds]).astype(np.float64)


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((ref - got) ** 2))
    signal = float(np.sum(ref**2))
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def as_ranges(td: Any) -> Any:
    """Any TensorsData -> a MinMax TensorsData of (lowest, highest) (what the quantizer reads)."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

    out = {}
    for name, d in td.data.items():
        if not hasattr(d, "lowest"):
            raise ValueError("no ranges (lowest/highest): this method's results are not int8 ranges")
        out[name] = TensorData(
            lowest=np.asarray(d.lowest).reshape(-1)[:1].astype(np.float32).reshape(()),
            highest=np.asarray(d.highest).reshape(-1)[:1].astype(np.float32).reshape(()),
        )
    return TensorsData(CalibrationMethod.MinMax, out)


def quantize(model_path: str, out_path: str, ranges: Any, workdir: Path, symmetric: bool) -> str:
    """Quantize with the given ranges, no calibration. Returns how."""
    from onnxruntime.quantization import QuantFormat, QuantType

    import histocal

    kw = dict(
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        extra_options={"ActivationSymmetric": symmetric},
    )
    quiet = contextlib.redirect_stdout(io.StringIO())
    logging.disable(logging.WARNING)
    try:
        if "tensors_range" in inspect.signature(histocal.quantize_static).parameters:
            with quiet:
                histocal.quantize_static(model_path, out_path, tensors_range=ranges, **kw)
            return "histocal.quantize_static(tensors_range=)"
        import importlib

        from onnxruntime.quantization import CalibrationMethod

        from histocal.io.cache import save_tensors_data

        cache = workdir / "ranges.json"
        with contextlib.suppress(FileNotFoundError):
            cache.unlink()
        save_tensors_data(ranges, cache)
        ort_q = importlib.import_module("onnxruntime.quantization.quantize")
        with quiet:
            ort_q.quantize_static(
                model_path,
                out_path,
                None,
                calibrate_method=CalibrationMethod.MinMax,
                calibration_cache_path=str(cache),
                **kw,
            )
        return "onnxruntime quantize_static + histocal.io.cache calibration cache"
    finally:
        logging.disable(logging.NOTSET)


class _Chosen(logging.Handler):
    """Catches histocal.selection's report: (samples, chosen label, seconds, table)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.args: tuple = ()

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("auto: output SQNR"):
            self.args = tuple(record.args or ())


def run_auto(
    model_path: str, out_path: str, calib: list[dict], symmetric: bool, selection_options: dict[str, Any]
) -> tuple[float, float, str]:
    """histocal.quantize_static(calibrate_method="auto") on the calibration inputs, with auto's
    selection options as method_options: (total seconds, seconds of the choice, chosen candidate)."""
    from onnxruntime.quantization import QuantFormat, QuantType

    import histocal

    chosen = _Chosen()
    selection_log = logging.getLogger("histocal.quantize.selection")
    root = logging.getLogger()
    saved = selection_log.level, root.level, selection_log.propagate
    selection_log.addHandler(chosen)
    selection_log.setLevel(logging.INFO)
    selection_log.propagate = False  # the table is logged below, once
    root.setLevel(logging.ERROR)  # onnxruntime's pre-processing advice, once per candidate
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            t0 = time.perf_counter()
            histocal.quantize_static(
                model_path,
                out_path,
                calib,
                calibrate_method="auto",
                quant_format=QuantFormat.QDQ,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
                extra_options={"ActivationSymmetric": symmetric},
                method_options=dict(selection_options),
            )
            total = time.perf_counter() - t0
    finally:
        selection_log.removeHandler(chosen)
        selection_log.setLevel(saved[0])
        root.setLevel(saved[1])
        selection_log.propagate = saved[2]
    if not chosen.args:
        raise ValueError("this histocal's quantize_static(calibrate_method='auto') chooses no candidate by the model")
    _, _, label, seconds, table = chosen.args
    log("    " + "\n    ".join(table.splitlines()))
    return total, float(seconds), str(label)


MODES = ("asymmetric", "symmetric")


@dataclass
class Row:
    model: str
    label: str
    mode: str
    compute_s: float | None = None
    quantize_s: float | None = None
    sqnr: float | None = None
    note: str = ""
    chosen: str = ""  # auto (model-level): the candidate it chose
    select_s: float | None = None  # auto (model-level): time of the choice itself


@dataclass
class ModelRun:
    name: str
    desc: str
    tensors: int = 0
    collect_s: float = 0.0
    float_sqnr_note: str = ""
    rows: list[Row] = field(default_factory=list)
    how: str = ""


def collect_state(model_path: str, feeds: list[dict], workdir: Path) -> tuple[Any, float]:
    from onnxruntime.quantization import CalibrationMethod

    import histocal

    cal = histocal.create_calibrator(
        model_path,
        augmented_model_path=str(workdir / "augmented.onnx"),
        calibrate_method=CalibrationMethod.Entropy,
        extra_options={"CollectionMode": "streaming"},
    )
    t0 = time.perf_counter()
    cal.collect_data(feeds)
    elapsed = time.perf_counter() - t0
    return cal.state, elapsed


def bench_model(
    name: str,
    desc: str,
    model: Any,
    calib: list[dict],
    held: list[dict],
    workdir: Path,
    methods: list[tuple[str, str, dict]],
    auto_options: dict[str, Any],
) -> ModelRun:
    import onnx

    run = ModelRun(name, desc)
    path = str(workdir / f"{name}.onnx")
    onnx.save(model, path)
    ref = run_all(path, held)
    state, run.collect_s = collect_state(path, calib, workdir)
    run.tensors = len(state.names)
    log(f"{name}: {run.tensors} tensors, collected {len(calib)} inputs in {run.collect_s:.2f} s")
    for mode, (label, method, options) in ((m, x) for m in MODES for x in methods):
        row = Row(name, label, mode)
        run.rows.append(row)
        symmetric = mode == "symmetric"
        if "symmetric" in options:
            options = {**options, "symmetric": symmetric}
        if method == AUTO_MODEL:
            qpath = str(workdir / f"{name}.q.onnx")
            try:
                row.compute_s, row.select_s, row.chosen = run_auto(path, qpath, calib, symmetric, auto_options)
            except (TypeError, ValueError) as exc:  # an older histocal without the model-level choice
                row.note = f"not available: {str(exc)[:90]}"
                log(f"  {mode[:4]} {label:18s} {row.note}")
                continue
            row.sqnr = sqnr_db(ref, run_all(qpath, held))
            log(
                f"  {mode[:4]} {label:18s} quantize_static(auto) {row.compute_s:.2f} s (choice {row.select_s:.2f} s): "
                f"{row.chosen}, SQNR {row.sqnr:.2f} dB"
            )
            continue
        try:
            t0 = time.perf_counter()
            td = state.compute(method, **options)
            row.compute_s = time.perf_counter() - t0
        except ValueError as exc:
            row.note = f"not available: {str(exc)[:90]}"
            log(f"  {mode[:4]} {label:18s} {row.note}")
            continue
        if method == "distribution":
            # ORT uses Distribution's avg/std for float8 scales only; its lowest/highest are just the
            # histogram's edges (+-max|x|, also for Relu outputs), not a calibrated int8 range.
            row.note = "n/a for int8: ORT uses Distribution (avg/std) for float8 only"
            log(f"  {mode[:4]} {label:18s} compute {row.compute_s:.3f} s, {row.note}")
            continue
        ranges = as_ranges(td)
        qpath = str(workdir / f"{name}.q.onnx")
        t0 = time.perf_counter()
        run.how = quantize(path, qpath, ranges, workdir, symmetric)
        row.quantize_s = time.perf_counter() - t0
        row.sqnr = sqnr_db(ref, run_all(qpath, held))
        log(
            f"  {mode[:4]} {label:18s} compute {row.compute_s:.3f} s, quantize {row.quantize_s:.2f} s, SQNR {row.sqnr:.2f} dB"
        )
    return run


# ----------------------------------------------------------------------------------------------
# report


def machine_info() -> list[str]:
    import onnxruntime

    import histocal

    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or "unknown CPU"
    return [
        f"{cpu}, {os.cpu_count()} logical CPUs; Python {platform.python_version()}, numpy {np.__version__}, "
        f"onnxruntime {onnxruntime.__version__}, histocal {histocal.__version__} "
        f"({histocal.get_num_threads()} threads)"
    ]


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def report(runs: list[ModelRun], command: str, args: argparse.Namespace, elapsed: float) -> str:
    md = [
        "## Calibration methods: int8 QDQ output SQNR",
        "",
        "Command (from the repository root):",
        "",
        "```",
        command,
        "```",
        "",
    ]
    md += [f"- {line}" for line in machine_info()]
    md += [
        f"- {(len(runs) and runs[0].how) or '-'}; QDQ, activations and weights QInt8 (per tensor), "
        f"{args.calib} calibration inputs, {args.held} held-back inputs (seeds {args.seed} / {args.seed + 1}); "
        f"wall time {elapsed:.0f} s"
    ]
    for r in runs:
        md.append(
            f"- `{r.name}`: {r.desc}; {r.tensors} calibrated tensors; streaming state collected in {r.collect_s:.2f} s"
        )
    md += [
        "",
        "SQNR of the model output vs the float model on the held-back inputs (dB, higher is better), with "
        'onnxruntime\'s default asymmetric activations (asym) and with `extra_options={"ActivationSymmetric": '
        "True}` (sym; mse and auto then search symmetric ranges). compute = `state.compute(method)` for all "
        "tensors (asym run). Best per column in bold.",
        "",
    ]
    names = [r.name for r in runs]
    md.append("| method | " + " | ".join(f"{n} asym (dB) | {n} sym (dB) | {n} compute (s)" for n in names) + " |")
    md.append("|---|" + "---:|---:|---:|" * len(names))
    labels = [m[0] for m in METHODS if any(row.label == m[0] for r in runs for row in r.rows)]
    best = {
        (r.name, mode): max((row.sqnr for row in r.rows if row.sqnr is not None and row.mode == mode), default=None)
        for r in runs
        for mode in MODES
    }
    notes = []
    for label in labels:
        cells = []
        for r in runs:
            for mode in MODES:
                row = next((x for x in r.rows if x.label == label and x.mode == mode), None)
                if row is None:
                    cells.append("-")
                    continue
                s = fmt(row.sqnr, ".2f")
                if row.sqnr is not None and row.sqnr == best[(r.name, mode)]:
                    s = f"**{s}**"
                if row.note:
                    s = "n/a" if row.sqnr is None else s
                    notes.append(f"- {label}: {row.note}")
                cells.append(s)
            row = next((x for x in r.rows if x.label == label and x.mode == MODES[0]), None)
            cells.append(fmt(row.compute_s if row else None, ".3f"))
        md.append(f"| {label} | " + " | ".join(cells) + " |")
    gaps = []
    for r in runs:
        for mode in MODES:
            auto = next((x.sqnr for x in r.rows if x.label == "auto" and x.mode == mode), None)
            single = [x for x in r.rows if x.sqnr is not None and x.mode == mode and not x.label.startswith("auto")]
            if auto is not None and single:
                top = max(single, key=lambda x: x.sqnr)
                gaps.append(f"{r.name} {mode[:4]} {auto - top.sqnr:+.2f} dB (vs {top.label})")
    if gaps:
        md += ["", "auto minus the best single method, per column: " + "; ".join(gaps) + "."]
    auto_rows = [row for r in runs for row in r.rows if row.label == "auto" and row.chosen]
    if auto_rows:
        choices = "; ".join(
            f"{row.model} {row.mode[:4]}: {row.chosen} ({row.compute_s:.2f} s, choice {row.select_s:.2f} s)"
            for row in auto_rows
        )
        notes.append(
            '- auto: `histocal.quantize_static(calibrate_method="auto")` with the calibration inputs as the reader: '
            "one streaming calibration pass that sets the first 16 inputs aside (each in one of 2 folds, by "
            "position) and collects the rest into one state, then one state per fold; each fold's 8 inputs are "
            "scored with every distinct candidate (per-tensor estimate and every single method above) computed "
            "from all the other data (the rest merged with the other fold), quantized and run; the best pooled "
            "(cross-validated) output SQNR wins, with its ranges from all the data merged; the held-back inputs "
            "play no part in the choice. Its compute column is the whole quantize_static call. "
            f"Chosen (total time, of which the choice): {choices}"
        )
    if notes:
        md += ["", *sorted(set(notes))]
    md += [
        "",
        "Note: with asymmetric activations onnxruntime's QDQ quantizer removes Relu/Clip nodes "
        "(`QDQRemovableActivation`: unless `ActivationSymmetric` or `QDQKeepRemovableActivations` is set) "
        "and lets the Relu output's range clip the producer's output instead. A range whose low is "
        "negative on a Relu output (kl's `(-t, t)`, pow2 int8's `(-128 s, 127 s)`) then lets negative "
        "values through: that, not the ranges' precision, is why those rows collapse in the asym columns "
        "of models with Relu.",
    ]
    return "\n".join(md) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller models, 4 + 4 inputs (smoke test)")
    ap.add_argument("--models", nargs="+", choices=["cnn", "transformer"], default=["cnn", "transformer"])
    ap.add_argument("--methods", nargs="+", metavar="LABEL", help="only these method labels (e.g. mse kl auto)")
    ap.add_argument("--calib", type=int, default=None, help="calibration inputs per model (default 32; --quick 4)")
    ap.add_argument("--held", type=int, default=None, help="held-back inputs per model (default 32; --quick 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--auto-options",
        type=json.loads,
        default={},
        metavar="JSON",
        help="auto's selection options, e.g. '{\"folds\": 4, \"eval_samples\": 32}' (default: the library's)",
    )
    ap.add_argument("--out", help="also write the markdown report to this file")
    args = ap.parse_args(argv)
    args.calib = args.calib or (4 if args.quick else 32)
    args.held = args.held or (4 if args.quick else 32)
    return args


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    command = "python3 " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__), *argv])
    methods = [m for m in METHODS if not args.methods or m[0] in args.methods or m[1] in args.methods]
    started = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_methods.") as tmp:
        workdir = Path(tmp)
        if "cnn" in args.models:
            size, width = (16, 8) if args.quick else (32, 16)
            runs.append(
                bench_model(
                    "cnn",
                    f"ResNet-like CNN, input 1x3x{size}x{size}, widths {width}/{2 * width}/{4 * width}",
                    build_cnn(size, width, args.seed),
                    cnn_inputs(args.calib, size, args.seed),
                    cnn_inputs(args.held, size, args.seed + 1),
                    workdir,
                    methods,
                    args.auto_options,
                )
            )
        if "transformer" in args.models:
            seq, dim, ff, layers = (16, 32, 64, 1) if args.quick else (32, 64, 256, 2)
            ch, mag = outlier_channels(dim, args.seed)
            runs.append(
                bench_model(
                    "transformer",
                    f"{layers} pre-LN encoder blocks, input 1x{seq}x{dim}, FF {ff}, outlier channels {sorted(ch.tolist())} "
                    f"at {', '.join(f'{abs(m):.0f}' for m in mag)}x",
                    build_transformer(seq, dim, ff, layers, args.seed),
                    transformer_inputs(args.calib, seq, dim, args.seed, args.seed),
                    transformer_inputs(args.held, seq, dim, args.seed + 1, args.seed),
                    workdir,
                    methods,
                    args.auto_options,
                )
            )
    text = report(runs, command, args, time.perf_counter() - started)
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text)
        log(f"written to {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])

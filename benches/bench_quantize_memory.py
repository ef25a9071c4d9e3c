#!/usr/bin/env python3
"""Peak memory and ranges of onnxruntime's ``quantize_static`` with a read-once reader:
onnxruntime's own calibrators vs histocal's under ``patch_onnxruntime()``.

ORT's ``quantize_static`` hands its calibrator the user's ``CalibrationDataReader``; a reader
without ``rewind()`` can be read only once. histocal's default (``auto``) mode then keeps each
batch's outputs while they fit its memory budget and gives ORT's exact ranges in one inference
pass; beyond the budget it collects in streaming mode. This script runs, each in its own
subprocess (so ``ru_maxrss`` is the run's own):

* ``ort``: ORT's ``quantize_static``, unpatched
* ``histocal``: the same call under ``histocal.patch_onnxruntime()``, default memory budget
* ``histocal-over``: the same with ``HISTOCAL_MEMORY_BUDGET`` set below the outputs' size
  (``--small-budget``): streaming, bounded memory, ranges close to ORT's but not identical
* ``histocal-rewind-over``: the same budget with a reader that has ``rewind()``: exact mode
  runs again the batches that did not fit, in bounded memory, with ORT's ranges

and reports per run the wall time of ``quantize_static``, the peak RSS and the RSS before the
call (imports and model loaded), and whether the ranges (captured from the calibrator's
``compute_data``) are identical to ORT's, bit for bit, compared as maps.

The model is bench_calibrate.py's CNN (203 calibrated tensors at 1x3x224x224) or ``--model``;
inputs come from bench_calibrate.py's synthetic reader, made on demand (never kept).

Usage:
    python3 benches/bench_quantize_memory.py --samples 8 32 --out benches/RESULTS_quantize_memory.md
    python3 benches/bench_quantize_memory.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_calibrate as bc
import numpy as np

IMPLS = ("ort", "histocal", "histocal-over", "histocal-rewind-over")


class ReadOnceReader:
    """bench_calibrate's synthetic samples through ``get_next`` only (no ``rewind``)."""

    def __init__(self, specs: list, samples: int, seed: int) -> None:
        self._reader = bc.SyntheticReader(specs, samples, seed)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return self._reader.get_next()


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import importlib

    import onnxruntime.quantization as oq
    from onnxruntime.quantization import CalibrationMethod

    import histocal

    quantize_module = importlib.import_module("onnxruntime.quantization.quantize")
    ranges: list = []
    if spec["impl"] != "ort":
        histocal.patch_onnxruntime()
    create = quantize_module.create_calibrator

    def recording(*args: Any, **kwargs: Any) -> Any:
        cal = create(*args, **kwargs)
        compute = cal.compute_data

        def recorded() -> Any:
            ranges.append(compute())
            return ranges[-1]

        cal.compute_data = recorded
        return cal

    quantize_module.create_calibrator = recording
    specs = bc.input_specs(spec["model"], spec["dim"])
    reader: Any = ReadOnceReader(specs, spec["samples"], spec["seed"])
    if spec["impl"] == "histocal-rewind-over":
        reader = bc.SyntheticReader(specs, spec["samples"], spec["seed"])
    rss_before = bc.current_rss_mb()
    t0 = time.perf_counter()
    oq.quantize_static(
        spec["model"],
        spec["output"],
        reader,
        calibrate_method=CalibrationMethod[spec["method"]],
    )
    seconds = time.perf_counter() - t0
    peak = bc.peak_rss_mb()
    with open(spec["ranges"], "wb") as f:
        pickle.dump(bc.ranges_of(ranges[0].data), f)
    return {"seconds": seconds, "peak_rss_mb": peak, "rss_before_mb": rss_before}


def run_child(spec: dict[str, Any], env_extra: dict[str, str]) -> dict[str, Any]:
    env = dict(os.environ, HISTOCAL_PROGRESS="0", PYTHONUNBUFFERED="1", **env_extra)
    if "HISTOCAL_MEMORY_BUDGET" not in env_extra:
        env.pop("HISTOCAL_MEMORY_BUDGET", None)
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            out = json.loads(line[len("RESULT ") :])
            out["warned_streaming"] = "streaming mode" in proc.stderr
            return out
    raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")


def identical(ref: dict, got: dict) -> tuple[int, int]:
    """(tensors whose ranges equal ORT's bit for bit, tensors compared); the key sets must match."""
    assert set(ref) == set(got), "other tensors than ORT's"
    same = sum(
        all(
            np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b, equal_nan=True)
            for a, b in zip(ref[k], got[k])
        )
        for k in ref
    )
    return same, len(ref)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--methods", nargs="+", default=["Percentile", "Entropy"])
    ap.add_argument(
        "--impls",
        nargs="+",
        default=list(IMPLS),
        choices=IMPLS,
        help="runs (ort, when given, runs first: the reference of the ranges)",
    )
    ap.add_argument("--small-budget", default="64M", help="HISTOCAL_MEMORY_BUDGET of the histocal-over runs")
    ap.add_argument("--model", help="an ONNX model instead of the built-in CNN")
    ap.add_argument("--dim", type=int, default=1, help="value of symbolic input dims (--model)")
    ap.add_argument("--size", type=int, default=224, help="built-in CNN input size")
    ap.add_argument("--width", type=int, default=32, help="built-in CNN base width (as bench_calibrate.py)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="smoke test: small CNN, 2 samples")
    ap.add_argument("--out", help="also write the results (markdown) here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return
    command = "python3 " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__), *argv])
    load_start = bc.loadavg()
    work = Path(tempfile.mkdtemp(prefix="bench_quantize_memory."))
    if args.model:
        model = os.path.abspath(args.model)
        desc = f"`{args.model}`: " + bc.describe_model(model)
    else:
        import onnx

        depth, width, size = ((1, 1, 1, 1), 8, 32) if args.quick else ((5, 8, 14, 6), args.width, args.size)
        model = str(work / "cnn.onnx")
        onnx.save(bc.build_cnn(size, depth, width, args.seed), model)
        desc = f"built-in CNN (input 1x3x{size}x{size}): " + bc.describe_model(model)
    samples = [2] if args.quick else args.samples
    rows = [
        "| method | samples | impl | quantize_static | RSS before | peak RSS | peak - before | ranges identical to ORT's |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for method in args.methods:
        for n in samples:
            ref = None
            impls = ["ort", *[i for i in args.impls if i != "ort"]] if "ort" in args.impls else args.impls
            for impl in impls:
                spec = {
                    "impl": impl,
                    "model": model,
                    "dim": args.dim,
                    "samples": n,
                    "seed": args.seed,
                    "method": method,
                    "output": str(work / f"{impl}.onnx"),
                    "ranges": str(work / f"{impl}.pkl"),
                }
                env = {"HISTOCAL_MEMORY_BUDGET": args.small_budget} if impl.endswith("-over") else {}
                r = run_child(spec, env)
                with open(spec["ranges"], "rb") as f:
                    got = pickle.load(f)
                if impl == "ort":
                    ref, verdict = got, "(reference)"
                elif ref is None:  # ORT not run (e.g. too many samples to keep them all)
                    verdict = "(not compared)" + (" (streaming, warned)" if r["warned_streaming"] else "")
                else:
                    same, total = identical(ref, got)
                    verdict = f"{same} of {total}" + (" (streaming, warned)" if r["warned_streaming"] else "")
                line = (
                    f"| {method} | {n} | {impl} | {r['seconds']:.2f} s | {r['rss_before_mb']:.0f} MB | "
                    f"{r['peak_rss_mb']:.0f} MB | {r['peak_rss_mb'] - r['rss_before_mb']:.0f} MB | {verdict} |"
                )
                rows.append(line)
                print(line, file=sys.stderr, flush=True)
    md = [
        "## quantize_static with a read-once reader: onnxruntime vs histocal (patched)",
        "",
        f"Command: `{command}`",
        "",
        f"Model: {desc}",
        "",
        *[f"Machine: {m}" for m in bc.machine_info()],
        f"Load average: {load_start} at start, {bc.loadavg()} at end; histocal-over and histocal-rewind-over: "
        f"HISTOCAL_MEMORY_BUDGET={args.small_budget}.",
        "",
        *rows,
    ]
    text = "\n".join(md) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    import shutil

    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])

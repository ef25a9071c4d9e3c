"""histocal's calibrators in streaming mode: bit-identical whatever the batching, order and
number of collect_data calls, and close to exact mode (bounds measured below, STREAMING_BOUNDS).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnxruntime.quantization.calibrate import TensorsData
from support import models
from support.calibrator_runs import DIST, ENT, PCT, assert_tensors_same, run_histocal, split

STREAM_CONFIGS = {
    "entropy-2048": (ENT, {"num_bins": 2048, "num_quantized_bins": 128}),
    "entropy-128": (ENT, {}),
    "percentile-sym": (PCT, {"symmetric": True}),
    "percentile-nonsym": (PCT, {"symmetric": False}),
    "percentile-sym-99.9": (PCT, {"symmetric": True, "percentile": 99.9}),
    "distribution-same": (DIST, {}),
    "distribution-p3": (DIST, {"scenario": "p3"}),
}


def _samples(model, n=8, seed=11):
    if model == "cnn":
        return [{"X": f["X"][i : i + 1]} for f in models.cnn_feeds(1, batch=n, seed=seed) for i in range(n)]
    feed = models.transformer_feeds([5], batch=n, seed=seed)[0]
    return [{k: v[i : i + 1] for k, v in feed.items()} for i in range(n)]


def _batched(samples, size):
    return [
        {k: np.concatenate([s[k] for s in samples[i : i + size]]) for k in samples[0]}
        for i in range(0, len(samples), size)
    ]


@pytest.mark.parametrize("model", ["cnn", "transformer"])
@pytest.mark.parametrize("cfg", list(STREAM_CONFIGS))
def test_streaming_independent_of_batching_order_and_calls(paths, tmp_path, model, cfg):
    method, opts = STREAM_CONFIGS[cfg]
    samples = _samples(model)
    base = run_histocal(paths[model], method, opts, [_batched(samples, 8)], tmp_path / "a.onnx", mode="streaming")
    shuffled = list(samples)
    random.Random(3).shuffle(shuffled)
    variants = {
        "2x4": [_batched(samples, 4)],
        "8x1": [_batched(samples, 1)],
        "4x2 shuffled": [_batched(shuffled, 2)],
        "3 calls": split(_batched(shuffled, 1), [3, 1, 4]),
        "2 calls, rewind reader": split(_batched(samples, 2), [2, 2]),
    }
    for name, chunks in variants.items():
        form = "rewind" if "rewind" in name else "once" if "shuffled" in name else "list"
        ours = run_histocal(paths[model], method, opts, chunks, tmp_path / "b.onnx", form, mode="streaming")
        assert_tensors_same(base, ours, f"streaming {name}")


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_streaming_batch_split_property(paths, tmp_path_factory, data):
    """Any split of the same samples into batches and calls, in any order: identical results."""
    method, opts = data.draw(st.sampled_from(list(STREAM_CONFIGS.values())))
    samples = _samples("cnn", n=6, seed=21)
    tmp = tmp_path_factory.mktemp("prop")
    base = run_histocal(paths["cnn"], method, opts, [_batched(samples, 6)], tmp / "a.onnx", mode="streaming")
    order = data.draw(st.permutations(range(6)))
    perm = [samples[i] for i in order]
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=6).filter(lambda s: sum(s) >= 6))
    batches, i = [], 0
    for s in sizes:
        if i < 6:
            batches.extend(_batched(perm[i : i + s], s))
            i += s
    cut = data.draw(st.integers(0, len(batches)))
    chunks = [c for c in (batches[:cut], batches[cut:]) if c]
    ours = run_histocal(paths["cnn"], method, opts, chunks, tmp / "b.onnx", mode="streaming")
    assert_tensors_same(base, ours, f"sizes={sizes} order={order} cut={cut}")


def closeness(exact: TensorsData, stream: TensorsData) -> dict[str, dict[str, float]]:
    """Per tensor and quantity, |streaming - exact| / (hi_e - lo_e), the exact range width:
    ``range`` = max over lowest and highest; Distribution also ``avg`` and ``std``."""
    out = {}
    for name, e in exact.data.items():
        s = stream.data[name]
        width = float(e.highest) - float(e.lowest)
        if not width > 0:
            continue
        d = {"range": max(abs(float(s.lowest) - float(e.lowest)), abs(float(s.highest) - float(e.highest))) / width}
        if hasattr(e, "avg"):
            d["avg"] = abs(float(s.avg) - float(e.avg)) / width
            d["std"] = abs(float(s.std) - float(e.std)) / width
        out[name] = d
    return out


# Bounds on |streaming - exact| / (exact range width), streaming_bins=16384, over every tensor of
# the CNN and the transformer (closeness_data; deterministic). Measured maxima (numpy 2.4.6,
# ORT 1.31.1, AVX-512 machine):
#   entropy 2048/128: 0.0351 (cnn/conv1): the KL minimum moves to a nearby candidate of a flat
#                     KL curve; entropy 128/128: 0 (one candidate, the min/max);
#   percentile 99.999 sym/non-sym: 0; sym 99.9: 3.29e-4 (1.35 ORT bins: the |x| histogram spans half the width);
#                     non-sym 99: 9.39e-4 (1.92 ORT bins; 1 bin = 1/2048 of the width = 4.9e-4);
#   distribution: lowest/highest 0 (exact min/max); avg 5.3e-6, std 1.02e-5.
STREAMING_BOUNDS = {
    "entropy-2048": {"range": 0.05},
    "entropy-128": {"range": 0.0},
    "percentile-sym": {"range": 1.2e-3},
    "percentile-nonsym": {"range": 1.2e-3},
    "percentile-sym-99.9": {"range": 1.2e-3},
    "percentile-nonsym-99": {"range": 1.2e-3},
    "distribution-same": {"range": 0.0, "avg": 2e-5, "std": 2e-5},
    "distribution-p3": {"range": 0.0, "avg": 2e-5, "std": 2e-5},
}
STREAM_CONFIGS["percentile-nonsym-99"] = (PCT, {"symmetric": False, "percentile": 99.0})


@pytest.fixture(scope="module")
def closeness_data():
    return {
        "cnn": [models.cnn_feeds(8, batch=16, seed=31)],
        "transformer": [models.transformer_feeds([16] * 8, batch=8, seed=32)],
    }


@pytest.mark.parametrize("cfg", list(STREAMING_BOUNDS))
def test_streaming_close_to_exact(paths, tmp_path, closeness_data, cfg):
    method, opts = STREAM_CONFIGS[cfg]
    worst: dict[str, tuple[float, str]] = {}
    for model, chunks in closeness_data.items():
        exact = run_histocal(paths[model], method, opts, chunks, tmp_path / "e.onnx", mode="exact")
        stream = run_histocal(paths[model], method, opts, chunks, tmp_path / "s.onnx", mode="streaming")
        for name, d in closeness(exact, stream).items():
            for q, v in d.items():
                if v >= worst.get(q, (-1.0, ""))[0]:
                    worst[q] = (v, f"{model}/{name}")
    print(f"\n{cfg}: " + ", ".join(f"{q} max {v:.3g} at {at}" for q, (v, at) in worst.items()))
    for q, bound in STREAMING_BOUNDS[cfg].items():
        v, at = worst[q]
        assert v <= bound, f"{cfg}: {q} of {at} differs by {v:.4g} of the range width (bound {bound})"

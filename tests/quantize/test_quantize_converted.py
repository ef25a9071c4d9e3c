"""quantize with ranges that fit the model onnxruntime quantizes.

ORT's quantize_static converts a model whose opset cannot express the quantization (16-bit
types need opset 21) before it calibrates; the conversion adds tensors (opset 11's Softmax on a
non-last axis becomes Flatten, Softmax ``<output>_intermediate``, Reshape). histocal calibrates
that converted model too, so its quantized model is ORT's, byte for byte; ranges that do not fit
(another model's, or the unconverted model's) are refused before ORT runs, naming their file.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import QuantType
from support import models
from support.calibrator_runs import DIST, ENT, MM, ORT_QUANTIZE, PCT, RewindReader
from support.graphs import GraphBuilder, tensor
from support.parity import quiet

import histocal
from histocal.cli import main


def softmax_classifier(opset: int = 11) -> onnx.ModelProto:
    """X[N,3,4] -MatMul-Relu-> Softmax over axis 1 (not the last) -> Y[N,3,6]."""
    g = GraphBuilder(3)
    g.const(g.rng.normal(0, 0.7, (4, 6)).astype(np.float32), "W")
    g.node("MatMul", ["X", "W"], output="logits", name="matmul")
    g.node("Relu", ["logits"], output="relu", name="relu")
    g.node("Softmax", ["relu"], output="Y", name="softmax", axis=1)
    return g.model("softmax_classifier", [tensor("X", ["N", 3, 4])], [tensor("Y", ["N", 3, 6])], opset)


FEEDS = [{"X": np.random.default_rng(i).normal(size=(2, 3, 4)).astype(np.float32)} for i in range(5)]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("converted") / "softmax11.onnx"
    onnx.save(softmax_classifier(), path.as_posix())
    return path


def ort_model(path, out, activation_type, method=MM, feeds=FEEDS) -> bytes:
    with quiet():
        ORT_QUANTIZE.quantize_static(
            path, out.as_posix(), RewindReader(feeds), calibrate_method=method, activation_type=activation_type
        )
    return out.read_bytes()


@pytest.mark.parametrize("method", [MM, ENT, PCT, DIST], ids=lambda m: m.name)
@pytest.mark.parametrize("activation_type", [QuantType.QInt16, QuantType.QUInt16], ids=lambda t: t.name)
def test_16bit_on_opset_11_is_orts_model(model_path, tmp_path, activation_type, method):
    expected = ort_model(model_path, tmp_path / "ort.onnx", activation_type, method)
    assert "Y_intermediate" in {n.output[0] for n in onnx.load_from_string(expected).graph.node}
    with quiet():
        histocal.quantize_static(
            model_path,
            tmp_path / "hc.onnx",
            RewindReader(FEEDS),
            calibrate_method=method,
            activation_type=activation_type,
        )
        # a ModelProto too (ORT converts it after a round trip through a file)
        histocal.quantize_static(
            softmax_classifier(),
            tmp_path / "proto.onnx",
            RewindReader(FEEDS),
            calibrate_method=method,
            activation_type=activation_type,
        )
    assert (tmp_path / "hc.onnx").read_bytes() == expected
    assert (tmp_path / "proto.onnx").read_bytes() == expected


def test_16bit_on_opset_11_histocal_methods_and_auto(model_path, tmp_path):
    # histocal's own methods calibrate the converted model too (no ORT model to compare with: the
    # quantized model runs and has the converted model's Softmax output quantized).
    for method in ("mse", "auto"):
        with quiet():
            histocal.quantize_static(
                model_path,
                tmp_path / f"{method}.onnx",
                FEEDS,
                calibrate_method=method,
                activation_type=QuantType.QInt16,
            )
        names = {
            n.input[0] for n in onnx.load(str(tmp_path / f"{method}.onnx")).graph.node if n.op_type == "QuantizeLinear"
        }
        assert "Y_intermediate" in names, method


def test_cli_16bit_on_opset_11_is_orts_model(model_path, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for i, feed in enumerate(FEEDS):
        np.save(data / f"{i}.npy", feed["X"])
    expected = ort_model(model_path, tmp_path / "ort.onnx", QuantType.QInt16)
    out = tmp_path / "cli.onnx"
    argv = ["quantize", str(model_path), str(out), "--data", str(data), "--activation-type", "qint16", "--no-progress"]
    assert main(argv) == 0, capsys.readouterr().err
    assert out.read_bytes() == expected
    # The same with a cache: written on the first run, reused (and checked) on the second.
    cache = tmp_path / "c.json"
    assert main([*argv, "--cache", str(cache)]) == 0, capsys.readouterr().err
    assert "Y_intermediate" in histocal.io.cache.load_tensors_data(cache).data
    assert main([*argv[:2], str(tmp_path / "again.onnx"), "--cache", str(cache), "--activation-type", "qint16"]) == 0
    assert (tmp_path / "again.onnx").read_bytes() == expected


# ---------------------------------------------------------------------------------------------
# Ranges that do not fit the model


def _cache_of(path, out, feeds, **kw):
    with quiet():
        histocal.quantize_static(path, out.with_suffix(".q.onnx"), feeds, calibration_cache_path=out, **kw)
    return out


def test_ranges_of_the_unconverted_model_are_refused(model_path, tmp_path, capsys):
    # An int8 calibration's cache lacks the tensors opset 21 adds: refused, saying why.
    cache = _cache_of(model_path, tmp_path / "int8.json", FEEDS)
    with pytest.raises(
        ValueError, match=r"int8\.json: no range for the Softmax output\(s\) 'Y_intermediate'.*opset 11 to 21"
    ):
        histocal.quantize_static(
            model_path, tmp_path / "q.onnx", None, calibration_cache_path=cache, activation_type=QuantType.QInt16
        )
    out = tmp_path / "cli.onnx"
    code = main(["quantize", str(model_path), str(out), "--cache", str(cache), "--activation-type", "qint16"])
    err = capsys.readouterr().err
    assert code == 1 and "Y_intermediate" in err and str(cache) in err, err
    assert not out.exists()


@pytest.fixture(scope="module")
def transformer_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("other") / "transformer.onnx"
    onnx.save(models.transformer(), path.as_posix())
    return path


def test_cache_and_state_of_another_model_are_refused(model_path, transformer_path, tmp_path, capsys):
    cnn = tmp_path / "cnn.onnx"
    onnx.save(models.cnn(), cnn.as_posix())
    cache = _cache_of(cnn, tmp_path / "cnn.json", models.cnn_feeds(3))
    # Python: a cache hit and tensors_range
    with pytest.raises(
        ValueError, match=r"cnn\.json: ranges of \d+ of its \d+ tensors name no tensor of .*another model"
    ):
        histocal.quantize_static(transformer_path, tmp_path / "q.onnx", None, calibration_cache_path=cache)
    ranges = histocal.io.cache.load_tensors_data(cache)
    with pytest.raises(ValueError, match="tensors_range: ranges of .* another model"):
        histocal.quantize_static(transformer_path, tmp_path / "q.onnx", tensors_range=ranges)
    assert not (tmp_path / "q.onnx").exists()
    # CLI: --cache, and --state (its model fingerprint)
    state = tmp_path / "cnn.hcs"
    data = tmp_path / "data"
    data.mkdir()
    for i, feed in enumerate(models.cnn_feeds(3)):
        np.save(data / f"{i}.npy", feed["X"])
    assert main(["calibrate", str(cnn), "--data", str(data), "--method", "entropy", "--state", str(state)]) == 0
    capsys.readouterr()
    for source in (["--cache", str(cache)], ["--state", str(state)]):
        out = tmp_path / "cli.onnx"
        assert main(["quantize", str(transformer_path), str(out), *source]) == 1
        err = capsys.readouterr().err
        assert source[1] in err and "another model" in err, err
        assert "Only an existing tensor" not in err
        assert not out.exists()
    # the state's own model still quantizes from it
    assert main(["quantize", str(cnn), str(tmp_path / "own.onnx"), "--state", str(state)]) == 0


def test_state_of_the_converted_model_quantizes(model_path, tmp_path, capsys):
    # A state collected (Python) on the model ORT converts to is the model's own for that
    # quantization: accepted, and its minmax ranges give ORT's model.
    from histocal.quantize.ort import model_ort_quantizes

    converted = model_ort_quantizes(model_path, QuantType.QInt8, QuantType.QInt16)
    assert converted is not None
    path = tmp_path / "converted.onnx"
    onnx.save(converted, path.as_posix())
    calibrator = histocal.create_calibrator(path, calibrate_method=ENT, augmented_model_path=tmp_path / "aug.onnx")
    calibrator.collect_data(FEEDS)
    state = tmp_path / "converted.hcs"
    calibrator.save_state(state)
    expected = ort_model(model_path, tmp_path / "ort.onnx", QuantType.QInt16)
    out = tmp_path / "cli.onnx"
    argv = ["quantize", str(model_path), str(out), "--state", str(state), "--method", "minmax"]
    assert main([*argv, "--activation-type", "qint16"]) == 0, capsys.readouterr().err
    assert out.read_bytes() == expected
    # for int8 ORT does not convert: the converted model's state is another model's
    assert main(argv) == 1
    assert "a state of another model" in capsys.readouterr().err

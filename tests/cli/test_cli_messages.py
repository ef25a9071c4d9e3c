"""What the command line says: -vv's traceback, out-of-range integers named by their option,
--help's defaults, and onnxruntime's pre-processing advice (once, at normal verbosity)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from histocal.cli import main


@pytest.fixture(scope="module")
def constant_weights(tmp_path_factory):
    """Y = X @ W with W held in a Constant node (no initializer), and its data."""
    root = tmp_path_factory.mktemp("constant")
    w = np.random.default_rng(0).normal(size=(64, 64)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["W"], value=numpy_helper.from_array(w, "Wc")),
            helper.make_node("MatMul", ["X", "W"], ["Y"], name="matmul"),
        ],
        "constant_weights",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 64])],
    )
    model = root / "constant.onnx"
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)]), model.as_posix())
    data = root / "data"
    data.mkdir()
    for i in range(3):
        np.save(data / f"{i}.npy", np.random.default_rng(i).normal(size=(64,)).astype(np.float32))
    return model, data


def test_vv_prints_the_traceback(tmp_path, capsys, constant_weights):
    model, _ = constant_weights
    assert main(["-vv", "quantize", str(model), str(tmp_path / "q.onnx"), "--cache", str(tmp_path / "no.json")]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "CliError" in err, err
    assert err.rstrip().splitlines()[-1].startswith("histocal: error:")
    # without -vv: the one error line only
    assert main(["quantize", str(model), str(tmp_path / "q.onnx"), "--cache", str(tmp_path / "no.json")]) == 1
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "option,value,bound",
    [
        ("--num-bins", "99999999999999999999", "16777216"),
        ("--num-quantized-bins", "16777217", "16777216"),
        ("--streaming-bins", "99999999999999999999", "16777216"),
        ("--batch-size", "99999999999999999999", "9223372036854775807"),
    ],
)
def test_huge_integers_name_their_option(tmp_path, capsys, constant_weights, option, value, bound):
    model, data = constant_weights
    argv = ["calibrate", str(model), "--data", str(data), "--method", "entropy", "--cache", str(tmp_path / "c.json")]
    assert main([*argv, option, value]) == 2
    err = capsys.readouterr().err
    assert f"argument {option}: expected an integer in [1, {bound}], got {value}" in err, err
    assert "too big to convert" not in err
    assert not (tmp_path / "c.json").exists()


def test_quantize_help_says_the_method_default(capsys):
    assert main(["quantize", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "see below" not in out
    assert "(default: with --data minmax; with --cache or --state the method they were made with)" in out
    assert main(["recompute", "--help"]) == 0
    assert "see below" not in capsys.readouterr().out


def test_pre_process_advice_once_at_normal_verbosity(tmp_path, capsys, constant_weights):
    model, data = constant_weights
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(model), str(out), "--data", str(data)]) == 0
    err = capsys.readouterr().err
    assert err.count("histocal: warning: the model is not pre-processed") == 1, err
    assert "python -m onnxruntime.quantization.preprocess" in err and "Constant nodes" in err
    assert "Please consider" not in err
    # why it matters: the Constant-node weight stays float, the quantized model is larger
    assert out.stat().st_size > model.stat().st_size
    # auto quantizes many candidates: still said once; -q: not at all
    assert main(["quantize", str(model), str(tmp_path / "auto.onnx"), "--data", str(data), "--method", "auto"]) == 0
    assert capsys.readouterr().err.count("not pre-processed") == 1
    assert main(["-q", "quantize", str(model), str(tmp_path / "q2.onnx"), "--data", str(data)]) == 0
    assert "pre-processed" not in capsys.readouterr().err


def test_no_pre_process_advice_for_a_pre_processed_model(tmp_path, capsys, constant_weights):
    from onnxruntime.quantization.quant_utils import add_pre_process_metadata

    model, data = constant_weights
    proto = onnx.load(str(model))
    add_pre_process_metadata(proto)
    pre = tmp_path / "pre.onnx"
    onnx.save(proto, pre.as_posix())
    assert main(["quantize", str(pre), str(tmp_path / "q.onnx"), "--data", str(data)]) == 0
    assert "pre-processed" not in capsys.readouterr().err

"""diagnose and quantize on models with nothing to quantize, or NaN where a range is needed.

* Nothing quantizable (no operator onnxruntime quantizes): ``quantize`` works, and ``diagnose``
  and ``quantize --auto-exclude`` failed with exit 1 ("no QuantizeLinear/DequantizeLinear pairs");
  now diagnose reports "nothing quantizable" with exit 0 and --auto-exclude writes what
  ``quantize`` writes.
* All-NaN activations (MinMax's range is NaN) or NaN weights: onnxruntime's bare "scale issue"
  named no tensor; the error now names them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnxruntime.quantization.calibrate import CalibrationMethod
from support.graphs import GraphBuilder, tensor

import histocal
from histocal.cli import main
from histocal.diagnose import diagnose


def _save(g: GraphBuilder, folder: Path, name: str) -> Path:
    path = folder / f"{name}.onnx"
    onnx.save(g.model(name, [tensor("X", ["N", 8])], [tensor("Y", ["N", 8])], 17), path.as_posix())
    return path


@pytest.fixture
def work(tmp_path) -> dict[str, Path]:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(12):
        np.save(data / f"s{i:02d}.npy", np.random.default_rng(i).normal(size=(8,)).astype(np.float32))
    g = GraphBuilder()
    g.node("Cos", ["X"], output="c", name="cos")
    g.node("Sin", ["c"], output="Y", name="sin")
    out = {"root": tmp_path, "data": data, "trig": _save(g, tmp_path, "trig")}
    # log(-|x|) is NaN everywhere: the MatMul's input range is NaN under MinMax
    g = GraphBuilder()
    g.const(np.eye(8, dtype=np.float32), "W")
    g.const(np.array(-1, np.float32), "neg")
    g.node("Abs", ["X"], output="a", name="abs")
    g.node("Mul", ["a", "neg"], output="b", name="mul")
    g.node("Log", ["b"], output="l", name="log")
    g.node("MatMul", ["l", "W"], output="Y", name="matmul")
    out["nan_activations"] = _save(g, tmp_path, "nan_activations")
    g = GraphBuilder()
    g.const(np.full((8, 8), np.nan, np.float32), "W_nan")
    g.node("MatMul", ["X", "W_nan"], output="Y", name="matmul")
    out["nan_weights"] = _save(g, tmp_path, "nan_weights")
    return out


def _cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([*map(str, argv), "--no-progress"])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_diagnose_nothing_quantizable(work, capsys):
    rc, out, err = _cli(capsys, "diagnose", work["trig"], "--data", work["data"])
    assert rc == 0, err
    assert "nothing quantizable" in out and "0 quantized nodes" in out
    rc, out, err = _cli(capsys, "diagnose", work["trig"], "--data", work["data"], "--json")
    assert rc == 0, err
    assert '"quantized_nodes": 0' in out


def test_diagnose_api_nothing_quantizable(work):
    feeds = [{"X": np.random.default_rng(i).normal(size=(2, 8)).astype(np.float32)} for i in range(6)]
    d = diagnose(work["trig"], feeds, eval_samples=2)
    assert d.quantized_nodes == 0 and d.nodes_to_exclude == () and d.impacts == ()
    assert d.sqnr_db == d.sqnr_excluded_db
    assert "nothing quantizable" in d.summary()


def test_auto_exclude_nothing_quantizable_writes_what_quantize_writes(work, capsys):
    plain, auto = work["root"] / "plain.onnx", work["root"] / "auto.onnx"
    rc, out_plain, err = _cli(capsys, "quantize", work["trig"], plain, "--data", work["data"])
    assert rc == 0, err
    rc, out_auto, err = _cli(capsys, "quantize", work["trig"], auto, "--data", work["data"], "--auto-exclude")
    assert rc == 0, err
    assert out_auto.splitlines()[-1] == out_plain.splitlines()[-1].replace("plain.onnx", "auto.onnx")
    assert onnx.load(auto.as_posix()).graph == onnx.load(plain.as_posix()).graph


@pytest.mark.parametrize("command", ["quantize", "diagnose", "auto-exclude"])
def test_nan_activations_are_named(work, capsys, command):
    model, out = work["nan_activations"], work["root"] / "q.onnx"
    argv = {
        "quantize": ["quantize", model, out],
        "diagnose": ["diagnose", model],
        "auto-exclude": ["quantize", model, out, "--auto-exclude"],
    }[command]
    rc, _, err = _cli(capsys, *argv, "--data", work["data"])
    assert rc == 1
    assert "no finite range for 2 tensor(s)" in err and "'l' [nan, nan]" in err and "'Y' [nan, nan]" in err, err
    assert "scale issue" not in err
    assert not out.exists()


def test_nan_weights_are_named(work, capsys):
    out = work["root"] / "q.onnx"
    rc, _, err = _cli(capsys, "quantize", work["nan_weights"], out, "--data", work["data"], "--method", "percentile")
    assert rc == 1
    assert "'W_nan' (64 NaN, 0 inf)" in err, err
    assert not out.exists()


def _feeds() -> list[dict[str, np.ndarray]]:
    return [{"X": np.random.default_rng(i).normal(size=(2, 8)).astype(np.float32)} for i in range(4)]


def test_quantize_static_names_nan_activations(work):
    """histocal.quantize_static from Python: ORT's bare "scale issue" becomes an error naming the
    tensors whose (MinMax) range is NaN."""
    out = work["root"] / "q.onnx"
    with pytest.raises(ValueError, match=r"no finite range for 2 tensor\(s\)") as raised:
        histocal.quantize_static(work["nan_activations"], out, _feeds(), calibrate_method=CalibrationMethod.MinMax)
    assert "'l' [nan, nan]" in str(raised.value) and "'Y' [nan, nan]" in str(raised.value)
    assert not out.exists()


@pytest.mark.parametrize("given", ["path", "proto"])
def test_quantize_static_names_nan_weights(work, given):
    model = work["nan_weights"] if given == "path" else onnx.load(work["nan_weights"].as_posix())
    with pytest.raises(ValueError, match=r"'W_nan' \(64 NaN, 0 inf\)"):
        histocal.quantize_static(model, work["root"] / "q.onnx", _feeds(), calibrate_method="percentile")


@pytest.mark.parity
def test_onnxruntime_fails_there_naming_nothing(work):
    """What the errors above replace: ORT's own quantize_static on the NaN-activation model, even
    with the node reading them excluded (ORT computes a scale for every range it is given)."""
    from onnxruntime.quantization import quantize_static as ort_quantize_static

    feeds = iter(_feeds())

    class Reader:
        def get_next(self):
            return next(feeds, None)

    with pytest.raises(AssertionError, match="scale issue"):
        ort_quantize_static(
            work["nan_activations"].as_posix(), (work["root"] / "o.onnx").as_posix(), Reader(),
            nodes_to_exclude=["matmul"], calibrate_method=CalibrationMethod.MinMax,
        )  # fmt: skip

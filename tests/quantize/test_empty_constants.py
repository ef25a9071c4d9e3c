"""Models shaped as paddle2onnx exports them, through every route to onnxruntime's quantizer.

A text detector exported by paddle2onnx feeds its Resizes' ``roi`` and ``scales`` from Constant
nodes holding empty float tensors. They are calibrated (ORT calibrates every float tensor a node
reads) and never quantized, and their MinMax range is ``[inf, -inf]`` (no value at all), which ORT
turns into scale 1 without complaint. The CLI's default method refused such a model, and diagnose
refused it with every method (its MinMax from a state gave ``[nan, nan]``), while the Python API
and ORT quantized it: the routes checked ranges differently. Now one check, in
``quantize_with_ranges`` (every route), refuses only what ORT cannot quantize: a NaN range (ORT
fails on it whatever the tensor) and an infinite range end on a tensor ORT quantizes (an infinite
scale). Older exporters also list the weights as graph inputs; diagnose and ``--auto-exclude``
failed on those.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnxruntime.quantization.calibrate import TensorData, TensorsData
from support import models
from support.calibrator_runs import DIST, ENT, MM, ORT_CREATE, ORT_QUANTIZE, PCT, RewindReader
from support.parity import quiet

import histocal
from histocal.cli import main
from histocal.diagnose import diagnose

EMPTY = ("p2o.helper.constant.140", "p2o.helper.constant.141")
FEEDS = models.detector_feeds(12)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("detector")
    data = root / "data"
    data.mkdir()
    for i, feed in enumerate(FEEDS):
        np.save(data / f"{i:02d}.npy", feed["X"])
    out = {"root": root, "data": data}
    for name, proto in (
        ("det", models.paddle_detector()),
        ("det_inputs", models.paddle_detector(initializers_as_inputs=True)),
    ):
        out[name] = root / f"{name}.onnx"
        onnx.save(proto, out[name].as_posix())
    return out


def _ort_model(model: Path, out: Path, method) -> bytes:
    with quiet():
        ORT_QUANTIZE.quantize_static(model.as_posix(), out.as_posix(), RewindReader(FEEDS), calibrate_method=method)
    return out.read_bytes()


def _cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([*map(str, argv), "--no-progress"])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.mark.parity
@pytest.mark.parametrize("model", ["det", "det_inputs"])
def test_cli_default_method_quantizes_as_onnxruntime(work, tmp_path, capsys, model):
    expected = _ort_model(work[model], tmp_path / "ort.onnx", MM)
    rc, _, err = _cli(capsys, "quantize", work[model], tmp_path / "cli.onnx", "--data", work["data"])
    assert rc == 0, err
    assert (tmp_path / "cli.onnx").read_bytes() == expected
    assert not any(p.name.startswith(".cli.onnx.") for p in tmp_path.iterdir())  # no staging left


@pytest.mark.parity
@pytest.mark.parametrize("method", [MM, ENT, PCT, DIST], ids=lambda m: m.name)
def test_python_api_and_cli_each_method_as_onnxruntime(work, tmp_path, capsys, method):
    expected = _ort_model(work["det"], tmp_path / "ort.onnx", method)
    with quiet():
        histocal.quantize_static(work["det"], tmp_path / "api.onnx", RewindReader(FEEDS), calibrate_method=method)
    assert (tmp_path / "api.onnx").read_bytes() == expected
    cli_method = method.name.lower()
    rc, _, err = _cli(
        capsys, "quantize", work["det"], tmp_path / "cli.onnx", "--data", work["data"], "--method", cli_method
    )
    assert rc == 0, err
    assert (tmp_path / "cli.onnx").read_bytes() == expected


@pytest.mark.parity
def test_state_minmax_of_empty_tensors_is_orts(work):
    """MinMax computed from a streaming state equals ORT's MinMax calibrator, the empty constants'
    ``[inf, -inf]`` included (it was ``[nan, nan]``, which ORT cannot quantize with)."""
    with quiet():
        ort = ORT_CREATE(work["det"].as_posix(), calibrate_method=MM, augmented_model_path=str(work["root"] / "a.onnx"))
        ort.collect_data(RewindReader(FEEDS))
        expected = ort.compute_data()
        cal = histocal.create_calibrator(
            work["det"], calibrate_method=ENT, extra_options={"CollectionMode": "streaming"}
        )
        cal.collect_data(RewindReader(FEEDS))
    got = cal.state.compute("minmax")
    assert set(got.data) == set(expected.data)
    for name, td in expected.data.items():
        for a, b in zip(got.data[name].range_value, td.range_value, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=name)
    for name in EMPTY:
        assert [float(v[0]) for v in got.data[name].range_value] == [math.inf, -math.inf]


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile", "distribution", "mse"])
@pytest.mark.parametrize("model", ["det", "det_inputs"])
def test_diagnose_every_method(work, method, model):
    with quiet():
        d = diagnose(work[model], FEEDS, method=method, eval_samples=4)
    assert d.quantized_nodes > 0 and math.isfinite(d.sqnr_db)
    assert set(EMPTY) <= set(d.ranges.data)  # calibrated, and quantized around


@pytest.mark.parametrize("model", ["det", "det_inputs"])
@pytest.mark.parametrize("how", [("diagnose",), ("quantize", "--auto-exclude"), ("quantize", "--method", "auto")])
def test_cli_diagnose_auto_exclude_and_auto(work, tmp_path, capsys, model, how):
    command, *options = how
    argv = [command, work[model]] + ([tmp_path / "q.onnx"] if command == "quantize" else [])
    rc, _, err = _cli(capsys, *argv, "--data", work["data"], *options)
    assert rc == 0, err
    if command == "quantize":
        onnx.checker.check_model(onnx.load((tmp_path / "q.onnx").as_posix()))


# ---------------------------------------------------------------------------------------------
# The one range check: what ORT cannot quantize, refused on every route, naming the tensors


def _ranges(model: Path, **overrides: tuple[float, float]) -> TensorsData:
    """MinMax ranges of ``model`` on FEEDS, with some replaced."""
    with quiet():
        cal = histocal.create_calibrator(model, calibrate_method=MM)
        cal.collect_data(RewindReader(FEEDS))
        ranges = cal.compute_data()
    data = dict(ranges.data)
    for name, (lo, hi) in overrides.items():
        data[name] = TensorData(lowest=np.array([lo], np.float32), highest=np.array([hi], np.float32))
    return TensorsData(MM, data)


def test_infinite_range_of_a_quantized_tensor_is_refused(work, tmp_path):
    out = tmp_path / "q.onnx"
    out.write_bytes(b"the user's earlier file")
    with quiet(), pytest.raises(ValueError, match=r"no finite range for 1 quantized tensor\(s\): 'r1' \[-inf, 3\]"):
        histocal.quantize_static(work["det"], out, tensors_range=_ranges(work["det"], r1=(-math.inf, 3.0)))
    assert out.read_bytes() == b"the user's earlier file"  # ORT wrote beside it, not over it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.onnx"]


def test_infinite_range_of_a_tensor_not_quantized_is_orts_result(work, tmp_path):
    """ORT quantizes neither the empty constants nor the ``sizes`` input; an infinite range there
    gives ORT's model (the same as with the calibrated ranges: ORT never reads it)."""
    infinite = _ranges(work["det"], **{EMPTY[0]: (-math.inf, math.inf)})
    with quiet():
        histocal.quantize_static(work["det"], tmp_path / "a.onnx", tensors_range=_ranges(work["det"]))
        histocal.quantize_static(work["det"], tmp_path / "b.onnx", tensors_range=infinite)
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


def test_nan_range_is_refused_before_onnxruntime_runs(work, tmp_path, capsys):
    """ORT computes a scale for every tensor it is given a range for, quantized or not: a NaN
    range fails there ('scale issue', no tensor named), so it is refused first, on every route."""
    with pytest.raises(ValueError, match=rf"no finite range for 1 tensor\(s\): '{EMPTY[1]}' \[nan, nan\]"):
        histocal.quantize_static(
            work["det"], tmp_path / "q.onnx", tensors_range=_ranges(work["det"], **{EMPTY[1]: (math.nan, math.nan)})
        )
    assert not (tmp_path / "q.onnx").exists()
    cache = tmp_path / "nan.json"
    histocal.io.cache.save_tensors_data(_ranges(work["det"], **{EMPTY[1]: (math.nan, math.nan)}), cache)
    rc, _, err = _cli(capsys, "quantize", work["det"], tmp_path / "q.onnx", "--cache", cache)
    assert rc == 1 and f"'{EMPTY[1]}' [nan, nan]" in err, err
    assert not (tmp_path / "q.onnx").exists()

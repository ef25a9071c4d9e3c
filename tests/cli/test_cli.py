"""The histocal command line (histocal.cli): calibrate, quantize, inspect, recompute, demo.

Most runs call ``histocal.cli.main([...])`` in-process; a few run ``python -m histocal`` in a
subprocess to check the real entry point, exit codes and stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from onnxruntime.quantization import calibrate as ort_calibrate
from onnxruntime.quantization.calibrate import CalibrationMethod
from PIL import Image
from support import models

import histocal
from histocal.cli import main
from histocal.io.data import open_calibration_data

ENV = {**os.environ, "HISTOCAL_PROGRESS": "0"}


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "histocal", *map(str, args)],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=cwd,
        timeout=120,
    )


def calibrate_args(model, data, *options, method=None, cache=None, state=None) -> list[str]:
    """``histocal calibrate``'s arguments: the model, ``--data``, ``--method``, ``options``, ``--cache``, ``--state``."""
    args = ["calibrate", str(model), "--data", str(data)]
    args += ["--method", method] if method else []
    args += [str(o) for o in options]
    args += ["--cache", str(cache)] if cache else []
    return args + (["--state", str(state)] if state else [])


def files_in(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("histocal: error:")]


def assert_same_tensors_data(a, b) -> None:
    assert a.calibration_method == b.calibration_method
    assert set(a.data) == set(b.data)
    for name, ta in a.data.items():
        da, db = ta.to_dict(), b.data[name].to_dict()
        assert set(da) == set(db), name
        for key, va in da.items():
            if key == "CLS":
                continue
            va, vb = np.asarray(va), np.asarray(db[key])
            assert va.dtype == vb.dtype and va.shape == vb.shape, (name, key)
            assert np.array_equal(va, vb, equal_nan=True), (name, key)


# ---------------------------------------------------------------------------------------------
# Fixtures: a small CNN (X[N,3,8,8]) and a folder of each data kind


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(0)
    paths = {"root": root, "model": root / "cnn.onnx", "transformer": root / "transformer.onnx"}
    onnx.save(models.cnn(), paths["model"].as_posix())
    onnx.save(models.transformer(), paths["transformer"].as_posix())

    npy = paths["npy"] = root / "npy"
    npy.mkdir()
    for i in range(6):
        np.save(npy / f"sample_{i}.npy", (rng.normal(size=(3, 8, 8)) * (1 + i)).astype(np.float32))
    npz = paths["npz"] = root / "npz"
    npz.mkdir()
    for i in range(4):
        np.savez(npz / f"s{i}.npz", X=rng.normal(size=(1, 3, 8, 8)).astype(np.float32))
    pb = paths["pb"] = root / "pb"
    for i in range(3):  # model-zoo layout
        d = pb / f"test_data_set_{i}"
        d.mkdir(parents=True)
        x = rng.normal(size=(1, 3, 8, 8)).astype(np.float32)
        (d / "input_0.pb").write_bytes(numpy_helper.from_array(x, "X").SerializeToString())
        (d / "output_0.pb").write_bytes(numpy_helper.from_array(np.zeros((1, 4, 1, 1), np.float32)).SerializeToString())
    png = paths["png"] = root / "png"
    png.mkdir()
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)).save(png / f"img{i}.png")
    return paths


def out_dir(tmp_path: Path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d


# ---------------------------------------------------------------------------------------------
# calibrate


@pytest.mark.parity
@pytest.mark.subprocess
def test_calibrate_subprocess_cache_loads_in_ort_and_matches_api(work, tmp_path):
    cache, state = tmp_path / "cache.json", tmp_path / "state.hcs"
    r = run_cli(
        *calibrate_args(
            work["model"],
            work["npy"],
            "--num-bins",
            "256",
            "--batch-size",
            "2",
            method="entropy",
            cache=cache,
            state=state,
        )
    )
    assert r.returncode == 0, r.stderr
    assert "calibrated 8 tensors" in r.stdout and not error_lines(r.stderr)
    from_file = ort_calibrate.load_tensors_data(cache)  # onnxruntime's own loader
    data = open_calibration_data(work["model"], work["npy"], batch_size=2)
    expected = histocal.calibrate(work["model"], data, CalibrationMethod.Entropy, num_bins=256)
    assert_same_tensors_data(from_file, expected)
    assert state.is_file()


def test_summary_counts_samples_not_files(work, tmp_path, capsys):
    """Files may hold batches: the summary counts the samples in them, and the files."""
    data = tmp_path / "batches"
    data.mkdir()
    for i in range(3):
        np.save(data / f"b{i}.npy", np.random.default_rng(i).normal(size=(2, 3, 8, 8)).astype(np.float32))
    assert main(["calibrate", str(work["model"]), "--data", str(data), "--cache", str(tmp_path / "c.json")]) == 0
    assert "(MinMax, 6 samples in 3 files)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "kind, method, extra",
    [
        ("npy", "minmax", ["--symmetric", "--batch-size", "3"]),
        ("npz", "percentile", ["--percentile", "99.9", "--num-bins", "512"]),
        ("pb", "distribution", ["--scenario", "p3", "--num-bins", "512"]),
        ("png", "entropy", ["--preprocess", "mobilenet", "--num-bins", "256", "--num-quantized-bins", "64"]),
    ],
)
def test_calibrate_each_data_kind_matches_api(work, tmp_path, capsys, kind, method, extra):
    cache = tmp_path / "c.json"
    rc = main(calibrate_args(work["model"], work[kind], "--no-progress", *extra, method=method, cache=cache))
    assert rc == 0, capsys.readouterr().err
    batch_size = int(extra[extra.index("--batch-size") + 1]) if "--batch-size" in extra else 1
    preprocess = "mobilenet" if kind == "png" else "none"
    data = open_calibration_data(work["model"], work[kind], batch_size=batch_size, preprocess=preprocess)
    settings = {
        "minmax": dict(extra_options={"CalibTensorRangeSymmetric": True}),
        "percentile": dict(extra_options={"CalibPercentile": 99.9}, num_bins=512),
        "distribution": dict(scenario="p3", num_bins=512),
        "entropy": dict(num_bins=256, num_quantized_bins=64),
    }[method]
    expected = histocal.calibrate(
        work["model"], data, CalibrationMethod[method.capitalize() if method != "minmax" else "MinMax"], **settings
    )
    assert_same_tensors_data(histocal.io.cache.load_tensors_data(cache), expected)
    assert oct(cache.stat().st_mode & 0o777) == "0o600"  # ORT's cache mode


def test_calibrate_streaming_mode_and_op_types(work, tmp_path, capsys):
    cache = tmp_path / "c.json"
    rc = main(
        calibrate_args(
            work["model"],
            work["npy"],
            "--mode",
            "streaming",
            "--streaming-bins",
            "1024",
            "--op-types",
            "Conv",
            method="percentile",
            cache=cache,
        )
    )
    assert rc == 0, capsys.readouterr().err
    ranges = histocal.io.cache.load_tensors_data(cache)
    assert {"X", "conv1", "pool"} <= set(ranges.data)  # Conv inputs and outputs only
    assert "resize" not in ranges.data
    # an option of another method is ignored with a warning
    rc = main(calibrate_args(work["model"], work["npy"], "--scenario", "p3", cache=tmp_path / "m.json"))
    assert rc == 0 and "--scenario does not apply to --method minmax" in capsys.readouterr().err


def test_calibrate_memory_budget(work, tmp_path, capsys, monkeypatch):
    """--memory-budget reaches the calibrator (exact mode: ORT's ranges whatever the budget; a bad
    size is an error naming the option); another method ignores it with a warning."""
    caches = []
    for budget in ("0", "1M"):
        cache = tmp_path / f"c{budget}.json"
        args = ["calibrate", str(work["model"]), "--data", str(work["npy"]), "--method", "percentile"]
        assert main([*args, "--mode", "exact", "--memory-budget", budget, "--cache", str(cache)]) == 0
        caches.append(histocal.io.cache.load_tensors_data(cache))
    assert_same_tensors_data(caches[0], caches[1])
    rc = main([*args, "--memory-budget", "lots", "--cache", str(tmp_path / "bad.json")])
    assert rc != 0 and "memory_budget must be a size" in capsys.readouterr().err
    minmax = ["calibrate", str(work["model"]), "--data", str(work["npy"]), "--memory-budget", "1M"]
    rc = main([*minmax, "--cache", str(tmp_path / "m.json")])
    assert rc == 0 and "--memory-budget does not apply to --method minmax" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# quantize


def ort_run(model_path: Path) -> np.ndarray:
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).normal(size=(2, 3, 8, 8)).astype(np.float32)
    (y,) = sess.run(None, {"X": x})
    return y


def op_types(model_path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(model_path)).graph.node}


@pytest.mark.parity
@pytest.mark.subprocess
def test_quantize_images_subprocess_model_runs_in_ort(work, tmp_path):
    out = tmp_path / "q" / "cnn.qdq.onnx"
    cache = tmp_path / "ranges.json"
    r = run_cli(
        "quantize",
        work["model"],
        out,
        "--data",
        work["png"],
        "--preprocess",
        "mobilenet",
        "--method",
        "percentile",
        "--cache",
        cache,
        "--per-channel",
    )
    assert r.returncode == 0, r.stderr
    assert not error_lines(r.stderr) and "Please consider" not in r.stderr
    assert {"QuantizeLinear", "DequantizeLinear"} <= op_types(out)
    assert ort_run(out).shape == (2, 4, 1, 1)
    assert files_in(out.parent) == {out.name}  # nothing else left behind
    assert ort_calibrate.load_tensors_data(cache).calibration_method == CalibrationMethod.Percentile


def test_quantize_from_cache_and_from_state(work, tmp_path, capsys):
    cache, state = tmp_path / "e.json", tmp_path / "e.hcs"
    assert main(calibrate_args(work["model"], work["npy"], method="entropy", cache=cache, state=state)) == 0
    # --cache alone: the cache's method is used
    q1 = tmp_path / "q1.onnx"
    assert (
        main(
            [
                "quantize",
                str(work["model"]),
                str(q1),
                "--cache",
                str(cache),
                "--format",
                "qoperator",
                "--activation-type",
                "quint8",
                "--weight-type",
                "qint8",
            ]
        )
        == 0
    ), capsys.readouterr().err
    assert "QLinearConv" in op_types(q1)
    ort_run(q1)
    # --state: ranges computed from the state (its own method by default) == the cache's ranges
    q2, q3 = tmp_path / "q2.onnx", tmp_path / "q3.onnx"
    assert (
        main(
            [
                "quantize",
                str(work["model"]),
                str(q2),
                "--state",
                str(state),
                "--format",
                "qoperator",
                "--activation-type",
                "quint8",
            ]
        )
        == 0
    ), capsys.readouterr().err
    assert onnx.load(str(q1)).graph == onnx.load(str(q2)).graph
    assert (
        main(
            [
                "quantize",
                str(work["model"]),
                str(q3),
                "--state",
                str(state),
                "--method",
                "minmax",
                "--nodes-to-exclude",
                "conv2",
            ]
        )
        == 0
    ), capsys.readouterr().err
    ort_run(q3)
    # a cache made with another method is refused
    capsys.readouterr()
    assert (
        main(["quantize", str(work["model"]), str(tmp_path / "q4.onnx"), "--cache", str(cache), "--method", "minmax"])
        == 1
    )
    assert str(cache) in capsys.readouterr().err
    assert not (tmp_path / "q4.onnx").exists()


# ---------------------------------------------------------------------------------------------
# recompute and inspect


@pytest.mark.parity
def test_recompute_from_state(work, tmp_path, capsys):
    cache, state = tmp_path / "d.json", tmp_path / "d.hcs"
    assert main(calibrate_args(work["model"], work["npy"], method="distribution", cache=cache, state=state)) == 0
    again = tmp_path / "again.json"
    assert main(["recompute", str(state), "--method", "distribution", "--cache", str(again)]) == 0
    assert_same_tensors_data(histocal.io.cache.load_tensors_data(again), histocal.io.cache.load_tensors_data(cache))
    pct = tmp_path / "p.json"
    assert (
        main(
            [
                "recompute",
                str(state),
                "--method",
                "percentile",
                "--percentile",
                "99.5",
                "--no-symmetric",
                "--cache",
                str(pct),
            ]
        )
        == 0
    )
    from histocal.state import CalibrationState

    expected = CalibrationState.load(state).compute("percentile", percentile=99.5, symmetric=False)
    assert_same_tensors_data(ort_calibrate.load_tensors_data(pct), expected)
    # bad state file: exit 1, named, nothing written
    bad = tmp_path / "bad.hcs"
    bad.write_bytes(b"not a state")
    capsys.readouterr()
    assert main(["recompute", str(bad), "--method", "entropy", "--cache", str(tmp_path / "x.json")]) == 1
    (line,) = error_lines(capsys.readouterr().err)
    assert str(bad) in line and not (tmp_path / "x.json").exists()


PLUGIN = """
import histocal


def half_range(t):
    return t.min / 2, t.max / 2


histocal.register_method("cli_plugin_half", half_range, replace=True)
"""


@pytest.mark.parity
def test_histocal_methods_and_plugins(work, tmp_path, capsys, monkeypatch):
    """histocal's own methods and registered ones through calibrate, recompute and quantize."""
    from histocal.state import CalibrationState

    state, cache = tmp_path / "s.hcs", tmp_path / "pow2.json"
    assert (
        main(
            calibrate_args(
                work["model"],
                work["npy"],
                "--pow2-method",
                "MinMSE",
                "--minmse-mode",
                "MostCommon",
                "--qtype",
                "uint8",
                method="pow2",
                cache=cache,
                state=state,
            )
        )
        == 0
    )
    loaded = CalibrationState.load(state)
    options = {"qtype": "uint8", "pow2_method": "MinMSE", "minmse_mode": "MostCommon"}
    assert_same_tensors_data(ort_calibrate.load_tensors_data(cache), loaded.compute("pow2", **options))
    mse = tmp_path / "mse.json"
    assert (
        main(["recompute", str(state), "--method", "mse", "--qtype", "int16", "--symmetric", "--cache", str(mse)]) == 0
    )
    assert_same_tensors_data(ort_calibrate.load_tensors_data(mse), loaded.compute("mse", qtype="int16", symmetric=True))
    # a plugin module registers a method that then works by name
    (tmp_path / "cli_plugin_mod.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    half = tmp_path / "half.json"
    assert (
        main(
            ["recompute", str(state), "--plugin", "cli_plugin_mod", "--method", "cli_plugin_half", "--cache", str(half)]
        )
        == 0
    )
    got = ort_calibrate.load_tensors_data(half)
    for name in loaded.names:
        fmin = loaded.stream.export(name).finite_min
        assert float(got.data[name].range_value[0][0]) == np.float32(fmin / 2)
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(work["model"]), str(out), "--state", str(state), "--method", "kl"]) == 0
    assert out.exists()
    # unknown method: usage error; a plugin that fails to import: exit 1, named
    capsys.readouterr()
    assert main(["recompute", str(state), "--method", "nosuch", "--cache", str(tmp_path / "n.json")]) == 2
    assert (
        main(
            [
                "recompute",
                str(state),
                "--plugin",
                "no_such_module_xyz",
                "--method",
                "mse",
                "--cache",
                str(tmp_path / "n.json"),
            ]
        )
        == 1
    )
    assert "no_such_module_xyz" in capsys.readouterr().err
    assert not (tmp_path / "n.json").exists()


@pytest.mark.parity
@pytest.mark.subprocess
def test_inspect_cache_text_and_json(work, tmp_path, capsys):
    cache = tmp_path / "m.json"
    assert main(["calibrate", str(work["model"]), "--data", str(work["npy"]), "--cache", str(cache)]) == 0
    ranges = ort_calibrate.load_tensors_data(cache)
    capsys.readouterr()
    assert main(["inspect", str(cache)]) == 0
    text = capsys.readouterr().out
    assert "ort-cache" in text and "MinMax range" in text
    for name, td in ranges.data.items():
        assert f"[{float(td.lowest.item()):.9g}, {float(td.highest.item()):.9g}]" in _table_cells(text, name)
    r = run_cli("inspect", cache, "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["kind"] == "ort-cache" and info["method"] == "MinMax" and info["num_tensors"] == len(ranges.data)
    for name, td in ranges.data.items():
        assert info["tensors"][name]["lowest"] == float(td.lowest.item())
        assert info["tensors"][name]["highest"] == float(td.highest.item())


def test_inspect_state(work, tmp_path, capsys):
    state = tmp_path / "s.hcs"
    assert main(calibrate_args(work["model"], work["npz"], method="percentile", state=state)) == 0
    capsys.readouterr()
    assert main(["inspect", str(state), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "histocal-state" and info["method"] == "percentile" and info["mode"] == "exact"
    assert len(info["model_fingerprint"]) == 64 and info["data_fingerprints"][0].startswith("sha256:")
    assert info["options"]["settings"]["num_bins"] == 2048
    x = info["tensors"]["X"]
    assert x["finite"] == 4 * 3 * 8 * 8 and x["nan"] == x["posinf"] == x["neginf"] == 0 and x["batches"] == 4
    assert x["min"] <= x["lowest"] <= x["highest"] <= x["max"] or x["lowest"] == -x["highest"]
    assert main(["inspect", str(state)]) == 0
    text = capsys.readouterr().out
    assert "histocal-state" in text and "model_fingerprint" in text and "posinf" in text
    assert "data range" in text and "Percentile range" in text


def _table_cells(text: str, tensor: str) -> list[str]:
    """The cells of ``tensor``'s row in an inspect table (columns are split by 2+ spaces)."""
    import re

    (row,) = [line for line in text.splitlines() if line.split(" ", 1)[0] == tensor]
    return re.split(r"\s{2,}", row.strip())


@pytest.mark.parity
def test_inspect_table_shows_each_range_once(work, tmp_path, capsys):
    """One "[low, high]" cell per range: a state's data range and its method's range (marked
    when they are the same), per-channel ranges as their span and channel count."""
    state, cache = tmp_path / "s.hcs", tmp_path / "pc.json"
    assert (
        main(
            ["calibrate", str(work["model"]), "--data", str(work["npy"]), "--method", "entropy", "--state", str(state)]
        )
        == 0
    )
    assert (
        main(["calibrate", str(work["model"]), "--data", str(work["npy"]), "--per-channel", "--cache", str(cache)]) == 0
    )
    capsys.readouterr()
    assert main(["inspect", str(state), "--json"]) == 0
    x = json.loads(capsys.readouterr().out)["tensors"]["X"]
    assert main(["inspect", str(state)]) == 0
    text = capsys.readouterr().out
    header = text.split("\n\n", 1)[1].splitlines()[0]
    assert "data range" in header and "Entropy range" in header and "lowest" not in header and " min " not in header
    cells = _table_cells(text, "X")
    assert f"[{x['min']:.9g}, {x['max']:.9g}]" in cells
    # ORT's Entropy with its default 128 bins is the data range: said once, not repeated
    assert "= data range" in cells and (x["lowest"], x["highest"]) == (x["min"], x["max"])

    ranges = ort_calibrate.load_tensors_data(cache)
    assert main(["inspect", str(cache)]) == 0
    text = capsys.readouterr().out
    low, high = ranges.data["conv1"].range_value
    assert low.size == 4
    assert f"[{float(low.min()):.9g}, {float(high.max()):.9g}] over 4 channels" in _table_cells(text, "conv1")


def test_inspect_bad_files(tmp_path, capsys):
    bad = tmp_path / "junk.json"
    bad.write_text("{not json")
    assert main(["inspect", str(bad)]) == 1
    (line,) = error_lines(capsys.readouterr().err)
    assert str(bad) in line
    assert main(["inspect", str(tmp_path / "missing.json")]) == 1
    assert "missing.json" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Bad data: exit 1, one line naming the file, no output


def _bad_data(kind: str, work: dict, root: Path) -> tuple[Path, Path, Path]:
    """(model, data path, the file the message must name)."""
    d = root / "data"
    d.mkdir()
    good = np.zeros((3, 8, 8), np.float32)
    if kind == "unreadable image":
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(d / "a.png")
        (d / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
        return work["model"], d, d / "b.png"
    if kind == "unreadable npy":
        np.save(d / "a.npy", good)
        (d / "b.npy").write_bytes(b"garbage")
        return work["model"], d, d / "b.npy"
    if kind == "wrong shape":
        np.save(d / "a.npy", good)
        np.save(d / "b.npy", np.zeros((3, 9, 8), np.float32))
        return work["model"], d, d / "b.npy"
    if kind == "wrong dtype":
        np.save(d / "a.npy", good)
        np.save(d / "b.npy", np.zeros((3, 8, 8), np.complex64))
        return work["model"], d, d / "b.npy"
    if kind == "missing input":  # the transformer has inputs X and M
        np.save(d / "X_0.npy", np.zeros((4, 8), np.float32))
        return work["transformer"], d, d / "X_0.npy"
    if kind == "empty folder":
        return work["model"], d, d
    raise AssertionError(kind)


BAD = ["unreadable image", "unreadable npy", "wrong shape", "wrong dtype", "missing input", "empty folder"]


@pytest.mark.parametrize("kind", BAD)
def test_bad_data_fails_cleanly(work, tmp_path, capsys, kind):
    model, data, culprit = _bad_data(kind, work, tmp_path)
    out = out_dir(tmp_path)
    rc = main(calibrate_args(model, data, method="entropy", cache=out / "c.json", state=out / "s.hcs"))
    err = capsys.readouterr().err
    assert rc == 1
    (line,) = error_lines(err)
    assert str(culprit) in line
    assert files_in(out) == set()
    rc = main(["quantize", str(model), str(out / "q.onnx"), "--data", str(data), "--cache", str(out / "c.json")])
    assert rc == 1 and str(culprit) in capsys.readouterr().err
    assert files_in(out) == set()


@pytest.mark.subprocess
def test_bad_data_subprocess(work, tmp_path):
    _, data, culprit = _bad_data("unreadable image", work, tmp_path)
    out = out_dir(tmp_path)
    r = run_cli("calibrate", work["model"], "--data", data, "--cache", out / "c.json")
    assert r.returncode == 1 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("histocal: error:") and str(culprit) in line
    assert files_in(out) == set()


@pytest.mark.parametrize("command", ["calibrate", "quantize"])
def test_non_onnx_model_names_the_file(tmp_path, capsys, work, command):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model \x00\xff" * 8)
    out = out_dir(tmp_path)
    argv = (
        ["calibrate", str(junk), "--cache", str(out / "c.json")]
        if command == "calibrate"
        else ["quantize", str(junk), str(out / "q.onnx")]
    )
    assert main([*argv, "--data", str(work["npy"])]) == 1
    (line,) = error_lines(capsys.readouterr().err)
    assert str(junk) in line and "not an ONNX model" in line
    assert files_in(out) == set()


@pytest.mark.parity
def test_float64_files_follow_the_feed_rule(work, tmp_path, capsys):
    """float64 files are cast to the model's float32 by the same rule as Python feeds (histocal.
    readers.cast_to_input): the same cache as float32 files; values float32 cannot hold are an
    error naming the file, before anything is written."""
    f32, f64 = tmp_path / "f32", tmp_path / "f64"
    f32.mkdir(), f64.mkdir()
    rng = np.random.default_rng(3)
    for i in range(3):
        x = rng.normal(size=(3, 8, 8)) * 10
        np.save(f64 / f"s{i}.npy", x)
        np.save(f32 / f"s{i}.npy", x.astype(np.float32))
    caches = {}
    for name, folder in (("f32", f32), ("f64", f64)):
        caches[name] = tmp_path / f"{name}.json"
        assert main(calibrate_args(work["model"], folder, method="percentile", cache=caches[name])) == 0
    assert_same_tensors_data(
        ort_calibrate.load_tensors_data(caches["f32"]), ort_calibrate.load_tensors_data(caches["f64"])
    )
    np.save(f64 / "s1.npy", np.full((3, 8, 8), 1e39))
    out = out_dir(tmp_path)
    assert main(["calibrate", str(work["model"]), "--data", str(f64), "--cache", str(out / "c.json")]) == 1
    (line,) = error_lines(capsys.readouterr().err)
    assert str(f64 / "s1.npy") in line and "outside the range" in line
    assert files_in(out) == set()


def test_missing_model(tmp_path, capsys, work):
    assert (
        main(
            ["calibrate", str(tmp_path / "nope.onnx"), "--data", str(work["npy"]), "--cache", str(tmp_path / "c.json")]
        )
        == 1
    )
    assert "nope.onnx" in capsys.readouterr().err and not (tmp_path / "c.json").exists()


# ---------------------------------------------------------------------------------------------
# Usage errors and help


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["calibrate", "m.onnx"],  # no --data
        ["calibrate", "m.onnx", "--data", "d"],  # neither --cache nor --state
        ["calibrate", "m.onnx", "--data", "d", "--cache", "c.json", "--method", "klx"],
        ["calibrate", "m.onnx", "--data", "d", "--cache", "c.json", "--num-bins", "0"],
        ["calibrate", "m.onnx", "--data", "d", "--cache", "c.json", "--percentile", "101"],
        ["calibrate", "m.onnx", "--data", "d", "--cache", "c.json", "--input-shape", "1,x"],
        ["quantize", "m.onnx", "out.onnx"],  # no calibration source
        ["quantize", "m.onnx", "out.onnx", "--data", "d", "--state", "s"],
        ["quantize", "m.onnx", "out.onnx", "--cache", "c.json", "--activation-type", "int3"],
        ["recompute", "s.hcs", "--cache", "o.json"],  # no --method
        ["inspect"],
        ["demo", "--samples", "-1"],
    ],
)
def test_usage_errors_exit_2(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.subprocess
def test_usage_error_subprocess(tmp_path):
    r = run_cli("calibrate", "m.onnx", "--data", "d", cwd=tmp_path)
    assert r.returncode == 2 and "--cache and/or --state" in r.stderr


@pytest.mark.parametrize(
    "argv, prog, suggestion",
    [
        (["calibrat", "m.onnx"], "histocal", "did you mean calibrate?"),
        (
            ["calibrate", "m.onnx", "--data", "d", "--cache", "c.json", "--num-bnis", "3"],
            "histocal calibrate",
            "did you mean --num-bins?",
        ),
        (
            ["calibrate", "m.onnx", "--data", "d", "--cache", "c.json", "--num-bnis=3"],
            "histocal calibrate",
            "did you mean --num-bins?",
        ),
        (
            ["quantize", "m.onnx", "o.onnx", "--data", "d", "--preprocess", "resnt"],
            "histocal quantize",
            "did you mean resnet?",
        ),
        (
            ["calibrate", "m.onnx", "--data", "d", "--cache", "c.json", "--method", "entrpy"],
            "histocal calibrate",
            "did you mean entropy?",
        ),
        (["calibrate", "m.onnx"], "histocal calibrate", None),
        (["report", "s.hcs"], "histocal report", None),
    ],
)
def test_usage_errors_are_short_with_suggestions(argv, prog, suggestion, tmp_path, capsys, monkeypatch):
    """A usage error is a one-line usage, the error and a pointer to --help (not the whole usage),
    with "did you mean" for a misspelled subcommand, option or choice."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"usage: {prog} ") and "[options]" in lines[0]
    assert lines[1].startswith(f"{prog}: error: ")
    assert lines[2] == f"Run '{prog} --help' for the full usage."
    if suggestion:
        assert lines[1].endswith(f"({suggestion})"), lines[1]
    assert list(tmp_path.iterdir()) == []


def test_verbosity_before_or_after_the_subcommand(work, tmp_path, capsys):
    """-v and -q work on either side of the subcommand; a message has one "histocal:" prefix."""
    base = [
        "calibrate",
        str(work["model"]),
        "--data",
        str(work["npy"]),
        "--method",
        "entropy",
        "--cache",
        str(tmp_path / "c.json"),
    ]
    for argv in (["-v", *base], [*base, "-v"], [*base, "--verbose"]):
        assert main(argv) == 0
        info = [line for line in capsys.readouterr().err.splitlines() if line.startswith("histocal: info: ")]
        assert any("collection mode: exact" in line for line in info), argv
        assert not any(line.startswith("histocal: info: histocal") for line in info), info
    for argv in ([*base, "-q"], ["-v", *base, "-q"], ["-q", *base]):
        assert main(argv) == 0
        assert capsys.readouterr().err == "", argv
    # a warning under -q is hidden, and shown without -q (option for another method)
    assert main([*base, "--scenario", "p3", "-q"]) == 0 and capsys.readouterr().err == ""
    assert main([*base, "--scenario", "p3"]) == 0 and "histocal: warning: option --scenario" in capsys.readouterr().err


HELP = {
    None: ["calibrate", "quantize", "inspect", "recompute", "demo"],
    "calibrate": [
        "--data",
        "--method",
        "--num-bins",
        "--num-quantized-bins",
        "--percentile",
        "--symmetric",
        "--scenario",
        "--moving-average",
        "--averaging-constant",
        "--per-channel",
        "--max-intermediate-outputs",
        "--mode",
        "--streaming-bins",
        "--memory-budget",
        "--cache",
        "--state",
        "--batch-size",
        "--preprocess",
        "--input-shape",
        "--layout",
        "--providers",
        "--op-types",
        "--no-progress",
    ],
    "quantize": [
        "--data",
        "--cache",
        "--state",
        "--method",
        "--format",
        "--per-channel",
        "--activation-type",
        "--weight-type",
        "--reduce-range",
        "--nodes-to-exclude",
        "--op-types",
        "--preprocess",
    ],
    "inspect": ["FILE", "--json"],
    "recompute": ["STATE", "--method", "--cache", "--num-bins", "--percentile", "--scenario"],
    "demo": ["--samples"],
}


@pytest.mark.parametrize("command", list(HELP))
def test_help_mentions_options(command, capsys):
    assert main(([command] if command else []) + ["--help"]) == 0
    text = capsys.readouterr().out
    for option in HELP[command]:
        assert option in text, (command, option)


@pytest.mark.subprocess
def test_python_m_histocal_help():
    r = run_cli("--help")
    assert r.returncode == 0 and "calibrate" in r.stdout and "demo" in r.stdout


# ---------------------------------------------------------------------------------------------
# demo


def test_demo_small(capsys):
    assert main(["demo", "--samples", "4", "--batch-size", "2", "--methods", "percentile", "distribution"]) == 0
    out = capsys.readouterr().out
    assert "Percentile" in out and "Distribution" in out and "speedup" in out
    rows = [line for line in out.splitlines() if line.startswith(("Percentile", "Distribution"))]
    assert len(rows) == 2 and all(row.rstrip().endswith("yes") for row in rows)

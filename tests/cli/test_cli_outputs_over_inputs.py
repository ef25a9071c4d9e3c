"""No output of a command may land on any file the command reads, not only on the files named on
its command line: the model's external-data files, every sample the --data folders hold.

``histocal quantize a.onnx b.onnx --external-data`` replaced ``b.onnx.data`` when that was the
float model's own weight file (a renamed export), and ``--cache``/``--state`` naming a sample
inside ``--data`` replaced that sample; both exited 0. Each case is refused before any work, the
message names the option and the input, and nothing is written.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from histocal.cli import main


def conv_model() -> onnx.ModelProto:
    """X[N,3,8,8] -Conv-> Y, its int8 weight over the 1 KiB from which ORT writes a tensor as external data."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.5, (64, 3, 3, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.normal(0, 0.1, (64,)).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["X", "W", "B"], ["Y"], name="conv", pads=[1, 1, 1, 1])],
        "conv",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["N", 64, 8, 8])],
        initializer=[w, b],
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def ext(tmp_path) -> dict[str, Path]:
    """ext/a.onnx whose weights are in ext/b.onnx.data (an export renamed after saving), and a
    data folder ext/d of .npy samples, one of them in a subfolder."""
    root = tmp_path / "ext"
    (root / "d" / "sub").mkdir(parents=True)
    model = root / "a.onnx"
    onnx.save_model(
        conv_model(), model.as_posix(), save_as_external_data=True, location="b.onnx.data", size_threshold=0
    )
    rng = np.random.default_rng(0)
    for name in ("s0.npy", "s1.npy", "sub/s2.npy"):
        np.save(root / "d" / name, rng.normal(size=(3, 8, 8)).astype(np.float32))
    return {"root": root, "model": model, "weights": root / "b.onnx.data", "data": root / "d"}


def _refused(capsys, argv: list[object], kept: list[Path], absent: list[Path] = ()) -> str:
    """Exit 1 with the one-line refusal; ``kept`` unchanged, ``absent`` not written."""
    before = {p: _digest(p) for p in kept}
    assert main([str(a) for a in argv]) == 1
    err = capsys.readouterr().err
    assert "refusing to overwrite" in err, err
    for p, digest in before.items():
        assert _digest(p) == digest, f"{p} was changed"
    for p in absent:
        assert not p.exists(), f"{p} was written"
    return err


def _model_loads(model: Path) -> None:
    session = ort.InferenceSession(model.as_posix(), providers=["CPUExecutionProvider"])
    session.run(None, {"X": np.zeros((1, 3, 8, 8), np.float32)})


def test_quantize_external_data_onto_the_models_own_weights(ext, capsys):
    """R3: the output's external data (<OUTPUT>.data) is the float model's weight file."""
    output = ext["root"] / "b.onnx"
    argv = ["quantize", ext["model"], output, "--data", ext["data"], "--external-data", "--no-progress"]
    err = _refused(capsys, argv, [ext["model"], ext["weights"]], [output])
    assert "--external-data" in err and "MODEL's external data" in err and "b.onnx.data" in err
    _model_loads(ext["model"])
    # without --external-data the output writes no .data file: nothing to refuse
    assert main([str(a) for a in argv[:-2]] + ["--no-progress"]) == 0
    _model_loads(ext["model"])
    _model_loads(output)


@pytest.mark.parametrize("how", ["same path", "symlink"])
def test_output_model_onto_an_external_data_file(ext, capsys, tmp_path, how):
    output = ext["weights"]
    if how == "symlink":
        output = tmp_path / "q.onnx"
        output.symlink_to(ext["weights"])
    argv = ["quantize", ext["model"], output, "--data", ext["data"], "--no-progress"]
    err = _refused(capsys, argv, [ext["model"], ext["weights"]])
    assert "OUTPUT" in err and "MODEL's external data" in err
    _model_loads(ext["model"])


@pytest.mark.parametrize("option", ["--cache", "--state"])
def test_calibrate_output_onto_a_data_sample(ext, capsys, option):
    """R6: a sample inside the --data folder (here in a subfolder) is an input."""
    sample = ext["data"] / "sub" / "s2.npy"
    argv = ["calibrate", ext["model"], "--data", ext["data"], option, sample, "--method", "percentile"]
    err = _refused(capsys, [*argv, "--no-progress"], [sample, ext["model"], ext["weights"]])
    assert f"{option} {sample}" in err and "--data" in err


def test_calibrate_cache_onto_the_models_external_data(ext, capsys):
    argv = ["calibrate", ext["model"], "--data", ext["data"], "--cache", ext["weights"], "--no-progress"]
    _refused(capsys, argv, [ext["model"], ext["weights"]])
    _model_loads(ext["model"])


def test_quantize_cache_onto_a_data_sample(ext, capsys, tmp_path):
    sample = ext["data"] / "s0.npy"
    output = tmp_path / "q.onnx"
    argv = ["quantize", ext["model"], output, "--data", ext["data"], "--cache", sample, "--no-progress"]
    _refused(capsys, argv, [sample], [output])


@pytest.mark.parametrize("how", ["symlinked folder", "hard link", "symlinked sample"])
def test_data_samples_through_links(ext, capsys, tmp_path, how):
    """Links count: the data folder through a symlink, or the output a link to a sample."""
    sample = ext["data"] / "s1.npy"
    data, cache = ext["data"], sample
    if how == "symlinked folder":
        data = tmp_path / "data-link"
        data.symlink_to(ext["data"], target_is_directory=True)
    elif how == "hard link":
        cache = tmp_path / "ranges.json"
        os.link(sample, cache)
    else:
        cache = tmp_path / "ranges.json"
        cache.symlink_to(sample)
    argv = ["calibrate", ext["model"], "--data", data, "--cache", cache, "--no-progress"]
    _refused(capsys, argv, [sample])


def test_outputs_beside_the_inputs_still_work(ext, capsys):
    """Files in the data folder that it does not read (hidden or not data) and a fresh name are
    not inputs: writing them is allowed."""
    cache = ext["data"] / "ranges.json"
    state = ext["data"] / "run.hcs"
    argv = ["calibrate", ext["model"], "--data", ext["data"], "--method", "percentile"]
    assert main([*map(str, argv), "--cache", str(cache), "--state", str(state), "--no-progress"]) == 0
    output = ext["root"] / "q.onnx"
    argv = ["quantize", ext["model"], output, "--data", ext["data"], "--external-data", "--no-progress"]
    assert main(list(map(str, argv))) == 0
    assert (ext["root"] / "q.onnx.data").is_file()
    _model_loads(output)
    _model_loads(ext["model"])


def test_diagnose_report_over_images_it_reads(ext, capsys):
    """The report replaces its tensors/ folder of .png images: images the --data folder feeds
    from there are inputs."""
    image = pytest.importorskip("PIL.Image")
    data = ext["root"] / "images"
    (data / "r" / "tensors").mkdir(parents=True)
    pixels = np.random.default_rng(0).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    for path in (data / "a.png", data / "r" / "tensors" / "b.png"):
        image.fromarray(pixels).save(path)
    kept = data / "r" / "tensors" / "b.png"
    before = _digest(kept)
    argv = ["diagnose", ext["model"], "--data", data, "--report", data / "r", "--eval-samples", "1", "--no-progress"]
    assert main([str(a) for a in argv]) == 1
    err = capsys.readouterr().err
    assert f"--report {data / 'r'} would replace the input --data {kept}" in err, err
    assert _digest(kept) == before and not (data / "r" / "index.html").exists()

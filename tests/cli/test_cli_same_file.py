"""Commands refuse, before any work, an output that is the same file as one of their inputs.

``histocal quantize M M`` silently replaced the float model with the int8 one. Every command
that writes files (quantize, calibrate, recompute, report, diagnose --report) compares its
outputs with its inputs as the system does: the same path, a symlink or a hard link to it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from support import models

from histocal.cli import main


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def work(tmp_path) -> dict[str, Path]:
    model = tmp_path / "cnn.onnx"
    onnx.save(models.cnn(), model.as_posix())
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        np.save(data / f"s{i}.npy", rng.normal(size=(3, 8, 8)).astype(np.float32))
    return {"root": tmp_path, "model": model, "data": data}


def _refused(capsys, argv: list[str], *kept: Path) -> str:
    before = {p: _digest(p) for p in kept}
    assert main([*map(str, argv), "--no-progress"] if argv[0] != "recompute" else list(map(str, argv))) == 1
    err = capsys.readouterr().err
    assert "same file" in err and "refusing to overwrite" in err, err
    for p, digest in before.items():
        assert _digest(p) == digest, f"{p} was changed"
    return err


@pytest.mark.parametrize("how", ["same path", "other spelling", "symlink", "hard link"])
def test_quantize_onto_its_own_model(work, capsys, how):
    model = work["model"]
    output = {
        "same path": model,
        "other spelling": model.parent / "." / model.name,
        "symlink": work["root"] / "link.onnx",
        "hard link": work["root"] / "hard.onnx",
    }[how]
    if how == "symlink":
        output.symlink_to(model)
    elif how == "hard link":
        os.link(model, output)
    err = _refused(capsys, ["quantize", model, output, "--data", work["data"]], model)
    assert "OUTPUT" in err and "MODEL" in err


def test_quantize_output_over_its_cache_or_state(work, capsys, tmp_path):
    model, data = work["model"], work["data"]
    cache = tmp_path / "ranges.json"
    assert main(["calibrate", str(model), "--data", str(data), "--cache", str(cache), "--no-progress"]) == 0
    capsys.readouterr()
    _refused(capsys, ["quantize", model, cache, "--cache", cache], cache, model)
    _refused(capsys, ["quantize", model, model, "--cache", cache], cache, model)
    # with --data the cache is written: it may not be the model either
    _refused(capsys, ["quantize", model, tmp_path / "q.onnx", "--data", data, "--cache", model], model)
    assert not (tmp_path / "q.onnx").exists()


def test_calibrate_outputs_over_the_model_or_each_other(work, capsys, tmp_path):
    model, data = work["model"], work["data"]
    _refused(capsys, ["calibrate", model, "--data", data, "--cache", model], model)
    _refused(capsys, ["calibrate", model, "--data", data, "--state", model], model)
    sample = data / "s0.npy"
    _refused(capsys, ["calibrate", model, "--data", sample, "--cache", sample], sample, model)
    err = _refused(capsys, ["calibrate", model, "--data", data, "--cache", tmp_path / "x", "--state", tmp_path / "x"])
    assert "the output --cache" in err
    assert not (tmp_path / "x").exists()


def test_recompute_over_its_state(work, capsys, tmp_path):
    state = tmp_path / "s.hcs"
    args = ["calibrate", str(work["model"]), "--data", str(work["data"]), "--method", "percentile"]
    assert main([*args, "--state", str(state), "--no-progress"]) == 0
    capsys.readouterr()
    _refused(capsys, ["recompute", state, "--method", "percentile", "--cache", state], state)


def test_report_over_its_state(work, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "report"
    (out / "tensors").mkdir(parents=True)
    state = out / "tensors" / "s.png"  # the report replaces tensors/ whole
    args = ["calibrate", str(work["model"]), "--data", str(work["data"]), "--method", "percentile"]
    assert main([*args, "--state", str(state), "--no-progress"]) == 0
    capsys.readouterr()
    before = _digest(state)
    assert main(["report", str(state), "--out", str(out)]) == 1
    assert "would replace the input STATE" in capsys.readouterr().err
    assert _digest(state) == before


def test_distinct_paths_still_work(work, capsys, tmp_path):
    output = tmp_path / "q.onnx"
    assert main(["quantize", str(work["model"]), str(output), "--data", str(work["data"]), "--no-progress"]) == 0
    assert output.is_file() and _digest(output) != _digest(work["model"])

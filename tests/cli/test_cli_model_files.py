"""Every command that takes a MODEL refuses a file that is not an ONNX model in one line naming
it (exit 1, no traceback): an empty file is not "a model with no inputs"."""

from __future__ import annotations

import numpy as np
import pytest

from histocal.cli import main


@pytest.fixture
def data(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    np.save(folder / "a.npy", np.zeros((1, 3), np.float32))
    return folder


@pytest.mark.parametrize(
    "content, says",
    [(b"", "not an ONNX model (0 bytes)"), (b"\x08\xff" * 40, "cannot be parsed")],
    ids=["empty", "junk"],
)
@pytest.mark.parametrize("command", ["calibrate", "quantize", "diagnose"])
def test_a_model_file_that_is_no_model_is_named(tmp_path, capsys, data, content, says, command):
    model = tmp_path / "model.onnx"
    model.write_bytes(content)
    out = tmp_path / "out"
    argv = {
        "calibrate": ["calibrate", str(model), "--cache", str(out / "c.json")],
        "quantize": ["quantize", str(model), str(out / "q.onnx")],
        "diagnose": ["diagnose", str(model)],
    }[command]
    assert main([*argv, "--data", str(data)]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("histocal: error:")]
    assert len(lines) == 1 and f"{model}: not an ONNX model" in lines[0] and says in lines[0], err
    assert "Traceback" not in err and "no inputs" not in err
    assert not out.exists()

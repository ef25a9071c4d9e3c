"""``histocal recompute --method-for``: a state records tensor names, not the op types producing
them, so op-keyed rules are refused naming what recompute can do instead (never "give model=",
an option recompute does not have); tensor-keyed rules apply."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from support import models

from histocal.cli import main


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    root = tmp_path_factory.mktemp("recompute")
    model = root / "cnn.onnx"
    onnx.save(models.cnn(), model.as_posix())
    data = root / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        np.save(data / f"s{i}.npy", rng.normal(size=(3, 8, 8)).astype(np.float32))
    path = root / "cnn.hcs"
    argv = ["calibrate", model, "--data", data, "--method", "entropy", "--state", path, "--no-progress"]
    assert main(list(map(str, argv))) == 0
    return path


@pytest.mark.parametrize("rule", ["op:Conv=percentile", "Conv=percentile"])
def test_op_keyed_rules_are_refused_naming_recompute_s_ways(state, tmp_path, capsys, rule):
    cache = tmp_path / "c.json"
    assert main(["recompute", str(state), "--method", "entropy", "--method-for", rule, "--cache", str(cache)]) == 2
    err = capsys.readouterr().err
    assert "model=" not in err and "Traceback" not in err
    assert "op:-keyed --method-for needs the model; recompute works on a state only" in err, err
    assert "name:TENSOR" in err and "calibrate" in err and "quantize" in err
    assert not cache.exists()


def test_tensor_keyed_rules_apply(state, tmp_path):
    ranges = {}
    for name, rule in (("plain", []), ("override", ["--method-for", "name:conv1=percentile"])):
        cache = tmp_path / f"{name}.json"
        assert main(["recompute", str(state), "--method", "entropy", *rule, "--cache", str(cache)]) == 0
        ranges[name] = {t: (v["lowest"], v["highest"]) for t, v in json.loads(cache.read_text())["data"].items()}
    assert ranges["override"]["conv1"] != ranges["plain"]["conv1"]
    assert ranges["override"]["relu1"] == ranges["plain"]["relu1"]

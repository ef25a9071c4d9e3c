"""histocal.io.outputs: the inputs a writer must not replace, and the check of its outputs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from histocal.io.data import data_files, open_calibration_data
from histocal.io.outputs import (
    OverwriteError,
    external_data_files,
    external_data_output,
    model_files,
    refuse_overwriting,
    report_outputs,
)

F32 = onnx.TensorProto.FLOAT


def _weights(name: str, n: int = 64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.arange(n, dtype=np.float32), name)


def _model_with_tensors_everywhere() -> onnx.ModelProto:
    """An initializer, a Constant node's value and an If branch's initializer: three places a
    tensor can keep its data externally."""
    then = helper.make_graph(
        [helper.make_node("Add", ["x", "T"], ["t_out"])], "then", [], [helper.make_tensor_value_info("t_out", F32, [64])],
        initializer=[_weights("T")],
    )  # fmt: skip
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e_out"])], "else", [], [helper.make_tensor_value_info("e_out", F32, [64])]
    )  # fmt: skip
    nodes = [
        helper.make_node("Constant", [], ["c"], value=_weights("C")),
        helper.make_node("Add", ["W", "c"], ["x"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", F32, [64])],
        initializer=[_weights("W")],
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


def test_every_external_tensor_is_found_without_reading_it(tmp_path, monkeypatch):
    model = _model_with_tensors_everywhere()
    # one file per tensor, named after it; the Constant's value and the If branch's too
    onnx.external_data_helper.convert_model_to_external_data(
        model, all_tensors_to_one_file=False, size_threshold=0, convert_attribute=True
    )
    onnx.save_model(model, (tmp_path / "m.onnx").as_posix())
    (tmp_path / "C").unlink()  # a missing file is still one the model names
    monkeypatch.chdir(tmp_path.parent)  # found next to the model, not in the working folder
    found = external_data_files(tmp_path / "m.onnx")
    assert sorted(p.name for p in found) == ["C", "T", "W"]
    assert all(p.parent == tmp_path for p in found)
    assert [n for n, _ in model_files(tmp_path / "m.onnx")] == ["MODEL", *["MODEL's external data"] * 3]


def test_a_model_saved_by_onnx_with_its_data_in_one_file(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save_model(
        _model_with_tensors_everywhere(), path.as_posix(), save_as_external_data=True, location="x.data",
        size_threshold=0, convert_attribute=True,
    )  # fmt: skip
    assert external_data_files(path) == [tmp_path / "x.data"]


def test_a_file_that_is_no_model_names_no_external_data(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"\xff not onnx")
    assert external_data_files(path) == []
    assert external_data_files(tmp_path / "missing.onnx") == []


def test_output_names_onnxruntime_uses():
    assert external_data_output(Path("out/b.onnx")) == Path("out/b.onnx.data")


def test_refuse_overwriting_sees_links_and_unwritten_files(tmp_path):
    a = tmp_path / "a.npy"
    a.write_bytes(b"a")
    os.link(a, tmp_path / "hard")
    (tmp_path / "soft").symlink_to(a)
    for output in (a, tmp_path / "hard", tmp_path / "soft", tmp_path / "." / "a.npy"):
        with pytest.raises(OverwriteError, match="the same file as the input --data") as info:
            refuse_overwriting([("--cache", output)], [("--data", a)])
        assert info.value.other == "--data" and info.value.role == "the input"
    # two outputs not written yet, one path
    with pytest.raises(OverwriteError, match="--state .* the same file as the output --cache"):
        refuse_overwriting([("--cache", tmp_path / "x"), ("--state", tmp_path / "sub" / ".." / "x")], [])
    refuse_overwriting([("--cache", tmp_path / "b.json"), ("--state", None)], [("--data", a), ("--x", None)])


def test_report_outputs_hold_the_tensors_folder(tmp_path):
    (tmp_path / "r" / "tensors").mkdir(parents=True)
    (tmp_path / "r" / "tensors" / "t.png").write_bytes(b"")
    out = tmp_path / "r"
    assert report_outputs(out) == [out, out / "index.html", out / "tensors", out / "tensors" / "t.png"]


def test_data_files_are_the_files_the_reader_reads(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", F32, ["N", 2])], [helper.make_tensor_value_info("y", F32, ["N", 2])],
    )  # fmt: skip
    model = tmp_path / "m.onnx"
    onnx.save_model(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)]), model)
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / ".hidden").mkdir()
    for name in ("s10.npy", "s2.npy", "sub/s1.npy", ".hidden/h.npy", ".h.npy"):
        np.save(d / name, np.zeros(2, np.float32))
    for name in ("notes.txt", "m.onnx", "output_0.pb"):
        (d / name).write_bytes(b"")
    assert data_files(d) == open_calibration_data(model, d).files
    assert data_files([d / "notes.txt", tmp_path / "missing"]) == [d / "notes.txt"]

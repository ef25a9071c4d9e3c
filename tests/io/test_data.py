"""histocal.data: calibration data files (npy, npz, model-zoo pb, images) -> feed dicts."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, quantize_static
from PIL import Image

from histocal.io.data import CalibrationData, DataError, model_inputs, open_calibration_data

F32, I64, I32, U8 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.UINT8
X2 = ("x", F32, ["N", 2])
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def make_model(*inputs: tuple[str, int, list]) -> onnx.ModelProto:
    """Identity per input (output '<name>_out'), ORT-loadable (IR 10, opset 17)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", [n], [f"{n}_out"]) for n, _, _ in inputs],
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(f"{n}_out", t, None) for n, t, _ in inputs],
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


def run(model: onnx.ModelProto, data) -> list[list[np.ndarray]]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [sess.run(None, feed) for feed in data]


def save_image(path: Path, pixels: np.ndarray) -> Path:
    Image.fromarray(pixels).save(path)
    return path


def rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def decoded(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


# ------------------------------------------------------------------------------------------ npy


def test_npy_single_input_batches_in_natural_order(tmp_path):
    model = make_model(("x", F32, ["N", 3, 4]))
    rng = np.random.default_rng(0)
    arrays = {i: rng.standard_normal((3, 4)) for i in (1, 2, 10, 11, 3)}  # float64 on disk
    for i, a in arrays.items():
        np.save(tmp_path / f"s{i}.npy", a)
    data = open_calibration_data(model, tmp_path, batch_size=2)
    assert isinstance(data, CalibrationData) and data.input_names == ("x",)
    assert [f.name for f in data.files] == ["s1.npy", "s2.npy", "s3.npy", "s10.npy", "s11.npy"]
    assert len(data) == 3 and data.num_samples == 5
    batches = list(data)
    assert [b["x"].shape for b in batches] == [(2, 3, 4), (2, 3, 4), (1, 3, 4)]
    assert all(b["x"].dtype == np.float32 for b in batches)
    expected = np.stack([arrays[i] for i in (1, 2, 3, 10, 11)]).astype(np.float32)
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in batches]), expected)
    again = list(data)  # re-iterable: every iter() starts over
    assert all(np.array_equal(a["x"], b["x"]) for a, b in zip(batches, again))
    outs = run(model, data)
    np.testing.assert_array_equal(np.concatenate([o[0] for o in outs]), expected)


def test_npy_files_holding_batches_are_concatenated(tmp_path):
    model = make_model(("x", F32, ["N", 2]))
    for i in range(3):
        np.save(tmp_path / f"b{i}.npy", np.full((i + 1, 2), i, np.float32))
    data = open_calibration_data(model, [tmp_path / f"b{i}.npy" for i in range(3)], batch_size=2)
    assert [b["x"].shape for b in data] == [(3, 2), (3, 2)]
    np.testing.assert_array_equal(next(iter(data))["x"][:, 0], [0, 1, 1])


def test_sample_and_item_counts_and_length_hint(tmp_path, caplog):
    """num_samples counts rows along the batch dim (a file may hold a batch), num_items the files
    batch_size counts; __length_hint__ is what is left of the current read (set_range)."""
    model = make_model(("x", F32, ["N", 2]))
    for i in range(3):
        np.save(tmp_path / f"b{i}.npy", np.full((i + 1, 2), i, np.float32))
    np.save(tmp_path / "single.npy", np.zeros(2, np.float64))  # one sample, float64 on disk
    with caplog.at_level(logging.INFO, logger="histocal.io.data"):
        data = open_calibration_data(model, tmp_path, batch_size=2)
    assert (data.num_items, data.num_samples, len(data)) == (4, 7, 2)
    assert "7 sample(s) in 4 npy file(s)" in caplog.text
    assert "float64 data" in caplog.text and "single.npy" in caplog.text
    assert open_calibration_data(model, tmp_path, validate=False).num_samples == 7  # counted on demand
    # (len() is the whole data set; readers.DataSource asks a reader for its __length_hint__)
    assert data.__length_hint__() == 2
    data.get_next()
    assert data.__length_hint__() == 1
    data.set_range(1, 2)
    assert data.__length_hint__() == 1
    data.rewind()
    assert data.__length_hint__() == 2


def test_not_an_onnx_model_names_the_file(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\xff not protobuf" * 4)
    with pytest.raises(ValueError, match=f"^{junk}: not an ONNX model"):
        model_inputs(junk)
    np.save(tmp_path / "a.npy", np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="not an ONNX model"):
        open_calibration_data(junk, tmp_path / "a.npy")


def test_npy_multi_input_per_sample_folders(tmp_path):
    model = make_model(("input", F32, ["N", 2]), ("input_ids", I64, ["N", 3]))
    for s in range(3):
        (tmp_path / f"sample_{s}").mkdir()
        np.save(tmp_path / f"sample_{s}" / "input.npy", np.full(2, s, np.float32))
        np.save(tmp_path / f"sample_{s}" / "input_ids.npy", np.full(3, s, np.int32))
    data = open_calibration_data(model, tmp_path, batch_size=3)
    (batch,) = list(data)
    assert batch["input"].dtype == np.float32 and batch["input_ids"].dtype == np.int64
    np.testing.assert_array_equal(batch["input_ids"], np.repeat([[0], [1], [2]], 3, axis=1))
    run(model, data)


def test_npy_multi_input_name_prefixes_longest_match_and_sanitised_names(tmp_path):
    model = make_model(("input", F32, ["N", 2]), ("input_ids", I64, ["N", 3]), ("mask:0", I64, ["N", 3]))
    for s in range(2):
        np.save(tmp_path / f"input_{s}.npy", np.full((1, 2), s, np.float32))
        np.save(tmp_path / f"input_ids_{s}.npy", np.full((1, 3), 10 + s, np.int64))
        np.save(tmp_path / f"mask_0_{s}.npy", np.full((1, 3), 20 + s, np.int64))
    batches = list(open_calibration_data(model, tmp_path))
    assert len(batches) == 2
    assert [int(b["input"][0, 0]) for b in batches] == [0, 1]
    assert [int(b["input_ids"][0, 0]) for b in batches] == [10, 11]
    assert [int(b["mask:0"][0, 0]) for b in batches] == [20, 21]
    run(model, batches)


# ------------------------------------------------------------------------------------------ npz


def test_npz_multi_and_single_input(tmp_path):
    model = make_model(("a", F32, ["N", 2]), ("b", I64, ["N"]))
    for s in range(3):
        np.savez(tmp_path / f"{s}.npz", a=np.full(2, s, np.float64), b=np.array(s))
    data = open_calibration_data(model, tmp_path, batch_size=2)
    batches = list(data)
    assert [b["a"].shape for b in batches] == [(2, 2), (1, 2)]
    np.testing.assert_array_equal(batches[0]["b"], np.array([0, 1], np.int64))
    run(model, data)

    single = make_model(("x", F32, [1, 4]))
    np.savez(tmp_path / "pos.npz", np.arange(4.0))  # positional key arr_0
    (feed,) = open_calibration_data(single, tmp_path / "pos.npz")
    np.testing.assert_array_equal(feed["x"], np.arange(4.0, dtype=np.float32)[None])


# ------------------------------------------------------------------------------------------- pb


def write_pb(path: Path, array: np.ndarray, name: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(numpy_helper.from_array(array, name).SerializeToString())


def test_model_zoo_folders(tmp_path):
    model = make_model(("x", F32, [1, 2]), ("y", I64, [1, 2]))
    onnx.save(model, tmp_path / "model.onnx")  # next to the data, as in the zoo: skipped
    for s in range(2):
        d = tmp_path / f"test_data_set_{s}"
        if s == 0:  # unnamed tensors: by index
            write_pb(d / "input_0.pb", np.full((1, 2), s, np.float32))
            write_pb(d / "input_1.pb", np.full((1, 2), 10 + s, np.int64))
        else:  # named tensors: by name, whatever the file order
            write_pb(d / "input_0.pb", np.full((1, 2), 10 + s, np.int64), "y")
            write_pb(d / "input_1.pb", np.full((1, 2), s, np.float32), "x")
        write_pb(d / "output_0.pb", np.zeros(1, np.float32))
    data = open_calibration_data(tmp_path / "model.onnx", tmp_path)
    assert len(data) == 2 and all(f.stem.startswith("input_") for f in data.files)
    batches = list(data)
    assert [(int(b["x"][0, 0]), int(b["y"][0, 0])) for b in batches] == [(0, 10), (1, 11)]
    run(model, batches)


def test_pb_single_input_each_file_is_a_sample(tmp_path):
    model = make_model(("data", F32, ["N", 3]))
    for s in range(3):
        write_pb(tmp_path / f"set_{s}" / "input_0.pb", np.full((1, 3), s, np.float32), "data_0")
    data = open_calibration_data(model, tmp_path, batch_size=2)
    assert [float(b["data"][0, 0]) for b in data] == [0.0, 2.0]


# --------------------------------------------------------------------------------------- images


def test_image_none_preset_raw_pixels_and_formats(tmp_path):
    model = make_model(("img", F32, ["N", 3, 6, 5]))
    paths = [
        save_image(tmp_path / "a.png", rgb(6, 5, 1)),
        save_image(tmp_path / "b.bmp", rgb(6, 5, 2)),
        save_image(tmp_path / "c.jpg", rgb(6, 5, 3)),
        save_image(tmp_path / "d.JPEG", rgb(6, 5, 4)),
    ]
    data = open_calibration_data(model, tmp_path, batch_size=4)
    (batch,) = list(data)
    expected = np.stack([decoded(p).transpose(2, 0, 1) for p in paths]).astype(np.float32)
    assert batch["img"].shape == (4, 3, 6, 5) and batch["img"].dtype == np.float32
    np.testing.assert_array_equal(batch["img"], expected)
    run(model, data)


def test_images_without_pillow_name_the_extra(tmp_path, monkeypatch):
    # Pillow is the images extra, imported only when an image is read: without it, .npy data
    # still works and images fail with an error saying what to install.
    model = make_model(("img", F32, ["N", 3, 6, 5]))
    save_image(tmp_path / "a.png", rgb(6, 5, 1))
    np.save(tmp_path / "b.npy", np.zeros((1, 3, 6, 5), np.float32))
    monkeypatch.setitem(__import__("sys").modules, "PIL", None)
    (batch,) = list(open_calibration_data(model, tmp_path / "b.npy"))
    assert batch["img"].shape == (1, 3, 6, 5)
    with pytest.raises(DataError, match=r"needs Pillow.*pip install pillow.*\[images\]"):
        open_calibration_data(model, tmp_path / "a.png")


def test_image_gray_and_rgba_become_rgb_uint8_input(tmp_path):
    model = make_model(("img", U8, [1, 4, 4, 3]))
    Image.fromarray(np.arange(16, dtype=np.uint8).reshape(4, 4)).save(tmp_path / "g.png")
    Image.fromarray(np.zeros((4, 4, 4), np.uint8)).save(tmp_path / "rgba.png")
    feeds = list(open_calibration_data(model, tmp_path))
    assert all(f["img"].shape == (1, 4, 4, 3) and f["img"].dtype == np.uint8 for f in feeds)
    np.testing.assert_array_equal(feeds[0]["img"][0, ..., 1], np.arange(16).reshape(4, 4))
    run(model, feeds)


def test_image_mobilenet_preset(tmp_path):
    model = make_model(("img", F32, [1, 3, 7, 9]))
    p = save_image(tmp_path / "a.png", rgb(7, 9))
    data = open_calibration_data(model, tmp_path, preprocess="mobilenet")
    (feed,) = list(data)
    ref = (rgb(7, 9).astype(np.float32) / 127.5 - 1).transpose(2, 0, 1)[None]
    np.testing.assert_allclose(feed["img"], ref, rtol=0, atol=1e-6)
    assert data.files == [p] and feed["img"].min() >= -1 and feed["img"].max() <= 1


def test_image_resnet_preset_center_crop(tmp_path):
    model = make_model(("img", F32, ["N", 3, 224, 224]))
    pixels = rgb(256, 292)  # shorter side already 256: no resize, crop only
    save_image(tmp_path / "a.png", pixels)
    (feed,) = open_calibration_data(model, tmp_path, preprocess="resnet")
    crop = pixels[16:240, 34:258].astype(np.float32)
    ref = ((crop / 255 - MEAN) / STD).transpose(2, 0, 1)[None]
    assert feed["img"].shape == (1, 3, 224, 224) and feed["img"].dtype == np.float32
    np.testing.assert_allclose(feed["img"], ref, rtol=0, atol=1e-5)
    run(model, [feed])


def test_image_caffe2_preset_nhwc_from_model(tmp_path):
    model = make_model(("img", F32, [1, 5, 6, 3]))
    save_image(tmp_path / "a.bmp", rgb(5, 6))
    (feed,) = open_calibration_data(model, tmp_path, preprocess="caffe2")
    ref = rgb(5, 6)[..., ::-1].astype(np.float32) - np.array([103.939, 116.779, 123.68], np.float32)
    np.testing.assert_allclose(feed["img"], ref[None], rtol=0, atol=1e-4)


def test_image_resize_input_shape_and_layout_options(tmp_path):
    save_image(tmp_path / "a.png", rgb(20, 30))
    save_image(tmp_path / "b.jpg", rgb(31, 17))
    fixed = make_model(("img", F32, ["N", 3, 8, 8]))
    feeds = list(open_calibration_data(fixed, tmp_path, preprocess="mobilenet"))
    assert [f["img"].shape for f in feeds] == [(1, 3, 8, 8)] * 2
    dynamic = make_model(("img", F32, ["N", 3, "H", "W"]))
    data = open_calibration_data(dynamic, tmp_path, preprocess="resnet", batch_size=2)
    assert next(iter(data))["img"].shape == (2, 3, 224, 224)
    data = open_calibration_data(dynamic, tmp_path, preprocess="resnet", input_shape="1,3,16,12")
    assert [f["img"].shape for f in data] == [(1, 3, 16, 12)] * 2
    anything = make_model(("img", F32, ["N", "A", "B", "C"]))
    data = open_calibration_data(anything, tmp_path, input_shape=[-1, 10, 12, 3], layout="nhwc")
    feeds = list(data)
    assert [f["img"].shape for f in feeds] == [(1, 10, 12, 3)] * 2
    run(anything, feeds)
    with pytest.raises(DataError, match="differ in shape"):  # dynamic H/W, no resize, two sizes
        open_calibration_data(anything, tmp_path, batch_size=2)


# ------------------------------------------------------------------------------- reader protocol


def test_calibration_data_reader_protocol(tmp_path):
    model = make_model(("x", F32, ["N", 2]))
    for i in range(5):
        np.save(tmp_path / f"{i}.npy", np.full(2, i, np.float32))
    data = open_calibration_data(model, tmp_path, batch_size=2)
    assert isinstance(data, CalibrationDataReader)
    firsts = []
    while (feed := data.get_next()) is not None:
        firsts.append(float(feed["x"][0, 0]))
    assert firsts == [0.0, 2.0, 4.0] and data.get_next() is None
    data.rewind()
    assert float(data.get_next()["x"][0, 0]) == 0.0
    clone = copy.deepcopy(data)  # what quantize_static does for some options
    assert float(clone.get_next()["x"][0, 0]) == 2.0
    data.set_range(1, 2)
    assert float(data.get_next()["x"][0, 0]) == 2.0 and data.get_next() is None
    assert len(list(data)) == 3  # iteration is independent of the reader cursor


@pytest.mark.parity
def test_quantize_static_accepts_it(tmp_path):
    w = np.random.default_rng(0).standard_normal((4, 2)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", F32, ["N", 4])],
        [helper.make_tensor_value_info("y", F32, None)],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "data").mkdir()
    for i in range(4):
        np.save(tmp_path / "data" / f"{i}.npy", np.random.default_rng(i).standard_normal(4))
    assert [i.name for i in model_inputs(tmp_path / "m.onnx")] == ["x"]
    data = open_calibration_data(tmp_path / "m.onnx", tmp_path / "data")
    quantize_static(tmp_path / "m.onnx", tmp_path / "q.onnx", data)
    assert any(n.op_type == "QuantizeLinear" for n in onnx.load(tmp_path / "q.onnx").graph.node)


def test_unsupported_files_in_folders_are_skipped_with_a_warning(tmp_path, caplog):
    np.save(tmp_path / "a.npy", np.zeros(2, np.float32))
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / ".hidden.npy").write_bytes(b"junk")
    with caplog.at_level(logging.WARNING, logger="histocal.io.data"):
        data = open_calibration_data(make_model(("x", F32, [1, 2])), tmp_path)
    assert [f.name for f in data.files] == ["a.npy"] and "notes.txt" in caplog.text


def test_duplicate_paths_are_read_once_and_validation_can_be_deferred(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(2, np.float32))
    (tmp_path / "b.npy").write_bytes(b"junk")
    data = open_calibration_data(make_model(X2), [tmp_path, tmp_path / "a.npy"], validate=False)
    assert [f.name for f in data.files] == ["a.npy", "b.npy"]
    with pytest.raises(DataError, match="b.npy: not a valid .npy"):
        data.validate()


# ------------------------------------------------------------------------------------- bad data


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _npy(path: Path, array: np.ndarray, **kw) -> Path:
    np.save(path, array, **kw)
    return path


def _npz(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


def _pb(path: Path, name: str) -> Path:
    write_pb(path, np.zeros((1, 2), np.float32), name)
    return path


def _png(path: Path, cut: int | None = None) -> Path:
    save_image(path, rgb(8, 8))
    path.write_bytes(path.read_bytes()[:cut])
    return path


def _mixed(d: Path) -> Path:
    save_image(d / "b.png", rgb(2, 2))
    return _npy(d / "a.npy", np.zeros(2))


XY = [X2, ("y", F32, ["N"])]
IMG = [("img", F32, [1, 3, 8, 8])]
# case: (model inputs, writes the data into folder d and returns the file the error must name;
#        the data path given is d, or that path itself when it is not an existing file in d)
BAD = {
    "garbage image": (IMG, lambda d: _write(d / "a.png", b"not an image")),
    "truncated png": (IMG, lambda d: _png(d / "a.png", cut=60)),
    "image, 1 channel": ([("img", F32, [1, 1, 8, 8])], lambda d: _png(d / "a.png")),
    "image, 2 inputs": ([*IMG, X2], lambda d: _png(d / "a.png")),
    "image, 2-D input": ([X2], lambda d: _png(d / "a.png")),
    "npy float for int": ([("x", I64, ["N", 2])], lambda d: _npy(d / "a.npy", np.zeros(2))),
    "npy complex": ([X2], lambda d: _npy(d / "a.npy", np.zeros(2, np.complex64))),
    "npy strings": ([X2], lambda d: _npy(d / "a.npy", np.array(["a", "b"]))),
    "npy object": ([X2], lambda d: _npy(d / "a.npy", np.array([{}, 1], object), allow_pickle=True)),
    "npy shape": ([X2], lambda d: _npy(d / "a.npy", np.zeros(3, np.float32))),
    "npy rank": ([X2], lambda d: _npy(d / "a.npy", np.zeros((1, 1, 2), np.float32))),
    "npy not npy": ([X2], lambda d: _write(d / "a.npy", b"hello")),
    "static batch": ([("x", F32, [1, 2])], lambda d: _npy(d / "a.npy", np.zeros((2, 2)))),
    "npz missing key": (XY, lambda d: _npz(d / "a.npz", x=np.zeros(2))),
    "npz unknown key": ([X2], lambda d: _npz(d / "a.npz", x=np.zeros(2), z=np.zeros(1))),
    "npz not zip": ([X2], lambda d: _write(d / "a.npz", b"PK no zip")),
    "pb garbage": ([X2], lambda d: _write(d / "input_0.pb", b"\xff\xff\xff\xff")),
    "pb text": ([X2], lambda d: _write(d / "input_0.pb", b"hello world")),
    "pb unknown name": (XY, lambda d: _pb(d / "input_0.pb", "zzz")),
    "pb missing input": (XY, lambda d: _pb(d / "input_0.pb", "x")),
    "npy missing input": (XY, lambda d: _npy(d / "x_0.npy", np.zeros(2))),
    "npy unmatched name": (XY, lambda d: _npy(d / "q.npy", np.zeros(2))),
    "empty folder": ([X2], lambda d: d),
    "only unsupported": ([X2], lambda d: [_write(d / "a.txt", b"x"), d][1]),
    "explicit unsupported": ([X2], lambda d: _write(d.parent / f"{d.name}.txt", b"x")),
    "missing path": ([X2], lambda d: d / "nope"),
    "mixed kinds": ([X2], _mixed),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_data_raises_data_error_naming_the_file(tmp_path, case):
    inputs, make = BAD[case]
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    culprit = make(data_dir)
    data_path = data_dir if data_dir in culprit.parents and culprit.exists() else culprit
    with pytest.raises(DataError) as err:
        open_calibration_data(make_model(*inputs), data_path)
    assert str(culprit) in str(err.value), err.value


@pytest.mark.parametrize("kind", ["truncated jpeg", "int overflow"])
def test_bad_data_found_on_load_is_a_data_error_too(tmp_path, kind):
    if kind == "int overflow":
        model = make_model(("x", I32, ["N", 2]))
        path = _npy(tmp_path / "a.npy", np.array([0, 2**40]))
    else:
        model = make_model(("img", F32, [1, 3, 64, 64]))
        path = save_image(tmp_path / "a.jpg", rgb(64, 64))
        path.write_bytes(path.read_bytes()[:2000])  # headers intact, scan data cut
    data = open_calibration_data(model, tmp_path)  # the cheap header check passes
    for check in (lambda: data.validate(deep=True), lambda: list(data)):
        with pytest.raises(DataError, match=str(path)):
            check()


def test_options_are_checked(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(2, np.float32))
    model = make_model(X2)
    for kwargs in ({"batch_size": 0}, {"preprocess": "vgg"}, {"layout": "CHW"}):
        with pytest.raises(ValueError):
            open_calibration_data(model, tmp_path, **kwargs)
    with pytest.raises(DataError, match="apply to images"):
        open_calibration_data(model, tmp_path, preprocess="resnet")
    with pytest.raises(ValueError, match="single-input"):
        open_calibration_data(make_model(X2, ("y", F32, [1])), tmp_path, input_shape="1,2")

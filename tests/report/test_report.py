"""histocal.report and ``histocal report``: the HTML page, the images, names, errors."""

from __future__ import annotations

import html.parser
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

import histocal
from histocal import _core
from histocal.cli import main
from histocal.methods.scale_rule import SCALE_RULE
from histocal.report import images as report_images
from histocal.report import page as report
from histocal.state import CalibrationState

pytest.importorskip("matplotlib")

ENV = {**os.environ, "HISTOCAL_PROGRESS": "0"}
# the Rust kernels of histocal's own methods (mse, kl, pow2, auto) and of the error estimate
KERNELS = hasattr(_core.StreamHistograms, "ranges") and hasattr(_core.StreamHistograms, "qerrors")
ORT = ("minmax", "entropy", "percentile")

# Tensor names with '/', ':', unicode, names that sanitize alike, and names differing only in case.
NAMES = {
    "mul": "enc/layer.0/mul:0",
    "relu": "блок/relu 出力",
    "log": "log/out",  # log(relu): -inf where relu is 0
    "spike": "a:b",  # one huge value: the outlier
    "spike2": "a/b",
    "upper": "Enc",
    "lower": "enc",
}


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(1.0, 0.3, (8,)).astype(np.float32), "c"),
        numpy_helper.from_array(np.array([1.0] * 7 + [500.0], np.float32), "spike_w"),
    ]
    n = NAMES
    nodes = [
        helper.make_node("Mul", ["X", "c"], [n["mul"]]),
        helper.make_node("Relu", [n["mul"]], [n["relu"]]),
        helper.make_node("Log", [n["relu"]], [n["log"]]),
        helper.make_node("Mul", [n["mul"], "spike_w"], [n["spike"]]),
        helper.make_node("Neg", [n["spike"]], [n["spike2"]]),
        helper.make_node("Sigmoid", [n["spike2"]], [n["upper"]]),
        helper.make_node("Tanh", [n["upper"]], [n["lower"]]),
        helper.make_node("Add", [n["lower"], n["log"]], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "report_test",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 8])],
        initializer=inits,
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    out = []
    for _ in range(6):
        x = rng.normal(0, 1, (4096, 8)).astype(np.float32)  # > 10^5 values: p99.99 is not the max
        x[:, 7] = np.abs(x[:, 7]) * 0.01  # spike column: small values scaled by 500 ...
        out.append({"X": x})
    out[2]["X"][5, 7] = 3.0  # ... and one large one: max|x| far above p99.99
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report")
    model = root / "model.onnx"
    onnx.save(_model(), model.as_posix())
    from onnxruntime.quantization import CalibrationMethod

    cal = histocal.create_calibrator(
        model, augmented_model_path=(root / "aug.onnx").as_posix(), calibrate_method=CalibrationMethod.Entropy
    )
    cal.show_progress = False
    with np.errstate(all="ignore"):
        cal.collect_data(_batches())
    state = root / "state.hcs"
    cal.save_state(state)
    return {"root": root, "model": model, "state": state}


@pytest.fixture(scope="module")
def state(files) -> CalibrationState:
    return CalibrationState.load(files["state"])


@pytest.fixture(scope="module")
def full_report(files, state, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("full") / "nested" / "out"
    index = report.write_report(state, out, workers=1)
    assert index == out / "index.html"
    return out


class _Page(html.parser.HTMLParser):
    """Rows of the summary table (cells' data attributes), image sources and element ids."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict] = []
        self.images: list[str] = []
        self.ids: list[str] = []
        self.links: list[str] = []
        self.scripts = 0
        self._row: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.scripts += 1
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "a" and a.get("href", "").startswith("#"):
            self.links.append(a["href"][1:])
            if self._row is not None:
                self._row["linked"] = True
        if tag == "img":
            self.images.append(a["src"])
        if tag == "tr":
            self._row = {"ranges": {}, "errors": {}, "classes": []}
        if tag == "td" and self._row is not None:
            self._row["classes"].append(a.get("class", ""))
            if "data-name" in a:
                self._row["name"] = a["data-name"]
            if "data-method" in a:
                self._row["ranges"][a["data-method"]] = (float(a["data-low"]), float(a["data-high"]))
                if "data-error" in a:
                    self._row["errors"][a["data-method"]] = float(a["data-error"])
            if "data-ratio" in a:
                self._row["ratio"] = float(a["data-ratio"])
                self._row["ratio_class"] = a.get("class", "")
            if "data-auto" in a:
                self._row["auto"] = a["data-auto"]

    def handle_endtag(self, tag):
        if tag == "tr" and self._row is not None:
            if "name" in self._row:
                self.rows.append(self._row)
            self._row = None


def _page(out: Path) -> _Page:
    page = _Page()
    page.feed((out / "index.html").read_text(encoding="utf-8"))
    return page


def _pair(td) -> tuple[float, float]:
    return float(np.asarray(td.range_value[0]).reshape(-1)[0]), float(np.asarray(td.range_value[1]).reshape(-1)[0])


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


# ---------------------------------------------------------------------------------------------
# The page


def test_page_lists_every_tensor_with_every_methods_range(full_report, state):
    page = _page(full_report)
    assert page.scripts == 0
    text = (full_report / "index.html").read_text(encoding="utf-8")
    assert "http://" not in text and "https://" not in text  # nothing fetched
    rows = {r["name"]: r for r in page.rows}
    assert sorted(rows) == sorted(state.names) and len(page.rows) == len(state.names)
    assert set(NAMES.values()) <= set(rows)
    for m in ORT:
        expected = state.compute(m, symmetric=False).data
        for name in state.names:
            got, want = rows[name]["ranges"][m], _pair(expected[name])
            assert _same(got[0], want[0]) and _same(got[1], want[1]), (m, name, got, want)
    if not KERNELS:
        pytest.skip("mse/kl/pow2/auto kernels are not in this build")
    for m, options in (
        ("mse", {"qtype": "int8", "symmetric": False}),
        ("kl", {}),
        ("pow2", {"qtype": "int8", "pow2_method": "MinMSE", "minmse_mode": "All"}),
        ("auto", {"qtype": "int8", "symmetric": False}),
    ):
        pairs, choices = state.method_ranges(m, **options)
        computed = state.compute(m, **options).data
        for i, name in enumerate(state.names):
            assert rows[name]["ranges"][m] == tuple(pairs[i]), (m, name)
            low, high = _pair(computed[name])  # the TensorsData carries the same range in the tensor's dtype
            assert (low, high) == tuple(float(np.float32(v)) for v in pairs[i])
            if m == "auto":
                assert rows[name]["auto"] == choices[i]


def test_errors_are_the_kernels_estimates(full_report, state):
    if not KERNELS:
        pytest.skip("qerrors kernel is not in this build")
    page = _page(full_report)
    for row in page.rows:
        for m, err in row["errors"].items():
            low, high = row["ranges"][m]
            assert math.isfinite(low) and math.isfinite(high)
            assert (
                err
                == state.stream.qerrors(
                    [row["name"]], [(low, high)], scale_rule=SCALE_RULE, qtype="int8", symmetric=False
                )[0]
            )
        # every finite range has an estimate
        assert set(row["errors"]) == {m for m, r in row["ranges"].items() if all(map(math.isfinite, r))}


def test_rows_by_outlier_ratio_and_highlight(full_report, state):
    page = _page(full_report)
    ratios = [r.get("ratio", -1.0) for r in page.rows]
    assert ratios == sorted(ratios, reverse=True)
    top = page.rows[0]
    assert top["name"] in (NAMES["spike"], NAMES["spike2"])
    assert top["ratio"] > report.OUTLIER_THRESHOLD and "out" in top["ratio_class"]
    # the ratio: max|x| over the p99.99 of |x| read from the streaming histogram
    assert all(r["ratio"] >= 1.0 for r in page.rows if "ratio" in r)
    calm = {r["name"]: r for r in page.rows}[NAMES["upper"]]  # sigmoid: bounded, no outlier
    assert calm["ratio"] < report.OUTLIER_THRESHOLD and "out" not in calm["ratio_class"]


def test_nonfinite_counts_shown(full_report, state):
    text = (full_report / "index.html").read_text(encoding="utf-8")
    _finite, _nan, _posinf, neginf, _ = state.counts(NAMES["log"])
    assert neginf > 0
    assert f"{neginf:,} -Inf" in text
    rows = {r["name"]: r for r in _page(full_report).rows}
    assert rows[NAMES["log"]]["ranges"]["minmax"][0] == -math.inf


def test_images_exist_are_pngs_and_are_linked(full_report, state):
    page = _page(full_report)
    pngs = sorted((full_report / "tensors").iterdir())
    assert len(pngs) == len(state.names) == len(page.images)
    for png in pngs:
        assert re.fullmatch(r"[A-Za-z0-9._-]+\.png", png.name), png.name
        with Image.open(png) as im:
            im.verify()
        with Image.open(png) as im:
            assert im.format == "PNG" and im.size == (
                int(report.FIG_SIZE[0] * report.FIG_DPI),
                int(report.FIG_SIZE[1] * report.FIG_DPI),
            )
    assert len({p.name.lower() for p in pngs}) == len(pngs)  # distinct on case-insensitive file systems
    assert sorted(page.images) == sorted(f"tensors/{p.name}" for p in pngs)
    # every tensor name in the table links to its section
    assert set(page.links) - {"summary"} <= set(page.ids) and len(set(page.links) - {"summary"}) == len(pngs)


def test_safe_file_names():
    names = [
        "a/b",
        "a:b",
        "a_b",
        "A_b",
        "Enc",
        "enc",
        "блок/relu 出力",
        "出力",
        "",
        "con",
        "x" * 300,
        ".hidden",
        "..",
        "a_b-2",
    ]
    stems = report.safe_file_names(names)
    assert len({s.lower() for s in stems}) == len(names)
    for s in stems:
        assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", s) and len(s) <= 100, s
    assert stems[2] == "a_b" and stems[4] == "Enc"  # safe names are kept
    assert stems[9] != "con"
    assert report.safe_file_names(names) == stems  # deterministic


# ---------------------------------------------------------------------------------------------
# Options


def test_methods_subset_qtype_and_max_tensors(files, state, tmp_path):
    out = tmp_path / "r"
    report.write_report(
        files["state"], out, methods=["percentile", "minmax"], symmetric=True, qtype="uint8", max_tensors=2, workers=1
    )
    page = _page(out)
    assert len(page.rows) == len(state.names)
    assert {m for r in page.rows for m in r["ranges"]} == {"minmax", "percentile"}
    expected = state.compute("percentile", symmetric=True).data
    for r in page.rows:
        got, want = r["ranges"]["percentile"], _pair(expected[r["name"]])
        assert _same(got[0], want[0]) and _same(got[1], want[1])
    # only the two worst tensors are plotted
    assert len(list((out / "tensors").iterdir())) == 2 == len(page.images)
    assert [bool(r.get("linked")) for r in page.rows] == [True, True] + [False] * (len(page.rows) - 2)
    text = (out / "index.html").read_text(encoding="utf-8")
    assert "uint8" in text and "symmetric" in text and str(files["state"]) in text
    with pytest.raises(ValueError, match="report methods"):
        report.write_report(state, tmp_path / "x", methods=["distribution"])
    with pytest.raises(ValueError, match="qtype"):
        report.write_report(state, tmp_path / "x", qtype="int4")
    assert not (tmp_path / "x").exists()


def test_qtype_and_symmetric_reach_the_methods_and_errors(state, tmp_path):
    if not KERNELS:
        pytest.skip("mse/kl/pow2/auto kernels are not in this build")
    out = tmp_path / "u8"
    report.write_report(
        state, out, methods=["mse", "auto", "pow2", "entropy"], qtype="uint8", symmetric=True, max_tensors=0
    )
    rows = {r["name"]: r for r in _page(out).rows}
    expected = {
        m: state.method_ranges(m, **o)[0]
        for m, o in (
            ("mse", {"qtype": "uint8", "symmetric": True}),
            ("auto", {"qtype": "uint8", "symmetric": True}),
            ("pow2", {"qtype": "uint8"}),
        )
    }
    entropy = state.compute("entropy", symmetric=True).data
    for i, name in enumerate(state.names):
        row = rows[name]
        for m, pairs in expected.items():
            assert row["ranges"][m] == tuple(pairs[i]), (m, name)
        assert row["ranges"]["entropy"] == _pair(entropy[name])
        for m, err in row["errors"].items():
            assert (
                err
                == state.stream.qerrors(
                    [name], [row["ranges"][m]], scale_rule=SCALE_RULE, qtype="uint8", symmetric=True
                )[0]
            )


def test_pow2_without_the_qtype_is_reported_not_fatal(state, tmp_path):
    out = tmp_path / "u16"
    report.write_report(state, out, qtype="uint16", methods=["minmax", "pow2"], max_tensors=0)
    text = (out / "index.html").read_text(encoding="utf-8")
    assert "pow2 has no uint16 variant" in text
    assert list((out / "tensors").iterdir()) == []


def test_parallel_workers_render_the_same_images(state, tmp_path, monkeypatch):
    monkeypatch.setattr(report_images, "_PARALLEL_MIN", 1)
    one, two = tmp_path / "one", tmp_path / "two"
    report.write_report(state, one, methods=["minmax", "entropy"], workers=1)
    report.write_report(state, two, methods=["minmax", "entropy"], workers=2)
    a = {p.name: p.read_bytes() for p in (one / "tensors").iterdir()}
    b = {p.name: p.read_bytes() for p in (two / "tensors").iterdir()}
    assert a == b and len(a) == len(state.names)


def test_rewrite_replaces_images_and_keeps_other_files(state, tmp_path):
    out = tmp_path / "again"
    report.write_report(state, out, methods=["minmax"], workers=1)
    (out / "notes.txt").write_text("mine")
    (out / "tensors" / "stale.png").write_bytes(b"old")
    report.write_report(state, out, methods=["minmax"], max_tensors=1, workers=1)
    assert (out / "notes.txt").read_text() == "mine"
    assert len(list((out / "tensors").iterdir())) == 1
    assert not any(p.name.startswith(".") for p in out.iterdir())
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no staging left behind
    # a tensors/ folder that is not a report's is never replaced
    (out / "tensors" / "data.npy").write_bytes(b"precious")
    with pytest.raises(ValueError, match="not report images"):
        report.write_report(state, out, methods=["minmax"])
    assert (out / "tensors" / "data.npy").read_bytes() == b"precious"
    # nor an index.html that is not a report
    other = tmp_path / "site"
    other.mkdir()
    (other / "index.html").write_text("<html>my page</html>")
    with pytest.raises(ValueError, match="not a histocal report"):
        report.write_report(state, other, methods=["minmax"])
    assert (other / "index.html").read_text() == "<html>my page</html>" and not (other / "tensors").exists()


# ---------------------------------------------------------------------------------------------
# Command line


def test_cli_report(files, state, tmp_path, capsys):
    out = tmp_path / "deep" / "er" / "dir"
    assert (
        main(["report", str(files["state"]), "--out", str(out), "--methods", "minmax", "entropy", "--max-tensors", "3"])
        == 0
    )
    stdout = capsys.readouterr().out
    assert f"report of {len(state.names)} tensors (3 plotted)" in stdout
    assert (out / "index.html").is_file() and len(list((out / "tensors").iterdir())) == 3


@pytest.mark.subprocess
def test_cli_report_subprocess(files, tmp_path):
    out = tmp_path / "sub"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "histocal",
            "report",
            str(files["state"]),
            "--out",
            str(out),
            "--methods",
            "minmax",
            "--no-symmetric",
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert (out / "index.html").is_file()


def test_cli_corrupt_state(files, tmp_path, capsys):
    bad = tmp_path / "bad.hcs"
    raw = files["state"].read_bytes()
    bad.write_bytes(raw[: len(raw) // 2])
    out = tmp_path / "out"
    assert main(["report", str(bad), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("histocal: error:")]
    assert len(lines) == 1 and str(bad) in lines[0]
    assert not out.exists()
    assert main(["report", str(tmp_path / "missing.hcs"), "--out", str(out)]) == 1
    assert "missing.hcs" in capsys.readouterr().err and not out.exists()


def test_cli_usage_errors(files, tmp_path):
    assert main(["report", str(files["state"])]) == 2  # no --out
    assert main(["report", str(files["state"]), "--out", str(tmp_path / "o"), "--qtype", "int4"]) == 2
    assert main(["report", str(files["state"]), "--out", str(tmp_path / "o"), "--methods", "distribution"]) == 2
    assert main(["report", str(files["state"]), "--out", str(tmp_path / "o"), "--max-tensors", "-1"]) == 2
    assert not (tmp_path / "o").exists()


def test_output_is_a_file(files, tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["report", str(files["state"]), "--out", str(target)]) == 1
    assert "not a directory" in capsys.readouterr().err
    assert target.read_text() == "x"


def test_missing_matplotlib(files, state, tmp_path, monkeypatch, capsys):
    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "out"
    assert main(["report", str(files["state"]), "--out", str(out)]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    # histocal is not on a package index: the hint names matplotlib itself, or the source folder's extra
    assert len(lines) == 1 and "pip install matplotlib" in lines[0] and "'.[report]'" in lines[0], lines
    assert "histocal[report]" not in lines[0]
    with pytest.raises(ImportError, match=r"pip install matplotlib"):
        report.write_report(state, out)
    assert not out.exists()

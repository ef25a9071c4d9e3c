"""``histocal calibrate --quark``: Quark's calibrators (histocal.quark) from the command line give
the cache the Python API gives."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from support import models

import histocal.io.cache
from histocal import quark
from histocal.cli import main
from histocal.io.data import open_calibration_data


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("quark_cli")
    onnx.save(models.cnn(), root / "cnn.onnx")
    rng = np.random.default_rng(5)
    (root / "npy").mkdir()
    for i in range(5):
        np.save(root / "npy" / f"s{i}.npy", (rng.normal(size=(3, 8, 8)) * (1 + i)).astype(np.float32))
    return root


def api_ranges(work, factory, **kwargs):
    data = open_calibration_data(work / "cnn.onnx", work / "npy", batch_size=1)
    cal = factory(work / "cnn.onnx", **kwargs)
    cal.collect_data(data)
    return cal.compute_data()


def cli_ranges(work, tmp_path, *args):
    cache = tmp_path / "c.json"
    rc = main(["calibrate", str(work / "cnn.onnx"), "--data", str(work / "npy"), "--no-progress", "--quark",
               "--cache", str(cache), *args])  # fmt: skip
    assert rc == 0
    return histocal.io.cache.load_tensors_data(cache)


def assert_same(a, b):
    assert a.calibration_method == b.calibration_method and set(a.data) == set(b.data)
    for name, t in a.data.items():
        for attr in ("lowest", "highest"):
            assert np.array_equal(np.ravel(getattr(t, attr)), np.ravel(getattr(b.data[name], attr))), (name, attr)


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ([], {}),  # Quark's default: NonOverflow (symmetric MinMax)
        (["--pow2-method", "MinMSE"], {"method": "MinMSE"}),
        (
            ["--pow2-method", "MinMSE", "--minmse-mode", "MostCommon", "--qtype", "int16"],
            {"method": "MinMSE", "activation_type": "QInt16", "extra_options": {"minmse_mode": "MostCommon"}},
        ),
        (
            ["--pow2-method", "MinMSE", "--no-symmetric"],
            {"method": "MinMSE", "extra_options": {"symmetric": False, "num_bins": 0}},
        ),
        (["--pow2-method", "MinMSE", "--num-bins", "512"], {"method": "MinMSE", "extra_options": {"num_bins": 512}}),
    ],
)
def test_pow2(work, tmp_path, args, kwargs):
    ours = cli_ranges(work, tmp_path, "--method", "pow2", *args)
    assert_same(ours, api_ranges(work, quark.create_calibrator_power_of_two, **kwargs))


def test_float_scale_uses_quarks_factory_defaults(work, tmp_path):
    ours = cli_ranges(work, tmp_path, "--method", "percentile", "--num-bins", "512")
    expected = api_ranges(
        work, quark.create_calibrator_float_scale, calibrate_method="Percentile", extra_options={"num_bins": 512}
    )
    assert_same(ours, expected)


def test_quark_usage_errors(work, tmp_path, capsys):
    base = ["calibrate", str(work / "cnn.onnx"), "--data", str(work / "npy"), "--quark"]
    assert main([*base, "--method", "kl", "--cache", str(tmp_path / "c.json")]) == 2
    assert "--quark takes --method" in capsys.readouterr().err
    assert main([*base, "--method", "pow2", "--state", str(tmp_path / "s.hcs")]) == 1
    assert "keeps no histocal state" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, factory, kwargs",
    [
        (["--method", "entropy"], "create_calibrator_float_scale", {"calibrate_method": "Entropy"}),
        (["--method", "pow2", "--pow2-method", "MinMSE"], "create_calibrator_power_of_two", {"method": "MinMSE"}),
        (
            ["--method", "pow2", "--pow2-method", "MinMSE", "--no-symmetric", "--qtype", "int16"],
            "create_calibrator_power_of_two",
            {"method": "MinMSE", "activation_type": "QInt16", "extra_options": {"symmetric": False}},
        ),
    ],
)
def test_quark_version_0_9(work, tmp_path, args, factory, kwargs):
    """--quark-version 0.9: histocal.quark.v0_9's factories (Quark 0.9's merging and MinMSE)."""
    from histocal.quark import v0_9

    ours = cli_ranges(work, tmp_path, "--quark-version", "0.9", *args)
    assert_same(ours, api_ranges(work, getattr(v0_9, factory), **kwargs))


def test_quark_version_needs_quark(work, tmp_path, capsys):
    rc = main(["calibrate", str(work / "cnn.onnx"), "--data", str(work / "npy"), "--quark-version", "0.9",
               "--cache", str(tmp_path / "c.json")])  # fmt: skip
    assert rc == 2 and "--quark-version applies to --quark only" in capsys.readouterr().err

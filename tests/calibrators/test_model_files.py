"""Creating a calibrator writes nothing beside the user's model.

onnxruntime's ``CalibraterBase`` infers shapes through a file ``<model>-inferred.onnx`` written
beside the model and deleted after: calibrators of one model created at once delete each other's
file (FileNotFoundError), and a model in a read-only folder cannot be calibrated. histocal infers
shapes in memory; the model it gets must be the very ModelProto ORT's file round trip gives.
"""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import onnx
import pytest
from onnxruntime.quantization import calibrate as ort_calibrate
from onnxruntime.quantization.quant_utils import load_model_with_shape_infer as ort_load
from support import models
from support.calibrator_runs import BUILDERS, RewindReader
from support.parity import quiet

import histocal
from histocal import quark
from histocal.calibrators.common import load_model_with_shape_infer

KINDS = ("MinMax", "Entropy", "Percentile", "Distribution", "mse")


def _external_model(folder: Path) -> Path:
    """The cnn with its weights in a side file (ORT loads them from the inferred file's folder)."""
    path = folder / "external.onnx"
    onnx.save_model(
        models.cnn(), path.as_posix(), save_as_external_data=True, location="external.data", size_threshold=0
    )
    return path


@pytest.mark.parametrize("name", [*BUILDERS, "external"])
def test_model_is_ort_s(tmp_path, name):
    """The shape-inferred model equals the one ORT's load_model_with_shape_infer returns."""
    if name == "external":
        path = _external_model(tmp_path)
    else:
        path = tmp_path / f"{name}.onnx"
        onnx.save(BUILDERS[name](), path.as_posix())
    before = sorted(os.listdir(tmp_path))
    ours = load_model_with_shape_infer(path)
    assert sorted(os.listdir(tmp_path)) == before
    assert ours.SerializeToString() == ort_load(path).SerializeToString()


def test_attributes_are_ort_s(tmp_path):
    """The base class sets what ORT's sets (an ORT upgrade that adds one fails here)."""
    path = tmp_path / "cnn.onnx"
    onnx.save(models.cnn(), path.as_posix())
    args = (path.as_posix(), ["Conv"], "aug.onnx", True, False, True)
    ort = ort_calibrate.CalibraterBase(*args)
    ours = histocal.calibrators.common.PrivateShapeInference(*args)
    assert ours.model.SerializeToString() == ort.model.SerializeToString()
    assert {k: v for k, v in vars(ours).items() if k != "model"} == {k: v for k, v in vars(ort).items() if k != "model"}
    with pytest.raises(ValueError, match="model_path should be model path"):
        histocal.calibrators.common.PrivateShapeInference(models.cnn())


def _create(path: Path, kind: str):
    if kind == "pow2":
        return quark.create_calibrator_power_of_two(path)
    return histocal.create_calibrator(path, calibrate_method=kind)


@pytest.mark.parametrize("kind", [*KINDS, "pow2"])
def test_nothing_written_beside_the_model(tmp_path, kind):
    path = tmp_path / "cnn.onnx"
    onnx.save(models.cnn(), path.as_posix())
    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:  # catches a file written and deleted while the calibrator is made
        while not stop.is_set():
            seen.update(os.listdir(tmp_path))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with quiet():
            cal = _create(path, kind)
            cal.collect_data(RewindReader(models.cnn_feeds(2)))
            assert len(cal.compute_data().data) > 0
    finally:
        stop.set()
        watcher.join()
    assert seen | set(os.listdir(tmp_path)) == {"cnn.onnx"}


def test_calibrators_of_one_model_created_at_once(tmp_path):
    """ORT's base class failed here: threads deleted each other's ``cnn-inferred.onnx``."""
    path = tmp_path / "cnn.onnx"
    onnx.save(models.cnn(), path.as_posix())
    threads, rounds = 8, 3
    errors: list[BaseException] = []
    made: list[object] = []

    def make(barrier: threading.Barrier, kind: str) -> None:
        barrier.wait()
        try:
            with quiet():
                made.append(histocal.create_calibrator(path, calibrate_method=kind))
        except BaseException as e:  # every failure is the finding
            errors.append(e)

    for _ in range(rounds):
        barrier = threading.Barrier(threads)
        workers = [threading.Thread(target=make, args=(barrier, KINDS[i % len(KINDS)])) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert errors == []
    assert len(made) == threads * rounds
    assert os.listdir(tmp_path) == ["cnn.onnx"]


_READ_ONLY_RUN = textwrap.dedent(
    """
    import sys
    import numpy as np
    import histocal
    from onnxruntime.quantization.calibrate import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.feeds = iter([{"X": rng.normal(size=(2, 3, 8, 8)).astype(np.float32)} for _ in range(2)])

        def get_next(self):
            return next(self.feeds, None)

    for kind in ("MinMax", "Entropy", "Percentile", "Distribution", "mse"):
        cal = histocal.create_calibrator(sys.argv[1], calibrate_method=kind)
        cal.collect_data(Reader())
        assert len(cal.compute_data().data) > 0, kind
    print("ok")
    """
)


def _without_dac_override() -> None:
    """Root writes into any folder whatever its mode: drop the capabilities that let it
    (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER) from the bounding set before exec."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2, 3):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.subprocess
def test_model_in_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "cnn.onnx"
    onnx.save(models.cnn(), path.as_posix())
    os.chmod(path, 0o444)
    os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    probe = subprocess.run(
        [sys.executable, "-c", f"open({(folder / 'probe').as_posix()!r}, 'w')"],
        capture_output=True,
        preexec_fn=_without_dac_override,
    )
    assert probe.returncode != 0, "the folder must be read-only to the test's subprocess"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        result = subprocess.run(
            [sys.executable, "-c", _READ_ONLY_RUN, path.as_posix()],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd="/",
            preexec_fn=_without_dac_override,
        )
    finally:
        os.chmod(folder, 0o755)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
    assert os.listdir(folder) == ["cnn.onnx"]

"""patch_onnxruntime() with clients that bind or patch onnxruntime's calibration themselves.

* Hugging Face Optimum's ORTQuantizer imports ``create_calibrator`` from
  ``onnxruntime.quantization.calibrate`` at module level (optimum/onnxruntime/configuration.py):
  a name bound before the patch. The patch also replaces the calibrator classes that ORT's
  ``create_calibrator`` looks up when called, so that bound function makes histocal's calibrators.
* Olive 0.13's OnnxStaticQuantization replaces ``MinMaxCalibrater.augment_graph`` in
  ``onnxruntime.quantization.calibrate`` (to drop the model's outputs from the augmented model)
  right before it calls quantize_static. histocal's calibrators keep their own (they never hold
  the model's outputs Olive drops), and the ranges are ORT's either way; a change made while
  patched lands on a class of the patch's own and goes with it, never on histocal's class.
"""

from __future__ import annotations

import importlib
import types

import onnx
import pytest
from onnxruntime.quantization import calibrate as oc
from support.calibrator_runs import (
    DIST,
    ENT,
    MM,
    ORT_CREATE,
    ORT_QUANTIZE,
    PCT,
    RewindReader,
    assert_tensors_same,
    chunks_for,
    flat,
)
from support.parity import quiet

import histocal
from histocal import calibrators

ORT_CLASSES = {
    name: getattr(oc, name)
    for name in ("MinMaxCalibrater", "EntropyCalibrater", "PercentileCalibrater", "DistributionCalibrater")
}


def _ranges(create, path, tmp_path, method, feeds, extra=None):
    calibrator = create(
        path,
        [],
        augmented_model_path=(tmp_path / f"aug_{method.name}.onnx").as_posix(),
        calibrate_method=method,
        extra_options=dict(extra or {}),
    )
    calibrator.collect_data(RewindReader(feeds))
    return calibrator, calibrator.compute_data()


@pytest.mark.parity
@pytest.mark.parametrize(
    "method,extra",
    [
        (MM, {"symmetric": False, "moving_average": False, "averaging_constant": 0.01}),
        (ENT, {"num_bins": 128, "num_quantized_bins": 128, "symmetric": False}),
        (PCT, {"num_bins": 2048, "percentile": 99.99}),
        (DIST, {}),
    ],
    ids=lambda v: getattr(v, "name", None) or str(len(v)),
)
def test_create_calibrator_bound_before_patching(paths, tmp_path, method, extra):
    # As Optimum: `from onnxruntime.quantization.calibrate import create_calibrator` at import.
    bound = importlib.import_module("onnxruntime.quantization.calibrate").create_calibrator
    assert bound is ORT_CREATE
    feeds = flat(chunks_for("transformer", 1))
    _, expected = _ranges(bound, paths["transformer"], tmp_path, method, feeds, extra)
    with histocal.patch_onnxruntime():
        calibrator, got = _ranges(bound, paths["transformer"], tmp_path, method, feeds, extra)
        assert isinstance(calibrator, getattr(calibrators, type(calibrator).__name__))
        assert type(calibrator).__module__.startswith("histocal.")
    assert_tensors_same(expected, got)
    # unpatched again: the bound function makes ORT's calibrators
    for name, cls in ORT_CLASSES.items():
        assert getattr(oc, name) is cls
    again, _ = _ranges(bound, paths["transformer"], tmp_path, method, feeds[:1], extra)
    assert type(again) is ORT_CLASSES[type(again).__name__]


def test_quantize_static_bound_before_patching_is_orts_model(paths, tmp_path):
    # quantize_static itself bound before patching (a client's `from ... import quantize_static`):
    # it calls create_calibrator through its module, patched, and makes ORT's model.
    quantize_static = ORT_QUANTIZE.quantize_static
    feeds = flat(chunks_for("cnn", 1))
    with quiet():
        quantize_static(paths["cnn"], (tmp_path / "ort.onnx").as_posix(), RewindReader(feeds), calibrate_method=ENT)
        with histocal.patch_onnxruntime():
            quantize_static(paths["cnn"], (tmp_path / "hc.onnx").as_posix(), RewindReader(feeds), calibrate_method=ENT)
    assert (tmp_path / "ort.onnx").read_bytes() == (tmp_path / "hc.onnx").read_bytes()


def _drop_model_outputs(original):
    """What Olive 0.13 does to MinMaxCalibrater.augment_graph (our own code, same effect): after
    the original, remove the model's own outputs from the augmented model."""

    def augment_graph(self):
        original(self)
        model = onnx.load(self.augmented_model_path)
        kept = [o for o in model.graph.output if o.name not in self.model_original_outputs]
        del model.graph.output[:]
        model.graph.output.extend(kept)
        self.num_model_outputs -= len(self.model_original_outputs)
        self.model_original_outputs = set()
        onnx.save(model, self.augmented_model_path)

    return augment_graph


@pytest.mark.parity
def test_client_patch_of_minmax_while_patched_changes_nothing(paths, tmp_path):
    feeds = flat(chunks_for("cnn", 1))
    histocal_augment = calibrators.MinMaxCalibrater.augment_graph
    with quiet():
        ORT_QUANTIZE.quantize_static(paths["cnn"], (tmp_path / "ort.onnx").as_posix(), RewindReader(feeds))
        with histocal.patch_onnxruntime():
            cls = importlib.import_module("onnxruntime.quantization.calibrate").MinMaxCalibrater
            assert issubclass(cls, calibrators.MinMaxCalibrater) and cls is not calibrators.MinMaxCalibrater
            cls.augment_graph = _drop_model_outputs(cls.augment_graph)  # as Olive, after the patch
            ORT_QUANTIZE.quantize_static(paths["cnn"], (tmp_path / "hc.onnx").as_posix(), RewindReader(feeds))
    assert (tmp_path / "ort.onnx").read_bytes() == (tmp_path / "hc.onnx").read_bytes()
    # the client's change went with the patch: histocal's class and ORT's are as they were
    assert calibrators.MinMaxCalibrater.augment_graph is histocal_augment
    assert oc.MinMaxCalibrater is ORT_CLASSES["MinMaxCalibrater"]


@pytest.mark.parity
def test_client_patch_of_orts_minmax_before_patching_is_not_used(paths, tmp_path, monkeypatch):
    # Olive patching first: ORT's class changes, histocal's calibrators (their own augment_graph,
    # fetching only the reduced outputs: what Olive's trim saves, they never hold) give ORT's ranges.
    feeds = flat(chunks_for("cnn", 1))
    with quiet():
        ORT_QUANTIZE.quantize_static(paths["cnn"], (tmp_path / "ort.onnx").as_posix(), RewindReader(feeds))
        monkeypatch.setattr(
            oc.MinMaxCalibrater, "augment_graph", _drop_model_outputs(oc.MinMaxCalibrater.augment_graph)
        )
        with histocal.patch_onnxruntime():
            ORT_QUANTIZE.quantize_static(paths["cnn"], (tmp_path / "hc.onnx").as_posix(), RewindReader(feeds))
    assert (tmp_path / "ort.onnx").read_bytes() == (tmp_path / "hc.onnx").read_bytes()


def _client_binding_while_patched():
    """A client module imported while patched that binds ORT's names at import, as Optimum does."""
    client = types.ModuleType("fake_client")
    exec(
        "from onnxruntime.quantization.calibrate import create_calibrator, EntropyCalibrater\n"
        "from onnxruntime.quantization import create_calibrator as package_create_calibrator\n",
        client.__dict__,
    )
    return client


@pytest.mark.parity
def test_names_bound_while_patched_go_back_to_ort_after_the_unpatch(paths, tmp_path):
    aug = (tmp_path / "aug.onnx").as_posix()
    histocal.patch_onnxruntime()
    try:
        client = _client_binding_while_patched()
        for create in (client.create_calibrator, client.package_create_calibrator):
            made = create(paths["cnn"], [], augmented_model_path=aug, calibrate_method=ENT)
            assert type(made).__module__.startswith("histocal."), type(made)
        assert isinstance(client.EntropyCalibrater(paths["cnn"], [], aug), calibrators.EntropyCalibrater)
    finally:
        histocal.unpatch_onnxruntime()
    assert not histocal.is_patched()
    for create in (client.create_calibrator, client.package_create_calibrator):
        again = create(paths["cnn"], [], augmented_model_path=aug, calibrate_method=ENT)
        assert type(again) is ORT_CLASSES["EntropyCalibrater"]
    assert type(client.EntropyCalibrater(paths["cnn"], [], aug)) is ORT_CLASSES["EntropyCalibrater"]
    # a client's own subclass of the bound class stays its own class
    subclass = type("ClientEntropy", (client.EntropyCalibrater,), {})
    assert type(subclass(paths["cnn"], [], aug)) is subclass
    # patched again, the same bindings make histocal's calibrators again
    with histocal.patch_onnxruntime():
        made = client.create_calibrator(paths["cnn"], [], augmented_model_path=aug, calibrate_method=ENT)
        assert type(made).__module__.startswith("histocal.")

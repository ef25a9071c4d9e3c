"""Readers, models, data and the ORT and histocal runners shared by the test_calibrators_*.py
files (histocal's calibrators against onnxruntime's own; conftest.py's ``paths`` fixture saves
the BUILDERS models)."""

from __future__ import annotations

import contextlib
import importlib

import numpy as np
from onnxruntime.quantization import calibrate as oc
from onnxruntime.quantization.calibrate import CalibrationDataReader, CalibrationMethod, TensorData, TensorsData

import histocal

from . import models
from .parity import argmin_spy, assert_entropy_threshold, assert_same, quiet

MM, ENT, PCT, DIST = (
    CalibrationMethod.MinMax,
    CalibrationMethod.Entropy,
    CalibrationMethod.Percentile,
    CalibrationMethod.Distribution,
)
ORT_QUANTIZE = importlib.import_module("onnxruntime.quantization.quantize")
ORT_CREATE = oc.create_calibrator


# ----------------------------------------------------------------------------------------------
# Readers
# ----------------------------------------------------------------------------------------------


class RewindReader(CalibrationDataReader):
    """A CalibrationDataReader with rewind() (histocal reads it twice in exact mode)."""

    def __init__(self, feeds):
        self.feeds = list(feeds)
        self.i = 0
        self.reads = 0

    def get_next(self):
        if self.i == 0:
            self.reads += 1
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        return self.feeds[self.i - 1]

    def rewind(self):
        self.i = 0


class OnceReader(CalibrationDataReader):
    """A CalibrationDataReader without rewind(): can be read only once."""

    def __init__(self, feeds):
        self.it = iter(list(feeds))

    def get_next(self):
        return next(self.it, None)


class StridedReader(RewindReader):
    """Supports len() and set_range() (quantize_static's CalibStridedMinMax)."""

    def __init__(self, feeds):
        super().__init__(feeds)
        self.all = list(feeds)

    def __len__(self):
        return len(self.all)

    def set_range(self, start_index, end_index):
        self.feeds = self.all[start_index:end_index]
        self.i = 0


FORMS = ("list", "rewind", "once")


def as_form(feeds, form):
    if form == "list":
        return list(feeds)
    if form == "rewind":
        return RewindReader(feeds)
    if form == "once":
        return OnceReader(feeds)
    if form == "as is":
        return feeds
    raise AssertionError(form)


# ----------------------------------------------------------------------------------------------
# Models and data
# ----------------------------------------------------------------------------------------------

BUILDERS = {
    "cnn": models.cnn,
    "cnn19": lambda: models.cnn(opset=19),
    "transformer": models.transformer,
    "transformer18": lambda: models.transformer(opset=18),
    "fp16": models.fp16,
    "empty": models.empty_slice,
    "passthrough": models.passthrough,
}


def split(feeds, sizes):
    assert sum(sizes) == len(feeds)
    out, i = [], 0
    for s in sizes:
        out.append(feeds[i : i + s])
        i += s
    return out


def chunks_for(model: str, ncalls: int) -> list[list[dict]]:
    """The batches of each collect_data call (shapes fixed within a call: ORT needs that)."""
    if model.startswith("transformer"):
        if ncalls == 1:
            return [models.transformer_feeds([5, 5, 5])]
        # The sequence length changes between calls (dynamic dims across calls work in ORT).
        return [
            models.transformer_feeds([4, 4], seed=1),
            models.transformer_feeds([6], seed=2),
            models.transformer_feeds([3, 3], seed=3),
        ]
    if model.startswith("cnn"):
        feeds = models.cnn_feeds(5)
    elif model == "fp16":
        feeds = models.vector_feeds(5, width=16, dtype=np.float16)
    else:
        feeds = models.vector_feeds(5)
    return [feeds] if ncalls == 1 else split(feeds, [2, 1, 2])


def flat(chunks):
    return [f for c in chunks for f in c]


# ----------------------------------------------------------------------------------------------
# Running ORT and histocal
# ----------------------------------------------------------------------------------------------


class OrtResult:
    def __init__(self, td, calibrator, kl):
        self.td, self.calibrator, self.kl = td, calibrator, kl

    @property
    def hist(self):
        return self.calibrator.collector.histogram_dict if getattr(self.calibrator, "collector", None) else {}


def run_ort(path, method, opts, chunks, aug, op_types=None) -> OrtResult:
    with quiet():
        cal = ORT_CREATE(path, op_types, aug.as_posix(), method, extra_options=dict(opts))
        for chunk in chunks:
            cal.collect_data(RewindReader(chunk))
        records: list = []
        with argmin_spy(records) if method == ENT else contextlib.nullcontext():
            td = cal.compute_data()
    kl = dict(zip(list(cal.collector.histogram_dict), records)) if method == ENT else {}
    return OrtResult(td, cal, kl)


def make_histocal(path, method, opts, aug, op_types=None, mode="exact"):
    extra = dict(opts)
    if mode is not None:
        extra["CollectionMode"] = mode
    return histocal.create_calibrator(path, op_types, aug.as_posix(), method, extra_options=extra)


def histocal_calibrator(path, method, opts, chunks, aug, form="list", op_types=None, mode="exact"):
    with quiet():
        cal = make_histocal(path, method, opts, aug, op_types, mode)
        for chunk in chunks:
            cal.collect_data(as_form(chunk, form))
    return cal


def batch_bytes(cal, shape, itemsize=4) -> int:
    """What one batch counts against the memory budget when each tensor the calibrator fetches
    has ``shape`` (and ``itemsize``-byte values)."""
    from histocal.calibrators.budget import KEPT_ARRAY_OVERHEAD

    return len(cal.fetch_names()) * (int(np.prod(shape)) * itemsize + KEPT_ARRAY_OVERHEAD)


def run_histocal(path, method, opts, chunks, aug, form="list", op_types=None, mode="exact") -> TensorsData:
    cal = histocal_calibrator(path, method, opts, chunks, aug, form, op_types, mode)
    with quiet():
        return cal.compute_data()


def _nothing_binned(o: TensorData, ort_run: OrtResult | None, name: str) -> bool:
    """Whether ORT's Percentile range is the inverted one of a tensor with nothing binned (a
    constant tensor's range comes out inverted from ORT too, and stays ORT's). ORT's TensorData
    holds only the first two counts, so without ORT's histogram the empty tensor's (0, -0.5) tells."""
    if not o.lowest > o.highest:
        return False
    if ort_run is not None:
        return not np.any(ort_run.hist[name][0])
    return bool(o.lowest == 0 and o.highest == -0.5)


def assert_tensors_same(
    ort_td: TensorsData,
    ours: TensorsData,
    where: str = "",
    ort_run: OrtResult | None = None,
    nq: int = 128,
    deviating: frozenset = frozenset(),
) -> list[str]:
    """Same TensorsData as a map. Returns the entropy tensors accepted as KL near-ties.
    ``deviating``: tensors whose values are not compared (a documented deviation, checked by
    the caller); their keys, attributes and types still are."""
    assert type(ours) is TensorsData, f"{where}: {type(ours)}"
    assert ours.calibration_method == ort_td.calibration_method
    assert set(ours.data) == set(ort_td.data), f"{where}: keys {sorted(ours.data)} != ORT's {sorted(ort_td.data)}"
    near = []
    for name, o in ort_td.data.items():
        h = ours.data[name]
        w = f"{where}[{name!r}]"
        assert type(h) is TensorData, f"{w}: {type(h)}"
        assert h._attrs == o._attrs, f"{w}: attributes {h._attrs} != ORT's {o._attrs}"
        skip = set()
        if ort_td.calibration_method == ENT and not (o.lowest == h.lowest and o.highest == h.highest):
            assert ort_run is not None, (
                f"{w}: entropy thresholds differ: {(h.lowest, h.highest)} vs {(o.lowest, o.highest)}"
            )
            assert_entropy_threshold(
                name, (o.lowest, o.highest), (h.lowest, h.highest), ort_run.hist[name], ort_run.kl.get(name), nq
            )
            for attr in ("lowest", "highest"):
                assert type(getattr(h, attr)) is type(getattr(o, attr)), f"{w}.{attr}: type"
            skip = {"lowest", "highest"}
            near.append(name)
        if ort_td.calibration_method == PCT and np.size(o.lowest) == 1 and _nothing_binned(o, ort_run, name):
            # nothing binned: ORT's range is inverted, histocal's [lowest, lowest] (docs/deviations.md)
            hi = o.highest
            expected = np.array(o.lowest, hi.dtype) if isinstance(hi, np.ndarray) else hi.dtype.type(o.lowest)
            assert_same(expected, h.highest, f"{w}.highest")
            skip.add("highest")
        for attr in o._attrs:
            if name in deviating:
                assert np.asarray(getattr(h, attr)).dtype == np.asarray(getattr(o, attr)).dtype, f"{w}.{attr}: dtype"
            elif attr not in skip:
                assert_same(getattr(o, attr), getattr(h, attr), f"{w}.{attr}")
    return near


def ranges(td: TensorsData) -> dict[str, tuple[float, float]]:
    return {k: (float(np.max(v.lowest)), float(np.min(v.highest))) for k, v in td.data.items()}

"""Calibration data from files: ``.npy``, ``.npz``, model-zoo ``.pb`` or images -> feed dicts.

``open_calibration_data(model, paths, ...)`` returns a :class:`CalibrationData`: a re-iterable
sequence of batches ``{input_name: np.ndarray}`` (every ``iter()`` starts over) that is also an
onnxruntime ``CalibrationDataReader`` (``get_next`` / ``rewind`` / ``set_range``), so it can be
passed to ``quantize_static`` as is. Opening lists and maps the files and, by default, checks
every file's header (shape, dtype, keys, image header) so that bad data fails before anything is
written; arrays are read lazily, one batch at a time. Bad data raises :class:`DataError`, whose
message starts with the offending file. Loading never executes code (``allow_pickle=False``,
images restricted to the JPEG/PNG/BMP decoders, no external tensor data).

Finding files
    ``paths`` is a file, a folder or a list of them. Folders are walked recursively in natural
    order (``img2`` before ``img10``), skipping hidden entries, ``*.onnx`` and ``output_*.pb``;
    other unsupported files in folders are skipped with a warning, while an unsupported file
    named explicitly is an error. All data files must be of one kind (mixing is an error).

Mapping files to model inputs
    The data is a list of *items*, each giving one array per model input; ``batch_size`` counts
    items. An item's arrays may hold one sample or a batch of them (see Shapes below).
    ``.npy``   Single-input model: one file is one item. Multi-input model: a file belongs to
               the input named by its stem (``sample_0/x.npy``, ``sample_0/y.npy``: one item per
               folder) or by a stem prefix followed by ``_`` (``x_0.npy``, ``y_0.npy``: one item
               per remaining stem and folder; the longest matching input name wins). Names are
               matched as written or with characters outside ``[A-Za-z0-9._-]`` replaced by ``_``.
               Each item needs exactly one file per input.
    ``.npz``   One file is one item; its keys are exactly the input names (a single-input
               model also accepts the lone key ``arr_0`` written by ``np.savez(f, a)``).
    ``.pb``    ONNX ``TensorProto`` files (model zoo: ``test_data_set_*/input_<k>.pb``).
               Single-input model: one file is one item. Multi-input model: one folder is one
               item; a tensor goes to the input it names, or, unnamed, to input ``k``.
    images     ``.jpg .jpeg .png .bmp``, single-input models only: one file is one item (one
               sample), decoded to RGB and preprocessed (see below).

Shapes and dtypes
    An array with the input's declared rank is a batch of samples (any leading size); one with a
    dim fewer is one sample and gets a leading batch dim of 1. ``batch_size`` items in a row are
    concatenated along axis 0; the last batch may be partial. Static declared dims are checked
    (the batch dim on the assembled batch). Arrays are cast to the input's element type by the
    rule of :func:`histocal.io.readers.cast_to_input`, the same as for feeds given in Python: within
    the same kind (float64 -> float32, int -> float, int64 -> int32) when every value fits; other
    casts (float -> int, complex, strings) and values that do not fit are errors. ``input_shape``
    (single-input models) replaces the declared shape; dims ``<= 0``, ``None`` or ``?`` are dynamic.

Image preprocessing (``preprocess``), HWC uint8 RGB in, then HWC -> ``layout``, batch dim of 1:
    ``none``       pixels as they are (0..255), resized to the input's H, W if both are static;
    ``mobilenet``  resized to H, W; ``x / 127.5 - 1`` (range [-1, 1]);
    ``resnet``     shorter side resized to 256/224 of the larger of H, W (256 for the default
                   224 x 224), center-cropped to H x W (torchvision's ImageNet eval transform),
                   ``x / 255``, then ``(x - (0.485, 0.456, 0.406)) / (0.229, 0.224, 0.225)``;
    ``caffe2``     resized to H, W; channels reordered to BGR; ``x - (103.939, 116.779, 123.68)``
                   (B, G, R means, 0..255 scale).
    Resizing is bilinear (Pillow). ``layout`` defaults to the declared 4-D shape: NCHW if dim 1 is
    3, else NHWC if dim 3 is 3, else NCHW. Images always have 3 channels.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization.calibrate import CalibrationDataReader

from .samples import (
    IMAGE_SUFFIXES,
    LAYOUTS,
    PRESETS,
    DataError,
    ImageSample,
    ModelInput,
    NpySample,
    NpzSample,
    PathLike,
    PbSample,
    Sample,
    Shape,
    check_batch,
    check_dtype,
    conform,
    fit_shape,
    image_prep,
    model_inputs,
    parse_shape,
    read_pb,
)

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# The data set


class CalibrationData(CalibrationDataReader):
    """Batches ``{input_name: array}`` read lazily from files; re-iterable; an ORT data reader."""

    def __init__(self, inputs: Sequence[ModelInput], samples: Sequence[Sample], batch_size: int) -> None:
        self.inputs = tuple(inputs)
        self.batch_size = batch_size
        self._samples = list(samples)
        self._num_samples: int | None = None  # rows along the batch dim, from the headers
        self._next, self._stop = 0, len(self)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    @property
    def files(self) -> list[Path]:
        """Every data file used, in feed order."""
        return [f for s in self._samples for f in s.files]

    @property
    def num_items(self) -> int:
        """Data items: files, or one file per input of a multi-input model (``batch_size`` counts these)."""
        return len(self._samples)

    @property
    def num_samples(self) -> int:
        """Samples: rows along the batch dim over all items (a file holding a batch of k adds k)."""
        if self._num_samples is None:
            self.validate()
        assert self._num_samples is not None
        return self._num_samples

    def __len__(self) -> int:
        return math.ceil(len(self._samples) / self.batch_size)

    def __length_hint__(self) -> int:
        """Batches left in the current read (``get_next`` after ``set_range`` or a partial read)."""
        return max(self._stop - self._next, 0)

    def _chunk(self, index: int) -> list[Sample]:
        return self._samples[index * self.batch_size : (index + 1) * self.batch_size]

    def batch(self, index: int) -> dict[str, np.ndarray]:
        """Load batch ``index`` (0 <= index < len(self))."""
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} out of range (0..{len(self) - 1})")
        columns: list[list[tuple[np.ndarray, str]]] = [[] for _ in self.inputs]
        for sample in self._chunk(index):
            for inp, column, (arr, where) in zip(self.inputs, columns, sample.arrays()):
                column.append((conform(inp, arr, where), where))
        feed = {}
        for inp, column in zip(self.inputs, columns):
            arrays, wheres = zip(*column)
            check_batch(inp, [a.shape for a in arrays], wheres)
            feed[inp.name] = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        return feed

    def batch_files(self, index: int) -> list[Path]:
        """The data files of batch ``index``, in feed order."""
        return [f for s in self._chunk(index) for f in s.files]

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return (self.batch(i) for i in range(len(self)))

    def validate(self, deep: bool = False) -> None:
        """Check all files without keeping their data: headers (cheap) or, ``deep``, full loads."""
        if deep:
            for _ in self:
                pass
            return
        rows = 0
        cast: dict[tuple[str, np.dtype], str] = {}
        for index in range(len(self)):
            columns: list[list[tuple[Shape, str]]] = [[] for _ in self.inputs]
            for sample in self._chunk(index):
                for inp, column, header in zip(self.inputs, columns, sample.headers()):
                    shape, dtype, where = header
                    check_dtype(inp, dtype, where)
                    if dtype != inp.dtype:
                        cast.setdefault((inp.name, dtype), where)
                    column.append((fit_shape(inp, shape, where), where))
            for inp, column in zip(self.inputs, columns):
                shapes, wheres = zip(*column)
                check_batch(inp, shapes, wheres)
            rows += sum(s[0] if s else 1 for s, _ in columns[0])
        self._num_samples = rows
        for (name, dtype), where in cast.items():
            logger.info(
                "input %r: %s data (e.g. %s) cast to %s, the model's input type",
                name,
                dtype,
                where,
                self.inputs[self.input_names.index(name)].dtype,
            )

    # onnxruntime CalibrationDataReader protocol (index-based, so copy.deepcopy works)
    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._next >= self._stop:
            return None
        self._next += 1
        return self.batch(self._next - 1)

    def rewind(self) -> None:
        self._next, self._stop = 0, len(self)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._next, self._stop = max(start_index, 0), min(end_index, len(self))


# ---------------------------------------------------------------------------------------------
# Finding and mapping files


def _natural_key(path: Path) -> list[int | str]:
    return [int(t) if i % 2 else t.lower() for i, t in enumerate(re.split(r"(\d+)", str(path)))]


_KINDS = {".npy": "npy", ".npz": "npz", ".pb": "pb", **{s: "image" for s in IMAGE_SUFFIXES}}
_SUPPORTED = "expected .npy, .npz, .pb or images (" + " ".join(IMAGE_SUFFIXES) + ")"


def _kind(path: Path) -> str | None:
    return _KINDS.get(path.suffix.lower())


def _quietly_skipped(path: Path) -> bool:
    suffix = path.suffix.lower()
    return suffix == ".onnx" or (suffix == ".pb" and path.stem.startswith("output_"))


def _folder_files(root: Path) -> list[Path]:
    """The files under ``root`` a folder of data offers, in natural order: hidden entries left out."""
    found = [
        p for p in root.rglob("*") if p.is_file() and not any(x.startswith(".") for x in p.relative_to(root).parts)
    ]
    return sorted(found, key=_natural_key)


def data_files(paths: PathLike | Sequence[PathLike]) -> list[Path]:
    """Every file ``open_calibration_data(model, paths)`` would read, found the same way, quietly:
    a missing path or an unsupported file in a folder is left out (opening the data reports them).
    A file named explicitly is kept whatever its type. What commands keep their outputs off."""
    files: list[Path] = []
    for root in [Path(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]:
        if root.is_dir():
            files += [p for p in _folder_files(root) if not _quietly_skipped(p) and _kind(p)]
        elif root.is_file():
            files.append(root)
    return files


def _list_files(paths: Sequence[PathLike]) -> list[Path]:
    files: list[Path] = []
    skipped: list[Path] = []
    for root in map(Path, paths):
        if root.is_dir():
            for p in _folder_files(root):
                if _quietly_skipped(p):
                    logger.debug("skipping %s", p)
                elif _kind(p):
                    files.append(p)
                else:
                    skipped.append(p)
        elif root.is_file():
            if not _kind(root):
                raise DataError(f"{root}: unsupported file type ({_SUPPORTED})")
            files.append(root)
        else:
            raise DataError(f"{root}: no such file or folder")
    if skipped:
        logger.warning("skipping %d unsupported file(s), e.g. %s", len(skipped), skipped[0])
    unique: dict[Path, Path] = {}
    for f in files:
        unique.setdefault(f.resolve(), f)
    if not unique:
        raise DataError(f"{', '.join(map(str, paths))}: no calibration data files ({_SUPPORTED})")
    return list(unique.values())


def _file_names(inputs: Sequence[ModelInput]) -> dict[str, int]:
    names: dict[str, int] = {}
    for i, inp in enumerate(inputs):
        names.setdefault(inp.name, i)
        names.setdefault(re.sub(r"[^A-Za-z0-9._-]", "_", inp.name), i)
    return names


_Groups = dict[object, dict[int, Path]]  # sample key -> {input index: file}


def _grouped(inputs: Sequence[ModelInput], groups: _Groups, what: str) -> list[tuple[Path, ...]]:
    samples = []
    for slots in groups.values():
        missing = [inputs[i].name for i in range(len(inputs)) if i not in slots]
        if missing:
            first = next(iter(slots.values()))
            raise DataError(f"{first}: this {what} has no file for input(s) {missing}")
        samples.append(tuple(slots[i] for i in range(len(inputs))))
    return samples


def _assign(slots: dict[int, Path], index: int, path: Path, inputs: Sequence[ModelInput]) -> None:
    if index in slots:
        raise DataError(f"{path}: second file for input {inputs[index]} (first: {slots[index]})")
    slots[index] = path


def _npy_samples(files: list[Path], inputs: Sequence[ModelInput]) -> list[Sample]:
    if len(inputs) == 1:
        return [NpySample((f,)) for f in files]
    names = _file_names(inputs)
    groups: _Groups = {}
    for f in files:
        if f.stem in names:
            index, key = names[f.stem], ""
        else:
            prefix = max((n for n in names if f.stem.startswith(n + "_")), key=len, default=None)
            if prefix is None:
                raise DataError(
                    f"{f}: cannot tell which input this file is for; name it <input>.npy in a "
                    f"per-sample folder or <input>_<sample>.npy (inputs: {list(names)})"
                )
            index, key = names[prefix], f.stem[len(prefix) + 1 :]
        _assign(groups.setdefault((f.parent, key), {}), index, f, inputs)
    return [NpySample(s) for s in _grouped(inputs, groups, "sample")]


def _pb_samples(files: list[Path], inputs: Sequence[ModelInput]) -> list[Sample]:
    if len(inputs) == 1:
        return [PbSample((f,)) for f in files]
    names = {inp.name: i for i, inp in enumerate(inputs)}
    groups: _Groups = {}
    for f in files:
        tensor_name = read_pb(f).name
        match = re.fullmatch(r"input_(\d+)", f.stem)
        if tensor_name:
            if tensor_name not in names:
                raise DataError(f"{f}: tensor {tensor_name!r} is not a model input {list(names)}")
            index = names[tensor_name]
        elif match and int(match[1]) < len(inputs):
            index = int(match[1])
        else:
            raise DataError(f"{f}: unnamed tensor and not named input_<k>.pb, k < {len(names)}")
        _assign(groups.setdefault(f.parent, {}), index, f, inputs)
    return [PbSample(s) for s in _grouped(inputs, groups, "folder")]


def open_calibration_data(
    model: PathLike | onnx.ModelProto,
    paths: PathLike | Sequence[PathLike],
    *,
    batch_size: int = 1,
    preprocess: str = "none",
    input_shape: str | Sequence[int | str | None] | None = None,
    layout: str | None = None,
    validate: bool = True,
) -> CalibrationData:
    """Map the data files under ``paths`` to ``model``'s inputs (see the module docstring).

    With ``validate`` (the default) every file's header is checked now, so bad data raises
    :class:`DataError` before the caller does any work; arrays are only read while iterating.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if preprocess not in PRESETS:
        raise ValueError(f"preprocess must be one of {PRESETS}, got {preprocess!r}")
    if layout is not None and layout.upper() not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    layout = layout and layout.upper()
    inputs = model_inputs(model)
    if input_shape is not None:
        if len(inputs) != 1:
            raise ValueError(f"input_shape needs a single-input model, not {len(inputs)} inputs")
        inputs = (ModelInput(inputs[0].name, inputs[0].dtype, parse_shape(input_shape)),)

    files = _list_files([paths] if isinstance(paths, (str, os.PathLike)) else list(paths))
    by_kind: dict[str, list[Path]] = {}
    for f in files:
        by_kind.setdefault(_kind(f) or "", []).append(f)
    if len(by_kind) > 1:
        found = "; ".join(f"{len(fs)} {k} (e.g. {fs[0]})" for k, fs in by_kind.items())
        raise DataError(f"{files[0]}: mixed kinds of data files ({found}); use one kind per run")
    (kind,) = by_kind
    if kind != "image" and (preprocess != "none" or layout is not None):
        raise DataError(f"{files[0]}: preprocess and layout apply to images, not to .{kind} data")

    samples: list[Sample]
    if kind == "npy":
        samples = _npy_samples(files, inputs)
    elif kind == "pb":
        samples = _pb_samples(files, inputs)
    elif kind == "npz":
        samples = [NpzSample((f,), tuple(i.name for i in inputs)) for f in files]
    else:
        if len(inputs) != 1:
            names = [i.name for i in inputs]
            raise DataError(f"{files[0]}: images need a single-input model, not inputs {names}")
        prep = image_prep(inputs[0], preprocess, layout, files[0])
        samples = [ImageSample((f,), prep) for f in files]

    data = CalibrationData(inputs, samples, batch_size)
    if validate:
        data.validate()
    logger.info(
        "calibration data: %s sample(s) in %d %s file(s), %d batch(es) of up to %d %s",
        data.num_samples if validate else "?",
        len(files),
        kind,
        len(data),
        batch_size,
        "file(s)" if len(inputs) == 1 else "item(s) (one file per input)",
    )
    return data

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
    rule of :func:`histocal.readers.cast_to_input`, the same as for feeds given in Python: within
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
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator, Protocol, Sequence, Union

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime.quantization.calibrate import CalibrationDataReader
from PIL import Image

from .readers import cast_to_input

logger = logging.getLogger(__name__)

PRESETS = ("none", "mobilenet", "resnet", "caffe2")
LAYOUTS = ("NCHW", "NHWC")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
_IMAGE_FORMATS = ("JPEG", "PNG", "BMP")  # Pillow decoders allowed (never EPS & co.)
_IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
_IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
_CAFFE2_BGR_MEAN = np.array([103.939, 116.779, 123.68], np.float32)

PathLike = Union[str, "os.PathLike[str]"]
Shape = tuple[int, ...]
_Header = tuple[Shape, np.dtype, str]  # shape, dtype, where (file, maybe with an .npz key)


class DataError(ValueError):
    """Calibration data that cannot be fed to the model; the message names the file."""


@dataclass(frozen=True)
class ModelInput:
    """One graph input: name, numpy dtype, declared dims (None: dynamic; shape None: unknown)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...] | None

    def __str__(self) -> str:
        dims = "x".join("?" if d is None else str(d) for d in self.shape or ())
        dims = "?" if self.shape is None else dims
        return f"{self.name!r} ({self.dtype}[{dims}])"


def model_inputs(model: PathLike | onnx.ModelProto) -> tuple[ModelInput, ...]:
    """The model's graph inputs that are not initializers, in graph order."""
    if not isinstance(model, onnx.ModelProto):
        try:
            model = onnx.load(str(model), load_external_data=False)
        except OSError:
            raise
        except Exception as e:  # protobuf's DecodeError names neither the file nor what it expected
            raise ValueError(f"{model}: not an ONNX model ({' '.join(str(e).split())})") from None
    initializers = {t.name for t in model.graph.initializer}
    inputs = []
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        if not vi.type.HasField("tensor_type"):
            raise ValueError(f"model input {vi.name!r} is not a tensor")
        t = vi.type.tensor_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        except Exception:
            raise ValueError(f"model input {vi.name!r}: unknown elem type {t.elem_type}") from None
        shape = None
        if t.HasField("shape"):
            shape = tuple(d.dim_value if d.dim_value > 0 else None for d in t.shape.dim)
        inputs.append(ModelInput(vi.name, dtype, shape))
    if not inputs:
        raise ValueError("model has no inputs to feed")
    return tuple(inputs)


# ---------------------------------------------------------------------------------------------
# Checks shared by header validation and loading


def _fit_shape(inp: ModelInput, shape: Shape, where: str) -> Shape:
    """``shape`` with a batch dim, checked against the input's static non-batch dims."""
    if inp.shape is None:
        if not shape:
            raise DataError(f"{where}: a scalar cannot be batched for input {inp}")
        return shape
    batched = (1, *shape) if len(shape) == len(inp.shape) - 1 else shape
    if len(batched) != len(inp.shape) or any(
        want is not None and got != want for got, want in zip(batched[1:], inp.shape[1:])
    ):
        raise DataError(f"{where}: shape {shape} does not fit input {inp}")
    return batched


def _check_dtype(inp: ModelInput, dtype: np.dtype, where: str) -> None:
    """The header part of :func:`histocal.readers.cast_to_input`'s rule (values are checked on load)."""
    if dtype == inp.dtype:
        return
    if dtype.kind in "OSUVMm" or not np.can_cast(dtype, inp.dtype, "same_kind"):
        raise DataError(f"{where}: {dtype} data cannot be cast to input {inp}")


def _conform(inp: ModelInput, arr: np.ndarray, where: str) -> np.ndarray:
    arr = arr.reshape(_fit_shape(inp, arr.shape, where))
    try:
        return cast_to_input(arr, inp.dtype, f"{where}: data for input {inp.name!r}")
    except ValueError as e:
        raise DataError(str(e)) from None


def _check_batch(inp: ModelInput, shapes: Sequence[Shape], wheres: Sequence[str]) -> None:
    """Samples of one batch must agree on their non-batch dims; the batch dim must fit."""
    if not shapes[0]:  # a scalar input: nothing to batch along
        if len(shapes) > 1:
            raise DataError(f"{wheres[0]}: input {inp} is a scalar, use batch_size=1")
        return
    if len({s[1:] for s in shapes}) > 1:
        found = ", ".join(f"{w}: {s}" for s, w in zip(shapes, wheres))
        raise DataError(f"{wheres[0]}: samples batched for input {inp} differ in shape ({found})")
    rows = sum(s[0] for s in shapes)
    if inp.shape and inp.shape[0] is not None and rows != inp.shape[0]:
        raise DataError(
            f"{wheres[0]}: batch of {rows} rows for input {inp}, which declares a batch of "
            f"{inp.shape[0]} (adjust batch_size or the arrays' leading dim)"
        )


# ---------------------------------------------------------------------------------------------
# Readers


def _npy_header(fp: IO[bytes], where: str) -> tuple[Shape, np.dtype]:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fp)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, _, dtype = read(fp)
    except Exception as e:
        raise DataError(f"{where}: not a valid .npy array ({e})") from None
    return tuple(shape), np.dtype(dtype)


def _load_npy(path: Path) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as e:
        raise DataError(f"{path}: cannot load .npy ({e})") from None
    if not isinstance(arr, np.ndarray):
        raise DataError(f"{path}: holds an .npz archive, not a single .npy array")
    return arr


def _read_pb(path: Path) -> onnx.TensorProto:
    tensor = onnx.TensorProto()
    try:
        tensor.ParseFromString(path.read_bytes())
    except Exception as e:
        raise DataError(f"{path}: not an ONNX TensorProto ({e})") from None
    if tensor.data_type == onnx.TensorProto.UNDEFINED:
        raise DataError(f"{path}: not an ONNX TensorProto (no data type)")
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise DataError(f"{path}: TensorProto with external data is not supported")
    try:
        helper.tensor_dtype_to_np_dtype(tensor.data_type)
    except Exception:
        raise DataError(f"{path}: unsupported TensorProto data type {tensor.data_type}") from None
    return tensor


@dataclass(frozen=True)
class _ImagePrep:
    preset: str
    layout: str
    size: tuple[int, int] | None  # target (H, W); None: keep the image's size

    def shape(self, width: int, height: int) -> Shape:
        h, w = self.size or (height, width)
        return (1, 3, h, w) if self.layout == "NCHW" else (1, h, w, 3)

    def __call__(self, img: Image.Image) -> np.ndarray:
        img = img.convert("RGB")
        if self.preset == "resnet" and self.size:
            h, w = self.size  # like torchvision's Resize(256) + CenterCrop(224), scaled to h, w
            short, (iw, ih) = round(max(h, w) * 256 / 224), img.size
            size = (short, int(short * ih / iw)) if iw <= ih else (int(short * iw / ih), short)
            img = img.resize(size, Image.Resampling.BILINEAR)
            top, left = round((img.height - h) / 2), round((img.width - w) / 2)
            img = img.crop((left, top, left + w, top + h))
        elif self.size and img.size != self.size[::-1]:
            img = img.resize(self.size[::-1], Image.Resampling.BILINEAR)
        x = np.asarray(img)
        if self.preset == "mobilenet":
            x = x.astype(np.float32) / np.float32(127.5) - np.float32(1)
        elif self.preset == "resnet":
            x = (x.astype(np.float32) / np.float32(255) - _IMAGENET_MEAN) / _IMAGENET_STD
        elif self.preset == "caffe2":
            x = x[..., ::-1].astype(np.float32) - _CAFFE2_BGR_MEAN
        return np.ascontiguousarray(x.transpose(2, 0, 1) if self.layout == "NCHW" else x)[None]


# ---------------------------------------------------------------------------------------------
# Samples: one feed's worth of data (one array per input, in input order)


class _Sample(Protocol):
    @property
    def files(self) -> tuple[Path, ...]: ...

    def headers(self) -> list[_Header]: ...

    def arrays(self) -> list[tuple[np.ndarray, str]]: ...


@dataclass(frozen=True)
class _NpySample:
    files: tuple[Path, ...]  # one per input

    def headers(self) -> list[_Header]:
        out = []
        for path in self.files:
            with path.open("rb") as fp:
                out.append((*_npy_header(fp, str(path)), str(path)))
        return out

    def arrays(self) -> list[tuple[np.ndarray, str]]:
        return [(_load_npy(p), str(p)) for p in self.files]


@dataclass(frozen=True)
class _NpzSample:
    files: tuple[Path]
    names: tuple[str, ...]  # input names, in input order

    def _keys(self, keys: Sequence[str]) -> list[str]:
        path = self.files[0]
        if len(self.names) == 1 and list(keys) == ["arr_0"]:
            return ["arr_0"]
        missing = [n for n in self.names if n not in keys]
        unknown = [k for k in keys if k not in self.names]
        if missing or unknown:
            raise DataError(
                f"{path}: .npz keys must be the input names {list(self.names)}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {unknown}" if unknown else "")
            )
        return list(self.names)

    def headers(self) -> list[_Header]:
        path = self.files[0]
        try:
            with zipfile.ZipFile(path) as z:
                members = {m.removesuffix(".npy"): m for m in z.namelist()}
                out = []
                for key in self._keys(list(members)):
                    with z.open(members[key]) as fp:
                        out.append((*_npy_header(fp, f"{path}[{key}]"), f"{path}[{key}]"))
                return out
        except DataError:
            raise
        except Exception as e:  # BadZipFile, OSError, zlib.error, ...
            raise DataError(f"{path}: not a valid .npz archive ({e})") from None

    def arrays(self) -> list[tuple[np.ndarray, str]]:
        path = self.files[0]
        try:
            with np.load(path, allow_pickle=False) as npz:
                out = [(npz[k], f"{path}[{k}]") for k in self._keys(npz.files)]
            for arr, where in out:
                if not isinstance(arr, np.ndarray):
                    raise DataError(f"{where}: not a .npy array")
            return out
        except DataError:
            raise
        except Exception as e:
            raise DataError(f"{path}: cannot load .npz ({e})") from None


@dataclass(frozen=True)
class _PbSample:
    files: tuple[Path, ...]  # one per input

    def headers(self) -> list[_Header]:  # decoding is the cheap part once a .pb is parsed
        return [(a.shape, a.dtype, where) for a, where in self.arrays()]

    def arrays(self) -> list[tuple[np.ndarray, str]]:
        out = []
        for path in self.files:
            tensor = _read_pb(path)
            try:
                out.append((numpy_helper.to_array(tensor), str(path)))
            except Exception as e:
                raise DataError(f"{path}: corrupt TensorProto ({e})") from None
        return out


@dataclass(frozen=True)
class _ImageSample:
    files: tuple[Path]
    prep: _ImagePrep

    def _open(self) -> Image.Image:
        try:
            return Image.open(self.files[0], formats=_IMAGE_FORMATS)
        except Exception as e:
            raise DataError(f"{self.files[0]}: unreadable image ({e})") from None

    def headers(self) -> list[_Header]:
        with self._open() as img:
            size = img.size
            try:
                img.verify()
            except Exception as e:
                raise DataError(f"{self.files[0]}: corrupt image ({e})") from None
        dtype = np.dtype(np.uint8 if self.prep.preset == "none" else np.float32)
        return [(self.prep.shape(*size), dtype, str(self.files[0]))]

    def arrays(self) -> list[tuple[np.ndarray, str]]:
        with self._open() as img:
            try:
                img.load()
            except Exception as e:
                raise DataError(f"{self.files[0]}: corrupt image ({e})") from None
            return [(self.prep(img), str(self.files[0]))]


# ---------------------------------------------------------------------------------------------
# The data set


class CalibrationData(CalibrationDataReader):
    """Batches ``{input_name: array}`` read lazily from files; re-iterable; an ORT data reader."""

    def __init__(
        self, inputs: Sequence[ModelInput], samples: Sequence[_Sample], batch_size: int
    ) -> None:
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

    def _chunk(self, index: int) -> list[_Sample]:
        return self._samples[index * self.batch_size : (index + 1) * self.batch_size]

    def batch(self, index: int) -> dict[str, np.ndarray]:
        """Load batch ``index`` (0 <= index < len(self))."""
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} out of range (0..{len(self) - 1})")
        columns: list[list[tuple[np.ndarray, str]]] = [[] for _ in self.inputs]
        for sample in self._chunk(index):
            for inp, column, (arr, where) in zip(self.inputs, columns, sample.arrays()):
                column.append((_conform(inp, arr, where), where))
        feed = {}
        for inp, column in zip(self.inputs, columns):
            arrays, wheres = zip(*column)
            _check_batch(inp, [a.shape for a in arrays], wheres)
            feed[inp.name] = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        return feed

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
                    _check_dtype(inp, dtype, where)
                    if dtype != inp.dtype:
                        cast.setdefault((inp.name, dtype), where)
                    column.append((_fit_shape(inp, shape, where), where))
            for inp, column in zip(self.inputs, columns):
                shapes, wheres = zip(*column)
                _check_batch(inp, shapes, wheres)
            rows += sum(s[0] if s else 1 for s, _ in columns[0])
        self._num_samples = rows
        for (name, dtype), where in cast.items():
            logger.info("input %r: %s data (e.g. %s) cast to %s, the model's input type", name, dtype, where,
                        self.inputs[self.input_names.index(name)].dtype)

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


def _list_files(paths: Sequence[PathLike]) -> list[Path]:
    files: list[Path] = []
    skipped: list[Path] = []
    for root in map(Path, paths):
        if root.is_dir():
            found = [
                p
                for p in root.rglob("*")
                if p.is_file() and not any(x.startswith(".") for x in p.relative_to(root).parts)
            ]
            for p in sorted(found, key=_natural_key):
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


def _npy_samples(files: list[Path], inputs: Sequence[ModelInput]) -> list[_Sample]:
    if len(inputs) == 1:
        return [_NpySample((f,)) for f in files]
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
    return [_NpySample(s) for s in _grouped(inputs, groups, "sample")]


def _pb_samples(files: list[Path], inputs: Sequence[ModelInput]) -> list[_Sample]:
    if len(inputs) == 1:
        return [_PbSample((f,)) for f in files]
    names = {inp.name: i for i, inp in enumerate(inputs)}
    groups: _Groups = {}
    for f in files:
        tensor_name = _read_pb(f).name
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
    return [_PbSample(s) for s in _grouped(inputs, groups, "folder")]


def _parse_shape(shape: str | Sequence[int | str | None]) -> tuple[int | None, ...]:
    dims = shape.split(",") if isinstance(shape, str) else list(shape)
    try:
        ints = [-1 if str(d).strip() in ("?", "None") else int(d) for d in dims]
    except ValueError:
        raise ValueError(f"input_shape: ints expected (<=0, '?': dynamic), got {shape!r}") from None
    return tuple(d if d > 0 else None for d in ints)


def _image_prep(inp: ModelInput, preset: str, layout: str | None, where: Path) -> _ImagePrep:
    shape = inp.shape
    if shape is not None and len(shape) != 4:
        raise DataError(f"{where}: images give 4-D batches, input {inp} is not 4-D (input_shape?)")
    if layout is None:
        layout = "NHWC" if shape and shape[1] != 3 and shape[3] == 3 else "NCHW"
    channels, h, w = (None, None, None) if shape is None else (
        (shape[1], shape[2], shape[3]) if layout == "NCHW" else (shape[3], shape[1], shape[2])
    )
    if channels not in (None, 3):
        raise DataError(f"{where}: images have 3 channels, input {inp} has {channels} ({layout})")
    if preset == "resnet":
        h, w = h or 224, w or 224
    return _ImagePrep(preset, layout, (h, w) if h and w else None)


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
        inputs = (ModelInput(inputs[0].name, inputs[0].dtype, _parse_shape(input_shape)),)

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

    samples: list[_Sample]
    if kind == "npy":
        samples = _npy_samples(files, inputs)
    elif kind == "pb":
        samples = _pb_samples(files, inputs)
    elif kind == "npz":
        samples = [_NpzSample((f,), tuple(i.name for i in inputs)) for f in files]
    else:
        if len(inputs) != 1:
            names = [i.name for i in inputs]
            raise DataError(f"{files[0]}: images need a single-input model, not inputs {names}")
        prep = _image_prep(inputs[0], preprocess, layout, files[0])
        samples = [_ImageSample((f,), prep) for f in files]

    data = CalibrationData(inputs, samples, batch_size)
    if validate:
        data.validate()
    logger.info(
        "calibration data: %s sample(s) in %d %s file(s), %d batch(es) of up to %d %s",
        data.num_samples if validate else "?", len(files), kind, len(data), batch_size,
        "file(s)" if len(inputs) == 1 else "item(s) (one file per input)",
    )
    return data

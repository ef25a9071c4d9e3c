"""Calibration data files, one sample each: .npy, .npz members, model-zoo .pb tensors, images (see
:mod:`histocal.io.data`). Every reader checks shape and dtype against the model input and names the file."""

from __future__ import annotations

import logging
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, Union

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .models import load_model
from .readers import cast_to_input

if TYPE_CHECKING:
    from PIL import Image

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
        model = load_model(model, load_external_data=False)
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


def fit_shape(inp: ModelInput, shape: Shape, where: str) -> Shape:
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


def check_dtype(inp: ModelInput, dtype: np.dtype, where: str) -> None:
    """The header part of :func:`histocal.io.readers.cast_to_input`'s rule (values are checked on load)."""
    if dtype == inp.dtype:
        return
    if dtype.kind in "OSUVMm" or not np.can_cast(dtype, inp.dtype, "same_kind"):
        raise DataError(f"{where}: {dtype} data cannot be cast to input {inp}")


def conform(inp: ModelInput, arr: np.ndarray, where: str) -> np.ndarray:
    arr = arr.reshape(fit_shape(inp, arr.shape, where))
    try:
        return cast_to_input(arr, inp.dtype, f"{where}: data for input {inp.name!r}")
    except ValueError as e:
        raise DataError(str(e)) from None


def check_batch(inp: ModelInput, shapes: Sequence[Shape], wheres: Sequence[str]) -> None:
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


def read_pb(path: Path) -> onnx.TensorProto:
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


def _pillow() -> Any:
    """``PIL.Image``, imported on first use: only image files need Pillow (the ``images`` extra)."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise DataError(
            f"reading images needs Pillow ({exc}): pip install pillow (or pip install '.[images]' in "
            "histocal's source folder, or pip install 'histocal[images]')"
        ) from None
    return Image


@dataclass(frozen=True)
class _ImagePrep:
    preset: str
    layout: str
    size: tuple[int, int] | None  # target (H, W); None: keep the image's size

    def shape(self, width: int, height: int) -> Shape:
        h, w = self.size or (height, width)
        return (1, 3, h, w) if self.layout == "NCHW" else (1, h, w, 3)

    def __call__(self, img: Image.Image) -> np.ndarray:
        bilinear = _pillow().Resampling.BILINEAR
        img = img.convert("RGB")
        if self.preset == "resnet" and self.size:
            h, w = self.size  # like torchvision's Resize(256) + CenterCrop(224), scaled to h, w
            short, (iw, ih) = round(max(h, w) * 256 / 224), img.size
            size = (short, int(short * ih / iw)) if iw <= ih else (int(short * iw / ih), short)
            img = img.resize(size, bilinear)
            top, left = round((img.height - h) / 2), round((img.width - w) / 2)
            img = img.crop((left, top, left + w, top + h))
        elif self.size and img.size != self.size[::-1]:
            img = img.resize(self.size[::-1], bilinear)
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


class Sample(Protocol):
    @property
    def files(self) -> tuple[Path, ...]: ...

    def headers(self) -> list[_Header]: ...

    def arrays(self) -> list[tuple[np.ndarray, str]]: ...


@dataclass(frozen=True)
class NpySample:
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
class NpzSample:
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
class PbSample:
    files: tuple[Path, ...]  # one per input

    def headers(self) -> list[_Header]:  # decoding is the cheap part once a .pb is parsed
        return [(a.shape, a.dtype, where) for a, where in self.arrays()]

    def arrays(self) -> list[tuple[np.ndarray, str]]:
        out = []
        for path in self.files:
            tensor = read_pb(path)
            try:
                out.append((numpy_helper.to_array(tensor), str(path)))
            except Exception as e:
                raise DataError(f"{path}: corrupt TensorProto ({e})") from None
        return out


@dataclass(frozen=True)
class ImageSample:
    files: tuple[Path]
    prep: _ImagePrep

    def _open(self) -> Image.Image:
        image = _pillow()
        try:
            return image.open(self.files[0], formats=_IMAGE_FORMATS)
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


def parse_shape(shape: str | Sequence[int | str | None]) -> tuple[int | None, ...]:
    dims = shape.split(",") if isinstance(shape, str) else list(shape)
    try:
        ints = [-1 if d is None or str(d).strip() in ("?", "None") else int(d) for d in dims]
    except ValueError:
        raise ValueError(f"input_shape: ints expected (<=0, '?': dynamic), got {shape!r}") from None
    return tuple(d if d > 0 else None for d in ints)


def image_prep(inp: ModelInput, preset: str, layout: str | None, where: Path) -> _ImagePrep:
    shape = inp.shape
    if shape is not None and len(shape) != 4:
        raise DataError(f"{where}: images give 4-D batches, input {inp} is not 4-D (input_shape?)")
    if layout is None:
        layout = "NHWC" if shape and shape[1] != 3 and shape[3] == 3 else "NCHW"
    channels, h, w = (
        (None, None, None)
        if shape is None
        else ((shape[1], shape[2], shape[3]) if layout == "NCHW" else (shape[3], shape[1], shape[2]))
    )
    if channels not in (None, 3):
        raise DataError(f"{where}: images have 3 channels, input {inp} has {channels} ({layout})")
    if preset == "resnet":
        h, w = h or 224, w or 224
    return _ImagePrep(preset, layout, (h, w) if h and w else None)

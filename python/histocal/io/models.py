"""Loading a model file the user named: the one place histocal parses a model path, so that a file
that is not an ONNX model is refused by every route (Python API, CLI, diagnose, Ray's driver) with
a message naming it, never protobuf's ``DecodeError`` (which names neither the file nor what was
expected) nor an error further on about an empty graph (a 0-byte file parses as an empty model)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import onnx

StrPath = Union[str, "os.PathLike[str]"]


class ModelFileError(ValueError):
    """A model file that is not an ONNX model; the message names the file."""


def check_model_file(path: StrPath) -> None:
    """The checks that need no parsing: ``path`` is an existing, non-empty regular file.

    Raises:
        FileNotFoundError: no such file (naming it).
        ModelFileError: not a regular file, or 0 bytes.
    """
    name = os.fspath(path)
    try:
        info = os.stat(name)
    except FileNotFoundError:
        raise FileNotFoundError(f"{name}: no such model file") from None
    if not os.path.isfile(name):
        raise ModelFileError(f"{name}: not a file")
    if info.st_size == 0:
        raise ModelFileError(f"{name}: not an ONNX model (0 bytes)")


# Over this size a model that only an inference session reads is written with its tensors in an
# external data file (protobuf's 2 GB limit; 1 GiB leaves room for the graph and ByteSize's estimate).
INLINE_MODEL_BYTES = 1 << 30


def save_model(model: onnx.ModelProto, path: StrPath) -> None:
    """A working copy of a model written to ``path`` with its tensors in one external data file
    beside it (``path``'s name + ".data"): models over 2 GB work, and onnx's shape inference on the
    file (onnxruntime's ``quantize_static`` and ``quant_pre_process`` run it) copies the graph
    without the weights: inline, MiniLM's 90 MB made each quantization 0.4 s slower. As
    ``onnx.save_model``, the weights move out of ``model`` into the file: a caller that still
    needs them saves a copy."""
    name = os.fspath(path)
    onnx.save_model(model, name, save_as_external_data=True, location=os.path.basename(name) + ".data")


def written_files(path: StrPath) -> list[Path]:
    """A model file histocal wrote into a folder of its own (``save_model``, or onnxruntime's
    ``quantize_static``) and the files beside it whose names start with its name (its external
    data), by name: found without reading the model (``io.outputs.external_data_files`` reads it,
    for a model anyone wrote)."""
    model = Path(path)
    return sorted(model.parent.glob(f"{model.name}*"))


def load_model(path: StrPath, *, load_external_data: bool = True) -> onnx.ModelProto:
    """The ONNX model in the file ``path``.

    Args:
        path: the model file.
        load_external_data: also load the weights stored beside it (as ``onnx.load``).

    Returns:
        The parsed model, which has a graph.

    Raises:
        FileNotFoundError: no such file (naming it).
        ModelFileError: a file that is empty, cannot be parsed as an ONNX model, or holds no graph.
        OSError: the file (or its external data) cannot be read.
    """
    check_model_file(path)
    name = os.fspath(path)
    try:
        model = onnx.load(name, load_external_data=load_external_data)
    except OSError:
        raise
    except Exception as e:  # protobuf's DecodeError; onnx's own on a malformed header
        reason = " ".join(str(e).split()) or type(e).__name__
        raise ModelFileError(f"{name}: not an ONNX model (cannot be parsed: {reason})") from None
    if not model.HasField("graph"):
        raise ModelFileError(f"{name}: not an ONNX model (no graph)")
    return model

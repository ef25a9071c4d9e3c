"""Outputs never over inputs: the one check every writer runs before any work.

A command's inputs are more files than its arguments name: the model's external-data files (a
renamed export can keep its weights in ``b.onnx.data``, the very file ``quantize a.onnx b.onnx
--external-data`` writes) and every sample a data folder holds. ``refuse_overwriting`` compares
each output with all of them, and with the outputs before it, as the system sees files: the same
inode where both exist (so symlinks and hard links count), else the same resolved path.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import onnx

from .files import StrPath

logger = logging.getLogger(__name__)

# (what it is, e.g. "--cache" or "MODEL", its path); paths that are None are skipped
Named = Iterable[tuple[str, StrPath | None]]

# onnxruntime's quantize_static writes the external data of ``model_output`` to this file in the
# same folder (onnxruntime.quantization.onnx_model.ONNXModel.save_model_to_file)
EXTERNAL_DATA_SUFFIX = ".data"


class OverwriteError(ValueError):
    """An output would replace one of the inputs, or another output: which ones are attributes."""

    def __init__(self, output: str, output_path: StrPath, other: str, other_path: StrPath, role: str) -> None:
        super().__init__(
            f"{output} {output_path} is the same file as {role} {other} {other_path}: "
            "refusing to overwrite it (give another path)"
        )
        self.output, self.output_path = output, output_path
        self.other, self.other_path, self.role = other, other_path, role


def external_data_output(model_output: StrPath) -> Path:
    """The file onnxruntime's quantize_static writes ``model_output``'s external data to."""
    path = Path(model_output)
    return path.with_name(path.name + EXTERNAL_DATA_SUFFIX)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    """The tensors of a node's attributes (Constant's value, subgraphs' initializers...)."""
    for a in node.attribute:
        if a.HasField("t"):
            yield a.t
        yield from a.tensors
        for sparse in (*([a.sparse_tensor] if a.HasField("sparse_tensor") else []), *a.sparse_tensors):
            yield from (sparse.values, sparse.indices)
        for g in (*([a.g] if a.HasField("g") else []), *a.graphs):
            yield from _graph_tensors(g)


def external_data_files(model: StrPath) -> list[Path]:
    """The files ``model``'s tensors keep their data in (``data_location`` EXTERNAL), resolved
    against the model's folder as onnx and onnxruntime do; the data itself is not read. A model
    that does not parse yields none: loading it fails later, with that command's own message."""
    try:
        proto = onnx.load(Path(model).as_posix(), load_external_data=False)
    except Exception as exc:  # not ONNX, or unreadable: nothing it could reference
        logger.debug("%s: no external data listed (%s)", model, exc)
        return []
    tensors = [*_graph_tensors(proto.graph), *(t for f in proto.functions for n in f.node for t in _node_tensors(n))]
    folder = Path(model).parent
    files: dict[str, Path] = {}
    for t in tensors:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in t.external_data if e.key == "location"), None)
        if location:
            files.setdefault(location, folder / location)
    return list(files.values())


def model_files(model: StrPath, name: str = "MODEL") -> list[tuple[str, Path]]:
    """The model file and its external-data files, named for a message."""
    return [(name, Path(model)), *((f"{name}'s external data", f) for f in external_data_files(model))]


def _identity(path: StrPath) -> tuple[object, ...]:
    """What makes two paths one file: the device and inode of an existing one (through symlinks,
    across hard links), else the resolved path of one not written yet."""
    try:
        st = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(path))
    return ("inode", st.st_dev, st.st_ino)


def refuse_overwriting(outputs: Named, inputs: Named) -> None:
    """OverwriteError, before anything is written, when an output is the same file as an input or
    as an earlier output; the message names both and their paths."""
    seen: dict[tuple[object, ...], tuple[str, StrPath, str]] = {}
    for name, path in inputs:
        if path is not None:
            seen.setdefault(_identity(path), (name, path, "the input"))
    for name, path in outputs:
        if path is None:
            continue
        key = _identity(path)
        if key in seen:
            raise OverwriteError(name, path, *seen[key])
        seen[key] = (name, path, "the output")


def report_outputs(out_dir: StrPath) -> list[Path]:
    """What a report written into ``out_dir`` replaces: the folder, its ``index.html`` and its
    ``tensors/`` folder with everything in it (replaced whole)."""
    out = Path(out_dir)
    images = out / "tensors"
    inside = list(images.rglob("*")) if images.is_dir() and not images.is_symlink() else []
    return [out, out / "index.html", images, *inside]

"""The model fingerprint a state records: which model its tensors come from."""

from __future__ import annotations

import hashlib
import os
from typing import Any


def model_fingerprint(model: Any, num_outputs: int | None = None) -> str:
    """The fingerprint a state records of its model: sha256 over the model's opset imports and its
    graph's nodes, inputs, outputs and (sparse) initializers, each serialized deterministically.
    Names, doc strings, metadata and value_info (shape inference) are ignored.

    Args:
        model: an onnx ModelProto or a path.
        num_outputs: hash only the first outputs (a calibrator appends its own); None: all.

    Returns:
        The sha256 digest, 64 hex digits.

    Raises:
        ValueError: a file that is not an ONNX model (naming it).
        OSError: the file cannot be read.
    """
    if isinstance(model, (str, os.PathLike)):
        from ..io.models import load_model

        model = load_model(model)
    graph = model.graph
    outputs = list(graph.output)[: num_outputs if num_outputs is not None else None]
    h = hashlib.sha256(b"histocal-model-fingerprint-v1\0")
    for tag, messages in (
        (b"opset", list(model.opset_import)),
        (b"node", list(graph.node)),
        (b"input", list(graph.input)),
        (b"output", outputs),
        (b"initializer", list(graph.initializer)),
        (b"sparse_initializer", list(graph.sparse_initializer)),
    ):
        h.update(tag + len(messages).to_bytes(8, "little"))
        for m in messages:
            raw = m.SerializeToString(deterministic=True)
            h.update(len(raw).to_bytes(8, "little"))
            h.update(raw)
    return h.hexdigest()

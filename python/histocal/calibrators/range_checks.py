"""Errors that name the tensors onnxruntime's quantization fails on without naming them.

ORT computes a scale for every tensor it is given a range for, and for every weight it
quantizes, and asserts ``scale >= 0`` ("scale issue"): a NaN range or a weight holding NaN/Inf
fails there with no tensor named.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..io.models import load_model

_SHOWN = 10


def _listed(items: list[str]) -> str:
    return ", ".join(items[:_SHOWN]) + (f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def _nonfinite_ranges(ranges: Any) -> list[str]:
    bad = []
    for name, td in ranges.data.items():
        lo, hi = (np.asarray(v, np.float64) for v in td.range_value)
        if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
            shown = f"[{lo.flat[0]:g}, {hi.flat[0]:g}]" if lo.size == hi.size == 1 else "per channel"
            bad.append(f"{name!r} {shown}")
    return bad


def check_finite_ranges(ranges: Any) -> None:
    """ValueError naming the tensors of ``ranges`` (TensorsData) whose range is not finite, e.g.
    MinMax's NaN range of a tensor whose every calibration value was NaN."""
    bad = _nonfinite_ranges(ranges)
    if bad:
        raise ValueError(
            f"no finite range for {len(bad)} tensor(s): {_listed(bad)}; their calibration values were all "
            "NaN or infinite (check the model and the data), so their quantization scales cannot be computed"
        )


def nonfinite_weights(model: onnx.ModelProto) -> list[str]:
    """The float initializers holding NaN or infinite values."""
    out = []
    for init in model.graph.initializer:
        if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE):
            values = numpy_helper.to_array(init)
            if not np.isfinite(values).all():
                out.append(f"{init.name!r} ({int(np.isnan(values).sum())} NaN, {int(np.isinf(values).sum())} inf)")
    return out


@contextlib.contextmanager
def scale_issue_named(model: onnx.ModelProto | str | os.PathLike[str], ranges: Any = None) -> Iterator[None]:
    """Turn onnxruntime's bare "scale issue" assertion, raised inside, into a ValueError naming the
    tensors of ``ranges`` (TensorsData, if given) whose range is not finite, or else the weights
    of ``model`` that hold NaN/Inf (the model is read only then)."""
    try:
        yield
    except AssertionError as e:
        if "scale issue" not in str(e):
            raise
        if ranges is not None and _nonfinite_ranges(ranges):
            try:
                check_finite_ranges(ranges)
            except ValueError as named:
                raise named from e
        proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
        weights = nonfinite_weights(proto)
        where = f"weights holding NaN or infinite values: {_listed(weights)}" if weights else "no weight holds NaN/Inf"
        raise ValueError(
            f"onnxruntime could not compute a quantization scale ('scale issue'); {where}. Fix the model, or "
            "leave the nodes using them in float (nodes_to_exclude / --nodes-to-exclude)"
        ) from e

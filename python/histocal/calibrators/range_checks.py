"""The one range check before and after onnxruntime quantizes, and errors that name the tensors
onnxruntime's quantization fails on without naming them.

Every route to ORT's quantizer (``quantize_static``, the CLI, diagnose, auto) passes through
``quantize_with_ranges``, which calls the two checks here; no route checks ranges on its own.

What ORT does with a range (ORT 1.31/1.32, QDQ and QOperator alike): it computes a scale for
*every* tensor it is given a range for, quantized or not, and asserts ``scale >= 0`` ("scale
issue", no tensor named). So:

* a NaN range fails in ORT whatever the tensor: refused before ORT runs, naming the tensors;
* ``[inf, -inf]`` (MinMax of a tensor with no values at all, e.g. paddle2onnx's empty ``roi`` and
  ``scales`` constants of ``Resize``) gives scale 1 there (the range is widened to hold 0 first):
  harmless, whether ORT quantizes the tensor or not (it has no values to quantize);
* a range with an infinite end (values of ±inf in the data) gives an infinite scale without any
  error: harmful only where ORT quantizes the tensor, which is known once ORT has written the
  model (a scale initializer ``<tensor>_scale``, ORT's naming in both formats); refused then.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..io.models import load_model

_SHOWN = 10


def _listed(items: list[str]) -> str:
    return ", ".join(items[:_SHOWN]) + (f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def _ends(td: Any) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = (np.asarray(v, np.float64) for v in td.range_value)
    return lo, hi


def _shown(name: str, lo: np.ndarray, hi: np.ndarray) -> str:
    return f"{name!r} " + (f"[{lo.flat[0]:g}, {hi.flat[0]:g}]" if lo.size == hi.size == 1 else "per channel")


def _no_values(lo: np.ndarray, hi: np.ndarray) -> bool:
    """ORT MinMax's range of a tensor that never held a value: ``[inf, -inf]``."""
    return bool(np.all(np.isposinf(lo)) and np.all(np.isneginf(hi)))


def check_ranges_before_ort(ranges: Any) -> None:
    """ValueError naming the tensors of ``ranges`` (TensorsData) whose range holds NaN: ORT computes
    a scale for every tensor it is given a range for and fails on these, naming none (e.g. MinMax's
    range of a tensor whose every calibration value was NaN)."""
    bad = []
    for name, td in ranges.data.items():
        lo, hi = _ends(td)
        if np.isnan(lo).any() or np.isnan(hi).any():
            bad.append(_shown(name, lo, hi))
    if bad:
        raise ValueError(
            f"no finite range for {len(bad)} tensor(s): {_listed(bad)}; their calibration values were all NaN "
            "(check the model and the data), and onnxruntime computes a quantization scale for every tensor "
            "it is given a range for"
        )


def check_quantized_ranges(model_output: str | os.PathLike[str], ranges: Any) -> None:
    """ValueError naming the tensors onnxruntime quantized in ``model_output`` (the model it just
    wrote) with an infinite range end, i.e. an infinite scale. Reads the model (without external
    data) only when some range has one."""
    infinite = {}
    for name, td in ranges.data.items():
        lo, hi = _ends(td)
        if not (np.isfinite(lo).all() and np.isfinite(hi).all()) and not _no_values(lo, hi):
            infinite[name] = _shown(name, lo, hi)
    if not infinite:
        return
    written = onnx.load(Path(model_output).as_posix(), load_external_data=False)
    scales = {init.name for init in written.graph.initializer}
    bad = [shown for name, shown in infinite.items() if f"{name}_scale" in scales]
    if bad:
        raise ValueError(
            f"no finite range for {len(bad)} quantized tensor(s): {_listed(bad)}; their calibration values include "
            "infinities, so their quantization scales would be infinite (check the model and the data, or leave "
            "the nodes using them in float: nodes_to_exclude / --nodes-to-exclude)"
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
def scale_issue_named(model: onnx.ModelProto | str | os.PathLike[str]) -> Iterator[None]:
    """Turn onnxruntime's bare "scale issue" assertion, raised inside, into a ValueError naming the
    weights of ``model`` that hold NaN/Inf (ranges are checked before ORT runs; the model is read
    only on that failure)."""
    try:
        yield
    except AssertionError as e:
        if "scale issue" not in str(e):
            raise
        proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
        weights = nonfinite_weights(proto)
        where = f"weights holding NaN or infinite values: {_listed(weights)}" if weights else "no weight holds NaN/Inf"
        raise ValueError(
            f"onnxruntime could not compute a quantization scale ('scale issue'); {where}. Fix the model, or "
            "leave the nodes using them in float (nodes_to_exclude / --nodes-to-exclude)"
        ) from e

"""The onnxruntime scale rule that histocal's error model and methods follow.

onnxruntime's ``quant_utils.compute_scale_zp`` turns a range (TensorData's ``lowest``/``highest``,
float16 or float32 like the tensor) into a scale of that type and a zero point. A scale below a
threshold is degenerate and becomes 1, with zero point 0. Up to 1.31 the threshold is the range
type's smallest normal number, tested on the float64 scale; 1.32 lowered it for float16 ranges to
float16's smallest subnormal, tested on the scale rounded to float16 (float32 ranges are
unchanged). So under 1.31 a float16 tensor whose int8 range is narrower than about 0.0156
(255 * 2^-14) is quantized with scale 1; under 1.32 only one narrower than about 7.6e-6.

histocal's kernels implement both rules (``"1.31"``, ``"1.32"``). :data:`SCALE_RULE` is the
installed onnxruntime's, decided here once, by asking its own ``compute_scale_zp`` for the scale of
a float16 range whose scale is a float16 subnormal; every error estimate and range method (mse,
pow2, auto, the report) passes it to the kernels.
"""

from __future__ import annotations

import logging

import numpy as np
import onnxruntime
from onnx import TensorProto
from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType

logger = logging.getLogger(__name__)

SCALE_RULES = ("1.31", "1.32")

# A uint8 range (0, 255 * 2^-20) in float16: its scale 2^-20 is a float16 subnormal.
_PROBE_SCALE = 2.0**-20


def _probe() -> str | None:
    """The rule the installed compute_scale_zp follows, or None if it follows neither."""
    qmin, qmax = get_qmin_qmax_for_qType(TensorProto.UINT8, reduce_range=False, symmetric=False)
    low, high = np.array(0.0, np.float16), np.array(255 * _PROBE_SCALE, np.float16)
    zero_point, scale = compute_scale_zp(low, high, qmin, qmax, False)
    if int(zero_point) != 0:
        return None
    return {1.0: "1.31", _PROBE_SCALE: "1.32"}.get(float(scale))


def detect_scale_rule() -> str:
    """The installed onnxruntime's scale rule: ``"1.31"`` or ``"1.32"``."""
    rule = _probe()
    if rule is not None:
        return rule
    version = tuple(int(p) for p in onnxruntime.__version__.split(".")[:2] if p.isdigit())
    rule = "1.32" if version >= (1, 32) else "1.31"
    logger.warning(
        "onnxruntime %s's compute_scale_zp follows neither known float16 scale rule; "
        "histocal's error estimates use onnxruntime %s's",
        onnxruntime.__version__,
        rule,
    )
    return rule


SCALE_RULE: str = detect_scale_rule()

__all__ = ["SCALE_RULE", "SCALE_RULES", "detect_scale_rule"]

"""AMD Quark's ONNX calibration API (Quark 0.13's ``quark.onnx.calibration``), backed by histocal,
without Quark; Quark 0.9's (``quark.onnx.calibrate``) is :mod:`histocal.quark.v0_9`.

Swap ``from quark.onnx.calibration import ...`` for ``from histocal.quark import ...``: the same
classes and factories, with Quark 0.13's arguments, order, defaults and results (0.9's
``method=`` keyword of ``create_calibrator_power_of_two`` too). A Quark 0.9 user swaps
``from quark.onnx.calibrate import ...`` for ``from histocal.quark.v0_9 import ...`` and gets
0.9's signatures, defaults and results (docs/usage.md, "For Quark users"). With Quark
installed, :func:`patch_quark` makes Quark's own ``ModelQuantizer`` calibrate with these. Quark's enums (``PowerOfTwoMethod``,
``ExtendedQuantType``) and onnxruntime's (``CalibrationMethod``, ``QuantType``) are accepted as
themselves, as any enum with the same member name, or as the name.
"""

from .calibrators import (
    DistributionCalibrater,
    EntropyCalibrater,
    MinMaxCalibrater,
    PercentileCalibrater,
    PowOfTwoCalibrater,
    create_calibrator_float_scale,
    create_calibrator_power_of_two,
)
from .collector import PowOfTwoCollector
from .patch import is_quark_patched, patch_quark, unpatch_quark
from .types import PowerOfTwoMethod

__all__ = [
    "DistributionCalibrater",
    "EntropyCalibrater",
    "MinMaxCalibrater",
    "PercentileCalibrater",
    "PowOfTwoCalibrater",
    "PowOfTwoCollector",
    "PowerOfTwoMethod",
    "create_calibrator_float_scale",
    "create_calibrator_power_of_two",
    "is_quark_patched",
    "patch_quark",
    "unpatch_quark",
]

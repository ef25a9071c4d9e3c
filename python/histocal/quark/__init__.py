"""AMD Quark's ONNX calibration API (``quark.onnx.calibrate``), backed by histocal, without Quark.

Swap ``from quark.onnx.calibrate import ...`` for ``from histocal.quark import ...``: the same
classes and factories, arguments and defaults. Quark's enums (``PowerOfTwoMethod``,
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
]

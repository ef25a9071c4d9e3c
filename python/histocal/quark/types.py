"""Quark's option values without Quark: its enums are accepted as themselves, as any enum of the
same member name (Quark's own, onnxruntime's ``QuantType``) or as the name."""

from __future__ import annotations

import enum
import logging
from typing import Any

from onnxruntime.quantization.calibrate import CalibrationMethod
from onnxruntime.quantization.quant_utils import QuantType

logger = logging.getLogger(__name__)


class PowerOfTwoMethod(enum.Enum):
    """Quark's ``PowerOfTwoMethod`` (same member names and values)."""

    NonOverflow = 0
    MinMSE = 1


# What the API takes for Quark's and onnxruntime's enums: the enum, any enum with the same member
# names (Quark's own), or the member name.
Pow2MethodLike = PowerOfTwoMethod | enum.Enum | str
CalibrationMethodLike = CalibrationMethod | enum.Enum | str
QuantTypeLike = QuantType | enum.Enum | str

# Quark's activation types for power-of-two calibration, by member name (QuantType and Quark's
# ExtendedQuantType share these names), and the integer type each one means here.
QTYPE_NAMES = {"QInt8": "int8", "QUInt8": "uint8", "QInt16": "int16", "QUInt16": "uint16"}
# Quark lists these too, but its int32 arithmetic casts 2^31 back to int32: not reproduced.
UNSUPPORTED_QTYPE_NAMES = ("QInt32", "QUInt32")
MINMSE_MODES = ("All", "MostCommon", "Percentile")


def _name(value: Any) -> str | None:
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, str):
        return value
    return None


def pow2_method(value: Any) -> PowerOfTwoMethod:
    """``value`` (Quark's enum, this one, or the name) as :class:`PowerOfTwoMethod`."""
    name = _name(value)
    if name is None or name not in PowerOfTwoMethod.__members__:
        raise ValueError(f"method must be PowerOfTwoMethod.NonOverflow or .MinMSE (or the name), got {value!r}")
    return PowerOfTwoMethod[name]


def calibration_method(value: Any) -> CalibrationMethod:
    """``value`` (onnxruntime's ``CalibrationMethod``, an enum of the same member name, or the
    name, any case) as onnxruntime's ``CalibrationMethod``."""
    name = _name(value)
    by_lower = {m.name.lower(): m for m in CalibrationMethod}
    if name is None or name.lower() not in by_lower:
        raise ValueError(f"Unsupported calibration method {value!r}")
    return by_lower[name.lower()]


def is_supported_qtype(value: Any) -> bool:
    return _name(value) in QTYPE_NAMES


def activation_qtype(value: Any) -> str:
    """Quark 0.13's rule for the MinMSE activation type: QInt8, QUInt8, QInt16, QUInt16 of either
    enum (onnxruntime's ``QuantType.QInt16`` included: Quark 0.9 calibrated it as int8) or the
    name; any other enum member or name becomes int8 with a warning, as in Quark. int32/uint32
    and values that are no enum or name are errors."""
    name = _name(value)
    if name is None or name in UNSUPPORTED_QTYPE_NAMES:
        return qtype(value)  # raises, naming the value
    if name not in QTYPE_NAMES:
        logger.warning("Unsupported activation type %s for MinMSE, applying Int8 instead.", value)
        return "int8"
    return QTYPE_NAMES[name]


def qtype(value: Any) -> str:
    """An activation type (``QuantType.QInt8``, Quark's ``ExtendedQuantType.QInt16``, "QUInt8")
    as histocal's integer type name; only the types Quark's power-of-two calibration handles."""
    name = _name(value)
    if name in QTYPE_NAMES:
        return QTYPE_NAMES[name]
    if name in UNSUPPORTED_QTYPE_NAMES:
        raise ValueError(f"activation type {name} is not supported by histocal.quark (int8, uint8, int16, uint16)")
    raise ValueError(
        f"activation type must be one of {sorted(QTYPE_NAMES)} (QuantType, Quark's ExtendedQuantType "
        f"or the name), got {value!r}"
    )


def minmse_mode(value: Any) -> str:
    if value not in MINMSE_MODES:
        raise ValueError(f"minmse_mode must be one of {MINMSE_MODES}, got {value!r}")
    return str(value)


def _is_ort_quant_type(value: Any) -> bool:
    return isinstance(value, QuantType)


def is_listed_qtype_0_9(value: Any) -> bool:
    """Quark 0.9's ``calib_quant_type`` list: onnxruntime's ``QuantType.QInt8`` / ``QUInt8`` and
    Quark's ``ExtendedQuantType.QInt16`` / ``QUInt16`` / ``QInt32`` / ``QUInt32`` (any other enum of
    those names counts as Quark's; a name counts as listed). Enum members compare by identity, so
    onnxruntime's ``QuantType.QInt16`` and Quark's ``ExtendedQuantType.QInt8`` are not listed."""
    name = _name(value)
    if isinstance(value, str):
        return name in QTYPE_NAMES or name in UNSUPPORTED_QTYPE_NAMES
    if _is_ort_quant_type(value):
        return name in ("QInt8", "QUInt8")
    return name in ("QInt16", "QUInt16", *UNSUPPORTED_QTYPE_NAMES)


def factory_activation_0_9(value: Any) -> Any:
    """Quark 0.9's ``create_calibrator_power_of_two``: an activation type outside its list is
    ``QuantType.QInt8``, silently."""
    return value if is_listed_qtype_0_9(value) else QuantType.QInt8

"""``patch_quark()``: AMD Quark's own flow (``quark.onnx.ModelQuantizer``, ``calibrate_model``)
calibrates with histocal.

Quark 0.13 creates its calibrators through ``create_calibrator_power_of_two`` and
``create_calibrator_float_scale``, imported by name into several of its modules
(``quark.onnx.calibration.calibrate`` among them). The patch replaces every reference to Quark's
two factories in the loaded ``quark`` modules with histocal.quark's, and puts them back when
undone (a quark module or a client that binds them while patched gets Quark's back then too);
patches are counted, like ``patch_onnxruntime``. Quark must be importable (it needs torch).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from ..patching import CountedPatch, PatchUse, Replacement
from . import calibrators

FACTORIES = ("create_calibrator_power_of_two", "create_calibrator_float_scale")
# where Quark 0.13 defines the factories and the modules that bind them by name
QUARK_MODULES = (
    "quark.onnx.calibration.calibrators",
    "quark.onnx.calibration.calibrate",
    "quark.onnx.calibration.calib_utils",
    "quark.onnx.calibration",
    "quark.onnx",
)


def _quark_factories() -> dict[str, Any]:
    try:
        for name in QUARK_MODULES:
            importlib.import_module(name)
    except ImportError as e:
        raise ImportError(
            f"patch_quark needs AMD Quark 0.13's quark.onnx.calibration importable ({e}); "
            "histocal.quark's calibrators work without Quark"
        ) from e
    defining = sys.modules[QUARK_MODULES[0]]
    return {name: getattr(defining, name) for name in FACTORIES}


def _replacements() -> list[Replacement]:
    """Every loaded quark module's reference to Quark's factories, by any name, to histocal.quark's
    (a later import of a quark module binds the patched one, as it reads the defining module)."""
    originals = _quark_factories()
    # routed: a name bound to them while patched (a quark module imported then) follows the undo
    ours = {name: PATCH.route(getattr(calibrators, name), originals[name]) for name in FACTORIES}
    return [
        (module, attr, ours[name])
        for module in [m for n, m in list(sys.modules.items()) if n.split(".")[0] == "quark" and m]
        for attr, value in list(vars(module).items())
        for name in FACTORIES
        if value is originals[name]
    ]


PATCH = CountedPatch(_replacements)


def unpatch_quark() -> None:
    """Undo one ``patch_quark()`` made outside a ``with`` block; Quark's factories are back once
    every patch is undone. Without a patch, a no-op."""
    PATCH.undo()


def is_quark_patched() -> bool:
    """Whether AMD Quark's calibrator creation goes to histocal.quark now.

    Returns:
        True while at least one ``patch_quark()`` holds.
    """
    return PATCH.active


class patch_quark(PatchUse):
    """Route AMD Quark's calibrator creation to histocal.quark: ``patch_quark()`` alone patches
    until ``unpatch_quark()``; ``with patch_quark(): ...`` for the block only. Nested uses are
    counted.

    Raises:
        ImportError: AMD Quark 0.13's ``quark.onnx.calibration`` is not importable.
    """

    PATCH = PATCH

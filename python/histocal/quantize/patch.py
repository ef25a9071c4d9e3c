"""``patch_onnxruntime()``: onnxruntime's own quantization entry points (``quantize_static``, and
every other caller of ORT's ``create_calibrator``: Optimum's ``ORTQuantizer``, Olive's
``OnnxStaticQuantization``) calibrate with histocal.

The patch replaces ``create_calibrator`` in every ORT module that binds it by name, and the
calibrator classes ORT's ``create_calibrator`` looks up in its module when called, so it holds
also for a caller that bound ORT's ``create_calibrator`` before patching. Every replacement is
routed by the patch's state (:meth:`histocal.patching.CountedPatch.route`, and for the classes a
``__new__`` that checks it): a name a client binds while patched goes back to ORT's once the patch
is undone. Patches are counted and reversible (``unpatch_onnxruntime()``, or a ``with`` block);
AMD Quark's counterpart is ``histocal.quark.patch``.
"""

from __future__ import annotations

import importlib
from typing import Any

from .. import calibrators
from ..patching import CountedPatch, PatchUse, Replacement

# Every module that binds ORT's create_calibrator by name.
_TARGETS = ("onnxruntime.quantization", "onnxruntime.quantization.calibrate", "onnxruntime.quantization.quantize")
# The classes ORT's create_calibrator looks up in its module when it is called: replaced too, so
# the patch holds for a caller that bound ORT's create_calibrator before patching (Optimum's
# ORTQuantizer imports it at module level).
_CLASSES = ("MinMaxCalibrater", "EntropyCalibrater", "PercentileCalibrater", "DistributionCalibrater")


def _modules() -> list[Any]:
    return [importlib.import_module(m) for m in _TARGETS]


def _patch_class(name: str, original: type) -> type:
    """histocal's calibrator class ``name`` as a subclass of its own for this patch: a client that
    patches ORT's class through the module while histocal is patched (Olive replaces
    ``MinMaxCalibrater.augment_graph``) changes this subclass, which goes with the patch, and never
    histocal's class. A client that bound the class while patched makes ORT's ``original`` again
    once the patch is undone (a client's own subclass of it stays its own)."""
    base = getattr(calibrators, name)

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        if cls is patch_class and not PATCH.active:
            return original(*args, **kwargs)  # not an instance of cls: Python skips our __init__
        return base.__new__(cls)

    patch_class: type = type(
        name,
        (base,),
        {
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "__doc__": base.__doc__,
            "__new__": __new__,
        },
    )
    return patch_class


def _replacements() -> list[Replacement]:
    """ORT's create_calibrator in every module that binds it, and the classes it looks up, each
    routed by the patch's state (a name a client binds while patched follows the undo)."""
    calibrate_module = importlib.import_module("onnxruntime.quantization.calibrate")
    factories = [
        (m, "create_calibrator", PATCH.route(calibrators.create_calibrator, m.create_calibrator))
        for m in _modules()
        if hasattr(m, "create_calibrator")
    ]
    classes = [
        (calibrate_module, name, _patch_class(name, getattr(calibrate_module, name)))
        for name in _CLASSES
        if hasattr(calibrate_module, name)
    ]
    return factories + classes


PATCH = CountedPatch(_replacements)


def unpatch_onnxruntime() -> None:
    """Undo one ``patch_onnxruntime()`` made outside a ``with`` block. Patches are counted: ORT's
    own ``create_calibrator`` is back once every patch is undone. Without a patch, a no-op."""
    PATCH.undo()


class patch_onnxruntime(PatchUse):
    """Route onnxruntime's calibrator creation to histocal.

    Takes effect on construction, so ``patch_onnxruntime()`` alone patches until
    ``unpatch_onnxruntime()``; ``with patch_onnxruntime(): ...`` patches for the block only.
    Nested uses are counted. It holds in any import order, also for tools that bound
    ``create_calibrator`` earlier (docs/clients.md).
    """

    PATCH = PATCH


def is_patched() -> bool:
    """Whether onnxruntime's calibrator creation goes to histocal now.

    Returns:
        True while at least one ``patch_onnxruntime()`` holds.
    """
    return PATCH.active


__all__ = ["PATCH", "is_patched", "patch_onnxruntime", "unpatch_onnxruntime"]

"""AMD Quark 0.9's ``quark.onnx.calibrate`` for the live comparison tests, or None.

Quark 0.9 as installed (``amd-quark==0.9`` with torch), or, without torch, from an unpacked
``amd-quark==0.9`` wheel: the folder holding ``quark/`` named by ``HISTOCAL_QUARK09_SRC``, else
the wheel pip-downloaded from PyPI into the model cache:
its calibration code needs neither torch nor Quark's compiled custom ops, so the package
``__init__`` files and the custom-ops module (torch's C++ builder) are replaced by stand-ins, and
onnx's removed ``onnx.reference.custom_element_types`` by ml_dtypes' types. Only this test
process sees the stand-ins; :func:`unload` removes them."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """The real models' cache (benches/support/real_models.py's, same variable)."""
    return Path(os.environ.get("HISTOCAL_MODEL_CACHE", Path.home() / ".cache" / "histocal-models"))


CUSTOM_OPS = {
    "_COP_DOMAIN": "com.amd.quark",
    "_COP_QUANT_OP_NAME": "ExtendedQuantizeLinear",
    "_COP_DEQUANT_OP_NAME": "ExtendedDequantizeLinear",
    "_COP_IN_OP_NAME": "ExtendedInstanceNormalization",
    "_COP_LSTM_OP_NAME": "ExtendedLSTM",
    "_COP_BFP_OP_NAME": "BFPQuantizeDequantize",
    "_COP_MX_OP_NAME": "MXQuantizeDequantize",
    "_COP_VERSION": 1,
}
ADDED: list[str] = []


def _forget_namespace() -> None:
    """The tests' own ``quark`` folder is importable as a namespace package: not Quark."""
    module = sys.modules.get("quark")
    if module is not None and getattr(module, "__file__", None) is None:
        for name in [n for n in sys.modules if n == "quark" or n.startswith("quark.")]:
            del sys.modules[name]


def _installed() -> Any:
    try:
        calibrate = importlib.import_module("quark.onnx.calibrate")
        version = importlib.import_module("quark.version").__version__
    except Exception:
        _forget_namespace()
        return None
    return calibrate if str(version).startswith("0.9") else None


def _package(name: str, path: str) -> None:
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module
    ADDED.append(name)


def _from_wheel(root: str) -> Any:
    _forget_namespace()
    if not os.path.isfile(os.path.join(root, "quark", "onnx", "calibrate.py")) or "quark" in sys.modules:
        return None
    _package("quark", os.path.join(root, "quark"))
    _package("quark.onnx", os.path.join(root, "quark", "onnx"))
    _package("quark.onnx.operators", os.path.join(root, "quark", "onnx", "operators"))
    ops = types.ModuleType("quark.onnx.operators.custom_ops")
    vars(ops).update(CUSTOM_OPS, get_library_path=lambda device="CPU": "", compile_library=lambda: None)
    sys.modules[ops.__name__] = ops
    ADDED.append(ops.__name__)
    name = "onnx.reference.custom_element_types"
    try:
        importlib.import_module(name)
    except ImportError:
        import ml_dtypes
        import onnx.reference

        cet = types.ModuleType(name)
        cet.int4, cet.uint4, cet.float8e4m3fn = ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.float8_e4m3fn
        sys.modules[name] = cet
        ADDED.append(name)
        onnx.reference.custom_element_types = cet  # type: ignore[attr-defined]
    try:
        return importlib.import_module("quark.onnx.calibrate")
    except Exception:
        unload()
        return None


def unpacked_wheel() -> str:
    """The folder of the unpacked ``amd-quark==0.9`` wheel (pip-downloaded once into the model
    cache, as the real models are; 0.9 MB). A failed download raises, naming the package."""
    folder = cache_dir() / "amd-quark-0.9-unpacked"
    done = folder / ".unpacked"
    if not done.exists():
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, "amd-quark==0.9"],
                capture_output=True,
                text=True,
                timeout=900,
            )
            wheels = list(Path(tmp).glob("amd_quark-0.9-*.whl"))
            if r.returncode != 0 or not wheels:
                raise RuntimeError(f"pip download amd-quark==0.9 failed: {r.stderr.strip()[-500:]}")
            folder.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(wheels[0]) as z:
                z.extractall(folder)
        done.touch()
    return str(folder)


def load() -> Any:
    """Quark 0.9's ``quark.onnx.calibrate`` module: installed, or from the unpacked wheel named by
    ``HISTOCAL_QUARK09_SRC``, or else from the wheel downloaded from PyPI (None where that one
    cannot be loaded; a failed download raises)."""
    return _installed() or _from_wheel(os.environ.get("HISTOCAL_QUARK09_SRC") or unpacked_wheel())


def unload() -> None:
    """Remove the stand-ins and every quark module loaded through them."""
    if not ADDED:  # an installed Quark stays
        return
    for name in [n for n in sys.modules if n == "quark" or n.startswith("quark.")] + ADDED:
        sys.modules.pop(name, None)
    ADDED.clear()

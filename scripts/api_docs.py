"""Write docs/api.md, the public API reference, from the docstrings.

    python scripts/api_docs.py          # rewrite docs/api.md
    python scripts/api_docs.py --check  # exit 1 if docs/api.md is not what this would write

The page lists ``histocal``'s exports (``histocal.__all__``) by topic, then the public entry
points of the optional modules, each with its signature and its docstring as written
(Google style: Args / Returns / Raises). tests/test_docs.py checks the page is up to date.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "api.md"

# (title, [(module, name)]): every name of histocal.__all__ once, then other modules' entry points
SECTIONS: list[tuple[str, list[str]]] = [
    (
        "Calibrate and quantize",
        [
            "histocal.quantize_static",
            "histocal.calibrate",
            "histocal.create_calibrator",
            "histocal.patch_onnxruntime",
            "histocal.unpatch_onnxruntime",
            "histocal.is_patched",
        ],
    ),
    (
        "Calibrators",
        [
            "histocal.MinMaxCalibrater",
            "histocal.EntropyCalibrater",
            "histocal.PercentileCalibrater",
            "histocal.DistributionCalibrater",
            "histocal.MethodCalibrater",
            "histocal.MODES",
            "histocal.DEFAULT_STREAMING_BINS",
        ],
    ),
    (
        "States",
        [
            "histocal.CalibrationState",
            "histocal.Collection",
            "histocal.merge_states",
            "histocal.model_fingerprint",
            "histocal.compute_with_overrides",
        ],
    ),
    (
        "Methods",
        [
            "histocal.register_method",
            "histocal.unregister_method",
            "histocal.registered_methods",
            "histocal.TensorHistogram",
        ],
    ),
    (
        "Model-level auto",
        [
            "histocal.calibrate_and_select",
            "histocal.Selection",
            "histocal.select_ranges",
            "histocal.select_ranges_cross_validated",
            "histocal.state_candidates",
            "histocal.MODEL_AUTO_CANDIDATES",
            "histocal.AUTO_SELECTION_OPTIONS",
        ],
    ),
    (
        "The HistogramCollector drop-in and kernels",
        [
            "histocal.HistogramCollector",
            "histocal.ValueCounts",
            "histocal.tensor_stats",
            "histocal.TensorStats",
            "histocal.channel_min_max",
            "histocal.moving_average",
            "histocal.nanmean_pairwise",
            "histocal.nanmean_sequential",
            "histocal.set_num_threads",
            "histocal.get_num_threads",
            "histocal.__version__",
        ],
    ),
    (
        "Other modules",
        [
            "histocal.distributed.calibrate_distributed",
            "histocal.diagnose.diagnose",
            "histocal.report.write_report",
            "histocal.io.cache.save_tensors_data",
            "histocal.io.cache.load_tensors_data",
        ],
    ),
]


def _resolve(dotted: str) -> object:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


class _Annotation:
    """An annotation printed as written (no quotes around postponed ones, no ``<class ...>``)."""

    def __init__(self, annotation: object) -> None:
        self.text = annotation if isinstance(annotation, str) else getattr(annotation, "__qualname__", repr(annotation))

    def __repr__(self) -> str:
        return str(self.text)


def _signature(obj: object) -> str | None:
    try:
        sig = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    empty = inspect.Parameter.empty
    params = [
        p.replace(annotation=empty if p.annotation is empty else _Annotation(p.annotation))
        for p in sig.parameters.values()
    ]
    ret = sig.return_annotation
    sig = sig.replace(parameters=params, return_annotation=empty if ret is empty else _Annotation(ret))
    return str(sig)


def _doc(obj: object, own: bool = False) -> str:
    doc = obj.__doc__ if own else inspect.getdoc(obj)
    return inspect.cleandoc(doc) if doc else "(no docstring)"


def members(cls: type) -> list[tuple[str, object]]:
    """Public methods and properties defined by histocal's classes in ``cls``'s MRO, in source order."""
    out, seen = [], set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("histocal"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            if isinstance(value, (classmethod, staticmethod)):
                value = getattr(klass, name)  # bound: the signature without ``cls``
            if callable(value) or isinstance(value, property):
                seen.add(name)
                out.append((name, value))
    return out


def _entry(dotted: str) -> list[str]:
    obj = _resolve(dotted)
    name = dotted.removeprefix("histocal.") if dotted.count(".") == 1 else dotted
    lines = [f"### `{name}`", ""]
    if inspect.isclass(obj) or inspect.isroutine(obj):
        sig = _signature(obj)
        kind = "class " if inspect.isclass(obj) else ""
        if sig is not None:
            lines += ["```python", f"{kind}{dotted.rpartition('.')[2]}{sig}", "```", ""]
        lines += [_doc(obj), ""]
    else:
        lines += [f"`{dotted.rpartition('.')[2]} = {obj!r}`", ""]
        return lines
    if inspect.isclass(obj) and obj.__module__.startswith("histocal"):
        for member, value in members(obj):
            if isinstance(value, property):
                lines += [f"#### `{name}.{member}` (property)", "", _doc(value), ""]
                continue
            sig = _signature(value)
            lines += [f"#### `{name}.{member}`", ""]
            if sig is not None:
                lines += ["```python", f"{member}{sig}", "```", ""]
            lines += [_doc(value), ""]
    return lines


def render() -> str:
    lines = [
        "# API reference",
        "",
        "Written by `scripts/api_docs.py` from the docstrings (do not edit by hand; "
        "`tests/test_docs.py` checks it is up to date). The manual is [usage.md](usage.md), the "
        "methods [methods.md](methods.md).",
        "",
    ]
    for title, names in SECTIONS:
        lines += [f"## {title}", ""]
        for dotted in names:
            lines += _entry(dotted)
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is out of date")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != text:
            print("docs/api.md is out of date: run python scripts/api_docs.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

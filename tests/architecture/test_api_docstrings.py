"""The public API is documented (issue 25): every name of ``histocal.__all__``, the public
functions of ``histocal.diagnose``, ``histocal.report`` and ``histocal.distributed``, every entry
of docs/api.md, and every public method and property of their classes, has a docstring; a
callable that takes arguments has an ``Args:`` section (a record class: ``Attributes:``), and one
that returns something a ``Returns:`` section (Google style; docs/api.md is generated from them)."""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

import histocal

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("histocal.diagnose", "histocal.report", "histocal.distributed")


def _api_docs():
    """scripts/api_docs.py, which writes docs/api.md from these docstrings."""
    spec = importlib.util.spec_from_file_location("api_docs", ROOT / "scripts" / "api_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


API_DOCS = _api_docs()


def _public_objects() -> Iterator[tuple[str, object]]:
    """histocal's exports, the public functions of ``MODULES``, and every entry of docs/api.md."""
    labels = [f"histocal.{name}" for name in histocal.__all__]
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        labels += [
            f"{module_name}.{n}" for n in getattr(module, "__all__", ()) if inspect.isroutine(getattr(module, n))
        ]
    labels += [dotted for _, names in API_DOCS.SECTIONS for dotted in names]
    for dotted in dict.fromkeys(labels):
        module, _, name = dotted.rpartition(".")
        yield dotted, getattr(importlib.import_module(module), name)


def _problems(label: str, obj: object, *, is_class: bool = False) -> list[str]:
    doc = inspect.getdoc(obj) if not is_class else obj.__doc__
    if not doc:
        return [f"{label}: no docstring"]
    if isinstance(obj, property):
        return []
    try:
        sig = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return []
    params = [p for p in sig.parameters.values() if p.name not in ("self", "cls")]
    out = []
    if params and "Args:" not in doc and not (is_class and "Attributes:" in doc):
        out.append(f"{label}: takes {[p.name for p in params]} but has no Args section")
    returned = sig.return_annotation
    if not is_class and returned not in (inspect.Parameter.empty, None, "None") and "Returns:" not in doc:
        out.append(f"{label}: returns {returned} but has no Returns section")
    return out


def _all_problems() -> list[str]:
    problems = []
    for label, obj in _public_objects():
        if inspect.isroutine(obj):
            problems += _problems(label, obj)
        elif inspect.isclass(obj) and obj.__module__.startswith("histocal"):
            problems += _problems(label, obj, is_class=True)
            for member, value in API_DOCS.members(obj):
                problems += _problems(f"{label}.{member}", value)
    return problems


def test_the_public_api_has_google_style_docstrings() -> None:
    problems = _all_problems()
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "doc, expected",
    [
        ('"""Does it."""', ["f: takes ['x'] but has no Args section", "f: returns int but has no Returns section"]),
        ('"""Does it.\n\n    Args:\n        x: a number.\n\n    Returns:\n        One more.\n    """', []),
    ],
)
def test_the_check_sees_a_missing_section(doc: str, expected: list[str]) -> None:
    namespace: dict[str, object] = {}
    exec(f"def f(x: int) -> int:\n    {doc}\n    return x + 1\n", namespace)
    assert _problems("f", namespace["f"]) == expected

"""One route to ORT's results: a calibration state computes ORT's entropy, percentile and
distribution with ``histocal.ort_results`` directly, as the drop-in collector does; it never builds
the drop-in ``HistogramCollector`` (ORT's API object) to compute with, nor swaps histograms into one."""

from __future__ import annotations

import ast
from pathlib import Path

import histocal

STATE = Path(histocal.__file__).parent / "state"


def _collector_lines(source: str) -> list[int]:
    """The lines that name ``HistogramCollector``: imported, called or reached as an attribute."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            named = any(a.name == "HistogramCollector" for a in node.names)
        elif isinstance(node, ast.Name):
            named = node.id == "HistogramCollector"
        elif isinstance(node, ast.Attribute):
            named = node.attr == "HistogramCollector"
        else:
            named = False
        if named:
            lines.append(node.lineno)
    return lines


def test_the_state_builds_no_histogram_collector():
    found = [
        f"{path.relative_to(STATE.parent)}:{line}"
        for path in sorted(STATE.rglob("*.py"))
        for line in _collector_lines(path.read_text(encoding="utf-8"))
    ]
    assert found == []


def test_the_scan_finds_a_collector_the_state_would_build():
    source = (
        "from .. import collector\n"
        "from ..collector import HistogramCollector\n"
        "a = HistogramCollector('entropy', False, 128, 128, 99.999, 'same')\n"
        "b = collector.HistogramCollector('entropy', False, 128, 128, 99.999, 'same')\n"
    )
    assert sorted(set(_collector_lines(source))) == [2, 3, 4]

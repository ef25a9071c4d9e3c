"""BENCHMARKS.md is generated from the committed records (benches/results/*.json) by
``python -m benches report``: it must be what they give now, short enough to read, and show its
plots. Nothing is measured here."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benches.support import report  # noqa: E402

TEXT = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")


def test_benchmarks_md_is_generated_from_the_records():
    assert report.render() == TEXT, (
        "BENCHMARKS.md is stale against benches/results/*.json: run python -m benches report"
    )


def test_benchmarks_md_is_short():
    summary = TEXT.split("\n## Summary\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in summary.splitlines() if line.startswith("| [")]
    assert len(TEXT.splitlines()) <= 500
    assert 0 < len(rows) <= 15
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert all(len(c) <= report.MAX_CELL for c in cells), row
        assert re.match(r"\[[^\]]+\]\(#[\w-]+\)", cells[0]), row  # each row links its section


def test_plots_are_committed_small_and_shown():
    shown = re.findall(r"!\[[^\]]*\]\((benches/plots/[^)]+\.png)\)", TEXT)
    assert len(shown) >= 3
    for path in shown:
        assert (ROOT / path).stat().st_size < 150_000, path


def test_readme_figures_are_those_of_the_summary():
    """The README's headline figures are quoted from BENCHMARKS.md's summary, so a new
    measurement that changes them fails here until the README says what the records say."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## What it gives\n", 1)[1].split("\n## ", 1)[0]
    figures = re.findall(r"[+-]?\d[\d.,]*(?:-\d[\d.,]*)?(?:x|%)", section)
    summary = TEXT.split("\n## Summary\n", 1)[1].split("\n## ", 1)[0]
    assert figures
    assert [f for f in figures if f not in summary] == []

"""The project's documentation stays inside the project, the README's commands are the ones
the repository runs, and CI runs them with the derandomized hypothesis profile."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from hypothesis import settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    ROOT / "BENCHMARKS.md",
    ROOT / "benches" / "NOTES.md",
    *sorted((ROOT / "docs").glob("*.md")),
]


def test_links_point_to_files_inside_the_repository():
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path = (doc.parent / target).resolve()
            assert path.is_relative_to(ROOT) and path.exists(), f"{doc.name}: link {target}"
        assert "../shared" not in text and "/work/" not in text, doc.name


def _bash_block_after(text: str, heading: str) -> str:
    section = text.split(f"\n{heading}\n", 1)[1]
    return re.search(r"```bash\n(.*?)\n```", section, re.S).group(1).strip()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert _bash_block_after(readme, "## Install and run") == "pip install . && histocal demo"
    command = _bash_block_after(readme, "## Test")
    assert command == "bash scripts/test.sh"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1] == f"exec {command}"


def test_api_page_is_up_to_date():
    """docs/api.md is what scripts/api_docs.py writes from the current docstrings."""
    spec = importlib.util.spec_from_file_location("api_docs", ROOT / "scripts" / "api_docs.py")
    api_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(api_docs)
    assert (ROOT / "docs" / "api.md").read_text(encoding="utf-8") == api_docs.render(), (
        "docs/api.md is out of date: run python scripts/api_docs.py"
    )


def test_benchmarks_open_with_the_summary():
    """BENCHMARKS.md is read from its summary: the first ``##`` section is ``## Summary``."""
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert re.findall(r"^## .*$", text, re.M)[0] == "## Summary"


def test_readme_is_a_front_page():
    """The README stays a front page (at most 300 lines); the manual is docs/usage.md."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 300


def test_install_hints_name_installable_packages():
    """histocal is not on a package index: no hint may say `pip install 'histocal[...]'`."""
    for path in [*DOCS, *sorted((ROOT / "python" / "histocal").glob("*.py"))]:
        assert "histocal[" not in path.read_text(encoding="utf-8"), path.name


def test_ci_selects_the_derandomized_hypothesis_profile():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^export HYPOTHESIS_PROFILE=ci$", ci, re.M), ci
    ci_profile = settings.get_profile("ci")
    assert ci_profile.derandomize and ci_profile.database is None


def test_test_helpers_are_modules_not_conftest():
    """conftest.py holds fixtures and the profile: the helpers are importable modules (whether
    ``from conftest import`` works at all depends on pytest's import mode)."""
    for path in sorted((ROOT / "tests").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^\s*(from conftest import|import conftest)", text, re.M), path.name

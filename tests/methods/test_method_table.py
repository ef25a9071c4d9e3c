"""The method table (histocal.methods.table) is the one description of the methods: option checks,
the state file's settings, the command line and auto's candidates all follow it."""

from __future__ import annotations

from pathlib import Path

import pytest

import histocal
from histocal import methods
from histocal.cli.main import build_parser
from histocal.methods import table
from histocal.state.file_format import _settings

PACKAGE = Path(histocal.__file__).parent
STR_OPTIONS = [(m.name, o) for m in table.HISTOCAL_TABLE for o in m.options if o.kind is str and o.name != "qtype"]


def test_histocal_methods_defaults_are_the_table_defaults():
    for m in table.HISTOCAL_TABLE:
        assert methods.METHOD_OPTIONS[m.name] == m.defaults
        assert methods.check_options(m.name, {}) == m.defaults
    assert tuple(table.TABLE) == methods.ORT_METHODS + methods.HISTOCAL_METHODS


@pytest.mark.parametrize(("method", "option"), STR_OPTIONS, ids=[f"{m}.{o.name}" for m, o in STR_OPTIONS])
def test_every_choice_is_accepted_and_others_are_named(method, option):
    for choice in option.choices:
        assert methods.check_options(method, {option.name: choice})[option.name] == choice
        assert _settings({option.name: choice}) == {option.name: choice}  # the state file takes it too
    with pytest.raises(ValueError, match=f"{method}: {option.name} must be"):
        methods.check_options(method, {option.name: "no such value"})


def test_command_line_choices_come_from_the_table():
    parser = build_parser()
    for _, option in STR_OPTIONS:
        flag = "--" + option.name.replace("_", "-")
        for choice in option.choices:
            args = parser.parse_args(["recompute", "state.hcs", "--method", "pow2", "--cache", "c.json", flag, choice])
            assert getattr(args, option.name) == choice


def test_votes_are_collected_only_for_the_voting_setting():
    key, value = table.POW2_VOTING
    assert table.collects_votes("pow2", {key: value})
    assert not table.collects_votes("pow2", table.TABLE["pow2"].defaults)
    assert not table.collects_votes("mse", {key: value})


def test_each_option_value_is_spelled_in_one_source_file():
    # Adding a method or an option value is one table entry: nothing else spells the values.
    # histocal.quark is exempt: it mirrors Quark's API, whose enum names Quark fixes.
    sources = {p: p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py") if p.parent.name != "quark"}
    for value in table.POW2_METHODS + table.MINMSE_MODES[1:]:
        spelled = sorted(str(p.relative_to(PACKAGE)) for p, text in sources.items() if value in text)
        assert spelled == ["methods/table.py"], value

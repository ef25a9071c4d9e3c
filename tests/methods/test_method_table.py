"""The method table (histocal.methods.table) is the one description of the methods: option checks,
the state file's settings, the command line and auto's candidates all follow it."""

from __future__ import annotations

from pathlib import Path

import pytest

import histocal
from histocal import methods
from histocal.cli.main import build_parser
from histocal.methods import table
from histocal.state.file.header import _settings

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
    assert table.summaries_for("pow2", {key: value}) == {table.POW2_VOTES}
    assert not table.summaries_for("pow2", table.TABLE["pow2"].defaults)
    assert not table.summaries_for("mse", {key: value})
    assert table.summaries_for("isotone", {}) == {table.ISOTONE}
    assert not table.summaries_for("a registered method", {key: value})


def test_each_option_value_is_spelled_in_one_source_file():
    # Adding a method or an option value is one table entry: nothing else spells the values.
    # histocal.quark is exempt: it mirrors Quark's API, whose enum names Quark fixes.
    sources = {p: p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py") if p.parent.name != "quark"}
    for value in table.POW2_METHODS + table.MINMSE_MODES[1:]:
        spelled = sorted(str(p.relative_to(PACKAGE)) for p, text in sources.items() if value in text)
        assert spelled == ["methods/table.py"], value


def _string_literals() -> dict[str, set[str]]:
    """Per source file (histocal.quark exempt, as above), its string constants outside docstrings."""
    import ast

    out = {}
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "quark":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        out[str(path.relative_to(PACKAGE))] = {
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
        }
    return out


def test_each_collection_key_and_flag_is_spelled_in_one_source_file():
    # A collection setting is one row of histocal.methods.settings: its extra_options keys, flag and
    # environment variable are written nowhere else (every other module derives them from the row).
    from histocal.methods import settings

    literals = _string_literals()
    keys = [
        settings.METHOD_OPTIONS_KEY,
        settings.METHOD_OVERRIDES_KEY,
        settings.QUANTIZE_METHOD_OVERRIDES_KEY,
        *(s.extra_key for s in settings.SETTINGS if s.extra_key and s.extra_key != s.name),
        # (`quantize --per-channel` is also ORT's own weight argument of that name)
        *(s.flag for s in settings.SETTINGS if s.flag and s is not settings.PER_CHANNEL),
        *(s.env for s in settings.SETTINGS if s.env),
    ]
    assert {"MemoryBudget", "StreamingBins", "CollectionMode", "NumThreads", "SessionOptions"} <= set(keys)
    assert {"MethodOptions", "MethodOverrides", "channel_axis", "--memory-budget", "HISTOCAL_MEMORY_BUDGET"} <= set(
        keys
    )
    for key in keys:
        spelled = sorted(p for p, values in literals.items() if key in values)
        assert spelled == ["methods/settings.py"], key


def test_each_method_option_flag_is_derived_from_the_table():
    # Every option of every method reaches the command line from its table row: no module spells its flag
    # (but `histocal report`'s own --qtype and --symmetric: what the report's errors are computed for).
    literals = _string_literals()
    for option in (*table.ALL_OPTIONS.values(), *table.COLLECT_OPTIONS.values()):
        spelled = [p for p, values in literals.items() if option.flag in values and p != "cli/report.py"]
        assert spelled == [], option.flag


@pytest.mark.parametrize("name", [n for n, o in table.ALL_OPTIONS.items() if o.kind is int])
def test_command_line_parses_an_int_option_from_the_table(name):
    option = table.ALL_OPTIONS[name]
    low, high = option.bounds
    parser = build_parser()
    base = ["recompute", "state.hcs", "--method", "kl", "--cache", "c.json", option.flag]
    assert getattr(parser.parse_args([*base, str(int(high))]), name) == int(high)  # an int, not a string
    assert isinstance(getattr(parser.parse_args([*base, "64"]), name), int)
    with pytest.raises(SystemExit):
        parser.parse_args([*base, str(int(low) - 1)])
    with pytest.raises(ValueError, match=f"kl: {name} must be an integer in"):
        methods.check_options("kl", {name: int(high) + 1})


def test_collection_settings_from_each_spelling_and_refuse_bad_values():
    from histocal.methods.settings import CollectionSettings, settings_for

    given = {"CollectionMode": "exact", "StreamingBins": 1024, "MemoryBudget": "2KiB", "channel_axis": 2}
    settings = CollectionSettings.from_extra_options({**given, "num_bins": 7})
    assert (settings.mode, settings.streaming_bins, settings.memory_budget, settings.axis) == ("exact", 1024, 2048, 2)
    assert settings == CollectionSettings.from_keywords(mode="exact", streaming_bins=1024, memory_budget=2048, axis=2)
    # a calibrator reads its own settings: mse (streaming) neither the mode nor the budget, MinMax no bins
    mse = CollectionSettings.from_extra_options({**given, "MemoryBudget": "bad"}, settings_for("mse"))
    assert (mse.mode, mse.memory_budget, mse.streaming_bins) == ("auto", None, 1024)
    minmax = CollectionSettings.from_extra_options({**given, "StreamingBins": 1000}, settings_for("minmax"))
    assert minmax == CollectionSettings()
    # a calibrator takes the object or the keywords, not both
    with pytest.raises(TypeError, match="not both"):
        CollectionSettings.of(settings, mode="exact")
    assert CollectionSettings.of(settings) is settings
    # per-channel histograms are streaming ones: the drift the distributed driver once had is refused here
    with pytest.raises(ValueError, match="streaming mode only"):
        CollectionSettings.from_keywords(mode="exact", per_channel=True)
    assert CollectionSettings.from_keywords(per_channel=True).mode == "streaming"
    with pytest.raises(TypeError, match="memory_budgett"):
        CollectionSettings.from_keywords(memory_budgett=1)
    with pytest.raises(ValueError, match="streaming_bins must be a power of two"):
        CollectionSettings.from_keywords(streaming_bins=1000)

"""The report's methods, colours, labels and per-method settings come from the method table: a
method row with a ``colour`` is all the report needs."""

import dataclasses

from histocal.methods.table import TABLE
from histocal.report import tensors


def test_report_methods_are_the_coloured_rows_in_table_order():
    assert tensors.REPORT_METHODS == ("minmax", "entropy", "percentile", "mse", "kl", "pow2", "auto", "isotone")
    assert tuple(m.name for m in TABLE.values() if m.colour) == tensors.REPORT_METHODS
    assert set(tensors.COLOURS) == set(tensors.REPORT_METHODS)
    assert tensors.LABELS == {"pow2": "pow2 (MinMSE, All)"}


def test_report_settings_are_the_report_options_the_method_takes():
    assert tensors._method_settings("kl", "int16", True) == {}
    assert tensors._method_settings("percentile", "int16", True) == {"symmetric": True}
    assert tensors._method_settings("pow2", "int16", True) == {"qtype": "int16"}
    assert tensors._method_settings("mse", "int16", True) == {"qtype": "int16", "symmetric": True}


def test_a_new_row_reaches_the_report(monkeypatch):
    row = dataclasses.replace(TABLE["mse"], name="mse2", colour="#000000", label="mse 2")
    monkeypatch.setitem(TABLE, "mse2", row)
    assert tensors._method_settings("mse2", "uint8", False) == {"qtype": "uint8", "symmetric": False}

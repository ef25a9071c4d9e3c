"""The range methods' options reach the Rust core as keyword arguments read by name (one
``MethodOptions``): defaults as in the method table, unknown names and wrong types rejected."""

import numpy as np
import pytest

from histocal import _core
from histocal.methods.scale_rule import SCALE_RULE
from histocal.methods.table import TABLE

COUNTS = np.arange(1, 65, dtype=np.uint64)


def _range(method, **options):
    return _core.histogram_range(method, COUNTS, -1.0, 2 / 64, -1.0, 1.0, scale_rule=SCALE_RULE, **options)


@pytest.mark.parametrize("method", ["mse", "kl", "pow2"])
def test_defaults_are_the_tables(method):
    assert _range(method) == _range(method, **TABLE[method].defaults)


def test_options_change_the_range():
    assert _range("mse", qtype="int16", symmetric=True) != _range("mse")


def test_stream_ranges_take_the_same_options():
    s = _core.StreamHistograms(256)
    s.collect([("t", [np.linspace(-1, 1, 1000, dtype=np.float32)])])
    assert s.ranges("mse", scale_rule=SCALE_RULE, symmetric=True) != s.ranges("mse", scale_rule=SCALE_RULE)
    with pytest.raises(TypeError, match='unexpected option "qtyp"'):
        s.ranges("mse", scale_rule=SCALE_RULE, qtyp="int8")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"qtyp": "int8"}, 'unexpected option "qtyp"'),
        ({"qtype": 5}, 'option "qtype" must be a str, got 5'),
        ({"num_bins": "a"}, "option \"num_bins\" must be an integer, got 'a'"),
        ({"symmetric": 1}, 'option "symmetric" must be a bool, got 1'),
    ],
)
def test_bad_options_are_type_errors_naming_them(options, message):
    with pytest.raises(TypeError, match=message):
        _range("kl", **options)

"""State files an earlier histocal wrote read back to the same bytes, and serve every method.

``data/written_before/`` holds files written by the code before the calibration state became a
collection plus its provenance (streaming with isotone and pow2 summaries, plain streaming, exact
value and float16 |x| histograms, exact histograms merged by ORT's rule, per-channel histograms with
isotone summaries; each stored and deflated). A change of how a state is held in memory must not
change what its file says.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from histocal import CalibrationState, merge_states

WRITTEN_BEFORE = sorted((Path(__file__).parent / "data" / "written_before").glob("*.state"))


def test_the_earlier_files_are_there():
    assert len(WRITTEN_BEFORE) == 12


@pytest.mark.parametrize("path", WRITTEN_BEFORE, ids=lambda p: p.name)
def test_an_earlier_file_reads_back_to_its_bytes(path: Path):
    raw = path.read_bytes()
    state = CalibrationState.from_bytes(raw, path.name)
    assert state.to_bytes(compress=".deflated." in path.name) == raw


@pytest.mark.parametrize("path", [p for p in WRITTEN_BEFORE if ".deflated." not in p.name], ids=lambda p: p.name)
def test_an_earlier_file_serves_every_method_and_merges(path: Path):
    state = CalibrationState.load(path)
    per_tensor = {"per_channel": False} if state.channels is not None else {}
    for method in ("minmax", "entropy", "percentile", "distribution", "mse", "kl", "auto"):
        assert set(state.compute(method, **per_tensor).data) == set(state.names), method
    if state.channels is not None:
        assert set(state.compute("percentile").data) == set(state.names)
    twice = merge_states(state, state)
    assert twice.names == state.names
    assert all(twice.counts(n)[0] == 2 * state.counts(n)[0] for n in state.names)

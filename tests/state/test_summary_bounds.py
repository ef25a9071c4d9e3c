"""The summaries' members (pow2's votes, isotone's pairs) bounded from the zip directory before they are
inflated, and saving checking exactly what loading checks.

Each hostile file is a real saved state with summaries whose members are rewritten, loaded in a fresh
interpreter under an address-space cap and a timeout (``run_capped``): before, the votes' limit came from
the batch counts the file declares, outside the held-bytes limit and without a deflate-ratio bound, so 2 MB
of deflated zeros took gigabytes and seconds before a ``ValueError``.
"""

from __future__ import annotations

import io
import re
import sys

import numpy as np
import pytest
from test_hostile_inputs import GiB, MiB, members, npy, outcome, rezip, run_capped, zip_with_deflate_bomb

from histocal import CalibrationState, Collection, _core
from histocal.state.file import format as file_format

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS and /proc")


def npy_header(shape: tuple[int, ...], descr: str) -> bytes:
    """The .npy header of an array of ``shape`` (the data to follow, deflated, in a bomb)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def voted_state(n: int, bins: int = 8) -> bytes:
    """A state of ``n`` tensors with no finite value, saved with pow2's votes (an empty stream_votes)."""
    s = _core.StreamHistograms(bins, summaries=["pow2_votes"])
    s.collect([(f"t{i}", [np.zeros(0, np.float32)]) for i in range(n)])
    return CalibrationState(Collection("streaming", s)).to_bytes()


def votes_bomb(finite: int) -> bytes:
    """The tracker's reproducer: 11,000 empty tensors declaring 2^62 batches (and ``finite`` values), and a
    stream_votes member of (2 << 30) // 32 rows of 4 int64, deflated zeros (about 2 MB)."""
    n = 11_000
    parts = members(voted_state(n))
    counts = np.zeros((n, 5), np.uint64)
    counts[:, 0], counts[:, 4] = finite, 1 << 62
    parts["stream_counts.npy"] = npy(counts)
    del parts["stream_votes.npy"]
    return zip_with_deflate_bomb(parts, "stream_votes.npy", 2 << 30, npy_header(((2 << 30) // 32, 4), "<i8"))


@pytest.mark.subprocess
@pytest.mark.parametrize("finite", [0, 1 << 62])
def test_votes_bomb_is_refused_from_the_directory(tmp_path, finite):
    """8.3 s and 2.7 GB before a ValueError; now refused from the zip directory (the votes' declared size
    against what their compressed bytes can inflate to), in well under a second and 1 GiB."""
    path = tmp_path / "votes.npz"
    path.write_bytes(votes_bomb(finite))
    assert path.stat().st_size < 5 * MiB
    r = run_capped(outcome(f"CalibrationState.load({str(path)!r})", "load"), 1 * GiB, timeout=60)
    assert r["load"].startswith(f"ValueError: Invalid calibration state {path}: zip member 'stream_votes.npy' "), r
    assert "compressed bytes allow" in r["load"], r
    assert r["load_seconds"] < 5, r


@pytest.mark.subprocess
def test_isotone_pairs_bomb_is_refused_from_the_directory(tmp_path):
    """80 tensors each declaring the most pairs a tensor may hold, and 1.3 GB of pairs as deflated zeros
    (1.3 MB): the pairs were inflated (2 MB -> 2.2 GB) before anything refused them."""
    rng = np.random.default_rng(3)
    s = _core.StreamHistograms(64, summaries=["isotone"])
    s.collect([(f"t{i}", [rng.normal(size=(20, 5)).astype(np.float32)]) for i in range(80)])
    parts = members(CalibrationState(Collection("streaming", s)).to_bytes())
    pairs = 80 * _core.ISOTONE_MAX_PAIRS
    parts["isotone_tensors.npy"] = npy(np.array([[_core.ISOTONE_MAX_PAIRS, 0, 0]] * 80, np.uint64))
    del parts["isotone_pairs.npy"]
    path = tmp_path / "pairs.npz"
    path.write_bytes(zip_with_deflate_bomb(parts, "isotone_pairs.npy", 16 * pairs, npy_header((pairs, 2), "<f8")))
    assert path.stat().st_size < 3 * MiB
    r = run_capped(outcome(f"CalibrationState.load({str(path)!r})", "load"), 1 * GiB, timeout=60)
    assert "zip member 'isotone_pairs.npy' declares" in r["load"] and "compressed bytes allow" in r["load"], r
    assert r["load_seconds"] < 5, r


def problem(exc: pytest.ExceptionInfo) -> str:
    """The checked problem of a load's or a save's ValueError, without the words around it."""
    text = str(exc.value)
    text = re.sub(r"^Invalid calibration state [^:]*: ", "", text)
    text = re.sub(r"^this state is too large to be read back, so it is not written: ", "", text)
    return re.sub(r" \(calibrate fewer tensors or channels per state.*$", "", text)


def test_summaries_count_inside_the_held_bytes_on_save_and_load(monkeypatch):
    """The votes' bytes count with the bins against the held-bytes limit: a state over it is refused by load
    and by save with the same problem; one within it saves and loads."""
    s = _core.StreamHistograms(1024, summaries=["pow2_votes"])
    rng = np.random.default_rng(0)
    for _ in range(20):
        s.collect([(f"t{i}", [rng.normal(0, 10.0 ** rng.uniform(-3, 3), 200).astype(np.float32)]) for i in range(50)])
    state = CalibrationState(Collection("streaming", s))
    raw = state.to_bytes()
    votes = members(raw)["stream_votes.npy"]
    assert len(votes) > 10_000
    monkeypatch.setattr(file_format, "MAX_HELD_BYTES", 8 * 1024 * 50 + len(votes) - 1)
    with pytest.raises(ValueError) as loaded:
        CalibrationState.from_bytes(raw)
    with pytest.raises(ValueError, match="too large to be read back") as saved:
        state.to_bytes()
    assert problem(loaded) == problem(saved) and "stream_votes" in problem(saved), (loaded.value, saved.value)
    monkeypatch.setattr(file_format, "MAX_HELD_BYTES", 8 * 1024 * 50 + len(votes))
    assert CalibrationState.from_bytes(state.to_bytes()).to_bytes() == raw


def test_isotone_state_at_the_held_limit_saves_what_loads(monkeypatch):
    """Save checked isotone's pairs with 0 bins, load with the state's: a state near the limit was written,
    then refused on load. Now save refuses it with load's problem, and one just within it round-trips."""
    rng = np.random.default_rng(5)
    s = _core.StreamHistograms(4096, summaries=["isotone"])
    s.collect([(f"t{i}", [rng.normal(size=(400, 6)).astype(np.float32)]) for i in range(4)])
    state = CalibrationState(Collection("streaming", s), method="isotone")
    raw = state.to_bytes()
    parts = members(raw)
    summary = sum(len(parts[k]) for k in ("isotone_tensors.npy", "isotone_pairs.npy", "isotone_rows.npy"))
    bins, pairs = 8 * 4096 * 4, int(np.load(io.BytesIO(parts["isotone_tensors.npy"]))[:, 0].sum())
    # room for the pairs alone (what save checked), not for the pairs and the bins (what load checked)
    monkeypatch.setattr(file_format, "MAX_HELD_BYTES", bins + 24 * pairs - 1)
    with pytest.raises(ValueError) as loaded:
        CalibrationState.from_bytes(raw)
    with pytest.raises(ValueError, match="too large to be read back") as saved:
        state.to_bytes()
    assert problem(loaded) == problem(saved), (loaded.value, saved.value)
    monkeypatch.setattr(file_format, "MAX_HELD_BYTES", bins + summary)
    assert CalibrationState.from_bytes(state.to_bytes()).to_bytes() == raw


def test_deflated_summaries_inflating_beyond_the_ratio_are_refused_on_save_and_load():
    """A deflated summary member may declare at most MAX_SUMMARY_RATIO times its compressed bytes (+ 1 MiB):
    far beyond what histocal's members reach (votes ~14:1, isotone's members together ~15:1)."""

    raw = voted_state(3)
    parts = members(raw)
    rows = np.zeros((3 << 20, 4), np.int64)  # 96 MiB of zeros, ~1000:1 deflated
    bomb = rezip({**parts, "stream_votes.npy": npy(rows)}, compression=8)
    with pytest.raises(ValueError, match="zip member 'stream_votes.npy' declares .* compressed bytes allow"):
        CalibrationState.from_bytes(bomb)
    assert file_format.MAX_SUMMARY_RATIO >= 32


@pytest.mark.subprocess
def test_saving_keeps_no_whole_export_alive():
    """Saving kept a view of every tensor's whole exported histogram until the file was written (3.6 GB for
    a 168 MB file): 32 tensors x 2^20 bins held 256 MiB of exports for a file of a few KB."""
    r = run_capped(
        """
stream = _core.StreamHistograms(1 << 20)
stream.collect([(f"t{i}", [np.full(10, 1.0 + i, np.float32)]) for i in range(32)])
state = CalibrationState(Collection("streaming", stream))
with bounded_address_space(96 << 20):
"""
        + "\n".join("    " + line for line in outcome("raw = state.to_bytes()", "save").splitlines())
        + "\nreport(back='raw' in dir() and CalibrationState.from_bytes(raw).to_bytes() == raw)\n",
        2 * GiB,
    )
    assert r["save"] == "ok" and r["back"], r

"""A third summary in the state file through its touch points only.

The review's claim: a third summary is one Rust file, a ``REGISTERED`` line, one members class and a
``summaries=`` on its table row. The Rust half is a cargo test: ``rust/src/collection/summary/row_count.rs``
is a throwaway summary compiled into tests only, with its ``#[cfg(test)]`` line in ``REGISTERED``, and the
collection code collects, copies, merges and restores it unchanged. That summary is not in the built
``_core`` (no test-only code ships), so the Python half cannot collect it. It shows the file side instead:

* a throwaway members class, ``ThirdMembers``, for a summary the core has (pow2's votes, stored a second
  way: one flat int64 member ``third_votes``, written after ``channels``, version 2), added as a third entry
  of the registry ``histocal.state.file.summaries.SUMMARY_MEMBERS`` by ``monkeypatch``: the only change;
* collect -> save -> load -> save gives the same bytes, the file holds its member where its class says, at
  the version its class says, the summary it restores gives the same pow2 ranges, and its member is held to
  the same checks as every summary's (a file that declares too many of its bytes is refused);
* without it registered, histocal's own registry refuses its member (nothing else knows about it).

(The table row's ``summaries=`` is the methods table's half, tested with the table.)
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any, ClassVar

import numpy as np
import pytest

from histocal import CalibrationState, Collection, _core
from histocal.state.file import summaries
from histocal.state.file.errors import fail
from histocal.state.file.format import MemberSpec, SummaryMembers


class ThirdMembers(SummaryMembers):
    """pow2's votes as one flat member, rows of (tensor, type, exponent, batches)."""

    summary = "pow2_votes"
    members: ClassVar[dict[str, MemberSpec]] = {"third_votes": ("<i8", 1, None)}
    after = "channels"
    version = 2
    first = "third_votes"
    later = ("third_votes",)

    def later_limits(self, arrays: dict[str, np.ndarray], tensors: int, held_bins: int) -> dict[str, int]:
        counts = arrays["stream_counts"]
        return {"third_votes": 8 * 4 * 3 * int(np.minimum(counts[:, 4], _core.POW2_EXPONENTS).sum())}

    def write(self, stream: Any, names: list[str]) -> dict[str, np.ndarray]:
        rows = [
            [i, t, k, n]
            for i, name in enumerate(names)
            for t, k, n in zip(*(stream.export_summary(name, self.summary)[c] for c in ("type", "exponent", "batches")))
        ]
        return {"third_votes": np.array(rows, "<i8").reshape(-1)}

    def read(self, stream: Any, names: list[str], arrays: dict[str, np.ndarray]) -> None:
        flat = arrays.get("third_votes")
        if flat is None or flat.size % 4:
            fail("third_votes: missing, or not rows of 4")
        rows = flat.reshape(-1, 4)
        for i, name in enumerate(names):
            mine = rows[rows[:, 0] == i]
            parts = {"type": mine[:, 1].copy(), "exponent": mine[:, 2].copy(), "batches": mine[:, 3].astype(np.uint64)}
            try:
                stream.restore_summary(name, self.summary, parts)
            except (ValueError, OverflowError) as exc:
                fail(f"third_votes: {exc}")


def collected() -> CalibrationState:
    rng = np.random.default_rng(3)
    s = _core.StreamHistograms(512, summaries=["pow2_votes"])
    for _ in range(6):
        s.collect(
            [(f"t{i}", [rng.normal(0, 10.0 ** rng.uniform(-2, 2), (40, 8)).astype(np.float32)]) for i in range(3)]
        )
    return CalibrationState(Collection("streaming", s))


def names_and_version(raw: bytes) -> tuple[list[str], int]:
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        header = np.load(io.BytesIO(zf.read("header.npy")))
        return zf.namelist(), json.loads(header.tobytes())["version"]


def test_a_third_members_class_is_one_registry_entry(monkeypatch):
    stock = collected().to_bytes()
    assert names_and_version(stock) == (
        ["header.npy", "stream_bins.npy", "stream_stats.npy", "stream_counts.npy", "stream_votes.npy"],
        1,
    )
    monkeypatch.setattr(summaries, "SUMMARY_MEMBERS", (*summaries.SUMMARY_MEMBERS, ThirdMembers()))
    state = collected()
    raw = state.to_bytes()
    names, version = names_and_version(raw)
    assert names[-2:] == ["stream_votes.npy", "third_votes.npy"] and version == 2
    loaded = CalibrationState.from_bytes(raw)
    assert loaded.to_bytes() == raw
    want = state.compute("pow2", minmse_mode="MostCommon")
    got = loaded.compute("pow2", minmse_mode="MostCommon")
    for name in state.names:
        for a, b in zip(got[name].range_value, want[name].range_value, strict=True):
            np.testing.assert_array_equal(a, b)
    # its member is checked as every summary's: declared sizes bounded before they are read
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        parts = {n: zf.read(n) for n in zf.namelist()}
    bomb = io.BytesIO()
    np.lib.format.write_array(bomb, np.zeros(4 * 10_000, "<i8"))
    with zipfile.ZipFile(out := io.BytesIO(), "w") as zf:
        for n, data in {**parts, "third_votes.npy": bomb.getvalue()}.items():
            zf.writestr(n, data)
    with pytest.raises(ValueError, match="zip member 'third_votes.npy' declares"):
        CalibrationState.from_bytes(out.getvalue())
    # histocal's own registry knows nothing of it
    monkeypatch.undo()
    with pytest.raises(ValueError, match="unexpected zip member 'third_votes.npy'"):
        CalibrationState.from_bytes(raw)
    assert collected().to_bytes() == stock

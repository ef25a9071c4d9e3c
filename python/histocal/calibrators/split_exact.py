"""Exact mode split across processes (histocal.distributed): its two passes over parts of the data.

ORT bins all batches of one ``collect_data`` call on edges fixed by the whole call's range. Split
at that seam: ``scan_exact`` is pass 1 over one part (its per-tensor scans: ranges and counts,
nothing binned); every part's scans added together (``_core.Histograms.add_scans``) plan the same
binning wherever they are added, so ``count_exact`` counts one part on the bins of the whole call.
The parts' histograms share their edges and add up (``CalibrationState.merge``) to ORT's histogram
of one call over all the parts' batches. Neither function collects into the calibrator: each uses
its session, settings and lock only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import _core
from ..collector import CollectedData
from ..io.readers import DataSource
from .budget import second_read_differs
from .common import ReadDigest, is_checkpoint, run_batches


@dataclass(frozen=True)
class ExactScan:
    """Pass 1 over one part of the data: its scans (``_core.Histograms.pending_scans`` records),
    its batch count and the digest its second read is checked against."""

    scans: list[Any]
    batches: int
    digest: ReadDigest


def scan_exact(calibrator: Any, data_reader: Any) -> ExactScan:
    """Exact mode's pass 1 over ``data_reader`` on ``calibrator``'s session (an ORT histogram
    calibrator of histocal's): every batch scanned, nothing collected. An empty part gives no
    batches and no scans: it adds nothing (the caller refuses data that is empty in every part)."""
    with calibrator.lock:
        hist = _core.Histograms(calibrator.kind, calibrator.num_bins)
        first = ReadDigest()

        def scan(i: int, items: list) -> None:
            first.add(items)
            if is_checkpoint(i):
                first.kept[i] = first.digest
            hist.scan(items)

        source = DataSource(data_reader)
        n = run_batches(calibrator, source, calibrator.fetch_names(), scan, "histocal pass 1/2 (ranges)")
        return ExactScan(hist.pending_scans(), n, first)


def count_exact(calibrator: Any, data_reader: Any, part: ExactScan, planned_from: Sequence[Any]) -> CollectedData:
    """Exact mode's pass 2 over the part ``part`` scanned: its batches counted on the binning that
    ``planned_from`` (every part's scans, in order) plans, and its streaming histogram. The result
    holds this part's counts only, on the edges every part shares."""
    with calibrator.lock:
        hist, stream = _core.Histograms(calibrator.kind, calibrator.num_bins), calibrator.new_stream()
        hist.add_scans(planned_from)
        hist.plan()
        n, first, second = part.batches, part.digest, ReadDigest()

        def count(i: int, items: list) -> None:
            if i >= n:
                raise ValueError(
                    f"the data reader returned {n} batches on its first read and more on its second "
                    "(exact mode reads the data twice; it must yield the same batches each time)"
                )
            second.add(items)
            if is_checkpoint(i) and second.digest != first.kept[i]:
                raise second_read_differs((i + 1) // 2, i)
            hist.count(items)
            stream.collect(items)

        source = DataSource(data_reader)
        n2 = run_batches(calibrator, source, calibrator.fetch_names(), count, "histocal pass 2/2 (histograms)")
        if n2 != n:
            raise ValueError(
                f"the data reader returned {n} batches on its first read and {n2} on its second "
                "(exact mode reads the data twice; it must yield the same batches each time)"
            )
        if second.digest != first.digest:
            raise second_read_differs(max(first.kept) + 1, n - 1)
        for name, _, _, (finite, nan, posinf, neginf), batches in part.scans:
            st = hist.state(name)
            h = st.hist
            if int(h.sum()) != finite:  # a value outside pass 1's ranges was not binned
                raise ValueError(
                    f"tensor {name!r}: the data reader returned different data on its second read "
                    f"({finite - int(h.sum())} values fell outside the ranges of the first read); "
                    "exact mode reads the data twice and needs the same batches each time"
                )
            # this part's own counts: the planned ones are every part's
            hist.restore(
                name, st.dtype, h, st.edges, st.min, st.max, st.threshold, (finite, nan, posinf, neginf, batches)
            )
        return CollectedData("exact", stream, hist, calibrator.kind, int(calibrator.num_bins))

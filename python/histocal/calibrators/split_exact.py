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
from ..io.readers import DataSource
from ..state.collection import Collection
from .common import ReadCheck, ReadDigest, run_batches

# Why a shard is read twice, in the errors of a second read that differs from the first.
_WHY = (
    " (histocal.distributed's exact mode reads each shard twice: the reader must yield the same feeds in the "
    "same order on each read, so a shuffling loader must not reshuffle when opened again; or use mode='streaming')"
)


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
            hist.scan(items)

        source = DataSource(data_reader)
        desc = "histocal pass 1/2 (ranges)"
        n = run_batches(calibrator, source, calibrator.fetch_names(), scan, desc, digest=first)
        return ExactScan(hist.pending_scans(), n, first)


def count_exact(calibrator: Any, data_reader: Any, part: ExactScan, planned_from: Sequence[Any]) -> Collection:
    """Exact mode's pass 2 over the part ``part`` scanned: its batches counted on the binning that
    ``planned_from`` (every part's scans, in order) plans, and its streaming histogram. The result
    holds this part's counts only, on the edges every part shares."""
    with calibrator.lock:
        hist, stream = _core.Histograms(calibrator.kind, calibrator.num_bins), calibrator.new_stream()
        hist.add_scans(planned_from)
        hist.plan()

        def count(i: int, items: list) -> None:
            hist.count(items)
            stream.collect(items)

        # the feeds are checked against pass 1's as they are read, each before it runs
        check = ReadCheck(part.digest, _WHY)
        source = DataSource(data_reader)
        desc = "histocal pass 2/2 (histograms)"
        run_batches(calibrator, source, calibrator.fetch_names(), count, desc, digest=check)
        for name, _, _, (finite, nan, posinf, neginf), batches in part.scans:
            st = hist.state(name)
            h = st.hist
            if int(h.sum()) != finite:  # a value outside pass 1's ranges was not binned
                raise ValueError(
                    f"tensor {name!r}: the data reader returned different data on its second read "
                    f"({finite - int(h.sum())} values fell outside the ranges of the first read); "
                    "histocal.distributed's exact mode reads each shard twice and needs the same feeds each time"
                )
            # this part's own counts: the planned ones are every part's
            hist.restore(
                name, st.dtype, h, st.edges, st.min, st.max, st.threshold, (finite, nan, posinf, neginf, batches)
            )
        return Collection("exact", stream, hist)

"""What does calibration sharded over Ray workers cost on one machine, and is its merge exact?

The synthetic CNN's feeds are split into shards; ``histocal.distributed.calibrate_distributed``
runs them on 1..N local Ray workers (each worker's start included) against one process
collecting every feed, interleaved in rotating order. The merged state's ranges are compared
with the single process's at the workers' thread count (1), and one shard's state is measured as
a worker sends it: its size and what reading and merging it costs the driver.
"""

from __future__ import annotations

import functools
import logging
import tempfile
from pathlib import Path
from typing import Any

from benches.support import models
from benches.support.harness import Run, interleave, timed
from benches.support.report import fmt, table

TITLE = "Distributed calibration"
QUESTION = (
    "How long does calibration sharded over local Ray workers take against one process, is the merged result the "
    "single run's, and what does each shard's state cost the driver?"
)
SIZES = {
    "smoke": {"size": 32, "samples": 2, "shards": 2, "max_workers": 1, "repeat": 1},
    "quick": {"size": 224, "samples": 16, "shards": 4, "max_workers": 2, "repeat": 2},
    "full": {"size": 224, "samples": 64, "shards": 8, "max_workers": 2, "repeat": 3},
}


def shard(size: int, first: int, count: int) -> list[dict[str, Any]]:
    """Feeds first..first+count-1 (a shard a worker loads itself: module-level, picklable)."""
    return models.cnn_feeds(size, first + count)[first:]


def run(run: Run, settings: dict[str, Any]) -> None:
    import ray

    import histocal
    from histocal.distributed import calibrate_distributed

    logging.getLogger("histocal.distributed").setLevel(logging.WARNING)
    size, samples, count = settings["size"], settings["samples"], settings["shards"]
    bounds = [samples * k // count for k in range(count + 1)]
    shards = [functools.partial(shard, size, bounds[k], bounds[k + 1] - bounds[k]) for k in range(count)]
    feeds = models.cnn_feeds(size, samples)
    with tempfile.TemporaryDirectory(prefix="bench_distributed.") as tmp:
        model = models.save_cnn(Path(tmp), size)
        merged: dict[int, Any] = {}

        def single() -> float:
            cal = histocal.create_calibrator(
                model, calibrate_method="entropy", extra_options={"CollectionMode": "exact"}
            )
            cal.show_progress = False
            return timed(lambda: (cal.collect_data(feeds), cal.compute_data()))

        def workers(n: int) -> float:
            def go() -> None:
                state = calibrate_distributed(model, shards, calibrate_method="entropy",
                                              extra_options={"CollectionMode": "exact"}, num_workers=n, show_progress=False)  # fmt: skip
                merged[n] = state
                state.compute("entropy")

            return timed(go)

        ray.init(num_cpus=settings["max_workers"], include_dashboard=False, logging_level=logging.WARNING)
        try:
            runs = {
                "single process": single,
                **{f"{n} worker(s)": functools.partial(workers, n) for n in range(1, settings["max_workers"] + 1)},
            }
            rounds = interleave(runs, settings["repeat"], warmup=0)
        finally:
            ray.shutdown()
        case = {"size": size, "samples": samples, "shards": count}
        for subject in runs:
            run.add(subject, case, seconds=rounds.seconds[subject], median_s=rounds.median(subject),
                    x_single=rounds.ratio(subject, "single process"))  # fmt: skip

        # The merged state against one process at the workers' thread count (onnxruntime's float
        # outputs can depend on its thread count).
        one = histocal.create_calibrator(
            model, calibrate_method="entropy", extra_options={"CollectionMode": "exact", "NumThreads": 1}
        )
        one.show_progress = False
        one.collect_data(feeds)
        reference = one.compute_data()
        same, tensors = models.same_ranges(merged[1].compute("entropy"), reference)
        part = histocal.create_calibrator(model, calibrate_method="entropy", extra_options={"CollectionMode": "exact"})
        part.show_progress = False
        part.collect_data(shards[0]())
        raw = part.state.to_bytes()
        into = merged[1]
        merge_s = [timed(lambda: into.merge(histocal.CalibrationState.from_bytes(raw))) for _ in range(3)]
        run.add("merge", case, identical=same, tensors=tensors, shard_state_mb=len(raw) / 1e6,
                merge_ms_per_tensor=sorted(merge_s)[1] / tensors * 1e3)  # fmt: skip


def section(result: dict[str, Any]) -> list[str]:
    merge = next(r for r in result["records"] if r["subject"] == "merge")
    case = merge["case"]
    rows = [[r["subject"], f"{r['median_s']:.2f} s", fmt(r["x_single"])] for r in result["records"] if "median_s" in r]
    return [
        f"Synthetic CNN {case['size']}x{case['size']}, {case['samples']} samples in {case['shards']} shards, Entropy, "
        f"exact mode; merged ranges identical to one process's at one thread: **{merge['identical']} of "
        f"{merge['tensors']}**; a shard's state {fmt(merge['shard_state_mb'])} MB, read and merged by the driver in "
        f"{fmt(merge['merge_ms_per_tensor'])} ms per tensor.",
        "",
        *table(["run", "time (median)", "x one process"], rows),
    ]


def summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    merge = next(r for r in result["records"] if r["subject"] == "merge")
    most = [r for r in result["records"] if "x_single" in r][-1]
    return [
        (
            f"distributed (Ray), {merge['case']['shards']} shards",
            f"merged = one process in {merge['identical']} of {merge['tensors']} tensors; {most['subject']} "
            f"{fmt(most['x_single'])}x one process's time on this 2-CPU machine",
        )
    ]

"""``calibrate_distributed``: calibration sharded over a Ray cluster, merged exactly.

The driver starts one actor per worker (a :class:`~histocal.distributed.worker.ShardWorker`: one
calibrator, one ORT session), hands out shards one at a time to whichever worker is free, and
reduces the shards' states as they come in, as a binary tree (a binary counter over the results:
at most log2(shards) states held at once). Streaming mode is one round; exact mode two (pass 1's
scans of every shard plan the bins, pass 2 counts every shard on them).

Exactness: every shard's result depends on that shard alone, and the reduction is exact (streaming
histograms merge exactly; exact histograms on the same edges add), so the merged state is the state
of one run over all the shards' batches, whatever the split, the order of completion or the worker
that ran each shard, and an empty shard adds nothing. Faults (see :mod:`.pool`): a shard whose
worker dies or that outlasts the shard timeout is redone on another worker, and only its one result
is kept; a shard whose data fails fails the run with a :class:`ShardError` naming the shard (and
the file); nothing is merged until every shard has its result.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..calibrators.split_exact import ExactScan
from ..io.models import load_model
from ..io.outputs import external_data_files
from ..methods.settings import CollectionSettings
from ..state import CalibrationState
from .pool import RayPool
from .settings import check_count, check_job, check_seconds, make_job
from .shards import Shard, make_shards
from .worker import Job

__all__ = ["calibrate_distributed", "collect", "make_job", "reduce_states"]

logger = logging.getLogger(__name__)


def import_ray() -> Any:
    """Ray, or an ImportError saying which extra installs it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "histocal.distributed needs Ray, which is not installed: pip install 'ray>=2.40' "
            "(histocal's ray extra: pip install '.[ray]' in a histocal checkout)"
        ) from exc
    return ray


def calibrate_distributed(
    model: str | os.PathLike[str],
    shards: Sequence[Any],
    *,
    calibrate_method: Any,
    extra_options: dict[str, Any] | None = None,
    mode: str | None = None,
    settings: CollectionSettings | None = None,
    num_workers: int | None = None,
    address: str | None = None,
    cpus_per_worker: int | None = None,
    op_types_to_calibrate: Sequence[str] | None = None,
    providers: Sequence[Any] | None = None,
    data_options: dict[str, Any] | None = None,
    max_restarts: int = 0,
    max_task_retries: int = 0,
    max_shard_attempts: int = 3,
    shard_timeout: float | None = None,
    show_progress: bool | None = None,
) -> CalibrationState:
    """Calibrate ``model`` over ``shards`` on a Ray cluster, merged exactly (docs/distributed.md).

    ORT's histogram methods collect in exact mode (ORT's result on all the shards' batches as one
    ``collect_data`` call) unless the mode is ``"streaming"`` or ``per_channel`` is set
    (per-channel histograms are streaming ones, as in one process); histocal's methods collect in
    streaming mode; MinMax collects streaming histograms, whose state computes ORT's MinMax. The
    settings are checked before Ray starts.

    Args:
        model: path of the float model.
        shards: data files or folders (or lists of them), as the CLI's ``--data`` takes them, or
            zero-argument picklable callables returning an iterable of feed dicts. An empty shard
            adds nothing.
        calibrate_method, extra_options, op_types_to_calibrate, providers: ``create_calibrator``'s.
        mode: its ``CollectionMode`` (auto, exact, streaming; here or in ``extra_options``, not
            two different values).
        settings: the collection settings as one ``methods.settings.CollectionSettings``,
            instead of ``mode`` and the settings' ``extra_options`` keys.
        num_workers: default the cluster's CPUs / ``cpus_per_worker``, at most one per shard.
        address: an existing cluster (``"ray://host:10001"``, ``"auto"``); without it, and
            without ``ray.init`` called before, a local Ray instance is started and shut down.
        cpus_per_worker: default 1 (ORT's and histocal's threads per worker).
        data_options: how file shards are read (``batch_size``, ``preprocess``,
            ``input_shape``, ``layout``).
        max_restarts, max_task_retries: Ray's actor options (default 0; -1: no limit): Ray
            restarts a dead worker and reruns its task in place first.
        max_shard_attempts: a shard whose worker dies, or that outlasts ``shard_timeout``, is
            redone on another worker, at most this many times in all.
        shard_timeout: seconds per shard, at most 1e9 (default None or ``inf``: no limit; a
            shard past it has its worker killed).
        show_progress: a progress bar (default: on a terminal).

    Returns:
        The merged ``CalibrationState``: the state of one run over all the shards, bit for bit,
        at the workers' thread count (``cpus_per_worker``; onnxruntime's float outputs can
        change with its intra-op thread count).

    Raises:
        ImportError: Ray is not installed (the message says how to install it).
        ValueError: bad settings (MinMax's moving average, which depends on batch order, or
            per-channel MinMax, a number out of its bounds, naming it), a model file that is not
            an ONNX model (naming it), all found before Ray starts; or data empty in every shard.
        RuntimeError: a bad shard (``ShardError``, naming the shard and file), workers that
            cannot start, or a shard left without a result after its attempts.
    """
    # every setting is checked before Ray is imported or started
    max_shard_attempts = check_count("max_shard_attempts", max_shard_attempts, 1)
    shard_timeout = check_seconds("shard_timeout", shard_timeout)
    if num_workers is not None:
        check_count("num_workers", num_workers, 1)
    for name, value in (("max_restarts", max_restarts), ("max_task_retries", max_task_retries)):
        check_count(name, value, -1, " (-1: no limit, as Ray takes it)")
    job = make_job(calibrate_method, extra_options, op_types_to_calibrate, providers, cpus_per_worker, mode, settings)
    check_job(job)
    load_model(model, load_external_data=False)  # a file no worker could load, named here
    ray = import_ray()
    job = dataclasses.replace(job, model_name=os.fspath(model))
    shard_list = make_shards(shards, data_options)
    model_bytes, external_data = Path(model).read_bytes(), model_external_data(model)
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
    elif address is not None:
        logger.warning("Ray is already initialized; address %r is ignored", address)
    pool = None
    try:
        pool = RayPool(
            ray, model_bytes, job, len(shard_list), num_workers, max_restarts, max_task_retries, external_data
        )
        pool.max_shard_attempts, pool.shard_timeout = max_shard_attempts, shard_timeout
        pool.show_progress = show_progress
        return collect(pool, shard_list, job)
    finally:
        if pool is not None:
            pool.close()
        if started:
            ray.shutdown()


def model_external_data(model: str | os.PathLike[str]) -> dict[str, bytes]:
    """The bytes of ``model``'s external-data files, by their location relative to its folder
    (the workers write them beside their copy of the model); a location outside that folder is
    refused, naming it."""
    folder = Path(model).resolve().parent
    out = {}
    for path in external_data_files(model):
        try:
            location = path.resolve().relative_to(folder).as_posix()
        except ValueError:
            raise ValueError(f"{model}: external data {path} is outside the model's folder") from None
        if not path.is_file():
            raise ValueError(f"{model}: its external data file {path} does not exist")
        out[location] = path.read_bytes()
    return out


def collect(pool: Any, shards: list[Shard], job: Job) -> CalibrationState:
    """Run ``job`` over ``shards`` on ``pool`` (``map(method, shards, args)`` yielding
    ``(index, result)`` once per shard) and reduce the shards' states."""
    if job.mode == "streaming":
        return reduce_states(pool.map("streaming", shards, lambda s: ()), len(shards))
    scans: dict[int, ExactScan] = dict(pool.map("scan", shards, lambda s: ()))
    planned_from = plan_records([scans[s.index] for s in shards])
    if not any(scans[s.index].batches for s in shards):
        raise _no_data(len(shards))
    shared = pool.share(planned_from)
    return reduce_states(pool.map("count", shards, lambda s: (scans[s.index], shared)), len(shards))


def _no_data(shards: int) -> ValueError:
    # one process's error on no data, and where the data was looked for
    return ValueError(f"No data is collected. (all {shards} shards are empty)")


def plan_records(parts: Iterable[ExactScan]) -> list[Any]:
    """Every part's scans, in shard order: ``Histograms.add_scans`` combines them as one read of all
    the shards' batches in that order would have."""
    return [record for part in parts for record in part.scans]


def reduce_states(results: Iterable[tuple[int, bytes | None]], expected: int) -> CalibrationState:
    """Merge the shards' states (file-format bytes; None for an empty shard, which adds nothing)
    as they arrive, as a binary tree; an error, merging nothing, unless every shard
    ``0 .. expected-1`` gave exactly one."""
    levels: list[CalibrationState | None] = []
    seen: set[int] = set()
    for index, raw in results:
        if index in seen:  # a shard redone: its result replaces, never adds
            logger.debug("shard %d: a second result ignored", index)
            continue
        seen.add(index)
        if raw is None:
            continue
        state = CalibrationState.from_bytes(raw, f"from shard {index}")
        level = 0
        while level < len(levels) and levels[level] is not None:
            state = levels[level].merge(state)  # type: ignore[union-attr]
            levels[level] = None
            level += 1
        if level == len(levels):
            levels.append(state)
        else:
            levels[level] = state
    missing = sorted(set(range(expected)) - seen)
    if missing:
        raise RuntimeError(f"no result for shard(s) {missing[:10]}: a partial run is never merged")
    left = [s for s in levels if s is not None]
    if not left:
        raise _no_data(expected)
    merged = left[0]
    for other in left[1:]:
        merged = other.merge(merged)
    return merged

"""``calibrate_distributed``: calibration sharded over a Ray cluster, merged exactly.

The driver starts one actor per worker (a :class:`~histocal.distributed.worker.ShardWorker`: one
calibrator, one ORT session), hands out shards one at a time to whichever worker is free, and
reduces the shards' states as they come in, as a binary tree (a binary counter over the results:
at most log2(shards) states held at once). Streaming mode is one round; exact mode two (pass 1's
scans of every shard plan the bins, pass 2 counts every shard on them).

Exactness: every shard's result depends on that shard alone, and the reduction is exact (streaming
histograms merge exactly; exact histograms on the same edges add), so the merged state is the state
of one run over all the shards' batches, whatever the split, the order of completion or the worker
that ran each shard. Faults: a shard whose worker dies is redone on another worker (a replacement
actor is started), and only its one result is kept; a shard whose data fails fails the run with a
:class:`ShardError` naming the shard (and the file); nothing is merged until every shard has its
result.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import methods
from ..calibrators import MODE_OPTION
from ..calibrators.split_exact import ExactScan
from ..io.readers import progress
from ..state import CalibrationState
from .shards import Shard, ShardError, make_shards
from .worker import Job, ShardWorker

logger = logging.getLogger(__name__)

WORKER_START_TIMEOUT_S = 300.0
PIPELINE = 2


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
    num_workers: int | None = None,
    address: str | None = None,
    cpus_per_worker: int | None = None,
    op_types_to_calibrate: Sequence[str] | None = None,
    providers: Sequence[Any] | None = None,
    data_options: dict[str, Any] | None = None,
    max_restarts: int = 0,
    max_task_retries: int = 0,
    max_shard_attempts: int = 3,
    show_progress: bool | None = None,
) -> CalibrationState:
    """Calibrate ``model`` over ``shards`` on a Ray cluster; the merged :class:`CalibrationState`.

    ``shards``: data files or folders (or lists of them), as the CLI's ``--data`` takes them and
    read with ``data_options`` (``batch_size``, ``preprocess``, ``input_shape``, ``layout``), or
    zero-argument picklable callables returning an iterable of feed dicts. ``calibrate_method``
    and ``extra_options`` are ``create_calibrator``'s: ORT's histogram methods collect in exact
    mode (ORT's result on all the shards' batches as one ``collect_data`` call) unless
    ``CollectionMode`` is ``"streaming"``; histocal's methods collect in streaming mode; MinMax
    collects streaming histograms, whose state computes ORT's MinMax (no moving average, which
    depends on batch order, and no per-channel ranges: both refused).

    ``address``: an existing cluster (``"ray://host:10001"``, ``"auto"``); without it, and
    without ``ray.init`` called before, a local Ray instance is started and shut down again.
    ``num_workers`` (default: the cluster's CPUs / ``cpus_per_worker``, at most one per shard),
    ``cpus_per_worker`` (default 1: ORT's and histocal's threads per worker). Faults: a shard whose
    worker dies is redone on another one, at most ``max_shard_attempts`` times; ``max_restarts``
    and ``max_task_retries`` (Ray's actor options, default 0) let Ray restart a dead worker and
    rerun its task in place first."""
    ray = import_ray()
    if isinstance(max_shard_attempts, bool) or not isinstance(max_shard_attempts, int) or max_shard_attempts < 1:
        raise ValueError(f"max_shard_attempts must be an integer >= 1, got {max_shard_attempts!r}")
    job = make_job(calibrate_method, extra_options, op_types_to_calibrate, providers, cpus_per_worker)
    shard_list = make_shards(shards, data_options)
    model_bytes = Path(model).read_bytes()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
    elif address is not None:
        logger.warning("Ray is already initialized; address %r is ignored", address)
    pool = None
    try:
        pool = RayPool(ray, model_bytes, job, len(shard_list), num_workers, max_restarts, max_task_retries)
        pool.max_shard_attempts, pool.show_progress = max_shard_attempts, show_progress
        return collect(pool, shard_list, job)
    finally:
        if pool is not None:
            pool.close()
        if started:
            ray.shutdown()


def make_job(
    calibrate_method: Any,
    extra_options: dict[str, Any] | None,
    op_types: Sequence[str] | None,
    providers: Sequence[Any] | None,
    cpus_per_worker: int | None,
) -> Job:
    """What every worker does for ``calibrate_method`` and ``extra_options`` (see calibrate_distributed)."""
    threads = 1 if cpus_per_worker is None else cpus_per_worker
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"cpus_per_worker must be an integer >= 1, got {cpus_per_worker!r}")
    name = methods.canonical_name(calibrate_method)
    options = dict(extra_options or {})
    common: dict[str, Any] = {
        "op_types": None if op_types is None else list(op_types),
        "providers": None if providers is None else list(providers),
        "threads": threads,
    }
    if name == "minmax":
        refused = [k for k in ("moving_average", "per_channel") if options.get(k)]
        if refused:
            raise ValueError(
                f"distributed MinMax supports neither {' nor '.join(refused)}: a moving average depends on the "
                "order of the batches, which sharding changes, and per-channel ranges are not kept in a state"
            )
        unknown = set(options) - {"symmetric", "moving_average", "per_channel", "max_intermediate_outputs"}
        if unknown:
            raise ValueError(f"unknown extra_options for minmax: {sorted(unknown)}")
        return Job(
            "entropy",
            "streaming",
            "minmax",
            state_settings={"symmetric": bool(options.get("symmetric", False))},
            **common,
        )
    if name not in methods.ORT_METHODS:
        return Job(name, "streaming", name, extra_options=options, **common)
    mode = options.pop(MODE_OPTION, None) or "auto"
    if mode not in ("auto", "exact", "streaming"):
        raise ValueError(f"{MODE_OPTION} must be auto, exact or streaming, got {mode!r}")
    # shards are read twice where needed (files and callables can be), so auto means exact
    return Job(name, "exact" if mode == "auto" else mode, name, extra_options=options, **common)


def collect(pool: Any, shards: list[Shard], job: Job) -> CalibrationState:
    """Run ``job`` over ``shards`` on ``pool`` (``map(method, shards, args)`` yielding
    ``(index, result)`` once per shard) and reduce the shards' states."""
    if job.mode == "streaming":
        return reduce_states(pool.map("streaming", shards, lambda s: ()), len(shards))
    scans: dict[int, ExactScan] = dict(pool.map("scan", shards, lambda s: ()))
    planned_from = plan_records([scans[s.index] for s in shards])
    shared = pool.share(planned_from)
    return reduce_states(pool.map("count", shards, lambda s: (scans[s.index], shared)), len(shards))


def plan_records(parts: Iterable[ExactScan]) -> list[Any]:
    """Every part's scans, in shard order: ``Histograms.add_scans`` combines them as one read of all
    the shards' batches in that order would have."""
    return [record for part in parts for record in part.scans]


def reduce_states(results: Iterable[tuple[int, bytes]], expected: int) -> CalibrationState:
    """Merge the shards' states (file-format bytes) as they arrive, as a binary tree; an error,
    merging nothing, unless every shard ``0 .. expected-1`` gave exactly one."""
    levels: list[CalibrationState | None] = []
    seen: set[int] = set()
    for index, raw in results:
        if index in seen:  # a shard redone: its result replaces, never adds
            logger.debug("shard %d: a second result ignored", index)
            continue
        seen.add(index)
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
    merged = left[0]
    for other in left[1:]:
        merged = other.merge(merged)
    return merged


class _Results:
    """The shards' results as they complete, with their count for a progress bar."""

    def __init__(self, items: Iterator[tuple[int, Any]], total: int) -> None:
        self._items, self._total = items, total

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return self._items

    def __length_hint__(self) -> int:
        return self._total


class RayPool:
    """``num_workers`` ShardWorker actors; ``map`` hands out shards to whichever is free."""

    def __init__(
        self,
        ray: Any,
        model: bytes,
        job: Job,
        num_shards: int,
        num_workers: int | None,
        max_restarts: int,
        max_task_retries: int,
    ) -> None:
        if num_workers is None:
            cpus = int(ray.cluster_resources().get("CPU", 1))
            num_workers = max(1, cpus // job.threads)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}")
        self.ray = ray
        self.max_shard_attempts = 3
        self.show_progress: bool | None = None
        self._actor_class = ray.remote(ShardWorker).options(
            num_cpus=job.threads, max_restarts=max_restarts, max_task_retries=max_task_retries
        )
        self._model = ray.put(model)
        self._job = job
        self.actors = [self._actor_class.remote(self._model, job) for _ in range(min(num_workers, num_shards))]
        self._ready = list(self.actors)  # started (replacements join once they answer)
        self._starting: dict[Any, Any] = {}  # a replacement's pid() call -> the replacement
        try:
            self.pids = ray.get([a.pid.remote() for a in self.actors], timeout=WORKER_START_TIMEOUT_S)
        except ray.exceptions.RayError as exc:
            self.close()
            raise RuntimeError(f"the calibration workers could not start: {exc}") from None
        logger.info("%d calibration workers started", len(self.actors))

    def share(self, value: Any) -> Any:
        """``value`` in the object store, sent once to each worker."""
        return self.ray.put(value)

    def close(self) -> None:
        for actor in self.actors:
            with contextlib.suppress(Exception):  # already gone
                self.ray.kill(actor)
        self.actors, self._ready = [], []

    def map(
        self, method: str, shards: list[Shard], args: Callable[[Shard], tuple[Any, ...]]
    ) -> Iterable[tuple[int, Any]]:
        desc = {"streaming": "shards", "scan": "shards, pass 1/2", "count": "shards, pass 2/2"}[method]
        return progress(_Results(self._run(method, shards, args), len(shards)), desc, self.show_progress)

    def _run(
        self, method: str, shards: list[Shard], args: Callable[[Shard], tuple[Any, ...]]
    ) -> Iterator[tuple[int, Any]]:
        ray = self.ray
        queue = collections.deque(shards)
        attempts: collections.Counter[int] = collections.Counter()
        # each worker holds up to PIPELINE shards: its next one is queued while the driver merges
        idle = [a for a in self._ready for _ in range(PIPELINE)]
        running: dict[Any, tuple[Any, Shard]] = {}
        starting = self._starting
        done = 0

        def dispatch() -> None:
            while queue and idle:
                actor = idle.pop()
                if actor in self._ready:  # not a slot of a worker that died meanwhile
                    shard = queue.popleft()
                    running[getattr(actor, method).remote(shard, *args(shard))] = (actor, shard)

        while queue or running:
            dispatch()
            if not running:  # only replacements starting
                if not starting:
                    raise RuntimeError("every calibration worker died and none could be started")
                ready, _ = ray.wait(list(starting), num_returns=1, timeout=WORKER_START_TIMEOUT_S)
                if not ready:
                    raise RuntimeError(f"no calibration worker started within {WORKER_START_TIMEOUT_S:.0f} s")
            else:
                ready, _ = ray.wait(list(running) + list(starting), num_returns=1)
            ref = ready[0]
            if ref in starting:
                actor = starting.pop(ref)
                try:
                    ray.get(ref)
                    idle.extend([actor] * PIPELINE)
                    self._ready.append(actor)
                except ray.exceptions.RayError as exc:
                    self._drop(actor)
                    logger.warning("a replacement calibration worker failed to start: %s", exc)
                continue
            actor, shard = running.pop(ref)
            try:
                value = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:  # the shard's own failure: the run fails
                cause = getattr(exc, "cause", None)
                if isinstance(cause, ShardError):
                    raise ShardError(str(cause), shard.index) from None
                raise ShardError(f"{shard.describe()}: {exc}", shard.index) from None
            except ray.exceptions.RayError as exc:  # the worker died (process, node): redo the shard
                attempts[shard.index] += 1
                if attempts[shard.index] >= self.max_shard_attempts:
                    raise ShardError(
                        f"{shard.describe()}: its worker died {attempts[shard.index]} times ({type(exc).__name__})",
                        shard.index,
                    ) from None
                logger.warning("%s: its worker died (%s); redoing it on another worker", shard.describe(), exc)
                queue.appendleft(shard)
                if actor in self.actors:  # its first failed shard: replace it
                    self._drop(actor)
                    replacement = self._actor_class.remote(self._model, self._job)
                    self.actors.append(replacement)
                    starting[replacement.pid.remote()] = replacement
                continue
            idle.append(actor)
            done += 1
            logger.info("%s done (%d/%d, %s)", shard.describe(), done, len(shards), method)
            dispatch()  # before the caller merges this result
            yield shard.index, value

    def _drop(self, actor: Any) -> None:
        for group in (self.actors, self._ready):
            if actor in group:
                group.remove(actor)
        with contextlib.suppress(Exception):  # already gone
            self.ray.kill(actor)

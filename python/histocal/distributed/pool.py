"""``RayPool``: the calibration workers (Ray actors) and the shards handed out to them.

Each worker holds up to ``PIPELINE`` shards (its next one is queued while the driver merges) and
runs them in order. Faults: a shard whose worker dies, or that runs longer than ``shard_timeout``
seconds on it (the worker is then killed: a hung shard never finishes by itself), is put back at
the front of the queue and its worker replaced, until the shard has failed ``max_shard_attempts``
times; the shards queued behind it on the killed worker go back to the queue without counting an
attempt. A shard whose own work raises fails the run with a :class:`ShardError`.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ..io.readers import progress
from .shards import Shard, ShardError
from .worker import Job, ShardWorker

logger = logging.getLogger(__name__)

WORKER_START_TIMEOUT_S = 300.0
PIPELINE = 2


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
        external_data: Mapping[str, bytes] | None = None,
    ) -> None:
        if num_workers is None:
            cpus = int(ray.cluster_resources().get("CPU", 1))
            num_workers = max(1, cpus // job.threads)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}")
        self.ray = ray
        self.max_shard_attempts = 3
        self.shard_timeout: float | None = None
        self.show_progress: bool | None = None
        self._actor_class = ray.remote(ShardWorker).options(
            num_cpus=job.threads, max_restarts=max_restarts, max_task_retries=max_task_retries
        )
        self._model = ray.put(model)
        self._external_data = ray.put(dict(external_data or {}))
        self._job = job
        self.actors = [
            self._actor_class.remote(self._model, job, self._external_data) for _ in range(min(num_workers, num_shards))
        ]
        self._ready = list(self.actors)  # started (replacements join once they answer)
        self._starting: dict[Any, Any] = {}  # a replacement's ready() call -> the replacement
        try:
            answers = ray.get([a.ready.remote() for a in self.actors], timeout=WORKER_START_TIMEOUT_S)
        except ray.exceptions.RayError as exc:
            self.close()
            raise RuntimeError(f"the calibration workers could not start: {exc}") from None
        except BaseException:  # Ctrl-C while they start: they are not left running
            self.close()
            raise
        errors = [error for _, error in answers if error is not None]
        if errors:
            self.close()
            raise RuntimeError(f"the calibration workers could not start: {errors[0]}")
        self.pids = [pid for pid, _ in answers]
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
        idle = [a for _ in range(PIPELINE) for a in self._ready]  # every worker's first slot first
        running: dict[Any, tuple[Any, Shard]] = {}
        # per worker, its tasks in the order it runs them; the first one's start time
        lanes: dict[Any, collections.deque[Any]] = collections.defaultdict(collections.deque)
        since: dict[Any, float] = {}
        starting = self._starting
        done = 0

        def dispatch() -> None:
            while queue and idle:
                actor = idle.pop()
                if actor in self._ready:  # not a slot of a worker that died meanwhile
                    shard = queue.popleft()
                    ref = getattr(actor, method).remote(shard, *args(shard))
                    running[ref] = (actor, shard)
                    lanes[actor].append(ref)
                    since.setdefault(lanes[actor][0], time.monotonic())

        def finished(ref: Any) -> tuple[Any, Shard]:
            actor, shard = running.pop(ref)
            lane = lanes[actor]
            if ref in lane:
                lane.remove(ref)
            since.pop(ref, None)
            if lane:  # the worker's next shard starts now
                since.setdefault(lane[0], time.monotonic())
            return actor, shard

        def fail(shard: Shard, reason: str) -> None:
            """Count a failed attempt at ``shard`` and queue it again (an error after the last)."""
            attempts[shard.index] += 1
            n = attempts[shard.index]
            if n >= self.max_shard_attempts:
                tries = "its only attempt" if n == 1 else f"each of its {n} attempts"
                raise ShardError(f"{shard.describe()}: {reason}, on {tries} (max_shard_attempts={n})", shard.index)
            logger.warning("%s: %s; redoing it on another worker", shard.describe(), reason)
            queue.appendleft(shard)

        def timed_out() -> None:
            """Kill the worker of every shard past the timeout; requeue all that worker held."""
            now = time.monotonic()
            for ref, started in list(since.items()):
                if ref not in running or now - started < (self.shard_timeout or 0):
                    continue
                actor, shard = running[ref]
                for other in list(lanes[actor])[1:]:  # queued behind it: not their fault
                    queue.appendleft(finished(other)[1])
                finished(ref)
                self._replace(actor)
                fail(shard, f"no result within the shard timeout of {self.shard_timeout:g} s")

        while queue or running:
            dispatch()
            if not running:  # only replacements starting
                if not starting:
                    raise RuntimeError("every calibration worker died and none could be started")
                ready, _ = ray.wait(list(starting), num_returns=1, timeout=WORKER_START_TIMEOUT_S)
                if not ready:
                    raise RuntimeError(f"no calibration worker started within {WORKER_START_TIMEOUT_S:.0f} s")
            else:
                wait = None
                if self.shard_timeout is not None and since:
                    wait = max(0.0, min(since.values()) + self.shard_timeout - time.monotonic())
                ready, _ = ray.wait(list(running) + list(starting), num_returns=1, timeout=wait)
                if not ready:
                    timed_out()
                    continue
            ref = ready[0]
            if ref in starting:
                actor = starting.pop(ref)
                try:
                    _, error = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    error = str(exc)
                if error is None:
                    idle.extend([actor] * PIPELINE)
                    self._ready.append(actor)
                else:
                    self._drop(actor)
                    logger.warning("a replacement calibration worker failed to start: %s", error)
                continue
            actor, shard = finished(ref)
            try:
                value = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:  # the shard's own failure: the run fails
                cause = getattr(exc, "cause", None)
                if isinstance(cause, ShardError):
                    raise ShardError(str(cause), shard.index) from None
                raise ShardError(f"{shard.describe()}: {exc}", shard.index) from None
            except ray.exceptions.RayError as exc:  # the worker died (process, node): redo the shard
                logger.debug("%s: %s", shard.describe(), exc)
                if actor in self.actors:  # its first failed shard: replace it
                    self._replace(actor)
                fail(shard, f"its worker died ({type(exc).__name__})")
                continue
            idle.append(actor)
            done += 1
            logger.info("%s done (%d/%d, %s)", shard.describe(), done, len(shards), method)
            dispatch()  # before the caller merges this result
            yield shard.index, value

    def _replace(self, actor: Any) -> None:
        """Kill ``actor`` (if alive) and start another in its place (it joins once it answers)."""
        self._drop(actor)
        replacement = self._actor_class.remote(self._model, self._job, self._external_data)
        self.actors.append(replacement)
        self._starting[replacement.ready.remote()] = replacement

    def _drop(self, actor: Any) -> None:
        for group in (self.actors, self._ready):
            if actor in group:
                group.remove(actor)
        with contextlib.suppress(Exception):  # already gone
            self.ray.kill(actor)

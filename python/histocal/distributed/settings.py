"""The job every worker runs, resolved and checked on the driver before Ray starts.

``make_job`` turns ``calibrate_distributed``'s arguments into a :class:`Job`: its
``CollectionSettings``, built once here (from ``settings``, or from ``mode`` / ``extra_options``
as ``create_calibrator`` reads them) with the collection mode each method uses (``auto`` is exact
for ORT's histogram methods, whose shards can be read twice, and streaming where
``create_calibrator`` collects streaming: per-channel histograms, MinMax, histocal's methods), then
``check_job`` builds the job's calibrator on a stand-in model, so every option the calibrators
check is refused on the driver, with the calibrators' own message, before any worker starts.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import onnx
from onnx import TensorProto, helper

from .. import methods
from ..methods.settings import EXTRA_KEYS, MODE, PER_CHANNEL, CollectionSettings, mode_given, settings_for
from .worker import Job, build_calibrator

logger = logging.getLogger(__name__)

# The largest count a setting takes: Ray's actor options and ORT's thread counts are C ints, and a
# larger number fails inside Ray (OverflowError) after it started.
MAX_COUNT = 2**31 - 1
# The longest finite timeout: Ray waits in whole milliseconds in a C long; longer is "no limit",
# which inf (or None) says.
MAX_TIMEOUT_S = 1e9


def check_count(name: str, value: Any, minimum: int, meaning: str = "") -> int:
    """``value`` as the integer setting ``name`` in ``[minimum, MAX_COUNT]``; a ValueError naming it
    otherwise (``meaning``: what a special value means, added to the message)."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_COUNT:
        raise ValueError(f"{name} must be an integer in [{minimum}, {MAX_COUNT}]{meaning}, got {value!r}")
    return value


def check_seconds(name: str, value: Any) -> float | None:
    """The timeout ``name`` in seconds, None for no limit (None or inf given); a ValueError naming
    it for NaN, a value <= 0, one longer than ``MAX_TIMEOUT_S`` or one that is not a number."""
    if value is None or (isinstance(value, float) and value == math.inf):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    if value > MAX_TIMEOUT_S:
        raise ValueError(f"{name} must be at most {MAX_TIMEOUT_S:g} seconds (inf or None: no limit), got {value!r}")
    return float(value)


def make_job(
    calibrate_method: Any,
    extra_options: dict[str, Any] | None,
    op_types: Sequence[str] | None,
    providers: Sequence[Any] | None,
    cpus_per_worker: int | None,
    mode: str | None = None,
    settings: CollectionSettings | None = None,
) -> Job:
    """What every worker does for ``calibrate_method``, ``extra_options`` and ``mode``, or
    ``settings`` (see calibrate_distributed); a ValueError naming the option for a setting no
    worker could use."""
    threads = 1 if cpus_per_worker is None else check_count("cpus_per_worker", cpus_per_worker, 1)
    name = methods.canonical_name(calibrate_method)
    options = dict(extra_options or {})
    reads = settings_for(name)
    if settings is None:
        given, source = mode_given(mode, options)
        # the mode is decided here, per method (the calibrators' own would refuse exact per channel)
        settings = CollectionSettings.from_extra_options(options, tuple(s for s in reads if s is not MODE))
    elif mode is not None or any(k in EXTRA_KEYS for k in options):
        raise TypeError("give the collection settings as settings= or as mode and extra_options keys, not both")
    else:
        given, source = settings.mode, "mode"
    # the method's own options: the settings travel as the object
    method_options = {k: v for k, v in options.items() if k not in EXTRA_KEYS}
    common: dict[str, Any] = {
        "op_types": None if op_types is None else list(op_types),
        "providers": None if providers is None else list(providers),
        "threads": threads,
    }
    # the worker's share of its machine, unless the user's settings say otherwise
    settings = settings.replace(num_threads=threads if settings.num_threads is None else settings.num_threads)
    if name == "minmax":
        refused = [
            k
            for k, on in (("moving_average", options.get("moving_average")), (PER_CHANNEL.name, settings.per_channel))
            if on
        ]
        if refused:
            raise ValueError(
                f"distributed MinMax supports neither {' nor '.join(refused)}: a moving average depends on the "
                "order of the batches, which sharding changes, and per-channel ranges are not kept in a state"
            )
        ignored = (*reads, MODE)  # the settings MinMax reads, and the mode it has no use for
        unknown = {k for k in options if EXTRA_KEYS.get(k) not in ignored} - {
            "symmetric",
            "moving_average",
            "max_intermediate_outputs",
        }
        if unknown:
            raise ValueError(f"unknown extra_options for minmax: {sorted(unknown)}")
        _ignored_mode(name, given, source)
        return Job(
            collect_method="entropy",
            state_method="minmax",
            settings=settings.replace(mode="streaming"),
            state_settings={"symmetric": bool(options.get("symmetric", False))},
            **common,
        )
    if name not in methods.ORT_METHODS:
        _ignored_mode(name, given, source)
        return Job(name, name, settings.replace(mode="streaming"), method_options, **common)
    if settings.per_channel:
        # per-channel histograms are streaming ones: auto collects them so, in one process too
        if given == "exact":
            raise ValueError(f"per-channel histograms are collected in streaming mode only ({source}='exact' given)")
        return Job(name, name, settings.replace(mode="streaming"), method_options, **common)
    # shards are read twice where needed (files and callables can be), so auto means exact
    return Job(name, name, settings.replace(mode="exact" if given == "auto" else given), method_options, **common)


def _ignored_mode(method: str, given: str, source: str) -> None:
    if given == "exact":  # as create_calibrator: the mode applies to ORT's histogram methods only
        logger.warning("%s='exact' does not apply to %s, which collects streaming histograms; ignored", source, method)


def check_job(job: Job) -> None:
    """Build ``job``'s calibrator on a stand-in model (one Relu, on this CPU): its settings are
    checked as every worker will check them, before Ray starts. What depends on the model (the
    channel axis against each tensor's rank) or on the workers' machines (``providers``) is
    checked where it is used."""
    with tempfile.TemporaryDirectory(prefix="histocal_check_") as folder:
        path = os.path.join(folder, "stand_in.onnx")
        onnx.save(_stand_in_model(), path)
        build_calibrator(path, folder, job)


def _stand_in_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "stand_in", [x], [y])
    # IR 10: the oldest onnxruntime histocal supports loads it
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)

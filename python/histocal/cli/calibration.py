"""One calibration run of a command and its outputs: the model and data it reads, the calibrator
it runs, and the cache and state files it writes (staged, then moved into place)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..io.models import check_model_file
from .errors import CliError, UsageError
from .options import calibrator_options

logger = logging.getLogger("histocal.cli")


def check_model(path: str) -> Path:
    model = Path(path)
    if not model.is_file():
        raise CliError(f"{model}: no such model file" if not model.exists() else f"{model}: not a file")
    check_model_file(model)  # an empty file, before the data is opened against it
    return model


@contextlib.contextmanager
def _staged(final: Path, suffix: str = "") -> Iterator[Path]:
    """A temp path next to ``final``; the caller writes it, ``_commit`` moves it into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=f".tmp{suffix}")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def open_data(args: argparse.Namespace, model: Path) -> Any:
    from ..io.data import open_calibration_data

    data = open_calibration_data(
        model,
        args.data,
        batch_size=args.batch_size,
        preprocess=args.preprocess,
        input_shape=args.input_shape,
        layout=args.layout,
        validate=True,
    )
    return data


def run_calibrator(args: argparse.Namespace, model: Path, data: Any, *, want_state: bool) -> tuple[Any, Any]:
    """Run histocal's calibrator on ``data``: (TensorsData, calibrator). The calibrator is kept
    (for ``save_state``) only when ``want_state``."""
    from .. import calibrators

    quark = getattr(args, "quark", False)
    if getattr(args, "quark_version", None) and not quark:
        raise UsageError("--quark-version applies to --quark only")
    if quark and want_state:
        raise CliError("--state: --quark calibration keeps no histocal state; write --cache")
    options, settings = calibrator_options(args) if not (quark and args.method == "pow2") else ({}, None)
    with tempfile.TemporaryDirectory(prefix="histocal.") as tmp:
        augmented = Path(tmp, "augmented_model.onnx").as_posix()
        if quark:
            from .quark import QUARK_METHODS, quark_calibrator

            if args.method not in QUARK_METHODS:
                raise UsageError(f"--quark takes --method {', '.join(QUARK_METHODS)}; got {args.method}")
            calibrator = quark_calibrator(args, model, augmented, options, settings)
        else:
            calibrator = calibrators.create_calibrator(
                model,
                args.op_types,
                augmented_model_path=augmented,
                calibrate_method=args.method,
                providers=args.providers,
                extra_options=options,
                settings=settings,
            )
        if args.no_progress:
            calibrator.show_progress = False
        if want_state and not callable(getattr(calibrator, "save_state", None)):
            raise CliError(
                f"--state: {args.method} calibration keeps no histograms; calibrate with a histogram "
                "method (entropy, percentile, distribution): its state also computes minmax ranges"
            )
        start = time.perf_counter()
        calibrator.collect_data(data)
        ranges = calibrator.compute_data()
        logger.info(
            "calibrated %d tensors with %s in %.2f s", len(ranges.data), args.method, time.perf_counter() - start
        )
        if not want_state:
            del calibrator
            calibrator = None
        return ranges, calibrator


def fingerprint_files(files: Sequence[Path]) -> str:
    """sha256 over the data files' names and contents, in feed order."""
    import hashlib

    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode("utf-8", "surrogateescape") + b"\0")
        with open(f, "rb") as fp:
            for chunk in iter(lambda: fp.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return "sha256:" + digest.hexdigest()


def write_outputs(
    ranges: Any, cache: Path | None, calibrator: Any, state: Path | None, fingerprint: str | None = None
) -> None:
    """Stage every output next to its destination, then move them all into place."""
    from ..io.cache import save_tensors_data

    with contextlib.ExitStack() as stack:
        moves = []
        if state is not None:
            tmp_state = stack.enter_context(_staged(state, state.suffix))
            calibrator.save_state(tmp_state, data_fingerprint=fingerprint)
            moves.append((tmp_state, state))
        if cache is not None:
            tmp_cache = stack.enter_context(_staged(cache, ".json"))
            save_tensors_data(ranges, tmp_cache)
            moves.append((tmp_cache, cache))
        for tmp, final in moves:
            os.replace(tmp, final)
            logger.info("wrote %s", final)

"""Refusing an output that would replace one of the command's own inputs (or another output).

``histocal quantize M M`` used to replace the float model with the int8 one, and ``quantize a.onnx
b.onnx --external-data`` the float model's weights when they were in ``b.onnx.data``. Every command
that writes files collects all it reads (``inputs``: the model and its external-data files, each
file its --data folders would feed, the files it reads ranges from) and runs the check of
``histocal.io.outputs`` on its outputs before any work.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..io.outputs import Named, OverwriteError, model_files, report_outputs
from ..io.outputs import refuse_overwriting as _refuse
from .errors import CliError


def inputs(
    model: str | os.PathLike[str] | None = None, data: Iterable[tuple[str, Sequence[str] | None]] = (), *others: Named
) -> list[tuple[str, str | os.PathLike[str] | None]]:
    """Every file a command reads: ``model`` with its external data; for each (option, paths) of
    ``data`` the paths as given (a folder may not become an output either) and every file the
    data reader would take from them; then ``others`` as they are."""
    from ..io.data import data_files

    found: list[tuple[str, str | os.PathLike[str] | None]] = []
    if model is not None:
        found += model_files(model)
    for option, paths in data:
        found += [(option, p) for p in paths or ()]
        found += [(option, f) for f in data_files(list(paths or ()))]
    for named in others:
        found += list(named)
    return found


def refuse_overwriting(outputs: Named, inputs: Named) -> None:
    """CliError when an output is the same file as an input or as an earlier output."""
    try:
        _refuse(outputs, inputs)
    except OverwriteError as exc:
        raise CliError(str(exc)) from None


def report_inputs(out_dir: str | os.PathLike[str], inputs: Named, option: str = "--out") -> None:
    """CliError when the report written into ``out_dir`` (its ``index.html`` and ``tensors/``
    folder, both replaced) would replace an input: the folder itself, or a file inside those."""
    try:
        _refuse([("", p) for p in report_outputs(out_dir)], inputs)
    except OverwriteError as exc:
        raise CliError(
            f"{option} {Path(out_dir)} would replace the input {exc.other} {exc.other_path}: "
            "give another output directory"
        ) from None

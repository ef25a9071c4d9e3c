"""Refusing an output that would replace one of the command's own inputs (or another output).

``histocal quantize M M`` used to replace the float model with the int8 one; the check runs
before any work, on every command that writes files, and compares files as the system sees
them: the same inode where both exist (hard links, symlinks), else the same resolved path.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .errors import CliError

# (what it is, e.g. "--cache" or "MODEL", its path); paths that are None are skipped
Named = Iterable[tuple[str, "str | os.PathLike[str] | None"]]


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` are one file: the same inode if both exist, else the same real path."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def refuse_overwriting(outputs: Named, inputs: Named) -> None:
    """CliError when an output is the same file as an input or as an earlier output."""
    seen: list[tuple[str, str | os.PathLike[str]]] = [(n, p) for n, p in inputs if p is not None]
    n_inputs = len(seen)
    for name, path in outputs:
        if path is None:
            continue
        for i, (other, other_path) in enumerate(seen):
            if same_file(path, other_path):
                role = "the input" if i < n_inputs else "the output"
                raise CliError(
                    f"{name} {path} is the same file as {role} {other} {other_path}: "
                    "refusing to overwrite it (give another path)"
                )
        seen.append((name, path))


def report_inputs(out_dir: str | os.PathLike[str], inputs: Named) -> None:
    """CliError when the report written into ``out_dir`` (its ``index.html`` and ``tensors/``
    folder, both replaced) would replace an input: the folder itself, or a file inside those."""
    out = Path(out_dir)
    for name, path in inputs:
        if path is None:
            continue
        real = Path(os.path.realpath(path))
        targets = (out, out / "index.html", out / "tensors")
        if any(same_file(path, t) for t in targets) or Path(os.path.realpath(out / "tensors")) in real.parents:
            raise CliError(f"--out {out} would replace the input {name} {path}: give another output directory")

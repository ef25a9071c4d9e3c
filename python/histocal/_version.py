"""histocal's version: the Rust extension's (one source, Cargo.toml), else the installed distribution's."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from . import _core


def _read_version() -> str:
    built = getattr(_core, "__version__", None)
    if isinstance(built, str):
        return built
    try:
        return version("histocal")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _read_version()

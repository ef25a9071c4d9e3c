"""The error of a bad state file (reading it and the summaries' members raise it)."""

from __future__ import annotations

from typing import NoReturn


class StateError(ValueError):
    """A problem inside a state; ``load`` prefixes the file name."""


def fail(problem: str) -> NoReturn:
    raise StateError(problem)

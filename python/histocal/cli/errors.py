"""The command line's errors and their one-line messages: what ``main`` turns into exit codes
(``CliError``: 1, ``UsageError``: 2)."""

from __future__ import annotations

from collections.abc import Sequence


class CliError(Exception):
    """A failure to report as one line on stderr (exit code 1)."""


class UsageError(Exception):
    """Raised by a subcommand for an invalid option combination found after parsing (exit 2)."""


def did_you_mean(word: str, candidates: Sequence[str]) -> str:
    """ " (did you mean X?)" for the closest candidate, or ""."""
    import difflib

    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def one_line(text: object) -> str:
    return " ".join(str(text).split())

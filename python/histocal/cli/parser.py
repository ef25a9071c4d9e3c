"""The argument parser every command uses: short usage errors with "did you mean"."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

from .errors import did_you_mean


class Parser(argparse.ArgumentParser):
    """argparse with short usage errors: a one-line usage, the error, a pointer to --help, and
    "did you mean" for misspelled subcommands, choices and options (argparse's own
    suggest_on_error needs Python 3.14)."""

    def short_usage(self) -> str:
        parts = []
        for action in self._actions:
            if not action.option_strings:
                parts.append(
                    f"{action.metavar or action.dest.upper()}"
                    + (" ..." if isinstance(action, argparse._SubParsersAction) else "")
                )
        for action in self._actions:
            if action.option_strings and action.required:
                parts.append(
                    f"{action.option_strings[0]} {action.metavar or action.dest.upper()}"
                    + (" ..." if action.nargs in ("+", "*") else "")
                )
        options = ["[options]"] if any(a.option_strings and not a.required for a in self._actions) else []
        return " ".join([f"usage: {self.prog}", *options, *parts])

    def error(self, message: str) -> NoReturn:
        self.exit(
            2, f"{self.short_usage()}\n{self.prog}: error: {message}\nRun '{self.prog} --help' for the full usage.\n"
        )

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            choices = [str(c) for c in action.choices]
            hint = did_you_mean(str(value), choices) or f" (choose from {', '.join(choices)})"
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint}")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            # Unknown options of a subcommand reach the top parser: report them as the subcommand's.
            parser = self._subcommand(parsed) or self
            options = [o for a in parser._actions for o in a.option_strings]
            hints = [did_you_mean(e.partition("=")[0], options) for e in extras if e.startswith("-")]
            parser.error(f"unrecognized arguments: {' '.join(extras)}" + next((h for h in hints if h), ""))
        return parsed

    def _subcommand(self, parsed: argparse.Namespace) -> Parser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                name = getattr(parsed, action.dest, None)
                return action.choices.get(name) if isinstance(name, str) else None
        return None

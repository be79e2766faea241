"""Errors that reach the user as messages, never as tracebacks."""

from __future__ import annotations

import difflib


class InputError(Exception):
    """Bad input: a pipeline file, a flag or a template. Exit code 2.

    Rendered as ``file:line:col: field: message`` so editors and people can jump to it.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        column: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.field = field

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file
            if self.line is not None:
                where += f":{self.line}"
                if self.column is not None:
                    where += f":{self.column}"
            where += ": "
        shown = self.field or ""
        if len(shown) > 160:  # a path 3000 levels deep says no more than its ends
            shown = shown[:100] + "..." + shown[-50:]
        field = f"{shown}: " if shown else ""
        return f"{where}{field}{self.message}"


class StateError(Exception):
    """The .runner/ store cannot be read or written. Exit code 1."""


class LockedError(Exception):
    """Another apply holds the pipeline's lock. Exit code 1."""


def suggest(word: str, choices: list[str]) -> str:
    """The end of an "unknown name" message: the nearest of `choices`, or all of them."""
    near = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else f"; expected one of: {', '.join(sorted(choices))}"

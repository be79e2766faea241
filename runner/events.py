"""What the engine tells the reporters, and nothing else: the decision for a step, the result of one, and the
protocol a reporter implements. It imports no other module of the project, so the engine (which emits) and
the reporters in runner/ui.py (which consume) depend on it and not on each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

# What plan says of a step: run it, it is up to date, skipped by `when`, maybe (after an upstream runs), a
# restart pending, it would fail now, or it is blocked by one that would fail.
Action = Literal["run", "ok", "skip", "maybe", "pending", "fail", "block"]
# What apply says of a step once it is done with it.
Status = Literal["ok", "changed", "failed", "skipped", "blocked", "interrupted", "unselected", "pending"]


@dataclass
class Decision:
    name: str
    action: Action
    reason: str
    changes: list[str] = field(default_factory=list)


@dataclass
class Result:
    name: str
    status: Status
    reason: str = ""
    duration: float = 0.0
    error: str = ""
    hint: str = ""
    tail: str = ""
    log: str = ""
    input_error: bool = False
    attempts: int = 0
    note: str = ""  # shown after the status whatever it is (a loop's summary, a capture's value)
    outputs: dict[str, Any] = field(default_factory=dict)  # masked, secret outputs left out


class Reporter(Protocol):
    """The events of a run, in order: run_started, then per step step_started / output / progress /
    step_finished (or plan), notices at any time, run_finished last; close when done."""

    def run_started(self, pipeline: str, file: str, steps: list[str], command: str) -> None: ...
    def notice(self, message: str) -> None: ...
    def error(self, message: str) -> None: ...
    def step_started(self, name: str, reason: str) -> None: ...
    def output(self, name: str, line: str) -> None: ...
    def output_quiet(self, name: str, line: str) -> None: ...
    def progress(self, name: str, done: int, total: int | None, unit: str) -> None: ...
    def step_finished(self, result: Result) -> None: ...
    def plan(self, decisions: list[Decision]) -> None: ...
    def recap(self, results: list[Result]) -> None: ...
    def run_finished(self, results: list[Result], exit_code: int) -> None: ...
    def close(self) -> None: ...

"""What the engine tells the reporters, and nothing else: the decision for a step, the result of one, and the
protocol a reporter implements. It imports no other module of the project, so the engine (which emits) and
the reporters in runner/ui.py (which consume) depend on it and not on each other. A decision carries its cause
as data (runner/causes.py); its words come from runner/words.py, the one place that words them.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from runner import words
from runner.causes import Cause, Change
from runner.util.datatype import datatype, field

# What plan says of a step: run it, it is up to date, skipped by `when`, maybe (after an upstream runs), a
# restart pending, it would fail now, or it is blocked by one that would fail.
Action = Literal["run", "ok", "skip", "maybe", "pending", "fail", "block"]
# What apply says of a step once it is done with it.
Status = Literal["ok", "changed", "failed", "skipped", "blocked", "interrupted", "unselected", "pending"]


@datatype
class Decision:
    """What is decided of a step (or an item, `name[key]`): the action, its cause, and the field-level changes."""

    name: str
    action: Action
    cause: Cause
    changes: list[Change] = field(default_factory=list)

    @property
    def reason(self) -> str:
        """The cause in words, the changes spelled out: the line plan and apply print."""
        return words.reason(self.cause, self.changes)

    @property
    def brief(self) -> str:
        """The cause in words without the changes (explain and --json list them apart)."""
        return words.reason(self.cause, self.changes, full=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.name,
            "action": self.action,
            "reason": self.brief,
            "cause": self.cause.to_json(),
            "changes": [c.to_json() for c in self.changes],
        }


@datatype
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
    cause: Cause | None = None  # why it ran, was left alone or blocked (the decision's), for --json


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
    def never_reached(self, result: Result) -> None: ...
    def plan(self, decisions: list[Decision]) -> None: ...
    def recap(self, results: list[Result]) -> None: ...
    def run_finished(self, results: list[Result], exit_code: int) -> None: ...
    def close(self) -> None: ...

"""Reporters: what a person (or a pipe) sees while runner works."""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from runner.engine import Decision, Result

MARKS = {
    "ok": "ok",
    "changed": "changed",
    "failed": "FAILED",
    "skipped": "skipped",
    "blocked": "blocked",
    "interrupted": "interrupted",
    "pending": "pending",
}


def fmt_duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 120:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Reporter:
    """Plain text, one line per event: for pipes, CI and terminals alike."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None, width: int = 20) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.width = width
        self._lock = threading.Lock()

    def _print(self, text: str, stream: TextIO | None = None) -> None:
        with self._lock:
            target = stream or self.out
            print(text, file=target, flush=True)

    def notice(self, message: str) -> None:
        self._print(message, self.err)

    def step_started(self, name: str, reason: str) -> None:
        self._print(f"{'running':<8} {name:<{self.width}} {reason}")

    def progress(self, name: str, done: int, total: int | None, unit: str) -> None:
        """How far a step is (items of a for_each, bytes of a pull, ...); plain output does not show it."""

    def output(self, name: str, line: str) -> None:
        self._print(f"  {name} | {line}")

    def output_quiet(self, name: str, line: str) -> None:
        """Output of a step when not verbose: it goes to the log only."""

    def step_finished(self, result: Result) -> None:
        mark = MARKS.get(result.status, result.status)
        line = f"{mark:<8} {result.name:<{self.width}}"
        if result.status in ("changed", "failed", "interrupted") or result.duration >= 0.05:
            line += f" {fmt_duration(result.duration):>7}"
        if result.status in ("skipped", "blocked", "pending") or (
            result.status == "ok" and result.reason and result.reason != "up to date"
        ):
            line += f" {result.reason}"
        elif result.note:
            line += f" {result.note}"
        self._print(line)
        if result.status in ("failed", "interrupted"):
            for text in result.error.splitlines():
                self._print(f"    error: {text}")
            if result.hint:
                self._print(f"    hint: {result.hint}")
            if result.tail:
                self._print("    last output:")
                for text in result.tail.splitlines()[-10:]:
                    self._print(f"      {text}")
            if result.log:
                self._print(f"    log: {result.log}")

    def recap(self, results: list[Result]) -> None:
        counts = dict.fromkeys(("ok", "changed", "failed", "skipped"), 0)
        blocked = pending = 0
        for r in results:
            if r.status in counts:
                counts[r.status] += 1
            elif r.status == "interrupted":
                counts["failed"] += 1
            elif r.status == "blocked":
                blocked += 1
            elif r.status == "pending":
                pending += 1
        text = " ".join(f"{k}={v}" for k, v in counts.items())
        if blocked:
            text += f" blocked={blocked}"
        if pending:
            text += f" restart-pending={pending}"
        self._print(f"recap: {text}")

    def plan(self, decisions: list[Decision]) -> None:
        symbols = {
            "run": "+ run  ",
            "ok": "  ok   ",
            "skip": "  skip ",
            "maybe": "~ maybe",
            "pending": "! hold ",
            "fail": "x fail ",
        }
        for d in decisions:
            self._print(f"{symbols[d.action]} {d.name:<{self.width}} {d.reason}")
        pending = sum(1 for d in decisions if d.action in ("run", "maybe", "fail"))
        held = sum(1 for d in decisions if d.action == "pending")
        failing = [d.name for d in decisions if d.action == "fail"]
        if pending or held:
            text = f"plan: {pending} step(s) to run, {len(decisions) - pending - held} unchanged"
            text += f", {held} restart(s) pending (--force)" if held else ""
            self._print(text + (f"; would fail now: {', '.join(failing)}" if failing else ""))
        else:
            self._print("plan: nothing to do")

"""Reporters: what a person (or a pipe) sees while runner works.

- Reporter: plain, line-oriented, greppable; for pipes, CI, NO_COLOR, and dumb terminals.
- LiveReporter: on a terminal, a live view (rich) of the running steps under the lines of the finished ones.
- JsonReporter: `--json`, one JSON object a line for every event (docs/events.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, TextIO

from runner.util.text import printable

if TYPE_CHECKING:
    from runner.events import Decision, Result

MARKS = {
    "ok": "ok",
    "changed": "changed",
    "failed": "FAILED",
    "skipped": "skipped",
    "blocked": "blocked",
    "interrupted": "stopped",  # by a signal; as wide as the other marks
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


class PrintableStream:
    """A text stream whose writes have their control characters made visible (words.printable): what runner
    prints for people — an error quoting a step's output, a status line with a hostile item key — never carries
    a raw escape sequence. `raw` is the stream itself, for rich's own colour and cursor codes."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        return self.raw.write(printable(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def install_printable(command: str | None) -> None:
    """stderr always; stdout too, except where it carries data (`env` for eval, `schema`, and `logs` into a
    pipe or a file, which keeps the step's bytes)."""
    if not isinstance(sys.stderr, PrintableStream):
        sys.stderr = PrintableStream(sys.stderr)
    data = command in ("env", "schema") or (command == "logs" and not sys.stdout.isatty())
    if not data and not isinstance(sys.stdout, PrintableStream):
        sys.stdout = PrintableStream(sys.stdout)


def raw_stream(stream: TextIO) -> TextIO:
    return stream.raw if isinstance(stream, PrintableStream) else stream


def _reader_left(stream: Any) -> None:
    """The reader of `stream` went away (`runner apply | head -2`): what follows is dropped quietly, and the
    run goes on — a step's output is still drained and logged, so its job never blocks on a full pipe."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, raw_stream(stream).fileno())
        os.close(devnull)


class Reporter:
    """Plain text, one line per event: for pipes, CI and terminals alike."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None, width: int = 20) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.width = width
        self._lock = threading.Lock()

    def _print(self, text: str, stream: TextIO | None = None) -> None:
        text = printable(text)  # escape sequences from a step's output or a name never reach a terminal raw
        with self._lock:
            target = stream or self.out
            try:
                print(text, file=target, flush=True)
            except BrokenPipeError:
                _reader_left(target)

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
        # the time column is kept whether or not it is filled, so every row's detail starts at one column
        timed = result.status in ("changed", "failed", "interrupted") or result.duration >= 0.05
        line += f" {fmt_duration(result.duration) if timed else '':>7}"
        if result.status in ("skipped", "blocked", "pending") or (
            result.status == "ok" and result.reason and result.reason != "up to date"
        ):
            line += f" {result.reason}"
        elif result.note:
            line += f" {result.note}"
        self._print(line.rstrip())
        if result.status in ("failed", "interrupted"):
            for text in result.error.splitlines():
                self._print(f"    error: {text}")
            for text in result.hint.splitlines():
                self._print(f"    hint: {text}")
            if result.tail:
                self._print("    last output:")
                for text in result.tail.splitlines()[-10:]:
                    self._print(f"      {text}")
            if result.log:
                self._print(f"    log: {result.log}")

    def never_reached(self, result: Result) -> None:
        """A step apply stopped before (after a failure, without --keep-going): the recap names it in plain
        output; --json gives it its step_finished, as every step gets one."""

    def run_started(self, pipeline: str, file: str, steps: list[str], command: str) -> None:
        """An apply or plan begins (plain output says nothing)."""

    def run_finished(self, results: list[Result], exit_code: int) -> None:
        self.recap(results)

    def error(self, message: str) -> None:
        self._print(message, self.err)

    def close(self) -> None:
        """Stop whatever the reporter draws (the live view)."""

    def recap(self, results: list[Result]) -> None:
        counts = recap_counts(results)
        text = " ".join(f"{k}={counts[k]}" for k in ("ok", "changed", "failed", "skipped"))
        for label, names in (
            ("blocked", [r.name for r in results if r.status == "blocked" and not _not_started(r)]),
            ("not-started", [r.name for r in results if _not_started(r)]),
        ):
            if names:
                shown = ", ".join(names[:8]) + (f", and {len(names) - 8} more" if len(names) > 8 else "")
                text += f" {label}={len(names)} ({shown})"
        if counts["pending"]:
            text += f" restart-pending={counts['pending']}"
        self._print(f"recap: {text}")

    def plan(self, decisions: list[Decision]) -> None:
        symbols = {
            "run": "+ run  ",
            "ok": "  ok   ",
            "skip": "  skip ",
            "maybe": "~ maybe",
            "pending": "! hold ",
            "fail": "x fail ",
            "block": "- block",
        }
        for d in decisions:
            self._print(f"{symbols[d.action]} {d.name:<{self.width}} {d.reason}")
        pending = sum(1 for d in decisions if d.action in ("run", "maybe"))
        held = sum(1 for d in decisions if d.action == "pending")
        failing = [d.name for d in decisions if d.action == "fail"]
        blocked = [d.name for d in decisions if d.action == "block"]
        if pending or held or failing or blocked:
            unchanged = len(decisions) - pending - held - len(failing) - len(blocked)
            text = f"plan: {pending} step(s) to run, {unchanged} unchanged"
            text += f", {held} restart(s) pending (--force)" if held else ""
            text += f"; would fail now: {', '.join(failing)}" if failing else ""
            if blocked:
                text += f"; blocked by them: {', '.join(blocked)}" if failing else f"; blocked: {', '.join(blocked)}"
            self._print(text)
        else:
            self._print("plan: nothing to do")


def _not_started(result: Result) -> bool:
    """Blocked only in that apply stopped before it (fail-fast): it waits on nothing that failed."""
    return result.status == "blocked" and result.cause is not None and result.cause.kind == "not_started"


def recap_counts(results: list[Result]) -> dict[str, int]:
    counts = dict.fromkeys(("ok", "changed", "failed", "skipped", "blocked", "pending"), 0)
    for r in results:
        key = "failed" if r.status == "interrupted" else r.status
        if key in counts:
            counts[key] += 1
    return counts


EVENTS_VERSION = 2  # 2: `changes` are objects (field, old, new), and `cause` is data


class JsonReporter(Reporter):
    """`--json`: every event as one JSON object on its own line of stdout (schema: docs/events.schema.json)."""

    def _emit(self, event: str, **fields: Any) -> None:
        record = {"event": event, "time": round(time.time(), 3), **fields}
        self._print(json.dumps(record, default=str, sort_keys=False), self.out)

    def run_started(self, pipeline: str, file: str, steps: list[str], command: str) -> None:
        self._emit("run_started", version=EVENTS_VERSION, command=command, pipeline=pipeline, file=file, steps=steps)

    def notice(self, message: str) -> None:
        self._emit("notice", message=message)

    def error(self, message: str) -> None:
        self._emit("error", message=message)

    def step_started(self, name: str, reason: str) -> None:
        self._emit("step_started", step=name, reason=reason)

    def output(self, name: str, line: str) -> None:
        self._emit("output", step=name, line=line)

    def progress(self, name: str, done: int, total: int | None, unit: str) -> None:
        self._emit("progress", step=name, done=done, total=total, unit=unit)

    def step_finished(self, result: Result) -> None:
        fields: dict[str, Any] = {
            "step": result.name,
            "status": result.status,
            "reason": result.reason or result.note,
            "duration": round(result.duration, 4),
            "outputs": result.outputs,
        }
        if result.note and result.note != fields["reason"]:
            fields["note"] = result.note  # what the text line shows after the status (`= v1`, `e2b 2.50.0`)
        if result.status in ("failed", "interrupted"):
            fields.update(error=result.error, hint=result.hint, tail=result.tail, log=result.log)
        if result.attempts:
            fields["attempts"] = result.attempts
        if result.cause is not None:
            fields["cause"] = result.cause.to_json()
        self._emit("step_finished", **fields)

    def never_reached(self, result: Result) -> None:
        self.step_finished(result)

    def run_finished(self, results: list[Result], exit_code: int) -> None:
        self._emit("run_finished", recap=recap_counts(results), exit_code=exit_code)

    def plan(self, decisions: list[Decision]) -> None:
        for d in decisions:
            self._emit("planned", **d.to_json())
        actions = ("run", "maybe", "fail", "block", "pending", "ok", "skip")
        counts = {a: sum(1 for d in decisions if d.action == a) for a in actions}
        self._emit("plan_finished", actions=counts)


def use_live_view(stream: TextIO) -> bool:
    """A live view only on a real terminal, and never with NO_COLOR or TERM=dumb."""
    return bool(stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM", "") not in ("dumb", ""))


class LiveReporter(Reporter):
    """A rich live view: a line per finished step, and below them a row per running step with a spinner, its
    elapsed time, a progress bar when the step reports progress, and its latest output line."""

    def __init__(self, console: Any = None, width: int = 20) -> None:
        super().__init__(width=width)
        from rich.console import Console

        self.console = console or Console(highlight=False, file=raw_stream(sys.stdout))
        self._running: dict[str, dict[str, Any]] = {}
        self._live: Any = None
        # Three locks, never nested: printing (the base's), the rows (read by the live view's own refresh
        # thread, which holds rich's lock meanwhile), and starting or stopping the live view.
        self._rows = threading.Lock()
        self._live_lock = threading.Lock()

    # rendering
    def _render(self) -> Any:
        """The rows of the running steps, drawn afresh on every refresh (so a silent step's time still moves),
        in columns of fixed width (so nothing shifts as rows and output lines come and go)."""
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        table = Table.grid(padding=(0, 1))
        table.add_column(width=2, no_wrap=True)
        table.add_column(width=self.width, no_wrap=True, overflow="ellipsis")
        table.add_column(justify="right", width=7, no_wrap=True)
        # the rest of the terminal, and no more: a line wider than it is cut with an ellipsis here, instead of
        # the table squeezing the spinner and clock columns away for every row
        rest = max(10, self.console.width - (2 + self.width + 7 + 3))
        table.add_column(width=rest, no_wrap=True, overflow="ellipsis")
        now = time.monotonic()
        with self._rows:
            rows = [(name, dict(row)) for name, row in self._running.items()]
        for name, row in rows:
            elapsed = fmt_duration(now - row["since"])
            detail: Any = Text(row.get("reason", ""), style="dim", no_wrap=True, overflow="ellipsis")
            if row.get("total"):
                bar = ProgressBar(total=row["total"], completed=row.get("done", 0), width=30)
                grid = Table.grid(padding=(0, 1))
                grid.add_column(width=30)
                grid.add_column(no_wrap=True)
                grid.add_row(bar, Text(f"{row.get('done', 0)}/{row['total']} {row.get('unit', '')}"))
                detail = grid
            table.add_row(row["spinner"], Text(name, style="bold"), elapsed, detail)
            if row.get("line"):
                table.add_row("", "", "", Text(row["line"], style="dim", no_wrap=True, overflow="ellipsis"))
        return table

    def _ensure_live(self) -> None:
        with self._live_lock:
            if self._live is not None:
                return
            from rich.live import Live

            self._live = Live(
                console=self.console,
                refresh_per_second=8,
                transient=True,
                get_renderable=self._render,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()

    def _print(self, text: str, stream: TextIO | None = None) -> None:
        text = printable(text)
        with self._lock:
            style = None
            if text.startswith("FAILED") or text.startswith("    error:"):
                style = "red"
            elif text.startswith("changed"):
                style = "yellow"
            elif text.startswith("ok"):
                style = "green"
            try:
                self.console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)
            except BrokenPipeError:
                _reader_left(self.console.file)

    def notice(self, message: str) -> None:
        self._print(message)

    def step_started(self, name: str, reason: str) -> None:
        from rich.spinner import Spinner

        with self._rows:
            self._running[name] = {"since": time.monotonic(), "reason": reason, "spinner": Spinner("dots")}
        self._ensure_live()

    def output(self, name: str, line: str) -> None:
        """Output the user asked to see (-v, a foreground job): printed above the live rows, where it stays."""
        self._print(f"  {name} | {line}")
        self.output_quiet(name, line)

    def output_quiet(self, name: str, line: str) -> None:
        with self._rows:
            row = self._running.get(name)
            if row is not None and line.strip():
                row["line"] = printable(line)

    def progress(self, name: str, done: int, total: int | None, unit: str) -> None:
        from rich.spinner import Spinner

        with self._rows:
            row = self._running.get(name)
            if row is None:
                row = self._running[name] = {
                    "since": time.monotonic(),
                    "reason": "",
                    "spinner": Spinner("dots"),
                    "own": True,
                }
            row.update(done=done, total=total, unit=unit)
            if row.get("own") and total is not None and done >= total:
                self._running.pop(name, None)  # a loop's row goes when its last item is done
        self._ensure_live()

    def step_finished(self, result: Result) -> None:
        with self._rows:
            self._running.pop(result.name, None)
        super().step_finished(result)

    def close(self) -> None:
        with self._live_lock:
            if self._live is not None:
                self._live.stop()
                self._live = None

    def run_finished(self, results: list[Result], exit_code: int) -> None:
        self.close()
        super().run_finished(results, exit_code)

"""An in-process harness: the real CLI (runner.cli.main) on a pipeline of fake kinds whose "system" is a dict,
as docker compose's reconcile tests hand-build the observed state. No subprocess, no git, pip or Docker: what
is tested is the engine — the walk, blocking, for_each, held restarts, timeouts and the words.

The fake kind `fake` (FakeStep) keeps its state in `WORLD`:
- `WORLD.made[name]` is what the step made (its `value`); the probe says `missing`/`drift` against it;
- `WORLD.stopped` holds the names whose service is stopped on purpose (the probe says so, as launch does);
- `WORLD.live` holds the names with live work (a re-run on a changed spec is held as a restart);
- `fail: true` fails its apply; `hang: S` sleeps S seconds in Python, deaf to the engine (no process, no
  cancel check): only the executor's deadline can end it;
- `WORLD.runs` lists the names applied, in order.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from runner.causes import Change
from steps.base import Probe, SpecModel, StepContext, StepError, StepKind


@dataclass
class World:
    made: dict[str, str] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)
    live: set[str] = field(default_factory=set)
    runs: list[str] = field(default_factory=list)

    def reset(self) -> None:
        self.made.clear()
        self.stopped.clear()
        self.live.clear()
        self.runs.clear()


WORLD = World()


class FakeSpec(SpecModel):
    value: str = Field("v", description="what the step makes")
    fail: bool = Field(False, description="its apply fails")
    hang: float = Field(0, description="seconds its apply sleeps in Python, checking nothing")
    preview_fails: str = Field("", description="what plan's preview says apply would hit")


class FakeStep(StepKind[FakeSpec]):
    kind = "fake"
    Spec = FakeSpec
    local_probe = True
    outputs = frozenset({"value"})

    def probe(self, ctx: StepContext) -> Probe:
        have = WORLD.made.get(ctx.name)
        if have is None:
            return Probe.missing(f"{ctx.name} is not made")
        if have != self.spec.value:
            return Probe.drift(f"{ctx.name} holds {have}", (Change("value", have, self.spec.value),))
        if ctx.name in WORLD.stopped:
            return Probe.parked(f"{ctx.name} is stopped")
        return Probe.ok()

    def live_work(self, ctx: StepContext) -> str | None:
        return f"{ctx.name} serves" if ctx.name in WORLD.live and ctx.name in WORLD.made else None

    def preview(self, ctx: StepContext) -> str | None:
        return self.spec.preview_fails or None

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        WORLD.runs.append(ctx.name)
        if self.spec.hang:
            time.sleep(self.spec.hang)
        if self.spec.fail:
            raise StepError(f"{ctx.name} broke")
        WORLD.made[ctx.name] = self.spec.value
        WORLD.stopped.discard(ctx.name)
        return {"value": self.spec.value}


@dataclass
class Said:
    code: int
    out: str
    err: str

    def planned(self) -> dict[str, str]:
        """plan's line per step: `{action} {reason}` (plain output: a 7-wide symbol, the name, the reason)."""
        found: dict[str, str] = {}
        for line in self.out.splitlines():
            symbol, rest = line[:7].strip(), line[8:]
            if symbol in PLAN_SYMBOLS and rest.strip():
                name, _, reason = rest.strip().partition(" ")
                found[name] = f"{PLAN_SYMBOLS[symbol]} {reason.strip()}"
        return found

    def events(self, kind: str) -> list[dict[str, Any]]:
        """--json: the events of one kind."""
        return [e for e in map(json.loads, self.out.splitlines()) if e["event"] == kind]

    def finished(self) -> dict[str, dict[str, Any]]:
        """--json apply: each step's step_finished event."""
        return {e["step"]: e for e in self.events("step_finished")}


PLAN_SYMBOLS = {
    "+ run": "run",
    "ok": "ok",
    "skip": "skip",
    "~ maybe": "maybe",
    "! hold": "pending",
    "x fail": "fail",
    "- block": "block",
}


class Harness:
    """A pipeline file in a directory, run through runner.cli.main in this process."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, text: str) -> Path:
        target = self.path / "pipeline.yaml"
        target.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return target

    def __call__(self, *argv: str) -> Said:
        from runner import cli

        out, err = io.StringIO(), io.StringIO()
        with _cwd(self.path), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(argv))
        return Said(code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)

"""The decision, without the system: hand-built records in, a stable line of text out (as docker compose tests
its reconciler). Nothing here touches git, Docker, pip or a file."""

from __future__ import annotations

import time
from typing import Any

import pytest

from runner import words
from runner.causes import Change
from runner.decide import decide, to_observe
from runner.events import Decision
from runner.record import StepRecord
from runner.state import iso
from steps.base import Probe

FP = "f" * 64
WHEN = time.mktime((2026, 12, 3, 9, 30, 0, 0, 0, -1))


def done(**fields: Any) -> StepRecord:
    return StepRecord({"status": "done", "fingerprint": FP, "upstream": {"a": "1"}, **fields})


def text(decision: Decision) -> str:
    line = f"{decision.name}: {decision.action} - {decision.reason}"
    return line + "".join(f"\n  {words.change(c)}" for c in decision.changes)


CASES: list[tuple[str, StepRecord | None, dict[str, Any], str]] = [
    ("no-record", None, {}, "s: run - no record yet"),
    ("forced-beats-everything", done(), {"forced": True, "probe": Probe.ok()}, "s: run - forced (--force)"),
    (
        "crashed-inside",
        StepRecord({"status": "started", "started": WHEN}),
        {},
        f"s: run - an earlier run stopped inside this step (started {iso(WHEN)}, never finished)",
    ),
    (
        "plan-cannot-tell-a-crash-from-a-run",
        StepRecord({"status": "started", "started": WHEN}),
        {"crashed_ok": False},
        f"s: run - started {iso(WHEN)} and not finished (running now, or crashed)",
    ),
    (
        "interrupted",
        StepRecord({"status": "interrupted", "finished": WHEN}),
        {},
        f"s: run - interrupted last time ({iso(WHEN)})",
    ),
    (
        "failed-shows-the-first-line",
        StepRecord({"status": "failed", "error": "pip install failed: no e2b\nmore"}),
        {},
        "s: run - failed last time: pip install failed: no e2b",
    ),
    ("failed-without-error", StepRecord({"status": "failed"}), {}, "s: run - failed last time"),
    ("unknown-status", StepRecord({"status": "zombie"}), {}, "s: run - unknown recorded status 'zombie'"),
    (
        "spec-changed",
        done(fingerprint="old"),
        {"changes": [Change("ref", "main@3f2a1c", "v1.2 (9b7e00)")]},
        "s: run - spec changed: ref: main@3f2a1c -> v1.2 (9b7e00)\n  ref: main@3f2a1c -> v1.2 (9b7e00)",
    ),
    (
        "upstream-changed",
        done(fingerprint="old"),
        {"upstream": {"a": "2", "b": "9"}},
        "s: run - upstream changed: a, b",
    ),
    ("inputs-changed", done(fingerprint="old"), {}, "s: run - inputs changed"),
    (
        "a-running-job-waits-for-force",
        done(fingerprint="old"),
        {"changes": [Change("command", "'a'", "'b'")], "live": "pid 42 is running", "step": "train"},
        "s: pending - restart pending (spec changed: command: 'a' -> 'b'); pid 42 is running; "
        "`apply --force train` restarts it\n  command: 'a' -> 'b'",
    ),
    ("probe-ok", done(), {"probe": Probe.ok()}, "s: ok - up to date"),
    ("probe-ok-with-words", done(), {"probe": Probe.ok("adopted pid 7")}, "s: ok - adopted pid 7"),
    (
        "probe-missing",
        done(),
        {"probe": Probe.missing("results/rewards.jsonl is missing")},
        "s: run - results/rewards.jsonl is missing",
    ),
    (
        "probe-drift-lists-changes",
        done(),
        {"probe": Probe("drift", "container drifted", (Change("ports", "8000", "9000"),))},
        "s: run - container drifted\n  ports: 8000 -> 9000",
    ),
    (
        "probe-unknown-fails-without-running",
        done(),
        {"probe": Probe.unknown("node1 did not answer within 60s over ssh", "check node1")},
        "s: fail - not looked at: node1 did not answer within 60s over ssh",
    ),
]


@pytest.mark.parametrize(("record", "given", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(record: StepRecord | None, given: dict[str, Any], expected: str) -> None:
    arguments: dict[str, Any] = {"fingerprint": FP, "upstream": {"a": "1"}, **given}
    assert text(decide("s", record, **arguments)) == expected


def test_what_to_observe_follows_the_record() -> None:
    assert to_observe(None, FP, forced=False) == "nothing"
    assert to_observe(done(), FP, forced=True) == "nothing"
    assert to_observe(StepRecord({"status": "failed"}), FP, forced=False) == "nothing"
    assert to_observe(done(fingerprint="old"), FP, forced=False) == "changes"
    assert to_observe(done(), FP, forced=False) == "probe"


def test_a_current_record_is_never_decided_without_its_probe() -> None:
    with pytest.raises(ValueError, match="needs the probe"):
        decide("s", done(), fingerprint=FP, upstream={"a": "1"})


def test_the_record_reads_what_disk_gave_it_defensively() -> None:
    odd = StepRecord({"status": "done", "duration": "slow", "attempts": "2", "outputs": [1, 2], "spec": "x"})
    assert odd.duration is None and odd.attempts == 0 and odd.outputs == {} and odd.spec is None
    assert StepRecord.of("not a record") is None and StepRecord.of(None) is None
    begun = StepRecord.starting(done(outputs={"x": 1}), WHEN, "run-1", 99, "/l")
    assert begun.status == "started" and begun.outputs == {"x": 1} and begun.fingerprint == FP
    failed = begun.ended(False, WHEN + 1, 1.0, 2, "boom")
    assert failed.status == "failed" and failed.attempts == 2 and failed.outputs == {"x": 1}
    assert begun.ended(True, WHEN + 1, 1.0, 1, "interrupted").status == "interrupted"
    unknown_kept = StepRecord({"status": "done", "from_a_newer_runner": 1})
    assert unknown_kept.to_dict()["from_a_newer_runner"] == 1

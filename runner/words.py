"""Every cause and change put into words, in one place: plan's lines, apply's, explain's and --json's `reason`
all come from here, so the two commands can no longer say a step's state differently.

`reason(cause, changes)` is the line plan and apply print; `brief(cause)` leaves the changes out (explain and
--json carry them apart, as data, so they are not said twice).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from runner.causes import Cause, Change


def iso(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def change(c: Change) -> str:
    if not c.field:
        return c.note
    if c.note:
        return f"{c.field}: {c.note}"
    if c.old is None and c.new is not None:
        return f"{c.field}: added {c.new}"
    if c.new is None and c.old is not None:
        return f"{c.field}: removed"
    return f"{c.field}: {c.old} -> {c.new}"


def hold(step: str, how: str) -> str:
    """Why a step that is up to date cannot serve what depends on it now."""
    if how == "restart_pending":
        return f"{step} has a restart pending (its job runs with the old spec; `apply --force {step}`)"
    return f"{step} is stopped (`runner stop`; `apply --force {step}` relaunches it)"


def _joined(steps: Sequence[str]) -> str:
    return ", ".join(steps)


def reason(c: Cause, changes: Sequence[Change] = (), *, full: bool = True) -> str:
    """The cause as plan and apply say it; `full`: with the spec's changes spelled out in the line."""
    text = _reason(c, changes, full=full)
    order_only = c.data.get("order_only")
    if order_only:
        first = order_only[0]
        text += (
            f"; not re-run for {_joined(order_only)} above it in the file (file order only orders): "
            f"`needs: [{first}]` re-runs it when {first} changes"
        )
    return text


def _reason(c: Cause, changes: Sequence[Change] = (), *, full: bool = True) -> str:
    d = c.data
    k = c.kind
    if k == "forced":
        return "forced (--force)"
    if k == "no_record":
        if d.get("creates_exist"):
            return f"no record yet; every `creates` exists: `runner mark-done {d.get('target')}` takes it as done"
        return "no record yet"
    if k == "crashed":
        when = iso(d.get("started"))
        if d.get("running_now"):
            text = f"started {when} and not finished (running now, or crashed)"
        else:
            text = f"an earlier run stopped inside this step (started {when}, never finished)"
        if d.get("left"):
            text += f"; {d['left']} it started still running, stopped before it runs again: {d.get('left_shown', '')}"
        return text
    if k == "interrupted":
        return f"interrupted last time ({iso(d.get('finished'))})"
    if k == "failed_before":
        return "failed last time" + (f": {d['error']}" if d.get("error") else "")
    if k == "unknown_status":
        return f"unknown recorded status {d.get('status')!r}"
    if k == "spec_changed":
        if full and changes:
            return "spec changed: " + "; ".join(change(x) for x in changes)
        return "spec changed: " + _joined(d.get("fields") or [x.field or x.note for x in changes])
    if k == "upstream_changed":
        outputs, forced = d.get("outputs") or {}, d.get("forced") or []
        parts = []
        for dep in d.get("steps", []):
            how = []
            if dep in forced:
                how.append("re-run by --force")
            if dep in outputs:
                how.append(f"new {', '.join(outputs[dep])}" if outputs[dep] else "same outputs, new spec or inputs")
            parts.append(dep + (f" ({'; '.join(how)})" if how else ""))
        return "upstream changed: " + _joined(parts)
    if k == "inputs_changed":
        return "inputs changed"
    if k == "probe":
        return str(d.get("text") or d.get("status") or "")
    if k == "up_to_date":
        return str(d.get("text") or "up to date")
    if k == "restart_pending":
        inner = reason(d["inner"], changes, full=full)
        step = d.get("step", "")
        return f"restart pending ({inner}); {d.get('live', '')}; `apply --force {step}` restarts it"
    if k == "held":
        return "blocked: " + "; ".join(hold(s, how) for s, how in d.get("holds", []))
    if k == "waits_on":
        holds = d.get("holds") or {}
        tense = "failed" if d.get("happened") else "would fail"
        why = "; ".join(
            "; ".join(hold(s, how) for s, how in holds[r]) if r in holds else f"{r} {tense}" for r in d.get("roots", [])
        )
        via = d.get("via") or []
        return f"blocked: {why}" + (f" (via {_joined(via)})" if via else "")
    if k == "would_fail":
        return f"would fail: {d.get('problem', '')}"
    if k == "when_false":
        return f"`when` is false: {d.get('when')}"
    if k == "after_upstream":
        text = ("no record yet; " if d.get("never_ran") else "") + f"after {_joined(d.get('pending', []))} runs"
        if d.get("items") is not None:
            text += f" ({d['items']} items)"
        elif d.get("rerun_note"):
            text += " (re-runs if their outputs change)"
        return text
    if k == "items_to_run":
        to_run = d.get("to_run", [])
        parts = [f"{key} ({reason(why, item_changes, full=full)})" for key, why, item_changes in to_run[:3]]
        shown = "; ".join(parts) + (f"; and {len(to_run) - 3} more" if len(to_run) > 3 else "")
        return f"{len(to_run)} of {d.get('total')} items to run: {shown}"
    if k == "items_up_to_date":
        return f"{d.get('count')} items up to date"
    if k == "not_started":
        return "not started: an earlier step failed"
    if k == "unreachable":
        return f"not looked at: {d.get('problem', '')}"
    return k.replace("_", " ")

"""Whether a step runs, and why: a pure function of what was recorded, what is wanted and what was observed.

Two steps, as docker compose's reconciler reads observed state before it plans: :func:`to_observe` says what
the engine must look at for this step (nothing, the field-level changes and any live work, or the probe), and
:func:`decide` turns the record, the wanted fingerprint and those observations into a :class:`Decision` with
its reason. Neither touches the system, so both are tested with hand-built records (tests/test_decide.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from runner.events import Decision
from runner.record import DONE, FAILED, INTERRUPTED, STARTED, StepRecord
from runner.state import iso
from steps.base import Probe

Observe = Literal["nothing", "changes", "probe"]


def to_observe(record: StepRecord | None, fingerprint: str, forced: bool) -> Observe:
    """What :func:`decide` needs looked at: "changes" (the spec's field-level changes and the live work a
    re-run would disrupt) when the fingerprint moved, "probe" when the record is done and current."""
    if forced or record is None or not record.is_done:
        return "nothing"
    return "changes" if record.fingerprint != fingerprint else "probe"


def decide(
    name: str,
    record: StepRecord | None,
    *,
    fingerprint: str,
    upstream: Mapping[str, str],
    forced: bool = False,
    step: str | None = None,
    crashed_ok: bool = True,
    changes: Sequence[str] = (),
    live: str | None = None,
    probe: Probe | None = None,
) -> Decision:
    """The decision for `name` (a step, or `step[key]` an item of it).

    `crashed_ok`: a `started` record means the runner died inside the step (apply holds the lock, so nothing
    else can be running it); plan, without the lock, says it may be running now. `changes`, `live` and `probe`
    are what :func:`to_observe` asked for.
    """
    step = step or name
    if forced:
        return Decision(name, "run", "forced (--force)")
    if record is None:
        return Decision(name, "run", "no record yet")
    status = record.status
    if status == STARTED:
        when = iso(record.started)
        if crashed_ok:
            return Decision(name, "run", f"an earlier run stopped inside this step (started {when}, never finished)")
        return Decision(name, "run", f"started {when} and not finished (running now, or crashed)")
    if status == INTERRUPTED:
        return Decision(name, "run", f"interrupted last time ({iso(record.finished)})")
    if status == FAILED:
        error = record.first_error_line
        return Decision(name, "run", "failed last time" + (f": {error}" if error else ""))
    if status != DONE:
        return Decision(name, "run", f"unknown recorded status {status!r}")
    if record.fingerprint != fingerprint:
        old_up = record.upstream
        moved = [d for d in upstream if old_up.get(d) != upstream[d]]
        if changes:
            decision = Decision(name, "run", "spec changed: " + "; ".join(changes), list(changes))
        elif moved:
            decision = Decision(name, "run", "upstream changed: " + ", ".join(moved))
        else:
            decision = Decision(name, "run", "inputs changed")
        if live:
            return Decision(
                name,
                "pending",
                f"restart pending ({decision.reason}); {live}; `apply --force {step}` restarts it",
                decision.changes,
            )
        return decision
    if probe is None:
        raise ValueError(f"{name}: decide needs the probe of a current record (see to_observe)")
    if probe.status != "ok":
        return Decision(name, "run", probe.reason or probe.status, list(probe.changes))
    return Decision(name, "ok", probe.reason or "up to date")

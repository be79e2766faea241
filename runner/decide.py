"""Whether a step runs, and why: a pure function of what was recorded, what is wanted and what was observed.

Two steps, as docker compose's reconciler reads observed state before it plans: :func:`to_observe` says what
the engine must look at for this step (nothing, the field-level changes and any live work, or the probe), and
:func:`decide` turns the record, the wanted fingerprint and those observations into a :class:`Decision` with
its reason. Neither touches the system, so both are tested with hand-built records (tests/test_decide.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from runner.causes import Change, cause
from runner.events import Decision
from runner.record import DONE, FAILED, INTERRUPTED, STARTED, StepRecord
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
    changes: Sequence[Change] = (),
    live: str | None = None,
    probe: Probe | None = None,
) -> Decision:
    """The decision for `name` (a step, or `step[key]` an item of it), with its cause as data.

    `crashed_ok`: a `started` record means the runner died inside the step (apply holds the lock, so nothing
    else can be running it); plan, without the lock, says it may be running now. `changes`, `live` and `probe`
    are what :func:`to_observe` asked for.
    """
    step = step or name
    if forced:
        return Decision(name, "run", cause("forced"))
    if record is None:
        return Decision(name, "run", cause("no_record"))
    status = record.status
    if status == STARTED:
        return Decision(name, "run", cause("crashed", started=record.started, running_now=not crashed_ok))
    if status == INTERRUPTED:
        return Decision(name, "run", cause("interrupted", finished=record.finished))
    if status == FAILED:
        return Decision(name, "run", cause("failed_before", error=record.first_error_line))
    if status != DONE:
        return Decision(name, "run", cause("unknown_status", status=status))
    if record.fingerprint != fingerprint:
        old_up = record.upstream
        moved = [d for d in upstream if old_up.get(d) != upstream[d]]
        if changes:
            why = cause("spec_changed", fields=list(dict.fromkeys(c.field for c in changes if c.field)))
        elif moved:
            why = cause("upstream_changed", steps=moved)
        else:
            why = cause("inputs_changed")
        if live:
            return Decision(name, "pending", cause("restart_pending", inner=why, live=live, step=step), list(changes))
        return Decision(name, "run", why, list(changes))
    if probe is None:
        raise ValueError(f"{name}: decide needs the probe of a current record (see to_observe)")
    found = [c if isinstance(c, Change) else Change.fact(c) for c in probe.changes]
    if probe.status == "unknown":  # its machine did not answer: it fails without running, its record kept
        return Decision(name, "fail", cause("unreachable", problem=probe.reason, hint=probe.hint))
    if probe.status != "ok":
        ended = {"exit_code": probe.exit_code} if probe.exit_code is not None else {}
        return Decision(name, "run", cause("probe", status=probe.status, text=probe.reason, **ended), found)
    return Decision(name, "ok", cause("up_to_date", text=probe.reason))

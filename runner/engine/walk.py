"""The one walk: the rules that decide a step given how the steps before it turned out, for plan and apply alike.

Plan walks the graph in order and feeds each step's decision back as its outcome (a step that would run is
`pending`: its outputs are not known yet, so what reads them may or may not run again). Apply walks the same
graph as its scheduler reaches each step and feeds back what really happened. Either way a step is decided by
:meth:`Walk.look` and nothing else, so the two can no longer decide or word a step differently:

- what it waits on (data and order edges) failed, was blocked or would fail -> `block` (waits_on)
- not selected (--only, --from)                                       -> not decided; its record adopted
- `when` is false                                                     -> `skip` (its digest is "skipped")
- a data upstream is pending (plan only)                              -> `maybe` (or `run` with no record)
- otherwise rendered and decided from its record and the system (runner.decide); a run held back by a
  stopped or restart-pending upstream -> `block` (held); plan alone asks the kind's preview -> `fail`
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Literal

from runner.causes import Cause, Change, cause
from runner.engine.base import RunState
from runner.engine.observe import Observer
from runner.engine.prepare import Item, Prepared, Preparer
from runner.errors import InputError
from runner.events import Action, Decision
from runner.model import StepDecl
from runner.util.datatype import datatype, field
from steps.base import StepError

# How a step turned out, as the walk sees it. `pending`: plan only, it would (or may) run.
Outcome = Literal["ok", "changed", "pending", "failed", "blocked", "skipped", "unselected"]

STOPPING: tuple[Outcome, ...] = ("failed", "blocked")
UP_TO_DATE = ("up_to_date", "items_up_to_date", "probe")

OUTCOME_OF_ACTION: dict[Action, Outcome] = {
    "run": "pending",
    "maybe": "pending",
    "ok": "ok",
    "pending": "ok",  # a restart held back: its outputs are what they were
    "skip": "skipped",
    "fail": "failed",
    "block": "blocked",
}


@datatype
class Look:
    """A step's decision and what carrying it out needs: the rendered step (or each item's, for for_each), or
    why it could not be rendered (apply fails the step with it; plan raises it)."""

    decision: Decision | None  # None: not selected this run
    prep: Prepared | None = None
    items: list[tuple[Prepared, Decision]] = field(default_factory=list)
    all_items: list[Item] | None = None  # a for_each step's items, in order
    error: InputError | StepError | None = None
    error_item: str = ""  # the item whose rendering failed


class Walk:
    """The rules of the walk (see the module's docstring), and the walk's own state: the roots of what is
    blocked, the holds, the selection."""

    def __init__(self, run: RunState, prep: Preparer, observer: Observer) -> None:
        self.run = run
        self.prep = prep
        self.observer = observer
        self.begin_walk()

    def begin_walk(self) -> None:
        self.run.holding.clear()
        self._roots: dict[str, list[str]] = {}  # a blocked step -> the failing (or held) steps it waits on
        self._held_why: dict[str, list[list[str]]] = {}  # a step blocked by a held upstream -> those holds
        self.selected_names = self.run.selected()

    def look(self, name: str, outcomes: Mapping[str, Outcome], *, planning: bool, crashed_ok: bool = True) -> Look:
        """The decision for step `name`, given the outcomes of the steps before it."""
        looked = self._walk_step(name, outcomes, planning, crashed_ok)
        decision = looked.decision
        if decision is not None and decision.action == "ok" and decision.cause.kind in UP_TO_DATE:
            # It follows a step that runs (or ran) now by file order alone: say it is not re-run for it, and how
            # it would be, so a stale output along a file-order edge is never silent (docs/steps.md, "Order").
            deps = self.run.graph.deps[name]
            ran = [d for d in self.run.graph.after[name] if d not in deps and outcomes.get(d) in ("pending", "changed")]
            if ran:
                noted = Cause(decision.cause.kind, {**decision.cause.data, "order_only": ran})
                looked.decision = Decision(name, "ok", noted, decision.changes)
        if looked.decision is not None and looked.decision.cause.kind == "held":
            # the root of what waits on it: they say why (the holds above it), not "it would fail"
            self._held_why[name] = looked.decision.cause.data.get("holds", [])
        return looked

    def _walk_step(self, name: str, outcomes: Mapping[str, Outcome], planning: bool, crashed_ok: bool) -> Look:
        step = self.run.pipeline.step(name)
        self.run.adopt_record(name)  # its recorded outputs, until (in apply) a run replaces them
        selected = name in self.selected_names
        blocked_by = [d for d in self.run.graph.after[name] if outcomes.get(d) in STOPPING]
        if selected and blocked_by:
            return Look(self.waits_on(name, blocked_by, happened=not planning))
        if not selected:
            if step.exports_env:
                with contextlib.suppress(InputError, StepError):
                    self.prep.prepare(step)
            return Look(None)
        pending_up = [d for d in self.run.graph.deps[name] if outcomes.get(d) == "pending"]
        if step.common.for_each is not None:
            return self._look_each(step, pending_up, crashed_ok)
        try:
            prep = self.prep.prepare(step)
        except InputError as exc:
            if pending_up:
                return Look(self._after(name, pending_up))
            return Look(None, error=exc)
        except StepError as exc:  # looking at it failed (hashing its inputs took longer than its timeout)
            return Look(None, error=exc)
        if prep is None:
            return Look(self._skip(step))
        decision = self.observer.decide(prep, crashed_ok)
        if decision.action == "run" and planning:
            problem = self.observer.preview(prep)
            if problem:
                decision = Decision(name, "fail", cause("would_fail", problem=problem), decision.changes)
        if decision.action in ("ok", "pending") and pending_up:
            decision = Decision(name, "maybe", cause("after_upstream", pending=pending_up, rerun_note=True))
        return Look(decision, prep=prep)

    def _look_each(self, step: StepDecl, pending_up: list[str], crashed_ok: bool) -> Look:
        name = step.name
        try:
            items = self.prep.items(step)
            if items is not None:
                self.prep.check_item_targets(step, items, self.run.options.force)
        except InputError as exc:
            if pending_up:
                return Look(self._after(name, pending_up))
            return Look(None, error=exc)
        if items is None:
            return Look(self._skip(step))
        if pending_up:
            return Look(self._after(name, pending_up, len(items)), all_items=items)
        looked: list[tuple[Prepared, Decision]] = []
        to_run: list[list[object]] = []
        changes: list[Change] = []
        for item in items:
            try:
                prep = self.prep.prepare(step, item=item)
            except (InputError, StepError) as exc:
                return Look(None, items=looked, all_items=items, error=exc, error_item=item.key)
            assert prep is not None
            decision = self.observer.decide(prep, crashed_ok)
            if decision.action == "block":
                return Look(Decision(name, "block", decision.cause), all_items=items)
            looked.append((prep, decision))
            if decision.action not in ("ok", "pending"):
                to_run.append([item.key, decision.cause, decision.changes])
                changes += [_in_item(item.key, c) for c in decision.changes]
        if not to_run:
            done = Decision(name, "ok", cause("items_up_to_date", count=len(items)))
            return Look(done, items=looked, all_items=items)
        why = cause("items_to_run", total=len(items), to_run=to_run)
        return Look(Decision(name, "run", why, changes), items=looked, all_items=items)

    def _skip(self, step: StepDecl) -> Decision:
        """`when` is false: its outputs are what it recorded, and what depends on it sees the digest "skipped"
        (in plan as in apply: a skipped upstream is not a change)."""
        self.run.digests[step.name] = "skipped"
        return Decision(step.name, "skip", cause("when_false", when=step.common.when))

    def _after(self, name: str, pending: list[str], items: int | None = None) -> Decision:
        """A step that cannot be known before what it waits on runs: it runs for certain when it has never run
        (`+ run`), and maybe otherwise (`~ maybe`: only if their outputs change)."""
        never_ran = self.run.record(name) is None
        action: Action = "run" if never_ran else "maybe"
        return Decision(name, action, cause("after_upstream", pending=pending, never_ran=never_ran, items=items))

    def waits_on(self, name: str, blocked_by: list[str], happened: bool) -> Decision:
        roots = list(dict.fromkeys(r for d in blocked_by for r in self._roots.get(d, [d])))
        self._roots[name] = roots
        holds = {r: self._held_why[r] for r in roots if r in self._held_why}
        via = [d for d in blocked_by if d not in roots or d in holds]  # a held root is said by what it waits on
        return Decision(name, "block", cause("waits_on", roots=roots, via=via, holds=holds, happened=happened))


def _in_item(key: str, change: Change) -> Change:
    if change.field:
        return Change(f"[{key}] {change.field}", change.old, change.new, change.note)
    return Change.fact(f"[{key}] {change.note}")


def outcome_of(decision: Decision) -> Outcome:
    return OUTCOME_OF_ACTION[decision.action]


__all__ = ["Cause", "Look", "Outcome", "Walk", "outcome_of"]

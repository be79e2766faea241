"""plan(): every step's decision, without running anything; the same graph and rules apply uses."""

from __future__ import annotations

import contextlib

from runner.engine.observe import Deciding
from runner.errors import InputError
from runner.events import Action, Decision
from runner.model import StepDecl
from runner.state import lock_holder
from steps.base import StepError


class Planning(Deciding):
    """plan(): a decision for every step in graph order, with maybe/fail/block propagated as apply would."""

    def _plan_each(self, step: StepDecl, crashed_ok: bool, pending_up: list[str], failing_up: list[str]) -> Decision:
        name = step.name
        items = self.items(step)
        if items is None:
            return Decision(name, "skip", f"`when` is false: {step.common.when}")
        self.check_item_targets(step, items, self.options.force)
        if pending_up:
            action: Action = "run" if self.record(name) is None else "maybe"  # never ran: it runs, whatever comes
            return Decision(name, action, _after(pending_up, failing_up, action) + f" ({len(items)} items)")
        to_run: list[str] = []
        changes: list[str] = []
        for item in items:
            prep = self.prepare(step, item=item)
            assert prep is not None
            decision = self.decide(prep, crashed_ok)
            if decision.action == "block":
                return Decision(name, "block", decision.reason)
            if decision.action not in ("ok", "pending"):
                to_run.append(f"{item.key} ({decision.reason})")
                changes += [f"[{item.key}] {c}" for c in decision.changes]
        if not to_run:
            return Decision(name, "ok", f"{len(items)} items up to date")
        shown = "; ".join(to_run[:3]) + (f"; and {len(to_run) - 3} more" if len(to_run) > 3 else "")
        return Decision(name, "run", f"{len(to_run)} of {len(items)} items to run: {shown}", changes)

    def plan(self) -> list[Decision]:
        self.load_state()
        self.holding.clear()
        holder = lock_holder(self.pipeline.state_dir)
        selected = self.selected()
        decisions: dict[str, Decision] = {}
        failing_roots: dict[str, list[str]] = {}  # a blocked step -> the failing steps it waits on
        held_reason: dict[str, str] = {}  # a step blocked by a stopped or held step above -> why
        for name in self.graph.order():
            step = self.pipeline.step(name)
            self._adopt_record(name)
            pending_up = [
                d for d in self.graph.deps[name] if decisions.get(d) and decisions[d].action in ("run", "maybe", "fail")
            ]
            failing_up = [d for d in pending_up if decisions[d].action == "fail"]
            # As apply does: a step waits on everything before it in the graph (data and order edges), and one
            # whose wait ends in a failure is blocked, not run.
            blocked_by = [
                d for d in self.graph.after[name] if decisions.get(d) and decisions[d].action in ("fail", "block")
            ]
            if name in selected and blocked_by:
                roots = list(dict.fromkeys(r for d in blocked_by for r in failing_roots.get(d, [d])))
                failing_roots[name] = roots
                via = [d for d in blocked_by if d not in roots]
                why = "; ".join(held_reason.get(r, f"{r} would fail") for r in roots)
                reason = f"blocked: {why}" + (f" (via {', '.join(via)})" if via else "")
                decisions[name] = Decision(name, "block", reason)
                continue
            if name not in selected:
                if step.exports_env:
                    with contextlib.suppress(InputError):
                        self.prepare(step)
                continue
            if step.common.for_each is not None:
                try:
                    decisions[name] = self._plan_each(step, holder is None, pending_up, failing_up)
                    if decisions[name].action == "block":
                        held_reason[name] = decisions[name].reason.removeprefix("blocked: ")
                except InputError as exc:
                    if not pending_up:
                        raise exc
                    decisions[name] = self._after_pending(name, pending_up, failing_up)
                continue
            try:
                prep = self.prepare(step)
            except InputError as exc:
                if pending_up:
                    decisions[name] = self._after_pending(name, pending_up, failing_up)
                    continue
                raise exc
            except StepError as exc:  # looking at it failed (hashing its inputs took longer than its timeout)
                decisions[name] = Decision(name, "fail", self.masker.mask(exc.message))
                continue
            if prep is None:
                decisions[name] = Decision(name, "skip", f"`when` is false: {step.common.when}")
                continue
            decision = self.decide(prep, crashed_ok=holder is None)
            if decision.action == "block":  # what it needs is stopped or held: its dependents say why
                held_reason[name] = decision.reason.removeprefix("blocked: ")
            if decision.action == "run":
                problem = self._preview(prep)
                if problem:
                    decision = Decision(name, "fail", f"would fail: {problem}", decision.changes)
            if decision.action in ("ok", "pending") and pending_up:
                decision = Decision(
                    name, "maybe", _after(pending_up, failing_up) + " (re-runs if their outputs change)"
                )
            decisions[name] = decision
        return [decisions[n] for n in self.graph.order() if n in decisions]

    def _after_pending(self, name: str, pending: list[str], failing: list[str]) -> Decision:
        """A step that cannot be rendered before what it waits on runs: it runs for certain when it has never
        run (`+ run`), and maybe otherwise (`~ maybe`: only if their outputs change)."""
        action: Action = "run" if self.record(name) is None else "maybe"
        return Decision(name, action, _after(pending, failing, action))


def _after(pending: list[str], failing: list[str], action: str = "maybe") -> str:
    text = ("no record yet; " if action == "run" else "") + f"after {', '.join(pending)} runs"
    if failing:
        text += f"; blocked while {', '.join(failing)} would fail"
    return text

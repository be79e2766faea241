"""Deciding one step: what to look at (runner.decide.to_observe), looking, and the pure decision."""

from __future__ import annotations

from runner.causes import Cause, Change, cause
from runner.decide import decide, to_observe
from runner.engine.base import RunState
from runner.engine.prepare import Prepared
from runner.events import Decision
from runner.fingerprint import spec_changes
from runner.record import STARTED, StepRecord
from runner.util import sweep
from steps.base import Probe, StepError, Unreachable


class Observer:
    """Looks at what runner.decide asks for (changes, live work, the probe) and decides."""

    def __init__(self, run: RunState) -> None:
        self.run = run

    def _left_running(self, key: str, record: StepRecord) -> list[sweep.Leftover]:
        """What the run that stopped inside this step (a crash: its record says `started`) left running."""
        run = record.run
        if run is None:
            return []
        tag = sweep.step_tag(str(self.run.pipeline.state_dir), run, key)
        return [sweep.Leftover(pid, sweep.command_of(pid)) for pid, _ in sweep.find([tag])]

    def decide(self, prep: Prepared, crashed_ok: bool) -> Decision:
        """Look at what runner.decide asks for (the record always; the changes or the probe), then decide."""
        record = self.run.record(prep.key)
        forced = prep.step.name in self.run.options.force or prep.key in self.run.options.force
        changes: list[Change] = []
        live: str | None = None
        probe: Probe | None = None
        looking = to_observe(record, prep.fingerprint, forced)
        if looking == "changes" and record is not None:
            changes = self._changes(prep, record)
            live = self._live_work(prep)
        elif looking == "probe":
            found = self.probe(prep)
            masked = tuple(self._mask_change(c) for c in found.changes)
            mask = self.run.masker.mask
            probe = Probe(found.status, mask(found.reason), masked, found.stopped, mask(found.hint), found.exit_code)
        decision = decide(
            prep.key,
            record,
            fingerprint=prep.fingerprint,
            upstream=prep.upstream,
            forced=forced,
            step=prep.step.name,
            crashed_ok=crashed_ok,
            changes=changes,
            live=live,
            probe=probe,
        )
        if decision.cause.kind == "upstream_changed":
            decision = self._say_what_moved(decision)
        if (
            decision.cause.kind == "no_record"
            and prep.step.kind == "run"
            and prep.ctx.host is None
            and getattr(prep.instance.spec, "creates", None)
        ):
            # Ansible's `creates` would skip it; runner runs what it has no record of (the files may be another
            # spec's), and says how to take them as done instead: a renamed step, an item dropped and added back.
            # Here only: a stat per path, not a round trip per item to another machine on a first apply.
            if self.probe(prep).status == "ok":
                why = Cause("no_record", {"creates_exist": True, "target": prep.key})
                decision = Decision(decision.name, decision.action, why, decision.changes)
        if record is not None and record.status == STARTED and crashed_ok and decision.action == "run":
            left = self._left_running(prep.key, record)
            if left:
                count, shown = sweep.describe(left, self.run.masker.mask)
                why = Cause("crashed", {**decision.cause.data, "left": count, "left_shown": shown})
                decision = Decision(decision.name, decision.action, why, decision.changes)
        step = prep.step.name
        if decision.action == "pending":
            self.run.holding[step] = "restart_pending"
        elif decision.action == "ok" and probe is not None and probe.stopped:
            self.run.holding[step] = "stopped"
        if decision.action == "run" and self.run.holding and not forced:
            held = self._held_upstream(step)
            if held:
                return Decision(decision.name, "block", cause("held", holds=held), decision.changes)
        return decision

    def _say_what_moved(self, decision: Decision) -> Decision:
        """An upstream that ran in this apply: which of its outputs changed (their names, never their values), and
        whether it ran because of --force, so `upstream changed: sandbox_server` says why."""
        what: dict[str, list[str]] = {}
        forced: list[str] = []
        for dep in decision.cause.data.get("steps", []):
            if dep in self.run.options.force:
                forced.append(dep)
            if dep in self.run.replaced:
                old, new = self.run.replaced[dep], self.run.outputs.get(dep, {})
                what[dep] = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if not what and not forced:
            return decision
        why = Cause(decision.cause.kind, {**decision.cause.data, "outputs": what, "forced": forced})
        return Decision(decision.name, decision.action, why, decision.changes)

    def _held_upstream(self, name: str) -> list[list[str]]:
        """The steps `name` depends on (transitively) that cannot serve it now: [step, how] in file order."""
        ancestors = self.run.graph.upstream({name}) - {name}
        held = sorted((a for a in ancestors if a in self.run.holding), key=lambda a: self.run.pipeline.step(a).index)
        return [[a, self.run.holding[a]] for a in held]

    def _changes(self, prep: Prepared, record: StepRecord) -> list[Change]:
        """The spec's field-level changes since the record, in the kind's own terms where it has them."""
        self.run.masker.scan(record.spec)  # a record written before a value was known to be secret
        changes = spec_changes(self.run.masker.mask_data(record.spec), self.run.masker.mask_data(prep.spec))
        if changes and record.spec is not None:
            try:
                changes = [self._mask_change(c) for c in prep.instance.describe_changes(prep.ctx, record.spec, changes)]
            except (StepError, OSError):
                pass
        return changes

    def _mask_change(self, change: Change | str) -> Change:
        if isinstance(change, str):
            return Change.fact(self.run.masker.mask(change))
        mask = self.run.masker.mask
        return Change(
            mask(change.field),
            None if change.old is None else mask(change.old),
            None if change.new is None else mask(change.new),
            mask(change.note),
        )

    def _live_work(self, prep: Prepared) -> str | None:
        try:
            live = prep.instance.live_work(prep.ctx)
        except (StepError, OSError):
            return None
        return self.run.masker.mask(live) if live else None

    def preview(self, prep: Prepared) -> str | None:
        host = prep.instance.remote_host(prep.ctx)
        if host:  # a machine that cannot be reached fails every step there: plan says so, as apply will
            from steps._support.machine import machine_for  # ssh's code, only for a step on another machine

            try:
                machine_for(host).check()
            except StepError as exc:
                return self.run.masker.mask(exc.message)
        try:
            problem = prep.instance.preview(prep.ctx)
        except (StepError, OSError):
            return None
        return self.run.masker.mask(problem) if problem else None

    def probe(self, prep: Prepared) -> Probe:
        try:
            return prep.instance.probe(prep.ctx)
        except Unreachable as exc:  # not known: neither run nor taken for missing
            return Probe.unknown(exc.message, exc.hint)
        except StepError as exc:
            return Probe.missing(f"probe failed: {exc.message}")
        except OSError as exc:
            return Probe.missing(f"probe failed: {exc}")

"""The engine's side of explain, forget, mark-done, stop, logs and env."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

from runner import words
from runner.engine.base import RunState
from runner.engine.execute import Executor
from runner.engine.observe import Observer
from runner.engine.plan import Planner
from runner.engine.prepare import Prepared, Preparer, Removals
from runner.errors import InputError, suggest
from runner.events import Decision
from runner.model import StepDecl
from runner.record import StepRecord
from runner.state import iso, lock_holder, now, pipeline_lock
from steps import kind_class
from steps.base import StepContext, StepError, StepKind


class Admin:
    """What the other commands ask: explain, forget, mark-done, stop, logs, env."""

    def __init__(
        self,
        run: RunState,
        prep: Preparer,
        removals: Removals,
        observer: Observer,
        planner: Planner,
        executor: Executor,
    ) -> None:
        self.run = run
        self.prep = prep
        self.removals = removals
        self.observer = observer
        self.planner = planner
        self.executor = executor

    def explain(self, target: str) -> str:
        """One step's full reasoning, as plan would reach it: what it is, what it depends on, its rendered
        spec, its record, and the decision with its reason (like `doit info`). `NAME[key]`: one item of it."""
        name, _, key = target.partition("[")
        decisions = {d.name: d for d in self.planner.plan()}
        step = self.run.pipeline.step(name)
        lines = [
            f"step {target} ({step.kind}), "
            + ("an item of " if key else "")
            + f"steps[{step.index}] of {self.run.pipeline.file}"
        ]
        if step.common.description:
            lines.append(f"  description: {step.common.description}")
        graph = self.run.graph

        def in_file_order(names: list[str]) -> list[str]:
            return sorted(names, key=lambda n: self.run.pipeline.step(n).index)

        # as `runner graph` draws them: data edges (a change re-runs what depends) and file-order edges (order only)
        deps = in_file_order(graph.deps[name])
        lines.append(f"  depends on: {', '.join(deps) if deps else 'nothing'}")
        after = in_file_order([d for d in graph.after[name] if d not in graph.deps[name]])
        if after:
            lines.append(
                f"  runs after: {', '.join(after)} (file order: it waits for them, and is not re-run when they change)"
            )
        needed = in_file_order([d for d in graph.dependents[name] if name in graph.deps[d]])
        lines.append(f"  needed by: {', '.join(needed) if needed else 'nothing'}")
        before = in_file_order([d for d in graph.dependents[name] if name not in graph.deps[d]])
        if before:
            lines.append(f"  runs before: {', '.join(before)} (file order only)")
        prep: Prepared | None = None
        if key:
            self._reach(name)
            try:
                items = self.prep.items(step)
            except InputError:
                items = None  # items that do not render yet: said below
            if items is not None:
                self.prep.check_item_targets(step, items, [target])  # an unknown key: exit 2, with the keys
            try:
                prep = self._prepare_through(target)
            except InputError as exc:
                lines.append(f"  spec: cannot render yet ({exc})")
                return "\n".join(lines)
            decision: Decision | None = self.observer.decide(
                prep, crashed_ok=lock_holder(self.run.pipeline.state_dir) is None
            )
        else:
            decision = decisions.get(name)
        if decision is not None:
            lines.append(f"  decision: {decision.action} - {decision.brief if decision.changes else decision.reason}")
            for change in decision.changes:
                lines.append(f"    {words.change(change)}")
        record = self.run.record(target)
        self._explain_record(lines, record)
        if step.common.for_each is not None and not key:
            try:
                items = self.prep.items(step) or []
            except InputError as exc:
                lines.append(f"  items: cannot render ({exc})")
            else:
                lines.append(f"  items: {len(items)} (`runner explain '{name}[KEY]'` for one)")
                for item in items:
                    rec = self.run.record(f"{name}[{item.key}]")
                    lines.append(f"    {item.key}: {rec.status if rec else 'no record'}")
            return "\n".join(lines)
        if prep is None:
            try:
                prep = self.prep.prepare(step)
            except InputError as exc:
                lines.append(f"  spec: cannot render yet ({exc})")
                return "\n".join(lines)
            if prep is None:
                lines.append(f"  `when` is false: {step.common.when}")
                return "\n".join(lines)
        lines.append(
            f"  fingerprint: {prep.fingerprint[:16]}"
            + (
                ""
                if record is None
                else " (same as recorded)"
                if record.fingerprint == prep.fingerprint
                else f" (recorded: {str(record.fingerprint)[:16]})"
            )
        )
        for dep, value in sorted(prep.upstream.items()):
            old = record.upstream.get(dep) if record else None
            moved = "" if record is None or old == value else " (changed since the record)"
            lines.append(f"    upstream {dep}: {value[:16]}{moved}")
        spec = json.dumps(self.run.masker.mask_data(prep.spec), indent=2, sort_keys=True, default=str)
        lines.append("  spec (rendered):")
        lines += ["    " + line for line in spec.splitlines()]
        if record is not None and record.is_done:
            probe = self.observer.probe(prep)
            lines.append(
                f"  probe: {probe.status}" + (f" - {self.run.masker.mask(probe.reason)}" if probe.reason else "")
            )
        return "\n".join(lines)

    def _explain_record(self, lines: list[str], record: StepRecord | None) -> None:
        if record is None:
            lines.append("  record: none (it has never finished)")
            return
        lines.append(
            f"  record: {record.status or None}, finished {iso(record.finished)}"
            + (f", took {record.duration:.2f}s" if record.duration is not None else "")
            + (f", {record.attempts} attempt(s)" if record.attempts else "")
        )
        if record.error:
            lines.append(f"    last error: {record.error}")
        if record.outputs:
            shown = json.dumps(record.outputs, sort_keys=True, default=str)
            lines.append(f"    outputs: {shown[:400]}{'...' if len(shown) > 400 else ''}")

    def forget(self, name: str) -> bool:
        """Drop a step's record (with its items' and its secrets), or only one item's (`NAME[key]`)."""
        with pipeline_lock(self.run.pipeline.state_dir, notice=self.run.reporter.notice):
            self.run.load_state()
            existed = self.run.state.record(name) is not None or bool(self.run.secrets.get(name))
            items = [] if "[" in name else [n for n in self.run.state.steps if n.startswith(f"{name}[")]
            for item in items:
                self.run.state.replace(item, None)
                self.run.secrets.put(item, None)
            self.run.state.replace(name, None)
            self.run.state.compact()
            self.run.secrets.put(name, None)
            return existed

    def _prepare_through(self, target: str) -> Prepared:
        """Render one step (or `NAME[key]`, one item of it) as a run would reach it: records adopted and env
        steps rendered before it."""
        name, _, key = target.partition("[")
        step = self._reach(name)
        if key:
            return self._prepare_item(step, key[:-1])
        if step.common.for_each is not None:
            raise InputError(f"{name!r} is a for_each step: name one of its items, {name}[KEY]")
        prep = self.prep.prepare(step)
        if prep is None:
            raise InputError(f"step {name!r} is skipped (`when` is false)")
        return prep

    def _reach(self, name: str) -> StepDecl:
        """Adopt the records and render the env steps before `name`, as a run reaches it; its declaration."""
        for other in self.run.graph.order():
            step = self.run.pipeline.step(other)
            self.run.adopt_record(other)
            if other == name:
                return step
            if step.exports_env:
                with contextlib.suppress(InputError):
                    self.prep.prepare(step)
        raise InputError(f"no step named {name!r}")

    def _prepare_item(self, step: StepDecl, key: str) -> Prepared:
        prep = self.prep.prepare(step, item=self.prep.item_named(step, key))
        assert prep is not None
        return prep

    def mark_done(self, target: str) -> str:
        """Accept the live state as done: record the current fingerprint without running the step (every item
        of a for_each step, or the one named `NAME[key]`). Refused, with why, when the next apply would run it
        anyway: a check (an assert is judged on every apply) or a probe that fails now (a missing `creates`)."""
        with pipeline_lock(self.run.pipeline.state_dir, notice=self.run.reporter.notice):
            self.run.load_state()
            name, _, key = target.partition("[")
            step = self.run.pipeline.step(name)
            if not kind_class(step.kind).changes_system:
                raise InputError(
                    f"{name} is an {step.kind} step: it is checked on every apply, so it cannot be marked done; "
                    "fix what it checks, or give it `when:` to skip it"
                )
            if step.common.for_each is not None and not key:
                self._reach(name)
                items = self.prep.items(step)
                if items is None:
                    raise InputError(f"step {name!r} is skipped (`when` is false)")
                preps = [self.prep.prepare(step, item=item) for item in items]
            else:
                preps = [self._prepare_through(target)]
                items = None
            adopted: dict[str, dict[str, Any]] = {}
            for prep in preps:
                assert prep is not None
                try:
                    outputs = prep.instance.adopt(prep.ctx)
                except StepError as exc:
                    raise StepError(f"{prep.key}: not marked done: {self.run.masker.mask(exc.message)}") from None
                if outputs is not None:
                    adopted[prep.key] = outputs
                    continue
                found = self.observer.probe(prep)
                if found.status != "ok":
                    raise StepError(
                        f"{prep.key}: not marked done: {self.run.masker.mask(found.reason) or found.status}; "
                        "the next apply would run it anyway"
                    )
            for prep in preps:
                assert prep is not None
                marked = StepRecord.marked_done(
                    self.run.record(prep.key),
                    kind=prep.step.kind,
                    fingerprint=prep.fingerprint,
                    spec=self.run.masker.mask_data(prep.spec),
                    upstream=prep.upstream,
                    when=now(),
                    run=self.run.run_id,
                    outputs=self._masked(adopted[prep.key]) if prep.key in adopted else None,
                )
                self.run.state.replace(prep.key, marked.to_dict())
            if items is not None:
                kept = [self.run.record(p.key) or StepRecord({}) for p in preps if p is not None]
                self.executor.gather(step, items, kept, True, 0.0)
            self.run.state.compact()
            return f"{len(preps)} item(s)" if items is not None else target

    def _masked(self, outputs: dict[str, Any]) -> dict[str, Any]:
        masked = self.run.masker.mask_data(outputs)
        assert isinstance(masked, dict)
        return masked

    def down(self, purge: bool, dry_run: bool) -> list[tuple[str, str, bool]]:
        """`runner down`: each step's teardown, dependents first (containers removed, detached and Ray jobs
        stopped; with `purge`, clones, venvs and `creates` files removed), then every record dropped (secrets
        and env.sh too), unless a teardown failed. Returns (step, what was done, failed) for each step that had
        something to say, in the order done; with `dry_run` nothing changes and the words say "would"."""
        with pipeline_lock(self.run.pipeline.state_dir, notice=self.run.reporter.notice):
            self.run.load_state()
            preps: list[tuple[str, Prepared | None, str]] = []
            for name in self.run.graph.order():
                step = self.run.pipeline.step(name)
                self.run.adopt_record(name)
                try:
                    if step.common.for_each is not None:
                        for item in self.prep.items(step) or []:
                            preps.append((f"{name}[{item.key}]", self.prep.prepare(step, item=item), ""))
                    else:
                        preps.append((name, self.prep.prepare(step), ""))
                except InputError as exc:
                    preps.append((name, None, f"left as it is: cannot render it ({self.run.masker.mask(str(exc))})"))
            said: list[tuple[str, str, bool]] = []
            for (
                gone
            ) in self.removals.removed():  # steps deleted from the pipeline first: nothing of the pipeline needs them
                if gone.instance is not None and gone.ctx is not None:
                    done = self._teardown(gone.name, gone.instance, gone.ctx, purge, dry_run)
                    said += [(key, f"{text} (removed from the pipeline)", bad) for key, text, bad in done]
            for key, prep, problem in reversed(preps):
                if prep is not None:
                    said += self._teardown(key, prep.instance, prep.ctx, purge, dry_run)
                elif problem:
                    said.append((key, problem, True))
            records = len(self.run.state.steps)
            if any(failed for _, _, failed in said) or dry_run:
                if dry_run and records:
                    said.append(("(state)", f"would drop {records} record(s), the secrets and env.sh", False))
                return said
            for name in list(self.run.state.steps):
                self.run.state.replace(name, None)
                self.run.secrets.put(name, None)
            self.run.state.compact()
            for leftover in ("env.sh", "secrets.json"):
                with contextlib.suppress(FileNotFoundError):
                    (self.run.pipeline.state_dir / leftover).unlink()
            if records:
                said.append(("(state)", f"dropped {records} record(s), the secrets and env.sh", False))
            return said

    def _teardown(
        self, key: str, instance: StepKind[Any], ctx: StepContext, purge: bool, dry_run: bool
    ) -> list[tuple[str, str, bool]]:
        """One step's teardown for `down`, in words: (step, what was done, failed), or nothing to say."""
        try:
            text = instance.teardown(ctx, purge, dry_run)
        except StepError as exc:
            return [(key, self.run.masker.mask(exc.message), True)]
        except OSError as exc:
            return [(key, self.run.masker.mask(f"{exc.strerror or exc} ({exc.filename or ''})"), True)]
        return [(key, self.run.masker.mask(text), False)] if text else []

    def stop(self, name: str) -> str:
        """Stop what a step started (a detached job). Raises StepError when there is nothing to stop."""
        with pipeline_lock(self.run.pipeline.state_dir, notice=self.run.reporter.notice):
            self.run.load_state()
            gone = self.removals.removed_named(name) if name.split("[", 1)[0] not in self.run.graph.names else None
            if gone is not None:
                if gone.instance is None or gone.ctx is None:
                    raise StepError(f"{name} was removed from the pipeline and its record says too little to stop it")
                return self.run.masker.mask(gone.instance.stop(gone.ctx))
            prep = self._prepare_through(name)
            return self.run.masker.mask(prep.instance.stop(prep.ctx))

    def remote_log(self, name: str, follow: bool) -> Iterator[str] | None:
        """The log of what a step started elsewhere (a Ray job), if it has one."""
        self.run.load_state()
        try:
            prep = self._prepare_through(name)
        except InputError:
            return None  # not renderable now: the local log, if any, is what there is to show
        return prep.instance.remote_log(prep.ctx, follow)

    def runs_of(self, name: str) -> list[Path]:
        """The step logs of a step (or of a for_each item, `name[key]`) kept in .runner/logs, newest first."""
        logs = self.run.pipeline.state_dir / "logs"
        if not logs.is_dir():
            return []
        return [p for p in (run / f"{name}.log" for run in sorted(logs.iterdir(), reverse=True)) if p.is_file()]

    def log_of(self, name: str, run: int | None = None) -> Path | None:
        """The log to show for a step: what it started (a job's log), else its last run's step log; with `run`,
        the log of its Nth most recent run (1: the latest) from .runner/logs."""
        runs = self.runs_of(name)
        if run is not None:
            if not 1 <= run <= len(runs):
                raise InputError(f"{name} has {len(runs)} run log(s) kept; --run takes 1 (the latest) to {len(runs)}")
            return runs[run - 1]
        self.run.load_state()
        candidates: list[Path] = []
        with contextlib.suppress(InputError, StepError):
            prep = self._prepare_through(name)
            path = prep.instance.log_file(prep.ctx)
            if path is not None:
                candidates.append(path)
        log = (self.run.record(name) or StepRecord({})).log or None
        if isinstance(log, str) and log:
            candidates.append(Path(log))
        candidates += runs[:1]  # the latest kept run's log, which `--run 1` shows
        return next((p for p in candidates if p.is_file()), candidates[0] if candidates else None)

    def check_item(self, target: str) -> None:
        """`NAME[key]` names an item the step has now, had when it last ran, or kept a log of; InputError (bad
        input, exit 2) with the items it has otherwise."""
        name, _, rest = target.partition("[")
        key = rest[:-1]
        choices = self.item_keys(name)
        if key in choices:
            return
        raise InputError(
            f"step {name!r} has no item {key!r}"
            + (suggest(key, choices) if choices else " (it has no items now, and none has run)")
        )

    def item_keys(self, name: str) -> list[str]:
        """The keys of a for_each step's items: those it has now (rendered, where they can be), those its record
        holds, and those with a kept log."""
        self.run.load_state()  # the records, and the key of the secret items' digests
        known: list[str] = []
        with contextlib.suppress(InputError, StepError):
            step = self._reach(name)
            known += [item.key for item in self.prep.items(step) or []]
        record = self.run.record(name)
        known += list(record.item_keys or []) if record is not None else []
        known += [p.name[len(name) + 1 : -5] for p in self.runs_of_prefix(name)]
        return list(dict.fromkeys(known))

    def item_logs(self, name: str) -> list[tuple[str, Path]]:
        """For `runner logs LOOP`: each item's log (latest kept), in the items' recorded order."""
        record = self.run.record(name)
        keys = record.item_keys if record is not None else None
        if keys is None:
            keys = sorted({p.name[len(name) + 1 : -5] for p in self.runs_of_prefix(name)})
        found = []
        for key in keys:
            path = self.log_of(f"{name}[{key}]")
            if path is not None and path.is_file():
                found.append((f"{name}[{key}]", path))
        return found

    def runs_of_prefix(self, name: str) -> list[Path]:
        logs = self.run.pipeline.state_dir / "logs"
        if not logs.is_dir():
            return []
        return [p for run in logs.iterdir() for p in run.glob(f"{glob_escape(name)}[[]*].log")]

    def exported_env(self) -> dict[str, str]:
        """Every variable the env steps export, rendered with the recorded outputs."""
        self.run.load_state()
        merged: dict[str, str] = {}
        for name in self.run.graph.order():
            step = self.run.pipeline.step(name)
            self.run.adopt_record(name)
            if step.exports_env:
                prep = self.prep.prepare(step)
                if prep is not None:
                    merged.update(self.run.exports[name])
        return merged

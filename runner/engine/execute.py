"""Running one step: its decision (asked of observe), then the run — retries, timeout, cancel — and its record."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runner.engine import deadline
from runner.engine.base import RunState
from runner.engine.prepare import Item, Prepared, Preparer
from runner.engine.walk import Look, Outcome, Walk
from runner.errors import InputError, StateError
from runner.events import Decision, Result, Status
from runner.fingerprint import digest
from runner.model import StepDecl
from runner.record import STARTED, StepRecord
from runner.state import now
from runner.template import RenderError, render_string
from runner.util import faults, sweep
from runner.util.text import is_template
from steps import kind_class
from steps.base import StepError, Unreachable

STATUS_OUTCOME: dict[Status, Outcome] = {
    "ok": "ok",
    "pending": "ok",
    "changed": "changed",
    "failed": "failed",
    "interrupted": "failed",
    "blocked": "blocked",
    "skipped": "skipped",
    "unselected": "unselected",
}


class Executor:
    """Carrying out the walk's decision for one step: retries, timeout, cancel, outputs and its record; a
    for_each step's items. No decision is made here: the walk's stands."""

    def __init__(self, run: RunState, prep: Preparer, walk: Walk) -> None:
        self.run = run
        self.prep = prep
        self.walk = walk

    def run_one(self, name: str, outcomes: Mapping[str, Outcome], log_dir: Path) -> Result:
        started = time.monotonic()
        looked = self.look_at(name, outcomes, log_dir, started)
        if isinstance(looked, Result):
            return looked
        return self.execute(*looked)

    def look_at(
        self, name: str, outcomes: Mapping[str, Outcome], log_dir: Path, started: float
    ) -> Result | tuple[Prepared, Decision, float, Path]:
        """The walk's decision for a step, and its result when it need not run (up to date, skipped, blocked,
        failed to render); else what `_execute` needs. The scheduler calls it in its own thread for steps whose
        looking is local (no network), so a converged step costs no hand-over to a worker."""
        step = self.run.pipeline.step(name)
        looked = self.walk.look(name, outcomes, planning=False)
        decision = looked.decision
        if looked.error is not None and not looked.items:
            return self._render_failed(name, looked.error, started, looked.error_item)
        if decision is None:
            return Result(name, "unselected")
        if decision.action == "block":  # (the walk adopted its record: a held step's outputs are what they were)
            took = time.monotonic() - started
            return self._report(Result(name, "blocked", decision.reason, took, cause=decision.cause))
        if decision.action == "skip":
            return self._report(Result(name, "skipped", decision.reason, cause=decision.cause))
        if step.common.for_each is not None:
            return self._run_each(step, looked, log_dir, started)
        if decision.action in ("ok", "pending"):  # its record's outputs, adopted by the walk, stand
            kept = (self.run.record(name) or StepRecord({})).outputs
            result = Result(
                name, decision.action, decision.reason, time.monotonic() - started, outputs=kept, cause=decision.cause
            )
            self.run.reporter.step_finished(result)
            return result
        assert looked.prep is not None
        return looked.prep, decision, started, log_dir / f"{name}.log"

    def _apply_once(self, prep: Prepared, tag: str) -> dict[str, Any]:
        """One attempt of the kind's apply, within the step's `timeout:` (runner/engine/deadline.py)."""
        timeout = prep.step.common.timeout
        if timeout is None:
            prep.ctx.cancel = self.run.cancel
            return prep.instance.apply(prep.ctx)
        cancel = deadline.StepCancel(self.run.cancel)
        prep.ctx.cancel = cancel
        return deadline.within(lambda: prep.instance.apply(prep.ctx), timeout, cancel, tag, prep.key, self.run.hurry)

    def _render_failed(self, name: str, exc: InputError | StepError, started: float, item: str = "") -> Result:
        prefix = f"item {item}: " if item else ""
        if isinstance(exc, InputError):
            return self._report(Result(name, "failed", error=f"{prefix}{exc}", input_error=True))
        return self._report(self._not_looked_at(name, exc, started, prefix))

    def _not_looked_at(self, name: str, exc: StepError, started: float, prefix: str = "") -> Result:
        interrupted = self.run.cancel.is_set()
        status: Status = "interrupted" if interrupted else "failed"
        message = "interrupted" if interrupted else prefix + self.run.masker.mask(exc.message)
        return Result(name, status, "", time.monotonic() - started, error=message, hint=self.run.masker.mask(exc.hint))

    def _report(self, result: Result) -> Result:
        self.run.reporter.step_finished(result)
        return result

    def _run_each(self, step: StepDecl, looked: Look, log_dir: Path, started: float) -> Result:
        """A for_each step: the walk decided each item; those to run run in order, each recorded on its own;
        then one record for the step whose outputs (`items`, `keys`, `count`) and digest later steps see."""
        name = step.name
        items = looked.all_items or []
        ran = 0
        kept: list[StepRecord] = []
        for (prep, decision), item in zip(looked.items, items, strict=False):
            self.run.reporter.progress(name, item.index, len(items), "items")
            if decision.action not in ("ok", "pending"):
                log_path = log_dir / f"{name}[{item.key}].log"
                outcome = self.execute(prep, decision, time.monotonic(), log_path)
                if outcome.status not in ("ok", "changed"):
                    return Result(
                        name,
                        outcome.status,
                        f"item {item.key} ({item.index + 1} of {len(items)}) did not succeed; "
                        f"{item.index} before it done",
                        time.monotonic() - started,
                        error=f"item {item.key}: {outcome.error}",
                        log=outcome.log,
                        attempts=outcome.attempts,
                    )
                ran += 1
            kept.append(self.run.record(prep.key) or StepRecord({}))
        if looked.error is not None:  # an item that did not render: the ones before it ran
            return self._render_failed(name, looked.error, started, looked.error_item)
        self.run.reporter.progress(name, len(items), len(items), "items")
        self.gather(step, items, kept, ran > 0, time.monotonic() - started)
        keys = [i.key for i in items]
        changes = kind_class(step.kind).changes_system
        duration = time.monotonic() - started
        shown = {"keys": keys, "count": len(items)}
        if ran:
            summary = f"{ran} of {len(items)} items ran"
            result = Result(name, "changed" if changes else "ok", summary, duration, note=summary, outputs=shown)
        else:
            result = Result(name, "ok", f"{len(items)} items up to date", duration, outputs=shown)
        self.run.reporter.step_finished(result)
        return result

    def gather(self, step: StepDecl, items: list[Item], kept: list[StepRecord], ran: bool, duration: float) -> None:
        """A for_each step's own record from its items' (when something moved), the outputs and digest later
        steps see, and the records of items no longer in the list dropped."""
        name = step.name
        outputs = [{**r.outputs, **self.run.secrets.get(f"{name}[{i.key}]")} for r, i in zip(kept, items, strict=True)]
        keys = [i.key for i in items]
        output_digest = digest({"items": [r.recorded_output_digest for r in kept], "keys": keys})
        self.run.outputs[name] = {"items": outputs, "keys": keys, "count": len(items)}
        self.run.digests[name] = output_digest
        previous = self.run.record(name)
        if ran or previous is None or previous.output_digest != output_digest or not previous.is_done:
            masked = self.run.masker.mask_data({"items": [r.outputs for r in kept], "keys": keys, "count": len(items)})
            assert isinstance(masked, dict)
            record = StepRecord.loop_done(
                kind=step.kind,
                keys=keys,
                items=kept,
                outputs=masked,
                output_digest=output_digest,
                finished=now(),
                duration=duration,
                run=self.run.run_id,
            )
            self.run.state.replace(name, record.to_dict())
        current = {f"{name}[{k}]" for k in keys}
        for stale in [n for n in self.run.state.steps if n.startswith(f"{name}[") and n not in current]:
            self.run.state.replace(stale, None)  # an item no longer in the list
            self.run.secrets.put(stale, None)

    def _hint(self, prep: Prepared, own: str) -> str:
        """The kind's hint, then the step's `hint:` (rendered; as written if it cannot be)."""
        extra = prep.step.common.hint or ""
        if extra and is_template(extra):
            with contextlib.suppress(RenderError):
                extra = render_string(extra, self.prep.context(prep.step, self.prep.exported_before(prep.step)))
        return self.run.masker.mask("\n".join(h for h in (own, extra) if h))

    def _stop_left_running(self, name: str, tag: str, crashed: bool = False, prep: Prepared | None = None) -> None:
        """Stop what a failed, timed-out or interrupted run of the step left running outside its process group
        (setsid, double forks), and say so; `crashed`: what the run that died inside the step left. A step on
        another machine (`host:`) is swept there too, by the same tag."""
        if not sweep.GUARDIAN.holds(tag) and not crashed:
            return  # it started no process
        left: list[sweep.Leftover] = []
        host = prep.instance.remote_host(prep.ctx) if prep is not None else None
        if host:
            from steps._support.machine import machine_for  # ssh's code, only for a step on another machine

            there = machine_for(host)
            left += [sweep.Leftover(pid, f"{command} ({there.where.strip()})") for pid, command in there.sweep(tag)]
        left += sweep.stop([tag])
        sweep.GUARDIAN.release(tag)
        if not left:
            return
        count, shown = sweep.describe(left, self.run.masker.mask)
        if crashed:
            what = f"the run that stopped inside this step had left {count} running"
            self.run.reporter.notice(f"{name}: {what}; stopped them before running it again: {shown}")
        else:
            self.run.reporter.notice(f"{name}: stopped {count} it had left running: {shown}")

    def execute(self, prep: Prepared, decision: Decision, started: float, log_path: Path) -> Result:
        name = prep.key
        if decision.action == "fail":  # not looked at (its machine did not answer): nothing runs, nothing recorded
            data = decision.cause.data
            error = f"{data.get('problem', decision.reason)} (nothing ran; its record is kept)"
            hint = str(data.get("hint") or "")
            took = time.monotonic() - started
            return self._report(Result(name, "failed", "", took, error=error, hint=hint, cause=decision.cause))
        common = prep.step.common
        log_path.parent.mkdir(parents=True, exist_ok=True)
        prep.ctx.log_path = log_path
        if prep.instance.changes_system:
            self.run.reporter.step_started(name, decision.reason)
        prep.ctx.progress = lambda done, total, unit: self.run.reporter.progress(name, done, total, unit)
        if self.run.options.verbose or prep.instance.streams_output():
            prep.ctx.on_output = lambda line: self.run.reporter.output(name, line)
        else:
            prep.ctx.on_output = lambda line: self.run.reporter.output_quiet(name, line)
        prep.ctx.on_transient = lambda line: self.run.reporter.output_quiet(name, line)
        previous = self.run.record(name)
        if previous is not None and previous.status == STARTED and previous.run:
            crashed_tag = sweep.step_tag(str(self.run.pipeline.state_dir), previous.run, name)
            self._stop_left_running(name, crashed_tag, crashed=True, prep=prep)
        tag = sweep.step_tag(str(self.run.pipeline.state_dir), self.run.run_id, name)
        prep.ctx.process_tag = tag
        begin = now()
        begun = StepRecord.starting(previous, begin, self.run.run_id, os.getpid(), str(log_path))
        try:
            self.run.state.replace(name, begun.to_dict())
        except StateError as exc:  # a full disk, say: the step gets its verdict line before the run ends on it
            self._report(Result(name, "failed", error=f"its start could not be recorded, so it did not run: {exc}"))
            raise
        faults.point("started")
        attempts = 0

        def before_retry(attempt: int, exc: BaseException | None) -> None:
            self._stop_left_running(name, tag, prep=prep)
            message = exc.message if isinstance(exc, StepError) else str(exc)
            self.run.reporter.notice(
                f"{name}: attempt {attempt} of {common.retries + 1} failed: "
                f"{self.run.masker.mask(message)}; retrying in {common.retry_delay:g}s"
            )

        from tenacity import retry_if_exception_type, wait_fixed  # only when a step runs: not on a converged run

        from runner.util.retry import retrying

        retries = retrying(
            attempts=common.retries + 1,
            wait=wait_fixed(common.retry_delay),
            retry=retry_if_exception_type(StepError),
            cancel=self.run.cancel,
            interrupted=_Cancelled,
            before_retry=before_retry,
        )
        try:
            for attempt in retries:
                with attempt:
                    attempts += 1
                    if self.run.cancel.is_set():
                        raise _Cancelled()
                    outputs = self._apply_once(prep, tag)
        except (StepError, _Cancelled) as exc:
            self._stop_left_running(name, tag, prep=prep)
            duration = time.monotonic() - started
            interrupted = self.run.cancel.is_set()
            message = self.run.masker.mask(exc.message if isinstance(exc, StepError) else "interrupted")
            if interrupted:
                message = "interrupted"
            if isinstance(exc, Unreachable) and not interrupted:
                # its machine stopped answering: what the step is there is not known, so its record stays as it
                # was (the next apply looks again) instead of a failure that would make it run again
                self.run.state.replace(name, previous.to_dict() if previous is not None else None)
                message += " (its record is kept)"
            else:
                self.run.state.replace(name, begun.ended(interrupted, now(), duration, attempts, message).to_dict())
            result = Result(
                name,
                "interrupted" if interrupted else "failed",
                decision.reason,
                duration,
                error=message,
                hint=self._hint(prep, exc.hint if isinstance(exc, StepError) and not interrupted else ""),
                tail=self.run.masker.mask(exc.output_tail) if isinstance(exc, StepError) else "",
                log=str(log_path) if log_path.exists() else "",
                attempts=attempts,
                cause=decision.cause,
            )
            self.run.reporter.step_finished(result)
            return result
        except Exception as exc:  # a bug in a kind: record it, do not lose the run
            self._stop_left_running(name, tag, prep=prep)
            duration = time.monotonic() - started
            if isinstance(exc, OSError) and exc.strerror:  # the system said no (a full disk, a permission)
                where = f" ({exc.filename})" if exc.filename else ""
                message = self.run.masker.mask(f"{exc.strerror}{where}")
            else:
                message = self.run.masker.mask(
                    f"internal error in the {prep.step.kind} step: {type(exc).__name__}: {exc}"
                )
            self.run.state.replace(name, begun.ended(False, now(), duration, attempts, message).to_dict())
            result = Result(
                name,
                "failed",
                decision.reason,
                duration,
                error=message,
                log=str(log_path),
                attempts=attempts,
                cause=decision.cause,
            )
            self.run.reporter.step_finished(result)
            if self.run.options.verbose:
                raise
            return result
        sweep.GUARDIAN.release(tag)  # a step that ended well keeps what it left running in a session of its own
        faults.point("applied")
        duration = time.monotonic() - started
        secret_keys = prep.instance.secret_outputs()
        kept = {k: str(v) for k, v in outputs.items() if k in secret_keys}
        for value in kept.values():
            self.run.masker.add(value)
        self.run.secrets.put(name, kept)
        masked_outputs = self.run.masker.mask_data(outputs)
        assert isinstance(masked_outputs, dict)
        output_digest = digest({"fingerprint": prep.fingerprint, "outputs": outputs})
        if name == prep.step.name:  # an item's outputs reach later steps through its step's `items`
            self.run.replaced[name] = self.run.outputs.get(name, {})
            self.run.outputs[name] = dict(outputs)
            self.run.digests[name] = output_digest
        done = StepRecord.done(
            kind=prep.step.kind,
            fingerprint=prep.fingerprint,
            spec=self.run.masker.mask_data(prep.spec),
            upstream=prep.upstream,
            outputs=masked_outputs,
            output_digest=output_digest,
            started=begin,
            finished=now(),
            duration=duration,
            attempts=attempts,
            run=self.run.run_id,
            reason=decision.reason,
            log=str(log_path) if log_path.exists() else "",
        )
        self.run.state.replace(name, done.to_dict())
        status: Status = "changed" if prep.instance.changes_system and prep.ctx.changed else "ok"
        shown = {k: v for k, v in masked_outputs.items() if k not in secret_keys}
        # a check that ran and passed says so, not just why it ran; a run that found nothing to do, too
        if not prep.instance.changes_system:
            reason = f"checked, passed ({decision.reason})"
        elif not prep.ctx.changed:
            reason = f"{decision.reason}: nothing to change"
        else:
            reason = decision.reason
        note = self.run.masker.mask(prep.instance.note(shown)) if shown else ""
        result = Result(
            name,
            status,
            reason,
            duration,
            log=str(log_path),
            attempts=attempts,
            outputs=shown,
            note=note,
            cause=decision.cause,
        )
        self.run.reporter.step_finished(result)
        return result


class _Cancelled(Exception):
    message = "interrupted"

"""plan(): probe every step and decide, with reasons. apply(): run what is needed, journaling each step.

The engine knows steps only through the contract in steps/base.py; kinds come from the registry.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import ValidationError
from tenacity import retry_if_exception_type, wait_fixed

from runner.decide import decide, to_observe
from runner.errors import InputError
from runner.events import Decision, Reporter, Result, Status
from runner.fingerprint import digest, spec_changes, step_fingerprint
from runner.load import validation_errors
from runner.model import Pipeline, StepDecl
from runner.record import StepRecord
from runner.secrets import Masker, SecretStore
from runner.state import StateStore, check_writable, iso, lock_holder, now, pipeline_lock
from runner.template import Facts, Outputs, RenderError, render_data, render_string, render_value, when_source
from steps import kind_class
from steps._support import faults
from steps._support.retry import retrying
from steps._support.words import FALSE_WORDS, TRUE_WORDS
from steps.base import Probe, StepContext, StepError, StepKind

KEPT_RUNS = 20
ITEM_KEY = re.compile(r"[A-Za-z0-9_.:@+-]{1,64}")


@dataclass
class Options:
    only: list[str] = field(default_factory=list)
    from_step: str | None = None
    force: set[str] = field(default_factory=set)
    jobs: int = 1
    keep_going: bool = False
    verbose: bool = False


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived during apply."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class Prepared:
    """A step rendered for this run: its kind instance, context and fingerprint."""

    step: StepDecl
    instance: StepKind
    ctx: StepContext
    spec: dict[str, Any]
    fingerprint: str
    upstream: dict[str, str]
    record: str = ""  # where its record lives: the step's name, or `name[key]` for an item of for_each

    def __post_init__(self) -> None:
        self.record = self.record or self.step.name


@dataclass
class Item:
    """One item of a for_each step."""

    key: str
    value: Any
    index: int


class Engine:
    def __init__(self, pipeline: Pipeline, reporter: Reporter, options: Options | None = None) -> None:
        self.pipeline = pipeline
        self.reporter = reporter
        self.options = options or Options()
        self.state = StateStore(pipeline.state_dir)
        self.secrets = SecretStore(pipeline.state_dir)
        self.masker = Masker()
        for name in pipeline.secrets:
            self.masker.add(str(pipeline.vars[name]))
        self.facts = Facts()
        self.outputs: dict[str, dict[str, Any]] = {}
        self.digests: dict[str, str] = {}
        self.exports: dict[str, dict[str, str]] = {}
        self.cancel = threading.Event()
        self.run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        self.graph = pipeline.graph
        self._check_names()

    def load_state(self) -> None:
        """Read state.json and the secrets file; every kept secret is masked from here on."""
        self.state.load()
        self.secrets.load()
        for value in self.secrets.values():
            self.masker.add(value)

    # ---- selection ------------------------------------------------------------------------------------

    def _check_names(self) -> None:
        known = set(self.graph.names)
        wanted = [*self.options.only, *self.options.force]
        if self.options.from_step:
            wanted.append(self.options.from_step)
        for name in wanted:
            if name not in known:
                from runner.load import suggest

                raise InputError(f"no step named {name!r}" + suggest(name, list(known)))

    def selected(self) -> set[str]:
        """The steps this run may execute: `--only` (with what they need) and `--from` (it and what follows)."""
        names = set(self.graph.names)
        if self.options.only:
            names = self.graph.upstream(set(self.options.only))
        if self.options.from_step:
            start = self.pipeline.step(self.options.from_step).index
            names &= {s.name for s in self.pipeline.steps if s.index >= start}
        return names

    # ---- rendering ------------------------------------------------------------------------------------

    def _exported_before(self, step: StepDecl) -> dict[str, str]:
        merged: dict[str, str] = {}
        for other in self.pipeline.steps[: step.index]:
            if other.name in self.exports:
                merged.update(self.exports[other.name])
        return merged

    def _context(self, step: StepDecl, exported: dict[str, str], item: Item | None = None) -> dict[str, Any]:
        context: dict[str, Any] = {
            "vars": self.pipeline.vars,
            "env": {**os.environ, **exported},
            "facts": self.facts,
            "steps": {name: Outputs(name, self.outputs[name]) for name in step.refs if name in self.outputs},
        }
        if item is not None:
            context["item"] = item.value
            context["item_index"] = item.index
        return context

    def _render_error(self, step: StepDecl, exc: RenderError) -> InputError:
        path = ("steps", step.index, *exc.path)
        field = f"steps[{step.index}] ({step.name})." + ".".join(str(p) for p in exc.path)
        return self.pipeline.marks.error(path, self.masker.mask(exc.message), field=field)

    def when_holds(self, step: StepDecl, context: dict[str, Any]) -> bool:
        when = step.common.when
        if when is None:
            return True
        if isinstance(when, bool):
            return when
        try:
            text = render_string(when_source(when), context, ("when",))
        except RenderError as exc:
            raise self._render_error(step, exc) from None
        word = text.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise self._render_error(step, RenderError(f"`when` rendered to {text!r}, not true or false", ("when",)))

    def items(self, step: StepDecl) -> list[Item] | None:
        """The items of a for_each step, rendered; None when its `when` is false."""
        exported = self._exported_before(step)
        context = self._context(step, exported)
        if not self.when_holds(step, context):
            return None
        try:
            value = render_value(step.common.for_each, context, ("for_each",))
        except RenderError as exc:
            raise self._render_error(step, exc) from None
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    value = json.loads(text)
                except ValueError:
                    raise self._render_error(
                        step, RenderError(f"for_each rendered to {text[:80]!r}, which is not a JSON list", ())
                    ) from None
            else:
                value = [part.strip() for part in text.split(",") if part.strip()]
        if isinstance(value, dict):
            value = [{"key": k, "value": v} for k, v in value.items()]
        if not isinstance(value, (list, tuple)):
            raise self._render_error(
                step, RenderError(f"for_each must give a list, not {type(value).__name__}", ("for_each",))
            )
        items: list[Item] = []
        seen: dict[str, int] = {}
        for index, entry in enumerate(value):
            key = item_key(entry)
            if key in seen:
                raise self._render_error(
                    step, RenderError(f"for_each has item {key!r} twice (at {seen[key]} and {index})", ("for_each",))
                )
            seen[key] = index
            items.append(Item(key, entry, index))
        return items

    def prepare(self, step: StepDecl, log_path: Path | None = None, item: Item | None = None) -> Prepared | None:
        """Render a step (or one item of it); None when its `when` is false. Raises InputError for template
        and spec errors."""
        exported = self._exported_before(step)
        context = self._context(step, exported, item)
        if item is None and not self.when_holds(step, context):
            return None
        record_name = f"{step.name}[{item.key}]" if item is not None else step.name
        try:
            rendered = render_data(step.raw, context, (step.kind,))
        except RenderError as exc:
            raise self._render_error(step, exc) from None
        cls = kind_class(step.kind)
        try:
            spec = cls.Spec.model_validate(rendered)
        except ValidationError as exc:
            errors = validation_errors(exc, ("steps", step.index, step.kind), cls.Spec, self.pipeline.marks, rendered)
            err = errors[0]
            err.message = self.masker.mask(err.message) + " (after rendering templates)"
            raise err from None
        instance = cls(spec)
        if cls.exports_env:
            self.exports[step.name] = instance.exports()
        ctx = StepContext(
            name=record_name,
            pipeline_dir=self.pipeline.dir,
            state_dir=self.pipeline.state_dir,
            env={**os.environ, **exported},
            exported=exported,
            timeout=step.common.timeout,
            log_path=log_path,
            record_outputs=(self.record(record_name) or StepRecord({})).outputs,
            cancel=self.cancel,
            mask=self.masker.mask,
            stored_secrets=self.secrets.get(record_name),
            notice=self.reporter.notice,
        )
        dumped = spec.model_dump(mode="json")
        spec_data = (
            {k: v for k, v in dumped.items() if k not in cls.cosmetic_fields} if isinstance(dumped, dict) else dumped
        )
        upstream = {dep: self.digests.get(dep, "none") for dep in self.graph.deps[step.name]}
        extra = instance.fingerprint_extra(ctx)
        fingerprint = step_fingerprint(step.kind, spec_data, extra, upstream)
        ctx.fingerprint = fingerprint
        return Prepared(step, instance, ctx, spec_data, fingerprint, upstream, record_name)

    # ---- deciding -------------------------------------------------------------------------------------

    def decide(self, prep: Prepared, crashed_ok: bool) -> Decision:
        """Look at what runner.decide asks for (the record always; the changes or the probe), then decide."""
        record = self.record(prep.record)
        forced = prep.step.name in self.options.force
        changes: list[str] = []
        live: str | None = None
        probe: Probe | None = None
        looking = to_observe(record, prep.fingerprint, forced)
        if looking == "changes" and record is not None:
            changes = self._changes(prep, record)
            live = self._live_work(prep)
        elif looking == "probe":
            found = self._probe(prep)
            probe = Probe(found.status, self.masker.mask(found.reason), found.changes)
        return decide(
            prep.record,
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

    def record(self, name: str) -> StepRecord | None:
        return StepRecord.of(self.state.record(name))

    def _changes(self, prep: Prepared, record: StepRecord) -> list[str]:
        """The spec's field-level changes since the record, in the kind's own terms where it has them."""
        changes = spec_changes(record.spec, self.masker.mask_data(prep.spec))
        if changes and record.spec is not None:
            try:
                changes = [self.masker.mask(c) for c in prep.instance.describe_changes(prep.ctx, record.spec, changes)]
            except (StepError, OSError):
                pass
        return changes

    def _live_work(self, prep: Prepared) -> str | None:
        try:
            live = prep.instance.live_work(prep.ctx)
        except (StepError, OSError):
            return None
        return self.masker.mask(live) if live else None

    def _plan_each(self, step: StepDecl, crashed_ok: bool, pending_up: list[str], failing_up: list[str]) -> Decision:
        name = step.name
        items = self.items(step)
        if items is None:
            return Decision(name, "skip", f"`when` is false: {step.common.when}")
        if pending_up:
            return Decision(name, "maybe", _after(pending_up, failing_up) + f" ({len(items)} items)")
        to_run: list[str] = []
        changes: list[str] = []
        for item in items:
            prep = self.prepare(step, item=item)
            assert prep is not None
            decision = self.decide(prep, crashed_ok)
            if decision.action not in ("ok", "pending"):
                to_run.append(f"{item.key} ({decision.reason})")
                changes += [f"[{item.key}] {c}" for c in decision.changes]
        if not to_run:
            return Decision(name, "ok", f"{len(items)} items up to date")
        shown = "; ".join(to_run[:3]) + (f"; and {len(to_run) - 3} more" if len(to_run) > 3 else "")
        return Decision(name, "run", f"{len(to_run)} of {len(items)} items to run: {shown}", changes)

    def _preview(self, prep: Prepared) -> str | None:
        try:
            problem = prep.instance.preview(prep.ctx)
        except (StepError, OSError):
            return None
        return self.masker.mask(problem) if problem else None

    def _probe(self, prep: Prepared) -> Probe:
        try:
            return prep.instance.probe(prep.ctx)
        except StepError as exc:
            return Probe.missing(f"probe failed: {exc.message}")
        except OSError as exc:
            return Probe.missing(f"probe failed: {exc}")

    def _adopt_record(self, name: str) -> None:
        record = self.record(name) or StepRecord({})
        self.outputs[name] = {**record.outputs, **self.secrets.get(name)}
        self.digests[name] = record.output_digest

    # ---- plan -----------------------------------------------------------------------------------------

    def plan(self) -> list[Decision]:
        self.load_state()
        holder = lock_holder(self.pipeline.state_dir)
        selected = self.selected()
        decisions: dict[str, Decision] = {}
        failing_roots: dict[str, list[str]] = {}  # a blocked step -> the failing steps it waits on
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
                reason = f"blocked: {', '.join(roots)} would fail" + (f" (via {', '.join(via)})" if via else "")
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
                except InputError as exc:
                    if not pending_up:
                        raise exc
                    decisions[name] = Decision(name, "maybe", _after(pending_up, failing_up))
                continue
            try:
                prep = self.prepare(step)
            except InputError as exc:
                if pending_up:
                    decisions[name] = Decision(name, "maybe", _after(pending_up, failing_up))
                    continue
                raise exc
            if prep is None:
                decisions[name] = Decision(name, "skip", f"`when` is false: {step.common.when}")
                continue
            decision = self.decide(prep, crashed_ok=holder is None)
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

    # ---- apply ----------------------------------------------------------------------------------------

    def apply(self) -> list[Result]:
        with pipeline_lock(self.pipeline.state_dir, notice=self.reporter.notice):
            self.load_state()
            check_writable(self.pipeline.state_dir)
            log_dir = self.pipeline.state_dir / "logs" / self.run_id
            self._prune_logs()
            try:
                with _signals_raise():
                    return self._schedule(log_dir)
            finally:
                self.state.compact()  # state.json alone holds the whole state once apply ends

    def _prune_logs(self) -> None:
        logs = self.pipeline.state_dir / "logs"
        if not logs.is_dir():
            return
        runs = sorted(p for p in logs.iterdir() if p.is_dir())
        for old in runs[: max(0, len(runs) - KEPT_RUNS + 1)]:
            shutil.rmtree(old, ignore_errors=True)

    def _schedule(self, log_dir: Path) -> list[Result]:
        order = self.graph.order()
        index = {n: i for i, n in enumerate(order)}
        selected = self.selected()
        remaining = {n: len(self.graph.after[n]) for n in order}
        ready = [index[n] for n in order if remaining[n] == 0]
        heapq.heapify(ready)
        results: dict[str, Result] = {}
        running: dict[Future[Result], str] = {}
        stop = False
        jobs = max(1, self.options.jobs)

        def finish(name: str, result: Result) -> None:
            results[name] = result
            for child in self.graph.dependents[name]:
                remaining[child] -= 1
                if remaining[child] == 0:
                    heapq.heappush(ready, index[child])

        executor = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="step")
        try:
            while ready or running:
                while ready and len(running) < jobs and not stop:
                    name = order[heapq.heappop(ready)]
                    blocked_by = [
                        d for d in self.graph.after[name] if results[d].status in ("failed", "blocked", "interrupted")
                    ]
                    if blocked_by:
                        result = Result(name, "blocked", f"waits on {', '.join(blocked_by)}, which did not succeed")
                        if name in selected:
                            self.reporter.step_finished(result)
                        finish(name, result)
                        continue
                    if name not in selected:
                        finish(name, self._unselected(name))
                        continue
                    running[executor.submit(self._run_one, name, log_dir)] = name
                if not running:
                    break
                done, _ = wait(list(running), timeout=0.2, return_when=FIRST_COMPLETED)
                for fut in done:
                    name = running.pop(fut)
                    result = fut.result()
                    finish(name, result)
                    if result.status in ("failed", "interrupted") and not self.options.keep_going:
                        stop = True
        except Interrupted:
            self.cancel.set()
            for fut, name in list(running.items()):
                try:
                    result = fut.result()
                except Exception as exc:  # noqa: BLE001 - reported, not raised
                    result = Result(name, "interrupted", error=str(exc))
                results[name] = result
            raise
        finally:
            executor.shutdown(wait=True)
        # Steps never reached (after a failure without --keep-going).
        for name in order:
            if name not in results and name in selected:
                results[name] = Result(name, "blocked", "not started: an earlier step failed")
        return [results[n] for n in order if n in results and results[n].status != "unselected"]

    def _unselected(self, name: str) -> Result:
        step = self.pipeline.step(name)
        self._adopt_record(name)
        if step.exports_env:
            with contextlib.suppress(InputError):
                self.prepare(step)
        return Result(name, "unselected")

    def _run_one(self, name: str, log_dir: Path) -> Result:
        step = self.pipeline.step(name)
        started = time.monotonic()
        if step.common.for_each is not None:
            return self._run_each(step, log_dir, started)
        log_path = log_dir / f"{name}.log"
        try:
            prep = self.prepare(step, log_path)
        except InputError as exc:
            return self._report(Result(name, "failed", error=str(exc), input_error=True))
        if prep is None:
            return self._skipped(step)
        decision = self.decide(prep, crashed_ok=True)
        if decision.action in ("ok", "pending"):
            self._adopt_record(name)
            kept = (self.record(name) or StepRecord({})).outputs
            result = Result(name, decision.action, decision.reason, time.monotonic() - started, outputs=kept)
            self.reporter.step_finished(result)
            return result
        return self._execute(prep, decision, started, log_path)

    def _report(self, result: Result) -> Result:
        self.reporter.step_finished(result)
        return result

    def _skipped(self, step: StepDecl) -> Result:
        self._adopt_record(step.name)
        self.digests[step.name] = "skipped"
        return self._report(Result(step.name, "skipped", f"`when` is false: {step.common.when}"))

    def _run_each(self, step: StepDecl, log_dir: Path, started: float) -> Result:
        """A for_each step: its items in order, each decided and recorded on its own; then one record for the
        step whose outputs (`items`, `keys`, `count`) and digest later steps see."""
        name = step.name
        try:
            items = self.items(step)
        except InputError as exc:
            return self._report(Result(name, "failed", error=str(exc), input_error=True))
        if items is None:
            return self._skipped(step)
        ran = 0
        kept: list[StepRecord] = []
        for item in items:
            self.reporter.progress(name, item.index, len(items), "items")
            log_path = log_dir / f"{name}[{item.key}].log"
            try:
                prep = self.prepare(step, log_path, item)
            except InputError as exc:
                return self._report(Result(name, "failed", error=f"item {item.key}: {exc}", input_error=True))
            assert prep is not None
            decision = self.decide(prep, crashed_ok=True)
            if decision.action not in ("ok", "pending"):
                outcome = self._execute(prep, decision, time.monotonic(), log_path)
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
            kept.append(self.record(prep.record) or StepRecord({}))
        self.reporter.progress(name, len(items), len(items), "items")
        outputs = [{**r.outputs, **self.secrets.get(f"{name}[{i.key}]")} for r, i in zip(kept, items, strict=True)]
        keys = [i.key for i in items]
        aggregate = {"items": outputs, "keys": keys, "count": len(items)}
        output_digest = digest({"items": [r.recorded_output_digest for r in kept], "keys": keys})
        self.outputs[name] = aggregate
        self.digests[name] = output_digest
        previous = self.record(name)
        if ran or previous is None or previous.output_digest != output_digest or not previous.is_done:
            masked = self.masker.mask_data({"items": [r.outputs for r in kept], "keys": keys, "count": len(items)})
            assert isinstance(masked, dict)
            record = StepRecord.loop_done(
                kind=step.kind,
                keys=keys,
                items=kept,
                outputs=masked,
                output_digest=output_digest,
                finished=now(),
                duration=time.monotonic() - started,
                run=self.run_id,
            )
            self.state.replace(name, record.to_dict())
        current = {f"{name}[{k}]" for k in keys}
        for stale in [n for n in self.state.steps if n.startswith(f"{name}[") and n not in current]:
            self.state.replace(stale, None)  # an item no longer in the list
            self.secrets.put(stale, None)
        changes = kind_class(step.kind).changes_system
        duration = time.monotonic() - started
        shown = {"keys": keys, "count": len(items)}
        if ran:
            summary = f"{ran} of {len(items)} items ran"
            result = Result(name, "changed" if changes else "ok", summary, duration, note=summary, outputs=shown)
        else:
            result = Result(name, "ok", f"{len(items)} items up to date", duration, outputs=shown)
        self.reporter.step_finished(result)
        return result

    def _execute(self, prep: Prepared, decision: Decision, started: float, log_path: Path) -> Result:
        name = prep.record
        common = prep.step.common
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if prep.instance.changes_system:
            self.reporter.step_started(name, decision.reason)
        prep.ctx.progress = lambda done, total, unit: self.reporter.progress(name, done, total, unit)
        if self.options.verbose or prep.instance.streams_output():
            prep.ctx.on_output = lambda line: self.reporter.output(name, line)
        else:
            prep.ctx.on_output = lambda line: self.reporter.output_quiet(name, line)
        begin = now()
        begun = StepRecord.starting(self.record(name), begin, self.run_id, os.getpid(), str(log_path))
        self.state.replace(name, begun.to_dict())
        faults.point("started")
        attempts = 0

        def before_retry(attempt: int, exc: BaseException | None) -> None:
            message = exc.message if isinstance(exc, StepError) else str(exc)
            self.reporter.notice(
                f"{name}: attempt {attempt} of {common.retries + 1} failed: "
                f"{self.masker.mask(message)}; retrying in {common.retry_delay:g}s"
            )

        retries = retrying(
            attempts=common.retries + 1,
            wait=wait_fixed(common.retry_delay),
            retry=retry_if_exception_type(StepError),
            cancel=self.cancel,
            interrupted=_Cancelled,
            before_retry=before_retry,
        )
        try:
            for attempt in retries:
                with attempt:
                    attempts += 1
                    if self.cancel.is_set():
                        raise _Cancelled()
                    outputs = prep.instance.apply(prep.ctx)
        except (StepError, _Cancelled) as exc:
            duration = time.monotonic() - started
            interrupted = self.cancel.is_set()
            message = self.masker.mask(exc.message if isinstance(exc, StepError) else "interrupted")
            if interrupted:
                message = "interrupted"
            self.state.replace(name, begun.ended(interrupted, now(), duration, attempts, message).to_dict())
            result = Result(
                name,
                "interrupted" if interrupted else "failed",
                decision.reason,
                duration,
                error=message,
                hint=self.masker.mask(exc.hint) if isinstance(exc, StepError) else "",
                tail=self.masker.mask(exc.output_tail) if isinstance(exc, StepError) else "",
                log=str(log_path) if log_path.exists() else "",
                attempts=attempts,
            )
            self.reporter.step_finished(result)
            return result
        except Exception as exc:  # a bug in a kind: record it, do not lose the run
            duration = time.monotonic() - started
            if isinstance(exc, OSError) and exc.strerror:  # the system said no (a full disk, a permission)
                where = f" ({exc.filename})" if exc.filename else ""
                message = self.masker.mask(f"{exc.strerror}{where}")
            else:
                message = self.masker.mask(f"internal error in the {prep.step.kind} step: {type(exc).__name__}: {exc}")
            self.state.replace(name, begun.ended(False, now(), duration, attempts, message).to_dict())
            result = Result(
                name, "failed", decision.reason, duration, error=message, log=str(log_path), attempts=attempts
            )
            self.reporter.step_finished(result)
            if self.options.verbose:
                raise
            return result
        faults.point("applied")
        duration = time.monotonic() - started
        secret_keys = prep.instance.secret_outputs()
        kept = {k: str(v) for k, v in outputs.items() if k in secret_keys}
        for value in kept.values():
            self.masker.add(value)
        self.secrets.put(name, kept)
        masked_outputs = self.masker.mask_data(outputs)
        assert isinstance(masked_outputs, dict)
        output_digest = digest({"fingerprint": prep.fingerprint, "outputs": outputs})
        if name == prep.step.name:  # an item's outputs reach later steps through its step's `items`
            self.outputs[name] = dict(outputs)
            self.digests[name] = output_digest
        done = StepRecord.done(
            kind=prep.step.kind,
            fingerprint=prep.fingerprint,
            spec=self.masker.mask_data(prep.spec),
            upstream=prep.upstream,
            outputs=masked_outputs,
            output_digest=output_digest,
            started=begin,
            finished=now(),
            duration=duration,
            attempts=attempts,
            run=self.run_id,
            reason=decision.reason,
            log=str(log_path) if log_path.exists() else "",
        )
        self.state.replace(name, done.to_dict())
        status: Status = "changed" if prep.instance.changes_system else "ok"
        shown = {k: v for k, v in masked_outputs.items() if k not in secret_keys}
        # a check that ran and passed says so, not just why it ran
        reason = decision.reason if prep.instance.changes_system else f"checked, passed ({decision.reason})"
        note = self.masker.mask(prep.instance.note(shown)) if shown else ""
        result = Result(name, status, reason, duration, log=str(log_path), attempts=attempts, outputs=shown, note=note)
        self.reporter.step_finished(result)
        return result

    def explain(self, name: str) -> str:
        """One step's full reasoning, as plan would reach it: what it is, what it depends on, its rendered
        spec, its record, and the decision with its reason (like `doit info`)."""
        decisions = {d.name: d for d in self.plan()}
        step = self.pipeline.step(name)
        lines = [f"step {name} ({step.kind}), steps[{step.index}] of {self.pipeline.file}"]
        if step.common.description:
            lines.append(f"  description: {step.common.description}")
        deps = sorted(self.graph.deps[name], key=lambda n: self.pipeline.step(n).index)
        lines.append(f"  depends on: {', '.join(deps) if deps else 'nothing'}")
        dependents = sorted(self.graph.dependents[name], key=lambda n: self.pipeline.step(n).index)
        lines.append(f"  needed by: {', '.join(dependents) if dependents else 'nothing'}")
        decision = decisions.get(name)
        if decision is not None:
            lines.append(f"  decision: {decision.action} - {decision.reason}")
            for change in decision.changes:
                lines.append(f"    {change}")
        record = self.record(name)
        if record is None:
            lines.append("  record: none (it has never finished)")
        else:
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
        if step.common.for_each is not None:
            try:
                items = self.items(step) or []
            except InputError as exc:
                lines.append(f"  items: cannot render ({exc})")
            else:
                lines.append(f"  items: {len(items)}")
                for item in items:
                    rec = self.record(f"{name}[{item.key}]")
                    lines.append(f"    {item.key}: {rec.status if rec else 'no record'}")
            return "\n".join(lines)
        try:
            prep = self.prepare(step)
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
        spec = json.dumps(self.masker.mask_data(prep.spec), indent=2, sort_keys=True, default=str)
        lines.append("  spec (rendered):")
        lines += ["    " + line for line in spec.splitlines()]
        if record is not None and record.is_done:
            probe = self._probe(prep)
            lines.append(f"  probe: {probe.status}" + (f" - {self.masker.mask(probe.reason)}" if probe.reason else ""))
        return "\n".join(lines)

    # ---- record edits ---------------------------------------------------------------------------------

    def forget(self, name: str) -> bool:
        with pipeline_lock(self.pipeline.state_dir, notice=self.reporter.notice):
            self.load_state()
            existed = self.state.record(name) is not None or bool(self.secrets.get(name))
            for item in [n for n in self.state.steps if n.startswith(f"{name}[")]:
                self.state.replace(item, None)
                self.secrets.put(item, None)
            self.state.replace(name, None)
            self.state.compact()
            self.secrets.put(name, None)
            return existed

    def _prepare_through(self, name: str) -> Prepared:
        """Render one step as a run would reach it: records adopted and env steps rendered before it."""
        for other in self.graph.order():
            step = self.pipeline.step(other)
            self._adopt_record(other)
            if other == name:
                prep = self.prepare(step)
                if prep is None:
                    raise InputError(f"step {name!r} is skipped (`when` is false)")
                return prep
            if step.exports_env:
                with contextlib.suppress(InputError):
                    self.prepare(step)
        raise InputError(f"no step named {name!r}")

    def mark_done(self, name: str) -> None:
        """Accept the live state as done: record the current fingerprint without running the step."""
        with pipeline_lock(self.pipeline.state_dir, notice=self.reporter.notice):
            self.load_state()
            prep = self._prepare_through(name)
            marked = StepRecord.marked_done(
                self.record(name),
                kind=prep.step.kind,
                fingerprint=prep.fingerprint,
                spec=self.masker.mask_data(prep.spec),
                upstream=prep.upstream,
                when=now(),
                run=self.run_id,
            )
            self.state.replace(name, marked.to_dict())
            self.state.compact()

    def stop(self, name: str) -> str:
        """Stop what a step started (a detached job). Raises StepError when there is nothing to stop."""
        with pipeline_lock(self.pipeline.state_dir, notice=self.reporter.notice):
            self.load_state()
            prep = self._prepare_through(name)
            return self.masker.mask(prep.instance.stop(prep.ctx))

    def remote_log(self, name: str, follow: bool) -> Iterator[str] | None:
        """The log of what a step started elsewhere (a Ray job), if it has one."""
        self.load_state()
        try:
            prep = self._prepare_through(name)
        except InputError:
            return None  # not renderable now: the local log, if any, is what there is to show
        return prep.instance.remote_log(prep.ctx, follow)

    def runs_of(self, name: str) -> list[Path]:
        """The step logs of a step (or of a for_each item, `name[key]`) kept in .runner/logs, newest first."""
        logs = self.pipeline.state_dir / "logs"
        if not logs.is_dir():
            return []
        return [p for p in (run / f"{name}.log" for run in sorted(logs.iterdir(), reverse=True)) if p.is_file()]

    def log_of(self, name: str, run: int | None = None) -> Path | None:
        """The log to show for a step: what it started (a job's log), else its last run's step log; with `run`,
        the log of its Nth most recent run (1: the latest) from .runner/logs."""
        if run is not None:
            runs = self.runs_of(name)
            if not 1 <= run <= len(runs):
                raise InputError(f"{name} has {len(runs)} run log(s) kept; --run takes 1 (the latest) to {len(runs)}")
            return runs[run - 1]
        self.load_state()
        with contextlib.suppress(InputError, StepError):
            prep = self._prepare_through(name)
            path = prep.instance.log_file(prep.ctx)
            if path is not None:
                return path
        log = (self.record(name) or StepRecord({})).log or None
        return Path(log) if isinstance(log, str) and log else None

    def exported_env(self) -> dict[str, str]:
        """Every variable the env steps export, rendered with the recorded outputs."""
        self.load_state()
        merged: dict[str, str] = {}
        for name in self.graph.order():
            step = self.pipeline.step(name)
            self._adopt_record(name)
            if step.exports_env:
                prep = self.prepare(step)
                if prep is not None:
                    merged.update(self.exports[name])
        return merged


class _Cancelled(Exception):
    message = "interrupted"


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM become Interrupted in the main thread, so running steps are stopped cleanly."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    old_int = signal.signal(signal.SIGINT, handler)
    old_term = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def _after(pending: list[str], failing: list[str]) -> str:
    text = f"after {', '.join(pending)} runs"
    if failing:
        text += f"; blocked while {', '.join(failing)} would fail"
    return text


def item_key(value: Any) -> str:
    """A for_each item's name in records and logs: the item itself when it is a short plain word, else a
    readable prefix and a digest."""
    if isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, (str, int, float)):
        text = str(value)
    else:
        return "item-" + digest(value)[-12:]
    if ITEM_KEY.fullmatch(text):
        return text
    readable = re.sub(r"[^A-Za-z0-9_.:@+-]+", "-", text)[:40].strip("-")
    return f"{readable or 'item'}-{digest(text)[-8:]}"

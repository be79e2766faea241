"""Rendering a step for this run: templates, for_each items, `when`, the spec and the fingerprint."""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from runner.engine.base import RunState
from runner.errors import InputError
from runner.fingerprint import digest, step_fingerprint
from runner.load import validation_errors
from runner.model import StepDecl
from runner.record import StepRecord
from runner.template import (
    EnvView,
    Outputs,
    RenderError,
    render_data,
    render_string,
    render_value,
    secret_parts,
    when_source,
)
from runner.util.datatype import datatype
from runner.util.text import FALSE_WORDS, TRUE_WORDS
from steps import kind_class
from steps.base import StepContext, StepError, StepKind

ITEM_KEY = re.compile(r"[A-Za-z0-9_.:@+-]{1,64}")


@datatype
class Prepared:
    """A step rendered for this run: its kind instance, context and fingerprint."""

    step: StepDecl
    instance: StepKind
    ctx: StepContext
    spec: dict[str, Any]
    fingerprint: str
    upstream: dict[str, str]
    key: str = ""  # the name its record is kept under: the step's name, or `name[key]` for an item of for_each

    def __post_init__(self) -> None:
        self.key = self.key or self.step.name


@datatype
class Item:
    """One item of a for_each step."""

    key: str
    value: Any
    index: int


class Preparer:
    """Rendering: a step (or one for_each item) into a Prepared, with its context, spec and fingerprint."""

    def __init__(self, run: RunState) -> None:
        self.run = run

    def exported_before(self, step: StepDecl) -> dict[str, str]:
        merged: dict[str, str] = {}
        for other in self.run.graph.env_view[step.name]:
            if other in self.run.exports:
                merged.update(self.run.exports[other])
        return merged

    @functools.cached_property
    def environ(self) -> dict[str, str]:
        """runner's environment, read once (os.environ decodes every key and value at each read)."""
        return dict(os.environ)

    def context(self, step: StepDecl, exported: dict[str, str], item: Item | None = None) -> dict[str, Any]:
        context: dict[str, Any] = {
            "vars": self.run.pipeline.vars,
            "env": EnvView({**self.environ, **exported}),
            "facts": self.run.facts,
            "steps": {name: Outputs(name, self.run.outputs[name]) for name in step.refs if name in self.run.outputs},
        }
        if item is not None:
            context["item"] = item.value
            context["item_index"] = item.index
        return context

    def _render_error(self, step: StepDecl, exc: RenderError) -> InputError:
        path = ("steps", step.index, *exc.path)
        field = f"steps[{step.index}] ({step.name})." + ".".join(str(p) for p in exc.path)
        return self.run.pipeline.marks.error(path, self.run.masker.mask(exc.message), field=field)

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
        exported = self.exported_before(step)
        context = self.context(step, exported)
        if not self.when_holds(step, context):
            return None
        try:
            with secret_parts(self.run.masker.add_part):  # `{{ vars.key[:12] }}` as an item is a secret too
                value = render_value(step.common.for_each, context, ("for_each",))
        except RenderError as exc:
            raise self._render_error(step, exc) from None
        self.run.masker.scan(value)  # an item's `token:`, a URL's password: secrets from here on, and in its key
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    value = json.loads(text)
                except ValueError:
                    raise self._render_error(
                        step,
                        RenderError(f"for_each rendered to {text[:80]!r}, which is not a JSON list", ("for_each",)),
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
            key = self._item_key(entry)
            if key in seen:
                raise self._render_error(
                    step, RenderError(f"for_each has item {key!r} twice (at {seen[key]} and {index})", ("for_each",))
                )
            seen[key] = index
            items.append(Item(key, entry, index))
        return items

    def _item_key(self, entry: Any) -> str:
        """item_key, unless the item carries a secret: then `secret-` and a keyed digest of it (the key kept in
        secrets.json), so that a secret never names a record, a log file or a job, and is never printed as one."""
        text = entry if isinstance(entry, str) else json.dumps(entry, sort_keys=True, default=str)
        if self.run.masker and self.run.masker.mask(text) != text:
            return "secret-" + self.run.secrets.keyed_digest(text).rsplit(":", 1)[1][:12]
        return item_key(entry)

    def check_item_targets(self, step: StepDecl, items: list[Item], targets: Iterable[str]) -> None:
        """Each `NAME[key]` among `targets` (--force, mark-done, ...) names an item this step has."""
        prefix = step.name + "["
        wanted = [t[len(prefix) : -1] for t in targets if t.startswith(prefix) and t.endswith("]")]
        keys = [i.key for i in items]
        for key in wanted:
            if key not in keys:
                from runner.errors import suggest

                raise InputError(f"{step.name} has no item {key!r}" + suggest(key, keys))

    def item_named(self, step: StepDecl, key: str) -> Item:
        """The item `key` of a for_each step (its items rendered as a run would)."""
        items = self.items(step)
        if items is None:
            raise InputError(f"step {step.name!r} is skipped (`when` is false)")
        self.check_item_targets(step, items, [f"{step.name}[{key}]"])
        return next(i for i in items if i.key == key)

    def prepare(self, step: StepDecl, log_path: Path | None = None, item: Item | None = None) -> Prepared | None:
        """Render a step (or one item of it); None when its `when` is false. Raises InputError for template
        and spec errors."""
        exported = self.exported_before(step)
        context = self.context(step, exported, item)
        if item is None and not self.when_holds(step, context):
            return None
        record_name = f"{step.name}[{item.key}]" if item is not None else step.name
        try:
            with secret_parts(self.run.masker.add_part):
                rendered = render_data(step.raw, context, (step.kind,))
        except RenderError as exc:
            raise self._render_error(step, exc) from None
        self.run.masker.scan(rendered)  # values under secret-sounding names, URL passwords: masked from here on
        cls = kind_class(step.kind)
        host = self._host(step, context)
        if host and "host" in cls.Spec.model_fields and isinstance(rendered, dict) and rendered.get("host") is None:
            rendered = {**rendered, "host": host}  # docker's engine there, capture's command there: as `docker.host`
        try:
            spec = cls.Spec.model_validate(rendered, context={"host": host})
        except ValidationError as exc:
            errors = validation_errors(
                exc, ("steps", step.index, step.kind), cls.Spec, self.run.pipeline.marks, rendered
            )
            err = errors[0]
            err.message = self.run.masker.mask(err.message) + " (after rendering templates)"
            raise err from None
        instance = cls(spec)
        if cls.exports_env:
            self.run.exports[step.name] = instance.exports()
        ctx = StepContext(
            name=record_name,
            pipeline_dir=self.run.pipeline.dir,
            state_dir=self.run.pipeline.state_dir,
            env={**self.environ, **exported},
            exported=exported,
            timeout=step.common.timeout,
            log_path=log_path,
            record_outputs=(self.run.record(record_name) or StepRecord({})).outputs,
            cancel=self.run.cancel,
            hurry=self.run.hurry,
            mask=self.run.masker.mask,
            mask_cut=self.run.masker.safe_cut,
            stored_secrets=self.run.secrets.get(record_name),
            notice=self.run.reporter.notice,
            digest=self.run.secrets.keyed_digest,
            forced=step.name in self.run.options.force or record_name in self.run.options.force,
            host=host,
        )
        dumped = spec.model_dump(mode="json")
        spec_data = (
            {k: v for k, v in dumped.items() if k not in cls.cosmetic_fields} if isinstance(dumped, dict) else dumped
        )
        if cls.on_machine and isinstance(spec_data, dict) and "host" not in cls.Spec.model_fields:
            # the machine is part of what the step is, under the key the older spelling (`run: {host: }`) gave it,
            # so a pipeline moved to the step's `host:` keeps its records
            spec_data["host"] = host
        upstream = {dep: self.run.digests.get(dep, "none") for dep in self.run.graph.deps[step.name]}
        try:
            extra = instance.fingerprint_extra(ctx)
        except StepError as exc:
            if not exc.field:
                raise
            path = ("steps", step.index, step.kind, exc.field)
            where = f"steps[{step.index}] ({step.name}).{step.kind}.{exc.field}"
            raise self.run.pipeline.marks.error(path, self.run.masker.mask(exc.message), field=where) from None
        fingerprint = step_fingerprint(step.kind, spec_data, extra, upstream)
        ctx.fingerprint = fingerprint
        return Prepared(step, instance, ctx, spec_data, fingerprint, upstream, record_name)

    def _host(self, step: StepDecl, context: dict[str, Any]) -> str | None:
        """The step's `host:` rendered and checked as an ssh destination; None (also when it renders empty) is
        this machine."""
        host = step.common.host
        if host is None or ("{{" not in host and "{%" not in host):
            return host
        where = step.host_at[2:]
        try:
            text = render_string(host, context, where).strip()
        except RenderError as exc:
            raise self._render_error(step, exc) from None
        if not text:
            return None
        from steps._support.ssh import check_target

        try:
            return check_target(text)
        except ValueError as exc:
            raise self._render_error(step, RenderError(f"{exc} (after rendering templates)", where)) from None


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


@datatype
class RemovedStep:
    """A record whose step is no longer in the pipeline, and what of it may still run (a detached job, a
    container), as its kind's teardown would say it."""

    name: str
    kind: str
    instance: StepKind[Any] | None
    ctx: StepContext | None
    live: str | None


class Removals:
    """Records of steps deleted from the pipeline: listed by plan and status, stoppable, reached by down."""

    def __init__(self, run: RunState, prep: Preparer) -> None:
        self.run = run
        self.prep = prep

    def removed_records(self) -> dict[str, StepRecord]:
        """The records whose step (or, for an item, whose for_each step) is not in the pipeline."""
        names = set(self.run.graph.names)  # a list: `in` on it made this quadratic (0.8 s of 10,000 converged steps)
        found = {}
        for key, data in list(self.run.state.steps.items()):
            if key.split("[", 1)[0] not in names:
                record = StepRecord.of(data)
                if record is not None:
                    found[key] = record
        return found

    def removed(self) -> list[RemovedStep]:
        """Each removed step's record, with what of it is still there (its kind's teardown, dry run)."""
        return [self._removed_one(key, record) for key, record in self.removed_records().items()]

    def removed_named(self, name: str) -> RemovedStep | None:
        record = self.removed_records().get(name)
        return self._removed_one(name, record) if record is not None else None

    def is_removed(self, name: str) -> bool:
        """A name whose record remains from a step no longer in the pipeline (cheap: no look at what runs)."""
        return name in self.removed_records()

    def _removed_one(self, key: str, record: StepRecord) -> RemovedStep:
        try:
            cls = kind_class(record.kind)
            spec = dict(record.spec or {})
            host = spec.get("host") if cls.on_machine else None
            if "host" not in cls.Spec.model_fields:
                spec.pop("host", None)
            instance = cls(cls.Spec.model_validate(spec, context={"host": host}))
        except Exception:  # noqa: BLE001 - an unknown kind or a spec of an older runner: nothing to look at
            return RemovedStep(key, record.kind or "?", None, None, None)
        ctx = StepContext(
            name=key,
            pipeline_dir=self.run.pipeline.dir,
            state_dir=self.run.pipeline.state_dir,
            env=dict(self.prep.environ),
            exported={},
            record_outputs=record.outputs,
            mask=self.run.masker.mask,
            notice=self.run.reporter.notice,
            digest=self.run.secrets.keyed_digest,
            host=host if isinstance(host, str) else None,
        )
        try:
            live = instance.teardown(ctx, purge=False, dry_run=True)
        except Exception:  # noqa: BLE001 - what cannot be looked at is said as unknown
            live = None
        return RemovedStep(key, record.kind, instance, ctx, self.run.masker.mask(live) if live else None)

    def removal_notices(self) -> list[str]:
        """One line per removed step's record, for plan and apply."""
        lines = []
        for gone in self.removed():
            head = f"{gone.name} ({gone.kind}) was removed from the pipeline; its record is kept"
            if gone.live:
                lines.append(
                    f"{head} and what it runs is still there (`runner down` {gone.live}): `runner stop {gone.name}` "
                    f"stops it, `runner forget {gone.name}` drops the record"
                )
            else:
                lines.append(f"{head} (nothing of it runs): `runner forget {gone.name}` drops it")
        return lines

"""The step contract.

A kind is a class with a pydantic ``Spec`` model (its fields and their descriptions become the JSON Schema),
a read-only ``probe`` and an idempotent ``apply``. The engine decides whether a step runs; the kind only says
whether the live system matches its spec and how to make it so.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationInfo

from runner.causes import Change as Change  # what a probe and describe_changes report
from runner.util.datatype import datatype, field


def _without_pydantic_plugins() -> None:
    """runner's own models are not for third-party pydantic plugins, which pydantic finds by reading the entry
    points of every installed distribution when the first model is built (8 ms of every run): its plugin list is
    set to empty before runner builds one. Only this process: the programs steps run are not touched."""
    try:
        from pydantic.plugin import _loader

        if getattr(_loader, "_plugins", None) is None:
            _loader._plugins = {}
    except Exception:  # noqa: BLE001 - a private detail of pydantic; without it, pydantic scans as usual
        pass


_without_pydantic_plugins()


def _argv_words(value: Any) -> Any:
    """In an argv list a number or a boolean is a word to the program: `[python, x.py, --n, 8]` means "8"."""
    if not isinstance(value, list):
        return value
    out: list[Any] = []
    for item in value:
        if isinstance(item, bool):
            out.append("true" if item else "false")
        elif isinstance(item, (int, float)):
            out.append(str(item))
        else:
            out.append(item)
    return out


def _no_nul(value: str | list[str]) -> str | list[str]:
    r"""No program can be given a NUL byte; in YAML it comes from "\0" in a double-quoted string."""
    for word in [value] if isinstance(value, str) else value:
        if "\0" in word:
            raise ValueError(
                'holds a NUL byte, which no program can be given (in a YAML double-quoted string "\\0" is a NUL: '
                'write "\\\\0" for a backslash and a zero)'
            )
    return value


# A command: a string runs under `sh -c`; a list is the argv itself, its numbers and booleans taken as words.
Command = Annotated[str | list[str], BeforeValidator(_argv_words), AfterValidator(_no_nul)]


def machine_named(info: ValidationInfo) -> str | None:
    """In a spec's validator: the step's `host:` (the engine validates a spec with it as the context), or None for
    this machine (and at load while it is a template: checked again once rendered)."""
    context = info.context
    host = context.get("host") if isinstance(context, dict) else None
    return host if isinstance(host, str) and host else None


class SpecModel(BaseModel):
    """Base of every kind's spec: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@datatype(frozen=True)
class Probe:
    """The result of a probe: ``ok``, or ``missing``/``drift`` with a reason and field-level changes (a
    :class:`Change`, or a kind's own words for one)."""

    status: Literal["ok", "missing", "drift", "unknown"]
    reason: str = ""
    changes: tuple[Change | str, ...] = ()
    # ok, but what the step provides is down on purpose (a job `runner stop` stopped): what depends on it and
    # would run is blocked, by name, instead of running against nothing
    stopped: bool = False
    hint: str = ""  # unknown: what to check
    exit_code: int | None = None  # missing because the job it started exited with this code (`status` shows it)

    @classmethod
    def ok(cls, reason: str = "") -> Probe:
        return cls("ok", reason)

    @classmethod
    def parked(cls, reason: str) -> Probe:
        """Up to date, and stopped on purpose: see `stopped`."""
        return cls("ok", reason, stopped=True)

    @classmethod
    def missing(cls, reason: str, exit_code: int | None = None) -> Probe:
        return cls("missing", reason, exit_code=exit_code)

    @classmethod
    def drift(cls, reason: str, changes: tuple[Change | str, ...] = ()) -> Probe:
        return cls("drift", reason, changes)

    @classmethod
    def unknown(cls, reason: str, hint: str = "") -> Probe:
        """The machine the step is on did not answer: nothing is known of the step there, so it is neither run
        nor taken for missing (the step fails as unreachable and its record is kept)."""
        return cls("unknown", reason, hint=hint)


def scalar_text(value: Any) -> Any:
    """YAML scalars as environment strings: true -> "true", 8000 -> "8000"; other values unchanged."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return value


def env_mapping(value: Any) -> Any:
    """A before-validator for environment mappings: scalar values become strings."""
    if isinstance(value, dict):
        return {k: scalar_text(v) for k, v in value.items()}
    return value


class StepError(Exception):
    """A step failed. ``message`` says what happened, ``hint`` what to do about it."""

    def __init__(self, message: str, hint: str = "", output_tail: str = "", field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.output_tail = output_tail
        self.field = field  # a field of the spec that is wrong as written: the engine reports bad input there


class Unreachable(StepError):
    """The machine a step is on did not answer (no connection, a stalled one, a host key that is not the known
    one): what the step is there is not known. A probe that meets it is `unknown`, not `missing`; an apply that
    meets it leaves the step's record as it was, so the next apply only looks again."""


def _no_digest() -> str:
    raise RuntimeError("this StepContext has no keyed digest: the engine gives one (SecretStore.keyed_digest)")


@datatype
class StepContext:
    """What a step gets from the engine: never globals."""

    name: str
    pipeline_dir: Path
    state_dir: Path
    env: Mapping[str, str]  # the process environment plus every exported variable before this step
    exported: Mapping[str, str]  # only the variables exported by env steps before this step
    timeout: float | None = None
    log_path: Path | None = None
    record_outputs: Mapping[str, Any] = field(default_factory=dict)  # outputs of the last successful run
    on_output: Callable[[str], None] = lambda line: None
    # a progress update the command overwrites with `\r` (`45%\r46%\r`): its running row shows it, no log line
    on_transient: Callable[[str], None] = lambda line: None
    cancel: threading.Event = field(default_factory=threading.Event)
    hurry: threading.Event = field(default_factory=threading.Event)  # set by a second Ctrl-C: no more grace
    mask: Callable[[str], str] = lambda text: text  # hides secret values in anything written out
    # where a text may be cut (at or before an index) without splitting a secret: for output with no end of line
    mask_cut: Callable[[str, int], int] = lambda text, at: at
    fingerprint: str = ""  # the fingerprint this run records, for kinds that tag what they create with it
    stored_secrets: Mapping[str, str] = field(default_factory=dict)  # this step's secret outputs, kept last time
    notice: Callable[[str], None] = lambda message: None  # a one-line message to the user
    # how far the step is: (done, total or None, unit), e.g. bytes of an image pull; the live view draws a bar
    progress: Callable[[int, int | None, str], None] = lambda done, total, unit: None
    # a keyed digest (HMAC) of a secret, whose key lives only in the 0600 secrets file: for records and
    # fingerprints that must change with a secret without revealing it
    digest: Callable[[str], str] = lambda text: _no_digest()
    # set False by an apply that found the system already as the spec says (a forced clone at its commit):
    # the step then reports `ok`, not `changed`
    changed: bool = True
    # the tag every process this run of the step starts carries in its environment (runner/util/sweep.py);
    # "" outside an apply
    process_tag: str = ""
    forced: bool = False  # named by `apply --force`: replace what is there even if runner did not make it
    # the machine the step works on: the step's `host:` rendered (an ssh destination), None for this one; a kind
    # reaches it through steps._support.machine.machine_for(ctx.host)
    host: str | None = None

    def resolve(self, path: str) -> Path:
        """A path relative to the pipeline file's directory (absolute paths stay as they are)."""
        return Path(os.path.join(self.pipeline_dir, os.path.expanduser(path)))  # join keeps an absolute one


SpecT = TypeVar("SpecT", bound=BaseModel)


class StepKind(Generic[SpecT]):
    """Base of the step kinds: ``class RunStep(StepKind[RunSpec])`` sets ``kind`` and ``Spec = RunSpec`` and
    implements probe and apply; ``self.spec`` is then typed as that spec."""

    kind: ClassVar[str]
    Spec: ClassVar[type[BaseModel]]
    # Fields that do not change what the step does: left out of the fingerprint.
    cosmetic_fields: ClassVar[frozenset[str]] = frozenset()
    # An env-like step exports variables to every later step, whether or not it runs.
    exports_env: ClassVar[bool] = False
    # False for checks: a run that passes reports `ok`, not `changed`.
    changes_system: ClassVar[bool] = True
    # Its probe reads only this machine (files, a cache): the scheduler may look at it in its own thread even
    # with -j N, so an up-to-date step costs no hand-over (a probe over the network stays on a worker).
    local_probe: ClassVar[bool] = False
    # The outputs `{{ steps.NAME.x }}` may name, checked at load time; None: not fixed (an env step's).
    outputs: ClassVar[frozenset[str] | None] = None
    # Written against the step's machine (ctx.host), so `host:` may name another; False: this machine only (an env
    # step's variables, a secret's prompt, an API call), and a `host:` on it is an error at load.
    on_machine: ClassVar[bool] = False

    def __init__(self, spec: SpecT) -> None:
        self.spec: SpecT = spec

    def probe(self, ctx: StepContext) -> Probe:
        """Read-only and fast: is the live system as the spec says?"""
        return Probe.ok()

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        """Make it so; return the outputs later steps may reference."""
        raise NotImplementedError

    def adopt(self, ctx: StepContext) -> dict[str, Any] | None:
        """`runner mark-done`: take what is there as this step's, returning the outputs to record (StepError
        when it does not match the spec), or None for a kind that adopts nothing (its probe decides)."""
        return None

    def exports(self) -> dict[str, str]:
        """Variables this step exports to later steps (env-like kinds only)."""
        return {}

    def fingerprint_extra(self, ctx: StepContext) -> dict[str, Any]:
        """Extra inputs of the fingerprint (e.g. content hashes of input files)."""
        return {}

    def streams_output(self) -> bool:
        """Whether the step's output goes to the terminal even without -v (a foreground job)."""
        return False

    def secret_outputs(self) -> frozenset[str]:
        """Output keys whose values are secrets: kept in the 0600 secrets file, masked everywhere else."""
        return frozenset()

    def note(self, outputs: dict[str, Any]) -> str:
        """A few words shown after a run's result line (what a capture read, what pip installed), or ""."""
        return ""

    def live_work(self, ctx: StepContext) -> str | None:
        """Live work a re-run would disrupt (a running job): its description, or None.

        When a changed spec or upstream would re-run the step while this returns a description, the engine
        reports "restart pending" and leaves it alone unless the step is forced.
        """
        return None

    def stop(self, ctx: StepContext) -> str:
        """Stop what the step started (`runner stop STEP`); returns what was done."""
        raise StepError(f"a {self.kind} step has nothing to stop")

    def teardown(self, ctx: StepContext, purge: bool, dry_run: bool) -> str | None:
        """`runner down`: remove what this step runs (a container, a job) and, with `purge`, what it made on disk
        (a clone, a venv, the files it `creates`); only what runner itself made. Returns what it did (or, with
        `dry_run`, what it would do) in a few words, or None when there is nothing to remove."""
        return None

    def describe_changes(self, ctx: StepContext, old_spec: dict[str, Any], changes: list[Change]) -> list[Change]:
        """For `plan`: the field-level changes in the kind's own terms (`ref: main@3f2a1c -> v1.2 (9b7e00)`);
        read-only and local. The default keeps the generic (field, old, new) changes."""
        return changes

    def preview(self, ctx: StepContext) -> str | None:
        """For `plan` only: a failure that apply would certainly hit, found read-only (a check that fails now)."""
        return None

    def remote_log(self, ctx: StepContext, follow: bool) -> Iterator[str] | None:
        """A log that lives elsewhere (a Ray job's, on its cluster): chunks of text, or None for none."""
        return None

    def remote_host(self, ctx: StepContext) -> str | None:
        """The machine (an ssh destination) this step works on over ssh, or None for this one: `plan` says a
        machine it cannot reach would fail, and what a failed or crashed run of it left running there is swept
        there. The step's `host:`; a kind that reaches a machine some other way too says so (docker's engine)."""
        return ctx.host

    def log_file(self, ctx: StepContext) -> Path | None:
        """Where the output of what this step started goes, when not in the run's step log (`runner logs`)."""
        return None

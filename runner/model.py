"""The pipeline model: the file's top level and the fields every step has."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

import steps.base  # noqa: F401 - before the first model: it keeps pydantic from scanning for plugins
from runner.util.datatype import datatype, field

if TYPE_CHECKING:
    from runner.graph import Graph
    from runner.marks import MarkedData

STEP_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_-]*$"


class PipelineHeader(BaseModel):
    """The top level of pipeline.yaml, less its steps."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, description="The pipeline's name (default: the file's name).")
    description: str | None = Field(None, description="What the pipeline is for.")
    vars: dict[str, Any] = Field(
        default_factory=dict,
        description="Variables for templates, as `{{ vars.NAME }}`; `--var k=v` overrides.",
    )
    secrets: list[str] = Field(
        default_factory=list,
        description="Names of vars whose values are secret: masked in all output, logs and state.",
    )
    not_secret: list[str] = Field(
        default_factory=list,
        description="Names that look secret but are not (a var or field named like `*_KEY`, `*_TOKEN`, "
        "`*_SECRET`, `*_PASSWORD` is masked; list it here to show its value).",
    )


class StepCommon(BaseModel):
    """The fields every step has, whatever its kind."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Unique name: letters, digits, - and _.", pattern=STEP_NAME_PATTERN, max_length=100)
    description: str | None = Field(None, description="What the step is for (cosmetic).")
    hint: str | None = Field(
        None,
        description="What to try when this step fails, shown under its error after the kind's own hint (a "
        "template: `pick a free port with --var port=N`).",
    )
    needs: list[str] = Field(
        default_factory=list,
        description=(
            "The steps this one depends on. Without `needs`, a step comes after the steps before it (order only: "
            "it is not re-run when they change)."
        ),
    )
    when: str | bool | None = Field(
        None,
        description="A condition: a template or an expression such as `vars.smoke`; false skips the step.",
    )
    retries: int = Field(0, ge=0, le=100, description="How often to retry a failed step.")
    retry_delay: float = Field(2.0, ge=0, le=3600, description="Seconds between retries.")
    timeout: float | None = Field(
        None,
        gt=0,
        description="Seconds an attempt of the step may take: past it the step is cancelled, what it "
        "started is stopped (TERM, then KILL) and the attempt fails as timed out, whatever its kind.",
    )
    host: str | None = Field(
        None,
        description="The machine the step works on, over ssh: a ~/.ssh/config alias, user@host or "
        "ssh://user@host:port (a template: `{{ item }}` with for_each covers a fleet). Relative paths are then that "
        "machine's, from the login directory (or `cwd`); exported variables go along on stdin, never on a command "
        "line; a docker step uses that machine's engine. Default: this machine. Every kind that works on a machine "
        "takes it; env, secret and e2b steps work here only.",
    )
    for_each: str | list[Any] | None = Field(
        None,
        description="Repeat the step for each item of this list (or a template that renders one, or a "
        "comma-separated string); `{{ item }}` and `{{ item_index }}` in its spec. Items run in order, each with "
        "its own record: an interrupted loop resumes at the first unfinished item, a changed item re-runs alone.",
    )

    @field_validator("needs", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        from steps._support.ssh import check_target  # ssh's spelling of a destination, a template checked rendered

        return check_target(value)


# Known when the file declares `needs:` at all (an empty list makes the step independent).
COMMON_FIELDS = tuple(StepCommon.model_fields)
TOP_LEVEL_FIELDS = (*PipelineHeader.model_fields, "steps")


@datatype(frozen=True)
class StepDecl:
    """One step as declared: its common fields and the raw (unrendered) spec of its kind."""

    index: int
    name: str
    kind: str
    common: StepCommon
    raw: Any
    declares_needs: bool = False
    refs: frozenset[str] = frozenset()  # steps its templates reference
    exports_env: bool = False  # its kind exports variables to every later step (the contract's exports_env)
    # where its `host` is written: on the step, or (the older spelling, still read) inside its kind's mapping
    host_at: tuple[str | int, ...] = ()


DEFAULT_FILES = ("pipeline.yaml", "pipeline.yml")


def state_dir_for(file: Path) -> Path:
    """Where a pipeline file's state lives: `.runner/` beside `pipeline.yaml`, `.runner-NAME/` beside any other
    file NAME, so two pipeline files in one directory never share records, secrets or a lock. A `.runner/` made
    before that (by `-f NAME`) stays NAME's while there is no `.runner-NAME/` and no pipeline.yaml to claim it."""
    resolved = file.resolve()
    here = resolved.parent
    if resolved.name in DEFAULT_FILES:
        return here / ".runner"
    own = here / f".runner-{resolved.name}"
    legacy = here / ".runner"
    if not own.exists() and legacy.is_dir() and not any((here / n).exists() for n in DEFAULT_FILES):
        return legacy
    return own


@datatype(frozen=True)
class Pipeline:
    """A loaded pipeline, complete: its steps (templates checked, references known) and their graph."""

    name: str
    description: str | None
    vars: dict[str, Any]
    secrets: list[str]
    steps: tuple[StepDecl, ...]
    file: Path
    marks: MarkedData
    graph: Graph
    by_name: dict[str, StepDecl] = field(default_factory=dict, compare=False)
    not_secret: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()  # an older spelling read as today's (validate says each)

    @functools.cached_property
    def dir(self) -> Path:
        return self.file.resolve().parent

    @functools.cached_property
    def state_dir(self) -> Path:
        return state_dir_for(self.file)

    def step(self, name: str) -> StepDecl:
        return self.by_name[name]

"""run: any command — data preparation, a script, a check.

Example::

    - name: prepare
      run:
        command: [python, make_data.py, --output, "{{ vars.out }}/train.jsonl"]   # a list is argv, no shell
        creates: ["{{ vars.out }}/train.jsonl"]

A list runs as argv with no shell; a string runs under ``sh -c``. The step is done when its record matches
the fingerprint (the rendered spec plus the content of its ``inputs``) and every ``creates`` path exists.
Its output ``stdout`` keeps the first 64 KiB of what the command printed (apply says so when it cut it; the
step's log keeps it all): write anything bigger to a file and pass the path.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from steps._support.files import check_patterns
from steps._support.machine import Machine, machine_for
from steps._support.process import STDOUT_LIMIT
from steps.base import Command, Probe, SpecModel, StepContext, StepError, StepKind, env_mapping


class RunSpec(SpecModel):
    command: Command = Field(description="The command. A list is argv (no shell); a string runs under `sh -c`.")
    cwd: str | None = Field(None, description="Working directory, relative to the pipeline file.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    creates: list[str] = Field(
        default_factory=list,
        description="Paths or globs the command creates; the step is not done while one is missing.",
    )
    inputs: list[str] = Field(
        default_factory=list,
        description="Paths or globs whose content is hashed into the fingerprint: a change re-runs the step.",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        """`run: "make data"` is short for `run: {command: "make data"}`."""
        return {"command": value} if isinstance(value, (str, list)) else value

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, value: Any) -> Any:
        return env_mapping(value)

    @field_validator("creates", "inputs")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        return check_patterns(value)

    @field_validator("command")
    @classmethod
    def _not_empty(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, str) and not value.strip():
            raise ValueError("the command is empty")
        if isinstance(value, list) and not value:
            raise ValueError("the command list is empty")
        return value


class RunStep(StepKind[RunSpec]):
    """Written once against the step's machine (steps/_support/machine.py): this one, or `host`'s."""

    local_probe = True
    on_machine = True
    kind = "run"
    Spec = RunSpec
    outputs = frozenset({"stdout", "rc", "cwd", "host"})

    _seen: tuple[str | None, dict[str, Any]] | None = None

    def machine(self, ctx: StepContext) -> Machine:
        return machine_for(ctx.host)

    def _look(self, ctx: StepContext) -> tuple[str | None, dict[str, Any]]:
        """`creates` and `inputs` where the command runs (on a host, one round trip), kept for the probe and the
        fingerprint until apply runs the command."""
        if self._seen is None:
            self._seen = self.machine(ctx).look(ctx, self.spec.cwd, self.spec.creates, self.spec.inputs)
        return self._seen

    def probe(self, ctx: StepContext) -> Probe:
        if not self.spec.creates:
            return Probe.ok()
        missing, _ = self._look(ctx)
        return Probe.missing(f"{missing} does not exist{self.machine(ctx).where}") if missing else Probe.ok()

    def fingerprint_extra(self, ctx: StepContext) -> dict[str, Any]:
        return self._look(ctx)[1] if self.spec.inputs else {}

    def teardown(self, ctx: StepContext, purge: bool, dry_run: bool) -> str | None:
        if not purge or not self.spec.creates:
            return None
        return self.machine(ctx).remove(ctx, self.spec.cwd, self.spec.creates, dry_run)

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        spec = self.spec
        machine = self.machine(ctx)
        self._seen = None
        result = machine.run(ctx, spec.command, cwd=spec.cwd, env=spec.env)
        if result.returncode != 0:
            raise machine.failure(result.returncode, spec.command, result.tail)
        if spec.creates:
            missing, _ = machine.look(ctx, spec.cwd, spec.creates, [])
            if missing:
                hint = "fix the command or the `creates` path"
                if machine.host is not None:
                    hint += " (relative paths are from the login directory or `cwd`)"
                raise StepError(
                    f"the command succeeded but did not create {missing}{machine.where}",
                    hint=hint,
                    output_tail="\n".join(result.tail),
                )
        stdout = result.stdout[:-1] if result.stdout.endswith("\n") else result.stdout
        if result.stdout_cut:
            ctx.notice(
                f"{ctx.name}: its output is longer than {STDOUT_LIMIT // 1024} KiB: `steps.{ctx.name.partition('[')[0]}"
                f".stdout` keeps the first {STDOUT_LIMIT // 1024} KiB (its log has it all)"
            )
        outputs: dict[str, Any] = {"rc": 0, "stdout": stdout, "cwd": machine.workdir(ctx, spec.cwd)}
        if machine.host is not None:
            outputs["host"] = machine.host
        return outputs

"""run: any command — data preparation, a script, a check.

Example::

    - name: prepare
      run:
        command: [python, make_data.py, --output, "{{ vars.out }}/train.jsonl"]   # a list is argv, no shell
        creates: ["{{ vars.out }}/train.jsonl"]

A list runs as argv with no shell; a string runs under ``sh -c``. The step is done when its record matches
the fingerprint (the rendered spec plus the content of its ``inputs``) and every ``creates`` path exists.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import Field, field_validator, model_validator

from steps._support import remote
from steps._support.files import check_patterns, content_digest, expand, remove_created
from steps._support.process import run_process
from steps._support.words import argv_of
from steps.base import Command, Probe, SpecModel, StepContext, StepError, StepKind, env_mapping


class RunSpec(SpecModel):
    command: Command = Field(description="The command. A list is argv (no shell); a string runs under `sh -c`.")
    cwd: str | None = Field(None, description="Working directory, relative to the pipeline file.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    host: str | None = Field(None, description=remote.HOST_DESCRIPTION)
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

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        return remote.check_host(value)

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
    local_probe = True
    kind = "run"
    Spec = RunSpec
    outputs = frozenset({"stdout", "rc", "cwd", "host"})

    _seen: tuple[str | None, dict[str, Any]] | None = None

    def remote_host(self) -> str | None:
        return self.spec.host

    def _remote_look(self) -> tuple[str | None, dict[str, Any]]:
        """On a host: `creates` and `inputs` there, in one round trip, kept for the probe and the fingerprint."""
        if self._seen is None:
            spec = self.spec
            assert spec.host is not None
            self._seen = remote.observe(spec.host, spec.cwd, spec.creates, spec.inputs)
        return self._seen

    def probe(self, ctx: StepContext) -> Probe:
        if self.spec.host:
            if not self.spec.creates:
                return Probe.ok()
            missing, _ = self._remote_look()
            return Probe.missing(f"{missing} does not exist on {self.spec.host}") if missing else Probe.ok()
        for pattern in self.spec.creates:
            if not expand(ctx.resolve(pattern), ctx):
                return Probe.missing(f"{pattern} does not exist")
        return Probe.ok()

    def fingerprint_extra(self, ctx: StepContext) -> dict[str, Any]:
        if not self.spec.inputs:
            return {}
        if self.spec.host:
            return {"remote_input_digests": self._remote_look()[1]}
        found = {p: [str(x) for x in expand(ctx.resolve(p), ctx)] for p in self.spec.inputs}
        paths = [ctx.resolve(x) for matches in found.values() for x in matches]
        return {"inputs": found, "input_digests": content_digest(paths, ctx)}

    def teardown(self, ctx: StepContext, purge: bool, dry_run: bool) -> str | None:
        if not purge:
            return None
        if self.spec.host:
            return self._remote_teardown(ctx, dry_run)
        return "; ".join(remove_created(ctx, self.spec.creates, dry_run)) or None

    def _remote_teardown(self, ctx: StepContext, dry_run: bool) -> str | None:
        spec = self.spec
        assert spec.host is not None
        if not spec.creates:
            return None
        if dry_run:
            return f"would remove {', '.join(spec.creates)} on {spec.host}"
        cd = f"cd {remote.ssh.quote(spec.cwd)} || exit 1; " if spec.cwd else ""
        removes = "; ".join(
            f'{remote.match_lines(p)} | while IFS= read -r _p; do rm -rf -- "$_p"; done' for p in spec.creates
        )
        code, _ = remote.ssh.quick(spec.host, f"{cd}{removes}; :")
        return f"removed {', '.join(spec.creates)} on {spec.host}" if code == 0 else None

    def _remote_apply(self, ctx: StepContext) -> dict[str, Any]:
        spec = self.spec
        assert spec.host is not None
        self._seen = None
        result = remote.run(ctx, spec.host, spec.command, cwd=spec.cwd, env=spec.env)
        if result.returncode != 0:
            raise remote.failure(spec.host, result.returncode, spec.command, result.tail)
        if spec.creates:
            missing, _ = remote.observe(spec.host, spec.cwd, spec.creates, [])
            if missing:
                raise StepError(
                    f"the command succeeded but did not create {missing} on {spec.host}",
                    hint="fix the command or the `creates` path (relative paths are from the login directory or `cwd`)",
                    output_tail="\n".join(result.tail),
                )
        stdout = result.stdout[:-1] if result.stdout.endswith("\n") else result.stdout
        return {"rc": 0, "stdout": stdout, "cwd": spec.cwd or "~", "host": spec.host}

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        spec = self.spec
        if spec.host:
            return self._remote_apply(ctx)
        argv = argv_of(spec.command)
        cwd = ctx.resolve(spec.cwd) if spec.cwd else ctx.pipeline_dir
        env = {**ctx.env, **spec.env}
        if "PWD" in env:
            env["PWD"] = str(cwd)
        result = run_process(argv, ctx, cwd=cwd, env=env)
        if result.returncode != 0:
            shown = spec.command if isinstance(spec.command, str) else " ".join(spec.command)
            if isinstance(spec.command, str) and result.returncode == 127:
                hint = "the shell could not find a command (exit 127): check its name and PATH"
            else:
                hint = ""
            raise StepError(
                f"command exited with code {result.returncode}: {shown}",
                hint=hint,
                output_tail="\n".join(result.tail),
            )
        for pattern in spec.creates:
            if not expand(ctx.resolve(pattern), ctx):
                raise StepError(
                    f"the command succeeded but did not create {pattern}",
                    hint="fix the command or the `creates` path",
                    output_tail="\n".join(result.tail),
                )
        stdout = result.stdout[:-1] if result.stdout.endswith("\n") else result.stdout
        return {"rc": result.returncode, "stdout": stdout, "cwd": os.fspath(cwd)}

"""capture: run a command (on this host or inside a container) and keep its stripped stdout as `value`.

Example — the tutorial's way to get the AgentENV key::

    - name: aenv-key
      capture:
        container: "{{ steps.aenv.container_id }}"    # docker exec; the reference re-captures on a recreate
        command: [cat, /workspace/env/secrets/api-key]
        secret: true

With `secret: true` the value is kept in `.runner/secrets.json` (0600) and masked everywhere else; the
command's output never reaches the step log. A captured value is kept until the spec or an upstream step
changes: a converged apply runs nothing.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from runner.util.text import argv_of
from steps._support import remote
from steps._support.machine import machine_for
from steps.base import Command, Probe, SpecModel, StepContext, StepError, StepKind, env_mapping


class CaptureSpec(SpecModel):
    command: Command = Field(description="The command. A list is argv (no shell); a string runs under `sh -c`.")
    container: str | None = Field(None, description="Run it inside this container (name or id), as `docker exec`.")
    host: str | None = Field(
        None,
        description="Without `container`: the machine the command runs on, over ssh (a ~/.ssh/config alias, "
        "user@host or ssh://user@host:port). With `container`: its Docker Engine (unix://, tcp://, ssh://; default "
        "DOCKER_HOST, else the socket), or an ssh alias or user@host, where `docker exec` then runs.",
    )
    cwd: str | None = Field(None, description="Working directory (on the host, or inside the container).")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    secret: bool = Field(False, description="The value is a secret: kept 0600, masked in all output and state.")
    allow_empty: bool = Field(False, description="Accept an empty output (by default it is an error).")

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, value: Any) -> Any:
        return env_mapping(value)

    @model_validator(mode="after")
    def _host_kind(self) -> CaptureSpec:
        if self.host is not None and not (self.container and _engine_url(self.host)):
            remote.check_host(self.host)
        return self

    @field_validator("command")
    @classmethod
    def _not_empty(cls, value: str | list[str]) -> str | list[str]:
        if (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value):
            raise ValueError("the command is empty")
        return value


class CaptureStep(StepKind[CaptureSpec]):
    kind = "capture"
    Spec = CaptureSpec
    outputs = frozenset({"value"})
    on_machine = True  # the step's `host:` is read as `capture.host` (a machine, or that machine's engine)

    def remote_host(self, ctx: StepContext) -> str | None:
        host = self.spec.host
        if host and self.spec.container and _engine_url(host):
            return host if host.startswith("ssh://") else None  # an engine: over ssh, that machine's
        return host

    def secret_outputs(self) -> frozenset[str]:
        return frozenset({"value"}) if self.spec.secret else frozenset()

    def note(self, outputs: dict[str, Any]) -> str:
        """The value read, so a choice made from it (a version pin) is visible; never a secret one."""
        if self.spec.secret or "value" not in outputs:
            return ""
        value = str(outputs["value"])
        lines = value.splitlines() or [""]
        cut = len(lines) > 1 or len(lines[0]) > 60
        return f"= {lines[0][:60]}{'...' if cut else ''}"

    def probe(self, ctx: StepContext) -> Probe:
        if self.spec.secret and "value" not in ctx.stored_secrets:
            return Probe.missing("the captured secret is not in .runner/secrets.json")
        return Probe.ok()

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        """On the step's machine (this one, or `host`'s over ssh), or through a Docker Engine into `container`."""
        spec = self.spec
        argv = argv_of(spec.command)
        shown = spec.command if isinstance(spec.command, str) else " ".join(spec.command)
        engine = bool(spec.host and _engine_url(spec.host))
        machine = machine_for(None if engine else spec.host)
        if spec.container and machine.host is None:
            code, out = self._exec(ctx, argv)
        else:
            command, cwd = self._command(argv) if spec.container else (spec.command, spec.cwd)
            result = machine.run(ctx, command, cwd=cwd, env=spec.env, quiet=spec.secret)
            code, out = result.returncode, result.stdout
        value = out.strip()
        if code != 0:
            tail = "" if spec.secret else ctx.mask(value[-2000:])
            where = (f" in container {spec.container}" if spec.container else "") + machine.where
            hint = remote.ssh.missing_command_hint(machine.host) if code == 127 and machine.host else ""
            raise StepError(f"command exited with code {code}{where}: {shown}", hint=hint, output_tail=tail)
        if not value and not spec.allow_empty:
            raise StepError(f"the command printed nothing: {shown}", hint="set `allow_empty: true` if that is fine")
        return {"value": value}

    def _command(self, argv: list[str]) -> tuple[list[str], None]:
        """`docker exec` into `container` on the step's host; the step's `env` reaches it by name (`-e NAME`, its
        value exported on stdin), never on a command line."""
        spec = self.spec
        words = ["docker", "exec"]
        if spec.cwd:
            words += ["-w", spec.cwd]
        for name in spec.env:
            words += ["-e", name]
        return [*words, str(spec.container), *argv], None

    def _exec(self, ctx: StepContext, argv: list[str]) -> tuple[int, str]:
        from steps._support.docker_engine import api_error_text, connect, sdk

        docker = sdk()

        spec = self.spec
        client, address = connect(spec.host, ctx.env)
        try:
            container = client.containers.get(spec.container)
            if container.status != "running":
                raise StepError(f"container {spec.container} on {address} is {container.status}, not running")
            code, out = container.exec_run(argv, workdir=spec.cwd, environment=spec.env or None, demux=True)
        except docker.errors.NotFound:
            raise StepError(f"no container {spec.container!r} on {address}") from None
        except docker.errors.APIError as exc:
            raise StepError(f"docker exec in {spec.container} failed: {api_error_text(exc)}") from None
        finally:
            client.close()
        stdout, stderr = out if isinstance(out, tuple) else (out, b"")
        text = (stdout or b"").decode("utf-8", errors="replace")
        if code != 0 and not spec.secret and stderr:
            text += stderr.decode("utf-8", errors="replace")
        return int(code or 0), text


def _engine_url(host: str) -> bool:
    """A Docker Engine address, not an ssh destination: `container` then goes through the docker SDK."""
    return host.startswith(("unix://", "tcp://", "ssh://", "http://", "https://", "npipe://", "fd://"))

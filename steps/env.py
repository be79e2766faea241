"""env: variables exported to every later step, like `export` in a shell script.

Example::

    - name: settings
      env:
        E2B_API_URL: "http://{{ facts.host_ip }}:8000"

The variables reach every later step whether or not this step runs, and are written to `.runner/env.sh`
(mode 0600) so a shell can `source` them, or use `eval "$(runner env)"`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from pydantic import RootModel, field_validator

from runner.util.atomic import atomic_write
from steps.base import Probe, StepContext, StepKind, env_mapping

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EnvSpec(RootModel[dict[str, str]]):
    """A mapping of variable names to values."""

    @field_validator("root", mode="before")
    @classmethod
    def _strings(cls, value: Any) -> Any:
        return env_mapping(value)

    @field_validator("root")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not NAME.match(key):
                raise ValueError(f"{key!r} is not a valid variable name (letters, digits and _)")
        return value


def env_file_text(variables: dict[str, str]) -> str:
    lines = ["# written by runner: the variables exported by the pipeline's env steps"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in variables.items()]
    return "\n".join(lines) + "\n"


def write_env_file(path: Path, variables: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, env_file_text(variables), mode=0o600)


class EnvStep(StepKind[EnvSpec]):
    local_probe = True
    kind = "env"
    Spec = EnvSpec
    exports_env = True

    def exports(self) -> dict[str, str]:
        return dict(self.spec.root)

    def _wanted(self, ctx: StepContext) -> dict[str, str]:
        return {**ctx.exported, **self.exports()}

    def probe(self, ctx: StepContext) -> Probe:
        path = ctx.state_dir / "env.sh"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            return Probe.missing(f"{path} does not exist")
        present = set(text.splitlines())
        for key, value in self.exports().items():
            if f"export {key}={shlex.quote(value)}" not in present:
                return Probe.drift(f"{key} in {path} is not the declared value")
        return Probe.ok()

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        write_env_file(ctx.state_dir / "env.sh", self._wanted(ctx))
        return dict(self.exports())

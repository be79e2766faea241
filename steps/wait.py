"""wait: until an HTTP URL answers (2xx by default) or a TCP port accepts.

Example::

    - name: aenv-health
      wait:
        http: http://127.0.0.1:8000/health
        status: [204]
        timeout: 900     # the first start downloads the runtime

A passed wait is done until its spec or an upstream step (say, the container it waits on) changes: a converged
apply sends no request.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from steps._support import remote
from steps._support.readiness import Readiness, wait_ready
from steps.base import StepContext, StepKind


class WaitSpec(Readiness):
    host: str | None = Field(
        None,
        description="Wait as that machine sees the target, over ssh (a ~/.ssh/config alias, user@host or "
        "ssh://user@host:port): `http://127.0.0.1:8265` is then its own port. The connection is made there "
        "(ssh -W), so nothing needs installing on it.",
    )

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        return remote.check_host(value)


class WaitStep(StepKind[WaitSpec]):
    kind = "wait"
    Spec = WaitSpec
    outputs = frozenset({"answer", "target", "host"})
    changes_system = False
    cosmetic_fields = frozenset({"interval"})

    def remote_host(self) -> str | None:
        return self.spec.host

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        answer = wait_ready(self.spec, ctx.cancel, on_attempt=ctx.on_output, via=self.spec.host)
        out = {"answer": answer, "target": self.spec.target}
        return {**out, "host": self.spec.host} if self.spec.host else out

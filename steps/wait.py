"""wait: until an HTTP URL answers (2xx by default) or a TCP port accepts.

Example::

    - name: aenv-health
      wait:
        http: http://127.0.0.1:8000/health
        status: [204]
        timeout: 900     # the first start downloads the runtime

A passed wait is done until its spec or an upstream step (say, the container it waits on) changes: a converged
apply sends no request. With the step's `host:` the target is as that machine sees it (`http://127.0.0.1:8265`
is its own port): the connection is made there (ssh -W), so nothing needs installing on it.
"""

from __future__ import annotations

from typing import Any

from steps._support.readiness import Readiness, wait_ready
from steps.base import StepContext, StepKind


class WaitSpec(Readiness):
    """With the step's `host:`, the target as that machine sees it: `http://127.0.0.1:8265` is then its own port.
    The connection is made there (ssh -W), so nothing needs installing on it."""


class WaitStep(StepKind[WaitSpec]):
    kind = "wait"
    Spec = WaitSpec
    outputs = frozenset({"answer", "target", "host"})
    changes_system = False
    on_machine = True
    cosmetic_fields = frozenset({"interval"})

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        answer = wait_ready(self.spec, ctx.cancel, on_attempt=ctx.on_output, via=ctx.host)
        out = {"answer": answer, "target": self.spec.target}
        return {**out, "host": ctx.host} if ctx.host else out

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

from steps._support.readiness import Readiness, wait_ready
from steps.base import StepContext, StepKind


class WaitStep(StepKind[Readiness]):
    kind = "wait"
    Spec = Readiness
    outputs = frozenset({"answer", "target"})
    changes_system = False
    cosmetic_fields = frozenset({"interval"})

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        answer = wait_ready(self.spec, ctx.cancel, on_attempt=ctx.on_output)
        return {"answer": answer, "target": self.spec.target}

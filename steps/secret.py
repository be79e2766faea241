"""secret: a value generated once and kept, e.g. the AgentENV API key passed as AENV_API_KEY.

Example::

    - name: aenv-key
      secret: {prefix: e2b_, bytes: 24}      # e2b_ + 48 hex digits

    - name: aenv
      docker:
        env: {AENV_API_KEY: "{{ steps['aenv-key'].value }}"}

The value lives in `.runner/secrets.json` (mode 0600), never in state.json, and is masked by value in all
output, logs and state. It stays the same across applies, so a recreated container keeps its key;
`runner forget STEP` makes a new one on the next apply.
"""

from __future__ import annotations

import re
import secrets as random_source
from typing import Any

from pydantic import Field

from steps.base import Probe, SpecModel, StepContext, StepKind

PREFIX_CHARS = re.compile(r"^[A-Za-z0-9_.~-]*$")


class SecretSpec(SpecModel):
    prefix: str = Field("", max_length=64, pattern=PREFIX_CHARS.pattern, description="Text before the random part.")
    bytes: int = Field(24, ge=8, le=128, description="Random bytes, written as hex (two characters each).")


class SecretStep(StepKind[SecretSpec]):
    local_probe = True
    kind = "secret"
    Spec = SecretSpec
    outputs = frozenset({"value"})

    def _fits(self, value: str | None) -> bool:
        spec = self.spec
        if not value or not value.startswith(spec.prefix):
            return False
        body = value[len(spec.prefix) :]
        return len(body) == 2 * spec.bytes and all(c in "0123456789abcdef" for c in body)

    def secret_outputs(self) -> frozenset[str]:
        return frozenset({"value"})

    def probe(self, ctx: StepContext) -> Probe:
        if not self._fits(ctx.stored_secrets.get("value")):
            return Probe.missing("no kept value in .runner/secrets.json")
        return Probe.ok()

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        kept = ctx.stored_secrets.get("value")
        if self._fits(kept):
            ctx.changed = False  # the key it made before: nothing new
            return {"value": kept}
        spec = self.spec
        return {"value": spec.prefix + random_source.token_hex(spec.bytes)}

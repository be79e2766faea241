"""Why a step runs, waits or is left alone, as data: a :class:`Cause` (a kind and its data) and the field-level
:class:`Change` of a spec or of what a probe found. Nothing here words anything (runner/words.py does, for plan,
apply, explain and --json alike) and nothing here imports the rest of the project.

The cause kinds, with the data each carries:

======================  ==============================================================================
forced                  --
no_record               -- or, for a run step whose every `creates` exists: creates_exist, target
crashed                 started (epoch), running_now (plan cannot tell a crash from a run), left (count
                        of processes the dead run left, stopped before it runs again), left_shown
interrupted             finished
failed_before           error (its first line)
unknown_status          status
spec_changed            fields (the changed fields; the changes themselves ride beside the cause)
upstream_changed        steps; in apply, for those that ran before it: outputs ({step: [output names that
                        changed]}) and forced (the steps among them run by --force)
inputs_changed          --
probe                   status, text (what the kind's probe said), exit_code (a job that exited so)
up_to_date              text (what the probe said, or "")
restart_pending         inner (the cause of the re-run it holds back), live, step
held                    holds: [[step, "stopped" | "restart_pending"], ...] upstream, in file order
waits_on                roots (the failing steps), via, holds ({root: hold} for roots held, not failing),
                        happened (apply: they failed; plan: they would)
would_fail              problem
when_false              when
after_upstream          pending, never_ran, items (a for_each's count, or None), rerun_note
items_to_run            total, to_run: [[key, cause, [change, ...]], ...]
items_up_to_date        count
not_started             -- (apply after a failure without --keep-going)
(any ok cause)          order_only: the steps above it by file order alone that run now (it is not re-run
                        for them; its words say how it would be)
unreachable             problem, hint (its machine did not answer the probe: nothing ran, the record is kept)
======================  ==============================================================================
"""

from __future__ import annotations

from typing import Any

from runner.util.datatype import datatype, field


@datatype(frozen=True)
class Change:
    """One field-level change: `field` from `old` to `new` (None: added or removed). `note`: the kind's words
    where a change is not old -> new (pip's "e2b: 2.63.0 installed, wants <2.51" is field e2b, that note)."""

    field: str
    old: str | None = None
    new: str | None = None
    note: str = ""

    @classmethod
    def fact(cls, text: str) -> Change:
        """A change told in a kind's own words, with no field apart from them."""
        return cls("", note=text)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"field": self.field, "old": self.old, "new": self.new}
        if self.note:
            data["note"] = self.note
        return data


@datatype(frozen=True)
class Cause:
    kind: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        def plain(value: Any) -> Any:
            if isinstance(value, (Cause, Change)):
                return value.to_json()
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            return value

        return {"kind": self.kind, **{k: plain(v) for k, v in self.data.items()}}


def cause(kind: str, **data: Any) -> Cause:
    return Cause(kind, data)

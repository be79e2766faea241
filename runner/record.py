"""The step record: the one type that knows what state.json and the journal keep of a step.

A record is read from disk with :meth:`StepRecord.of` (anything but a mapping is no record) and written back
with :meth:`StepRecord.to_dict`; every change of a step's life is one constructor here — started, ended
badly, done, a for_each step's aggregate, marked done by hand — so the engine and the CLI read typed
properties and never a key. Keys this version does not know are kept as they were (a newer runner's
record survives an older one's edit).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.util.hashing import digest

# The statuses a record can have: a step is running (or its runner died inside it), done, failed, or was
# interrupted by a signal.
STARTED, DONE, FAILED, INTERRUPTED = "started", "done", "failed", "interrupted"


class StepRecord:
    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data: dict[str, Any] = dict(data)

    @classmethod
    def of(cls, data: Any) -> StepRecord | None:
        """A view of a stored record, shared and not copied: the store replaces a record, never edits it, and
        this class only reads (each change of a step's life below builds a new record)."""
        if type(data) is dict:
            view = cls.__new__(cls)
            view._data = data
            return view
        return cls(data) if isinstance(data, Mapping) else None

    def to_dict(self) -> dict[str, Any]:
        return dict(self._data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepRecord) and other._data == self._data

    def __repr__(self) -> str:
        return f"StepRecord({self._data!r})"

    # ---- what it says ----------------------------------------------------------------------------------

    @property
    def status(self) -> str:
        return str(self._data.get("status", ""))

    @property
    def run(self) -> str | None:
        """The run id of the apply that wrote this record (a crashed step's: the run that stopped inside it)."""
        value = self._data.get("run")
        return value if isinstance(value, str) else None

    @property
    def is_done(self) -> bool:
        return self.status == DONE

    @property
    def item_keys(self) -> list[str] | None:
        """A for_each step's record: its items' keys, in order; None for any other record."""
        value = self._data.get("for_each")
        return [str(k) for k in value] if isinstance(value, list) else None

    @property
    def kind(self) -> str:
        return str(self._data.get("kind", ""))

    @property
    def fingerprint(self) -> str | None:
        value = self._data.get("fingerprint")
        return str(value) if value is not None else None

    @property
    def spec(self) -> dict[str, Any] | None:
        """The rendered spec (masked) it was made with, for field-level changes; None when not kept."""
        value = self._data.get("spec")
        return value if isinstance(value, dict) else None

    @property
    def upstream(self) -> dict[str, str]:
        value = self._data.get("upstream")
        return dict(value) if isinstance(value, dict) else {}

    @property
    def outputs(self) -> dict[str, Any]:
        value = self._data.get("outputs")
        return dict(value) if isinstance(value, dict) else {}

    @property
    def output_digest(self) -> str:
        return str(self._data.get("output_digest", "none"))

    @property
    def recorded_output_digest(self) -> str | None:
        """The digest as recorded, None when the record has none (a for_each step's digest of its items)."""
        value = self._data.get("output_digest")
        return str(value) if value is not None else None

    @property
    def started(self) -> float | None:
        return _number(self._data.get("started"))

    @property
    def finished(self) -> float | None:
        return _number(self._data.get("finished"))

    @property
    def duration(self) -> float | None:
        return _number(self._data.get("duration"))

    @property
    def attempts(self) -> int:
        value = self._data.get("attempts")
        return value if isinstance(value, int) else 0

    @property
    def error(self) -> str:
        return str(self._data.get("error") or "")

    @property
    def first_error_line(self) -> str:
        return next(iter(self.error.splitlines()), "")

    @property
    def log(self) -> str:
        return str(self._data.get("log") or "")

    # ---- the changes of a step's life ------------------------------------------------------------------

    @staticmethod
    def starting(previous: StepRecord | None, when: float, run: str, pid: int, log: str) -> StepRecord:
        """A step begins: the previous record's fields stay (its outputs, its fingerprint) under `started`."""
        data = previous.to_dict() if previous else {}
        data.update(status=STARTED, started=when, run=run, pid=pid, log=log)
        return StepRecord(data)

    def ended(self, interrupted: bool, when: float, duration: float, attempts: int, error: str) -> StepRecord:
        """A step failed, or a signal stopped it: the rest of the record is kept."""
        data = self.to_dict()
        data.update(
            status=INTERRUPTED if interrupted else FAILED,
            finished=when,
            duration=duration,
            attempts=attempts,
            error=error,
        )
        return StepRecord(data)

    @staticmethod
    def done(
        *,
        kind: str,
        fingerprint: str,
        spec: Any,
        upstream: dict[str, str],
        outputs: dict[str, Any],
        output_digest: str,
        started: float,
        finished: float,
        duration: float,
        attempts: int,
        run: str,
        reason: str,
        log: str = "",
        with_log: bool = True,
    ) -> StepRecord:
        data: dict[str, Any] = {
            "status": DONE,
            "kind": kind,
            "fingerprint": fingerprint,
            "spec": spec,
            "upstream": upstream,
            "outputs": outputs,
            "output_digest": output_digest,
            "started": started,
            "finished": finished,
            "duration": duration,
            "attempts": attempts,
            "run": run,
            "reason": reason,
        }
        if with_log:
            data["log"] = log
        return StepRecord(data)

    @staticmethod
    def marked_done(
        previous: StepRecord | None,
        *,
        kind: str,
        fingerprint: str,
        spec: Any,
        upstream: dict[str, str],
        when: float,
        run: str,
        outputs: dict[str, Any] | None = None,
    ) -> StepRecord:
        """`runner mark-done`: the live state accepted as done; the outputs it had stay (or those the kind
        gave when it adopted what it found)."""
        if outputs is None:
            outputs = previous.outputs if previous else {}
        return StepRecord.done(
            kind=kind,
            fingerprint=fingerprint,
            spec=spec,
            upstream=upstream,
            outputs=outputs,
            output_digest=digest({"fingerprint": fingerprint, "outputs": outputs}),
            started=when,
            finished=when,
            duration=0.0,
            attempts=0,
            run=run,
            reason="marked done by hand",
            with_log=False,
        )

    @staticmethod
    def loop_done(
        *,
        kind: str,
        keys: list[str],
        items: list[StepRecord],
        outputs: dict[str, Any],
        output_digest: str,
        finished: float,
        duration: float,
        run: str,
    ) -> StepRecord:
        """A for_each step's own record: its items' fingerprints and outputs, gathered."""
        return StepRecord(
            {
                "status": DONE,
                "kind": kind,
                "for_each": keys,
                "fingerprint": digest({"items": [r.fingerprint for r in items]}),
                "outputs": outputs,
                "output_digest": output_digest,
                "finished": finished,
                "duration": duration,
                "run": run,
            }
        )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

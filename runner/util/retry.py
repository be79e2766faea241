"""Retrying with tenacity, where a wait between attempts ends at once when the run is cancelled."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tenacity import RetryCallState, Retrying, stop_after_attempt


def retrying(
    *,
    attempts: int,
    wait: Any,
    retry: Any,
    cancel: threading.Event,
    interrupted: Callable[[], BaseException],
    before_retry: Callable[[int, BaseException | None], None],
) -> Retrying:
    """`for attempt in retrying(...): with attempt: ...` — up to `attempts` tries; `before_retry(n, error)` is
    told of each failed try that will be retried; a cancel during a wait raises `interrupted()`."""

    def sleep(seconds: float) -> None:
        if cancel.wait(seconds):
            raise interrupted()

    def notify(state: RetryCallState) -> None:
        before_retry(state.attempt_number, state.outcome.exception() if state.outcome else None)

    return Retrying(
        stop=stop_after_attempt(attempts), wait=wait, retry=retry, reraise=True, before_sleep=notify, sleep=sleep
    )

"""A step's `timeout:`, owned by the executor: the kind's apply runs in a thread of its own and the executor
waits for it up to the deadline. Past it, the step is cancelled (its own cancel event, which every kind's
waits and runner's process runner watch), then what carries its process tag is stopped (SIGTERM, then SIGKILL),
and the attempt fails as timed out — whether or not the kind ever looks at `ctx.timeout`. A kind that keeps
the timeout itself (a creates glob, a readiness wait) gets KIND_FIRST seconds to fail in its own words first.

A kind stuck in Python code that checks nothing (a read with no timeout) cannot be killed from outside: its
thread is left behind (a daemon: it ends with the process) and the step is recorded as timed out all the same.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from runner.util import sweep
from steps.base import StepError

KIND_FIRST = 0.5  # seconds past the timeout a kind that keeps it itself gets to say so in its own words
CANCEL_GRACE = 2.0  # seconds a cancelled kind gets to return before its processes are stopped by tag
KILL_WAIT = 3.0  # after that, seconds to wait for it to return before it is left behind


class StepCancel(threading.Event):
    """A step's own cancel: set by its deadline, and set whenever the run's cancel (a signal) is."""

    def __init__(self, run: threading.Event) -> None:
        super().__init__()
        self._run = run

    def is_set(self) -> bool:
        return super().is_set() or self._run.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = 0.05 if end is None else min(0.05, end - time.monotonic())
            if left <= 0:
                return False
            super().wait(left)
        return True


def within(
    work: Callable[[], dict[str, Any]],
    timeout: float,
    cancel: StepCancel,
    tag: str,
    name: str,
    hurry: threading.Event,
) -> dict[str, Any]:
    """`work()`'s outputs if it ends within `timeout` seconds; else StepError "timed out after Ns"."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["outputs"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the executor's thread
            box["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=run, name=f"step {name}", daemon=True)
    worker.start()
    if not done.wait(timeout + KIND_FIRST):
        cancel.set()
        stopped = done.wait(0 if hurry.is_set() else CANCEL_GRACE)
        if not stopped and tag:
            sweep.stop([tag], 0.0 if hurry.is_set() else 1.0)
            stopped = done.wait(KILL_WAIT)
        message = f"timed out after {timeout:g}s"
        if not stopped:
            message += " (its kind did not stop when asked; what it runs in this process was left to end)"
        raise StepError(message, hint="raise the step's `timeout:`, or find why it takes that long (its log)")
    if "error" in box:
        raise box["error"]
    outputs: dict[str, Any] = box["outputs"]
    return outputs

"""Crash points for the reliability tests.

`RUNNER_FAULT=NAME[:N]` makes this process kill itself with SIGKILL the Nth time (default: the first) it
passes the point NAME — the way a power cut or an OOM kill would end it there. Outside those tests the
variable is unset and a point costs a string comparison. Points: started, applied (engine), journal-torn,
snapshot (state), git-cloned (git), docker-removed (docker).
"""

from __future__ import annotations

import os
import signal
import threading

_NAME, _, _NTH = os.environ.get("RUNNER_FAULT", "").partition(":")
_hits: dict[str, int] = {}
_lock = threading.Lock()


def hit(name: str) -> bool:
    """Count a pass of point `name`; True when this is the pass that must crash."""
    if name != _NAME:
        return False
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        return _hits[name] == int(_NTH or 1)


def kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def point(name: str) -> None:
    if hit(name):
        kill()

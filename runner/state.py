"""The .runner/ store: state.json (schema-versioned, written atomically), logs, and the lock.

Every step transition (started, finished, failed, interrupted) rewrites state.json through a temporary file,
fsync and rename, so a crash at any instant leaves either the old or the new state, never half of one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runner.errors import LockedError, StateError

SCHEMA_VERSION = 1


def now() -> float:
    return time.time()


def iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class StateStore:
    """Per-step records. Thread-safe: under `-j` several steps finish at once."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.path = state_dir / "state.json"
        self._lock = threading.Lock()
        self.data: dict[str, Any] = {"schema": SCHEMA_VERSION, "steps": {}}

    def load(self) -> StateStore:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return self
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StateError(
                f"{self.path} is not valid JSON ({exc.msg} at line {exc.lineno}); "
                "move it away to start over (every step will be probed and re-run)"
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("steps"), dict):
            raise StateError(f"{self.path} does not hold runner state; move it away to start over")
        schema = data.get("schema")
        if schema != SCHEMA_VERSION:
            raise StateError(
                f"{self.path} has schema {schema!r}; this runner reads schema {SCHEMA_VERSION}: upgrade runner"
            )
        self.data = data
        return self

    @property
    def steps(self) -> dict[str, dict[str, Any]]:
        steps: dict[str, dict[str, Any]] = self.data["steps"]
        return steps

    def record(self, name: str) -> dict[str, Any] | None:
        return self.steps.get(name)

    def update(self, name: str, **fields: Any) -> None:
        with self._lock:
            rec = self.steps.setdefault(name, {})
            rec.update(fields)
            self._write()

    def replace(self, name: str, record: dict[str, Any] | None) -> None:
        with self._lock:
            if record is None:
                self.steps.pop(name, None)
            else:
                self.steps[name] = record
            self._write()

    def _write(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, json.dumps(self.data, indent=1, sort_keys=True) + "\n")
        except OSError as exc:
            raise StateError(f"cannot write {self.path}: {exc.strerror}; the previous state is kept") from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def pipeline_lock(state_dir: Path, notice: Any = print) -> Iterator[None]:
    """One apply per pipeline at a time. flock is released by the kernel when its holder dies."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StateError(f"cannot create {state_dir}: {exc.strerror}") from None
    path = state_dir / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
            since = iso(holder.get("since")) if isinstance(holder.get("since"), (int, float)) else "?"
            raise LockedError(f"another apply holds the lock on this pipeline: {who}, since {since} ({path})") from None
        previous = _read_holder(fd)
        pid = previous.get("pid")
        if isinstance(pid, int) and previous.get("host") == socket.gethostname() and not _alive(pid):
            notice(
                f"notice: took over the lock left by pid {pid} (no longer running), since {iso(previous.get('since'))}"
            )
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": now()}).encode())
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 4096)
        data = json.loads(raw.decode() or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def lock_holder(state_dir: Path) -> dict[str, Any] | None:
    """Who holds the lock now (for plan/status, which never take it), or None."""
    path = state_dir / "lock"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd) or {"pid": "?"}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)

"""A file written so that a reader sees the old one or the new one, never a torn one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from runner.util import faults


def atomic_write(path: Path, text: str, mode: int = 0o644, crash_point: str | None = None) -> None:
    """Write `text` to `path` so that a reader sees the old file or the new one, never a torn one: a unique
    temporary sibling, fsync, chmod `mode`, rename, fsync of the directory. `crash_point` names the
    reliability tests' kill point just before the rename (runner/util/faults.py)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        if crash_point:
            faults.point(crash_point)
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

"""Files as kinds and the engine use them: globs that must exist, content hashes, and the one atomic write."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from steps._support import faults
from steps._support.words import is_template

if TYPE_CHECKING:
    from steps.base import StepContext

GLOB_CHARS = set("*?[")


def check_patterns(patterns: list[str]) -> list[str]:
    """For validators: refuse patterns that cannot mean what was meant (empty, an unclosed `[`, NUL)."""
    for pattern in patterns:
        if is_template(pattern):
            continue  # checked once rendered
        if not pattern.strip():
            raise ValueError("an empty path pattern")
        if "\x00" in pattern:
            raise ValueError(f"{pattern!r} holds a NUL byte")
        depth = 0
        for char in pattern:
            if char == "[":
                depth += 1
            elif char == "]" and depth:
                depth -= 1
        if depth:
            raise ValueError(f"{pattern!r} has a `[` that is never closed (write `[[]` for a literal `[`)")
    return patterns


def is_glob(pattern: str) -> bool:
    return any(c in GLOB_CHARS for c in pattern)


def expand(pattern: Path) -> list[Path]:
    """The paths a pattern names: itself if it is a plain path that exists, or its glob matches."""
    text = str(pattern)
    if not is_glob(text):
        return [pattern] if pattern.exists() or pattern.is_symlink() else []
    return sorted(Path(p) for p in glob.glob(text, recursive=True))


def content_digest(paths: list[Path]) -> dict[str, str]:
    """sha256 of each file (directories are walked), keyed by path."""
    digests: dict[str, str] = {}
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            h = hashlib.sha256()
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            digests[str(f)] = h.hexdigest()
    return digests


def atomic_write(path: Path, text: str, mode: int = 0o644, crash_point: str | None = None) -> None:
    """Write `text` to `path` so that a reader sees the old file or the new one, never a torn one: a unique
    temporary sibling, fsync, chmod `mode`, rename, fsync of the directory. `crash_point` names the
    reliability tests' kill point just before the rename (steps/_support/faults.py)."""
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


def remove_created(ctx: StepContext, patterns: list[str], dry_run: bool) -> list[str]:
    """`runner down --purge` of a step's `creates`: the regular files (and symlinks) they match, never a
    directory, never through a link. Returns what was (or would be) removed, in words."""
    files = [p for pattern in patterns for p in expand(ctx.resolve(pattern)) if p.is_symlink() or p.is_file()]
    if not files:
        return []
    if not dry_run:
        for path in files:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    shown = ", ".join(str(p) for p in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return [("would remove " if dry_run else "removed ") + shown]

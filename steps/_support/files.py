"""Path patterns shared by kinds: globs that must exist, and content hashes of input files."""

from __future__ import annotations

import glob
import hashlib
from pathlib import Path

GLOB_CHARS = set("*?[")


def check_patterns(patterns: list[str]) -> list[str]:
    """For validators: refuse patterns that cannot mean what was meant (empty, an unclosed `[`, NUL)."""
    for pattern in patterns:
        if "{{" in pattern or "{%" in pattern:
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

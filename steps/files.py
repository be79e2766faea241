"""Path patterns shared by kinds: globs that must exist, and content hashes of input files."""

from __future__ import annotations

import glob
import hashlib
from pathlib import Path

GLOB_CHARS = set("*?[")


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

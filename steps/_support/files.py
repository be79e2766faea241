"""Files as kinds and the engine use them: globs that must exist, content hashes, and the one atomic write."""

from __future__ import annotations

import atexit
import contextlib
import glob
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.util.atomic import atomic_write
from runner.util.text import is_template

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


def expand(pattern: Path, ctx: StepContext | None = None) -> list[Path]:
    """The paths a pattern names: itself if it is a plain path that exists, or its glob matches.

    With `ctx`, a glob is expanded so that it can be given up: a Ctrl-C (ctx.cancel) or the step's timeout ends
    the wait (`creates: ["/**/x"]` walks the whole disk) with a StepError; the walk itself is left to finish in
    the background."""
    text = str(pattern)
    if not is_glob(text):
        return [pattern] if os.path.lexists(text) else []  # it, or a link to anything (one lstat)
    if ctx is None:
        return sorted(Path(p) for p in glob.glob(text, recursive=True))
    found = _cancellable(lambda: glob.glob(text, recursive=True), ctx, f"expanding the pattern {text}")
    return sorted(Path(p) for p in found)


def _cancellable(work: Callable[[], list[str]], ctx: StepContext, what: str) -> list[str]:
    from steps.base import StepError

    box: list[list[str] | BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append(work())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name="glob").start()
    started = time.monotonic()
    while not done.wait(0.05):
        if ctx.cancel.is_set():
            raise StepError("interrupted")
        if ctx.timeout is not None and time.monotonic() - started > ctx.timeout:
            raise StepError(
                f"{what} took longer than the step's timeout ({ctx.timeout:g}s)",
                hint="narrow the pattern: a `**` near / walks the whole disk",
            )
    result = box[0]
    if isinstance(result, BaseException):
        raise result
    return result


def content_digest(paths: list[Path], ctx: StepContext | None = None) -> dict[str, str]:
    """sha256 of each file (directories are walked), keyed by path.

    Only regular files are read: a device (/dev/zero), a FIFO or a socket named directly is a StepError (it
    would never end); inside a walked directory they are left out. A file whose (device, inode, size, mtime,
    ctime) is as when it was last hashed is not read again (the cache in .runner/cache/hashes.json, as git's
    index does). With `ctx`, a Ctrl-C or the step's timeout stops the hashing."""
    from steps.base import StepError

    cache = _hash_cache(ctx.state_dir) if ctx is not None else None
    started = time.monotonic()
    digests: dict[str, str] = {}

    def check() -> None:
        if ctx is None:
            return
        if ctx.cancel.is_set():
            raise StepError("interrupted")
        if ctx.timeout is not None and time.monotonic() - started > ctx.timeout:
            raise StepError(f"hashing the inputs took longer than the step's timeout ({ctx.timeout:g}s)")

    for path in paths:
        try:
            top = path.stat()
        except OSError as exc:
            raise StepError(f"cannot read {path}: {exc.strerror}", field="inputs") from None
        if stat.S_ISDIR(top.st_mode):
            files = []
            for p in sorted(path.rglob("*")):
                check()
                with contextlib.suppress(OSError):
                    if stat.S_ISREG(p.stat().st_mode):
                        files.append(p)
        elif stat.S_ISREG(top.st_mode):
            files = [path]
        else:
            raise StepError(
                f"{path} is not a regular file ({_kind_of(top.st_mode)}): its content has no end to fingerprint; "
                "name the files the command reads",
                field="inputs",
            )
        for f in files:
            st = f.stat()
            key = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
            known = cache.get(str(f), key) if cache is not None else None
            if known is not None:
                digests[str(f)] = known
                continue
            h = hashlib.sha256()
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    check()
                    h.update(chunk)
            digests[str(f)] = h.hexdigest()
            if cache is not None:
                cache.put(str(f), key, digests[str(f)])
    return digests


def _kind_of(mode: int) -> str:
    for test, word in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return word
    return "not a regular file"


class _HashCache:
    """sha256 of files by path, valid while (device, inode, size, mtime_ns, ctime_ns) is unchanged. Written
    once, when the process ends, if something was added (a cache only: any error leaves it unwritten)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.dirty = False
        self.entries: dict[str, list[Any]] = {}
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and isinstance(data.get("files"), dict):
                self.entries = data["files"]

    def get(self, name: str, key: list[int]) -> str | None:
        with self.lock:
            entry = self.entries.get(name)
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == key and isinstance(entry[1], str):
            return entry[1]
        return None

    def put(self, name: str, key: list[int], digest: str) -> None:
        with self.lock:
            self.entries[name] = [key, digest]
            if not self.dirty:
                self.dirty = True
                atexit.register(self.save)

    def save(self) -> None:
        with self.lock:
            if not self.dirty:
                return
            self.dirty = False
            text = json.dumps({"version": 1, "files": self.entries}, separators=(",", ":"))
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.parent.is_symlink():
                atomic_write(self.path, text, mode=0o600)


_caches: dict[str, _HashCache] = {}
_caches_lock = threading.Lock()


def _hash_cache(state_dir: Path) -> _HashCache:
    with _caches_lock:
        cache = _caches.get(str(state_dir))
        if cache is None:
            cache = _caches[str(state_dir)] = _HashCache(state_dir / "cache" / "hashes.json")
        return cache


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

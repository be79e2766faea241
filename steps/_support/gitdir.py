"""Reading a clone's `.git` in-process, without spawning git: HEAD, refs, packed-refs and the origin URL; and
what git's own words say of a failure (NETWORK_ERRORS), for the kind here and its script on a host.

The git kind's probe uses only this, so a converged apply costs a few file reads per clone.
"""

from __future__ import annotations

import configparser
from pathlib import Path

# what git says when the network, not the request, failed: such a failure is retried (here and on a host)
NETWORK_ERRORS = (
    "could not read from remote",
    "unable to access",
    "connection refused",
    "connection reset",
    "connection timed out",
    "timed out",
    "early eof",
    "the remote end hung up",
    "unexpected disconnect",
    "could not resolve host",
    "failed to connect",
    "fetch-pack: invalid index-pack output",
    "rpc failed",
)


def git_dir(worktree: Path) -> Path | None:
    dot = worktree / ".git"
    if dot.is_dir():
        return dot
    if dot.is_file():  # a worktree or submodule: "gitdir: <path>"
        text = dot.read_text(encoding="utf-8", errors="replace").strip()
        if text.startswith("gitdir:"):
            target = Path(text[len("gitdir:") :].strip())
            return target if target.is_absolute() else (worktree / target).resolve()
    return None


def resolve_ref(gitdir: Path, ref: str) -> str | None:
    """The object name a full ref (refs/heads/main) points at: loose file first, then packed-refs."""
    for _ in range(10):  # symbolic refs, bounded
        loose = gitdir / ref
        if loose.is_file():
            text = loose.read_text(encoding="utf-8", errors="replace").strip()
            if text.startswith("ref: "):
                ref = text[5:].strip()
                continue
            return text or None
        packed = gitdir / "packed-refs"
        if packed.is_file():
            for line in packed.read_text(encoding="utf-8", errors="replace").splitlines():
                if line and line[0] not in "#^":
                    sha, _, name = line.partition(" ")
                    if name.strip() == ref:
                        return sha
        return None
    return None


def head(gitdir: Path) -> tuple[str | None, str | None]:
    """(commit of HEAD, branch name or None when detached)."""
    try:
        text = (gitdir / "HEAD").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None, None
    if text.startswith("ref: "):
        ref = text[5:].strip()
        branch = ref[len("refs/heads/") :] if ref.startswith("refs/heads/") else None
        return resolve_ref(gitdir, ref), branch
    return text or None, None


def origin_url(gitdir: Path) -> str | None:
    parser = configparser.RawConfigParser(strict=False)
    try:
        parser.read(gitdir / "config", encoding="utf-8")
    except (configparser.Error, OSError):
        return None
    section = 'remote "origin"'
    if parser.has_section(section) and parser.has_option(section, "url"):
        return parser.get(section, "url").strip()
    return None


def same_url(a: str | None, b: str | None) -> bool:
    def norm(url: str) -> str:
        url = url.strip().rstrip("/")
        return url[:-4] if url.endswith(".git") else url

    return a is not None and b is not None and norm(a) == norm(b)

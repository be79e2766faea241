"""Reading a clone's `.git` in-process, without spawning git: HEAD, refs, packed-refs and the origin URL; and
what git's own words say of a failure (NETWORK_ERRORS), for the kind here and its script on a host.

The git kind's probe uses only this, so a converged apply costs a few file reads per clone.
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path
from typing import TYPE_CHECKING

from runner.util.datatype import datatype

if TYPE_CHECKING:
    from steps.base import StepContext

# what the system says through git when the disk is full: a failure of its own, never retried (git's "early EOF"
# and "the remote end hung up" that follow it would otherwise read as the network)
DISK_FULL = ("no space left on device", "disk quota exceeded")

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


@datatype
class Clone:
    """What a clone's directory is: "none" (nothing, or an empty directory), "notgit" (something else), or
    "clone" with its origin, HEAD and branch; `remote` is the origin's head of the ref asked for ("" when the
    origin did not answer), None when not asked."""

    state: str
    url: str | None = None
    commit: str | None = None
    branch: str | None = None
    remote: str | None = None


@datatype
class CloneFact:
    """The git kind's probe as a fact (steps/_support/facts.py): here from `.git` in-process, with no git process
    unless `ask_ref` asks the origin; there one script, with that machine's git."""

    dest: str  # as the spec says it: on another machine `~/` is its home and a relative path the login directory's
    url: str  # the origin asked with `ask_ref` (here; there the clone's own origin is asked)
    ask_ref: str | None = None  # a branch name or HEAD: ask the origin where it is now

    def here(self, ctx: StepContext) -> Clone:
        dest = ctx.resolve(self.dest)
        gitdir = git_dir(dest)
        if gitdir is None:
            busy = dest.is_dir() and any(dest.iterdir()) if dest.is_dir() else os.path.lexists(dest)
            return Clone("notgit" if busy else "none")
        commit, branch = head(gitdir)
        found = Clone("clone", origin_url(gitdir), commit, branch)
        if self.ask_ref is not None:
            found.remote = _ls_remote(ctx, self.url, self.ask_ref)
        return found

    def script(self) -> str:
        from steps._support.remote import glob_word
        from steps._support.ssh import quote

        word = glob_word(self.dest) if self.dest.startswith("~") else quote(self.dest)
        lines = [
            f"cd {word} 2>/dev/null || {{ echo NONE; exit 0; }}",
            '[ -n "$(ls -A)" ] || { echo NONE; exit 0; }',
            '[ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ] || { echo NOTGIT; exit 0; }',
            'echo "URL $(git config --get remote.origin.url)"',
            'echo "HEAD $(git rev-parse -q --verify HEAD)"',
            'echo "BRANCH $(git symbolic-ref -q --short HEAD)"',
        ]
        if self.ask_ref is not None:
            what = "HEAD" if self.ask_ref == "HEAD" else f"refs/heads/{self.ask_ref}"
            ask = f"GIT_TERMINAL_PROMPT=0 git ls-remote origin {quote(what)} 2>/dev/null"
            lines.append(f'echo "REMOTE $({ask} | head -n 1 | cut -f1)"')
        return "\n".join(lines)

    def parse(self, code: int, out: str) -> Clone:
        said: dict[str, str] = {}
        for line in out.splitlines():
            key, _, value = line.partition(" ")
            said[key] = value.strip()
        if "NONE" in said:
            return Clone("none")
        if "NOTGIT" in said:
            return Clone("notgit")
        remote = said.get("REMOTE") if self.ask_ref is not None else None
        return Clone("clone", said.get("URL") or None, said.get("HEAD") or None, said.get("BRANCH") or None, remote)


def _ls_remote(ctx: StepContext, url: str, ref: str) -> str:
    """Where the origin's ref is now (git ls-remote): its commit, "" when it has no such ref."""
    import subprocess

    from steps.base import StepError

    try:
        proc = subprocess.run(
            ["git", "ls-remote", url, ref if ref == "HEAD" else f"refs/heads/{ref}"],
            capture_output=True,
            text=True,
            timeout=ctx.timeout or 60,
            env={**ctx.env, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "/bin/true", "LC_ALL": "C"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StepError(f"git ls-remote {url} failed: {exc}") from None
    if proc.returncode != 0:
        raise StepError(f"git ls-remote {url} failed: {proc.stderr.strip()[-300:]}")
    lines = proc.stdout.strip().splitlines()
    return lines[0].split()[0] if lines else ""

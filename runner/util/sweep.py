"""Nothing a step started outlives it unless it ended well: every process a step starts carries a tag in its
environment (RUNNER_STEP_TAG), inherited by all it starts in turn — setsid'd and double-forked children too, which
leave the step's process group. What carries a tag is found in /proc and stopped:

- by the engine, when a step fails, times out or is interrupted (a step that ends well keeps what it left
  running on purpose in a session of its own: `ray start`, a daemon);
- by the guardian, a small process started once per apply (`python sweep.py --guard`, reading a pipe from the
  runner), when the runner dies — kill -9 included, which no signal handler sees: the pipe's end of file is how it
  knows, and it stops what the steps still running had started;
- by the next apply, before it runs again a step that a crashed run left `started`, and it reports what it found.

A process that clears its environment (`env -i`) escapes the tag; so does anything that re-parents itself into
another service (a container's processes belong to the Docker daemon, a Ray job to Ray). This file imports only
the standard library: the guardian runs it as a script with any interpreter.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

VARIABLE = "RUNNER_STEP_TAG"
_NEEDLE = VARIABLE.encode() + b"="


def step_tag(state_dir: str, run_id: str, name: str) -> str:
    """The tag of one run of one step of one pipeline: the next apply recomputes it from the crashed record."""
    return hashlib.sha256(f"{state_dir}\0{run_id}\0{name}".encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Leftover:
    pid: int
    command: str
    pgid: int = 0


def _tag_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            data = fh.read()
    except OSError:  # gone, or another user's
        return None
    if data.startswith(_NEEDLE):
        at = len(_NEEDLE)
    else:
        at = data.find(b"\0" + _NEEDLE)
        if at < 0:
            return None
        at += 1 + len(_NEEDLE)
    end = data.find(b"\0", at)
    return data[at : end if end >= 0 else len(data)].decode("ascii", "replace")


def command_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
    except OSError:
        return "?"


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def find(tags: Iterable[str]) -> list[tuple[int, str]]:
    """The live processes (pid, tag) carrying one of `tags`; zombies and this process are left out."""
    wanted = set(tags)
    if not wanted:
        return []
    me = os.getpid()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me:
            continue
        tag = _tag_of(pid)
        if tag in wanted and not _is_zombie(pid):
            found.append((pid, tag))
    return found


def _signal(pid: int, sig: int, tags: set[str]) -> bool:
    """Signal pid if it still carries one of `tags`, through a pidfd where there is one (a pid reused between
    the look and the signal is never hit)."""
    pidfd = -1
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(pid)
    try:
        if _tag_of(pid) not in tags:
            return False
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def describe(left: list[Leftover], mask: Callable[[str], str] = lambda text: text) -> tuple[str, str]:
    """`N process(es)`, and the first three by pid and command, for a notice."""
    shown = ", ".join(f"{p.pid} ({mask(p.command)})" for p in left[:3])
    more = f" and {len(left) - 3} more" if len(left) > 3 else ""
    return f"{len(left)} process(es)", f"{shown}{more}"


def stop(tags: Iterable[str], grace: float = 2.0, limit: float = 10.0) -> list[Leftover]:
    """Stop every process carrying one of `tags`: SIGTERM, `grace` seconds, then SIGKILL, again until none is
    left (what they start meanwhile is found the next time round). Returns what was found, first seen first."""
    wanted = set(tags)
    seen: dict[int, Leftover] = {}
    deadline = time.monotonic() + limit
    termed: set[int] = set()
    first = time.monotonic()
    while time.monotonic() < deadline:
        live = find(wanted)
        if not live:
            break
        for pid, _tag in live:
            if pid not in seen:
                with contextlib.suppress(OSError):
                    seen[pid] = Leftover(pid, command_of(pid), os.getpgid(pid))
            if pid not in termed:
                _signal(pid, signal.SIGTERM, wanted)
                termed.add(pid)
            elif time.monotonic() - first >= grace:
                _signal(pid, signal.SIGKILL, wanted)
        time.sleep(0.05)
    return list(seen.values())


class Guardian:
    """The runner's side of the guardian: `hold(tag)` before a step starts a process, `release(tag)` when the
    step is over. The guardian process is started by the first hold, once per runner process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._held: set[str] = set()
        self._broken = False

    def hold(self, tag: str) -> bool:
        """True when a guardian watches the tag (False: it could not be started, or died)."""
        with self._lock:
            if tag not in self._held:
                self._held.add(tag)
                if not self._broken:
                    self._send(f"+{tag}\n")
            return not self._broken

    def holds(self, tag: str) -> bool:
        with self._lock:
            return tag in self._held

    def release(self, tag: str) -> None:
        with self._lock:
            if tag not in self._held:
                return
            self._held.discard(tag)
            if not self._broken:
                self._send(f"-{tag}\n")

    def _send(self, line: str) -> None:
        if self._proc is None:
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", os.path.abspath(__file__), "--guard"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # a Ctrl-C at the terminal or a kill of runner's group spares it
                    close_fds=True,
                )
            except OSError:
                self._broken = True
                return
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(line.encode())
            self._proc.stdin.flush()
        except OSError:  # the guardian is gone: the engine's own sweep and the next apply's remain
            self._broken = True

    def close(self) -> None:
        """The apply is over: the guardian exits at the end of its pipe (stopping what is still held, as at a
        crash; normally nothing is). Not waited for: it needs no more of the runner."""
        with self._lock:
            if self._proc is not None and self._proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self._proc.stdin.close()
            self._proc = None
            self._held.clear()


GUARDIAN = Guardian()


def guard_main() -> int:
    """The guardian: read `+TAG`/`-TAG` lines until the runner's end of the pipe closes, then stop what the
    tags still held had started."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    held: set[str] = set()
    stdin = sys.stdin.buffer
    while True:
        try:
            line = stdin.readline()
        except OSError:
            break
        if not line:
            break
        text = line.decode("ascii", "replace").strip()
        if text.startswith("+"):
            held.add(text[1:])
        elif text.startswith("-"):
            held.discard(text[1:])
    if held:
        stop(held)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--guard"]:
        sys.exit(guard_main())
    print("usage: sweep.py --guard", file=sys.stderr)
    sys.exit(2)

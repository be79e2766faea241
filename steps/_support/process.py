"""Running a child process in its own process group, with a log, a timeout and cancellation."""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steps._support import sweep
from steps.base import StepContext, StepError

TAIL_LINES = 20
STDOUT_LIMIT = 64 * 1024


@dataclass
class Completed:
    returncode: int
    stdout: str
    tail: list[str]


def _kill_group(
    proc: subprocess.Popen[bytes], grace: float = 3.0, sig: int = signal.SIGTERM, hurry: threading.Event | None = None
) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc.poll() is not None or (hurry is not None and hurry.is_set()):
            break
        time.sleep(0.05)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _die_with_parent() -> None:  # runs in the child between fork and exec
    """The child gets SIGKILL when runner dies, even by kill -9 (Linux's PR_SET_PDEATHSIG), so a crashed
    apply leaves no installer or command running behind it; a normal stop still goes through the process
    group."""
    prctl = _prctl()
    if prctl is not None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@functools.lru_cache(maxsize=1)
def _prctl() -> Any:
    """libc's prctl, loaded the first time a process is run (ctypes stays off the converged path)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _lines(stream: Any) -> Iterator[bytes]:
    """Lines as they arrive, each with its end: `\n`, or `\r` alone for a progress update."""
    pending = b""
    for chunk in iter(lambda: stream.read1(65536), b""):
        pending += chunk
        start = 0
        for i, byte in enumerate(pending):
            if byte == 10:  # \n
                yield pending[start : i + 1]
                start = i + 1
            elif byte == 13 and i + 1 < len(pending) and pending[i + 1] != 10:  # \r not followed by \n
                yield pending[start : i + 1]
                start = i + 1
        pending = pending[start:]
        if len(pending) > 1 << 20:  # a megabyte without an end of line: pass it on as it is
            yield pending + b"\n"
            pending = b""
    if pending:
        yield pending if pending.endswith(b"\n") else pending + b"\n"


def run_process(
    argv: Sequence[str],
    ctx: StepContext,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    stop_signal: int = signal.SIGTERM,
    grace: float = 3.0,
    on_transient: Callable[[str], None] | None = None,
) -> Completed:
    """Run argv, streaming its merged output to the step's log and ``ctx.on_output``.

    A line ended by a carriage return alone is a progress update that the next one overwrites (git's
    "Receiving objects: 45%"): it goes to ``on_transient`` only, not to the log, the tail or the output.

    The child gets its own session (process group), so a timeout or an interrupt stops it and everything it
    started. What it starts carries the step's tag (`ctx.process_tag`), so what leaves the group is found too:
    stopped here on a timeout or a cancel, by the engine when the step fails, by the guardian if runner dies.
    Raises StepError when the program cannot be started, or on timeout or cancellation.
    """
    child_env = dict(env) if env is not None else None
    if ctx.process_tag:
        child_env = dict(os.environ) if child_env is None else child_env
        child_env[sweep.VARIABLE] = ctx.process_tag
        sweep.GUARDIAN.hold(ctx.process_tag)
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if _prctl() is not None else None,  # noqa: PLW1509 - a single libc call
        )
    except FileNotFoundError as exc:
        missing = exc.filename or argv[0]
        if cwd is not None and not cwd.is_dir():
            raise StepError(f"working directory does not exist: {cwd}") from None
        raise StepError(
            f"command not found: {missing}", hint="check the spelling, or install it, or use a full path"
        ) from None
    except PermissionError:
        raise StepError(f"permission denied running: {argv[0]}") from None

    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    captured: list[str] = []
    captured_size = 0
    log_error: list[str] = []
    try:
        log = _open_log(ctx.log_path) if ctx.log_path else None
    except OSError as exc:
        log, log_error = None, [exc.strerror or str(exc)]

    def read() -> None:
        nonlocal captured_size, log
        assert proc.stdout is not None
        for raw in _lines(proc.stdout):
            if raw.endswith(b"\r"):
                if on_transient is not None:
                    on_transient(ctx.mask(raw.decode("utf-8", errors="replace")).strip())
                continue
            line = ctx.mask(raw.decode("utf-8", errors="replace"))
            if log is not None:
                try:
                    log.write(line)
                    log.flush()
                except OSError as exc:  # a full disk: the output still reaches the tail and the terminal
                    log_error.append(exc.strerror or str(exc))
                    with contextlib.suppress(OSError):
                        log.close()
                    log = None
            stripped = line.rstrip("\n")
            tail.append(stripped)
            if captured_size < STDOUT_LIMIT:
                captured.append(line)
                captured_size += len(line)
            ctx.on_output(stripped)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = time.monotonic()
    reason = ""
    try:
        while proc.poll() is None:
            if ctx.cancel.is_set():
                reason = "interrupted"
                break
            if ctx.timeout is not None and time.monotonic() - started > ctx.timeout:
                reason = f"timed out after {ctx.timeout:g}s"
                break
            try:
                proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
    finally:
        if proc.poll() is None:
            _kill_group(proc, grace, stop_signal, ctx.hurry)
        else:
            # The leader exited; stop anything it left running in its group.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if reason and ctx.process_tag:  # what left the group (setsid, a double fork) goes too
            left = sweep.stop([ctx.process_tag], 0.0 if ctx.hurry.is_set() else grace)
            left = [p for p in left if p.pgid != proc.pid]  # the group's own members were stopped with it
            if left:
                count, shown = sweep.describe(left, ctx.mask)
                ctx.notice(f"{ctx.name}: stopped {count} it had left running: {shown}")
        reader.join(timeout=5)
        if log is not None:
            with contextlib.suppress(OSError):
                log.close()
        if log_error:
            ctx.notice(f"{ctx.name}: its log {ctx.log_path} could not be written ({log_error[0]})")
    if reason:
        raise StepError(f"command {reason}", output_tail="\n".join(tail))
    return Completed(proc.returncode, "".join(captured), list(tail))


def _open_log(path: Path) -> Any:
    """A step log, appended to, never through a symbolic link (O_NOFOLLOW), 0600 as the rest of .runner/."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise StepError(f"cannot open the step log {path}: {exc.strerror}") from None
    return os.fdopen(fd, "a", encoding="utf-8", errors="replace")

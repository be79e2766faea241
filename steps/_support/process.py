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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from runner.util import sweep
from runner.util.datatype import datatype
from steps.base import StepContext, StepError

TAIL_LINES = 20
STDOUT_LIMIT = 64 * 1024


@datatype
class Completed:
    returncode: int
    stdout: str
    tail: list[str]
    stdout_cut: bool = False  # stdout was longer than STDOUT_LIMIT: `stdout` is its first STDOUT_LIMIT characters


class _ExitWatch:
    """Waits for a child to exit and wakes the moment it does: a pidfd (Linux 5.3+) polled with a timeout, where
    Popen.wait(timeout) sleeps in steps of up to 50 ms (on average 25 ms lost per step, which adds up along a
    chain of steps). Without pidfd_open it falls back to Popen.wait."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.poller: Any = None
        self.fd = -1
        try:
            import select

            self.fd = os.pidfd_open(proc.pid)
            self.poller = select.poll()
            self.poller.register(self.fd, select.POLLIN)
        except (AttributeError, OSError):
            self.close()

    def wait(self, seconds: float) -> None:
        """Until the child exits or `seconds` pass (it is not reaped here: the caller polls)."""
        if self.poller is None:
            try:
                self.proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                pass
            return
        try:
            self.poller.poll(int(seconds * 1000))
        except InterruptedError:
            pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd, self.poller = -1, None


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


def run_process(
    argv: Sequence[str],
    ctx: StepContext,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    stop_signal: int = signal.SIGTERM,
    grace: float = 3.0,
    on_transient: Callable[[str], None] | None = None,
    stdin: bytes | None = None,
) -> Completed:
    """Run argv, streaming its merged output to the step's log and ``ctx.on_output``.

    A line ended by a carriage return alone is a progress update that the next one overwrites (git's
    "Receiving objects: 45%"): the log keeps it, as every byte; it goes to ``on_transient``, not to the tail or
    the output.

    The child gets its own session (process group), so a timeout or an interrupt stops it and everything it
    started. What it starts carries the step's tag (`ctx.process_tag`), so what leaves the group is found too:
    stopped here on a timeout or a cancel, by the engine when the step fails, by the guardian if runner dies.
    ``stdin``, when given, is written to the child's stdin, which then stays open until the child exits: a remote
    step's script, whose end of file tells the other machine that runner is gone (steps/_support/ssh.py).
    Raises StepError when the program cannot be started, or on timeout or cancellation.
    """
    child_env = dict(env) if env is not None else None
    guarded = False
    if ctx.process_tag:
        child_env = dict(os.environ) if child_env is None else child_env
        child_env[sweep.VARIABLE] = ctx.process_tag
        guarded = sweep.GUARDIAN.hold(ctx.process_tag)
    # the log first: a log that cannot be opened is said at the end, and the output still reaches the tail
    log, log_error = None, ""
    if ctx.log_path:
        try:
            log = _open_log(ctx.log_path)
        except OSError as exc:
            log_error = exc.strerror or str(exc)
    output = _Output(ctx, log, on_transient, log_error)
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=child_env,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # The guardian stops what carries the tag when runner dies; only without one does the child get
            # PR_SET_PDEATHSIG, whose preexec_fn costs a full fork (no vfork: 8 ms a step instead of 1)
            preexec_fn=_die_with_parent if not guarded and _prctl() is not None else None,  # noqa: PLW1509
        )
    except (OSError, ValueError) as exc:
        output.close()
        raise _not_started(exc, argv, cwd) from None

    def read() -> None:
        assert proc.stdout is not None
        output.pump(proc.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if stdin is not None:
        _feed(proc, stdin)
    started = time.monotonic()
    reason = ""
    watch = _ExitWatch(proc)
    try:
        while proc.poll() is None:
            if ctx.cancel.is_set():
                reason = "interrupted"
                break
            if ctx.timeout is not None and time.monotonic() - started > ctx.timeout:
                reason = f"timed out after {ctx.timeout:g}s"
                break
            watch.wait(0.05)  # back at once when it exits; every 50 ms for a cancel or the timeout
    finally:
        watch.close()
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
        # EOF comes when every writer is gone; a child that left the group (a daemon) may hold the pipe for good:
        # then stop waiting once nothing has come for half a second (up to 5 s), and drop what it writes later
        ended = time.monotonic()
        while reader.is_alive() and time.monotonic() - ended < 5:
            reader.join(0.05)
            if time.monotonic() - max(output.last_read, ended) > 0.5:
                break
        output.close()
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        if output.log_error:
            ctx.notice(f"{ctx.name}: its log {ctx.log_path} could not be written ({output.log_error})")
    tail = list(output.tail)
    if reason:
        raise StepError(f"command {reason}", output_tail="\n".join(tail))
    return Completed(proc.returncode, "".join(output.captured), tail, output.cut)


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    """Write `data` to the child's stdin without closing it; in a thread when it is more than a pipe holds."""
    assert proc.stdin is not None
    pipe = proc.stdin

    def write() -> None:
        with contextlib.suppress(OSError):
            pipe.write(data)
            pipe.flush()

    if len(data) <= 16384:
        write()
    else:
        threading.Thread(target=write, daemon=True).start()


def _not_started(exc: OSError | ValueError, argv: Sequence[str], cwd: Path | None) -> Exception:
    """Why the program could not be started, as a StepError where runner can say it better than the system."""
    if isinstance(exc, FileNotFoundError):
        if cwd is not None and not cwd.is_dir():
            return StepError(f"working directory does not exist: {cwd}")
        missing = exc.filename or argv[0]
        return StepError(f"command not found: {missing}", hint="check the spelling, or install it, or use a full path")
    if isinstance(exc, PermissionError):
        return StepError(f"permission denied running: {argv[0]}")
    if isinstance(exc, ValueError):  # a NUL byte in an argument or the environment
        return StepError(
            f"the command holds a NUL byte, which no program can be given ({exc})",
            hint='in a YAML double-quoted string "\\0" is a NUL: write "\\\\0" for a backslash and a zero',
        )
    return exc


def _open_log(path: Path) -> int:
    """A step log, appended to, never through a symbolic link (O_NOFOLLOW), 0600 as the rest of .runner/."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


CHUNK = 1 << 16
LONG_LINE = 1 << 20  # output with no end of line is passed on in parts of about this size
DEFAULT_LOG_LIMIT = 128 << 20
SHOWN = 2000  # characters of a line shown on the terminal and in an error's tail; the log has all


class _Output:
    """A child's output, read in chunks: every byte to the log (secrets masked, invalid UTF-8 and escape
    sequences kept as they came), lines to the tail, the captured stdout and `on_output` (cut to SHOWN
    characters; the reporters make control characters visible), a carriage-return progress update to
    `on_transient` only. Memory stays bounded whatever comes: a line with no end is passed on in parts."""

    def __init__(
        self, ctx: StepContext, log: int | None, on_transient: Callable[[str], None] | None, log_error: str = ""
    ) -> None:
        self.ctx = ctx
        self.log = log
        self.log_error = log_error
        self.on_transient = on_transient or ctx.on_transient
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.captured: list[str] = []
        self.captured_size = 0
        self.cut = False
        limit = log_limit()
        self.head_limit = limit - limit // 2 if limit else 1 << 62
        self.tail_limit = limit // 2
        self.head = 0  # bytes in the log itself
        self.logged = 0  # bytes the step wrote in all
        self.part: int | None = None  # the rotating file of the log's tail, past the head
        self.part_size = 0
        self.parts = 0
        self.long = 0  # characters so far of a line longer than LONG_LINE (shown once, at its start)
        self.shows = True  # False once the display failed: the output is still drained and logged
        self.last_read = 0.0  # when the last chunk came (monotonic)
        self.lock = threading.Lock()  # the reader thread's processing against close() from the step's thread
        self.done = False

    def pump(self, stream: Any) -> None:
        pending = b""
        for chunk in iter(lambda: stream.read1(CHUNK), b""):
            self.last_read = time.monotonic()
            with self.lock:
                if self.done:  # the step is over; a daemon it left still writes here: drained, never blocked
                    continue
                pending = pending + chunk if pending else chunk
                cut = _line_boundary(pending)
                if cut:
                    self._block(pending[:cut])
                    pending = pending[cut:]
                elif len(pending) > LONG_LINE:
                    text = pending.decode("utf-8", "surrogateescape")
                    at = self.ctx.mask_cut(text, len(text) - CHUNK)
                    if at <= 0:
                        continue
                    head = text[:at].encode("utf-8", "surrogateescape")
                    self._block(head, ended=False)
                    pending = pending[len(head) :]
        with self.lock:
            if pending and not self.done:
                self._block(pending)

    def _block(self, raw: bytes, ended: bool = True) -> None:
        masked = self.ctx.mask(raw.decode("utf-8", "surrogateescape"))
        data = masked.encode("utf-8", "surrogateescape")
        self._write(data)
        shown = masked if masked.isascii() else data.decode("utf-8", "replace")
        pieces = shown.split("\n")
        last = pieces.pop()  # after the block's last end of line: "" or a line not yet ended
        for piece in pieces:
            self._line(piece[:-1] if piece.endswith("\r") else piece, True)
        if last:
            self._line(last, ended)

    def _line(self, piece: str, ended: bool) -> None:
        if "\r" in piece:  # progress updates overwritten by what follows the carriage return
            updates = piece.split("\r")
            piece = updates.pop()
            if self.on_transient is not None and updates[-1].strip():
                self.on_transient(updates[-1][:SHOWN].strip())
            if not piece:  # nothing after the last update (yet)
                return
        if self.long or not ended:  # a part of a long line: shown once, at its start
            first = not self.long
            self.long += len(piece)
            if first:
                self._show(f"{piece[:SHOWN]} ... (a line longer than {LONG_LINE // 1024} KiB: the log has it whole)")
            self._capture(piece + ("\n" if ended else ""))
            if ended:
                self.long = 0
            return
        self._capture(piece + "\n")
        self._show(piece if len(piece) <= SHOWN else f"{piece[:SHOWN]} ... ({len(piece)} characters: the log has all)")

    def _show(self, line: str) -> None:
        self.tail.append(line)
        if not self.shows:
            return
        try:
            self.ctx.on_output(line)
        except Exception:  # noqa: BLE001 - whatever befalls the display, the output is drained and logged
            self.shows = False

    def _capture(self, text: str) -> None:
        if self.captured_size + len(text) > STDOUT_LIMIT:
            self.cut = True
        if self.captured_size < STDOUT_LIMIT:
            text = text[: STDOUT_LIMIT - self.captured_size]
            self.captured.append(text)
            self.captured_size += len(text)

    def _write(self, data: bytes) -> None:
        if self.log is None:
            return
        try:
            self.logged += len(data)
            room = self.head_limit - self.head
            if room > 0:
                head, data = data[:room], data[room:]
                _write_all(self.log, head)
                self.head += len(head)
            if data:
                self._keep_tail(data)
        except OSError as exc:  # a full disk: the output still reaches the tail and the terminal
            self.log_error = exc.strerror or str(exc)
            self._close_log()

    def _keep_tail(self, data: bytes) -> None:
        """Past the head of a capped log: the last part of the output, in two rotating files beside the log
        (at most the cap on disk, none of it in memory), joined to the log when it is closed."""
        segment = max(1, self.tail_limit)
        while data:
            if self.part is None or self.part_size >= segment:
                self._rotate()
            assert self.part is not None
            piece, data = data[: segment - self.part_size], data[segment - self.part_size :]
            _write_all(self.part, piece)
            self.part_size += len(piece)

    def _part_path(self, index: int) -> str:
        return f"{self.ctx.log_path}.part-{index % 2}"

    def _rotate(self) -> None:
        if self.part is not None:
            os.close(self.part)
            self.parts += 1
        path = self._part_path(self.parts)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.part = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.part_size = 0

    def _join_tail(self) -> None:
        """The log's last part after its head and a line that says what was left out."""
        assert self.log is not None and self.part is not None
        os.close(self.part)
        self.part = None
        older = self._part_path(self.parts - 1) if self.parts else None
        from_older = min(self.tail_limit - self.part_size, os.path.getsize(older)) if older else 0
        kept = from_older + self.part_size
        left_out = self.logged - self.head - kept
        note = (
            f"\n[runner: {left_out} bytes left out here: a step log keeps its first {self.head} and its last "
            f"{kept} bytes of {self.logged} (RUNNER_LOG_LIMIT={self.head_limit + self.tail_limit})]\n"
        )
        if left_out:
            _write_all(self.log, note.encode())
        if older:
            if from_older:
                self._append_from(older, -from_older)
            os.unlink(older)
        current = self._part_path(self.parts)
        self._append_from(current, 0)
        os.unlink(current)

    def _append_from(self, path: str, offset: int) -> None:
        """Copy a part into the log: all of it, or its last -offset bytes."""
        assert self.log is not None
        with open(path, "rb") as fh:
            if offset:
                fh.seek(offset, os.SEEK_END)
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                _write_all(self.log, chunk)

    def close(self) -> None:
        with self.lock:
            self.done = True
            self._close_log()

    def _close_log(self) -> None:
        if self.log is not None:
            if self.part is not None:
                try:
                    self._join_tail()
                except OSError as exc:
                    self.log_error = exc.strerror or str(exc)
            with contextlib.suppress(OSError):
                os.close(self.log)
            self.log = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def log_limit() -> int:
    """The cap of one step log in bytes: RUNNER_LOG_LIMIT (default 128 MiB), its first half and its last half
    kept; 0 for no cap."""
    text = os.environ.get("RUNNER_LOG_LIMIT", "")
    try:
        return max(0, int(text)) if text else DEFAULT_LOG_LIMIT
    except ValueError:
        return DEFAULT_LOG_LIMIT


def _line_boundary(data: bytes) -> int:
    """The length of the complete lines at the start of `data`: up to its last `\n`, or its last `\r` that is
    not the final byte (a final `\r` may be the first half of a `\r\n`)."""
    newline = data.rfind(b"\n")
    ret = data.rfind(b"\r", 0, len(data) - 1)
    return max(newline, ret) + 1


def log_line(ctx: StepContext, text: str) -> None:
    """A line of runner's own in the step's log and output (a retry said), masked as the child's output is."""
    line = ctx.mask(text)
    ctx.on_output(line)
    if ctx.log_path:
        try:
            fd = _open_log(ctx.log_path)
        except OSError:
            return
        try:
            os.write(fd, (line + "\n").encode("utf-8", "replace"))
        finally:
            os.close(fd)

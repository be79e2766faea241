"""Steps on another machine: the OpenSSH client, one multiplexed connection per host per run.

Why the OpenSSH client and not an SSH library: it reads ~/.ssh/config exactly as the user's own `ssh` does
(aliases, ProxyJump, Match blocks, certificates, the agent, known_hosts, GSSAPI), so a host that `ssh HOST true`
reaches is a host runner reaches, and nothing new is installed. Its multiplexing (ControlMaster, as Ansible uses
it) makes the first step to a host open the connection and every later one a new channel on it: a converged run
of many steps on one host costs one TCP and key exchange, and the master stays for `PERSIST` seconds of idleness,
so the next apply of an edit-apply loop costs none.

What is sent: the remote command line is a fixed bootstrap (`exec sh -c 'eval "$(head -n N)"'`); the script
itself, with the exported variables and the step's command, comes on stdin. A secret therefore never appears in
a remote process's command line, nor in the local `ssh`'s. The script keeps reading stdin after that: when the
connection ends (runner killed, Ctrl-C, a timeout), it sees end of file and stops the command's process group, so
nothing a step started outlives a dead runner on the other machine either.

Environment: RUNNER_SSH_CONFIG (an ssh_config file given with -F, instead of ~/.ssh/config),
RUNNER_SSH_CONTROL_DIR (where the control sockets go, default /tmp/runner-ssh-UID), RUNNER_SSH_PERSIST (seconds
an idle master stays, default 60).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from steps.base import StepError, Unreachable

if TYPE_CHECKING:
    pass

PERSIST = 60
CONNECT_TIMEOUT = 15
ANSWER_TIMEOUT = 60.0
# an ssh destination: [user@]host (a name or an address, as ssh takes it) or ssh://[user@]host[:port] (host may be
# [v6]); it never starts with "-", so it is never read as an option
_USER = r"(?:[A-Za-z0-9._][A-Za-z0-9._-]*@)?"
_PLAIN = re.compile(_USER + r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_URL = re.compile(r"ssh://" + _USER + r"(?:[A-Za-z0-9_][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\])(?::(\d{1,5}))?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# codes the remote wrapper uses for what it found before running anything
NO_DIRECTORY = 125


def check_target(value: str | None) -> str | None:
    """A `host:` as written (after templates): an ssh destination, or a ValueError saying what one looks like."""
    if value is None or "{{" in value or "{%" in value:
        return value
    text = value.strip()
    url = _URL.fullmatch(text)
    if url is None and _PLAIN.fullmatch(text) is None:
        raise ValueError(
            f"{value!r} is not an ssh destination: write a ~/.ssh/config alias, user@host, or ssh://user@host:port"
        )
    if url is not None and url.group(1) is not None and not 0 < int(url.group(1)) < 65536:
        raise ValueError(f"{value!r}: the port must be from 1 to 65535")
    return text


def display(target: str) -> str:
    """The host as messages name it: the destination without ssh://, unless it gives a port (then `ssh` takes it
    only as a URL, and a hint's `ssh HOST true` must work as written)."""
    url = _URL.fullmatch(target)
    return target if url is not None and url.group(1) is not None else target.removeprefix("ssh://")


_SAFE = re.compile(r"[A-Za-z0-9@%+=:,./_-]+")


def quote(text: str) -> str:
    """A word for a POSIX shell (as shlex.quote, without importing shlex on a converged run)."""
    if _SAFE.fullmatch(text):
        return text
    return "'" + text.replace("'", "'\"'\"'") + "'"


def exports(variables: Mapping[str, str]) -> str:
    """`export NAME='value'` lines for a script sent on stdin (names that are not shell names are left out)."""
    lines = []
    for name, value in variables.items():
        if _NAME.fullmatch(name):
            lines.append(f"export {name}={quote(value)}")
    return "\n".join(lines)


def control_dir() -> str:
    """The directory of the control sockets: this user's own, 0700, never through a link another user made."""
    path = os.environ.get("RUNNER_SSH_CONTROL_DIR") or os.path.join(
        os.environ.get("TMPDIR") or "/tmp", f"runner-ssh-{os.getuid()}"
    )
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StepError(f"cannot make the ssh control directory {path}: {exc.strerror}") from None
    info = os.lstat(path)
    import stat

    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise StepError(
            f"the ssh control directory {path} is not this user's own 0700 directory: nothing was sent through it",
            hint="remove it, or point RUNNER_SSH_CONTROL_DIR at a directory of your own",
        )
    return path


def persist() -> int:
    """Seconds an idle master stays for the next run (at least 1: a run's steps always share one)."""
    text = os.environ.get("RUNNER_SSH_PERSIST", "")
    return max(1, int(text)) if text.isdigit() else PERSIST


def base_argv(target: str) -> list[str]:
    """`ssh` with runner's options; the user's config supplies the rest (user, port, key, jumps)."""
    argv = ["ssh"]
    config = os.environ.get("RUNNER_SSH_CONFIG")
    if config:
        argv += ["-F", config]
    argv += [
        "-o",
        "BatchMode=yes",  # never a password or passphrase prompt nobody can answer
        "-o",
        f"ControlPath={control_dir()}/%C",
        "-o",
        f"ConnectTimeout={CONNECT_TIMEOUT}",
        "-o",
        "ServerAliveInterval=15",
        "-o",
        "ServerAliveCountMax=4",
    ]
    return argv


def command_argv(target: str, remote: str) -> list[str]:
    """The argv that runs `remote` (a command line for the remote login shell) on the host, over the master."""
    return [*base_argv(target), "-o", "ControlMaster=no", "-o", "LogLevel=ERROR", "-T", "--", target, remote]


def local_env() -> dict[str, str]:
    """The environment of the master: no step's tag (it serves the whole run and later ones, and the sweep after a
    failed step must not cut every other step's connection)."""
    from runner.util import sweep

    env = dict(os.environ)
    env.pop(sweep.VARIABLE, None)
    return env


class _Master:
    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.ready = False
        self.error: StepError | None = None


_MASTERS: dict[str, _Master] = {}
_MASTERS_LOCK = threading.Lock()
# connection set-ups this process made (the bench and the tests read it through `runner -v`'s notices)
opened: list[str] = []


def connect(target: str) -> None:
    """Make sure a master connection to `target` runs (start it if not): once per host per process, whatever the
    number of steps and threads. A StepError names the host and what to check."""
    with _MASTERS_LOCK:
        master = _MASTERS.setdefault(target, _Master(threading.Lock()))
    with master.lock:
        if master.ready:
            return
        if master.error is not None:
            raise master.error
        try:
            _start_master(target)
        except StepError as exc:
            master.error = exc
            raise
        master.ready = True


def _start_master(target: str) -> None:
    check = subprocess.run(
        [*base_argv(target), "-O", "check", "--", target],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=local_env(),
        timeout=30,
    )
    if check.returncode == 0:
        return  # a master from an earlier run (ControlPersist) still serves
    _remove_stale_socket(check.stderr)
    keep = persist()
    argv = [
        *base_argv(target),
        "-o",
        "ControlMaster=yes",
        "-o",
        f"ControlPersist={keep}",
        "-o",
        "StreamLocalBindUnlink=yes",  # a socket forward (a docker engine's) replaces a stale file of a dead master
        "-f",
        "-N",
        "--",
        target,
    ]
    import tempfile

    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,  # a file, not a pipe: the master that forks off keeps it open
                env=local_env(),
                start_new_session=True,  # its process group is proc.pid: the master that forks off stays in it
            )
            code = proc.wait(timeout=CONNECT_TIMEOUT * 4)
        except FileNotFoundError:
            raise StepError(
                f"cannot reach {display(target)}: there is no `ssh` program here",
                hint="install the OpenSSH client (apt-get install openssh-client) on the machine runner runs on",
            ) from None
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise Unreachable(
                f"cannot reach {display(target)}: the ssh connection did not come up in {CONNECT_TIMEOUT * 4}s",
                hint=f"check that `ssh {display(target)} true` works from here",
            ) from None
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    opened.append(target)
    if code != 0:
        raise connection_error(target, text)
    if "disabling multiplexing" in text.lower():
        # it could not bind the control socket: what forked off is a plain connection that no step uses and
        # that would live for good (ControlPersist does not apply to it); it is in the session started for it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        raise Unreachable(
            f"cannot reach {display(target)} over ssh: its control socket could not be made ({_last(text)})",
            hint=f"check the ssh control directory {control_dir()} (RUNNER_SSH_CONTROL_DIR)",
        )


def _last(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "ssh said nothing"


# what `ssh -O check` says when a socket is there and no master listens on it (its master was killed)
_STALE = re.compile(rb"Control socket connect\((.+)\): Connection refused")


def _remove_stale_socket(said: bytes) -> None:
    """The socket `ssh -O check` found with no master behind it is removed, so the new master can bind it; else
    ssh says "ControlSocket already exists, disabling multiplexing" and leaves a connection behind."""
    import stat

    found = _STALE.search(said)
    if found is None:
        return
    path = os.fsdecode(found.group(1))
    with contextlib.suppress(OSError):  # not there, or not ours to remove: ssh says what is wrong when it starts
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)


def connection_error(target: str, text: str) -> StepError:
    """What ssh said, in the words of what to check: unreachable, host key unknown or changed, auth refused."""
    host = display(target)
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("Warning:")]
    said = lines[-1] if lines else "ssh exited without saying why"
    low = text.lower()
    if "could not resolve hostname" in low or "name or service not known" in low:
        what, hint = "unreachable (the name is not known)", "check the name, or the alias in ~/.ssh/config"
    elif "identification has changed" in low:
        what = "host key changed"
        hint = (
            "the host's key is not the one in known_hosts: if the machine was reinstalled, `ssh-keygen -R` it and "
            "check the new fingerprint; otherwise do not connect"
        )
    elif "host key verification failed" in low or "host key is known" in low:
        what = "host key unknown"
        hint = (
            f"runner never accepts a host key by itself: run `ssh {host}` once and check the fingerprint, or add "
            "the key to ~/.ssh/known_hosts (ssh-keyscan)"
        )
    elif "permission denied" in low or "too many authentication failures" in low:
        what = "authentication refused"
        hint = (
            f"runner logs in without a prompt (BatchMode): check that `ssh {host} true` works without a password — "
            "a key in ssh-agent or IdentityFile in ~/.ssh/config, and the right user"
        )
    elif any(m in low for m in ("connection refused", "timed out", "no route to host", "network is unreachable")):
        what = "unreachable"
        hint = f"check that {host} is up, that sshd listens on the port ~/.ssh/config gives, and no firewall is between"
    else:
        what, hint = "ssh failed", f"check that `ssh {host} true` works from here"
    return Unreachable(f"cannot reach {host} over ssh: {what} ({said})", hint=hint)


def payload(script: str) -> tuple[str, bytes]:
    """The remote command line (a fixed bootstrap) and the stdin that carries `script`."""
    data = script if script.endswith("\n") else script + "\n"
    lines = data.count("\n")
    return f"exec sh -c 'eval \"$(head -n {lines})\"'", data.encode("utf-8")


def guarded(
    body: str,
    variables: Mapping[str, str],
    cwd: str | None,
    stop_signal: str = "TERM",
    grace: float = 3.0,
) -> str:
    """A script that runs `body` (sh) in a process group of its own on the host, with `variables` exported and
    in `cwd`, and stops that group (stop_signal, `grace` seconds, then KILL) when stdin ends before it does.

    The command runs in the script's foreground and the watch on stdin in its background: a non-interactive
    shell starts a background command with SIGINT and SIGQUIT ignored (POSIX, "Signals"), which a program cannot
    undo, so a job whose stop signal is INT (Python's KeyboardInterrupt) would never see it. The command writes its
    pid (its process group, through setsid) to a file the watch reads."""
    cd = ""
    if cwd:
        cd = (
            f"cd {quote(cwd)} 2>/dev/null || {{ printf 'runner: there is no directory %s on this host\\n' "
            f"{quote(cwd)} >&2; exit {NO_DIRECTORY}; }}\n"
        )
    return f"""{exports(variables)}
{cd}_rf=$(mktemp "${{TMPDIR:-/tmp}}/runner.XXXXXXXX") || exit 1
exec 3<&0
( unset RUNNER_STEP_TAG  # the watch is runner's, not the step's: no sweep takes it for a leftover
  while read -r _ <&3; do :; done
  _g=; _i=0
  while [ -z "$_g" ] && [ $_i -lt 50 ]; do _g=$(cat "$_rf" 2>/dev/null); [ -n "$_g" ] || sleep 0.1; _i=$((_i+1)); done
  [ -n "$_g" ] || exit 0
  kill -{stop_signal} -"$_g" 2>/dev/null || kill -{stop_signal} "$_g" 2>/dev/null
  sleep {grace:g}; kill -KILL -"$_g" 2>/dev/null ) >/dev/null 2>&1 &
_rd=$!
exec 3<&-
if command -v setsid >/dev/null 2>&1; then _rs=setsid; else _rs=; fi
$_rs sh -c 'echo $$ > "$1"; exec sh -c "$0"' {quote(body)} "$_rf" </dev/null
_rc=$?
kill $_rd 2>/dev/null
rm -f "$_rf"
exit $_rc
"""


def answer_timeout() -> float:
    """Seconds a probe waits for a machine to answer before it is taken as unreachable (default 60)."""
    text = os.environ.get("RUNNER_SSH_ANSWER_TIMEOUT", "")
    try:
        return max(0.5, float(text)) if text else ANSWER_TIMEOUT
    except ValueError:
        return ANSWER_TIMEOUT


def quick(target: str, script: str, timeout: float | None = None) -> tuple[int, str]:
    """Run a short read-only `script` on the host (a probe: one round trip), returning its exit code and output
    (stderr merged). It goes to the host's agent: one shell there per host and run, reading scripts on its stdin,
    so a probe costs the round trip and not a session's set-up (sshd's fork, the login shell and its rc files).
    A connection that fails is a StepError naming the host."""
    connect(target)
    with _AGENTS_LOCK:
        agent = _AGENTS.setdefault(target, _Agent(target))
    return agent.run(script, answer_timeout() if timeout is None else timeout)


_MARK = "RUNNER-AGENT-END"


class _Agent:
    """A shell on the host (`exec sh -s`, a channel on the master) that runs the probes sent to it one at a time:
    each script is `eval`ed in a subshell (a syntax error or an `exit` in it ends only that subshell), its stdin
    /dev/null, its output followed by a line with a fresh nonce and the exit status. The script travels on the
    shell's stdin, so nothing of it (an exported secret) is on a command line. Ends when runner does: its stdin
    is runner's pipe."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: Any = None
        self.err: Any = None

    def _start(self) -> subprocess.Popen[bytes]:
        import queue
        import tempfile

        self.err = tempfile.TemporaryFile()
        proc = subprocess.Popen(
            command_argv(self.target, "exec sh -s"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            env=local_env(),
            start_new_session=True,
        )
        lines: queue.Queue[bytes | None] = queue.Queue()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        self.proc, self.lines = proc, lines
        return proc

    def _stop(self) -> str:
        proc, self.proc = self.proc, None
        said = ""
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        if self.err is not None:
            self.err.seek(0)
            said = self.err.read().decode("utf-8", "replace")
            self.err.close()
            self.err = None
        return said

    def run(self, script: str, timeout: float) -> tuple[int, str]:
        import queue
        import secrets

        with self.lock:
            proc = self.proc if self.proc is not None and self.proc.poll() is None else self._start()
            nonce = secrets.token_hex(8)
            line = f"( eval {quote(script)} ) </dev/null 2>&1; printf '\\n{_MARK}-{nonce} %s\\n' \"$?\"\n"
            try:
                assert proc.stdin is not None
                proc.stdin.write(line.encode("utf-8"))
                proc.stdin.flush()
            except OSError:
                raise connection_error(self.target, self._stop()) from None
            out: list[bytes] = []
            end = f"{_MARK}-{nonce} ".encode()
            deadline = time.monotonic() + timeout
            while True:
                try:
                    got = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
                except queue.Empty:
                    self._stop()
                    raise Unreachable(
                        f"{display(self.target)} did not answer within {timeout:g}s over ssh",
                        hint=f"check that {display(self.target)} is up and `ssh {display(self.target)} true` answers "
                        f"(RUNNER_SSH_ANSWER_TIMEOUT, {answer_timeout():g}s now, is how long a probe waits)",
                    ) from None
                if got is None:
                    raise connection_error(self.target, self._stop())
                if got.startswith(end):
                    code = int(got[len(end) :].strip() or b"1")
                    break
                out.append(got)
        text = b"".join(out).decode("utf-8", "replace")
        return code, text[:-1] if text.endswith("\n") else text  # the newline the end line's printf put first


_AGENTS: dict[str, _Agent] = {}
_AGENTS_LOCK = threading.Lock()


def missing_command_hint(target: str) -> str:
    return (
        f"a command was not found on {display(target)} (exit 127): install it there, or give its full path "
        "(a non-interactive ssh session does not read ~/.bashrc's PATH)"
    )

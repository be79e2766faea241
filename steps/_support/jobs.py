"""Detached jobs on a machine, the launch kind's primitive (as `run` is a command's): start one in a session of
its own, read its state, stop its group, read its log. The kind (steps/launch.py) is written once over these.

- Here (:class:`LocalJobs`): a small Python supervisor (supervise.py) starts the job and writes the job file,
  `.runner/jobs/<step>.json` — its pid, its process start time (a reused pid is never taken for the job), a
  token the job carries in its environment, and, when it ends, its exit status.
- There (:class:`SshJobs`): the job starts in a session of its own (setsid) under a small sh wrapper that writes
  its exit status, when it ends, to `~/.runner/jobs/<pipeline>/<step>.exit` on that machine; its output goes to
  `log` (default `~/.runner/jobs/<pipeline>/<step>.log` there). The job file stays here, with the host in it.
  One round trip reads the job's state (alive, exit status, `creates`), one stops it (the waiting happens there),
  and `runner logs STEP -f` follows the log over ssh.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runner.util.datatype import datatype
from steps._support import remote, ssh
from steps._support.files import expand
from steps._support.supervise import SHOWN_VARIABLE, TOKEN_VARIABLE, carries, start_time, write
from steps.base import StepContext, StepError

SUPERVISOR = Path(__file__).with_name("supervise.py")
START_GRACE = 0.5  # seconds a detached job must live before it counts as started (one that exits at once fails)
# the start time of a process, field 22 of /proc/PID/stat, read after the ") " that ends its name (which may
# hold spaces): the 20th field from there
_START = "sed 's/.*) //' /proc/$_p/stat 2>/dev/null | cut -d' ' -f20"


@datatype
class JobState:
    alive: bool
    exit_code: int | None
    orphaned: bool = False  # it runs, but its supervisor is gone: its exit status will not be recorded
    missing: str | None = None  # a `creates` pattern that names nothing (looked at when asked)


def read_job(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def tail_of(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def live_pids(job: dict[str, Any]) -> list[int]:
    """The job's processes that still run and are the ones the job file names: the supervisor (pid) and the job
    itself (child_pid), each with its recorded start time and, where the file has one, the job's token in its
    environment. A pid that was reused, or edited into the file, is not the job's."""
    token = job.get("token")
    live = []
    for pid_key, time_key in (("pid", "start_time"), ("child_pid", "child_start_time")):
        pid = job.get(pid_key)
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
            continue
        if time_key not in job and pid_key == "child_pid":
            continue  # a job file from before children's start times were kept: the supervisor speaks for it
        began = start_time(pid)
        if began is None or began != job.get(time_key):
            continue
        if isinstance(token, str) and token and not carries(pid, token):
            continue
        live.append(pid)
    return live


class LocalJobs:
    """Detached jobs on this machine, under the Python supervisor."""

    where = ""

    def state(self, ctx: StepContext, job: dict[str, Any], cwd: str | None, creates: list[str]) -> JobState:
        live = live_pids(job)
        alive = "exit_code" not in job and bool(live)
        code = job.get("exit_code")
        missing = next((p for p in creates if not expand(ctx.resolve(p), ctx)), None) if code == 0 else None
        return JobState(alive, code if isinstance(code, int) else None, alive and job.get("pid") not in live, missing)

    def default_log(self, ctx: StepContext, log: str | None) -> str:
        return str(ctx.resolve(log) if log else ctx.state_dir / "jobs" / f"{ctx.name}.log")

    def start(self, ctx: StepContext, jobfile: Path, spec: Any, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
        cwd = ctx.resolve(spec.cwd) if spec.cwd else ctx.pipeline_dir
        if not cwd.is_dir():
            raise StepError(f"working directory does not exist: {cwd}")
        log = Path(self.default_log(ctx, spec.log))
        jobfile.parent.mkdir(parents=True, exist_ok=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        previous = jobfile.with_suffix(".previous.json")
        if jobfile.exists():
            os.replace(jobfile, previous)
        command = [sys.executable, "-I", str(SUPERVISOR), str(jobfile), str(log), ctx.fingerprint, "--", *argv]
        try:
            proc = subprocess.Popen(
                command,
                cwd=cwd,
                # the command as the job file and the log's header show it: masked (the supervisor's own argv
                # is the job's, readable in /proc as the job's is)
                env={**ctx.env, **env, TOKEN_VARIABLE: secrets.token_hex(16), SHOWN_VARIABLE: shown(ctx, argv)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise StepError(f"cannot start the job supervisor: {exc}") from None
        deadline = time.monotonic() + 15
        job: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            job = read_job(jobfile)
            if job and job.get("pid") == proc.pid:
                break
            if proc.poll() is not None:
                raise StepError(f"the job supervisor exited with code {proc.returncode} before starting the job")
            time.sleep(0.02)
        else:
            raise StepError("the job supervisor did not report the job's start within 15s")
        assert job is not None
        grace = time.monotonic() + START_GRACE
        while time.monotonic() < grace:
            job = read_job(jobfile) or job
            if "exit_code" in job:
                break
            time.sleep(0.05)
        if job.get("exit_code") not in (None, 0):
            raise StepError(
                f"the job exited at once with code {job['exit_code']}",
                hint=f"its log: {log}",
                output_tail=ctx.mask(tail_of(log)),
            )
        ctx.on_output(f"started pid {job['pid']}, log {log}")
        return job

    def signal(self, ctx: StepContext, jobfile: Path, job: dict[str, Any], stop_signal: str, timeout: float) -> str:
        """The stop signal to the job's process group, `timeout` seconds, then SIGKILL (and the exit status
        written when the supervisor could not)."""
        live = live_pids(job)
        if not live:
            return "it no longer ran"
        try:
            pgid = os.getpgid(live[0])
        except ProcessLookupError:
            return "it no longer ran"
        recorded = job.get("pgid")
        if isinstance(recorded, int) and recorded != pgid:
            raise StepError(
                f"the job file says process group {recorded}, but the job (pid {live[0]}) is in group {pgid}: "
                "nothing was signalled",
                hint=f"was {jobfile} edited? stop the job by hand, then `runner forget {ctx.name}`",
            )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, getattr(signal, f"SIG{stop_signal}"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            current = read_job(jobfile) or job
            if "exit_code" in current or not live_pids(job):
                _kill_rest(pgid)
                return f"SIG{stop_signal}"
            time.sleep(0.1)
        _kill_rest(pgid)
        current = read_job(jobfile) or job
        if "exit_code" not in current:
            write(str(jobfile), {**current, "exit_code": -signal.SIGKILL, "finished": time.time()})
        return f"SIGKILL after {timeout:g}s"

    def logs(self, ctx: StepContext, job: dict[str, Any], follow: bool) -> Iterator[str] | None:
        return None  # here `runner logs` reads the file itself (LaunchStep.log_file)


def shown(ctx: StepContext, argv: list[str]) -> str:
    return json.dumps([ctx.mask(arg) for arg in argv])


def _kill_rest(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _safe(name: str) -> str:
    """A step name (a for_each item's `name[key]` too) as a file name there."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


class SshJobs:
    """Detached jobs on another machine, under a sh wrapper there; the job file here names the host."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.where = f" on {host}"

    def _mine(self, job: dict[str, Any]) -> str:
        """A shell condition there: pid $_p is still the job (its start time and its token)."""
        token = ssh.quote(f"{TOKEN_VARIABLE}={job.get('token', '')}")
        return (
            f'[ "$({_START})" = {ssh.quote(str(job.get("start_time")))} ] && '
            f"tr '\\0' '\\n' < /proc/$_p/environ 2>/dev/null | grep -qx {token}"
        )

    def _members(self, job: dict[str, Any]) -> str:
        """Shell that prints "MEMBER <pid>" for the job's processes in the session its wrapper made ($_p: the
        wrapper's pid is the session's id) that carry its token: the job, when the wrapper itself was killed."""
        token = ssh.quote(f"{TOKEN_VARIABLE}={job.get('token', '')}")
        return (
            "for _d in /proc/[0-9]*; do "
            "[ \"$(sed 's/.*) //' $_d/stat 2>/dev/null | cut -d' ' -f4)\" = \"$_p\" ] || continue; "
            f"tr '\\0' '\\n' < $_d/environ 2>/dev/null | grep -qx {token} && echo \"MEMBER ${{_d#/proc/}}\"; "
            "done"
        )

    def state(self, ctx: StepContext, job: dict[str, Any], cwd: str | None, creates: list[str]) -> JobState:
        lines = []
        if isinstance(job.get("pid"), int):
            lines.append(f"_p={int(job['pid'])}; if {self._mine(job)}; then echo RUN; else {self._members(job)}; fi")
            exit_file = job.get("exit_file")
            if isinstance(exit_file, str):
                lines.append(f'[ -f "{exit_file}" ] && echo "EXIT $(cat "{exit_file}")"')
        if creates:
            if cwd:
                lines.append(f"cd {ssh.quote(cwd)} 2>/dev/null")
            for index, pattern in enumerate(creates):
                lines.append(f'_f=0; {remote.any_match(pattern)} && _f=1; echo "C{index} $_f"')
        alive, orphaned, code, found = False, False, None, {}
        if lines:
            for line in ssh.quick(self.host, "\n".join(lines) + "\n:\n")[1].splitlines():
                head, _, rest = line.partition(" ")
                if head == "RUN":
                    alive = True
                elif head == "MEMBER":  # its wrapper is gone, the job runs on: adopted, its exit not recorded
                    alive = orphaned = True
                elif head == "EXIT" and rest.strip().lstrip("-").isdigit():
                    code = int(rest.strip())
                elif head.startswith("C"):
                    found[head[1:]] = rest.strip() == "1"
        missing = next((p for i, p in enumerate(creates) if not found.get(str(i), False)), None)
        running = alive and "exit_code" not in job
        return JobState(running, code, orphaned and running, missing)

    def _dir(self, ctx: StepContext) -> str:
        """The job directory there: one per pipeline (its state directory's path names it), for its steps' logs
        and exit files."""
        tag = hashlib.sha256(os.fspath(ctx.state_dir.resolve()).encode()).hexdigest()[:12]
        return f"$HOME/.runner/jobs/{tag}"

    def default_log(self, ctx: StepContext, log: str | None) -> str:
        if log:
            return "$HOME/" + log[2:] if log.startswith("~/") else log
        return f"{self._dir(ctx)}/{_safe(ctx.name)}.log"

    def start(self, ctx: StepContext, jobfile: Path, spec: Any, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
        token = secrets.token_hex(16)
        directory = self._dir(ctx)
        log = self.default_log(ctx, spec.log)
        exit_file = f"{directory}/{_safe(ctx.name)}.exit"
        inner = spec.command if isinstance(spec.command, str) else None
        job_cmd = f"sh -c {ssh.quote(inner)}" if inner is not None else remote.body_of(spec.command)[len("exec ") :]
        wrapper = f'{job_cmd}; echo $? > "$0.tmp" && mv "$0.tmp" "$0"'
        variables = {**remote.variables(ctx, env), TOKEN_VARIABLE: token}
        variables.pop("RUNNER_STEP_TAG", None)  # the job outlives the step on purpose: no sweep takes it
        log_word = f'"{log}"' if log.startswith("$HOME/") else ssh.quote(log)
        cd = f"cd {ssh.quote(spec.cwd)} 2>/dev/null || {{ echo NODIR; exit 0; }}\n" if spec.cwd else ""
        script = f"""{ssh.exports(variables)}
{cd}command -v setsid >/dev/null 2>&1 || {{ echo NOSETSID; exit 0; }}
mkdir -p "{directory}" && chmod 700 "$HOME/.runner" "$HOME/.runner/jobs" "{directory}" 2>/dev/null
rm -f "{exit_file}"
: >> {log_word} || {{ echo NOLOG; exit 0; }}
rm -f "{exit_file}.pid"
_l='echo $$ > "$1.pid"; exec sh -c "$2" "$1"'
if setsid -f true >/dev/null 2>&1; then
  setsid -f sh -c "$_l" launch "{exit_file}" {ssh.quote(wrapper)} </dev/null >> {log_word} 2>&1
else
  setsid sh -c "$_l" launch "{exit_file}" {ssh.quote(wrapper)} </dev/null >> {log_word} 2>&1 &
fi
_i=0; while [ ! -s "{exit_file}.pid" ] && [ $_i -lt 100 ]; do sleep 0.05; _i=$((_i+1)); done
_p=$(cat "{exit_file}.pid" 2>/dev/null); rm -f "{exit_file}.pid"
sleep 0.2
echo "PID $_p $({_START})"
echo "LOG $(cd "$(dirname {log_word})" && pwd)/$(basename {log_word})"
echo "EXIT {exit_file}"
echo "HOME $HOME"
[ -f "{exit_file}" ] && echo "CODE $(cat "{exit_file}")"
"""
        code, out = ssh.quick(self.host, script)
        said = dict(line.partition(" ")[::2] for line in out.splitlines() if line)
        if "NODIR" in said:
            raise StepError(f"working directory does not exist on {self.host}: {spec.cwd}")
        if "NOSETSID" in said:
            raise StepError(
                f"there is no `setsid` on {self.host}: a detached job needs it (util-linux)",
                hint="install util-linux there",
            )
        if "NOLOG" in said:
            raise StepError(f"cannot write the job's log on {self.host}: {log}")
        pid_text, _, start = said.get("PID", "").partition(" ")
        if not pid_text.isdigit():
            raise StepError(f"the job did not start on {self.host} (the start script said: {out.strip()[-300:]})")
        home = said.get("HOME", "")
        job = {
            "host": self.host,
            "pid": int(pid_text),
            "start_time": start.strip(),
            "token": token,
            "log": said.get("LOG", log),
            "exit_file": exit_file.replace("$HOME", home) if home else exit_file,
            "fingerprint": ctx.fingerprint,
            "started": time.time(),
        }
        jobfile.parent.mkdir(parents=True, exist_ok=True)
        write(str(jobfile), job)
        early = said.get("CODE", "").strip()
        if early and early != "0":
            raise StepError(
                f"the job exited at once on {self.host} with code {early}",
                hint=f"its log there: {job['log']}",
                output_tail=ctx.mask("\n".join(self._tail(job))),
            )
        ctx.on_output(f"started pid {job['pid']} on {self.host}, log {job['log']}")
        return job

    def signal(self, ctx: StepContext, jobfile: Path, job: dict[str, Any], stop_signal: str, timeout: float) -> str:
        """The stop signal to the job's process group there, `timeout` seconds, then SIGKILL: one round trip
        (the waiting happens there). Only while the pid is still the job's (start time and token)."""
        tenths = max(1, int(timeout * 10))
        mine = self._mine(job)
        members = self._members(job)
        script = f"""_p={int(job["pid"])}
_live() {{ {mine} || [ -n "$({members})" ]; }}
if ! _live; then echo GONE; exit 0; fi
kill -{stop_signal} -$_p 2>/dev/null || kill -{stop_signal} $_p 2>/dev/null
_i=0
while _live; do
  _i=$((_i+1)); if [ $_i -gt {tenths} ]; then kill -KILL -$_p 2>/dev/null; echo KILLED; exit 0; fi
  sleep 0.1
done
echo STOPPED
"""
        _, out = ssh.quick(self.host, script, timeout=timeout + 60)
        if "GONE" in out:
            return "it no longer ran"
        if "KILLED" in out:
            return f"SIGKILL after {timeout:g}s"
        return f"SIG{stop_signal}"

    def _tail(self, job: dict[str, Any], lines: int = 20) -> list[str]:
        _, out = ssh.quick(self.host, f"tail -n {lines} -- {ssh.quote(str(job.get('log')))} 2>/dev/null; :")
        return out.splitlines()

    def logs(self, ctx: StepContext, job: dict[str, Any], follow: bool) -> Iterator[str] | None:
        """The job's log, read there (`tail`), followed with -f until the job ends or the reader stops."""
        ssh.connect(self.host)
        log = ssh.quote(str(job.get("log")))
        if follow:
            # tail follows the job's pid (--pid): it ends with the job
            command = f"exec tail -n +1 --pid={int(job['pid'])} -F -- {log} 2>/dev/null || exec tail -n +1 -f -- {log}"
        else:
            command = f"exec cat -- {log}"
        return self._read(ctx, command, follow)

    def _read(self, ctx: StepContext, command: str, follow: bool) -> Iterator[str]:
        proc = subprocess.Popen(
            ssh.command_argv(self.host, command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=ssh.local_env(),
        )
        assert proc.stdout is not None
        try:
            while True:
                chunk = proc.stdout.read1(65536)  # type: ignore[attr-defined]
                if not chunk:
                    break
                yield ctx.mask(chunk.decode("utf-8", "replace"))
        finally:
            if proc.poll() is None:
                proc.terminate()
            proc.wait()
        if proc.returncode not in (0, None, -15) and not follow:
            err = (proc.stderr.read() if proc.stderr else b"").decode("utf-8", "replace").strip()
            raise StepError(f"cannot read the job's log on {self.host}: {err or f'exit {proc.returncode}'}")


LOCAL = LocalJobs()
_remote: dict[str, SshJobs] = {}


def jobs_on(host: str | None) -> LocalJobs | SshJobs:
    """The jobs of the machine `host` names (None: this one)."""
    if not host:
        return LOCAL
    if host not in _remote:
        _remote[host] = SshJobs(host)
    return _remote[host]

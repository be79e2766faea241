"""A detached launch on another machine (`launch: {host: ..., detach: true}`).

The job starts there in a session of its own (setsid), under a small sh wrapper that writes its exit status,
when it ends, to `~/.runner/jobs/<pipeline>/<step>.exit` on that host; its output goes to `log` (default
`~/.runner/jobs/<pipeline>/<step>.log` there). The control machine keeps the job file, `.runner/jobs/<step>.json`:
host, pid, the process's start time there (a reused pid is never taken for the job), a token the job carries in
its environment, the log and exit paths, the fingerprint. One round trip reads the job's state (alive, exit
status, `creates`); the next apply adopts a live job with the same fingerprint, takes one that exited 0 as done,
and launches again one that failed or vanished; `runner stop STEP` signals the job's process group there;
`runner logs STEP -f` follows the log over ssh.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from steps._support import remote, ssh
from steps._support.supervise import write
from steps.base import Probe, StepContext, StepError

TOKEN = "RUNNER_JOB_TOKEN"
# the start time of a process, field 22 of /proc/PID/stat, read after the ") " that ends its name (which may
# hold spaces): the 20th field from there
_START = "sed 's/.*) //' /proc/$_p/stat 2>/dev/null | cut -d' ' -f20"


def _when(ts: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if isinstance(ts, (int, float)) else "?"


class RemoteJob:
    def __init__(self, step: Any, host: str) -> None:
        self.step = step
        self.host = host  # where the step starts its job: the step's `host:`
        self._seen: dict[str, Any] | None = None

    def where(self, job: dict[str, Any] | None) -> str:
        """Where a recorded job runs: the host it was started on (the spec's host may have changed since)."""
        recorded = job.get("host") if job else None
        return recorded if isinstance(recorded, str) and recorded else self.host

    # ---- the job file, on the control machine ---------------------------------------------------------------

    def job_path(self, ctx: StepContext) -> Path:
        return ctx.state_dir / "jobs" / f"{ctx.name}.json"

    def job(self, ctx: StepContext) -> dict[str, Any] | None:
        try:
            data = json.loads(self.job_path(ctx).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("host") else None

    def _write(self, ctx: StepContext, data: dict[str, Any]) -> None:
        self.job_path(ctx).parent.mkdir(parents=True, exist_ok=True)
        write(str(self.job_path(ctx)), data)

    def _dir(self, ctx: StepContext) -> str:
        """The job directory there: one per pipeline (its state directory's path names it), for its steps' logs
        and exit files."""
        tag = hashlib.sha256(os.fspath(ctx.state_dir.resolve()).encode()).hexdigest()[:12]
        return f"$HOME/.runner/jobs/{tag}"

    def _log(self, ctx: StepContext) -> str:
        spec = self.step.spec
        if spec.log:
            return "$HOME/" + spec.log[2:] if spec.log.startswith("~/") else spec.log
        return f"{self._dir(ctx)}/{_safe(ctx.name)}.log"

    # ---- reading the job's state there: one round trip -------------------------------------------------------

    def look(self, ctx: StepContext) -> dict[str, Any]:
        """{job, alive, exit_code, missing}: the job file and what the host says about it (kept for this run)."""
        if self._seen is not None:
            return self._seen
        job = self.job(ctx)
        lines = []
        if job and isinstance(job.get("pid"), int):
            pid = int(job["pid"])
            token = str(job.get("token", ""))
            lines.append(
                f'_p={pid}; if [ "$({_START})" = {ssh.quote(str(job.get("start_time")))} ] && '
                f"tr '\\0' '\\n' < /proc/$_p/environ 2>/dev/null | grep -qx {ssh.quote(f'{TOKEN}={token}')}; "
                "then echo RUN; fi"
            )
            exit_file = job.get("exit_file")
            if isinstance(exit_file, str):
                lines.append(f'[ -f "{exit_file}" ] && echo "EXIT $(cat "{exit_file}")"')
        spec = self.step.spec
        if spec.cwd:
            lines.insert(0, f"cd {ssh.quote(spec.cwd)} 2>/dev/null")
        for index, pattern in enumerate(spec.creates):
            lines.append(f'_f=0; {remote.any_match(pattern)} && _f=1; echo "C{index} $_f"')
        alive, code, found = False, None, {}
        elsewhere = job is not None and self.where(job) != self.host
        if elsewhere:  # the job runs where the spec no longer says: its state is read there, `creates` here
            job_lines = [line for line in lines if not line.startswith(("cd ", "_f=0"))]
            lines = [line for line in lines if line.startswith(("cd ", "_f=0"))]
            _, there = ssh.quick(self.where(job), "\n".join(job_lines) + "\n:\n")
        else:
            there = ""
        if lines or there:
            out = there
            if lines:
                out += ssh.quick(self.host, "\n".join(lines) + "\n:\n")[1]
            for line in out.splitlines():
                head, _, rest = line.partition(" ")
                if head == "RUN":
                    alive = True
                elif head == "EXIT" and rest.strip().lstrip("-").isdigit():
                    code = int(rest.strip())
                elif head.startswith("C"):
                    found[head[1:]] = rest.strip() == "1"
        missing = next((p for i, p in enumerate(spec.creates) if not found.get(str(i), False)), None)
        self._seen = {"job": job, "alive": alive, "exit_code": code, "missing": missing}
        return self._seen

    def running(self, job: dict[str, Any]) -> bool:
        """Whether a recorded job still runs where it was started (its pid, start time and token): one round trip."""
        pid, token = job.get("pid"), str(job.get("token", ""))
        if not isinstance(pid, int) or pid <= 1:
            return False
        script = (
            f'_p={pid}; if [ "$({_START})" = {ssh.quote(str(job.get("start_time")))} ] && '
            f"tr '\\0' '\\n' < /proc/$_p/environ 2>/dev/null | grep -qx {ssh.quote(f'{TOKEN}={token}')}; "
            "then echo RUN; fi\n"
        )
        return "RUN" in ssh.quick(self.where(job), script)[1]

    def probe(self, ctx: StepContext) -> Probe:
        seen = self.look(ctx)
        job = seen["job"]
        where = f"on {self.where(job)}"
        if job is None:
            return Probe.missing("no job recorded in .runner/jobs")
        if seen["alive"]:
            return Probe.ok(f"running {where} since {_when(job.get('started'))}, pid {job['pid']}")
        if job.get("stopped"):
            return Probe.parked(
                f"stopped by `runner stop` at {_when(job.get('finished'))}; `apply --force {ctx.name}` relaunches it"
            )
        code = seen["exit_code"]
        if code == 0:
            if seen["missing"]:
                return Probe.missing(f"the job finished, but {seen['missing']} is missing {where}")
            return Probe.ok(f"finished {where} (exit code 0)")
        if code is None:
            return Probe.missing(
                f"the job is gone (pid {job.get('pid')} {where} no longer runs and left no exit status)"
            )
        return Probe.missing(f"the job exited with code {code} {where}")

    def live_work(self, ctx: StepContext) -> str | None:
        seen = self.look(ctx)
        if seen["job"] and seen["alive"]:
            job = seen["job"]
            return f"the job runs on {self.where(job)} since {_when(job.get('started'))}, pid {job['pid']}"
        return None

    # ---- apply, stop, logs ----------------------------------------------------------------------------------

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        seen = self.look(ctx)
        self._seen = None
        job = seen["job"]
        if job and seen["alive"]:
            if job.get("fingerprint") == ctx.fingerprint and self.where(job) == self.host:
                ctx.on_output(f"adopting the running job on {self.host}, pid {job['pid']}")
                return self._outputs(job)
            ctx.on_output(f"stopping the running job on {self.where(job)} (pid {job['pid']}) to restart it")
            self._signal(ctx, job)
        return self._start(ctx)

    def _start(self, ctx: StepContext) -> dict[str, Any]:
        spec = self.step.spec
        token = secrets.token_hex(16)
        directory = self._dir(ctx)
        log = self._log(ctx)
        exit_file = f"{directory}/{_safe(ctx.name)}.exit"
        inner = spec.command if isinstance(spec.command, str) else None
        job_cmd = f"sh -c {ssh.quote(inner)}" if inner is not None else remote.body_of(spec.command)[len("exec ") :]
        wrapper = f'{job_cmd}; echo $? > "$0.tmp" && mv "$0.tmp" "$0"'
        variables = {**remote.variables(ctx, spec.env), TOKEN: token}
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
        self._write(ctx, job)
        early = said.get("CODE", "").strip()
        if early and early != "0":
            tail = "\n".join(self._tail(job))
            raise StepError(
                f"the job exited at once on {self.host} with code {early}",
                hint=f"its log there: {job['log']}",
                output_tail=ctx.mask(tail),
            )
        ctx.on_output(f"started pid {job['pid']} on {self.host}, log {job['log']}")
        return self._outputs(job)

    def _outputs(self, job: dict[str, Any]) -> dict[str, Any]:
        return {
            "pid": job.get("pid"),
            "started": job.get("started"),
            "log": job.get("log"),
            "detached": True,
            "host": job.get("host"),
        }

    def _signal(self, ctx: StepContext, job: dict[str, Any]) -> str:
        """The stop signal to the job's process group there, `stop_timeout` seconds, then SIGKILL: one round trip
        (the waiting happens there). Only while the pid is still the job's (start time and token)."""
        spec = self.step.spec
        tenths = max(1, int(spec.stop_timeout * 10))
        token = ssh.quote(f"{TOKEN}={job.get('token', '')}")
        mine = (
            f'[ "$({_START})" = {ssh.quote(str(job.get("start_time")))} ] && '
            f"tr '\\0' '\\n' < /proc/$_p/environ 2>/dev/null | grep -qx {token}"
        )
        script = f"""_p={int(job["pid"])}
if ! {{ {mine}; }}; then echo GONE; exit 0; fi
kill -{spec.stop_signal} -$_p 2>/dev/null || kill -{spec.stop_signal} $_p 2>/dev/null
_i=0
while {mine}; do
  _i=$((_i+1)); if [ $_i -gt {tenths} ]; then kill -KILL -$_p 2>/dev/null; echo KILLED; exit 0; fi
  sleep 0.1
done
echo STOPPED
"""
        _, out = ssh.quick(self.where(job), script, timeout=spec.stop_timeout + 60)
        if "GONE" in out:
            return "it no longer ran"
        if "KILLED" in out:
            return f"SIGKILL after {spec.stop_timeout:g}s"
        return f"SIG{spec.stop_signal}"

    def stop(self, ctx: StepContext) -> str:
        seen = self.look(ctx)
        self._seen = None
        job = seen["job"]
        if job is None:
            raise StepError("no job was launched yet")
        if not seen["alive"]:
            code = seen["exit_code"]
            return "not running" + (f" (exited with code {code})" if code is not None else "")
        how = self._signal(ctx, job)
        self._write(ctx, {**job, "stopped": True, "finished": time.time()})
        return f"stopped pid {job['pid']} on {self.where(job)} ({how})"

    def teardown(self, ctx: StepContext, dry_run: bool) -> str | None:
        seen = self.look(ctx)
        if seen["job"] is None:
            return None
        done = None
        if seen["alive"]:
            done = f"would stop pid {seen['job']['pid']} on {self.where(seen['job'])}" if dry_run else self.stop(ctx)
        if not dry_run:
            self.job_path(ctx).unlink(missing_ok=True)
        return done

    def _tail(self, job: dict[str, Any], lines: int = 20) -> list[str]:
        _, out = ssh.quick(self.where(job), f"tail -n {lines} -- {ssh.quote(str(job.get('log')))} 2>/dev/null; :")
        return out.splitlines()

    def logs(self, ctx: StepContext, follow: bool) -> Iterator[str]:
        """The job's log, read there (`tail`), followed with -f until the job ends or the reader stops."""
        job = self.job(ctx)
        if job is None:
            raise StepError("no job was launched yet: there is no log")
        host = self.where(job)
        ssh.connect(host)
        log = ssh.quote(str(job.get("log")))
        if follow:
            # tail follows the job's pid (--pid): it ends with the job
            command = f"exec tail -n +1 --pid={int(job['pid'])} -F -- {log} 2>/dev/null || exec tail -n +1 -f -- {log}"
        else:
            command = f"exec cat -- {log}"
        proc = subprocess.Popen(
            ssh.command_argv(host, command),
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
            raise StepError(f"cannot read the job's log on {host}: {err or f'exit {proc.returncode}'}")


def _safe(name: str) -> str:
    """A step name (a for_each item's `name[key]` too) as a file name there."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)

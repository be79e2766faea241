"""launch: the long-running job — the training run.

Example::

    - name: train
      launch:
        command: [bash, miles/examples/tbench2/run_tbench2.sh]
        env: {OPENENV_SANDBOX_BACKEND: e2b}
        detach: true

In the foreground (the default) the job's output streams to the terminal and the step's result is its exit
status; Ctrl-C stops it. Detached, it runs under a small supervisor in a session of its own, which records
its pid, its process start time (so a reused pid is never taken for the job) and, when it ends, its exit
status in `.runner/jobs/<step>.json`. On the next apply: a live job with the same fingerprint is adopted;
one that exited 0 is done; one that failed or vanished is launched again; a spec or upstream change while it
runs is reported as "restart pending" and carried out only with `apply --force STEP` — a multi-day training
run is never killed silently. A job stopped with `runner stop STEP` stays stopped until forced.
`runner logs STEP [-f]` shows its log. With the step's `host:` the job runs there, as upstream's multi-node
scripts run the launcher on the Ray head; detached, its state is read there in one round trip, `runner stop` and
`runner logs -f` reach it over ssh, and `log` and `creates` are paths there.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from runner.util.text import argv_of
from steps._support.files import check_patterns, expand, remove_created
from steps._support.machine import machine_for
from steps._support.ray_jobs import RayJob, RaySpec
from steps._support.supervise import TOKEN_VARIABLE, carries, start_time, write
from steps.base import Command, Probe, SpecModel, StepContext, StepError, StepKind, env_mapping, machine_named

if TYPE_CHECKING:
    from steps._support.remote_job import RemoteJob

SUPERVISOR = Path(__file__).parent / "_support" / "supervise.py"
START_GRACE = 0.5


class LaunchSpec(SpecModel):
    command: Command = Field(description="The job. A list is argv (no shell); a string runs under `sh -c`.")
    cwd: str | None = Field(None, description="Working directory, relative to the pipeline file.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables of the job.")
    detach: bool = Field(False, description="Run in the background, supervised; later applies adopt it.")
    log: str | None = Field(None, description="Log file of a detached job (default .runner/jobs/<step>.log).")
    stop_signal: str = Field("TERM", description="Signal that asks the job to stop (TERM, INT, ...).")
    stop_timeout: float = Field(30, ge=0, description="Seconds between the stop signal and SIGKILL.")
    creates: list[str] = Field(
        default_factory=list,
        description="Paths or globs the job makes: a finished job counts as done only while they exist.",
    )
    ray: RaySpec | None = Field(
        None,
        description="Submit the job to an existing Ray cluster through its Jobs API instead of running it here "
        "(address, runtime_env, entrypoint_resources, ...).",
    )

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, value: Any) -> Any:
        return env_mapping(value)

    @model_validator(mode="after")
    def _one_place(self, info: ValidationInfo) -> LaunchSpec:
        if machine_named(info) and self.ray is not None:
            raise ValueError("give `host` (run it there over ssh) or `ray` (submit it to a cluster), not both")
        return self

    @field_validator("creates")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        return check_patterns(value)

    @field_validator("stop_signal")
    @classmethod
    def _signal(cls, value: str) -> str:
        name = value.upper().removeprefix("SIG")
        if not hasattr(signal, f"SIG{name}"):
            raise ValueError(f"{value!r} is not a signal name (TERM, INT, HUP, QUIT, KILL, USR1, ...)")
        return name

    @field_validator("command")
    @classmethod
    def _not_empty(cls, value: str | list[str]) -> str | list[str]:
        if (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value):
            raise ValueError("the command is empty")
        return value


def _live_pids(job: dict[str, Any]) -> list[int]:
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


def _alive(job: dict[str, Any]) -> bool:
    return "exit_code" not in job and bool(_live_pids(job))


def _orphaned(job: dict[str, Any]) -> bool:
    """The job runs but its supervisor was killed: its exit status will not be recorded."""
    live = _live_pids(job)
    return bool(live) and job.get("pid") not in live


def _when(ts: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if isinstance(ts, (int, float)) else "?"


class LaunchStep(StepKind[LaunchSpec]):
    kind = "launch"
    on_machine = True
    Spec = LaunchSpec
    outputs = frozenset(
        {"exit_code", "detached", "pid", "started", "log", "submission_id", "address", "status", "host"}
    )
    cosmetic_fields = frozenset({"stop_signal", "stop_timeout", "log"})

    def remote_host(self, ctx: StepContext) -> str | None:
        return ctx.host if not self.spec.detach else None  # a detached job outlives the step on purpose

    def streams_output(self) -> bool:
        return not self.spec.detach and self.spec.ray is None

    @property
    def ray(self) -> RayJob | None:
        return RayJob(self) if self.spec.ray is not None else None

    _remote: RemoteJob | None = None

    def away(self, ctx: StepContext) -> RemoteJob | None:
        """The detached job on another machine (the step's `host` and `detach`), or None."""
        if ctx.host is None or not self.spec.detach:
            return None
        if self._remote is None:
            from steps._support.remote_job import RemoteJob

            self._remote = RemoteJob(self, ctx.host)
        return self._remote

    def preview(self, ctx: StepContext) -> str | None:
        return self.ray.secret_problem(ctx) if self.ray else None

    def remote_log(self, ctx: StepContext, follow: bool) -> Iterator[str] | None:
        if (away := self.away(ctx)) is not None:
            return away.logs(ctx, follow)
        return self.ray.logs(ctx, follow) if self.ray else None

    # ---- the job file ---------------------------------------------------------------------------------

    def job_path(self, ctx: StepContext) -> Path:
        return ctx.state_dir / "jobs" / f"{ctx.name}.json"

    def log_file(self, ctx: StepContext) -> Path | None:
        if not self.spec.detach or ctx.host:
            return None
        job = self.job(ctx)
        if job and isinstance(job.get("log"), str):
            return Path(job["log"])
        return self._log(ctx)

    def _log(self, ctx: StepContext) -> Path:
        spec = self.spec
        return ctx.resolve(spec.log) if spec.log else ctx.state_dir / "jobs" / f"{ctx.name}.log"

    def job(self, ctx: StepContext) -> dict[str, Any] | None:
        try:
            data = json.loads(self.job_path(ctx).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    # ---- probe ----------------------------------------------------------------------------------------

    def _missing_output(self, ctx: StepContext) -> str | None:
        for pattern in self.spec.creates:
            if not expand(ctx.resolve(pattern), ctx):
                return pattern
        return None

    def probe(self, ctx: StepContext) -> Probe:
        if self.ray:
            return self.ray.probe(ctx)
        if (away := self.away(ctx)) is not None:
            return away.probe(ctx)
        if not self.spec.detach:  # on the step's machine: this one or the host's, one round trip there
            machine = machine_for(ctx.host)
            missing = machine.look(ctx, self.spec.cwd, self.spec.creates, [])[0] if self.spec.creates else None
            return Probe.missing(f"{missing} is missing{machine.where} (the job makes it)") if missing else Probe.ok()
        job = self.job(ctx)
        if job is None:
            return Probe.missing("no job recorded in .runner/jobs")
        if _alive(job):
            if _orphaned(job):
                return Probe.ok(
                    f"running since {_when(job.get('started'))}, pid {job['child_pid']} (its supervisor, pid "
                    f"{job['pid']}, is gone: the exit status will not be recorded)"
                )
            return Probe.ok(f"running since {_when(job.get('started'))}, pid {job['pid']}")
        if job.get("stopped"):
            return Probe.parked(
                f"stopped by `runner stop` at {_when(job.get('finished'))}; `apply --force {ctx.name}` relaunches it"
            )
        code = job.get("exit_code")
        if code == 0:
            missing = self._missing_output(ctx)
            if missing:
                return Probe.missing(f"the job finished, but {missing} is missing")
            return Probe.ok(f"finished at {_when(job.get('finished'))} (exit code 0)")
        if code is None:
            return Probe.missing(f"the job is gone (pid {job.get('pid')} no longer runs and left no exit status)")
        return Probe.missing(f"the job exited with code {code} at {_when(job.get('finished'))}")

    def _moved(self, ctx: StepContext) -> dict[str, Any] | None:
        """A job recorded running on another machine than the spec now says (here -> a host, a host -> here):
        the job file, while that job still runs; it is stopped before the new one starts, never left untracked."""
        if not self.spec.detach:
            return None
        job = self.job(ctx)
        if job is None or bool(job.get("host")) == bool(ctx.host):
            return None  # where the spec says (a host's own changes are RemoteJob's)
        from steps._support.remote_job import RemoteJob

        if job.get("host"):
            return job if "exit_code" not in job and RemoteJob(self, ctx.host or "").running(job) else None
        return job if _alive(job) else None

    def _stop_moved(self, ctx: StepContext, job: dict[str, Any]) -> None:
        where = job.get("host") or "this machine"
        ctx.on_output(f"stopping the job running on {where} (pid {job['pid']}): the step now runs its job elsewhere")
        if job.get("host"):
            from steps._support.remote_job import RemoteJob

            RemoteJob(self, ctx.host or "")._signal(ctx, job)
        else:
            self._stop(ctx, job)
        self.job_path(ctx).unlink(missing_ok=True)

    def live_work(self, ctx: StepContext) -> str | None:
        if self.ray:
            return self.ray.live_work(ctx)
        moved = self._moved(ctx)
        if moved is not None:
            where = moved.get("host") or "this machine"
            return f"the job runs on {where} since {_when(moved.get('started'))}, pid {moved['pid']}"
        if (away := self.away(ctx)) is not None:
            return away.live_work(ctx)
        if not self.spec.detach:
            return None
        job = self.job(ctx)
        if job and _alive(job):
            return f"the job runs since {_when(job.get('started'))}, pid {job['pid']}"
        return None

    # ---- apply ----------------------------------------------------------------------------------------

    def _argv(self) -> list[str]:
        command = self.spec.command
        return argv_of(command)

    def _env(self, ctx: StepContext) -> dict[str, str]:
        return {**ctx.env, **self.spec.env}

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        spec = self.spec
        if self.ray:
            return self.ray.apply(ctx)
        moved = self._moved(ctx)
        if moved is not None:
            self._stop_moved(ctx, moved)
        if (away := self.away(ctx)) is not None:
            return away.apply(ctx)
        if not spec.detach:
            return self._foreground(ctx)
        cwd = ctx.resolve(spec.cwd) if spec.cwd else ctx.pipeline_dir
        if not cwd.is_dir():
            raise StepError(f"working directory does not exist: {cwd}")
        job = self.job(ctx)
        if job and _alive(job):
            if job.get("fingerprint") == ctx.fingerprint:
                ctx.on_output(f"adopting the running job, pid {job['pid']}")
                return self._outputs(job)
            ctx.on_output(f"stopping the running job (pid {job['pid']}) to restart it with the new spec")
            self._stop(ctx, job)
        return self._start(ctx, cwd)

    def _foreground(self, ctx: StepContext) -> dict[str, Any]:
        """In the foreground, on the step's machine: its output streamed, stopped with the step."""
        spec = self.spec
        machine = machine_for(ctx.host)
        result = machine.run(
            ctx, spec.command, cwd=spec.cwd, env=spec.env, stop_signal=spec.stop_signal, grace=spec.stop_timeout
        )
        if result.returncode != 0:
            raise machine.failure(result.returncode, spec.command, result.tail, what="the job")
        missing = machine.look(ctx, spec.cwd, spec.creates, [])[0] if spec.creates else None
        if missing:
            raise StepError(
                f"the job succeeded but did not create {missing}{machine.where}",
                hint="fix the job or the `creates` path",
            )
        outputs: dict[str, Any] = {"exit_code": 0, "detached": False}
        return {**outputs, "host": ctx.host} if ctx.host else outputs

    def _start(self, ctx: StepContext, cwd: Path) -> dict[str, Any]:
        jobfile = self.job_path(ctx)
        log = self._log(ctx)
        jobfile.parent.mkdir(parents=True, exist_ok=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        previous = jobfile.with_suffix(".previous.json")
        if jobfile.exists():
            os.replace(jobfile, previous)
        argv = [sys.executable, "-I", str(SUPERVISOR), str(jobfile), str(log), ctx.fingerprint, "--", *self._argv()]
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env={**self._env(ctx), TOKEN_VARIABLE: secrets.token_hex(16)},
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
            job = self.job(ctx)
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
            job = self.job(ctx) or job
            if "exit_code" in job:
                break
            time.sleep(0.05)
        if job.get("exit_code") not in (None, 0):
            raise StepError(
                f"the job exited at once with code {job['exit_code']}",
                hint=f"its log: {log}",
                output_tail=ctx.mask(_tail(log)),
            )
        ctx.on_output(f"started pid {job['pid']}, log {log}")
        return self._outputs(job)

    def _outputs(self, job: dict[str, Any]) -> dict[str, Any]:
        return {"pid": job.get("pid"), "started": job.get("started"), "log": job.get("log"), "detached": True}

    # ---- stop -----------------------------------------------------------------------------------------

    def stop(self, ctx: StepContext) -> str:
        if self.ray:
            return self.ray.stop(ctx)
        if (away := self.away(ctx)) is not None:
            return away.stop(ctx)
        if not self.spec.detach:
            raise StepError("a foreground launch stops when its apply stops (Ctrl-C): nothing runs in the background")
        job = self.job(ctx)
        if job is None:
            raise StepError("no job was launched yet")
        if not _alive(job):
            code = job.get("exit_code")
            ended = f" (exited with code {code} at {_when(job.get('finished'))})" if code is not None else ""
            return "not running" + ended
        how = self._stop(ctx, job)
        latest = self.job(ctx) or job
        self._write(ctx, {**latest, "stopped": True, "finished": latest.get("finished") or time.time()})
        return f"stopped pid {job['pid']} ({how})"

    def teardown(self, ctx: StepContext, purge: bool, dry_run: bool) -> str | None:
        done: list[str] = []
        if (away := self.away(ctx)) is not None:
            return away.teardown(ctx, dry_run)
        if self.ray:
            if self.ray.live_work(ctx):
                done.append("would stop the Ray job" if dry_run else self.ray.stop(ctx))
        elif self.spec.detach:
            job = self.job(ctx)
            if job is not None and _alive(job):
                done.append(f"would stop pid {job['pid']}" if dry_run else self.stop(ctx))
            if job is not None and not dry_run:
                with contextlib.suppress(FileNotFoundError):
                    self.job_path(ctx).unlink()
        if purge:
            done += remove_created(ctx, self.spec.creates, dry_run)
        return "; ".join(done) or None

    def _stop(self, ctx: StepContext, job: dict[str, Any]) -> str:
        spec = self.spec
        live = _live_pids(job)
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
                hint=f"was {self.job_path(ctx)} edited? stop the job by hand, then `runner forget {ctx.name}`",
            )
        sig = getattr(signal, f"SIG{spec.stop_signal}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + spec.stop_timeout
        while time.monotonic() < deadline:
            current = self.job(ctx) or job
            if "exit_code" in current or not _live_pids(job):
                self._kill_rest(pgid)
                return f"SIG{spec.stop_signal}"
            time.sleep(0.1)
        self._kill_rest(pgid)
        current = self.job(ctx) or job
        if "exit_code" not in current:
            self._write(ctx, {**current, "exit_code": -signal.SIGKILL, "finished": time.time()})
        return f"SIGKILL after {spec.stop_timeout:g}s"

    def _kill_rest(self, pgid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)

    def _write(self, ctx: StepContext, data: dict[str, Any]) -> None:
        write(str(self.job_path(ctx)), data)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])

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

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from runner.util.text import argv_of
from steps._support.files import check_patterns
from steps._support.jobs import LOCAL, JobState, jobs_on, read_job
from steps._support.machine import machine_for
from steps._support.ray_jobs import RayJob, RaySpec
from steps._support.supervise import write
from steps.base import Command, Probe, SpecModel, StepContext, StepError, StepKind, env_mapping, machine_named


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


def _when(ts: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if isinstance(ts, (int, float)) else "?"


def _at(ts: Any) -> str:
    return f" at {_when(ts)}" if isinstance(ts, (int, float)) else ""


class LaunchStep(StepKind[LaunchSpec]):
    """Written once against the step's machine: a foreground job through `machine.run`, a detached one through
    that machine's jobs (steps/_support/jobs.py: here the Python supervisor, there a sh wrapper)."""

    kind = "launch"
    on_machine = True
    Spec = LaunchSpec
    outputs = frozenset(
        {"exit_code", "detached", "pid", "started", "log", "submission_id", "address", "status", "host"}
    )
    cosmetic_fields = frozenset({"stop_signal", "stop_timeout", "log"})

    _seen: tuple[dict[str, Any], JobState] | None = None

    def remote_host(self, ctx: StepContext) -> str | None:
        return ctx.host if not self.spec.detach else None  # a detached job outlives the step on purpose

    def streams_output(self) -> bool:
        return not self.spec.detach and self.spec.ray is None

    @property
    def ray(self) -> RayJob | None:
        return RayJob(self) if self.spec.ray is not None else None

    def preview(self, ctx: StepContext) -> str | None:
        return self.ray.secret_problem(ctx) if self.ray else None

    def remote_log(self, ctx: StepContext, follow: bool) -> Iterator[str] | None:
        if self.ray:
            return self.ray.logs(ctx, follow)
        job = self.job(ctx) if self.spec.detach else None
        if job is not None and job.get("host"):
            return jobs_on(str(job["host"])).logs(ctx, job, follow)
        if self.spec.detach and ctx.host and job is None:
            raise StepError("no job was launched yet: there is no log")
        return None

    # ---- the job file (here, wherever the job runs) -----------------------------------------------------

    def job_path(self, ctx: StepContext) -> Path:
        return ctx.state_dir / "jobs" / f"{ctx.name}.json"

    def log_file(self, ctx: StepContext) -> Path | None:
        if not self.spec.detach:
            return None
        job = self.job(ctx)
        if job is not None and job.get("host"):
            return None  # read there (remote_log)
        if job and isinstance(job.get("log"), str):
            return Path(job["log"])
        return None if ctx.host else Path(LOCAL.default_log(ctx, self.spec.log))

    def job(self, ctx: StepContext) -> dict[str, Any] | None:
        return read_job(self.job_path(ctx))

    def _state(self, ctx: StepContext, job: dict[str, Any]) -> JobState:
        """The job's state, read on the machine it runs on (one round trip there), `creates` with it when that is
        the step's machine; kept until apply or stop acts on it."""
        if self._seen is not None and self._seen[0] == job:
            return self._seen[1]
        here = self._runs_where_the_step_does(ctx, job)
        creates = self.spec.creates if here else []
        state = jobs_on(job.get("host")).state(ctx, job, self.spec.cwd if here else None, creates)
        self._seen = (job, state)
        return state

    def _runs_where_the_step_does(self, ctx: StepContext, job: dict[str, Any]) -> bool:
        return (job.get("host") or None) == (ctx.host or None)

    def _where(self, ctx: StepContext, job: dict[str, Any]) -> str:
        """Where a recorded job runs, as the end of a message: " on HOST", "" here (" on this machine" when the
        step now runs its job elsewhere)."""
        where = jobs_on(job.get("host")).where
        return where or ("" if self._runs_where_the_step_does(ctx, job) else " on this machine")

    # ---- probe ----------------------------------------------------------------------------------------

    def probe(self, ctx: StepContext) -> Probe:
        if self.ray:
            return self.ray.probe(ctx)
        spec = self.spec
        if not spec.detach:  # on the step's machine: this one or the host's, one round trip there
            machine = machine_for(ctx.host)
            missing = machine.look(ctx, spec.cwd, spec.creates, [])[0] if spec.creates else None
            return Probe.missing(f"{missing} is missing{machine.where} (the job makes it)") if missing else Probe.ok()
        job = self.job(ctx)
        if job is None:
            return Probe.missing("no job recorded in .runner/jobs")
        where = self._where(ctx, job)
        if not self._runs_where_the_step_does(ctx, job):
            return Probe.missing(f"the job was started{where}; the step now runs it{machine_for(ctx.host).where}")
        state = self._state(ctx, job)
        if state.alive:
            if state.orphaned:
                child = f", pid {job['child_pid']}" if "child_pid" in job else ""
                return Probe.ok(
                    f"running{where} since {_when(job.get('started'))}{child} (its supervisor, pid "
                    f"{job['pid']}, is gone: the exit status will not be recorded)"
                )
            return Probe.ok(f"running{where} since {_when(job.get('started'))}, pid {job['pid']}")
        if job.get("stopped"):
            return Probe.parked(
                f"stopped by `runner stop` at {_when(job.get('finished'))}; `apply --force {ctx.name}` relaunches it"
            )
        code = state.exit_code
        if code == 0:
            if state.missing:
                return Probe.missing(f"the job finished, but {state.missing} is missing{where}")
            return Probe.ok(f"finished{where}{_at(job.get('finished'))} (exit code 0)")
        if code is None:
            return Probe.missing(
                f"the job is gone (pid {job.get('pid')}{where} no longer runs and left no exit status)"
            )
        return Probe.missing(f"the job exited with code {code}{where}{_at(job.get('finished'))}", exit_code=code)

    def live_work(self, ctx: StepContext) -> str | None:
        if self.ray:
            return self.ray.live_work(ctx)
        if not self.spec.detach:
            return None
        job = self.job(ctx)
        if job is None or not self._state(ctx, job).alive:
            return None
        return f"the job runs{self._where(ctx, job)} since {_when(job.get('started'))}, pid {job['pid']}"

    # ---- apply ----------------------------------------------------------------------------------------

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        if self.ray:
            return self.ray.apply(ctx)
        if not self.spec.detach:
            return self._foreground(ctx)
        job = self.job(ctx)
        if job is not None and self._state(ctx, job).alive:
            where = self._where(ctx, job)
            if not self._runs_where_the_step_does(ctx, job):
                ctx.on_output(
                    f"stopping the job running{where} (pid {job['pid']}): the step now runs its job elsewhere"
                )
                self._signal(ctx, job)
                self.job_path(ctx).unlink(missing_ok=True)
            elif job.get("fingerprint") == ctx.fingerprint:
                ctx.on_output(f"adopting the running job{where}, pid {job['pid']}")
                return self._outputs(job)
            else:
                ctx.on_output(f"stopping the running job{where} (pid {job['pid']}) to restart it with the new spec")
                self._signal(ctx, job)
        self._seen = None
        started = jobs_on(ctx.host).start(ctx, self.job_path(ctx), self.spec, argv_of(self.spec.command), self.spec.env)
        return self._outputs(started)

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

    def _outputs(self, job: dict[str, Any]) -> dict[str, Any]:
        out = {"pid": job.get("pid"), "started": job.get("started"), "log": job.get("log"), "detached": True}
        return {**out, "host": job["host"]} if job.get("host") else out

    def _signal(self, ctx: StepContext, job: dict[str, Any]) -> str:
        """Stop the job where it runs: the stop signal to its group, `stop_timeout` seconds, then SIGKILL."""
        self._seen = None
        jobs = jobs_on(job.get("host"))
        return jobs.signal(ctx, self.job_path(ctx), job, self.spec.stop_signal, self.spec.stop_timeout)

    # ---- stop -----------------------------------------------------------------------------------------

    def stop(self, ctx: StepContext) -> str:
        if self.ray:
            return self.ray.stop(ctx)
        if not self.spec.detach:
            raise StepError("a foreground launch stops when its apply stops (Ctrl-C): nothing runs in the background")
        job = self.job(ctx)
        if job is None:
            raise StepError("no job was launched yet")
        state = self._state(ctx, job)
        if not state.alive:
            code = state.exit_code
            return "not running" + (f" (exited with code {code}{_at(job.get('finished'))})" if code is not None else "")
        how = self._signal(ctx, job)
        latest = self.job(ctx) or job
        write(str(self.job_path(ctx)), {**latest, "stopped": True, "finished": latest.get("finished") or time.time()})
        return f"stopped pid {job['pid']}{jobs_on(job.get('host')).where} ({how})"

    def teardown(self, ctx: StepContext, purge: bool, dry_run: bool) -> str | None:
        done: list[str] = []
        if self.ray:
            if self.ray.live_work(ctx):
                done.append("would stop the Ray job" if dry_run else self.ray.stop(ctx))
        elif self.spec.detach:
            job = self.job(ctx)
            if job is not None and self._state(ctx, job).alive:
                where = jobs_on(job.get("host")).where
                done.append(f"would stop pid {job['pid']}{where}" if dry_run else self.stop(ctx))
            if job is not None and not dry_run:
                self.job_path(ctx).unlink(missing_ok=True)
        if purge and self.spec.creates:
            removed = machine_for(ctx.host).remove(ctx, self.spec.cwd, self.spec.creates, dry_run)
            done += [removed] if removed else []
        return "; ".join(done) or None

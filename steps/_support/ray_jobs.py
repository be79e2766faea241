"""A launch onto an existing Ray cluster, through the Ray Jobs REST API (no Ray needed where runner runs).

Example — Miles' launcher on a cluster that is already up (multi-node: MILES_SCRIPT_EXTERNAL_RAY=1)::

    - name: train
      launch:
        command: [python, miles/examples/experimental/openenv/run-openenv-tbench2.py, --num-nodes, "4"]
        env: {MILES_SCRIPT_EXTERNAL_RAY: "1", MASTER_ADDR: "{{ vars.head }}"}
        ray:
          address: "http://{{ vars.head }}:8265"
          runtime_env: {working_dir: .}
          entrypoint_resources: {head: 1}

The submission id is derived from the step's name and fingerprint (`runner-train-3f2a1c9b0e-1`), and recorded
in .runner/jobs/<step>.json before the request is sent, so a re-run — even after a crash in between — never
submits twice. Next apply: PENDING or RUNNING is adopted; SUCCEEDED is done; FAILED (or STOPPED by someone
else) is resubmitted under the next id; a job stopped by `runner stop` stays stopped until `--force`; a
changed spec while it runs is a restart pending. Ray keeps the entrypoint and runtime_env in plain text, so a
secret there is refused: pass a file path instead.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from steps.base import Probe, SpecModel, StepContext, StepError

RUNNING = ("PENDING", "RUNNING")
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class RaySpec(SpecModel):
    address: str = Field(description="The Ray dashboard (Jobs API) address, e.g. http://head:8265.")
    runtime_env: dict[str, Any] = Field(
        default_factory=dict,
        description="Ray's runtime_env (working_dir, pip, env_vars, ...); `env` is merged into env_vars. Ray "
        "stores it in plain text: no secrets.",
    )
    entrypoint_resources: dict[str, float] = Field(
        default_factory=dict, description="Custom resources the entrypoint needs (places it on a node that has them)."
    )
    entrypoint_num_cpus: float | None = Field(None, ge=0, description="CPUs reserved for the entrypoint.")
    entrypoint_num_gpus: float | None = Field(None, ge=0, description="GPUs reserved for the entrypoint.")
    metadata: dict[str, str] = Field(default_factory=dict, description="Metadata stored with the job.")


class RayClient:
    def __init__(self, address: str, timeout: float = 30) -> None:
        self.address = address.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        import urllib.error
        import urllib.request

        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.address + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:  # noqa: S310 - the user's cluster
                raw = answer.read()
                status = answer.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise StepError(
                f"cannot reach the Ray Jobs API at {self.address}: {reason}",
                hint="is the head up (`ray status` there), and the dashboard port (8265) reachable from here?",
            ) from None
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def status(self, submission_id: str) -> dict[str, Any] | None:
        code, body = self._call("GET", f"/api/jobs/{submission_id}")
        if code == 404:
            return None
        if code != 200 or not isinstance(body, dict):
            raise StepError(f"the Ray Jobs API at {self.address} answered {code} for job {submission_id}: {body}")
        return body

    def submit(self, payload: dict[str, Any]) -> tuple[int, Any]:
        return self._call("POST", "/api/jobs/", payload)

    def stop(self, submission_id: str) -> None:
        code, body = self._call("POST", f"/api/jobs/{submission_id}/stop")
        if code not in (200, 404):
            raise StepError(f"stopping {submission_id} on {self.address} failed ({code}): {body}")

    def logs(self, submission_id: str) -> str:
        code, body = self._call("GET", f"/api/jobs/{submission_id}/logs")
        if code != 200 or not isinstance(body, dict):
            raise StepError(f"the Ray Jobs API at {self.address} gave no logs for {submission_id} ({code})")
        return str(body.get("logs", ""))


def submission_id(step: str, fingerprint: str, attempt: int) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", step.lower()).strip("-")[:40] or "job"
    return f"runner-{slug}-{fingerprint[:10]}-{attempt}"


class RayJob:
    """The ray side of the launch kind: state on the cluster, the job file here."""

    def __init__(self, step: Any) -> None:
        self.step = step  # the LaunchStep: its spec, job file helpers

    @property
    def spec(self) -> RaySpec:
        ray = self.step.spec.ray
        assert isinstance(ray, RaySpec)
        return ray

    def client(self) -> RayClient:
        return RayClient(self.spec.address)

    def entrypoint(self) -> str:
        import shlex

        command = self.step.spec.command
        return command if isinstance(command, str) else shlex.join(command)

    def payload(self, ctx: StepContext, sid: str) -> dict[str, Any]:
        spec = self.spec
        runtime_env = json.loads(json.dumps(spec.runtime_env))
        env_vars = {**runtime_env.get("env_vars", {}), **self.step.spec.env}
        if env_vars:
            runtime_env["env_vars"] = env_vars
        payload: dict[str, Any] = {
            "entrypoint": self.entrypoint(),
            "submission_id": sid,
            "runtime_env": runtime_env,
            "metadata": {**spec.metadata, "runner.step": ctx.name},
        }
        if spec.entrypoint_resources:
            payload["entrypoint_resources"] = spec.entrypoint_resources
        if spec.entrypoint_num_cpus is not None:
            payload["entrypoint_num_cpus"] = spec.entrypoint_num_cpus
        if spec.entrypoint_num_gpus is not None:
            payload["entrypoint_num_gpus"] = spec.entrypoint_num_gpus
        return payload

    def secret_problem(self, ctx: StepContext) -> str | None:
        """Ray records the entrypoint and runtime_env in plain text: a known secret there is refused."""
        probe = self.payload(ctx, "probe")
        for part, value in (("the command", probe["entrypoint"]), ("runtime_env / env", probe["runtime_env"])):
            text = json.dumps(value) if not isinstance(value, str) else value
            if ctx.mask(text) != text:
                return (
                    f"a secret is in {part}, and Ray keeps the entrypoint and runtime_env in plain text (in its "
                    "dashboard and job table): pass the key by file path instead (e.g. env: {E2B_API_KEY_FILE: "
                    "/path/on/the/cluster}), or set it on the cluster nodes"
                )
        return None

    # ---- probe ----------------------------------------------------------------------------------------

    def probe(self, ctx: StepContext) -> Probe:
        job = self.step.job(ctx)
        if not job or not job.get("submission_id"):
            return Probe.missing("no job submitted yet")
        info = self.client().status(job["submission_id"])
        if info is None:
            return Probe.missing(f"{job['submission_id']} is not known to the cluster at {self.spec.address}")
        status = info.get("status")
        if status in RUNNING:
            return Probe.ok(f"{job['submission_id']} is {status} on {self.spec.address}")
        if status == "SUCCEEDED":
            return Probe.ok(f"{job['submission_id']} SUCCEEDED on {self.spec.address}")
        if status == "STOPPED" and job.get("stopped"):
            return Probe.ok(
                f"{job['submission_id']} was stopped by `runner stop`; `apply --force {ctx.name}` resubmits"
            )
        message = str(info.get("message") or "").strip()
        return Probe.missing(f"{job['submission_id']} is {status}" + (f": {message[:200]}" if message else ""))

    def live_work(self, ctx: StepContext) -> str | None:
        job = self.step.job(ctx)
        if not job or not job.get("submission_id"):
            return None
        try:
            info = self.client().status(job["submission_id"])
        except StepError:
            return None
        if info and info.get("status") in RUNNING:
            return f"{job['submission_id']} is {info['status']} on {self.spec.address}"
        return None

    # ---- apply ----------------------------------------------------------------------------------------

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        problem = self.secret_problem(ctx)
        if problem:
            raise StepError(problem)
        client = self.client()
        job = self.step.job(ctx) or {}
        previous = str(job.get("submission_id") or "")
        info = client.status(previous) if previous else None
        if info and info.get("status") in RUNNING:
            if job.get("fingerprint") == ctx.fingerprint:
                ctx.on_output(f"adopting {previous}, {info['status']} on {self.spec.address}")
                return self._outputs(previous, info["status"])
            ctx.on_output(f"stopping {previous} to submit the new spec")
            self._stop_and_wait(ctx, client, previous)
        same = job.get("fingerprint") == ctx.fingerprint
        attempt = int(job.get("attempt", 1) or 1) if same else 1
        if same and info is not None:
            attempt += 1  # the last one ended (failed, stopped, or forced to run again): the next id
        while True:
            sid = submission_id(ctx.name, ctx.fingerprint, attempt)
            existing = client.status(sid)
            if existing is None or existing.get("status") in RUNNING:
                break
            attempt += 1  # that id has run and ended before: never reuse it
        # the intent first: a crash between this and the request finds the same id again, never a second job
        self._write(
            ctx,
            {
                "ray": self.spec.address,
                "submission_id": sid,
                "fingerprint": ctx.fingerprint,
                "attempt": attempt,
                "submitted": time.time(),
            },
        )
        if existing is not None:
            ctx.on_output(f"{sid} was already submitted ({existing.get('status')}): adopted")
            return self._outputs(sid, str(existing.get("status")))
        code, body = client.submit(self.payload(ctx, sid))
        if code != 200:
            raise StepError(f"the Ray Jobs API at {self.spec.address} refused the job ({code}): {body}")
        ctx.on_output(f"submitted {sid} to {self.spec.address}")
        info = client.status(sid) or {"status": "PENDING"}
        return self._outputs(sid, str(info.get("status")))

    def _outputs(self, sid: str, status: str) -> dict[str, Any]:
        return {"submission_id": sid, "address": self.spec.address, "status": status, "detached": True}

    def _write(self, ctx: StepContext, data: dict[str, Any]) -> None:
        from steps._support.supervise import write

        path = self.step.job_path(ctx)
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path, data)

    def _stop_and_wait(self, ctx: StepContext, client: RayClient, sid: str) -> str:
        client.stop(sid)
        deadline = time.monotonic() + max(5.0, self.step.spec.stop_timeout)
        while time.monotonic() < deadline:
            info = client.status(sid)
            if info is None or info.get("status") in TERMINAL:
                return str(info.get("status") if info else "gone")
            if ctx.cancel.wait(0.5):
                break
        return "stopping"

    def stop(self, ctx: StepContext) -> str:
        job = self.step.job(ctx)
        if not job or not job.get("submission_id"):
            raise StepError("no Ray job recorded for this step")
        status = self._stop_and_wait(ctx, self.client(), job["submission_id"])
        self._write(ctx, {**job, "stopped": True, "stopped_at": time.time()})
        return f"stopped {job['submission_id']} on {self.spec.address} ({status})"

    def logs(self, ctx: StepContext, follow: bool) -> Iterator[str]:
        job = self.step.job(ctx)
        if not job or not job.get("submission_id"):
            raise StepError("no Ray job recorded for this step")
        client = self.client()
        sid = job["submission_id"]
        shown = 0
        while True:
            text = client.logs(sid)
            if len(text) > shown:
                yield ctx.mask(text[shown:])
                shown = len(text)
            if not follow:
                return
            info = client.status(sid)
            if info is None or info.get("status") in TERMINAL:
                text = client.logs(sid)
                if len(text) > shown:
                    yield ctx.mask(text[shown:])
                return
            time.sleep(1)

"""e2b: prove the sandbox service works — create a sandbox with the e2b SDK, run a command, kill it.

Example — the check before hours of GPU time depend on AgentENV::

    - name: sandbox-check
      needs: [aenv, e2b-settings, e2b-sdk]     # a recreated container re-runs the check
      e2b:
        template: base
        command: echo ok                       # must exit 0 and print "ok"

The URLs and the key come from the fields, or else from `E2B_API_URL`, `E2B_SANDBOX_URL` and `E2B_API_KEY` as an
earlier env step exported them. The check runs in `python:` (default: the interpreter running runner) with
the e2b SDK installed there — the one the training job will use, so an SDK the server cannot serve fails here.
The sandbox is always killed, also when the command fails or the check is interrupted.

A passed check is kept: a converged apply does not call the service. It runs again when its fingerprint
changes — the URLs, the key's digest, the template, the command, or an upstream step's outputs (the
container's id, the installed SDK version).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from pydantic import Field, field_validator

from runner.util.datatype import replace
from runner.util.interpreter import this_python
from steps._support.process import run_process
from steps.base import Probe, SpecModel, StepContext, StepError, StepKind

RESULT_MARK = "RUNNER-E2B-RESULT "

# Runs in the target interpreter; the configuration and the key arrive through the environment, never argv.
CHECK_SCRIPT = r"""
import json, os, signal, sys, time

def report(**fields):
    sys.stdout.write("\n" + MARK + json.dumps(fields) + "\n")
    sys.stdout.flush()

def interrupted(signum, frame):
    raise KeyboardInterrupt

signal.signal(signal.SIGTERM, interrupted)
cfg = json.loads(os.environ.pop("RUNNER_E2B_CHECK"))
try:
    import importlib.metadata
    from e2b import Sandbox
    version = importlib.metadata.version("e2b")
except Exception as exc:
    report(stage="import", error=type(exc).__name__, message=str(exc))
    sys.exit(0)

def raw_status(path):
    # AgentENV answers 401 with an empty body, which the SDK fails to parse (JSONDecodeError, no status):
    # ask the server itself, with a read-only call, what it says to this key.
    import urllib.error, urllib.request
    request = urllib.request.Request(os.environ["E2B_API_URL"].rstrip("/") + path,
                                     headers={"X-API-Key": os.environ["E2B_API_KEY"]})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except Exception:
        return None

def failure(stage, exc):
    status = getattr(exc, "status_code", None)
    text = str(exc)
    if status is None and text[:3].isdigit():
        status = int(text[:3])
    if status is None:
        status = raw_status("/templates/aliases/" + cfg["template"])
        if status not in (401, 403):
            status = None
    return dict(stage=stage, error=type(exc).__name__, message=text, status=status, version=version)

started = time.monotonic()
built = False
if cfg.get("template_image"):
    # AgentENV starts with no templates; make the one the check uses, as `aenv pull IMAGE --name NAME` does
    # (and as Miles' tb2_sandbox_e2b.ensure_task_template does for each task): alias_exists, else build.
    try:
        from e2b import Template
        if not Template.alias_exists(cfg["template"]):
            print(f"building template {cfg['template']} from {cfg['template_image']}", flush=True)
            Template.build(Template().from_image(cfg["template_image"]), cfg["template"])
            built = True
    except Exception as exc:
        report(**failure("template", exc))
        sys.exit(0)
try:
    sandbox = Sandbox.create(template=cfg["template"], timeout=cfg["sandbox_timeout"])
except Exception as exc:
    report(**failure("create", exc))
    sys.exit(0)
outcome = dict(stage="done", sandbox_id=sandbox.sandbox_id, version=version, built=built)
try:
    try:
        result = sandbox.commands.run(cfg["command"], timeout=cfg["command_timeout"])
        outcome.update(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr)
    except Exception as exc:
        if hasattr(exc, "exit_code") and hasattr(exc, "stdout"):
            outcome.update(exit_code=exc.exit_code, stdout=exc.stdout, stderr=getattr(exc, "stderr", ""))
        else:
            outcome.update(failure("run", exc), sandbox_id=sandbox.sandbox_id)
except KeyboardInterrupt:
    outcome.update(stage="interrupted")
finally:
    try:
        sandbox.kill()
        outcome["killed"] = True
    except BaseException as exc:
        outcome.update(killed=False, kill_error=f"{type(exc).__name__}: {exc}")
outcome["seconds"] = round(time.monotonic() - started, 3)
report(**outcome)
""".replace("MARK", repr(RESULT_MARK))


class E2bSpec(SpecModel):
    api_url: str | None = Field(None, description="Control-plane URL (default: E2B_API_URL as the step sees it).")
    sandbox_url: str | None = Field(
        None, description="Data-plane URL for commands (default: E2B_SANDBOX_URL; unset means the SDK's own)."
    )
    api_key: str | None = Field(
        None, description="The API key (default: E2B_API_KEY). Never shown; only its digest is recorded."
    )
    template: str = Field(
        "base",
        description="The sandbox template to create. A freshly started AgentENV has none: name one made with "
        "`aenv pull`, or set `template_image` so the check makes it.",
    )
    template_image: str | None = Field(
        None,
        description="When the server has no template named `template`, build it from this OCI image first "
        "(e.g. `ubuntu:22.04`), with the SDK's Template.build, as `aenv pull IMAGE --name TEMPLATE` does.",
    )
    command: str = Field("echo ok", description="The command to run in the sandbox (under bash -l -c).")
    expect_exit: int = Field(0, description="The exit code the command must end with.")
    expect_output: str | None = Field(
        None, description="Text its stdout must contain (default: `ok` for the default command, else no check)."
    )
    python: str | None = Field(
        None, description="The interpreter whose e2b SDK runs the check (default: the one running runner)."
    )
    sandbox_timeout: int = Field(60, ge=5, le=86400, description="Lifetime asked for the sandbox, in seconds.")
    timeout: float = Field(180, gt=0, le=86400, description="Seconds the whole check may take.")

    @field_validator("command", "template")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value


class E2bStep(StepKind[E2bSpec]):
    kind = "e2b"
    Spec = E2bSpec
    outputs = frozenset({"exit_code", "stdout", "sdk_version", "api_url", "key_digest"})
    changes_system = False
    cosmetic_fields = frozenset({"timeout", "sandbox_timeout"})

    # ---- what the check talks to ----------------------------------------------------------------------

    def _settings(self, ctx: StepContext) -> tuple[str, str | None, str]:
        spec = self.spec
        api_url = (spec.api_url or ctx.env.get("E2B_API_URL") or "").strip()
        sandbox_url = (spec.sandbox_url or ctx.env.get("E2B_SANDBOX_URL") or "").strip() or None
        key = (spec.api_key or ctx.env.get("E2B_API_KEY") or "").strip()
        return api_url, sandbox_url, key

    def _python(self) -> str:
        return self.spec.python or this_python()

    def fingerprint_extra(self, ctx: StepContext) -> dict[str, Any]:
        api_url, sandbox_url, key = self._settings(ctx)
        extra: dict[str, Any] = {
            "api_url": api_url,
            "sandbox_url": sandbox_url,
            "key": ctx.digest(key) if key else None,
            "python": self._python(),
        }
        if self.spec.python is None:
            extra["sdk"] = _own_sdk_version()  # a metadata read, not an import of e2b
        return extra

    def probe(self, ctx: StepContext) -> Probe:
        return Probe.ok("the check passed with these settings (a converged apply does not call the service)")

    # ---- the check ------------------------------------------------------------------------------------

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        spec = self.spec
        api_url, sandbox_url, key = self._settings(ctx)
        if not api_url:
            raise StepError(
                "no API URL: set `api_url:` or export E2B_API_URL in an earlier env step",
                hint="AgentENV listens on http://<host>:8000",
            )
        if not key:
            raise StepError(
                f"no API key for {api_url}: set `api_key:` or export E2B_API_KEY in an earlier env step",
                hint="the key is AENV_API_KEY given to the container, or "
                "`docker exec aenv cat /workspace/env/secrets/api-key`",
            )
        command_timeout = max(5, int(spec.timeout) - 10)
        env = {k: v for k, v in ctx.env.items() if not k.startswith("E2B_")}
        env.update(
            E2B_API_URL=api_url,
            E2B_API_KEY=key,
            PYTHONUNBUFFERED="1",
            RUNNER_E2B_CHECK=json.dumps(
                {
                    "template": spec.template,
                    "template_image": spec.template_image,
                    "sandbox_timeout": spec.sandbox_timeout,
                    "command": spec.command,
                    "command_timeout": command_timeout,
                }
            ),
        )
        if sandbox_url:
            env["E2B_SANDBOX_URL"] = sandbox_url
        where = f"{api_url}" + (f" (commands via {sandbox_url})" if sandbox_url else "")
        ctx.on_output(f"creating a '{spec.template}' sandbox at {where} with {self._python()}")
        timeout = spec.timeout if ctx.timeout is None else min(spec.timeout, ctx.timeout)
        quiet = _Quiet(ctx, key)
        try:
            done = run_process(
                [self._python(), "-I", "-c", CHECK_SCRIPT],
                replace(ctx, timeout=timeout, on_output=quiet.line),
                env=env,
                stop_signal=signal.SIGTERM,
                grace=15.0,  # time to kill the sandbox on the way out
            )
        except StepError as exc:
            raise StepError(_scrub(str(exc), key), exc.hint, _scrub(exc.output_tail, key)) from None
        result = _result(done.stdout)
        if result is None:
            tail = _scrub("\n".join(done.tail), key)
            raise StepError(
                f"the check in {self._python()} ended (exit {done.returncode}) without a result", output_tail=tail
            )
        return self._judge(result, api_url, sandbox_url, key, ctx)

    def _judge(
        self, result: dict[str, Any], api_url: str, sandbox_url: str | None, key: str, ctx: StepContext
    ) -> dict[str, Any]:
        spec = self.spec
        stage = result.get("stage")
        message = _scrub(str(result.get("message", "")), key)
        version = result.get("version")
        if stage == "import":
            raise StepError(
                f"the e2b SDK cannot be imported by {self._python()}: {result.get('error')}: {message}",
                hint="install it for that interpreter (a pip step with packages: ['e2b<2.51'] or 'e2b'), "
                "or point `python:` at the environment that has it",
            )
        if stage in ("create", "template"):
            raise _create_error(result, message, api_url, spec, version)
        if result.get("killed") is False:
            why = _scrub(str(result.get("kill_error")), key)
            ctx.notice(
                f"sandbox {result.get('sandbox_id')} could not be killed ({why}); "
                f"the server ends it after {spec.sandbox_timeout}s"
            )
        if stage == "interrupted":
            raise StepError("interrupted; the sandbox was killed" if result.get("killed") else "interrupted")
        if stage == "run":
            target = sandbox_url or "the SDK's default sandbox domain"
            hint = (
                "check E2B_SANDBOX_URL: with AgentENV it is the same http://<host>:8000 as the API URL"
                if "connect" in message.lower() or "refused" in message.lower()
                else ""
            )
            raise StepError(
                f"sandbox {result.get('sandbox_id')} was created, but running `{spec.command}` through {target} "
                f"failed: {result.get('error')}: {message}",
                hint=hint,
            )
        stdout = _scrub(str(result.get("stdout") or ""), key)
        stderr = _scrub(str(result.get("stderr") or ""), key)
        tail = "\n".join((stdout + stderr).strip().splitlines()[-20:])
        code = result.get("exit_code")
        if code != spec.expect_exit:
            raise StepError(
                f"`{spec.command}` exited {code} in sandbox {result.get('sandbox_id')}, expected {spec.expect_exit}",
                output_tail=tail,
            )
        expected = (
            spec.expect_output if spec.expect_output is not None else ("ok" if spec.command == "echo ok" else None)
        )
        if expected is not None and expected not in stdout:
            raise StepError(f"the output of `{spec.command}` does not contain {expected!r}", output_tail=tail)
        ctx.on_output(
            f"sandbox {result.get('sandbox_id')}: `{spec.command}` exited {code} in {result.get('seconds')}s; killed"
        )
        # No sandbox id among the outputs: they stay the same from check to check, so a re-check after a
        # server restart does not re-run the steps after it.
        return {
            "exit_code": code,
            "stdout": stdout[-2000:],
            "sdk_version": version,
            "api_url": api_url,
            "key_digest": ctx.digest(key),
        }


def _create_error(result: dict[str, Any], message: str, api_url: str, spec: E2bSpec, version: Any) -> StepError:
    status = result.get("status")
    error = str(result.get("error") or "")
    template = spec.template
    if status is None and message[:4].rstrip(":").isdigit():
        status = int(message[:3])
    sdk = f"e2b {version}" if version else "the e2b SDK"
    lowered = message.lower()
    if "refused" in lowered or error in ("ConnectError", "ConnectionRefusedError"):
        return StepError(
            f"connection refused at {api_url}: the server at that URL is not up",
            hint="start it (is the container running? `docker ps`), or fix E2B_API_URL / `api_url:`",
        )
    if error in ("ConnectTimeout", "ReadTimeout", "TimeoutException") or "timed out" in lowered:
        return StepError(
            f"{api_url} did not answer in time: {message}", hint="is the host reachable, and the port published?"
        )
    if result.get("stage") == "template" and status not in (401, 403):
        return StepError(
            f"building template '{template}' from {spec.template_image} at {api_url} with {sdk} failed: "
            f"{error}: {message}",
            hint="is the image name right, and can the server pull it? The server's log says more",
        )
    if status == 401 or error == "AuthenticationException":
        return StepError(
            f"the API key was rejected by {api_url} (401)",
            hint="E2B_API_KEY must be the server's key: the AENV_API_KEY the container was started with, or "
            "`docker exec aenv cat /workspace/env/secrets/api-key`; a key generated inside the container "
            "changes when the container is recreated",
        )
    if status == 405:
        return StepError(
            f"{api_url} answered 405 to POST /v2/sandboxes: the server predates AgentENV PR #306 (2026-09-20), "
            f"and {sdk} creates sandboxes there (e2b >= 2.51 does)",
            hint="pin the SDK with `e2b<2.51`, or run a newer AgentENV image",
        )
    if status in (400, 404) and "template" in message.lower() and "not found" in message.lower():
        # AgentENV: 400 "template X not found" (src/api/impls/sandbox.rs); a fresh server has no templates
        return StepError(
            f"template '{template}' does not exist on {api_url} ({status}: {message.split(': ', 1)[-1]}); "
            "a freshly started AgentENV has no templates",
            hint=f"set `template_image:` (e.g. ubuntu:22.04) so the check builds '{template}' first, or make it "
            f"yourself with `aenv pull ubuntu:22.04 --name {template}`",
        )
    return StepError(f"creating a sandbox at {api_url} with {sdk} failed: {error}: {message}")


def _result(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            try:
                data = json.loads(line[len(RESULT_MARK) :])
            except json.JSONDecodeError:
                return None
            return data if isinstance(data, dict) else None
    return None


def _scrub(text: str, key: str) -> str:
    return text.replace(key, "********") if key else text


class _Quiet:
    """Passes the SDK's own output through, but not the result line (it holds the command's raw output)."""

    def __init__(self, ctx: StepContext, key: str) -> None:
        self.ctx = ctx
        self.key = key

    def line(self, text: str) -> None:
        if text.startswith(RESULT_MARK) or not text.strip():
            return
        self.ctx.on_output(_scrub(text, self.key))


def _own_sdk_version() -> str | None:
    """The installed e2b's version, as importlib.metadata.version("e2b") gives it: the first distribution of
    that name on sys.path. Read from its METADATA header by hand, since metadata.version parses the whole file
    with the email package (milliseconds, on every converged run); anything unusual is left to it."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        found = [n for n in names if n.lower().startswith(("e2b-", "e2b.")) and n.endswith((".dist-info", ".egg-info"))]
        if not found:
            continue
        if len(found) == 1 and found[0].endswith(".dist-info"):
            try:
                with open(os.path.join(entry or ".", found[0], "METADATA"), encoding="utf-8") as fh:
                    for line in fh:
                        if not line.strip():
                            break
                        key, sep, rest = line.partition(":")
                        if sep and key.strip().lower() == "version":
                            return rest.strip()
            except OSError:
                pass
        break
    from importlib import metadata

    try:
        return metadata.version("e2b")
    except metadata.PackageNotFoundError:
        return None

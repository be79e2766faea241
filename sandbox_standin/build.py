"""Template build steps, as AgentENV reads and runs them (src/api/impls/template_helpers.rs, src/template/
step_executor.rs), in the template's own root: a directory of this host (the stand-in has no images), which each
sandbox made from the template starts from as a copy.

RUN runs `/bin/bash -lc CMD` in the current WORKDIR (under the root) with the ENV so far; ENV/ARG set variables
for later steps and for the template's sandboxes; WORKDIR is resolved against the current one, normalised, and
made; USER is recorded (RUN steps do not run as it, as upstream's do not); EXPOSE, VOLUME and LABEL are recorded.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import subprocess
from pathlib import Path
from typing import Any

STEP_TIMEOUT = 600.0


def check_request(body: dict[str, Any]) -> tuple[str | None, tuple[int, int]]:
    """A template request's resources (cpuCount, memoryMB: the machine's 2 and 1024 by default), or the 400
    message AgentENV gives (template_helpers.rs:15-57)."""
    if body.get("tags"):
        return "template tags are not supported yet", (0, 0)
    cpu, memory = body.get("cpuCount", 2), body.get("memoryMB", 1024)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (cpu, memory)):
        return "cpuCount and memoryMB must be non-negative integers", (0, 0)
    if cpu == 0 or memory == 0:
        return "cpuCount and memoryMB must be greater than 0", (0, 0)
    return None, (cpu, memory)


def check_steps(body: dict[str, Any]) -> str | None:
    """The 400 message AgentENV gives a build request whose base or steps it cannot take, or None
    (template_build_start_base_source and apply_e2b_template_step)."""
    image = str(body.get("fromImage") or "").strip()
    template = str(body.get("fromTemplate") or "").strip()
    if image and template:
        return "cannot specify both fromImage and fromTemplate"
    for step in body.get("steps") or []:
        if not isinstance(step, dict):
            return "a template step must be an object"
        if str(step.get("filesHash") or "").strip():
            return "template build filesHash/COPY support is not implemented yet"
        kind = str(step.get("type") or "")
        args = [str(a) for a in step.get("args") or []]
        upper = kind.upper()
        if upper == "RUN" and not (args and args[0].strip()):
            return "RUN template step requires a command argument"
        if upper in ("ENV", "ARG"):
            if not args or len(args) % 2:
                return f"{kind} template step requires key/value arguments"
            if any(not key.strip() for key in args[::2]):
                return f"{kind} template step requires a non-empty key"
        if upper == "WORKDIR" and not (args and args[0].strip()):
            return "WORKDIR template step requires a path argument"
        if upper == "USER" and not (args and args[0].strip()):
            return "USER step requires a value"
        if upper == "EXPOSE" and not (args and args[0].strip()):
            return "EXPOSE step requires a port argument"
        if upper == "VOLUME" and not (args and args[0].strip()):
            return "VOLUME step requires a path argument"
        if upper == "LABEL" and (len(args) < 2 or len(args) % 2 or any(not k.strip() for k in args[::2])):
            return "LABEL step requires key/value arguments"
        if upper in ("COPY", "ADD"):
            return f"{kind} template steps are not supported yet"
        if upper not in ("RUN", "ENV", "ARG", "WORKDIR", "USER", "EXPOSE", "VOLUME", "LABEL"):
            return f"template step type {upper} is not supported"
    return None


def resolve_workdir(current: str, path: str) -> str:
    """step_executor.rs resolve_workdir: joined to the current one when relative, `.` and `..` resolved."""
    joined = path if path.startswith("/") else posixpath.join(current or "/", path)
    parts: list[str] = []
    for part in joined.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
        else:
            parts.append(part)
    return "/" + "/".join(parts)


def inside(root: Path, path: str) -> Path:
    """An absolute path of the template (or sandbox) as a directory under its root on this host."""
    return root / path.lstrip("/")


def run_steps(root: Path, steps: list[dict[str, Any]], context: dict[str, Any], log: Any) -> tuple[str, str] | None:
    """Runs the steps in `root`, updating `context` (env, workdir, user); (message, step) of the first failure
    as AgentENV's build reason gives it (TemplateBuildErrorReason::with_step), or None."""
    for step in steps:
        kind = str(step.get("type")).upper()
        args = [str(a) for a in step.get("args") or []]
        if kind in ("ENV", "ARG"):
            context["env"].update(dict(zip(args[::2], args[1::2], strict=True)))
        elif kind == "WORKDIR":
            context["workdir"] = resolve_workdir(context["workdir"], args[0])
            try:
                inside(root, context["workdir"]).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                return f"build step failed: {exc.strerror}", f"WORKDIR {context['workdir']}"
        elif kind == "USER":
            context["user"] = args[0]
        elif kind == "RUN":
            failure = _run(root, args[0], context, log)
            if failure is not None:
                return failure, f"RUN {args[0]}"
    return None


def _run(root: Path, command: str, context: dict[str, Any], log: Any) -> str | None:
    where = inside(root, context["workdir"])
    where.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(root),
        "LANG": "C.UTF-8",
        **context["env"],
    }
    log("info", f"RUN {command}")
    try:
        done = subprocess.run(
            ["/bin/bash", "-lc", command],
            cwd=where,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=STEP_TIMEOUT,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return f"build step failed: the command ran past {STEP_TIMEOUT:g}s"
    except OSError as exc:
        return f"build step failed: {exc.strerror}"
    for line in (done.stdout + done.stderr).splitlines()[-50:]:
        log("info", line)
    if done.returncode != 0:
        stderr, stdout = done.stderr.strip(), done.stdout.strip()
        suffix = f"; stderr: {stderr}" if stderr else (f"; stdout: {stdout}" if stdout else "")  # errors.rs:30-42
        return f"build step failed: command exited with status {done.returncode}{suffix}"
    return None


def copy_root(source: Path | None, target: Path) -> None:
    """A sandbox (or a template built from another) starts from a copy of its template's root."""
    if source is not None and source.is_dir():
        shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
    else:
        target.mkdir(parents=True, exist_ok=True)

"""What the stand-in keeps: templates (AgentENV's compatibility-mode records) and live sandboxes, each a
scratch directory with its running processes. Every behaviour is cited in sandbox_standin/server.py's docstring.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ENVD_VERSION = "0.2.0"
ENVD_PORT = 49983  # the control-plane port inside the VM (AgentENV src/cfg.rs; the SDK's default too)


DEFAULT_TIMEOUT = 15.0  # NewSandbox's default, and keep_alive_for's: default_sandbox_timeout_secs (cfg.rs:553-554)


@dataclass
class Sandbox:
    sandbox_id: str
    template_id: str
    alias: str
    client_id: str
    directory: Path
    env_vars: dict[str, str]
    metadata: dict[str, str]
    started: float
    timeout: float
    access_token: str | None  # set when created with `secure: true`; the data plane then requires it
    processes: set[subprocess.Popen[bytes]] = field(default_factory=set)
    expires: float = 0.0  # started + timeout, until set_timeout or a refresh moves it

    def __post_init__(self) -> None:
        self.expires = self.expires or self.started + self.timeout

    def describe(self) -> dict[str, Any]:
        return {
            "templateID": self.template_id,
            "alias": self.alias,
            "sandboxID": self.sandbox_id,
            "clientID": self.client_id,
            "startedAt": _iso(self.started),
            "endAt": _iso(self.expires),
            "cpuCount": 1,
            "memoryMB": 512,
            "diskSizeMB": 1024,
            "state": "running",
            "envdVersion": ENVD_VERSION,
            "metadata": self.metadata,
        }


@dataclass
class Template:
    """A template as AgentENV keeps it: one record whose id is also its build id (compatibility mode)."""

    template_id: str
    name: str
    status: str = "waiting"  # waiting (requested) -> building -> ready | error
    image: str | None = None
    reason: str | None = None
    ready_at: float = 0.0
    log: list[dict[str, str]] = field(default_factory=list)

    def current_status(self) -> str:
        if self.status == "building" and time.time() >= self.ready_at:
            self.status = "ready"
            self.log.append(_log_entry("info", f"template {self.name} is ready"))
        return self.status


ALIAS = re.compile(r"[A-Za-z0-9_-]+")  # SnapshotAlias::parse: ASCII letters, digits, hyphens, underscores


def _log_entry(level: str, message: str) -> dict[str, str]:
    return {"timestamp": _iso(time.time()), "level": level, "message": message}


def _iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, tz=timezone.utc).isoformat().replace("+00:00", "Z")


class Registry:
    """The templates and the live sandboxes, each sandbox with its scratch directory and running processes."""

    def __init__(self, root: Path, templates: set[str], build_seconds: float = 0.0) -> None:
        self.root = root
        self.lock = threading.Lock()
        self.build_seconds = build_seconds
        self.templates: dict[str, Template] = {}
        self.sandboxes: dict[str, Sandbox] = {}
        for name in sorted(templates):  # made before start, as `aenv pull` would have made them
            self.templates[name] = Template(str(uuid.uuid4()), name, status="ready", image="(preset)")

    # ---- templates ---------------------------------------------------------------------------------------

    def request_template(self, name: str) -> Template:
        with self.lock:
            template = Template(str(uuid.uuid4()), name)
            self.templates.setdefault(name, template)  # a name that is new resolves once its build is ready
            self.templates[template.template_id] = template
            return template

    def template(self, key: str, ready_only: bool = True) -> Template | None:
        """By id or by name; a name resolves only to a committed (ready) template, as resolve_committed_alias."""
        with self.lock:
            found = self.templates.get(key)
        if found is None:
            return None
        status = found.current_status()
        if ready_only and status != "ready":
            return None
        return found

    def start_build(self, template: Template, body: dict[str, Any]) -> None:
        steps = body.get("steps") or []
        image = body.get("fromImage") or body.get("fromTemplate")
        template.image = str(image) if image else "(the server's default image)"
        template.log.append(_log_entry("info", f"building {template.name} from {template.image}"))
        if steps:
            kinds = ", ".join(sorted({str(step.get("type", "?")) for step in steps if isinstance(step, dict)}))
            template.status = "error"
            template.reason = (
                f"sandbox_standin cannot run template build steps ({kinds}): it has no images; "
                "build from an image alone, or rehearse against a real AgentENV"
            )
            return
        template.status = "building"
        template.ready_at = time.time() + self.build_seconds
        with self.lock:
            self.templates[template.name] = template  # the name now resolves to this build (once ready)

    # ---- sandboxes ---------------------------------------------------------------------------------------

    def create(self, body: dict[str, Any], template: Template) -> Sandbox:
        given = body.get("timeout")
        timeout = float(given) if isinstance(given, (int, float)) else DEFAULT_TIMEOUT
        sandbox_id = str(uuid.uuid4())
        directory = self.root / "sandboxes" / sandbox_id
        directory.mkdir(parents=True)
        env_vars = {str(k): str(v) for k, v in (body.get("envVars") or {}).items()}
        metadata = {str(k): str(v) for k, v in (body.get("metadata") or {}).items()}
        token = secrets.token_hex(16) if body.get("secure") is True else None
        box = Sandbox(
            sandbox_id,
            template.template_id,
            template.name,
            "standin",
            directory,
            env_vars,
            metadata,
            time.time(),
            timeout,
            token,
        )
        with self.lock:
            self.sandboxes[sandbox_id] = box
        return box

    def get(self, sandbox_id: str) -> Sandbox | None:
        self.reap()
        with self.lock:
            return self.sandboxes.get(sandbox_id)

    def keep_alive(self, sandbox_id: str, seconds: float | None, allow_shorter: bool) -> bool:
        """AgentENV's keep_alive_for (orchestrator/service.rs:793-870): the sandbox expires `seconds` from now
        (the default timeout, 15 s, when None: cfg.rs:553-554), unless that is not later and shorter is not
        allowed; False when there is no such sandbox."""
        self.reap()
        with self.lock:
            box = self.sandboxes.get(sandbox_id)
            if box is None:
                return False
            wanted = time.time() + (DEFAULT_TIMEOUT if seconds is None else seconds)
            if allow_shorter or wanted > box.expires:
                box.expires = wanted
            return True

    def kill(self, sandbox_id: str) -> bool:
        with self.lock:
            box = self.sandboxes.pop(sandbox_id, None)
        if box is None:
            return False
        for proc in list(box.processes):
            kill_group(proc)
        shutil.rmtree(box.directory, ignore_errors=True)
        return True

    def reap(self) -> None:
        now = time.time()
        with self.lock:
            expired = [sid for sid, box in self.sandboxes.items() if box.expires < now]
        for sandbox_id in expired:
            self.kill(sandbox_id)

    def listing(self) -> list[dict[str, Any]]:
        self.reap()
        with self.lock:
            return [box.describe() for box in self.sandboxes.values()]


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

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
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sandbox_standin.build import copy_root, run_steps
from sandbox_standin.netns import Network

ENVD_VERSION = "0.5.15"  # AgentENV's default (src/cfg.rs:264-266)
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
    cpu_count: int = 2  # its template's resources
    memory_mb: int = 1024
    workdir: str = "/"  # its template's WORKDIR: where a command without `cwd` runs
    user: str = "root"  # its template's USER, else envd's default (envd main.go:50, 187)
    network: Network | None = None  # its own network namespace (netns.py), or None: this host's

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
            "cpuCount": self.cpu_count,
            "memoryMB": self.memory_mb,
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
    # the resources asked for (resolve_resources, template_helpers.rs:15-32: machine defaults 2 vCPUs, 1024 MiB)
    cpu_count: int = 2
    memory_mb: int = 1024
    root: Path | None = None  # what its build steps made; each sandbox starts from a copy
    context: dict[str, Any] = field(default_factory=lambda: {"env": {}, "workdir": "/", "user": None})
    reason_step: str | None = None  # the step a failed build failed at

    def current_status(self) -> str:
        if self.status == "building" and time.time() >= self.ready_at:
            self.status = "ready"
            self.log.append(_log_entry("info", f"template {self.name} is ready"))
        return self.status


ALIAS = re.compile(r"[A-Za-z0-9_-]+")  # SnapshotAlias::parse: ASCII letters, digits, hyphens, underscores


def _log_entry(level: str, message: str) -> dict[str, str]:
    return {"timestamp": _iso(time.time()), "level": level, "message": message}


def make_homes(directory: Path) -> None:
    """The homes of a sandbox's users (envd.USERS), the unprivileged user's its own where this host is root."""
    (directory / "root").mkdir(mode=0o700, exist_ok=True)
    home = directory / "home" / "user"
    home.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(home, 1000, 1000)


def _iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, tz=timezone.utc).isoformat().replace("+00:00", "Z")


class Registry:
    """The templates and the live sandboxes, each sandbox with its scratch directory and running processes."""

    def __init__(self, root: Path, templates: set[str], build_seconds: float = 0.0) -> None:
        self.root = root
        self.shared_network_said = False  # the warning that sandboxes share this host's network, once
        self.lock = threading.Lock()
        self.build_seconds = build_seconds
        self.templates: dict[str, Template] = {}
        self.sandboxes: dict[str, Sandbox] = {}
        for name in sorted(templates):  # made before start, as `aenv pull` would have made them
            self.templates[name] = Template(str(uuid.uuid4()), name, status="ready", image="(preset)")

    # ---- templates ---------------------------------------------------------------------------------------

    def request_template(self, name: str, cpu_count: int = 2, memory_mb: int = 1024) -> Template:
        with self.lock:
            template = Template(str(uuid.uuid4()), name, cpu_count=cpu_count, memory_mb=memory_mb)
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
        """Starts the build (its steps run in a thread, as AgentENV spawns them; the status says how it went)."""
        image = body.get("fromImage") or body.get("fromTemplate")
        template.image = str(image) if image else "(the server's default image)"
        template.log.append(_log_entry("info", f"building {template.name} from {template.image}"))
        template.status = "building"
        template.ready_at = float("inf")  # until its steps are done
        threading.Thread(target=self._build, args=(template, body), daemon=True).start()

    def _build(self, template: Template, body: dict[str, Any]) -> None:
        root = self.root / "templates" / template.template_id
        base = self.template(str(body.get("fromTemplate") or ""), ready_only=True) if body.get("fromTemplate") else None
        if body.get("fromTemplate") and base is None:
            template.status, template.reason = "error", f"template {body['fromTemplate']} not found"
            return
        context: dict[str, Any] = {"env": {}, "workdir": "/", "user": None}
        if base is not None:
            context = {**base.context, "env": dict(base.context["env"])}
        try:
            copy_root(base.root if base is not None else None, root)
            failed = run_steps(
                root,
                list(body.get("steps") or []),
                context,
                lambda level, text: template.log.append(_log_entry(level, text)),
            )
        except OSError as exc:
            failed = (f"build failed: {exc.strerror}", "")
        if failed is not None:
            template.status, (template.reason, template.reason_step) = "error", failed
            template.log.append(_log_entry("error", f"{failed[1]}: {failed[0]}"))
            return
        template.root, template.context = root, context
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
        copy_root(template.root, directory)
        env_vars = {**template.context["env"], **{str(k): str(v) for k, v in (body.get("envVars") or {}).items()}}
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
            cpu_count=template.cpu_count,
            memory_mb=template.memory_mb,
            workdir=template.context["workdir"],
            user=template.context["user"] or "root",
            network=Network.start(directory),
        )
        make_homes(directory)
        if box.network is None and not self.shared_network_said:
            self.shared_network_said = True
            print(
                "sandbox_standin: no network namespace could be made (unshare/nsenter missing or user namespaces "
                "disabled): sandboxes share this host's ports, so two cannot both serve the same port",
                file=sys.stderr,
                flush=True,
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
        if box.network is not None:
            box.network.stop()
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

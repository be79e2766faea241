"""The E2B-compatible stand-in server: control plane, Connect-RPC process data plane, health.

Every behaviour here copies AgentENV (kvcache-ai/AgentENV at e3dcc6a, the source is cited in docs/upstream.md)
or the e2b SDK (2.45-2.63) where the pipeline and the SDK touch it:

- ``GET /health`` -> 204, no auth. Every other path needs exactly one ``X-API-Key`` header with the server's
  key, checked before routing: wrong, missing or doubled -> 401 with an empty body (src/api/impls/auth.rs).
- No templates until one is made. ``POST /v3/templates {name}`` -> 202 (templateID = buildID), then
  ``POST /v2/templates/{id}/builds/{id} {fromImage}`` -> 202 starts the build, polled with
  ``GET /templates/{id}/builds/{id}/status`` (building -> ready); ``GET /templates/aliases/{name}`` -> 200 or 404
  (what the e2b SDK's ``Template.build`` and ``Template.alias_exists`` call, and what ``aenv pull`` does).
- ``POST /sandboxes`` -> 201; an unknown template -> 400 "template X not found" (src/api/impls/sandbox.rs).
  ``POST /v2/sandboxes`` (SDK >= 2.51) -> 201 as well, except with ``--v1-only``: images before AgentENV PR #306
  route ``/v2/sandboxes`` for GET only, so POST gets axum's 405 (empty body, ``Allow: GET,HEAD``).
- ``GET /sandboxes`` and ``GET /v2/sandboxes`` list the running ones; ``DELETE /sandboxes/{id}`` -> 204, unknown
  -> 404 "sandbox X not found"; any other path -> 404 "route not found: METHOD PATH".
- The data plane: a request with ``E2b-Sandbox-Id`` (or ``X-Agentenv-Sandbox-Id``) on a path that is not a
  control-plane route is a proxy request. A route that does not parse (no port, an id that is not a UUID) passes
  only with the API key and then gets 400 naming the header; else 401. A parsed route to an unknown sandbox is
  404 "sandbox not found"; the envd port (49983) of a sandbox created with ``secure: true`` (e2b < 2.51 sends
  that; newer SDKs do not) needs its ``X-Access-Token``. ``POST /process.Process/Start`` is a Connect
  server-streaming call, JSON codec: the command runs in the sandbox's scratch directory and its output
  streams back as start/data/end events.

Where it cannot copy: a template "build" records the image name and runs no build steps (a build with steps
ends in status error, saying so), and a "sandbox" is a directory whose commands are processes of this user.
Nothing here isolates anything.
"""

from __future__ import annotations

import argparse
import base64
import hmac
import ipaddress
import json
import os
import queue
import re
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ENVD_VERSION = "0.2.0"
ENVD_PORT = 49983  # the control-plane port inside the VM (AgentENV src/cfg.rs; the SDK's default too)
MAX_BODY = 16 * 1024 * 1024
NOT_A_SANDBOX = (
    "sandbox_standin: this is NOT a sandbox. Commands run as ordinary processes of user {user} on this host, "
    "in {root}. Use it for rehearsals on loopback only."
)


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

    def describe(self) -> dict[str, Any]:
        return {
            "templateID": self.template_id,
            "alias": self.alias,
            "sandboxID": self.sandbox_id,
            "clientID": self.client_id,
            "startedAt": _iso(self.started),
            "endAt": _iso(self.started + self.timeout),
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
        timeout = float(given) if isinstance(given, (int, float)) else 15.0  # NewSandbox's default is 15 s
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

    def kill(self, sandbox_id: str) -> bool:
        with self.lock:
            box = self.sandboxes.pop(sandbox_id, None)
        if box is None:
            return False
        for proc in list(box.processes):
            _kill_group(proc)
        shutil.rmtree(box.directory, ignore_errors=True)
        return True

    def reap(self) -> None:
        now = time.time()
        with self.lock:
            expired = [sid for sid, box in self.sandboxes.items() if box.started + box.timeout < now]
        for sandbox_id in expired:
            self.kill(sandbox_id)

    def listing(self) -> list[dict[str, Any]]:
        self.reap()
        with self.lock:
            return [box.describe() for box in self.sandboxes.values()]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def envelope(payload: dict[str, Any], flags: int = 0) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(body)) + body


def read_envelope(data: bytes) -> dict[str, Any]:
    if len(data) < 5:
        raise ValueError("the request holds no Connect envelope")
    flags, length = struct.unpack(">BI", data[:5])
    if flags & 0x01:
        raise ValueError("compressed Connect messages are not supported")
    message = json.loads(data[5 : 5 + length] or b"{}")
    if not isinstance(message, dict):
        raise ValueError("the Connect message is not a JSON object")
    return message


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: StandinServer

    # ---- plumbing --------------------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        if self.server.verbose:
            sys.stderr.write(f"sandbox_standin: {self.address_string()} {format % args}\n")

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            total = 0
            while True:
                size_line = self.rfile.readline(1024).split(b";")[0].strip()
                size = int(size_line or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                total += size
                if total > MAX_BODY:
                    raise ValueError("request body too large")
                chunks.append(self.rfile.read(size))
                self.rfile.readline(8)
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError("request body too large")
        return self.rfile.read(length) if length else b""

    def _json_body(self) -> dict[str, Any]:
        raw = self._body()
        data = json.loads(raw or b"{}")
        if not isinstance(data, dict):
            raise ValueError("the body is not a JSON object")
        return data

    def _send(self, status: int, payload: Any = None, headers: dict[str, str] | None = None) -> None:
        body = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        if payload is not None:
            self.send_header("Content-Type", "application/json")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"code": status, "message": message})

    def _authorized(self) -> bool:
        """Exactly one X-API-Key header, equal to the key (auth.rs: single_header + matches)."""
        given = self.headers.get_all("X-API-Key") or []
        return len(given) == 1 and hmac.compare_digest(given[0].encode(), self.server.api_key.encode())

    def _is_proxy_request(self, route_known: bool) -> bool:
        """A data-plane request: a routing header on a path that is not a control-plane route (proxy.rs)."""
        routed = self.headers.get("E2b-Sandbox-Id") or self.headers.get("X-Agentenv-Sandbox-Id")
        return bool(routed) and not route_known

    # ---- routes ----------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        try:
            body = self._body()
        except ValueError as exc:
            self._error(400, f"bad request: {exc}")
            return
        route = self._route(path)
        if path == "/health" and not self._is_proxy_request(True):
            self._send(204 if method == "GET" else 405, headers={} if method == "GET" else {"Allow": "GET,HEAD"})
            return
        if self._is_proxy_request(route is not None):
            self._data_plane(method, path, body)
            return
        if not self._authorized():
            self._send(401)
            return
        if route is None:
            self._error(404, f"route not found: {method} {path}")
            return
        name, methods = route
        if method not in methods:
            allowed = ",".join(sorted(methods | ({"HEAD"} if "GET" in methods else set())))
            self._send(405, headers={"Allow": allowed})  # axum's MethodNotAllowed: an empty body
            return
        try:
            data = json.loads(body or b"{}") if method == "POST" else {}
        except json.JSONDecodeError as exc:
            self._error(400, f"bad request: {exc}")
            return
        if not isinstance(data, dict):
            self._error(400, "bad request: the body is not a JSON object")
            return
        getattr(self, f"_{name}")(method, path.split("/"), data)

    def _route(self, path: str) -> tuple[str, set[str]] | None:
        """The control-plane routes this stand-in has, by path shape, with the methods each accepts."""
        parts = path.split("/")[1:]
        v2_create = {"GET"} if self.server.v1_only else {"GET", "POST"}
        table: list[tuple[list[str], str, set[str]]] = [
            (["sandboxes"], "sandboxes", {"GET", "POST"}),
            (["v2", "sandboxes"], "sandboxes", v2_create),
            (["sandboxes", "*"], "sandbox", {"GET", "DELETE"}),
            (["v3", "templates"], "request_template", {"POST"}),
            (["v2", "templates", "*", "builds", "*"], "start_build", {"POST"}),
            (["templates", "*", "builds", "*", "status"], "build_status", {"GET"}),
            (["templates", "aliases", "*"], "alias", {"GET"}),
            (["templates"], "templates", {"GET"}),
            (["v2", "templates"], "templates", {"GET"}),
        ]
        for shape, name, methods in table:
            if len(shape) == len(parts) and all(w == "*" or w == p for w, p in zip(shape, parts, strict=True)):
                if name == "sandbox" and parts[1] == "aliases":
                    continue
                return name, methods
        return None

    def _sandboxes(self, method: str, parts: list[str], body: dict[str, Any]) -> None:
        registry = self.server.registry
        if method == "GET":
            self._send(200, registry.listing())
            return
        template_id = str(body.get("templateID") or "")
        if not template_id:
            self._error(400, "templateID is required")
            return
        template = registry.template(template_id)
        if template is None:
            self._error(400, f"template {template_id} not found")
            return
        box = registry.create(body, template)
        answer: dict[str, Any] = {
            "templateID": box.template_id,
            "alias": box.alias,
            "sandboxID": box.sandbox_id,
            "clientID": box.client_id,
            "envdVersion": ENVD_VERSION,
        }
        if box.access_token:
            answer["envdAccessToken"] = box.access_token
        self._send(201, answer, {"x-agentenv-sandbox-id": box.sandbox_id})

    def _sandbox(self, method: str, parts: list[str], body: dict[str, Any]) -> None:
        sandbox_id = parts[2]
        if method == "DELETE":
            if self.server.registry.kill(sandbox_id):
                self._send(204)
            else:
                self._error(404, f"sandbox {sandbox_id} not found")
            return
        box = self.server.registry.get(sandbox_id)
        if box is None:
            self._error(404, f"sandbox {sandbox_id} not found")
        else:
            self._send(200, box.describe())

    def _request_template(self, method: str, parts: list[str], body: dict[str, Any]) -> None:
        name = body.get("name")
        if not name:
            self._error(400, "template name must be provided")
            return
        if not isinstance(name, str) or not ALIAS.fullmatch(name):
            self._error(
                400, f"snapshot alias only supports ASCII letters, digits, hyphens, and underscores, got: {name}"
            )
            return
        template = self.server.registry.request_template(name)
        ident = template.template_id
        self._send(
            202, {"templateID": ident, "buildID": ident, "public": True, "names": [name], "tags": [], "aliases": [name]}
        )

    def _start_build(self, method: str, parts: list[str], body: dict[str, Any]) -> None:
        template_id, build_id = parts[3], parts[5]
        if template_id != build_id:
            self._error(400, "templateID and buildID must match in AgentENV compatibility mode")
            return
        template = self.server.registry.template(template_id, ready_only=False)
        if template is None or template.template_id != template_id:
            self._error(404, f"template {template_id} not found")
            return
        self.server.registry.start_build(template, body)
        self._send(202)

    def _build_status(self, method: str, parts: list[str], body: dict[str, Any]) -> None:
        template_id, build_id = parts[2], parts[4]
        if template_id != build_id:
            self._error(404, f"build {build_id} not found for template {template_id}")
            return
        template = self.server.registry.template(template_id, ready_only=False)
        if template is None or template.template_id != template_id:
            self._error(404, f"template {template_id} not found")
            return
        status = template.current_status()
        offset = 0
        query = self.path.partition("?")[2]
        for pair in query.split("&"):
            key, _, value = pair.partition("=")
            if key == "logsOffset" and value.isdigit():
                offset = int(value)
        entries = template.log[offset:]
        answer: dict[str, Any] = {
            "templateID": template_id,
            "buildID": build_id,
            "status": status,
            "logs": [e["message"] for e in entries],
            "logEntries": entries,
        }
        if template.reason:
            answer["reason"] = {"message": template.reason}
        self._send(200, answer)

    def _alias(self, method: str, parts: list[str], body: dict[str, Any]) -> None:
        alias = parts[3]
        if not ALIAS.fullmatch(alias):
            self._error(
                400, f"snapshot alias only supports ASCII letters, digits, hyphens, and underscores, got: {alias}"
            )
            return
        template = self.server.registry.template(alias)
        if template is None:
            self._error(404, f"template alias not found: {alias}")
        else:
            self._send(200, {"templateID": template.template_id, "public": False})

    def _templates(self, method: str, parts: list[str], body: dict[str, Any]) -> None:
        with self.server.registry.lock:
            known = {t.template_id: t for t in self.server.registry.templates.values()}
        listing = [
            {"templateID": t.template_id, "names": [t.name], "aliases": [t.name], "public": False}
            for t in known.values()
            if t.current_status() == "ready"
        ]
        self._send(200, listing)

    # ---- the data plane --------------------------------------------------------------------------------

    def _stream_start(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/connect+json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _stream_end(self, error: dict[str, str] | None = None) -> None:
        self._chunk(envelope({"error": error} if error else {}, flags=0x02))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _data_plane(self, method: str, path: str, body: bytes) -> None:
        """A proxied request to a sandbox's envd, authorised as require_auth does (auth.rs), routed as proxy.rs.

        A route that does not parse (no or a bad sandbox id, no or a bad port) passes only with the API key, and
        then gets the proxy's 400; a parsed route to an unknown sandbox is 404 "sandbox not found"; the envd
        port of a sandbox created with ``secure: true`` needs its ``X-Access-Token``.
        """
        raw_id = self.headers.get("X-Agentenv-Sandbox-Id") or self.headers.get("E2b-Sandbox-Id")
        raw_port = self.headers.get("X-Agentenv-Target-Port") or self.headers.get("E2b-Sandbox-Port")
        problem = None
        if not raw_id:
            problem = "missing sandbox routing header"
        elif not _is_uuid(raw_id):
            problem = "invalid sandbox routing header"
        elif not raw_port:
            problem = "missing target port routing header"
        elif not raw_port.isdigit() or int(raw_port) > 65535:
            problem = "invalid target port routing header"
        if problem is not None:
            if not self._authorized():
                self._send(401)
            else:
                self._error(400, problem)
            return
        box = self.server.registry.get(str(raw_id))
        if box is None:
            self._error(404, "sandbox not found")
            return
        if int(str(raw_port)) != ENVD_PORT:
            self._error(502, f"sandbox_standin serves only envd (port {ENVD_PORT}), not port {raw_port}")
            return
        if box.access_token is not None:
            token = self.headers.get_all("X-Access-Token") or []
            if len(token) != 1 or not hmac.compare_digest(token[0].encode(), box.access_token.encode()):
                self._send(401)
                return
        if method == "POST" and path == "/process.Process/Start":
            try:
                request = read_envelope(body)
            except (ValueError, json.JSONDecodeError) as exc:
                self._error(400, f"bad request: {exc}")
                return
            self._process_start(box, request)
            return
        self._send(501, {"code": "unimplemented", "message": f"{method} {path} is not in the stand-in"})

    def _process_start(self, box: Sandbox, request: dict[str, Any]) -> None:
        self._stream_start()
        spec = request.get("process") or {}
        argv = [str(spec.get("cmd") or "/bin/bash"), *[str(a) for a in spec.get("args") or []]]
        cwd = box.directory / str(spec.get("cwd") or "").lstrip("/")
        cwd.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(box.directory),
            "LANG": "C.UTF-8",
            "E2B_SANDBOX": "true",
            "E2B_SANDBOX_ID": box.sandbox_id,
            **box.env_vars,
            **{str(k): str(v) for k, v in (spec.get("envs") or {}).items()},
        }
        deadline_ms = self.headers.get("Connect-Timeout-Ms")
        deadline = time.monotonic() + int(deadline_ms) / 1000 if deadline_ms and deadline_ms.isdigit() else None
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            self._chunk(envelope({"event": {"start": {"pid": 0}}}))
            self._chunk(envelope({"event": {"data": {"stderr": _b64(f"{argv[0]}: {exc.strerror}\n".encode())}}}))
            self._chunk(envelope({"event": {"end": {"exitCode": 127, "exited": True, "status": "exit status 127"}}}))
            self._stream_end()
            return
        box.processes.add(proc)
        try:
            self._pump(proc, deadline)
        except (BrokenPipeError, ConnectionResetError):
            _kill_group(proc)  # the client went away: so does its command
        finally:
            box.processes.discard(proc)

    def _pump(self, proc: subprocess.Popen[bytes], deadline: float | None) -> None:
        events: queue.Queue[tuple[str, bytes]] = queue.Queue()

        def reader(stream: Any, name: str) -> None:
            for chunk in iter(lambda: stream.read1(65536), b""):
                events.put((name, chunk))
            events.put((name, b""))

        for stream, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            threading.Thread(target=reader, args=(stream, name), daemon=True).start()
        self._chunk(envelope({"event": {"start": {"pid": proc.pid}}}))
        open_streams = 2
        timed_out = False
        while open_streams:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                name, chunk = events.get(timeout=wait)
            except queue.Empty:
                timed_out = True
                _kill_group(proc)
                deadline = None
                continue
            if not chunk:
                open_streams -= 1
                continue
            self._chunk(envelope({"event": {"data": {name: _b64(chunk)}}}))
        code = proc.wait()
        if timed_out:
            self._stream_end({"code": "deadline_exceeded", "message": "the command ran past its timeout"})
            return
        status = f"exit status {code}" if code >= 0 else f"signal: {signal.Signals(-code).name.lower()[3:]}"
        end = {"exitCode": code if code >= 0 else -1, "exited": code >= 0, "status": status}
        self._chunk(envelope({"event": {"end": end}}))
        self._stream_end()


def _is_uuid(text: str) -> bool:
    """SandboxId::parse_str: sandbox ids are UUIDs."""
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class StandinServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        registry: Registry,
        api_key: str,
        *,
        v1_only: bool = False,
        verbose: bool = False,
    ) -> None:
        self.registry = registry
        self.api_key = api_key
        self.v1_only = v1_only
        self.verbose = verbose
        super().__init__(address, Handler)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


API_KEY_CHARS = re.compile(r"[A-Za-z0-9._~-]{32,256}")


class BadKey(ValueError):
    """A key AgentENV would refuse at start (src/api_key.rs ApiKey::new)."""


def load_key(key_file: Path) -> str:
    """AENV_API_KEY if set, else the key file, else a new key written there (0600), as src/api_key.rs resolves it:
    the key must be 32-256 URL-safe characters, and a generated one is ``e2b_`` + 64 hex digits (32 random bytes).
    """
    key = os.environ.get("AENV_API_KEY", "").strip()
    if not key and key_file.is_file():
        key = key_file.read_text(encoding="utf-8").strip()
    if key:
        if not API_KEY_CHARS.fullmatch(key):
            raise BadKey("API key must contain between 32 and 256 URL-safe characters")
        return key
    key = "e2b_" + secrets.token_hex(32)
    key_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(key + "\n")
    return key


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox_standin",
        description="An E2B-compatible stand-in for the AgentENV API, for rehearsals and tests. NOT a sandbox: "
        "commands run on this host.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address (others are refused)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--root", default=".sandbox-standin", help="scratch directories live here")
    parser.add_argument("--key-file", help="where the key is kept (default ROOT/secrets/api-key)")
    parser.add_argument(
        "--templates",
        default="",
        help="comma-separated template names that exist at start, as if made earlier with `aenv pull` "
        "(default: none, as a freshly started AgentENV)",
    )
    parser.add_argument("--v1-only", action="store_true", help="answer 405 on POST /v2/sandboxes (pre-PR #306)")
    parser.add_argument(
        "--ready-after",
        type=float,
        default=0.0,
        help="start listening only after this many seconds (AgentENV's first start fetches its runtime first)",
    )
    parser.add_argument("--build-seconds", type=float, default=0.0, help="how long a template build takes")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    if not is_loopback(args.host):
        parser.error(f"--host {args.host} is not a loopback address: this stand-in runs commands on this host")
    root = Path(args.root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    try:
        key = load_key(Path(args.key_file).resolve() if args.key_file else root / "secrets" / "api-key")
    except BadKey as exc:
        print(f"sandbox_standin: invalid AENV_API_KEY: {exc}", file=sys.stderr)
        return 1
    registry = Registry(
        root, {t.strip() for t in args.templates.split(",") if t.strip()}, build_seconds=args.build_seconds
    )
    if args.ready_after > 0:
        print(f"sandbox_standin: preparing; listening in {args.ready_after:g}s", file=sys.stderr, flush=True)
        time.sleep(args.ready_after)
    try:
        server = StandinServer(
            (args.host, args.port),
            registry,
            key,
            v1_only=args.v1_only,
            verbose=args.verbose,
        )
    except OSError as exc:
        print(f"sandbox_standin: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    user = os.environ.get("USER") or str(os.getuid())
    print(NOT_A_SANDBOX.format(user=user, root=root), file=sys.stderr, flush=True)
    print(f"sandbox_standin: listening on http://{args.host}:{server.server_port}", file=sys.stderr, flush=True)

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        for sandbox_id in list(registry.sandboxes):
            registry.kill(sandbox_id)
        server.server_close()
    return 0

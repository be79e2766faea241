"""The E2B-compatible stand-in server: control plane, Connect-RPC process data plane, health.

Wire (as the e2b SDK 2.45-2.63 speaks it):

- ``GET /health`` -> 204, no auth (AgentENV's readiness endpoint).
- ``POST /v2/sandboxes`` (SDK >= 2.51) and ``POST /sandboxes`` -> 201 ``{templateID, sandboxID, clientID,
  envdVersion}``; ``--v1-only`` answers 405 on the v2 path, as AgentENV images before its PR #306 do.
- ``GET /v2/sandboxes`` and ``GET /sandboxes`` -> the list; ``GET /sandboxes/{id}`` -> one;
  ``DELETE /sandboxes/{id}`` -> 204, unknown -> 404.
- Control-plane calls need the header ``X-API-Key`` (any case): a wrong or missing key -> 401.
- ``POST /process.Process/Start`` with ``E2b-Sandbox-Id``: a Connect server-streaming call, JSON codec; the
  command runs in the sandbox's scratch directory and its output streams back as start/data/end events.

Nothing here isolates anything: a "sandbox" is a directory and its commands are processes of this user.
"""

from __future__ import annotations

import argparse
import base64
import hmac
import ipaddress
import json
import os
import queue
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
MAX_BODY = 16 * 1024 * 1024
NOT_A_SANDBOX = (
    "sandbox_standin: this is NOT a sandbox. Commands run as ordinary processes of user {user} on this host, "
    "in {root}. Use it for rehearsals on loopback only."
)


@dataclass
class Sandbox:
    sandbox_id: str
    template_id: str
    client_id: str
    directory: Path
    env_vars: dict[str, str]
    metadata: dict[str, str]
    started: float
    timeout: float
    processes: set[subprocess.Popen[bytes]] = field(default_factory=set)

    def describe(self) -> dict[str, Any]:
        return {
            "templateID": self.template_id,
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


def _iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, tz=timezone.utc).isoformat().replace("+00:00", "Z")


class Registry:
    """The live sandboxes, each with its scratch directory and running processes."""

    def __init__(self, root: Path, templates: set[str]) -> None:
        self.root = root
        self.templates = templates
        self.lock = threading.Lock()
        self.sandboxes: dict[str, Sandbox] = {}

    def create(self, body: dict[str, Any]) -> Sandbox:
        template = str(body.get("templateID") or "base")
        timeout = float(body.get("timeout") or 300)
        sandbox_id = "sbx" + uuid.uuid4().hex[:17]
        directory = self.root / "sandboxes" / sandbox_id
        directory.mkdir(parents=True)
        env_vars = {str(k): str(v) for k, v in (body.get("envVars") or {}).items()}
        metadata = {str(k): str(v) for k, v in (body.get("metadata") or {}).items()}
        box = Sandbox(sandbox_id, template, "standin", directory, env_vars, metadata, time.time(), timeout)
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
        given = self.headers.get("X-API-Key") or ""
        if hmac.compare_digest(given.encode(), self.server.api_key.encode()):
            return True
        self._error(401, "Invalid API key" if given else "Missing API key: send it in the X-API-Key header")
        return False

    # ---- routes ----------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path == "/health":
            self._send(204 if time.time() >= self.server.ready_at else 503)
            return
        if not self._authorized():
            return
        if path in ("/sandboxes", "/v2/sandboxes"):
            self._send(200, self.server.registry.listing())
        elif path.startswith("/sandboxes/"):
            box = self.server.registry.get(path.split("/")[2])
            if box is None:
                self._error(404, "sandbox not found")
            else:
                self._send(200, box.describe())
        else:
            self._error(404, f"no route {path}")

    def do_DELETE(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if not self._authorized():
            return
        parts = path.split("/")
        if len(parts) == 3 and parts[1] == "sandboxes":
            if self.server.registry.kill(parts[2]):
                self._send(204)
            else:
                self._error(404, f"sandbox {parts[2]} not found")
        else:
            self._error(404, f"no route {path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            if path == "/process.Process/Start":
                self._process_start()
                return
            if path in ("/sandboxes", "/v2/sandboxes"):
                body = self._json_body()
                if path == "/v2/sandboxes" and self.server.v1_only:
                    self._send(405, {"code": 405, "message": "Method Not Allowed"}, {"Allow": "GET"})
                    return
                if not self._authorized():
                    return
                template = str(body.get("templateID") or "base")
                if template not in self.server.registry.templates:
                    self._error(404, f"template '{template}' not found")
                    return
                box = self.server.registry.create(body)
                self._send(
                    201,
                    {
                        "templateID": box.template_id,
                        "sandboxID": box.sandbox_id,
                        "clientID": box.client_id,
                        "envdVersion": ENVD_VERSION,
                        "alias": box.template_id,
                    },
                )
                return
            if path.startswith("/process.Process/") or path.startswith("/filesystem."):
                self._body()
                self._send(501, {"code": "unimplemented", "message": f"{path} is not in the stand-in"})
                return
            self._body()
            self._error(404, f"no route {path}")
        except (ValueError, json.JSONDecodeError) as exc:
            self._error(400, f"bad request: {exc}")

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

    def _process_start(self) -> None:
        request = read_envelope(self._body())
        box = self.server.registry.get(self.headers.get("E2b-Sandbox-Id", ""))
        self._stream_start()
        if box is None:
            self._stream_end({"code": "not_found", "message": "sandbox not found"})
            return
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
        ready_after: float = 0.0,
        verbose: bool = False,
    ) -> None:
        self.registry = registry
        self.api_key = api_key
        self.v1_only = v1_only
        self.ready_at = time.time() + ready_after
        self.verbose = verbose
        super().__init__(address, Handler)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_key(key_file: Path) -> str:
    """AENV_API_KEY if set (as AgentENV takes it), else the key file, else a new `e2b_` key written there (0600)."""
    key = os.environ.get("AENV_API_KEY", "").strip()
    if key:
        return key
    if key_file.is_file():
        key = key_file.read_text(encoding="utf-8").strip()
        if key:
            return key
    key = "e2b_" + secrets.token_hex(20)
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
    parser.add_argument("--templates", default="base", help="comma-separated template names it accepts")
    parser.add_argument("--v1-only", action="store_true", help="answer 405 on POST /v2/sandboxes (pre-PR #306)")
    parser.add_argument("--ready-after", type=float, default=0.0, help="/health answers 503 for this many seconds")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    if not is_loopback(args.host):
        parser.error(f"--host {args.host} is not a loopback address: this stand-in runs commands on this host")
    root = Path(args.root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    key = load_key(Path(args.key_file).resolve() if args.key_file else root / "secrets" / "api-key")
    registry = Registry(root, {t.strip() for t in args.templates.split(",") if t.strip()})
    try:
        server = StandinServer(
            (args.host, args.port),
            registry,
            key,
            v1_only=args.v1_only,
            ready_after=args.ready_after,
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

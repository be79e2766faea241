"""The E2B-compatible stand-in server: control plane, Connect-RPC process data plane, health.

Every behaviour here copies AgentENV (kvcache-ai/AgentENV at e3dcc6a) or the e2b SDK (2.45-2.63) where the
pipeline and the SDK touch it; docs/upstream.md cites each one (path:line) and the test that pins it:

- ``GET /health`` -> 204 without a key; every other path needs exactly one valid ``X-API-Key`` (else 401).
- Templates: ``POST /v3/templates``, ``POST /v2/templates/{id}/builds/{id}`` (steps: build.py), the build's
  status, ``GET /templates/aliases/{name}``; sandboxes: ``POST /sandboxes`` and ``/v2/sandboxes`` (GET only
  with ``--v1-only``, as before AgentENV PR #306), list, get, delete, ``/timeout``, ``/refreshes``; any other
  path -> 404 "route not found: METHOD PATH".
- The data plane (proxy.py): routed by header, by the ``/proxy`` prefix or, with ``--proxy-domains``, by a
  ``{port}-{id}.{domain}`` host; envd's ``process.Process/Start`` (a Connect stream) and ``/SendSignal``, and
  its files API; any other port in the sandbox is forwarded, HTTP and WebSocket.

Where it cannot copy: a template's image is only a name; its build steps run in a directory of this host that
its sandboxes start from as copies; a sandbox's commands are processes of this host, as root or uid 1000 (envd.py),
each sandbox in a network namespace of its own where this host can make one (netns.py). Nothing else is isolated.
"""

from __future__ import annotations

import hmac
import json
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sandbox_standin import proxy
from sandbox_standin.build import check_request, check_steps
from sandbox_standin.envd import envelope, read_envelope, read_file, run_process, send_signal, write_files
from sandbox_standin.registry import ALIAS, ENVD_PORT, ENVD_VERSION, Registry, Sandbox

MAX_BODY = 16 * 1024 * 1024
NOT_A_SANDBOX = (
    "sandbox_standin: this is NOT a sandbox. Commands run as ordinary processes of user {user} on this host, "
    "in {root}. Use it for rehearsals on loopback only."
)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: StandinServer
    gone = False  # the client of a stream went away

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

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        target = self.path
        if target.startswith("http://"):  # absolute form: a client that takes the stand-in as its HTTP proxy
            target = "/" + target.removeprefix("http://").partition("/")[2]
        path = target.split("?", 1)[0].rstrip("/") or "/"
        try:
            body = self._body()
        except ValueError as exc:
            self._error(400, f"bad request: {exc}")
            return
        route = self._route(path)
        # is_sandbox_proxy_request (proxy.rs:165-178): the /proxy prefix, a host under a proxy domain (parsed or
        # not), or a routing header on a path that is no control-plane route; such a request never takes the
        # /health bypass (auth.rs:51-54)
        host = self.headers.get("Host") or self.path.removeprefix("http://").partition("/")[0]
        by_host = proxy.host_route(host, self.server.proxy_domains)
        prefixed = path == "/proxy" or path.startswith("/proxy/")
        proxied = prefixed or by_host is not None or self._is_proxy_request(route is not None)
        if path == "/health" and not proxied:
            self._send(204 if method == "GET" else 405, headers={} if method == "GET" else {"Allow": "GET,HEAD"})
            return
        if proxied:
            self._proxy(method, target, path, body, by_host, prefixed, host)
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
        self.had_body = bool(body.strip())
        getattr(self, f"_{name}")(method, path.split("/"), data)

    def _route(self, path: str) -> tuple[str, set[str]] | None:
        """The control-plane routes this stand-in has, by path shape, with the methods each accepts."""
        parts = path.split("/")[1:]
        v2_create = {"GET"} if self.server.v1_only else {"GET", "POST"}
        table: list[tuple[list[str], str, set[str]]] = [
            (["sandboxes"], "sandboxes", {"GET", "POST"}),
            (["v2", "sandboxes"], "sandboxes", v2_create),
            (["sandboxes", "*"], "sandbox", {"GET", "DELETE"}),
            (["sandboxes", "*", "timeout"], "sandbox_timeout", {"POST"}),
            (["sandboxes", "*", "refreshes"], "sandbox_refresh", {"POST"}),
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
        network = body.get("network")
        if isinstance(network, dict) and network.get("allowPublicTraffic") is False:
            self._error(400, "sandbox_standin makes only sandboxes open to public traffic (allowPublicTraffic: false)")
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
        answer["trafficAccessToken"] = None  # public traffic (the only kind the stand-in makes)
        answer["domain"] = self.server.proxy_domains[0] if self.server.proxy_domains else None
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
            domain = self.server.proxy_domains[0] if self.server.proxy_domains else None
            self._send(200, {**box.describe(), "domain": domain})  # sandbox_detail_model (sandbox.rs:242-245)

    def _sandbox_timeout(self, method: str, parts: list[str], body: dict[str, Any]) -> None:
        """set_timeout: the sandbox expires `timeout` s from now, shorter or longer (sandbox.rs:1277-1309,
        keep_alive_for with allow_shorter; openapi.yml:633-642 requires an integer >= 0; no body: the default)."""
        self._keep_alive(parts[2], body, "timeout", required=True, allow_shorter=True, maximum=None)

    def _sandbox_refresh(self, method: str, parts: list[str], body: dict[str, Any]) -> None:
        """refreshes: extended to `duration` s from now, never shortened (sandbox.rs:1186-1221, keep_alive_for
        without allow_shorter; openapi.yml:644-651: an optional integer, 0..3600)."""
        self._keep_alive(parts[2], body, "duration", required=False, allow_shorter=False, maximum=3600)

    def _keep_alive(
        self,
        sandbox_id: str,
        body: dict[str, Any],
        field: str,
        *,
        required: bool,
        allow_shorter: bool,
        maximum: int | None,
    ) -> None:
        value = body.get(field)
        if self.had_body and (value is not None or required):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (maximum and value > maximum):
                upto = f" to {maximum}" if maximum else ""
                self._error(400, f"bad request: `{field}` must be an integer from 0{upto}")
                return
        seconds = float(value) if isinstance(value, int) else None
        if self.server.registry.keep_alive(sandbox_id, seconds, allow_shorter):
            self._send(204)
        else:
            self._error(404, f"sandbox {sandbox_id} not found")

    def _request_template(self, method: str, parts: list[str], body: dict[str, Any]) -> None:
        name = body.get("name")
        if not name:
            self._error(400, "template name must be provided")
            return
        if isinstance(name, str) and ":" in name:  # template_helpers.rs:38-49
            self._error(400, "template name tags are not supported yet")
            return
        if not isinstance(name, str) or not ALIAS.fullmatch(name):
            self._error(
                400, f"snapshot alias only supports ASCII letters, digits, hyphens, and underscores, got: {name}"
            )
            return
        problem, (cpu, memory) = check_request(body)
        if problem is not None:
            self._error(400, problem)
            return
        template = self.server.registry.request_template(name, cpu, memory)
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
        problem = check_steps(body)  # template_helpers.rs:83-106, 109-228: refused before the build starts
        if problem is not None:
            self._error(400, problem)
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
            answer["reason"] = {
                "message": template.reason,
                **({"step": template.reason_step} if template.reason_step else {}),
            }
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

    def _chunk(self, data: bytes, last: bytes = b"") -> None:  # a client gone mid-stream leaves its command be
        if self.gone:
            return
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n" + last)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.gone = self.close_connection = True

    def _proxy(
        self,
        method: str,
        target: str,
        path: str,
        body: bytes,
        by_host: tuple[str, int] | str | None,
        prefixed: bool,
        host: str | None,
    ) -> None:
        """A data-plane request, authorised as require_auth does (auth.rs:65-109) and routed as proxy.rs does: by
        Host (193-239), by the /proxy prefix (245-257, stripped) or by the routing headers (259-285); see the
        module's docstring and docs/upstream.md for what each refusal is."""
        routed = by_host if by_host is not None and not prefixed else proxy.header_route(self.headers)
        if isinstance(routed, str):  # route_for_auth gives None: only the key (or the prefix) lets it through
            if not (prefixed or self._authorized()):
                self._send(401)
            else:
                self._error(400, routed)
            return
        sandbox_id, port = routed
        box = self.server.registry.get(sandbox_id)
        if box is None:
            self._error(404, "sandbox not found")
            return
        if port == ENVD_PORT and box.access_token is not None:
            token = self.headers.get_all("X-Access-Token") or []
            if len(token) != 1 or not hmac.compare_digest(token[0].encode(), box.access_token.encode()):
                self._send(401)
                return
        forward_path = (target.removeprefix("/proxy") or "/") if prefixed else target
        if port != ENVD_PORT:
            self._forward(box, method, port, forward_path, body, host)
            return
        if method == "POST" and path.removeprefix("/proxy") == "/process.Process/Start":
            try:
                request = read_envelope(body)
            except (ValueError, json.JSONDecodeError) as exc:
                self._error(400, f"bad request: {exc}")
                return
            self._process_start(box, request)
            return
        if method == "POST" and path.removeprefix("/proxy") == "/process.Process/SendSignal":
            status, data = send_signal(box, body)
            self._reply(status, data, [("Content-Type", "application/json")])
            return
        if path.removeprefix("/proxy") == "/files" and method in ("GET", "POST"):
            query = dict(urllib.parse.parse_qsl(target.partition("?")[2]))
            kind = self.headers.get("Content-Type", "")
            status, data, kind = read_file(box, query) if method == "GET" else write_files(box, query, kind, body)
            self._reply(status, data, [("Content-Type", kind)])
            return
        self._send(501, {"code": "unimplemented", "message": f"{method} {path} is not in the stand-in"})

    def _forward(self, box: Sandbox, method: str, port: int, path: str, body: bytes, host: str | None) -> None:
        """To a port served inside the sandbox: in its own network (netns.py), else a port on this host whose
        listener that sandbox started. AgentENV answers 502 when nothing takes the connection (proxy.rs:504-511)."""
        opener: proxy.Opener = box.network.connect if box.network is not None else proxy.host_opener
        owner = proxy.listener_session(port) if box.network is None else None
        nothing = f"nothing in sandbox {box.sandbox_id} listens on port {port}"
        if box.network is None and (owner is None or owner not in {proc.pid for proc in box.processes}):
            self._error(502, nothing)
            return
        # a valid API key (auth.rs:78-80) and the envd token (not this port's, auth.rs:106-108) stay here
        dropped = {"x-access-token", *({"x-api-key"} if self._authorized() else set())}
        sent = [(k, v) for k, v in self.headers.items() if k.lower() not in dropped]
        try:
            if method == "GET" and proxy.is_websocket_upgrade(sent):
                self.close_connection = True
                refused = proxy.tunnel_websocket(self.connection, self._buffered(), path, port, sent, host, opener)
                if refused is not None:
                    self.connection.sendall(refused)
                return
            status, headers, data = proxy.forward(method, path, port, sent, body, host, opener)
        except TimeoutError:
            self._send(504)  # PROXY_RESPONSE_HEADER_TIMEOUT (proxy.rs:476-483)
            return
        except OSError as exc:
            self._error(502, nothing) if isinstance(exc, ConnectionRefusedError) else self._send(502)
            return
        self._reply(status, data if method != "HEAD" else b"", headers, len(data))

    def _buffered(self) -> bytes:  # what rfile has buffered past the request (never waits for more)
        self.connection.setblocking(False)
        try:
            return self.rfile.read1(65536) or b""
        except OSError:
            return b""
        finally:
            self.connection.setblocking(True)

    def _reply(self, status: int, data: bytes, headers: list[tuple[str, str]], length: int | None = None) -> None:
        self.send_response(status)
        for key, value in [*headers, ("Content-Length", str(len(data) if length is None else length))]:
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _process_start(self, box: Sandbox, request: dict[str, Any]) -> None:
        self._stream_start()
        error = run_process(box, request, self.headers, lambda event: self._chunk(envelope(event)))
        self._chunk(envelope({"error": error} if error else {}, flags=0x02), last=b"0\r\n\r\n")  # end of stream


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
        proxy_domains: list[str] | None = None,
    ) -> None:
        # AENV_SANDBOX_PROXY_DOMAINS: `{port}-{sandboxID}.{domain}` hosts are proxied into that sandbox, and the
        # first domain is each sandbox's `domain` (sandbox.rs:228-231)
        self.proxy_domains = [d.strip().rstrip(".").lower() for d in proxy_domains or [] if d.strip()]
        self.registry = registry
        self.api_key = api_key
        self.v1_only = v1_only
        self.verbose = verbose
        super().__init__(address, Handler)

"""The data plane past envd: a request routed to a sandbox by its Host (`{port}-{sandboxID}.{domain}`, as AgentENV's
`AENV_SANDBOX_PROXY_DOMAINS` enables) or by the routing headers, forwarded to that port inside the sandbox.

AgentENV forwards to the sandbox VM's own address (src/api/proxy.rs). The stand-in has no VM: a sandbox's
commands run on this host, so a port "inside" a sandbox is a port on 127.0.0.1. It forwards only to a port whose
listening socket belongs to a process that sandbox started (each envd command runs in a session of its own);
any other port is refused, so one sandbox can never be reached through another's name.
"""

from __future__ import annotations

import http.client
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox_standin.envd import is_uuid
from sandbox_standin.netns import pipe

# sanitize_request_headers (proxy.rs:969-980): what only the hop to AgentENV carries; and the hop-by-hop ones
DROPPED = frozenset(
    {
        "x-agentenv-sandbox-id",
        "e2b-sandbox-id",
        "x-agentenv-target-port",
        "e2b-sandbox-port",
        "e2b-traffic-access-token",
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"})
UPSTREAM_TIMEOUT = 30.0  # PROXY_RESPONSE_HEADER_TIMEOUT (proxy.rs:101)
CONNECT_TIMEOUT = 5.0  # PROXY_CONNECT_TIMEOUT
Opener = Callable[[int], socket.socket]  # a connection to a port inside the sandbox


def host_opener(port: int) -> socket.socket:
    """A port of a sandbox that shares this host's network: the port on 127.0.0.1."""
    return socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT)


class _Connection(http.client.HTTPConnection):
    def __init__(self, port: int, opener: Opener) -> None:
        super().__init__("127.0.0.1", port, timeout=UPSTREAM_TIMEOUT)
        self.opener = opener

    def connect(self) -> None:
        self.sock = self.opener(self.port)
        self.sock.settimeout(UPSTREAM_TIMEOUT)


def strip_host_port(host: str) -> str:
    """`name:port` -> name, `[::1]:port` -> ::1 (proxy.rs:390, strip_host_port)."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdigit() and ":" not in name else host


def host_route(raw_host: str | None, domains: list[str]) -> tuple[str, int] | str | None:
    """parse_host_proxy_route (proxy.rs:328-388): (sandbox id, port) for `{port}-{id}.{domain}`, None for any other
    host (the bare domain too), or the 400 message of a host under a domain that does not parse."""
    if not domains:
        return None
    host = strip_host_port((raw_host or "").strip()).rstrip(".").lower()
    if not host:
        return None
    for domain in domains:
        if host == domain:
            return None
        prefix = host.removesuffix(domain)
        if prefix == host or not prefix.endswith("."):
            continue
        label = prefix[:-1]
        if not label or "." in label:
            continue
        port, sep, sandbox_id = label.partition("-")
        if not sep:
            continue
        if not sandbox_id:
            return "invalid sandbox data-plane host: sandbox id is empty"
        if not port.isdigit() or not 0 < int(port) < 65536:
            return "invalid sandbox data-plane host: port is invalid"
        if not is_uuid(sandbox_id):
            return "invalid sandbox data-plane host: sandbox id is invalid"
        return sandbox_id, int(port)
    return None


def header_route(headers: Any) -> tuple[str, int] | str:
    """The routing headers (proxy.rs:817-860): (sandbox id, port), or the 400 message of what is wrong."""
    raw_id = headers.get("X-Agentenv-Sandbox-Id") or headers.get("E2b-Sandbox-Id")
    raw_port = headers.get("X-Agentenv-Target-Port") or headers.get("E2b-Sandbox-Port")
    if not raw_id:
        return "missing sandbox routing header"
    if not is_uuid(raw_id):
        return "invalid sandbox routing header"
    if not raw_port:
        return "missing target port routing header"
    if not raw_port.isdigit() or int(raw_port) > 65535:
        return "invalid target port routing header"
    return raw_id, int(raw_port)


def listener_session(port: int) -> int | None:
    """The session id of the process listening on 127.0.0.1 (or any address) at `port`, from /proc; None when
    nothing listens there or its owner cannot be seen."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                    return int(stat.rsplit(")", 1)[1].split()[3])  # field 6: the session id
            except (OSError, ValueError, IndexError):
                continue
    return None


def forward(
    method: str,
    path: str,
    port: int,
    headers: list[tuple[str, str]],
    body: bytes,
    original_host: str | None,
    opener: Opener = host_opener,
) -> tuple[int, list[tuple[str, str]], bytes]:
    """The request sent on to the sandbox's port, with the x-forwarded-* headers proxy.rs adds (989-1012); its
    response (status, headers, body). OSError when the port does not answer."""
    sent = [(k, v) for k, v in headers if k.lower() not in DROPPED and not k.lower().startswith("x-forwarded-")]
    if original_host:
        sent.append(("X-Forwarded-Host", original_host))
    sent += [("X-Forwarded-Proto", "http"), ("X-Forwarded-Method", method), ("X-Forwarded-Uri", path)]
    sent.append(("Host", f"127.0.0.1:{port}"))
    connection = _Connection(port, opener)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for key, value in sent:
            connection.putheader(key, value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body or None)
        response = connection.getresponse()
        data = response.read()
        kept = [
            (k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP and k.lower() != "content-length"
        ]
        return response.status, kept, data
    finally:
        connection.close()


def is_websocket_upgrade(headers: list[tuple[str, str]]) -> bool:
    """is_websocket_upgrade_request (proxy.rs:1031-1043): Connection has `upgrade`, Upgrade has `websocket`."""

    def has(name: str, token: str) -> bool:
        return any(part.strip().lower() == token for k, v in headers if k.lower() == name for part in v.split(","))

    return has("connection", "upgrade") and has("upgrade", "websocket")


def tunnel_websocket(
    client: socket.socket,
    pending: bytes,
    path: str,
    port: int,
    headers: list[tuple[str, str]],
    original_host: str | None,
    opener: Opener = host_opener,
) -> bytes | None:
    """A WebSocket upgrade carried to the sandbox's port. AgentENV ends the handshake on both sides and bridges the
    messages (proxy.rs:593-700, x-forwarded-proto `ws`); relaying the bytes of the client's own handshake gives
    the client the same: the upstream's 101 and then its frames. Returns the upstream's answer when it refused
    the upgrade (sent back as it is, map_websocket_handshake_rejection_response), else None once either side
    closed. OSError when the port does not answer (502), TimeoutError when it does not answer in time (504)."""
    kept = [(k, v) for k, v in headers if k.lower() not in DROPPED - {"connection", "upgrade"}]
    kept = [(k, v) for k, v in kept if not k.lower().startswith("x-forwarded-")]
    if original_host:
        kept.append(("X-Forwarded-Host", original_host))
    kept += [("X-Forwarded-Proto", "ws"), ("X-Forwarded-Method", "GET"), ("X-Forwarded-Uri", path)]
    kept.append(("Host", f"127.0.0.1:{port}"))
    upstream = opener(port)
    try:
        head = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in kept) + "\r\n"
        upstream.sendall(head.encode("latin-1"))
        upstream.settimeout(UPSTREAM_TIMEOUT)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = upstream.recv(65536)
            if not chunk:
                raise OSError("the upstream closed during the handshake")
            answer += chunk
        status = answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/") else b""
        if status != b"101":
            return answer
        client.sendall(answer)
        if pending:
            upstream.sendall(pending)
        upstream.settimeout(None)
        pipe(client, upstream, join_timeout=5)
        return None
    finally:
        upstream.close()

"""What a converged probe reads from a local Docker Engine — one container's inspect and one image's id — over
the engine's unix socket with the standard library, so that a run with nothing to do does not import the docker
SDK (requests, urllib3 and the SDK itself: about 0.1 s of a 0.2 s run).

The requests are the ones the SDK makes (docker/api/container.py `inspect_container`: GET /containers/{id}/json;
docker/api/image.py `inspect_image`: GET /images/{name}/json; each argument quoted with `safe="/:"` as
docker/api/client.py `_url` does, docker 7.1.0), unversioned, which the engine serves at its own API version.
Anything this module does not expect — no socket, an error status, a body it cannot parse — raises Unreadable,
and the caller asks again through the SDK, whose errors name the engine. It only reads: changes go through the
SDK.
"""

from __future__ import annotations

import json
import socket
from typing import Any
from urllib.parse import quote

TIMEOUT = 10.0


class Unreadable(Exception):
    """The engine could not be read this way: use the SDK."""


def socket_path(address: str) -> str | None:
    """The socket of a local engine address (`unix:///var/run/docker.sock`), or None for any other transport."""
    if address.startswith("unix://"):
        path = address[len("unix://") :]
        return path if path.startswith("/") else None
    return None


def _get(path: str, url: str) -> tuple[int, Any]:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(TIMEOUT)
            sock.connect(path)
            # HTTP/1.0: the engine answers with a plain body and closes the connection (no chunked encoding).
            sock.sendall(f"GET {url} HTTP/1.0\r\nHost: docker\r\nAccept: application/json\r\n\r\n".encode("ascii"))
            chunks = []
            while True:
                data = sock.recv(1 << 16)
                if not data:
                    break
                chunks.append(data)
    except OSError as exc:
        raise Unreadable(str(exc)) from None
    head, sep, body = b"".join(chunks).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if not sep or len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise Unreadable(f"not an HTTP answer: {lines[0][:80]!r}")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise Unreadable("a chunked answer")
    status = int(parts[1])
    if status != 200:
        return status, None
    try:
        return status, json.loads(body)
    except ValueError:
        raise Unreadable("the answer is not JSON") from None


class Container:
    """The part of docker.models.containers.Container the probe reads, from the same inspect document."""

    def __init__(self, attrs: dict[str, Any]) -> None:
        self.attrs = attrs
        self.id: str = attrs.get("Id") or ""
        self.name: str = str(attrs.get("Name") or "").lstrip("/")
        self.labels: dict[str, str] = (attrs.get("Config") or {}).get("Labels") or {}
        self.status: str = (attrs.get("State") or {}).get("Status") or ""


class Engine:
    """A read-only view of a local engine."""

    def __init__(self, path: str) -> None:
        self.path = path

    def container(self, name: str) -> Container | None:
        status, doc = _get(self.path, f"/containers/{quote(name, safe='/:')}/json")
        if status == 404:
            return None
        if status != 200 or not isinstance(doc, dict):
            raise Unreadable(f"inspect of {name}: status {status}")
        return Container(doc)

    def image_id(self, name: str) -> str | None:
        """The id a reference resolves to here, or None when the engine has no such image."""
        status, doc = _get(self.path, f"/images/{quote(name, safe='/:')}/json")
        if status == 404:
            return None
        if status != 200 or not isinstance(doc, dict) or not isinstance(doc.get("Id"), str):
            raise Unreadable(f"inspect of image {name}: status {status}")
        return str(doc["Id"])

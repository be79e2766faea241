"""Readiness polling shared by the wait and docker kinds: an HTTP URL or a TCP port, until it answers."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from pydantic import Field, field_validator, model_validator

from steps.base import SpecModel, StepError


class Readiness(SpecModel):
    http: str | None = Field(None, description="An http:// or https:// URL to GET until it answers with `status`.")
    tcp: str | None = Field(None, description="A `host:port` to connect to until it accepts.")
    status: list[int] = Field(default_factory=list, description="HTTP statuses that mean ready (default: any 2xx).")
    timeout: float = Field(60, gt=0, description="Seconds to wait before failing.")
    interval: float = Field(1, gt=0, description="Seconds between attempts.")

    @field_validator("http")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
        return value

    @field_validator("tcp")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None:
            return value
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected host:port with a port from 1 to 65535, got {value!r}")
        return value

    @field_validator("status")
    @classmethod
    def _statuses(cls, value: list[int]) -> list[int]:
        for code in value:
            if not 100 <= code <= 599:
                raise ValueError(f"{code} is not an HTTP status (100-599)")
        return value

    @model_validator(mode="after")
    def _one_target(self) -> Readiness:
        if (self.http is None) == (self.tcp is None):
            raise ValueError("give exactly one of `http` or `tcp`")
        return self

    @property
    def target(self) -> str:
        return self.http or self.tcp or ""


def _try_http(url: str, statuses: list[int], timeout: float, via: str | None = None) -> tuple[bool, str]:
    if via:
        return _try_http_from(via, url, statuses, timeout)
    import urllib.error  # here, not at the top: a converged run never sends a request
    import urllib.request

    request = urllib.request.Request(url, method="GET", headers={"User-Agent": "runner"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 - the user's own URL
            code = answer.status
            body = answer.read(300)
    except urllib.error.HTTPError as exc:
        code = exc.code
        body = exc.read(300) if exc.fp else b""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason: Any = getattr(exc, "reason", exc)
        return False, f"no answer: {reason}"
    return _answer(code, body, statuses)


def _answer(code: int, body: bytes, statuses: list[int]) -> tuple[bool, str]:
    ready = code in statuses if statuses else 200 <= code < 300
    text = body.decode("utf-8", errors="replace").strip().replace("\n", " ")
    return ready, f"HTTP {code}" + (f": {text[:200]}" if text else "")


def _try_http_from(via: str, url: str, statuses: list[int], timeout: float) -> tuple[bool, str]:
    """GET `url` as the machine `via` sees it: the connection is made there (ssh -W), the request from here."""
    import http.client
    from urllib.parse import urlsplit

    from steps._support import ssh_forward

    parts = urlsplit(url)
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    try:
        sock, proc = ssh_forward.forward(via, parts.hostname or "", port, timeout)
    except StepError as exc:
        return False, f"no answer: {exc.message}"
    try:
        sock.settimeout(timeout)
        conn: http.client.HTTPConnection
        if secure:
            import ssl

            context = ssl.create_default_context()
            conn = http.client.HTTPSConnection(parts.hostname or "", port, timeout=timeout, context=context)
            conn.sock = context.wrap_socket(sock, server_hostname=parts.hostname)
        else:
            conn = http.client.HTTPConnection(parts.hostname or "", port, timeout=timeout)
            conn.sock = sock
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers={"User-Agent": "runner"})
        answer = conn.getresponse()
        return _answer(answer.status, answer.read(300), statuses)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return False, f"no answer: {exc}"
    finally:
        sock.close()
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()


def _try_tcp(target: str, timeout: float, via: str | None = None) -> tuple[bool, str]:
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    if via:
        from steps._support import ssh_forward

        try:
            sock, proc = ssh_forward.forward(via, host, int(port), timeout)
        except StepError as exc:
            return False, f"no connection: {exc.message}"
        sock.close()
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        return True, "connected"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True, "connected"
    except OSError as exc:
        return False, f"no connection: {exc.strerror or exc}"


def wait_ready(
    spec: Readiness,
    cancel: threading.Event,
    alive: Callable[[], str | None] | None = None,
    on_attempt: Callable[[str], None] = lambda text: None,
    via: str | None = None,
) -> str:
    """Poll until ready; returns the answer that meant ready. ``alive`` returns why to give up early, or None.

    Raises StepError on timeout (with the last answer), on cancellation, or when ``alive`` gives a reason.
    """
    if via:
        from steps._support import ssh

        ssh.connect(via)  # a host that cannot be reached is an error now, not an answer to wait out
    deadline = time.monotonic() + spec.timeout
    last = "no attempt made"
    attempts = 0
    while True:
        left = deadline - time.monotonic()
        per_try = max(0.5, min(5.0, left))
        if spec.http:
            ready, last = _try_http(spec.http, spec.status, per_try, via)
        else:
            ready, last = _try_tcp(spec.tcp or "", per_try, via)
        attempts += 1
        on_attempt(f"{spec.target}: {last}")
        if ready:
            return last
        if alive is not None:
            gone = alive()
            if gone:
                raise StepError(gone)
        if time.monotonic() + spec.interval > deadline:
            raise StepError(
                f"{spec.target} not ready after {spec.timeout:g}s ({attempts} attempts); last answer: {last}",
                hint="raise `timeout` if the service is slow to start, or check the service's logs",
            )
        if cancel.wait(spec.interval):
            raise StepError("interrupted while waiting for " + spec.target)

"""Connecting to a Docker Engine with the docker SDK: where to look, and errors that say where we looked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from steps.base import StepError

if TYPE_CHECKING:
    import docker

DEFAULT_HOST = "unix:///var/run/docker.sock"
API_TIMEOUT = 60


def engine_address(host: str | None, env: Mapping[str, str]) -> str:
    """The engine a step talks to: its `host`, else DOCKER_HOST, else the local unix socket."""
    return host or env.get("DOCKER_HOST") or DEFAULT_HOST


def connect(
    host: str | None, env: Mapping[str, str], tls: Any = None, ping: bool = True
) -> tuple[docker.DockerClient, str]:
    """A client for the engine (checked with a ping unless ``ping`` is false). StepError names the address."""
    import docker
    import docker.errors

    address = engine_address(host, env)
    try:
        client = docker.DockerClient(base_url=address, timeout=API_TIMEOUT, tls=tls, use_ssh_client=False)
        if ping:
            client.ping()
    except docker.errors.DockerException as exc:
        raise StepError(
            f"cannot reach the Docker Engine at {address}: {_short(exc)}",
            hint="start the engine (`systemctl start docker` or `dockerd`), or point `host:` / DOCKER_HOST "
            "at a running one",
        ) from None
    except Exception as exc:  # noqa: BLE001 - requests/urllib3 errors differ by transport
        raise StepError(f"cannot reach the Docker Engine at {address}: {_short(exc)}") from None
    return client, address


def _short(exc: BaseException) -> str:
    text = str(exc)
    for marker in ("Connection aborted.", "Max retries exceeded"):
        if marker in text:
            inner = text.split("(", 1)[-1] if "(" in text else text
            if "No such file or directory" in text:
                return "no socket there (No such file or directory)"
            if "Connection refused" in text:
                return "connection refused"
            if "Permission denied" in text:
                return "permission denied (is your user in the docker group?)"
            return inner[:200]
    return text[:300]


def api_error_text(exc: BaseException) -> str:
    """The engine's own explanation from an APIError, without the request URL noise."""
    explanation = getattr(exc, "explanation", None)
    if explanation:
        return str(explanation.decode() if isinstance(explanation, bytes) else explanation)
    return str(exc)

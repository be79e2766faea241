"""Connecting to a Docker Engine with the docker SDK: where to look (an ssh:// engine through runner's ssh
connection), and errors that say where we looked."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from steps.base import StepError


class EngineUnreachable(StepError):
    """No Docker Engine to talk to at the address (no socket, refused, its machine not answering): every call
    fails on it, so plan says the step would fail (DockerStep.preview) as apply will."""


if TYPE_CHECKING:
    import docker

DEFAULT_HOST = "unix:///var/run/docker.sock"
API_TIMEOUT = 60


def engine_address(host: str | None, env: Mapping[str, str]) -> str:
    """The engine a step talks to: its `host`, else DOCKER_HOST, else the local unix socket."""
    return host or env.get("DOCKER_HOST") or DEFAULT_HOST


def engine_hostname(address: str) -> str | None:
    """The machine behind a remote engine address (`ssh://user@h:22`, `tcp://h:2376`); None for a local one."""
    from urllib.parse import urlsplit

    if address.startswith(("ssh://", "tcp://", "http://", "https://")):
        return urlsplit(address).hostname
    return None


def sdk() -> Any:
    """The docker SDK (with docker.errors), imported once, through here only. The SDK imports paramiko whenever
    it is installed (about 0.1 s) for its own ssh transport, which runner does not use (ssh:// engines go through
    runner's ssh connection, see `reach`): the import keeps it out."""
    if "docker" not in sys.modules and "paramiko" not in sys.modules:
        sys.modules["paramiko"] = None  # type: ignore[assignment]
        try:
            import docker
        finally:
            del sys.modules["paramiko"]
    import docker
    import docker.errors

    return docker


# Where the engine listens on that machine, as its own `docker` would find it: DOCKER_HOST in the login
# environment, else the current context (~/.docker/config.json names one only when `docker context use` was run),
# else the default socket. Then whether this user may open that socket.
_FIND_ENGINE = r"""_h=${DOCKER_HOST:-}
if [ -z "$_h" ] && grep -qs '"currentContext"' "$HOME/.docker/config.json" && command -v docker >/dev/null 2>&1; then
  _h=$(docker context inspect --format '{{.Endpoints.docker.Host}}' 2>/dev/null)
fi
echo "H ${_h:-unix:///var/run/docker.sock}"
case ${_h:-unix:///var/run/docker.sock} in unix://*)
  _s=${_h:-unix:///var/run/docker.sock}; _s=${_s#unix://}
  if [ ! -S "$_s" ]; then echo "N"; elif [ ! -r "$_s" ] || [ ! -w "$_s" ]; then echo "P $(id -un)"; fi;;
esac
[ -z "${DOCKER_TLS_VERIFY:-}" ] || echo "T"
"""


def reach(address: str) -> str:
    """The address to open for an engine: itself, or for `ssh://[user@]host[:port]` a local unix socket that
    runner's ssh connection to that machine (the one every step there shares, ~/.ssh/config and all) carries to
    the engine's socket there. StepError names the machine and what to check."""
    if not address.startswith("ssh://"):
        return address
    known = _REACHED.get(address)
    if known is not None:  # asked once a run: plan's preview, the probe and apply share it
        return known
    from steps._support import ssh, ssh_forward

    host = ssh.display(address)
    try:
        _, out = ssh.quick(address, _FIND_ENGINE)
    except StepError as exc:  # "cannot reach HOST over ssh: unreachable (...)", said of the engine
        why = exc.message.removeprefix(f"cannot reach {host}")
        why = why if why != exc.message else f": {why}"
        raise EngineUnreachable(f"cannot reach the Docker Engine at {address}{why}", hint=exc.hint) from None
    said = {line[:1]: line[2:] for line in out.splitlines() if line[:1] in ("H", "N", "P", "T")}
    endpoint = said.get("H", "")
    where = f"the Docker Engine at {address}"
    if "N" in said:
        raise EngineUnreachable(
            f"cannot reach {where}: there is no socket {endpoint.removeprefix('unix://')} on {host}",
            hint="install and start Docker there (`systemctl start docker`), or set DOCKER_HOST for that user",
        )
    if "P" in said:
        raise EngineUnreachable(
            f"cannot reach {where}: {said['P']} may not use {endpoint.removeprefix('unix://')} on {host}",
            hint=f"add {said['P']} to the docker group there (`usermod -aG docker {said['P']}`), or log in as "
            "a user that is",
        )
    if endpoint.startswith("unix://"):
        remote = endpoint.removeprefix("unix://")
    elif endpoint.startswith("tcp://") and "T" not in said:
        remote = endpoint.removeprefix("tcp://").rstrip("/")
    else:
        raise EngineUnreachable(
            f"cannot reach {where}: its engine is {endpoint} there, which runner does not forward",
            hint="give the step `host: tcp://...` with `tls:` for a TLS engine",
        )
    return _REACHED.setdefault(address, "unix://" + ssh_forward.forward_socket(address, remote))


_REACHED: dict[str, str] = {}  # ssh:// engine -> its forwarded socket, for this process (failures are asked again)


def tls_config(tls: Any, env: Mapping[str, str]) -> Any:
    """A docker.tls.TLSConfig from a step's `tls` (ca_cert, client_cert, client_key, verify), or None."""
    if tls is None:
        return None
    import docker.tls

    client_cert = (tls.client_cert, tls.client_key) if tls.client_cert and tls.client_key else None
    try:
        return docker.tls.TLSConfig(client_cert=client_cert, ca_cert=tls.ca_cert, verify=tls.verify)
    except Exception as exc:  # noqa: BLE001 - the SDK raises its own TLSParameterError
        raise StepError(f"bad TLS settings for the Docker Engine: {exc}") from None


def connect(
    host: str | None, env: Mapping[str, str], tls: Any = None, ping: bool = True
) -> tuple[docker.DockerClient, str]:
    """A client for the engine (checked with a ping unless ``ping`` is false), and its address as the step names
    it. StepError names the address. An ssh:// engine is reached through runner's ssh connection (`reach`)."""
    address = engine_address(host, env)
    base_url = reach(address)
    docker = sdk()

    try:
        client = docker.DockerClient(base_url=base_url, timeout=API_TIMEOUT, tls=tls_config(tls, env))
        if ping:
            client.ping()
    except docker.errors.DockerException as exc:
        remote = engine_hostname(address)
        hint = (
            f"check that `docker info` works for that user on {remote}, and that its sshd allows forwarding "
            "(AllowStreamLocalForwarding)"
            if address.startswith("ssh://")
            else "start the engine (`systemctl start docker` or `dockerd`), or point `host:` / DOCKER_HOST "
            "at a running one"
        )
        raise EngineUnreachable(f"cannot reach the Docker Engine at {address}: {_short(exc)}", hint=hint) from None
    except Exception as exc:  # noqa: BLE001 - requests/urllib3 errors differ by transport
        raise EngineUnreachable(f"cannot reach the Docker Engine at {address}: {_short(exc)}") from None
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


ENGINE_GONE_HINT = (
    "check that the engine runs (`docker info`; `systemctl status docker` where systemd runs it) and start it "
    "again; nothing of this step is recorded as done, so the next apply checks the container afresh"
)


def engine_gone(address: str, detail: str) -> StepError:
    """The error for an engine that stopped answering while a step talked to it."""
    return StepError(f"the Docker Engine at {address} went away during the step ({detail})", hint=ENGINE_GONE_HINT)


def lost_connection(exc: BaseException) -> str | None:
    """Why the engine cannot be reached, when `exc` says the connection is lost (refused, reset, the socket gone,
    a read timed out), in a few words; None for any other error (the engine answered)."""
    import requests

    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        cause: BaseException | None = exc
        while cause is not None:  # the OSError at the bottom says it best
            if isinstance(cause, OSError) and cause.strerror:
                return cause.strerror.lower()
            nested = cause.args[0] if cause.args and isinstance(cause.args[0], BaseException) else None
            cause = cause.__cause__ or cause.__context__ or nested
        text = str(exc)
        for words in ("Connection refused", "Connection aborted", "Connection reset", "timed out"):
            if words.lower() in text.lower():
                return words.lower()
        return "the connection was lost"
    return None


def answers(client: Any, within: float = 3.0) -> bool:
    """Does the engine still answer a ping, within `within` seconds? (A stopping engine stops its containers
    first, then closes its API: a container killed at the step's start is asked about once more.)"""
    deadline = time.monotonic() + within
    while True:
        try:
            client.ping()
        except Exception:  # noqa: BLE001 - any failure means it does not answer
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.25)

"""What the docker kind reads and writes of a container, apart from talking to an engine: the labels that say
who made it and with what configuration, port mappings, the field-level changes between a recorded configuration
and the spec or the container's live one, and the readiness wait as an engine's host sees it."""

from __future__ import annotations

import json
import re
import shlex
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from steps._support.docker_engine import engine_hostname
from steps._support.readiness import Readiness
from steps.base import StepContext

if TYPE_CHECKING:
    from docker.models.containers import Container

LOG_TAIL = 20

CONFIG_VERSION = 1
HASH_LABEL = "runner.config-hash"
CONFIG_LABEL = "runner.config"
STEP_LABEL = "runner.step"
OWNER_LABEL = "runner.owner"  # host:/path/.runner of the pipeline that created it


def owner_of(ctx: StepContext) -> str:
    """The identity a container carries of the pipeline that made it: this machine and its state directory."""
    return f"{socket.gethostname()}:{ctx.state_dir.resolve()}"


def foreign_owner(ctx: StepContext, container: Container) -> str | None:
    """A description of the other pipeline that owns this container, or None when it is ours (or unmarked)."""
    owner = (container.labels or {}).get(OWNER_LABEL)
    if owner and owner != owner_of(ctx):
        return (
            f"container {container.name} belongs to another pipeline ({owner}, step "
            f"{(container.labels or {}).get(STEP_LABEL, '?')}): runner does not fight over it"
        )
    return None


OWNER_HINT = "give this step another docker `name:`, or take it down there first (`runner down` in that pipeline)"


def unowned_hint(step: str) -> str:
    return (
        f"runner replaces only containers it made: `runner mark-done {step}` adopts this one as it is (if it "
        f"matches the spec), `runner apply --force {step}` replaces it (its writable layer is lost), or remove it "
        "yourself (`docker rm -f`)"
    )


PORT_RE = re.compile(
    r"^(?:(?P<ip>\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-fA-F:]+\]):)?"
    r"(?:(?P<host>\d+):)?(?P<cport>\d+)(?:/(?P<proto>tcp|udp|sctp))?$"
)
RESTART_RE = re.compile(r"^(no|always|unless-stopped|on-failure(:\d+)?)$")


def parse_port(text: str) -> tuple[str, str | None, int | None]:
    """'[ip:][host:]container[/proto]' -> ('8000/tcp', ip or None, host port or None)."""
    m = PORT_RE.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a port mapping: expected [ip:]host:container[/tcp|udp], like 8000:8000")
    cport = int(m["cport"])
    host = int(m["host"]) if m["host"] else None
    for port in (cport, host):
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"{text!r}: port {port} is outside 1-65535")
    ip = m["ip"].strip("[]") if m["ip"] else None
    return f"{cport}/{m['proto'] or 'tcp'}", ip, host


def check_volume(item: str) -> None:
    """'source:/container/path[:ro|rw]', or ValueError."""
    parts = item.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValueError(f"{item!r} is not a mount: expected source:/container/path[:ro|rw]")
    if not parts[1].startswith("/"):
        raise ValueError(f"{item!r}: the container path must be absolute")


def changes_between(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            for sub in sorted(set(a) | set(b)):
                if a.get(sub) != b.get(sub):
                    changes.append(f"{key}.{sub}: {show(a.get(sub))} -> {show(b.get(sub))}")
        else:
            changes.append(f"{key}: {show(a)} -> {show(b)}")
    return changes


def show(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "[]"
    return str(value)


def live_changes(
    ctx: StepContext, spec: Any, container: Container, volumes: list[str], image_id: Callable[[], str | None]
) -> list[str]:
    """How the running container differs from the spec, read from its live configuration (what `docker
    inspect` shows), for the fields that make it what it is. Env values are never shown, and what is shown is
    masked."""
    config = container.attrs.get("Config") or {}
    host = container.attrs.get("HostConfig") or {}
    changes: list[str] = []
    if config.get("Image") != spec.image:
        found = image_id()
        if found is None or found != container.attrs.get("Image"):
            changes.append(f"image: {config.get('Image')} -> {spec.image}")
    for field, live in (("command", config.get("Cmd")), ("entrypoint", config.get("Entrypoint"))):
        want = getattr(spec, field)
        if want is not None:
            argv = shlex.split(want) if isinstance(want, str) else list(want)
            if list(live or []) != argv:
                changes.append(f"{field}: {json.dumps(live)} -> {json.dumps(argv)}")
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    for key, value in sorted(spec.env.items()):
        if key not in env:
            changes.append(f"env.{key}: not set in the container")
        elif env[key] != value:
            changes.append(f"env.{key}: differs")
    want_ports = set()
    for item in spec.ports:
        key, ip, port = parse_port(item)
        want_ports.add((key, ip or "", str(port or "")))
    live_ports = {
        (key, b.get("HostIp") or "", b.get("HostPort") or "")
        for key, bindings in (host.get("PortBindings") or {}).items()
        for b in bindings or []
    }
    live_ports = {(k, "" if ip in ("0.0.0.0", "::") else ip, p) for k, ip, p in live_ports}
    if want_ports != live_ports:
        changes.append(f"ports: {ports_text(live_ports)} -> {ports_text(want_ports)}")

    def mount(text: str) -> tuple[str, str, str]:
        parts = text.split(":")
        return parts[0], parts[1] if len(parts) > 1 else "", parts[2] if len(parts) > 2 else "rw"

    want_mounts = {mount(v) for v in volumes}
    live_mounts = {mount(b) for b in host.get("Binds") or []}
    if want_mounts != live_mounts:
        changes.append(f"volumes: {sorted(live_mounts)} -> {sorted(want_mounts)}")
    if bool(host.get("Privileged")) != spec.privileged:
        changes.append(f"privileged: {bool(host.get('Privileged'))} -> {spec.privileged}")
    policy = host.get("RestartPolicy") or {}
    live_restart = policy.get("Name") or "no"
    if live_restart == "on-failure" and policy.get("MaximumRetryCount"):
        live_restart += f":{policy['MaximumRetryCount']}"
    if live_restart != spec.restart:
        changes.append(f"restart: {live_restart} -> {spec.restart}")
    mode = host.get("NetworkMode") or "default"
    if (spec.network or "default") != mode and {spec.network or "default", mode} != {"default", "bridge"}:
        changes.append(f"network: {mode} -> {spec.network or 'default'}")
    labels = config.get("Labels") or {}
    for key, value in sorted(spec.labels.items()):
        if labels.get(key) != value:
            changes.append(f"labels.{key}: {labels.get(key)!r} -> {value!r}")
    return [ctx.mask(change) for change in changes]


def ports_text(ports: set[tuple[str, str, str]]) -> str:
    return "[" + ", ".join(f"{ip + ':' if ip else ''}{host or '?'}:{key}" for key, ip, host in sorted(ports)) + "]"


def logs_tail(container: Container) -> str:
    try:
        raw = container.logs(tail=LOG_TAIL)
    except Exception:  # noqa: BLE001 - the logs are extra information only
        return ""
    return raw.decode("utf-8", errors="replace").rstrip() if isinstance(raw, bytes) else str(raw)


def published(container: Container) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, bindings in (container.attrs.get("NetworkSettings", {}).get("Ports") or {}).items():
        for b in bindings or []:
            text = f"{b.get('HostIp') or '0.0.0.0'}:{b.get('HostPort')}"
            if text not in out.setdefault(key, []):
                out[key].append(text)
    return {key: sorted(values) for key, values in sorted(out.items())}


def remote_readiness(wait: Readiness, address: str) -> Readiness:
    """With a tcp:// engine, a wait on 127.0.0.1 or localhost means the engine's host, where the ports are. With
    an ssh:// engine it stays as written: the wait is made from that machine (ssh -W), where 127.0.0.1 is its own,
    so the service need not be reachable from here (a firewall, a name only ~/.ssh/config knows)."""
    remote = engine_hostname(address)
    if not remote or address.startswith("ssh://"):
        return wait
    from urllib.parse import urlsplit, urlunsplit

    local = ("127.0.0.1", "localhost", "::1")
    if wait.http:
        parts = urlsplit(wait.http)
        if parts.hostname in local:
            netloc = remote + (f":{parts.port}" if parts.port else "")
            return wait.model_copy(update={"http": urlunsplit(parts._replace(netloc=netloc))})
    if wait.tcp:
        host, _, port = wait.tcp.rpartition(":")
        if host.strip("[]") in local:
            return wait.model_copy(update={"tcp": f"{remote}:{port}"})
    return wait

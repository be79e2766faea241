"""docker: one container, converged the way the tutorial runs AgentENV.

Example::

    - name: aenv
      docker:
        name: aenv
        image: ghcr.io/kvcache-ai/aenv-server:latest
        pull: missing            # missing | always | never
        privileged: true
        volumes: ["/dev:/dev"]
        ports: ["8000:8000", "80:8000"]   # two host ports onto one container port
        env: {AENV_SANDBOX_PROXY_DOMAINS: "{{ facts.host_ip_dashed }}.sslip.io"}
        wait: {http: "http://127.0.0.1:8000/health", timeout: 900}

The container carries a label with the hash of the fields that need a recreate (canonical and versioned, like
docker compose's config-hash) and one with those fields themselves (secrets masked), so a probe can say which
field drifted. Probe: the container exists, runs, carries the hash of this spec, and runs the image the name
resolves to now (locally: a converged apply never pulls). A local engine (`unix://`) is read for the probe with
two plain API requests over its socket, without the docker SDK; other engines, and anything unexpected, go
through the SDK. Apply: pull when needed, stop and remove a drifted container, create, start, wait until ready.
A stopped container is recreated; one that matches is left alone.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import socket
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from runner.util import faults
from steps._support.docker_engine import (
    answers,
    api_error_text,
    connect,
    engine_address,
    engine_gone,
    engine_hostname,
    lost_connection,
    reach,
    sdk,
)
from steps._support.docker_light import Engine as LightEngine
from steps._support.docker_light import Unreadable, socket_path
from steps._support.readiness import Readiness, wait_ready
from steps.base import Probe, SpecModel, StepContext, StepError, StepKind, env_mapping

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container

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


START_GRACE = 0.5  # seconds a container must stay up after start when there is no readiness wait
LOG_TAIL = 20

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


class DockerTls(SpecModel):
    ca_cert: str | None = Field(None, description="CA certificate that signed the engine's certificate.")
    client_cert: str | None = Field(None, description="Client certificate (with client_key).")
    client_key: str | None = Field(None, description="Client key (with client_cert).")
    verify: bool = Field(True, description="Verify the engine's certificate against ca_cert.")


class DockerSpec(SpecModel):
    name: str = Field(
        pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$", description="The container's name: one container of this name."
    )
    image: str = Field(min_length=1, description="The image, e.g. ghcr.io/kvcache-ai/aenv-server:latest.")
    pull: Literal["missing", "always", "never"] = Field(
        "missing", description="Pull when the image is not present (missing), on every run of the step, or never."
    )
    command: str | list[str] | None = Field(None, description="Command (a string is split like a shell would).")
    entrypoint: str | list[str] | None = Field(None, description="Override the image's entrypoint.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables of the container.")
    ports: list[str] = Field(
        default_factory=list, description="Published ports, `[ip:]host:container[/proto]`; several hosts may share one."
    )
    volumes: list[str] = Field(
        default_factory=list, description="Mounts, `host-path-or-volume:container-path[:ro]`; ./x is the pipeline's."
    )
    privileged: bool = Field(False, description="Run privileged (AgentENV needs it for /dev/kvm and ublk).")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on the container.")
    restart: str = Field("no", description="Restart policy: no, always, unless-stopped, on-failure[:N].")
    network: str | None = Field(None, description="Network mode: bridge (default), host, none, or a network name.")
    host: str | None = Field(
        None,
        description="Docker Engine address (unix://, tcp://, ssh://user@host:port); a bare ssh destination, as the "
        "other kinds' `host:` takes it (a ~/.ssh/config alias, user@host), means that machine's engine over ssh: "
        "its socket is reached through runner's ssh connection to that machine, shared with the other steps there. "
        "Default: DOCKER_HOST, else the socket.",
    )
    tls: DockerTls | None = Field(None, description="TLS for a `tcp://` engine: ca_cert, client_cert, client_key.")
    wait: Readiness | None = Field(
        None,
        description="Readiness check after start: `http` URL or `tcp` host:port. With a remote engine, "
        "127.0.0.1 and localhost in it mean that engine's host (over ssh the check is made from that machine).",
    )
    stop_timeout: float = Field(10, ge=0, description="Seconds to wait for a graceful stop before a recreate kills it.")

    @field_validator("env", "labels", mode="before")
    @classmethod
    def _strings(cls, value: Any) -> Any:
        return env_mapping(value)

    @field_validator("host")
    @classmethod
    def _engine(cls, value: str | None) -> str | None:
        """`host: gpu-7` (or ops@gpu-7), as run/git/pip spell a machine, is that machine's engine over ssh."""
        if value is None or "://" in value or "{{" in value:
            return value
        from steps._support.ssh import check_target

        return "ssh://" + (check_target(value) or value)

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: list[str]) -> list[str]:
        for item in value:
            parse_port(item)
        return value

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, value: list[str]) -> list[str]:
        for item in value:
            parts = item.split(":")
            if len(parts) not in (2, 3) or not all(parts[:2]) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
                raise ValueError(f"{item!r} is not a mount: expected source:/container/path[:ro|rw]")
            if not parts[1].startswith("/"):
                raise ValueError(f"{item!r}: the container path must be absolute")
        return value

    @field_validator("restart")
    @classmethod
    def _restart(cls, value: str) -> str:
        if not RESTART_RE.match(value):
            raise ValueError(f"{value!r} is not a restart policy: no, always, unless-stopped or on-failure[:N]")
        return value


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            for sub in sorted(set(a) | set(b)):
                if a.get(sub) != b.get(sub):
                    changes.append(f"{key}.{sub}: {_show(a.get(sub))} -> {_show(b.get(sub))}")
        else:
            changes.append(f"{key}: {_show(a)} -> {_show(b)}")
    return changes


def _show(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "[]"
    return str(value)


class DockerStep(StepKind[DockerSpec]):
    kind = "docker"
    Spec = DockerSpec
    outputs = frozenset({"container_id", "name", "image_id", "ports", "host", "hostname", "adopted"})
    cosmetic_fields = frozenset({"stop_timeout"})
    on_machine = True  # the step's `host:` is read as `docker.host`: that machine's engine, over ssh

    def remote_host(self, ctx: StepContext) -> str | None:
        """An ssh:// engine's machine: plan says it cannot be reached, as for every step there."""
        return self.spec.host if (self.spec.host or "").startswith("ssh://") else None

    # ---- the config that needs a recreate ----------------------------------------------------------------

    def config(self, ctx: StepContext) -> dict[str, Any]:
        spec = self.spec
        return {
            "image": spec.image,
            "command": spec.command,
            "entrypoint": spec.entrypoint,
            "env": dict(sorted(spec.env.items())),
            "ports": list(spec.ports),
            "volumes": [self._volume(ctx, v) for v in spec.volumes],
            "privileged": spec.privileged,
            "labels": dict(sorted(spec.labels.items())),
            "restart": spec.restart,
            "network": spec.network,
        }

    def config_hash(self, ctx: StepContext) -> str:
        from runner.util.hashing import digest

        return f"v{CONFIG_VERSION}:" + digest({"v": CONFIG_VERSION, **self.config(ctx)})

    def _volume(self, ctx: StepContext, item: str) -> str:
        source, _, rest = item.partition(":")
        if source.startswith(("./", "../", "~")) or source in (".", ".."):
            source = str(ctx.resolve(source).resolve())
        return f"{source}:{rest}"

    # ---- probe ----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _existing(self, ctx: StepContext) -> Iterator[tuple[Any, Container | None, str]]:
        """The engine (no ping: the first call says if it is not there), the step's container or None, and the
        engine's address; API errors become a StepError that names the engine."""
        docker = sdk()

        spec = self.spec
        client, address = connect(spec.host, ctx.env, spec.tls, ping=False)
        try:
            try:
                container: Container | None = client.containers.get(spec.name)
            except docker.errors.NotFound:
                container = None
            yield client, container, address
        except docker.errors.APIError as exc:
            raise StepError(f"Docker Engine at {address}: {api_error_text(exc)}") from None
        finally:
            client.close()

    def preview(self, ctx: StepContext) -> str | None:
        """For plan: a container of this name that another pipeline owns (apply refuses to replace it)."""
        light = self._light(ctx)
        try:
            if light is not None:
                address, _, container = light
            else:
                with self._existing(ctx) as (_, container, address):
                    pass
        except StepError:
            return None  # the engine's own error is the probe's to tell
        theirs = foreign_owner(ctx, container) if container is not None else None
        mine = self._unowned(ctx, container, address) if container is not None and not ctx.forced else None
        if theirs:
            return f"{theirs}; {OWNER_HINT}"
        return f"{mine}; {unowned_hint(ctx.name)}" if mine else None

    def _light(self, ctx: StepContext) -> tuple[str, LightEngine, Any] | None:
        """(address, the engine, the container or None), read from a local engine with the standard library so
        that a converged run does not import the SDK; None when the engine is not local or could not be read that
        way (the SDK then asks again, and its errors name the engine)."""
        address = engine_address(self.spec.host, ctx.env)
        path = socket_path(reach(address)) if self.spec.tls is None else None
        if path is None:
            return None
        engine = LightEngine(path)
        try:
            return address, engine, engine.container(self.spec.name)
        except Unreadable:
            return None

    def probe(self, ctx: StepContext) -> Probe:
        light = self._light(ctx)
        if light is not None:
            address, engine, container = light
            try:
                return self._judge(ctx, engine, container, address)
            except Unreadable:
                pass
        with self._existing(ctx) as (client, container, address):
            return self._judge(ctx, client, container, address)

    def _judge(self, ctx: StepContext, client: Any, container: Any, address: str) -> Probe:
        """The probe's verdict on what the engine holds under the step's name (through the SDK or the light
        reader: both give the inspect document as `attrs`)."""
        if container is None:
            return Probe.missing(f"no container named {self.spec.name} on {address}")
        theirs = foreign_owner(ctx, container) or self._unowned(ctx, container, address)
        if theirs:
            return Probe.missing(theirs)
        drift = self._drift(ctx, client, container)
        if drift:
            return Probe.drift(drift[0], tuple(drift[1]))
        return Probe.ok()

    @staticmethod
    def _image_id(client: Any, name: str) -> str | None:
        """The id `name` resolves to on the engine, or None when it has no such image."""
        if isinstance(client, LightEngine):
            return client.image_id(name)
        docker = sdk()
        try:
            return str(client.images.get(name).id)
        except docker.errors.ImageNotFound:
            return None

    def _drift(self, ctx: StepContext, client: Any, container: Container) -> tuple[str, list[str]] | None:
        """Why the container does not match the spec (reason, field changes), or None when it does."""
        labels = container.labels or {}
        if self._adopted(ctx, container):
            live = self._live_changes(ctx, client, container)
            if live:
                return "the adopted container differs from the spec: " + "; ".join(live), live
        elif labels.get(HASH_LABEL) != self.config_hash(ctx):
            if HASH_LABEL not in labels:
                return f"container {container.name} was not created by runner (no {HASH_LABEL} label)", []
            try:
                old = json.loads(labels.get(CONFIG_LABEL, "{}"))
            except ValueError:
                old = {}
            new = self._masked_config(ctx)
            changes = _changes(old, new) if isinstance(old, dict) else []
            shown = "; ".join(changes) if changes else "its config hash differs"
            return "container config drifted: " + shown, changes
        else:
            live = self._live_changes(ctx, client, container)  # labels copied by hand onto another container
            if live:
                return "the container's live configuration differs from its labels: " + "; ".join(live), live
        state = container.attrs.get("State", {})
        if container.status != "running":
            detail = f" (exit code {state.get('ExitCode')})" if container.status == "exited" else ""
            return f"container {container.name} is {container.status}{detail}, not running", []
        image_id = self._image_id(client, self.spec.image)
        if image_id is None:
            return None  # the tag was removed locally; the container still runs what it was made from
        if image_id != container.attrs.get("Image"):
            return (
                f"image: {self.spec.image} now resolves to {image_id[:19]}, the container runs "
                f"{str(container.attrs.get('Image'))[:19]}",
                [f"image: {str(container.attrs.get('Image'))[7:19]} -> {image_id[7:19]}"],
            )
        return None

    # ---- ownership ------------------------------------------------------------------------------------

    def _adopted(self, ctx: StepContext, container: Container) -> bool:
        """A container runner did not make, taken as this step's by `runner mark-done` (by its id)."""
        kept = ctx.record_outputs
        return bool(kept.get("adopted")) and kept.get("container_id") == container.id

    def _unowned(self, ctx: StepContext, container: Container, address: str) -> str | None:
        """What is there, when the container of this name is not runner's (no hash label, not adopted)."""
        if HASH_LABEL in (container.labels or {}) or self._adopted(ctx, container):
            return None
        image = (container.attrs.get("Config") or {}).get("Image", "?")
        created = str(container.attrs.get("Created", "?"))[:19].replace("T", " ")
        return (
            f"a container named {container.name} that runner did not create is on {address} "
            f"(image {image}, {container.status}, created {created}): runner does not replace it"
        )

    def adopt(self, ctx: StepContext) -> dict[str, Any] | None:
        with self._existing(ctx) as (client, container, address):
            if container is None:
                raise StepError(f"no container named {self.spec.name} on {address} to take as it is")
            theirs = foreign_owner(ctx, container)
            if theirs:
                raise StepError(theirs)
            if HASH_LABEL in (container.labels or {}):
                return None  # runner's own: the probe decides, as for any step
            live = self._live_changes(ctx, client, container)
            if live:
                raise StepError(
                    f"the container {container.name} does not match the spec: {'; '.join(live)}",
                    hint=f"make the spec say what runs, or `runner apply --force {ctx.name}` replaces it",
                )
            if container.status != "running":
                raise StepError(f"the container {container.name} is {container.status}, not running")
            return {
                "adopted": True,
                "container_id": container.id,
                "name": container.name,
                "image_id": container.attrs.get("Image"),
                "ports": _published(container),
                "host": address,
                "hostname": engine_hostname(address) or "localhost",
            }

    def _live_changes(self, ctx: StepContext, client: Any, container: Container) -> list[str]:
        """How the running container differs from the spec, read from its live configuration (what `docker
        inspect` shows), for the fields that make it what it is. Env values are never shown, and what is shown is
        masked."""
        spec = self.spec
        config = container.attrs.get("Config") or {}
        host = container.attrs.get("HostConfig") or {}
        changes: list[str] = []
        if config.get("Image") != spec.image:
            found = self._image_id(client, spec.image)
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
            changes.append(f"ports: {_ports_text(live_ports)} -> {_ports_text(want_ports)}")

        def mount(text: str) -> tuple[str, str, str]:
            parts = text.split(":")
            return parts[0], parts[1] if len(parts) > 1 else "", parts[2] if len(parts) > 2 else "rw"

        want_mounts = {mount(self._volume(ctx, v)) for v in spec.volumes}
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

    def _masked_config(self, ctx: StepContext) -> dict[str, Any]:
        masked: dict[str, Any] = json.loads(ctx.mask(json.dumps(self.config(ctx))))
        return masked

    # ---- apply ----------------------------------------------------------------------------------------

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        docker = sdk()

        spec = self.spec
        client, address = connect(spec.host, ctx.env, spec.tls)
        try:
            try:
                existing: Container | None = client.containers.get(spec.name)
            except docker.errors.NotFound:
                existing = None
            if existing is not None:
                theirs = foreign_owner(ctx, existing)
                if theirs:
                    raise StepError(theirs, hint=OWNER_HINT)
                mine = self._unowned(ctx, existing, address)
                if mine and not ctx.forced:
                    raise StepError(mine, hint=unowned_hint(ctx.name))
                if mine:
                    ctx.on_output(f"replacing the container {spec.name} that runner did not create (--force)")
            image = self._ensure_image(ctx, client, address)
            if existing is not None:
                drift = self._drift(ctx, client, existing)
                if drift is None:
                    ctx.on_output(f"container {spec.name} matches the spec and runs: not recreated")
                    container = existing
                else:
                    ctx.on_output(f"recreating {spec.name}: {drift[0]}")
                    self._remove(existing, spec.stop_timeout)
                    faults.point("docker-removed")
                    container = self._create_and_start(ctx, client, address, image.id)
            else:
                container = self._create_and_start(ctx, client, address, image.id)
            self._await_ready(ctx, container, address)
            container.reload()
            adopted = {"adopted": True} if self._adopted(ctx, container) else {}
            return {
                **adopted,
                "container_id": container.id,
                "name": spec.name,
                "image_id": container.attrs.get("Image", image.id),
                "ports": _published(container),
                "host": address,
                "hostname": engine_hostname(address) or "localhost",  # where the published ports are
            }
        except docker.errors.APIError as exc:
            raise StepError(f"Docker Engine at {address}: {api_error_text(exc)}") from None
        except Exception as exc:
            lost = lost_connection(exc)
            if lost is None:
                raise
            raise engine_gone(address, lost) from None
        finally:
            client.close()

    def _ensure_image(self, ctx: StepContext, client: docker.DockerClient, address: str) -> Any:
        docker = sdk()

        spec = self.spec
        local = None
        try:
            local = client.images.get(spec.image)
        except docker.errors.ImageNotFound:
            pass
        if local is not None and spec.pull != "always":
            return local
        if spec.pull == "never":
            raise StepError(
                f"image {spec.image} is not on the engine at {address}, and `pull: never`",
                hint="load it there (docker load / docker pull), or set `pull: missing`",
            )
        try:
            self._pull(ctx, client)
            return client.images.get(spec.image)
        except (docker.errors.APIError, docker.errors.ImageNotFound) as exc:
            if local is not None:
                ctx.notice(f"{ctx.name}: pulling {spec.image} failed ({api_error_text(exc)}); using the local image")
                return local
            raise StepError(
                f"image {spec.image} is not on the engine at {address} and pulling it failed: {api_error_text(exc)}",
                hint="check the image name and tag, the registry login (docker login), and the engine's network",
            ) from None

    def _pull(self, ctx: StepContext, client: docker.DockerClient) -> None:
        from docker.utils import parse_repository_tag

        repo, tag = parse_repository_tag(self.spec.image)
        ctx.on_output(f"pulling {self.spec.image}")
        layers: dict[str, tuple[int, int]] = {}  # layer id -> (bytes downloaded, layer size)
        for event in client.api.pull(repo, tag=tag or "latest", stream=True, decode=True):
            detail = event.get("progressDetail") or {}
            if event.get("status") == "Downloading" and isinstance(detail.get("total"), int) and event.get("id"):
                layers[event["id"]] = (int(detail.get("current") or 0), int(detail["total"]))
                ctx.progress(sum(d for d, _ in layers.values()), sum(t for _, t in layers.values()), "bytes")
            elif event.get("status") in ("Download complete", "Pull complete") and event.get("id") in layers:
                total = layers[event["id"]][1]
                layers[event["id"]] = (total, total)
            if "error" in event:
                docker = sdk()

                raise docker.errors.APIError(str(event["error"]), explanation=str(event["error"]))
            status = event.get("status")
            if status and "progress" not in event:
                ctx.on_output(f"{event.get('id', '')} {status}".strip())
            if ctx.cancel.is_set():
                raise StepError("interrupted while pulling " + self.spec.image)

    def teardown(self, ctx: StepContext, purge: bool, dry_run: bool) -> str | None:
        name = self.spec.name
        with self._existing(ctx) as (_, container, address):
            if container is None:
                return None
            if HASH_LABEL not in (container.labels or {}):
                return f"left container {name} on {address}: runner did not create it (no {HASH_LABEL} label)"
            theirs = foreign_owner(ctx, container)
            if theirs:
                return f"left: {theirs}"
            if dry_run:
                return f"would remove container {name} ({container.short_id}) on {address}"
            self._remove(container, self.spec.stop_timeout)
            return f"removed container {name} ({container.short_id}) on {address}"

    def _remove(self, container: Container, stop_timeout: float) -> None:
        docker = sdk()

        try:
            if container.status == "running":
                container.stop(timeout=int(stop_timeout))
            container.remove(force=True)
        except docker.errors.NotFound:
            pass

    def _create_and_start(
        self, ctx: StepContext, client: docker.DockerClient, address: str, image_id: str
    ) -> Container:
        docker = sdk()

        spec = self.spec
        ports: dict[str, list[Any]] = {}
        for item in spec.ports:
            key, ip, host = parse_port(item)
            ports.setdefault(key, []).append((ip, host) if ip else host)
        labels = {
            **spec.labels,
            HASH_LABEL: self.config_hash(ctx),
            CONFIG_LABEL: json.dumps(self._masked_config(ctx), sort_keys=True),
            STEP_LABEL: ctx.name,
            OWNER_LABEL: owner_of(ctx),
        }
        restart: dict[str, Any] | None = None
        if spec.restart != "no":
            policy, _, count = spec.restart.partition(":")
            restart = {"Name": policy, **({"MaximumRetryCount": int(count)} if count else {})}
        try:
            container = client.containers.create(
                spec.image,
                command=spec.command,
                entrypoint=spec.entrypoint,
                name=spec.name,
                environment=spec.env,
                ports=ports,
                volumes=[self._volume(ctx, v) for v in spec.volumes],
                privileged=spec.privileged,
                labels=labels,
                restart_policy=restart,
                network_mode=spec.network,
                detach=True,
            )
        except docker.errors.APIError as exc:
            text = api_error_text(exc)
            if "Conflict" in str(exc) or "already in use" in text:
                raise StepError(
                    f"a container named {spec.name} appeared on {address} while this step ran: {text}",
                    hint="another tool or apply created it; run apply again to converge it",
                ) from None
            raise StepError(f"creating container {spec.name} on {address} failed: {text}") from None
        ctx.on_output(f"created {spec.name} ({container.id[:12]})")
        try:
            container.start()
        except docker.errors.APIError as exc:
            text = api_error_text(exc)
            kept = f"the container is left created for `docker inspect {spec.name}`; the next apply recreates it"
            if "port is already allocated" in text or "address already in use" in text:
                port = re.search(r"(?:0\.0\.0\.0|\[::\]|[\d.]+):(\d+)", text)
                which = f"host port {port.group(1)}" if port else "a host port"
                raise StepError(
                    f"{which} is already in use on {address}: {text}",
                    hint=f"free it or change `ports:`; {kept}",
                ) from None
            raise StepError(f"container {spec.name} failed to start on {address}: {text}", hint=kept) from None
        return container

    def _await_ready(self, ctx: StepContext, container: Container, address: str) -> None:
        spec = self.spec

        def exited() -> str | None:
            container.reload()
            if container.status in ("running", "created", "restarting"):
                return None
            code = container.attrs.get("State", {}).get("ExitCode")
            if code in (137, 143) and not answers(container.client):  # killed: by its engine going down?
                raise engine_gone(address, f"it stopped the container, exit code {code}, then stopped answering")
            raise StepError(
                f"container {spec.name} exited at start (exit code {code}) on {address}",
                hint=f"`docker logs {spec.name}` has its full output; fix its command, env or image",
                output_tail=ctx.mask(_logs_tail(container)),
            )

        if spec.wait is None:
            deadline = time.monotonic() + START_GRACE
            while time.monotonic() < deadline:
                exited()
                if ctx.cancel.wait(0.1):
                    raise StepError("interrupted")
            exited()
            return
        readiness = remote_readiness(spec.wait, address)
        via = address if address.startswith("ssh://") else None  # from the engine's machine, as `wait` with host:
        seen_from = f" from {via.removeprefix('ssh://')}" if via else ""
        ctx.on_output(f"waiting for {readiness.target}{seen_from} (up to {readiness.timeout:g}s)")
        try:
            wait_ready(readiness, ctx.cancel, alive=exited, on_attempt=ctx.on_output, via=via)
        except StepError as exc:
            if not exc.output_tail:
                exc.output_tail = ctx.mask(_logs_tail(container))
            raise


def _ports_text(ports: set[tuple[str, str, str]]) -> str:
    return "[" + ", ".join(f"{ip + ':' if ip else ''}{host or '?'}:{key}" for key, ip, host in sorted(ports)) + "]"


def _logs_tail(container: Container) -> str:
    try:
        raw = container.logs(tail=LOG_TAIL)
    except Exception:  # noqa: BLE001 - the logs are extra information only
        return ""
    return raw.decode("utf-8", errors="replace").rstrip() if isinstance(raw, bytes) else str(raw)


def _published(container: Container) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, bindings in (container.attrs.get("NetworkSettings", {}).get("Ports") or {}).items():
        for b in bindings or []:
            text = f"{b.get('HostIp') or '0.0.0.0'}:{b.get('HostPort')}"
            if text not in out.setdefault(key, []):
                out[key].append(text)
    return {key: sorted(values) for key, values in sorted(out.items())}


__all__ = ["DockerSpec", "DockerStep", "engine_address", "parse_port"]


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

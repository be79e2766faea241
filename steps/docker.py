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
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from runner.util import faults
from runner.util.text import is_template
from steps._support.docker_config import (
    CONFIG_LABEL,
    CONFIG_VERSION,
    HASH_LABEL,
    OWNER_HINT,
    OWNER_LABEL,
    RESTART_RE,
    STEP_LABEL,
    changes_between,
    check_volume,
    foreign_owner,
    live_changes,
    logs_tail,
    owner_of,
    parse_port,
    published,
    remote_readiness,
    unowned_hint,
)
from steps._support.docker_engine import (
    EngineUnreachable,
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
from steps._support.docker_image import create_and_start, ensure_image
from steps._support.docker_light import Engine as LightEngine
from steps._support.docker_light import Unreadable, socket_path
from steps._support.readiness import Readiness, wait_ready
from steps.base import Probe, SpecModel, StepContext, StepError, StepKind, env_mapping

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container

START_GRACE = 0.5  # seconds a container must stay up after start when there is no readiness wait


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

    @field_validator("ports", "volumes")
    @classmethod
    def _mappings(cls, value: list[str], info: ValidationInfo) -> list[str]:
        check = parse_port if info.field_name == "ports" else check_volume
        for item in value:
            if not is_template(item):  # a templated one is checked once rendered
                check(item)
        return value

    @field_validator("restart")
    @classmethod
    def _restart(cls, value: str) -> str:
        if not RESTART_RE.match(value):
            raise ValueError(f"{value!r} is not a restart policy: no, always, unless-stopped or on-failure[:N]")
        return value


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
        except EngineUnreachable as exc:  # apply fails on it, so plan says so (as for a machine that does not answer)
            return exc.message
        except StepError:
            return None  # any other error of the engine is the probe's to tell
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
        try:
            return str(client.images.get(name).id)
        except sdk().errors.ImageNotFound:
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
            changes = changes_between(old, new) if isinstance(old, dict) else []
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
            return {"adopted": True, **_outputs(container, address, container.attrs.get("Image"))}

    def _live_changes(self, ctx: StepContext, client: Any, container: Container) -> list[str]:
        """How the running container differs from the spec, read from its live configuration (docker_config)."""
        volumes = [self._volume(ctx, v) for v in self.spec.volumes]
        return live_changes(ctx, self.spec, container, volumes, lambda: self._image_id(client, self.spec.image))

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
            image = ensure_image(ctx, client, address, self.spec)
            if existing is not None:
                drift = self._drift(ctx, client, existing)
                if drift is None:
                    ctx.on_output(f"container {spec.name} matches the spec and runs: not recreated")
                    container = existing
                else:
                    ctx.on_output(f"recreating {spec.name}: {drift[0]}")
                    self._remove(existing, spec.stop_timeout)
                    faults.point("docker-removed")
                    container = self._create(ctx, client, address)
            else:
                container = self._create(ctx, client, address)
            self._await_ready(ctx, container, address)
            container.reload()
            adopted = {"adopted": True} if self._adopted(ctx, container) else {}
            return {**adopted, **_outputs(container, address, container.attrs.get("Image", image.id))}
        except docker.errors.APIError as exc:
            raise StepError(f"Docker Engine at {address}: {api_error_text(exc)}") from None
        except Exception as exc:
            lost = lost_connection(exc)
            if lost is None:
                raise
            raise engine_gone(address, lost) from None
        finally:
            client.close()

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

    def _create(self, ctx: StepContext, client: docker.DockerClient, address: str) -> Container:
        labels = {
            HASH_LABEL: self.config_hash(ctx),
            CONFIG_LABEL: json.dumps(self._masked_config(ctx), sort_keys=True),
            STEP_LABEL: ctx.name,
            OWNER_LABEL: owner_of(ctx),
        }
        volumes = [self._volume(ctx, v) for v in self.spec.volumes]
        return create_and_start(ctx, client, address, self.spec, labels, volumes)

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
                output_tail=ctx.mask(logs_tail(container)),
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
                exc.output_tail = ctx.mask(logs_tail(container))
            raise


def _outputs(container: Container, address: str, image_id: Any) -> dict[str, Any]:
    return {
        "container_id": container.id,
        "name": container.name,
        "image_id": image_id,
        "ports": published(container),
        "host": address,
        "hostname": engine_hostname(address) or "localhost",  # where the published ports are
    }


__all__ = ["DockerSpec", "DockerStep", "engine_address", "parse_port", "remote_readiness"]

"""What the docker kind does on an engine through the docker SDK: the image there (pulled with progress when it
must be), and a container created and started as the spec says, errors in the engine's words."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from steps._support.docker_config import parse_port
from steps._support.docker_engine import api_error_text, sdk
from steps.base import StepContext, StepError

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container


def ensure_image(ctx: StepContext, client: docker.DockerClient, address: str, spec: Any) -> Any:
    """The spec's image on the engine: there already, or pulled (`pull: missing | always | never`)."""
    docker = sdk()

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
        pull(ctx, client, spec.image)
        return client.images.get(spec.image)
    except (docker.errors.APIError, docker.errors.ImageNotFound) as exc:
        if local is not None:
            ctx.notice(f"{ctx.name}: pulling {spec.image} failed ({api_error_text(exc)}); using the local image")
            return local
        raise StepError(
            f"image {spec.image} is not on the engine at {address} and pulling it failed: {api_error_text(exc)}",
            hint="check the image name and tag, the registry login (docker login), and the engine's network",
        ) from None


def pull(ctx: StepContext, client: docker.DockerClient, image: str) -> None:
    """Pull `image`, its layers' bytes as the step's progress."""
    from docker.utils import parse_repository_tag

    repo, tag = parse_repository_tag(image)
    ctx.on_output(f"pulling {image}")
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
            raise StepError("interrupted while pulling " + image)


def create_and_start(
    ctx: StepContext, client: docker.DockerClient, address: str, spec: Any, labels: dict[str, str], volumes: list[str]
) -> Container:
    """The container as the spec says, with runner's labels, created and started; errors in the engine's words."""
    docker = sdk()

    ports: dict[str, list[Any]] = {}
    for item in spec.ports:
        key, ip, host = parse_port(item)
        ports.setdefault(key, []).append((ip, host) if ip else host)
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
            volumes=volumes,
            privileged=spec.privileged,
            labels={**spec.labels, **labels},
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

"""Look-alike of Miles' tb2_sandbox_e2b.py: one E2B template per task, then a sandbox per episode.

Kept from upstream: the alias ``tb2-<task-id>-<digest>`` (the digest covers the task's image and build
resources), ``ensure_task_template`` (``Template.alias_exists``, else ``Template.build`` from the task's
``[environment].docker_image`` with cpu/memory from task.toml, floored at 1 CPU and 2048 MB), sandboxes created
from that alias with the task in their metadata, and the key: E2B_API_KEY, else the file E2B_API_KEY_FILE names
(default ~/.config/e2b/api_key), passed to every SDK call.

Not kept (yet): upstream adds build layers (a root user, apt packages, uv, the env server) and reaches an env
server started in each sandbox through get_host(8000); this look-alike builds each template from the image
alone and runs the episode as one script. sandbox_standin now runs build steps (in a directory of this host,
not an image) and proxies `{port}-{id}.{domain}` hosts, so the look-alike can move to upstream's shape.
"""

import hashlib
import os
import re
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib


def read_task_config(task_dir: Path) -> dict:
    with open(Path(task_dir) / "task.toml", "rb") as handle:
        return tomllib.load(handle)


def resolve_docker_image(task_dir: Path) -> str:
    image = read_task_config(task_dir).get("environment", {}).get("docker_image")
    if not image:
        raise ValueError(f"{Path(task_dir).name}: task.toml has no [environment].docker_image")
    return image


def task_build_resources(task_dir: Path) -> dict[str, int]:
    env_cfg = read_task_config(task_dir).get("environment", {})
    return {
        "cpu_count": max(1, int(env_cfg.get("cpus", 1))),
        "memory_mb": max(2048, int(env_cfg.get("memory_mb", 2048))),
    }


def template_alias(task_dir: Path) -> str:
    task_dir = Path(task_dir)
    inputs = [resolve_docker_image(task_dir), repr(sorted(task_build_resources(task_dir).items()))]
    digest = hashlib.sha256("\n".join(inputs).encode()).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9-]", "-", task_dir.name.lower())
    return f"tb2-{slug}-{digest}"


def resolve_api_key() -> str:
    key = os.environ.get("E2B_API_KEY", "").strip()
    if key:
        return key
    path = Path(os.environ.get("E2B_API_KEY_FILE") or "~/.config/e2b/api_key").expanduser()
    try:
        key = path.read_text(encoding="utf-8").strip()
    except OSError:
        key = ""
    if not key:
        raise RuntimeError(f"no E2B key: set E2B_API_KEY or put it in {path}")
    return key


def ensure_task_template(task_dir: Path) -> str:
    from e2b import Template

    alias = template_alias(task_dir)
    if not Template.alias_exists(alias, api_key=resolve_api_key()):
        template = Template().from_image(resolve_docker_image(task_dir))
        Template.build(template, alias, **task_build_resources(task_dir), api_key=resolve_api_key())
    return alias


def create_task_sandbox(task_dir: Path, timeout: int):
    from e2b import Sandbox

    alias = ensure_task_template(task_dir)
    metadata = {"openenv-tbench2-task": Path(task_dir).name}
    return Sandbox.create(template=alias, timeout=timeout, metadata=metadata, api_key=resolve_api_key())

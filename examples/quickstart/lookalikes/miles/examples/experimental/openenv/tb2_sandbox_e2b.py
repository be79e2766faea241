"""Look-alike of Miles' tb2_sandbox_e2b.py: the E2B materialization of the per-task recipe.

Kept from upstream (radixark/miles 31f1ca96), names, signatures and return shapes:
  ``template_alias(task_dir)``  ``tb2-<slug>-<digest>``, the digest over the base image, the build user, every
      layer command (the embedded tbench2_env source among them) and the build resources.
  ``ensure_task_template(task_dir, *, force, build_timeout_s, on_logs)``  ``Template.alias_exists``, else
      ``Template().from_image(image).set_user("root")`` plus one ``run_cmd`` per layer, built with the task's
      cpu/memory under a per-alias lock and a deadline.
  ``create_task_sandbox(task_dir, *, command_timeout_s, ready_timeout_s)``  a sandbox from that alias with the
      TTL OPENENV_E2B_SANDBOX_TTL_S (1800) and the recipe's labels as metadata; the env server started with
      ``commands.run(..., background=True, user="root")``; a wait on ``<scheme>://<get_host(8000)>/health``; a
      keepalive that re-arms the TTL (``set_timeout``) six times per TTL; returns ``(sandbox, base_url)`` and
      kills the sandbox if any of it fails.
  ``kill_sandbox(sandbox)``, ``resolve_api_key()``, and the bake CLI.

The one difference is the recipe's layers (tb2_sandbox_recipe.py says which) and the server's log, written to
tmp/openenv-server.log under the sandbox's root (upstream: /tmp/openenv-server.log).
"""

import argparse
import hashlib
import os
import re
import shlex
import sys
import threading
from pathlib import Path

import tb2_sandbox_recipe as recipe
from tb2_sandbox_recipe import (
    resolve_docker_image,
    run_with_deadline,
    sandbox_labels,
    server_cmd,
    server_layer_commands,
    task_env_resources,
    wait_server_ready,
)

_BUILD_USER = "root"


def template_alias(task_dir: Path) -> str:
    task_dir = Path(task_dir)
    resources = task_build_resources(task_dir)
    inputs = [
        resolve_docker_image(task_dir, None),
        _BUILD_USER,
        *server_layer_commands(task_dir),
        repr(sorted(resources.items())),
    ]
    digest = hashlib.sha256("\n".join(inputs).encode()).hexdigest()[:10]
    return f"tb2-{re.sub(r'[^a-z0-9-]', '-', task_dir.name.lower())}-{digest}"


def task_build_resources(task_dir: Path) -> dict[str, int]:
    cpus, memory_mb, _storage_mb = task_env_resources(task_dir)
    return {"cpu_count": cpus, "memory_mb": memory_mb}


def _connection_opts() -> dict:
    return {"api_key": resolve_api_key()}  # E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN: read by the SDK itself


_build_locks: dict[str, threading.Lock] = {}
_build_locks_guard = threading.Lock()


def _build_lock(alias: str) -> threading.Lock:
    with _build_locks_guard:
        return _build_locks.setdefault(alias, threading.Lock())


def ensure_task_template(task_dir: Path, *, force: bool = False, build_timeout_s: float = 1800.0, on_logs=None) -> str:
    from e2b import Template

    task_dir = Path(task_dir)
    alias = template_alias(task_dir)
    with _build_lock(alias):
        if not force and Template.alias_exists(alias, **_connection_opts()):
            return alias
        template = Template().from_image(resolve_docker_image(task_dir, None)).set_user(_BUILD_USER)
        for command in server_layer_commands(task_dir):
            template = template.run_cmd(command)
        run_with_deadline(
            lambda: Template.build(
                template,
                alias,
                **task_build_resources(task_dir),
                skip_cache=force,
                on_build_logs=on_logs,
                **_connection_opts(),
            ),
            build_timeout_s,
        )
    return alias


def base_url(sandbox) -> str:
    return f"{os.getenv('OPENENV_E2B_URL_SCHEME', 'https')}://{sandbox.get_host(8000)}"


_SANDBOX_TTL_S = int(os.getenv("OPENENV_E2B_SANDBOX_TTL_S", "1800"))
_READY_TIMEOUT_S = float(os.getenv("OPENENV_E2B_READY_TIMEOUT_S", "300"))
_KEEPALIVE_INTERVAL_S = _SANDBOX_TTL_S / 6.0
_KEEPALIVE_MAX_CONSECUTIVE_FAILURES = 3


def _start_keepalive(sandbox, task_id: str) -> None:
    opts = _connection_opts()
    recipe.start_keepalive(
        lambda: sandbox.set_timeout(_SANDBOX_TTL_S, **opts),
        f"tb2-sandbox-keepalive-{task_id}",
        interval_s=_KEEPALIVE_INTERVAL_S,
        max_consecutive_failures=_KEEPALIVE_MAX_CONSECUTIVE_FAILURES,
    )


def create_task_sandbox(
    task_dir: Path, *, command_timeout_s: int = recipe.COMMAND_TIMEOUT_S, ready_timeout_s: float = _READY_TIMEOUT_S
):
    from e2b import Sandbox

    task_dir = Path(task_dir)
    opts = _connection_opts()
    alias = ensure_task_template(task_dir)
    sandbox = Sandbox.create(template=alias, timeout=_SANDBOX_TTL_S, metadata=sandbox_labels(task_dir), **opts)
    try:
        cmd = server_cmd(command_timeout_s, default_task_id=task_dir.name)
        sandbox.commands.run(
            f"bash -c {shlex.quote(cmd)} > tmp/openenv-server.log 2>&1", background=True, user=_BUILD_USER
        )
        url = base_url(sandbox)
        wait_server_ready(url, timeout_s=ready_timeout_s)
        _start_keepalive(sandbox, task_dir.name)
        return sandbox, url
    except Exception:
        try:
            sandbox.kill(**opts)
        except Exception:
            pass  # the TTL reclaims it
        raise


def kill_sandbox(sandbox) -> None:
    sandbox.kill(**_connection_opts())


def resolve_api_key() -> str:
    return recipe.resolve_api_key("E2B_API_KEY", "E2B_API_KEY_FILE", "~/.config/e2b/api_key")


def bake(tasks_dir: Path, task_id: str, force: bool) -> None:
    task_dir = tasks_dir / task_id
    resources = task_build_resources(task_dir)
    print(f"[bake] {template_alias(task_dir)}  cpu={resources['cpu_count']} mem={resources['memory_mb']}MB")
    alias = ensure_task_template(task_dir, force=force, on_logs=lambda entry: print(f"  | {entry}", flush=True))
    print(f"[done] {alias}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks-dir", required=True, help="local terminal-bench-2 checkout")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--tasks", help="comma-separated task_ids")
    group.add_argument("--all", action="store_true", help="every dir with a task.toml")
    parser.add_argument("--force", action="store_true", help="rebuild even when the alias exists")
    args = parser.parse_args()
    tasks_dir = Path(args.tasks_dir).expanduser().resolve()
    if args.all:
        task_ids = sorted(p.name for p in tasks_dir.iterdir() if (p / "task.toml").is_file())
    else:
        task_ids = [t.strip() for t in args.tasks.split(",") if t.strip()]
    for task_id in task_ids:
        bake(tasks_dir, task_id, args.force)


if __name__ == "__main__":
    sys.exit(main())

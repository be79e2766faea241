"""Look-alike of Miles' tb2_sandbox_recipe.py: the provider-agnostic recipe of a per-task sandbox.

Kept from upstream (radixark/miles 31f1ca96): the names and signatures (server_cmd, read_task_config,
task_env_resources, sandbox_labels, resolve_api_key, start_keepalive, run_with_deadline, resolve_docker_image,
server_layer_commands, wait_server_ready), the floors (1 CPU, 2048 MB, 10240 MB of disk), the labels
(openenv-tbench2-task, openenv-launcher from OPENENV_LAUNCHER or the unix user, openenv-run-id from
OPENENV_RUN_ID), the env server's command line and its variables, the tbench2_env source embedded in a layer as a
deterministic tar (mtimes, owners and the gzip stamp zeroed), solution/ kept out of the staged task, and the
keepalive and deadline threads.

Not kept, because the rehearsal is offline and its sandboxes have no images: the apt-get and uv layers (the
env server's venv is made from the interpreter on PATH, without pip, and the package copied into it); the task
directory comes embedded in its layer rather than from the checkout's pinned GitHub tarball; and the paths are
relative to WORKDIR / (opt/..., not /opt/...), because the stand-in runs build steps in a directory of this host,
where an absolute path would write this host's /opt.
"""

import base64
import concurrent.futures
import getpass
import gzip
import io
import os
import shlex
import tarfile
import threading
import time
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

_MAX_INLINE_TAR_BYTES = 45_000  # upstream's ceiling on an embedded tar (a provider's longest build line)
_ENV_SRC_ITEMS = ("pyproject.toml", "README.md", "openenv.yaml", "__init__.py", "client.py", "models.py", "server")

COMMAND_TIMEOUT_S = int(os.getenv("TB2_COMMAND_TIMEOUT_S", "900"))

SERVER_CMD = (
    "TB2_TASKS_DIR=opt/tb2-tasks "
    "TB2_DEFAULT_TASK_ID={default_task_id} "
    "TB2_COMMAND_TIMEOUT_S={command_timeout_s} "
    "TB2_WITHHOLD_TESTS=1 "
    "CAMEL_RUNTIME=true "
    "MAX_CONCURRENT_ENVS=1 "
    "opt/envserver/bin/python -m tbench2_env.server.app "
    "--host 0.0.0.0 --port 8000"
)


def server_cmd(command_timeout_s: int = COMMAND_TIMEOUT_S, default_task_id: str = "") -> str:
    return SERVER_CMD.format(command_timeout_s=command_timeout_s, default_task_id=shlex.quote(default_task_id))


def read_task_config(task_dir: Path) -> dict:
    path = Path(task_dir) / "task.toml"
    if not path.is_file():
        raise FileNotFoundError(f"{task_dir}: no task.toml")
    return tomllib.loads(path.read_text())


def task_env_resources(task_dir: Path) -> tuple[int, int, int]:
    env_cfg = read_task_config(task_dir).get("environment", {})
    return (
        max(1, int(env_cfg.get("cpus", 1))),
        max(2048, int(env_cfg.get("memory_mb", 2048))),
        max(10240, int(env_cfg.get("storage_mb", 10240))),
    )


def sandbox_labels(task_dir: Path) -> dict[str, str]:
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry, as upstream allows
        user = "unknown"
    labels = {
        "openenv-tbench2-task": Path(task_dir).name,
        "openenv-launcher": os.environ.get("OPENENV_LAUNCHER") or user,
    }
    if os.environ.get("OPENENV_RUN_ID"):
        labels["openenv-run-id"] = os.environ["OPENENV_RUN_ID"]
    return labels


def resolve_api_key(env_var: str, file_env_var: str, default_path: str) -> str:
    key = os.environ.get(env_var, "").strip()
    if key:
        return key
    key_file = Path(os.environ.get(file_env_var, "").strip() or default_path).expanduser()
    try:
        key = key_file.read_text(encoding="utf-8").strip()
    except OSError:
        key = ""
    if not key:
        raise RuntimeError(f"no API key: {env_var} is unset and {key_file} is missing or empty")
    return key


def start_keepalive(beat, thread_name: str, *, interval_s: float, max_consecutive_failures: int) -> None:
    """`beat` every `interval_s` on a daemon thread, until it fails that many times in a row."""

    def run() -> None:
        failures = 0
        while failures < max_consecutive_failures:
            time.sleep(interval_s)
            try:
                beat()
                failures = 0
            except Exception:
                failures += 1

    threading.Thread(target=run, name=thread_name, daemon=True).start()


def run_with_deadline(fn, timeout_s: float):
    """`fn` on a worker thread that is not joined past `timeout_s` (TimeoutError)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(fn).result(timeout=timeout_s)
    finally:
        pool.shutdown(wait=False)


def _tar_filter(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    name = Path(info.name).name
    if name in {"__pycache__", ".initial_env"} or name.endswith((".pyc", ".egg-info")):
        return None
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def _dir_tar_b64(paths: list[Path], arcnames: list[str], max_bytes: int, exclude: tuple[str, ...] = ()) -> str:
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if any(info.name == x or info.name.startswith(x + "/") for x in exclude):
            return None
        return _tar_filter(info)

    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for path, arcname in zip(paths, arcnames, strict=True):
            tar.add(path, arcname=arcname, filter=keep)
    raw = buf.getvalue()
    if len(raw) > max_bytes:
        raise ValueError(f"embedded tar is {len(raw)} bytes (> {max_bytes}); inline embedding not suitable.")
    return base64.b64encode(raw).decode()


def _env_src_dir() -> Path:
    import tbench2_env

    src = Path(tbench2_env.__file__).resolve().parent
    if not (src / "pyproject.toml").is_file():
        raise RuntimeError(
            f"tbench2_env at {src} has no pyproject.toml; the per-task sandbox build embeds the package source and "
            "needs an editable/checkout install: pip install -e <OpenEnv>/envs/tbench2_env"
        )
    return src


def _env_src_tar_b64() -> str:
    src = _env_src_dir()
    items = [item for item in _ENV_SRC_ITEMS if (src / item).exists()]
    return _dir_tar_b64([src / i for i in items], [f"tbench2_env_src/{i}" for i in items], _MAX_INLINE_TAR_BYTES)


def _task_layer_command(task_dir: Path) -> str:
    task_dir = Path(task_dir)
    name = task_dir.name
    data = _dir_tar_b64([task_dir], [name], _MAX_INLINE_TAR_BYTES, exclude=(f"{name}/solution",))
    return f"mkdir -p opt/tb2-tasks && echo {data} | base64 -d | tar xz -C opt/tb2-tasks"


def resolve_docker_image(task_dir: Path, docker_image: str | None) -> str:
    if docker_image:
        return docker_image
    docker_image = read_task_config(task_dir).get("environment", {}).get("docker_image")
    if not docker_image:
        raise ValueError(f"{Path(task_dir).name}: task.toml has no [environment].docker_image")
    return docker_image


def server_layer_commands(task_dir: Path) -> list[str]:
    """The layers that turn the task's image into task + env server (see the module's docstring for what differs)."""
    purelib = "$(opt/envserver/bin/python -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')"
    return [
        "mkdir -p tmp && python3 -m venv --without-pip opt/envserver",
        f"mkdir -p opt/src && echo {_env_src_tar_b64()} | base64 -d | tar xz -C opt/src",
        f"cp -r opt/src/tbench2_env_src {purelib}/tbench2_env",
        _task_layer_command(task_dir),
    ]


def wait_server_ready(base_url: str, timeout_s: float = 300.0) -> None:
    import requests

    deadline = time.time() + timeout_s
    last_err: Exception | None = None
    while time.time() < deadline:
        try:
            if requests.get(f"{base_url}/health", timeout=5.0).status_code == 200:
                return
        except requests.RequestException as e:
            last_err = e
        time.sleep(0.2)  # upstream polls every 2 s; a look-alike server is up in a fraction of one
    raise TimeoutError(f"env server at {base_url} not ready in {timeout_s}s ({last_err})")

"""Helpers: write a pipeline into a temporary directory and run the real CLI on it, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


class Project:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, text: str, name: str = "pipeline.yaml") -> Path:
        target = self.path / name
        target.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return target

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.pop("RUNNER_DEBUG", None)
        return env

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "runner", *args]

    def run(self, *args: str, timeout: float = 120) -> Run:
        proc = subprocess.run(
            self.argv(*args), cwd=self.path, env=self.env(), capture_output=True, text=True, timeout=timeout
        )
        return Run(proc.returncode, proc.stdout, proc.stderr)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args),
            cwd=self.path,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def on_a_terminal(self, *args: str, extra: dict[str, str] | None = None) -> tuple[int, bytes]:
        """The CLI on a pseudo-terminal of 100x40, as a user's shell runs it: its exit code and every byte."""
        import fcntl
        import pty
        import struct
        import termios

        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
        env = {**self.env(), "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "40", **(extra or {})}
        if "NO_COLOR" not in (extra or {}):
            env.pop("NO_COLOR", None)
        proc = subprocess.Popen(
            self.argv(*args), cwd=self.path, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=60)
        os.close(leader)
        return proc.returncode, b"".join(chunks)

    def count(self, name: str) -> int:
        """Lines in a counter file that commands append to: how often they ran."""
        path = self.path / name
        return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)


# ---- a real Docker Engine ------------------------------------------------------------------------------

BUSYBOX_IMAGE = "runner-test/busybox:1"
BUSYBOX_APPLETS = ["sh", "httpd", "sleep", "cat", "echo", "env", "ls", "mkdir", "true", "false", "nc", "wget"]


def _engine_reachable(host: str) -> bool:
    import docker

    try:
        client = docker.DockerClient(base_url=host, timeout=10)
        client.ping()
        client.close()
        return True
    except Exception:  # noqa: BLE001 - any failure means unreachable
        return False


def _busybox_tar() -> bytes:
    import io
    import shutil
    import tarfile

    busybox = shutil.which("busybox") or "/bin/busybox"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(busybox, arcname="bin/busybox")
        for applet in BUSYBOX_APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
        for directory in ("www", "tmp"):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o777
            tar.addfile(info)
        health = tarfile.TarInfo("www/health")
        health.size = 3
        tar.addfile(health, io.BytesIO(b"ok\n"))
    return buf.getvalue()


@pytest.fixture(scope="session")
def docker_host() -> str:
    """The address of a running Docker Engine with the busybox test image; skip (fail under CI) without one."""
    import docker

    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not _engine_reachable(host):
        script = ROOT / ".ci" / "docker-up"
        proc = subprocess.run([str(script)], capture_output=True, text=True, timeout=600)
        host = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else ""
        if not host or not _engine_reachable(host):
            reason = f"no Docker Engine reachable ({proc.stderr.strip()[-300:]})"
            if os.environ.get("CI") == "true":
                pytest.fail(reason + "; under CI=true the docker tests must run")
            pytest.skip(reason)
    os.environ["DOCKER_HOST"] = host
    client = docker.DockerClient(base_url=host, timeout=60)
    try:
        client.images.get(BUSYBOX_IMAGE)
    except docker.errors.ImageNotFound:
        repo, tag = BUSYBOX_IMAGE.split(":")
        client.api.import_image_from_data(_busybox_tar(), repository=repo, tag=tag)
    client.close()
    return host


@pytest.fixture
def docker_client(docker_host: str) -> Iterator[Any]:
    import docker

    client = docker.DockerClient(base_url=docker_host, timeout=60)
    made: list[str] = []
    client.test_names = made  # type: ignore[attr-defined]
    yield client
    for name in made:
        try:
            client.containers.get(name).remove(force=True)
        except docker.errors.NotFound:
            pass
    client.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

"""Helpers: write a pipeline into a temporary directory and run the real CLI on it, as a user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.harness import Harness

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
        self.extra_env: dict[str, str] = {}  # for every command this project runs (the ssh settings, say)

    def write(self, text: str, name: str = "pipeline.yaml") -> Path:
        target = self.path / name
        target.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return target

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.pop("RUNNER_DEBUG", None)
        env.update(self.extra_env)
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


def processes_in(root: Path) -> dict[int, str]:
    """The live processes (not zombies) working in `root` or under it: what a test's steps, jobs and servers
    started there, {pid: argv}; runner's persisting ssh masters aside."""
    found: dict[int, str] = {}
    prefix = str(root)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if "ControlMaster=yes" in argv and argv.startswith("ssh "):
            continue  # runner's ssh master persists on purpose (ControlPersist); the ssh fixtures close them
        if state not in ("Z", "X") and (cwd == prefix or cwd.startswith(prefix + "/")):
            found[int(entry)] = argv.strip()[:200]
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_PASSED] = report.passed


_PASSED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def nothing_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test that has a tmp_path: what still runs in it is stopped (its process group, SIGKILL), so a
    test that fails half-way leaves nothing behind after pytest ends; a test that passed and left something
    running fails for it (a leak, or a missing `runner down`)."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    root = request.getfixturevalue("tmp_path")  # taken first: it is torn down after this fixture
    yield
    import signal
    import time

    left = processes_in(root)
    if not left:
        return
    deadline = time.monotonic() + 2  # what is ending on its own (a job's last line) gets a moment
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = processes_in(root)
    for pid in left:
        try:
            group = os.getpgid(pid)
            if group == os.getpgrp():  # started in pytest's own group: that group is pytest's (and its shell's)
                os.kill(pid, signal.SIGKILL)
            else:
                os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    if left and request.node.stash.get(_PASSED, False):
        pytest.fail(f"left running in {root}: " + "; ".join(f"{pid} {argv}" for pid, argv in left.items()))


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """The CLI in process (tests/harness.py) in tmp_path, with the fake kind `fake` registered and its world empty."""
    from steps import KINDS
    from tests.harness import WORLD, Harness

    monkeypatch.setitem(KINDS, "fake", "tests.harness:FakeStep")
    WORLD.reset()
    yield Harness(tmp_path)
    WORLD.reset()


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
    ensure_busybox_image(client)
    client.close()
    return host


def ensure_busybox_image(client: Any) -> None:
    """BUSYBOX_IMAGE on the engine, imported from this machine's busybox if it is not there (no registry)."""
    import docker

    try:
        client.images.get(BUSYBOX_IMAGE)
    except docker.errors.ImageNotFound:
        repo, tag = BUSYBOX_IMAGE.split(":")
        client.api.import_image_from_data(_busybox_tar(), repository=repo, tag=tag)


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


# ---- real OpenSSH on loopback: two "machines", node1 (127.0.0.1) and node2 (127.0.0.2) ----------------------


@pytest.fixture(scope="session")
def ssh_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One sshd listening on 127.0.0.1 and 127.0.0.2, and an ssh_config naming them node1 and node2 (with the
    test's key and known_hosts): what runner's `ssh` reads through RUNNER_SSH_CONFIG. `accepted()` counts the
    connections the server let in."""
    import tempfile

    from sshd import start_sshd, wait_until_in

    root = Path(tempfile.mkdtemp(prefix="rsshd-"))  # short: control socket paths have a length limit
    port = free_port()
    server = start_sshd(root, port, ["127.0.0.1", "127.0.0.2"], "AcceptEnv DOCKER_HOST\n")  # SetEnv in a test
    user = os.environ.get("USER") or "root"
    kind, key = server.host_key
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {kind} {key}\n[127.0.0.2]:{port} {kind} {key}\n")
    config = root / "ssh_config"
    config.write_text(
        "Host node1\n  HostName 127.0.0.1\nHost node2\n  HostName 127.0.0.2\n"
        f"Host *\n  User {user}\n  Port {port}\n  IdentityFile {root}/client_key\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {root}/known_hosts\n"
    )
    wait_until_in(["ssh", "-F", str(config), "-o", "BatchMode=yes", "node1", "true"], server)
    yield {"config": str(config), "root": root, "port": port, "server": server, "user": user}
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def remote(project: Project, ssh_hosts: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The project set up to reach node1 and node2, with control sockets of its own (so what a test counts is its
    own connections); the masters it leaves are closed at the end."""
    import tempfile

    control = tempfile.mkdtemp(prefix="rsc-")
    project.extra_env.update({"RUNNER_SSH_CONFIG": ssh_hosts["config"], "RUNNER_SSH_CONTROL_DIR": control})
    yield {**ssh_hosts, "control": control}
    close_masters(ssh_hosts["config"], control)


def close_masters(config: str, control: str, hosts: tuple[str, ...] = ("node1", "node2")) -> None:
    """`ssh -O exit` for each master whose socket is in `control`, then the directory."""
    for host in hosts:
        subprocess.run(
            ["ssh", "-F", config, "-o", f"ControlPath={control}/%C", "-O", "exit", host],
            capture_output=True,
            timeout=20,
        )
    shutil.rmtree(control, ignore_errors=True)

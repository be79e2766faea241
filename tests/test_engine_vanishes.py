"""The Docker Engine going away in the middle of an apply (issue 15, item 3): a private dockerd of the test's own
(its own data root, socket and network namespace, no bridge, no iptables), stopped — gracefully or by SIGKILL —
while a docker step waits for its container to be ready. The step fails with an error that names the engine,
nothing is recorded done that is not, and once the engine is back the next apply converges."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BUSYBOX_IMAGE, Project, _busybox_tar, _engine_reachable

from runner.state import StateStore


class Engine:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.address = f"unix://{root}/sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "unshare",
                "-n",  # a network namespace of its own: with --bridge=none, dockerd deletes docker0
                "dockerd",
                "--data-root",
                str(self.root / "data"),
                "--exec-root",
                str(self.root / "exec"),
                "--pidfile",
                str(self.root / "pid"),
                "-H",
                self.address,
                "--bridge=none",
                "--iptables=false",
                "--ip6tables=false",
            ],  # fmt: skip
            stdout=open(self.root / "log", "ab"),  # noqa: SIM115 - the engine's log, kept for a failure
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while not _engine_reachable(self.address):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the private dockerd did not come up: " + (self.root / "log").read_text()[-800:])
            time.sleep(0.2)

    def stop(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(timeout=60)
        self.proc = None
        if sig == signal.SIGKILL:  # a crashed engine leaves its pid files; its containerd may linger as a zombie
            for stale in (self.root / "pid", self.root / "exec" / "containerd" / "containerd.pid"):
                stale.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def engine(docker_host: str) -> Iterator[Engine]:
    """A private engine (docker_host first: it installs dockerd under CI)."""
    if shutil.which("dockerd") is None:
        pytest.skip("no dockerd")
    interfaces = set(os.listdir("/sys/class/net"))
    root = Path(f"/tmp/rdv-{os.getpid()}")  # short: containerd's socket path has a length limit
    root.mkdir(exist_ok=True)
    engine = Engine(root)
    try:
        engine.start()
    except RuntimeError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    import docker

    client = docker.DockerClient(base_url=engine.address, timeout=60)
    repo, tag = BUSYBOX_IMAGE.split(":")
    client.api.import_image_from_data(_busybox_tar(), repository=repo, tag=tag)
    client.close()
    yield engine
    if engine.proc is not None:
        engine.stop(signal.SIGTERM)
    shutil.rmtree(root, ignore_errors=True)
    gone = interfaces - set(os.listdir("/sys/class/net"))
    assert not gone, f"the private engine took the host's {gone} (the other tests' engine needs docker0)"


def _container_running(address: str, name: str) -> bool:
    import docker

    client = docker.DockerClient(base_url=address, timeout=10)
    try:
        return bool(client.containers.get(name).status == "running")
    except Exception:  # noqa: BLE001 - not there (yet)
        return False
    finally:
        client.close()


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_the_engine_going_away_mid_step_is_named_and_the_next_apply_converges(
    project: Project, engine: Engine, how: str
) -> None:
    name = f"vanish-{how}-{os.getpid()}"
    never_ready = 'wait: {tcp: "127.0.0.1:1", timeout: 40, interval: 0.2}'
    pipeline = f"""
        name: vanish
        steps:
          - name: box
            docker:
              name: {name}
              image: {BUSYBOX_IMAGE}
              pull: never
              network: none
              command: [sh, -c, "trap exit TERM; sleep 3600 & wait"]  # ends on SIGTERM: no 10 s stop grace
              host: {engine.address}
              {never_ready}
          - name: after
            run: "echo 1 >> after.count"
        """
    project.write(pipeline)
    proc = project.popen("apply")
    deadline = time.monotonic() + 60
    while not _container_running(engine.address, name):
        assert time.monotonic() < deadline and proc.poll() is None, "the container never ran"
        time.sleep(0.1)
    engine.stop(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    text = out + err
    assert proc.returncode == 1, text
    assert f"the Docker Engine at {engine.address} went away during the step" in text, text
    assert "internal error" not in text and "Traceback" not in text
    assert "fix its command" not in text  # the container did not fail: its engine stopped it
    records = StateStore(project.path / ".runner").load().steps
    assert records["box"]["status"] == "failed"
    assert "after" not in records or records["after"].get("status") != "done"
    assert project.count("after.count") == 0

    engine.start()
    project.write(pipeline.replace(never_ready, ""))  # nothing on the host answers a container with no network
    again = project.run("apply", timeout=180)
    assert again.code == 0, again.text
    assert _container_running(engine.address, name)
    assert project.count("after.count") == 1
    third = project.run("apply")
    assert third.code == 0 and "changed=0" in third.out, third.text
    import docker

    client = docker.DockerClient(base_url=engine.address, timeout=30)
    client.containers.get(name).remove(force=True)
    client.close()

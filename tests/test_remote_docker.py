"""docker over ssh://: a real OpenSSH server on 127.0.0.1 with a key made for the test, in front of the real
engine; the container converges through it, then converges again without change."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import BUSYBOX_IMAGE, Project, free_port
from sshd import start_sshd, wait_until_in


@pytest.fixture(scope="module")
def ssh_engine(tmp_path_factory: pytest.TempPathFactory, docker_host: str) -> Iterator[dict[str, Any]]:
    """An sshd on 127.0.0.1:PORT that lets the test's key in and points `docker` at the test engine."""
    root = tmp_path_factory.mktemp("sshd")
    port = free_port()
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI on the host behind sshd (`docker system dial-stdio` runs there)")
    server = start_sshd(
        root,
        port,
        ["127.0.0.1"],
        f'ForceCommand env DOCKER_HOST={docker_host} sh -c "$SSH_ORIGINAL_COMMAND"\n',
    )
    home = root / "home"
    (home / ".ssh").mkdir(parents=True)
    user = os.environ.get("USER") or "root"
    (home / ".ssh" / "config").write_text(
        f"Host 127.0.0.1\n  User {user}\n  Port {port}\n  IdentityFile {root}/client_key\n"
    )
    kind, key = server.host_key
    (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{port} {kind} {key}\n")
    wait_until_in(
        [
            "ssh",
            "-F",
            str(home / ".ssh" / "config"),
            "-o",
            f"UserKnownHostsFile={home}/.ssh/known_hosts",
            "-o",
            "BatchMode=yes",
            "127.0.0.1",
            "docker version --format '{{.Server.Version}}'",
        ],
        server,
    )
    yield {"address": f"ssh://{user}@127.0.0.1:{port}", "home": str(home), "port": port}
    server.stop()


def test_a_container_converges_through_ssh_and_again_without_change(
    project: Project, ssh_engine: dict[str, Any], docker_client: Any
) -> None:
    name = f"runner-ssh-{uuid.uuid4().hex[:8]}"
    docker_client.test_names.append(name)
    port = free_port()
    project.write(
        f"""
        name: remote
        steps:
          - name: box
            docker:
              name: {name}
              image: {BUSYBOX_IMAGE}
              pull: never
              host: "{ssh_engine["address"]}"
              command: [httpd, -f, -p, "8000", -h, /www]
              ports: ["{port}:8000"]
              wait: {{http: "http://127.0.0.1:{port}/health", timeout: 30}}
        """
    )
    env = {**project.env(), "HOME": ssh_engine["home"]}
    env.pop("DOCKER_HOST", None)  # only the step's host: may lead to the engine

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            project.argv(*args), cwd=project.path, env=env, capture_output=True, text=True, timeout=180
        )

    first = run("apply")
    assert first.returncode == 0, first.stdout + first.stderr
    container = docker_client.containers.get(name)
    state = json.loads((project.path / ".runner" / "state.json").read_text())["steps"]["box"]["outputs"]
    assert state["container_id"] == container.id and state["host"] == ssh_engine["address"]
    assert state["hostname"] == "127.0.0.1"

    again = run("apply")
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout + again.stderr
    assert docker_client.containers.get(name).id == container.id  # not recreated


def test_an_unreachable_ssh_engine_names_the_host(project: Project, ssh_engine: dict[str, Any]) -> None:
    dead = free_port()
    project.write(
        f"""
        name: remote
        steps:
          - name: box
            docker: {{name: x, image: {BUSYBOX_IMAGE}, host: "ssh://root@127.0.0.1:{dead}"}}
        """
    )
    env = {**project.env(), "HOME": ssh_engine["home"]}
    result = subprocess.run(
        project.argv("apply"), cwd=project.path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert f"cannot reach the Docker Engine at ssh://root@127.0.0.1:{dead}" in result.stdout
    assert "ssh" in result.stdout and "Traceback" not in result.stdout + result.stderr


def test_a_wait_on_localhost_means_the_remote_engines_host() -> None:
    from steps._support.readiness import Readiness
    from steps.docker import remote_readiness

    http = Readiness(http="http://127.0.0.1:8000/health", status=[204])
    assert remote_readiness(http, "ssh://ops@gpu-7:2222").http == "http://gpu-7:8000/health"
    assert remote_readiness(http, "tcp://10.0.0.5:2376").http == "http://10.0.0.5:8000/health"
    assert remote_readiness(http, "unix:///var/run/docker.sock").http == "http://127.0.0.1:8000/health"
    other = Readiness(http="http://aenv.internal:8000/health")
    assert remote_readiness(other, "ssh://ops@gpu-7").http == "http://aenv.internal:8000/health"
    tcp = Readiness(tcp="localhost:5432")
    assert remote_readiness(tcp, "ssh://ops@db-1").tcp == "db-1:5432"


def test_for_each_over_engines_deploys_a_fleet_each_with_its_own_record(
    project: Project, ssh_engine: dict[str, Any], docker_client: Any, docker_host: str
) -> None:
    prefix = f"runner-fleet-{uuid.uuid4().hex[:6]}"
    docker_client.test_names.extend([f"{prefix}-0", f"{prefix}-1"])
    project.write(
        f"""
        name: fleet
        vars: {{engines: ["{docker_host}", "{ssh_engine["address"]}"]}}  # local first: paramiko comes in late
        steps:
          - name: aenv
            for_each: "{{{{ vars.engines }}}}"
            docker:
              name: "{prefix}-{{{{ item_index }}}}"
              image: {BUSYBOX_IMAGE}
              pull: never
              host: "{{{{ item }}}}"
              command: [sleep, "600"]
        """
    )
    env = {**project.env(), "HOME": ssh_engine["home"]}
    env.pop("DOCKER_HOST", None)

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            project.argv("apply"), cwd=project.path, env=env, capture_output=True, text=True, timeout=180
        )

    first = run()
    assert first.returncode == 0, first.stdout + first.stderr
    assert "2 of 2 items ran" in first.stdout
    state = json.loads((project.path / ".runner" / "state.json").read_text())["steps"]
    items = [k for k in state if k.startswith("aenv[")]
    assert len(items) == 2
    assert {state[k]["outputs"]["host"] for k in items} == {ssh_engine["address"], docker_host}
    assert docker_client.containers.get(f"{prefix}-0") and docker_client.containers.get(f"{prefix}-1")
    again = run()
    assert again.returncode == 0 and "2 items up to date" in again.stdout, again.stdout

"""docker over ssh://: a real OpenSSH server on 127.0.0.1 with a key made for the test, in front of the real
engine; the container converges through it, then converges again without change."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BUSYBOX_IMAGE, Project, close_masters, free_port
from sshd import start_sshd, wait_until_in


@pytest.fixture(scope="module")
def ssh_engine(tmp_path_factory: pytest.TempPathFactory, docker_host: str) -> Iterator[dict[str, Any]]:
    """An sshd on 127.0.0.1:PORT that lets the test's key in, whose sessions have DOCKER_HOST pointing at the test
    engine (as a login environment would), and an ssh_config for runner's ssh (RUNNER_SSH_CONFIG)."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="rsde-"))  # short: the forwarded socket's path has a length limit
    port = free_port()
    server = start_sshd(
        root,
        port,
        ["127.0.0.1"],
        f'ForceCommand env DOCKER_HOST={docker_host} sh -c "$SSH_ORIGINAL_COMMAND"\n',
    )
    user = os.environ.get("USER") or "root"
    kind, key = server.host_key
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {kind} {key}\n")
    config = root / "ssh_config"
    config.write_text(
        f"Host 127.0.0.1 enginehost\n  HostName 127.0.0.1\n  User {user}\n  Port {port}\n"
        f"  IdentityFile {root}/client_key\n  IdentitiesOnly yes\n  UserKnownHostsFile {root}/known_hosts\n"
    )
    wait_until_in(["ssh", "-F", str(config), "-o", "BatchMode=yes", "127.0.0.1", "true"], server)
    control = root / "control"
    yield {
        "address": f"ssh://{user}@127.0.0.1:{port}",
        "env": {"RUNNER_SSH_CONFIG": str(config), "RUNNER_SSH_CONTROL_DIR": str(control)},
        "config": str(config),
        "control": str(control),
        "port": port,
        "server": server,
    }
    close_masters(str(config), str(control), hosts=("127.0.0.1", "enginehost"))
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


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
    env = {**project.env(), **ssh_engine["env"]}
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
    env = {**project.env(), **ssh_engine["env"]}
    result = subprocess.run(
        project.argv("apply"), cwd=project.path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert f"cannot reach the Docker Engine at ssh://root@127.0.0.1:{dead} over ssh: unreachable" in result.stdout
    assert "sshd listens" in result.stdout
    plan = subprocess.run(project.argv("plan"), cwd=project.path, env=env, capture_output=True, text=True)
    assert f"would fail: cannot reach ssh://root@127.0.0.1:{dead} over ssh: unreachable" in plan.stdout, plan.stdout
    assert "ssh" in result.stdout and "Traceback" not in result.stdout + result.stderr


def test_a_wait_on_localhost_means_the_remote_engines_host() -> None:
    from steps._support.readiness import Readiness
    from steps.docker import remote_readiness

    http = Readiness(http="http://127.0.0.1:8000/health", status=[204])
    assert remote_readiness(http, "tcp://10.0.0.5:2376").http == "http://10.0.0.5:8000/health"
    assert remote_readiness(http, "unix:///var/run/docker.sock").http == "http://127.0.0.1:8000/health"
    other = Readiness(http="http://aenv.internal:8000/health")
    assert remote_readiness(other, "tcp://10.0.0.5:2376").http == "http://aenv.internal:8000/health"
    tcp = Readiness(tcp="localhost:5432")
    assert remote_readiness(tcp, "tcp://db-1:2375").tcp == "db-1:5432"
    # an ssh:// engine's wait is made from that machine (ssh -W), where 127.0.0.1 is its own: left as written
    assert remote_readiness(http, "ssh://ops@gpu-7:2222").http == "http://127.0.0.1:8000/health"
    assert remote_readiness(tcp, "ssh://ops@db-1").tcp == "localhost:5432"


def test_for_each_over_engines_deploys_a_fleet_each_with_its_own_record(
    project: Project, ssh_engine: dict[str, Any], docker_client: Any, docker_host: str
) -> None:
    prefix = f"runner-fleet-{uuid.uuid4().hex[:6]}"
    docker_client.test_names.extend([f"{prefix}-0", f"{prefix}-1"])
    project.write(
        f"""
        name: fleet
        vars: {{engines: ["{docker_host}", "{ssh_engine["address"]}"]}}
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
    env = {**project.env(), **ssh_engine["env"]}
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


def test_an_engine_and_the_other_steps_on_its_machine_share_one_connection(
    project: Project, ssh_engine: dict[str, Any], docker_client: Any
) -> None:
    """The docker kind reaches an ssh:// engine through runner's own ssh connection to that machine (the engine's
    socket forwarded on the master, ~/.ssh/config or RUNNER_SSH_CONFIG read as by every other step there): a
    container and an assert on one machine, under an alias only the ssh config knows, converge; the converged
    re-run opens one connection to it, reads the engine without the docker SDK, and its readiness wait is made
    from that machine."""
    name = f"runner-shared-{uuid.uuid4().hex[:8]}"
    docker_client.test_names.append(name)
    port = free_port()
    project.write(
        f"""
        name: shared
        steps:
          - name: kvm
            assert: {{host: enginehost, path: /proc/self, program: [sh]}}
          - name: box
            needs: [kvm]
            docker:
              name: {name}
              image: {BUSYBOX_IMAGE}
              pull: never
              host: enginehost
              command: [httpd, -f, -p, "8000", -h, /www]
              ports: ["127.0.0.1:{port}:8000"]
              wait: {{http: "http://127.0.0.1:{port}/health", timeout: 30}}
        """
    )
    project.extra_env.update(ssh_engine["env"])
    project.extra_env["DOCKER_HOST"] = "unix:///nonexistent/docker.sock"  # only the step's host leads to the engine
    first = project.run("apply", "-v")
    assert first.code == 0, first.text
    assert "from enginehost" in first.out, first.out  # the wait, made there
    container = docker_client.containers.get(name)
    state = json.loads((project.path / ".runner" / "state.json").read_text())["steps"]["box"]["outputs"]
    assert state["container_id"] == container.id and state["host"] == "ssh://enginehost"

    close_masters(ssh_engine["config"], ssh_engine["control"], hosts=("enginehost",))
    before = ssh_engine["server"].accepted()
    watch = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('sdk imported' if 'docker' in sys.modules else 'no sdk', file=sys.stderr))\n"
        "sys.argv = ['runner', 'apply']\n"
        "runpy.run_module('runner', run_name='__main__')\n"
    )
    again = subprocess.run(
        [sys.executable, "-c", watch], cwd=project.path, env=project.env(), capture_output=True, text=True
    )
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout + again.stderr
    assert "no sdk" in again.stderr, again.stderr
    assert ssh_engine["server"].accepted() - before == 1, "the engine and the assert share one connection"
    assert docker_client.containers.get(name).id == container.id

    container.stop(timeout=1)  # drift seen through the forwarded socket, and mended through it
    mended = project.run("apply")
    assert mended.code == 0 and "changed=1" in mended.out, mended.text
    assert docker_client.containers.get(name).status == "running"

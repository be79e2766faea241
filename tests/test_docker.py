"""The docker kind against a real Docker Engine (a private dockerd, the busybox image made by `docker import`)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BUSYBOX_IMAGE, Project, free_port


def _name(client: Any) -> str:
    name = f"rt-{uuid.uuid4().hex[:8]}"
    client.test_names.append(name)
    return name


def _server(project: Project, name: str, port: int, env: str = "A: '1'", extra: str = "") -> None:
    project.write(
        f"""
        steps:
          - name: web
            docker:
              name: {name}
              image: {BUSYBOX_IMAGE}
              pull: never
              command: [httpd, -f, -p, "8000", -h, /www]
              ports: ["127.0.0.1:{port}:8000"]
              env: {{{env}}}
              wait: {{http: "http://127.0.0.1:{port}/health", timeout: 20, interval: 0.2}}
              stop_timeout: 1
        {extra}
        """
    )


def _containers(client: Any, name: str) -> list[Any]:
    return [c for c in client.containers.list(all=True) if c.name == name]


def test_converge_then_noop_then_one_recreate_per_drift(project: Project, docker_client: Any) -> None:
    name = _name(docker_client)
    port = free_port()
    _server(project, name, port)
    first = project.run("apply")
    assert first.code == 0, first.text
    assert "changed  web" in first.out
    container = docker_client.containers.get(name)
    assert container.status == "running"
    assert container.labels["runner.config-hash"].startswith("v1:")
    assert container.attrs["Config"]["Env"].count("A=1") == 1
    record = json.loads((project.path / ".runner/state.json").read_text())["steps"]["web"]
    assert record["outputs"]["container_id"] == container.id
    assert record["outputs"]["ports"] == {"8000/tcp": [f"127.0.0.1:{port}"]}

    again = project.run("apply")
    assert again.code == 0, again.text
    assert "ok       web" in again.out
    assert docker_client.containers.get(name).id == container.id  # not recreated

    _server(project, name, port, env="A: '2'")
    plan = project.run("plan")
    assert plan.code == 2
    assert 'env.A: "1" -> "2"' in plan.out
    drifted = project.run("apply")
    assert drifted.code == 0, drifted.text
    live = _containers(docker_client, name)
    assert len(live) == 1 and live[0].id != container.id
    assert "A=2" in live[0].attrs["Config"]["Env"]

    port2 = free_port()
    _server(project, name, port2, env="A: '2'")
    moved = project.run("apply")
    assert moved.code == 0, moved.text
    live2 = _containers(docker_client, name)
    assert len(live2) == 1 and live2[0].id != live[0].id
    assert live2[0].attrs["HostConfig"]["PortBindings"]["8000/tcp"][0]["HostPort"] == str(port2)
    assert project.run("apply").out.count("ok       web") == 1


def test_stopped_by_hand_is_brought_back(project: Project, docker_client: Any) -> None:
    name = _name(docker_client)
    port = free_port()
    _server(project, name, port)
    assert project.run("apply").code == 0
    docker_client.containers.get(name).stop(timeout=1)
    plan = project.run("plan")
    assert plan.code == 2 and "not running" in plan.out
    result = project.run("apply")
    assert result.code == 0, result.text
    assert docker_client.containers.get(name).status == "running"
    assert len(_containers(docker_client, name)) == 1


def test_two_host_ports_onto_one_container_port(project: Project, docker_client: Any) -> None:
    name = _name(docker_client)
    a, b = free_port(), free_port()
    project.write(
        f"""
        steps:
          - name: web
            docker:
              name: {name}
              image: {BUSYBOX_IMAGE}
              command: [httpd, -f, -p, "8000", -h, /www]
              ports: ["127.0.0.1:{a}:8000", "127.0.0.1:{b}:8000"]
              wait: {{tcp: "127.0.0.1:{b}", timeout: 20, interval: 0.2}}
          - name: show
            run: "echo {{{{ steps.web.ports['8000/tcp'] | join(',') }}}} > ports.txt"
        """
    )
    result = project.run("apply")
    assert result.code == 0, result.text
    shown = (project.path / "ports.txt").read_text().strip().split(",")
    assert sorted(shown) == sorted([f"127.0.0.1:{a}", f"127.0.0.1:{b}"])


def test_host_port_in_use(project: Project, docker_client: Any) -> None:
    name = _name(docker_client)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        _server(project, name, port)
        result = project.run("apply")
    assert result.code == 1
    assert f"host port {port} is already in use" in result.out
    assert "Traceback" not in result.text


def test_container_that_exits_at_start_shows_its_logs(project: Project, docker_client: Any) -> None:
    name = _name(docker_client)
    project.write(
        f"""
        steps:
          - name: crashy
            docker:
              name: {name}
              image: {BUSYBOX_IMAGE}
              command: [sh, -c, "echo missing config file >&2; exit 3"]
        """
    )
    result = project.run("apply")
    assert result.code == 1
    assert "exited at start (exit code 3)" in result.out
    assert "missing config file" in result.out


def test_readiness_timeout_shows_last_answer(project: Project, docker_client: Any) -> None:
    name = _name(docker_client)
    port = free_port()
    project.write(
        f"""
        steps:
          - name: slow
            docker:
              name: {name}
              image: {BUSYBOX_IMAGE}
              command: [httpd, -f, -p, "8000", -h, /www]
              ports: ["127.0.0.1:{port}:8000"]
              wait: {{http: "http://127.0.0.1:{port}/not-there", timeout: 2, interval: 0.3}}
        """
    )
    result = project.run("apply")
    assert result.code == 1
    assert "not ready after 2s" in result.out
    assert "last answer: HTTP 404" in result.out


def test_privileged_reaches_host_config(project: Project, docker_client: Any) -> None:
    name = _name(docker_client)
    project.write(
        f"""
        steps:
          - name: priv
            docker:
              name: {name}
              image: {BUSYBOX_IMAGE}
              command: [sleep, "600"]
              privileged: true
              volumes: ["/dev:/dev"]
              restart: unless-stopped
        """
    )
    result = project.run("apply")
    # Privileged containers may fail to start on these machines ("unable to apply caps"); either way the
    # container was created with the privileged host config, and a failure says what happened.
    container = docker_client.containers.get(name)
    assert container.attrs["HostConfig"]["Privileged"] is True
    assert container.attrs["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"
    assert "/dev:/dev" in container.attrs["HostConfig"]["Binds"]
    if result.code != 0:
        assert "failed to start" in result.out and "docker inspect" in result.out


def test_no_engine_says_where_it_looked(project: Project) -> None:
    project.write(
        f"""
        steps:
          - name: web
            docker: {{name: x, image: {BUSYBOX_IMAGE}, host: "unix:///nonexistent/docker.sock"}}
        """
    )
    result = project.run("apply")
    assert result.code == 1
    assert "cannot reach the Docker Engine at unix:///nonexistent/docker.sock" in result.out
    assert "Traceback" not in result.text


@pytest.mark.parametrize("pull", ["never", "missing"])
def test_image_missing(project: Project, docker_client: Any, pull: str) -> None:
    name = _name(docker_client)
    project.write(
        f"""
        steps:
          - name: web
            docker: {{name: {name}, image: "runner-test/no-such-image:0", pull: {pull}}}
        """
    )
    result = project.run("apply")
    assert result.code == 1
    if pull == "never":
        assert "is not on the engine" in result.out and "pull: never" in result.out
    else:
        assert "pulling it failed" in result.out


def test_bad_port_spec_is_an_input_error(project: Project) -> None:
    project.write(
        """
        steps:
          - name: web
            docker:
              name: x
              image: busybox
              ports: ["8000:99999"]
        """
    )
    result = project.run("validate")
    assert result.code == 2
    assert "pipeline.yaml:6:" in result.err and "outside 1-65535" in result.err


def test_down_removes_the_container_it_made_and_only_that(project: Project, docker_client: Any) -> None:
    name = _name(docker_client)
    port = free_port()
    _server(project, name, port)
    assert project.run("apply").code == 0
    dry = project.run("down", "--dry-run")
    assert dry.code == 0 and f"would remove container {name}" in dry.out, dry.text
    assert docker_client.containers.get(name).status == "running"  # a dry run changes nothing
    down = project.run("down")
    assert down.code == 0 and f"removed container {name}" in down.out, down.text
    assert _containers(docker_client, name) == []
    assert json.loads((project.path / ".runner/state.json").read_text())["steps"] == {}
    assert project.run("down").out.strip() == "down: nothing to remove"
    # one of the same name that runner did not make is left, and said so
    docker_client.containers.run(BUSYBOX_IMAGE, ["sleep", "300"], name=name, detach=True)
    theirs = project.run("down")
    assert theirs.code == 0 and "runner did not create it" in theirs.out, theirs.text
    assert len(_containers(docker_client, name)) == 1


def test_two_pipelines_with_one_container_name_do_not_fight(
    project: Project, docker_client: Any, tmp_path: Path
) -> None:
    name = _name(docker_client)
    port = free_port()
    _server(project, name, port)
    assert project.run("apply").code == 0
    first_id = docker_client.containers.get(name).id
    other = Project(tmp_path / "other")
    other.path.mkdir()
    _server(other, name, port, env="A: '2'")
    plan = other.run("plan")
    assert plan.code == 2 and "x fail" in plan.out and "belongs to another pipeline" in plan.out, plan.out
    applied = other.run("apply")
    assert applied.code == 1 and "belongs to another pipeline" in applied.out, applied.text
    assert docker_client.containers.get(name).id == first_id  # not recreated by the other pipeline
    again = project.run("apply")
    assert again.code == 0 and "ok       web" in again.out, again.text  # nor is it fought over on the next apply
    assert docker_client.containers.get(name).id == first_id
    assert "belongs to another pipeline" in other.run("down").out
    assert docker_client.containers.get(name).id == first_id


def _by_hand(client: Any, name: str, port: int, env: dict[str, str], labels: dict[str, str] | None = None) -> Any:
    """`docker run -d --name NAME ...` as the tutorial does it: the user's container, not runner's."""
    return client.containers.run(
        BUSYBOX_IMAGE,
        ["httpd", "-f", "-p", "8000", "-h", "/www"],
        name=name,
        detach=True,
        environment=env,
        ports={"8000/tcp": ("127.0.0.1", port)},
        labels=labels or {},
    )


def test_a_container_runner_did_not_make_is_never_replaced_unasked(project: Project, docker_client: Any) -> None:
    """The user's own container of the step's name (issue 18, item 2): plan says it fails, apply refuses and
    leaves it, `mark-done` adopts it when it matches the spec, and only `--force` replaces one that does not."""
    name = _name(docker_client)
    port = free_port()
    theirs = _by_hand(docker_client, name, port, {"A": "1"})
    _server(project, name, port)
    plan = project.run("plan")
    assert plan.code == 2 and "x fail" in plan.out and "that runner did not create" in plan.out, plan.text
    refused = project.run("apply")
    assert refused.code == 1 and "runner does not replace it" in refused.out, refused.text
    assert "mark-done web" in refused.out and "--force web" in refused.out
    assert docker_client.containers.get(name).id == theirs.id

    adopted = project.run("mark-done", "web")
    assert adopted.code == 0, adopted.text
    again = project.run("apply")
    assert again.code == 0 and "changed=0" in again.out, again.text
    assert docker_client.containers.get(name).id == theirs.id

    theirs.stop(timeout=1)  # an adopted container is judged by its live state, as runner's own are
    plan = project.run("plan")
    assert "is exited" in plan.out and "+ run" in plan.out, plan.text
    theirs.start()
    assert "nothing to do" in project.run("plan").out
    _server(project, name, port, env="A: '2'")  # the spec moves on: the adopted container is replaced
    plan = project.run("plan")
    assert 'spec changed: env.A: "1" -> "2"' in plan.out, plan.text
    assert project.run("apply").code == 0
    replaced = docker_client.containers.get(name)
    assert replaced.id != theirs.id and "runner.config-hash" in replaced.labels


def test_a_container_that_does_not_match_is_adopted_only_by_force(project: Project, docker_client: Any) -> None:
    name = _name(docker_client)
    port = free_port()
    theirs = _by_hand(docker_client, name, port, {"A": "other"})
    _server(project, name, port)
    refused = project.run("mark-done", "web")
    assert refused.code == 1 and "does not match the spec: env.A: differs" in refused.text, refused.text
    assert "other" not in refused.text  # env values are never shown
    assert docker_client.containers.get(name).id == theirs.id
    forced = project.run("apply", "--force", "web")
    assert forced.code == 0, forced.text
    assert docker_client.containers.get(name).id != theirs.id


def test_labels_copied_by_hand_do_not_hide_a_different_container(project: Project, docker_client: Any) -> None:
    """Drift is judged from the live configuration too, not from the labels alone (issue 18, item 4)."""
    name = _name(docker_client)
    port = free_port()
    _server(project, name, port)
    assert project.run("apply").code == 0
    ours = docker_client.containers.get(name)
    labels = dict(ours.labels)
    ours.remove(force=True)
    _by_hand(docker_client, name, port, {"A": "changed by hand"}, labels)  # runner's labels, another env
    plan = project.run("plan")
    assert "live configuration differs from its labels: env.A: differs" in plan.out, plan.text
    assert project.run("apply").code == 0
    assert "A=1" in docker_client.containers.get(name).attrs["Config"]["Env"]


def test_a_local_engine_is_read_without_the_sdk_and_judged_as_the_sdk_judges(
    project: Project, docker_client: Any, docker_host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A converged run reads a unix-socket engine with the standard library (steps/_support/docker_light.py); the
    SDK reads the same engine when the address is written `http+unix://` (docker/utils/utils.py parse_host takes
    it as unix). Both must come to the same plan in each state the container can be left in."""
    if not docker_host.startswith("unix:///"):
        pytest.skip("the engine is not on a local unix socket")
    through_sdk = "http+unix://" + docker_host[len("unix://") :]
    name = _name(docker_client)
    port = free_port()
    _server(project, name, port)
    assert project.run("apply").code == 0

    watch = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('sdk imported' if 'docker' in sys.modules else 'no sdk', file=sys.stderr))\n"
        "sys.argv = ['runner', 'apply']\n"
        "runpy.run_module('runner', run_name='__main__')\n"
    )
    proc = subprocess.run([sys.executable, "-c", watch], cwd=project.path, env=project.env(), capture_output=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert b"ok       web" in proc.stdout and b"no sdk" in proc.stderr

    def plans() -> list[tuple[int, str]]:
        seen = []
        for host in (docker_host, through_sdk):
            monkeypatch.setenv("DOCKER_HOST", host)
            result = project.run("plan")
            seen.append((result.code, result.out.replace(host, "ENGINE")))
        monkeypatch.setenv("DOCKER_HOST", docker_host)
        return seen

    converged = plans()
    assert converged[0] == converged[1] and converged[0][0] == 0, converged
    docker_client.containers.get(name).stop(timeout=1)
    stopped = plans()
    assert stopped[0] == stopped[1] and "not running" in stopped[0][1], stopped
    docker_client.containers.get(name).remove(force=True)
    gone = plans()
    assert gone[0] == gone[1] and f"no container named {name} on ENGINE" in gone[0][1], gone

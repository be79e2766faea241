"""kill -9 at many points of an apply across the kinds, then apply again: nothing lost, nothing done twice.

The kill points are named crash points in the code (RUNNER_FAULT=NAME:N, runner/util/faults.py: after a step's
start is recorded, after its work and before its result is recorded, in the middle of a journal append,
before a snapshot's rename, between a clone and its rename into place, between removing a container and
creating its successor) and kills at moments picked by the clock. After each: the state loads, the next
apply converges, a third finds nothing to do, no step recorded done before the crash runs again, every
clone is whole, and there is exactly one container of the name.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BUSYBOX_IMAGE, Project, processes_in
from gitrepos import Upstream, git
from wheels import make_wheel

from runner.state import StateStore

CLONES = ("clone_a", "clone_b", "clone_c")
LOOP_ITEMS = ("p", "q", "r")
COUNTED = ("first", "last", "helpers", *(f"loop-{i}" for i in LOOP_ITEMS))
# a step with helpers outside its process group: one setsid'd, one double-forked; it stops them itself when it
# ends well, and a crash must not leave them behind (the guardian stops them). The kill "while the helpers run"
# lands in that window for sure (test_kill_while_helpers_run_leaves_none_of_them), so the window can be short:
# it is on every case's path.
HELPERS = (
    "setsid sleep 97771 & echo $! > helpers.pid; (setsid sh -c 'echo $$ >> helpers.pid; exec sleep 97772' &); "
    "echo 1 >> helpers.count; while [ $(wc -l < helpers.pid) -lt 2 ]; do sleep 0.05; done; sleep 0.3; "
    "kill $(cat helpers.pid); touch helpers.out"
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("crash-world")
    upstream = Upstream(root)
    head = ""
    for i in range(3):
        head = upstream.commit(f"file{i}.txt", os.urandom(200_000))  # big enough that a clone takes a moment
    wheels = root / "wheels"
    make_wheel(wheels, "crashpkg", "1.0")
    venv = root / "venv-template"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    return {"url": upstream.url, "head": head, "wheels": wheels, "venv": venv}


@pytest.fixture(scope="module")
def engine_host(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The tests' Docker Engine (conftest's docker_host: it fails under CI=true without one); elsewhere, without
    an engine, None: the container step is left out and the other kinds are still killed."""
    import docker

    try:
        host = request.getfixturevalue("docker_host")
    except pytest.skip.Exception:
        yield None
        return
    yield host
    client = docker.DockerClient(base_url=host, timeout=60)
    for container in client.containers.list(all=True, filters={"label": "runner.step=box"}):
        container.remove(force=True)
    client.close()


def pipeline(world: dict[str, Any], host: str | None, container: str) -> str:
    clones = "\n".join(
        f"""  - name: {name}
    needs: []
    git: {{url: "{world["url"]}", dest: {name}, ref: main}}"""
        for name in CLONES
    )
    box = (
        f"""  - name: box
    needs: []
    docker:
      name: {container}
      image: {BUSYBOX_IMAGE}
      pull: never
      command: [sleep, "3600"]
      stop_timeout: 0  # sleep as pid 1 ignores SIGTERM: a recreate would wait out a grace that proves nothing here
      env: {{GEN: "{{{{ vars.gen }}}}"}}
      host: {host}
"""
        if host
        else ""
    )
    return f"""name: crash
vars: {{gen: "1"}}
steps:
  - name: first
    needs: []
    run: {{command: "echo 1 >> first.count && sleep 0.2 && echo done > first.out", creates: [first.out]}}
{clones}
  - name: helpers
    needs: []
    run: {{command: "{HELPERS}", creates: [helpers.out]}}
  - name: deps
    needs: []
    pip: {{python: venv/bin/python, packages: [crashpkg], no_index: true, find_links: ["{world["wheels"]}"]}}
  - name: loop
    needs: [first]
    for_each: {list(LOOP_ITEMS)}
    run:
      command: "echo 1 >> loop-{{{{ item }}}}.count && sleep 0.1 && touch {{{{ item }}}}.out"
      creates: ["{{{{ item }}}}.out"]
{box}  - name: last
    needs: [clone_a, deps, loop, helpers]
    run: {{command: "echo 1 >> last.count && echo done > last.out", creates: [last.out]}}
"""


def helpers_running(path: Path) -> list[str]:
    return [argv for argv in processes_in(path).values() if argv.startswith("sleep 977")]


def counts(path: Path) -> dict[str, int]:
    return {
        name: len((path / f"{name}.count").read_text().splitlines()) if (path / f"{name}.count").exists() else 0
        for name in COUNTED
    }


def done_steps(path: Path) -> set[str]:
    store = StateStore(path / ".runner").load()  # must never fail, whatever the crash left
    if (path / ".runner" / "state.json").exists():
        json.loads((path / ".runner" / "state.json").read_text())  # the snapshot always parses
    done = {name for name, rec in store.steps.items() if rec.get("status") == "done"}
    return {("loop-" + n[5:-1]) if n.startswith("loop[") else n for n in done}


def check_converged(project: Project, world: dict[str, Any], host: str | None, container: str, gen: str) -> None:
    for name in CLONES:
        assert git("rev-parse", "HEAD", cwd=project.path / name) == world["head"], f"{name} is not whole"
        assert git("status", "--porcelain", cwd=project.path / name) == ""
        assert not list(project.path.glob(f".{name}.runner-clone-*")), "a half clone was left behind"
    if host:
        import docker

        client = docker.DockerClient(base_url=host, timeout=60)
        same_name = [c for c in client.containers.list(all=True) if c.name == container]
        assert len(same_name) == 1, f"{len(same_name)} containers named {container}"
        assert f"GEN={gen}" in same_name[0].attrs["Config"]["Env"]
        client.close()


def crash_case(
    tmp_path: Path, world: dict[str, Any], host: str | None, fault: str | None, delay: float | None
) -> dict[str, Any]:
    project = Project(tmp_path)
    shutil.copytree(world["venv"], tmp_path / "venv", symlinks=True)
    container = f"runner-crash-{os.getpid()}-{tmp_path.name[-12:]}".replace("_", "-")
    project.write(pipeline(world, host, container))
    gen = "1"
    if fault == "docker-removed:1":  # a recreate is what this point interrupts: converge first, then drift
        assert project.run("apply").code == 0
        gen = "2"
    env = {**project.env(), **({"RUNNER_FAULT": fault} if fault else {})}
    proc = subprocess.Popen(
        [*project.argv("apply", "--var", f"gen={gen}")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    if delay == HELPERS_RUN:  # a moment told by what has happened: both helpers started, the step not ended
        deadline = time.monotonic() + 60
        while len(helpers_running(tmp_path)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the helpers never both ran"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
    elif delay is not None:
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)
    code = proc.wait(timeout=300)
    killed = code == -signal.SIGKILL
    deadline = time.monotonic() + 15
    while helpers_running(tmp_path):  # the guardian stops what the steps running at the kill had started
        assert time.monotonic() < deadline, f"left running after {fault or delay}: {helpers_running(tmp_path)}"
        time.sleep(0.05)
    before = counts(tmp_path)
    done_before = done_steps(tmp_path)

    # the recovery runs with -j 4: what it must not redo or half-do is the same, and the branches overlap
    again = project.run("apply", "-j", "4", "--var", f"gen={gen}", timeout=300)
    assert again.code == 0, f"after {fault or delay}: {again.text}"
    after = counts(tmp_path)
    for name in COUNTED:
        if name in done_before:
            assert after[name] == before[name], f"{name} was done before the crash and ran again"
        assert after[name] <= 2, f"{name} ran {after[name]} times"
    third = project.run("apply", "--var", f"gen={gen}")
    assert third.code == 0 and "changed=0" in third.out, third.text
    check_converged(project, world, host, container, gen)
    assert not helpers_running(tmp_path)
    return {"killed": killed, "done_before": len(done_before)}


FAULTS = [
    *(f"started:{n}" for n in range(1, 8)),
    *(f"applied:{n}" for n in range(1, 8)),
    *(f"journal-torn:{n}" for n in (1, 2, 3, 5, 8, 13)),
    "snapshot:1",
    *(f"git-cloned:{n}" for n in (1, 2, 3)),
    "docker-removed:1",
]
DELAYS = [0.15, 0.4, 0.8, 1.3, 2.0]
HELPERS_RUN = -1.0  # as a delay: kill while the helpers step's two helpers run


@pytest.mark.parametrize("fault", FAULTS)
def test_kill_at_a_crash_point_loses_nothing(
    fault: str, tmp_path: Path, world: dict[str, Any], engine_host: str | None
) -> None:
    if fault.startswith("docker") and engine_host is None:
        pytest.skip("no Docker Engine")
    outcome = crash_case(tmp_path, world, engine_host, fault, None)
    assert outcome["killed"], f"the run never reached {fault}"  # each chosen point is on the path


@pytest.mark.parametrize("delay", DELAYS)
def test_kill_at_a_moment_loses_nothing(
    delay: float, tmp_path: Path, world: dict[str, Any], engine_host: str | None
) -> None:
    crash_case(tmp_path, world, engine_host, None, delay)


def test_kill_while_helpers_run_leaves_none_of_them(
    tmp_path: Path, world: dict[str, Any], engine_host: str | None
) -> None:
    """Helpers a step started outside its process group, killed with runner while they run: the guardian stops
    both (crash_case waits for that), and the next apply runs the step again, once."""
    outcome = crash_case(tmp_path, world, engine_host, None, HELPERS_RUN)
    assert outcome["killed"] and counts(tmp_path)["helpers"] == 2

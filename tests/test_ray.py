"""launch onto a real Ray head on 127.0.0.1 (ray[default] from PyPI, in a venv of the tests only), through the
Jobs REST API: submitted once, adopted while running, not resubmitted after success, resubmitted after a
failure, its logs shown, stopped by `runner stop` (and left stopped), and a secret in its env refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Project, free_port


def _jobs(address: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{address}/api/jobs/", timeout=10) as answer:
        return [j for j in json.loads(answer.read()) if j.get("submission_id", "").startswith("runner-")]


def _wait_status(address: str, sid: str, wanted: set[str], timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{address}/api/jobs/{sid}", timeout=10) as answer:
            status = json.loads(answer.read())["status"]
        if status in wanted:
            return status
        time.sleep(0.5)
    raise AssertionError(f"{sid} stayed {status}, not {wanted}")


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    venv = os.environ.get("RUNNER_TEST_RAY_VENV")
    if not venv:
        venv = str(tmp_path_factory.mktemp("ray-venv"))
        # uv (a dependency of runner): ~2 s where pip takes ~27 s for Ray's 50 packages; told this machine's pip
        # configuration (indexes, find-links, constraints) the way the pip kind tells it
        from uv import find_uv_bin

        from steps._support.installer import pip_settings, uv_arguments

        uv = find_uv_bin()
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, venv], check=True)
        args, variables, _ = uv_arguments(pip_settings(os.environ, sys.prefix), has_index=False)
        installed = subprocess.run(
            [uv, "pip", "install", "-q", "--python", f"{venv}/bin/python", *args, "ray[default]"],
            capture_output=True,
            text=True,
            timeout=1200,
            env={**os.environ, **variables},
        )
        if installed.returncode != 0:
            reason = f"cannot install ray[default]: {installed.stderr[-300:]}"
            if os.environ.get("CI") == "true":
                pytest.fail(reason)
            pytest.skip(reason)
    ray = f"{venv}/bin/ray"
    gcs, dashboard = free_port(), free_port()
    temp = f"/tmp/rayt-{os.getpid()}"  # short: Ray's unix sockets live under it
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    started = subprocess.run(
        [
            ray,
            "start",
            "--head",
            f"--port={gcs}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            "--include-dashboard=true",
            "--num-cpus=2",
            "--disable-usage-stats",
            f"--temp-dir={temp}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    address = f"http://127.0.0.1:{dashboard}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{address}/api/version", timeout=3):
                break
        except OSError:
            assert time.monotonic() < deadline, "the Ray dashboard never answered"
            time.sleep(0.5)
    yield address
    subprocess.run([ray, "stop", "--force"], capture_output=True, env=env, timeout=120)


def _pipeline(project: Project, address: str, command: str, extra: str = "") -> None:
    project.write(
        f"""
        name: ray
        secrets: [token]
        vars: {{token: "tok-ray-5ecret"}}
        steps:
          - name: train
            launch:
              command: "{command}"
              env: {{STAGE: smoke{extra}}}
              ray: {{address: "{address}", entrypoint_num_cpus: 0.1}}
        """
    )


def test_submitted_once_adopted_not_resubmitted_after_success_resubmitted_after_failure(
    project: Project, ray_head: str
) -> None:
    before = {j["submission_id"] for j in _jobs(ray_head)}
    _pipeline(project, ray_head, "echo started $STAGE; sleep 6; echo finished")
    first = project.run("apply")
    assert first.code == 0, first.text
    job = json.loads((project.path / ".runner" / "jobs" / "train.json").read_text())
    sid = job["submission_id"]
    assert sid.startswith("runner-train-") and sid.endswith("-1")

    running = project.run("apply")  # while it runs: adopted, nothing submitted
    assert running.code == 0 and "changed=0" in running.out, running.text
    assert f"{sid} is" in running.out
    assert {j["submission_id"] for j in _jobs(ray_head)} - before == {sid}

    _wait_status(ray_head, sid, {"SUCCEEDED"})
    done = project.run("apply")
    assert done.code == 0 and "SUCCEEDED" in done.out and "changed=0" in done.out, done.text
    assert {j["submission_id"] for j in _jobs(ray_head)} - before == {sid}  # not resubmitted

    logs = project.run("logs", "train")
    assert logs.code == 0 and "started smoke" in logs.out and "finished" in logs.out, logs.text

    # A failing job: the next apply resubmits it under the next id.
    _pipeline(project, ray_head, "echo failing; exit 3")
    project.run("apply")
    failing = json.loads((project.path / ".runner" / "jobs" / "train.json").read_text())["submission_id"]
    assert failing != sid
    _wait_status(ray_head, failing, {"FAILED"})
    plan = project.run("plan")
    assert plan.code == 2 and "FAILED" in plan.out
    again = project.run("apply")
    assert again.code == 0, again.text
    retried = json.loads((project.path / ".runner" / "jobs" / "train.json").read_text())["submission_id"]
    assert retried == failing[:-1] + "2"
    assert {j["submission_id"] for j in _jobs(ray_head)} - before == {sid, failing, retried}


def test_runner_stop_stops_it_and_it_stays_stopped(project: Project, ray_head: str) -> None:
    _pipeline(project, ray_head, "sleep 120", extra="-stop")
    assert project.run("apply").code == 0
    sid = json.loads((project.path / ".runner" / "jobs" / "train.json").read_text())["submission_id"]
    _wait_status(ray_head, sid, {"RUNNING"})
    stopped = project.run("stop", "train")
    assert stopped.code == 0 and f"stopped {sid}" in stopped.out, stopped.text
    _wait_status(ray_head, sid, {"STOPPED"})
    after = project.run("apply")
    assert after.code == 0 and "changed=0" in after.out and "runner stop" in after.out, after.text
    assert all(j["submission_id"] != sid[:-1] + "2" for j in _jobs(ray_head))


def test_a_secret_in_the_jobs_env_is_refused(project: Project, ray_head: str) -> None:
    before = len(_jobs(ray_head))
    project.write(
        f"""
        name: ray
        secrets: [token]
        vars: {{token: "tok-ray-5ecret"}}
        steps:
          - name: train
            launch:
              command: "echo hi"
              env: {{E2B_API_KEY: "{{{{ vars.token }}}}"}}
              ray: {{address: "{ray_head}"}}
        """
    )
    plan = project.run("plan")
    assert "would fail" in plan.out and "plain text" in plan.out
    result = project.run("apply")
    assert result.code == 1 and "Ray keeps the entrypoint and runtime_env in plain text" in result.out
    assert "tok-ray-5ecret" not in result.text
    assert len(_jobs(ray_head)) == before  # nothing was submitted


def test_an_unreachable_cluster_names_its_address(project: Project) -> None:
    address = f"http://127.0.0.1:{free_port()}"
    _pipeline(project, address, "echo hi")
    result = project.run("apply")
    assert result.code == 1 and f"cannot reach the Ray Jobs API at {address}" in result.out, result.text


def test_the_multinode_example_loads() -> None:
    root = Path(__file__).resolve().parent.parent
    project = Project(root / "examples" / "multinode")
    result = project.run("validate")
    assert result.code == 0, result.text


def test_the_multinode_launcher_runs_on_the_head_as_upstream_runs_it() -> None:
    """Upstream's multi-node scripts (glm52_tbench2/launch_16node_slurm.sh) start the launcher on the Ray head
    with MILES_SCRIPT_EXTERNAL_RAY=1, MASTER_ADDR and --num-nodes: it is not a Ray Jobs entrypoint."""
    import yaml

    root = Path(__file__).resolve().parent.parent
    steps = {
        s["name"]: s for s in yaml.safe_load((root / "examples" / "multinode" / "pipeline.yaml").read_text())["steps"]
    }
    train = steps["train"]
    assert "launch" in train and "ray_job" not in train
    command, env = train["launch"]["command"], train["launch"]["env"]
    for option in ("--prompt-data", "--num-nodes", "--num-gpus-per-node"):
        assert option in command, option
    assert not any("_" in part for part in command if part.startswith("--"))  # typer options have dashes
    assert env["MILES_SCRIPT_EXTERNAL_RAY"] == "1" and env["MASTER_ADDR"] == "{{ vars.ray_head }}"
    assert env["OPENENV_SANDBOX_BACKEND"] == "agentenv" and "E2B_API_KEY_FILE" in env
    assert "E2B_API_KEY" not in env  # only the file's path reaches the job
    # the launcher runs ON the head (over ssh from the control machine), in the miles checkout (the script's
    # `cd $MILES_ROOT`), once every node's GPUs have joined (its `ray status` poll)
    assert train["host"] == "{{ vars.head_ssh }}" and train["launch"]["cwd"] == "{{ steps.miles.path }}"
    assert "ray_nodes" in train["needs"] and "ray_jobs_api" in steps["ray_nodes"]["needs"]
    nodes = steps["ray_nodes"]
    assert nodes["host"] == "{{ vars.head_ssh }}" and "ray status" in nodes["assert"]["command"]
    assert nodes["retries"] * nodes["retry_delay"] == 900  # upstream: 90 polls, 10 s apart
    assert steps["ray_jobs_api"]["host"] == "{{ vars.head_ssh }}"
    assert "127.0.0.1:8265" in steps["ray_jobs_api"]["wait"]["http"]
    # the AgentENV host's prerequisites are checked on that host; the env is installed on every training node
    for name in ("aenv_kernel", "aenv_kvm", "aenv_ublk", "aenv_sysctls"):
        assert steps[name]["host"] == "{{ vars.aenv_ssh }}", name
        assert name in steps["aenv"]["needs"]
    assert steps["tbench2_env"]["for_each"] == "{{ [vars.head_ssh] + vars.workers_ssh }}"
    assert steps["tbench2_env"]["host"] == "{{ item }}"

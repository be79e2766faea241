"""The top-level pipeline.yaml (the tutorial) loads, and plans on a machine without Docker, KVM or network."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, Project

STEPS = [
    "kernel",
    "kvm",
    "host_setup",
    "ublk",
    "host_sysctls",
    "server_address",
    "aenv_key",
    "aenv",
    "aenv_api",
    "e2b_settings",
    "e2b_sdk",
    "sandbox_check",
    "miles",
    "openenv",
    "openenv_recent",
    "terminal_bench_2",
    "tbench2_env",
    "tbench2_env_recent",
    "data",
    "gpus",
    "train_env",
    "train",
]
# What docker-setup.sh writes (AgentENV scripts/docker-setup.sh, docs/upstream.md), as host_sysctls checks it.
SYSCTLS = {
    "net.ipv4.neigh.default.gc_thresh1": 4096,
    "net.ipv4.neigh.default.gc_thresh2": 8192,
    "net.ipv4.neigh.default.gc_thresh3": 16384,
    "net.netfilter.nf_conntrack_max": 1048576,
    "kernel.pid_max": 4194304,
    "fs.inotify.max_user_instances": 8192,
}
AGENTENV_PREREQUISITES = ("kernel", "kvm", "ublk", "host_sysctls", "server_address")
NEEDS_THE_CONTAINER = ("aenv", "aenv_api", "e2b_sdk", "sandbox_check", "train")
INDEPENDENT = ("miles", "openenv", "openenv_recent", "terminal_bench_2", "tbench2_env", "tbench2_env_recent", "data")
PLAN_WORDS = {"+": "run", "~": "maybe", "x": "fail", "-": "block", "!": "restart"}


def sysctl_low() -> bool:
    for key, minimum in SYSCTLS.items():
        path = Path("/proc/sys") / key.replace(".", "/")
        try:
            if int(path.read_text().split()[0]) < minimum:
                return True
        except (OSError, ValueError):
            return True
    return False


def host_failures() -> dict[str, bool]:
    release = tuple(int(p) for p in platform.release().split("-")[0].split(".")[:2])
    return {
        "kernel": release < (6, 8),
        "kvm": not os.path.exists("/dev/kvm"),
        "ublk": not os.path.exists("/sys/module/ublk_drv"),
        "host_sysctls": sysctl_low(),
        "gpus": shutil.which("nvidia-smi") is None,
        "train_env": not all(importlib.util.find_spec(m) for m in ("typer", "ray", "httpx", "pydantic", "torch")),
    }


def plan_lines(output: str) -> dict[str, tuple[str, str]]:
    """step -> (action, the whole line), from `runner plan`'s text."""
    found: dict[str, tuple[str, str]] = {}
    for line in output.splitlines():
        parts = line.split()
        if not parts or line.startswith("plan:"):
            continue
        if parts[0] in PLAN_WORDS:
            found[parts[2]] = (PLAN_WORDS[parts[0]], line)
        else:  # "  ok  name" / "  skip  name"
            found[parts[1]] = (parts[0], line)
    return found


def apply_statuses(output: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("ok", "changed", "FAILED", "blocked", "skipped"):
            found[parts[1]] = parts[0]
    return found


def flagship(tmp_path: Path) -> Project:
    shutil.copy(ROOT / "pipeline.yaml", tmp_path / "pipeline.yaml")
    return Project(tmp_path)


def test_flagship_validates(tmp_path: Path) -> None:
    result = flagship(tmp_path).run("validate")
    assert result.code == 0, result.text
    assert f"({len(STEPS)} steps)" in result.text


def test_flagship_plans_without_docker_and_names_the_failing_prerequisites(tmp_path: Path) -> None:
    project = flagship(tmp_path)
    env = project.env()
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-docker.sock"  # no engine
    env["HTTPS_PROXY"] = env["HTTP_PROXY"] = "http://127.0.0.1:9"  # and no network, should plan try to reach one
    project.env = lambda: env  # type: ignore[method-assign]
    result = project.run("plan", "--var", "server=127.0.0.1")
    assert result.code == 2, result.text  # changes pending, not an error
    assert "Traceback" not in result.text
    lines = plan_lines(result.out)
    assert list(lines) == STEPS
    failures = host_failures()
    for name, fails in failures.items():
        action, line = lines[name]
        if fails:
            assert action == "fail" and "would fail" in line, line
        else:
            assert action == "run", line
    if failures["ublk"]:
        assert "sudo modprobe ublk_drv" in lines["ublk"][1]
    if failures["host_sysctls"]:
        assert "docker-setup.sh" in lines["host_sysctls"][1] and "below" in lines["host_sysctls"][1]
    if failures["gpus"]:
        assert "nvidia-smi is not on PATH" in lines["gpus"][1]
    if failures["train_env"]:  # what the launcher imports, looked up in the training interpreter
        assert (
            "is not a Miles training environment" in lines["train_env"][1] and "does not find" in lines["train_env"][1]
        )
    assert lines["host_setup"][0] == "skip"  # it changes the host: only with --var setup_host=true
    container_blocked = any(failures[name] for name in AGENTENV_PREREQUISITES if name in failures)
    for name in NEEDS_THE_CONTAINER:
        blocked = container_blocked or (name == "train" and (failures["gpus"] or failures["train_env"]))
        assert (lines[name][0] == "block") == blocked, lines[name][1]
        if blocked:
            assert "blocked: " in lines[name][1] and "would fail" in lines[name][1]
    for name in INDEPENDENT:  # nothing ties the clones, installs and data to the container
        assert lines[name][0] in ("run", "maybe"), lines[name][1]
    failing = [n for n in STEPS if n in failures and failures[n]]
    if failing:
        assert "would fail now: " + ", ".join(failing) in result.out


def test_a_host_name_for_server_is_refused_by_plan(tmp_path: Path) -> None:
    result = flagship(tmp_path).run("plan", "--var", "server=aenv-host.internal")
    lines = plan_lines(result.out)
    assert lines["server_address"][0] == "fail", lines["server_address"][1]
    assert "not a host name ('aenv-host.internal')" in lines["server_address"][1]
    assert lines["aenv"][0] == "block" and "server_address" in lines["aenv"][1]
    assert plan_lines(flagship(tmp_path).run("plan", "--var", "server=10.1.2.3").out)["server_address"][0] == "run"


def rehearsal_git_config(tmp_path: Path) -> Path:
    """The flagship's GitHub URLs answered by the quickstart's look-alike bundles, with no network."""
    repos = ROOT / "examples" / "quickstart" / "repos"
    config = tmp_path / "gitconfig"
    urls = {
        "miles": "https://github.com/radixark/miles.git",
        "OpenEnv": "https://github.com/huggingface/OpenEnv.git",
        "terminal-bench-2": "https://github.com/laude-institute/terminal-bench-2.git",
    }
    config.write_text(
        "[user]\n\tname = t\n\temail = t@example.invalid\n"
        + "".join(f'[url "{repos / name}.bundle"]\n\tinsteadOf = {url}\n' for name, url in urls.items())
    )
    return config


def test_flagship_apply_keep_going_does_exactly_what_plan_said(tmp_path: Path) -> None:
    """On this host (no ublk, low sysctls, no GPUs), in a network namespace of its own: plan, then
    `apply -j 4 --keep-going` fails and blocks the same steps, and still clones, installs and prepares data."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"]).returncode != 0:
        if os.environ.get("CI") == "true":  # as the Docker tests: under CI a missing prerequisite fails
            pytest.fail("needs `unshare -n` (a network namespace of the test's own)")
        pytest.skip("needs `unshare -n` (a network namespace of the test's own)")
    project = flagship(tmp_path)
    venv = tmp_path / "train-env"  # the training interpreter: this one's packages (typer, Tap, openai) and pip
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = project.env()
    env["GIT_CONFIG_GLOBAL"] = str(rehearsal_git_config(tmp_path))
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-docker.sock"
    env["PIP_NO_INDEX"] = "1"
    variables = ["--var", f"python={venv}/bin/python", "--var", f"data={tmp_path}/tbench2_train.jsonl"]
    if not any(host_failures()[n] for n in ("kernel", "kvm", "ublk", "host_sysctls")):
        variables += ["--var", "server=aenv-host.internal"]  # a host with every prerequisite: make one fail
    else:
        variables += ["--var", "server=127.0.0.1"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["unshare", "-n", *project.argv(*args)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    plan = run("plan", *variables)
    assert plan.returncode == 2, plan.stdout + plan.stderr
    planned = plan_lines(plan.stdout)
    would_fail = {n for n, (action, _) in planned.items() if action == "fail"}
    would_block = {n for n, (action, _) in planned.items() if action == "block"}
    assert would_fail and would_block

    applied = run("apply", "-j", "4", "--keep-going", *variables)
    assert applied.returncode == 1, applied.stdout + applied.stderr
    statuses = apply_statuses(applied.stdout)
    assert {n for n, s in statuses.items() if s == "FAILED"} == would_fail, applied.stdout
    assert {n for n, s in statuses.items() if s == "blocked"} == would_block, applied.stdout
    for name in INDEPENDENT:  # checks that pass are ok; clones, installs and data ran
        assert statuses[name] == ("ok" if name.endswith("_recent") else "changed"), (name, applied.stdout)
    rows = (tmp_path / "tbench2_train.jsonl").read_text().splitlines()
    assert len(rows) == 4  # the look-alike Terminal-Bench-2 has four tasks
    assert (tmp_path / "miles" / "examples" / "experimental" / "openenv" / "run-openenv-tbench2.py").is_file()
    assert "Traceback" not in applied.stdout + applied.stderr


def test_flagship_encodes_the_tutorial() -> None:
    text = (ROOT / "pipeline.yaml").read_text()
    for needle in (
        "privileged: true",
        '"/dev:/dev"',
        '"8000:8000", "80:8000"',
        "AENV_SANDBOX_PROXY_DOMAINS",
        ".sslip.io",
        "AENV_API_KEY",
        "/workspace/env/secrets/api-key",
        "http://127.0.0.1:8000/health",
        "status: [204]",
        "E2B_API_URL",
        "E2B_SANDBOX_URL",
        "E2B_API_KEY",
        "OPENENV_E2B_URL_SCHEME: http",
        "e2b<2.51",
        "04d259ea6",
        "TB2_WITHHOLD_TESTS",
        "server/tbench2_env_environment.py",
        "depth: 1",
        "--tasks_dir",
        "--output",
        "--n 8",
        "OPENENV_TB2_TASKS_DIR",
        "OPENENV_SANDBOX_BACKEND: agentenv",
        "run-openenv-tbench2.py",
        "- --prompt-data",
        "- --num-gpus-per-node",
        '- "{{ vars.gpus }}"',
        'PYTHONPATH: "{{ steps.miles.path }}"',
        "template_image:",
        "gc_thresh3",
    ):
        assert needle in text, needle
    assert "--prompt_data" not in text.replace("`--prompt_data` exits 2", "")


@pytest.mark.parametrize(("mode", "expected"), [((), "v2"), (("--v1-only",), "v1")], ids=["after-306", "before-306"])
def test_aenv_api_tells_the_routes_apart_and_creates_nothing(
    tmp_path: Path, mode: tuple[str, ...], expected: str
) -> None:
    """The flagship's aenv_api probe, run as written against the stand-in in both of AgentENV's modes."""
    import yaml
    from standin import standin

    steps = {s["name"]: s for s in yaml.safe_load((ROOT / "pipeline.yaml").read_text())["steps"]}
    probe = steps["aenv_api"]["capture"]["command"][1:]  # [-c, source]
    key = "e2b_" + "7e57" * 8
    with standin(tmp_path, key, "--templates", "base", *mode) as url:
        env = {**os.environ, "AENV_URL": url, "AENV_KEY": key}
        answer = subprocess.run([sys.executable, *probe], env=env, capture_output=True, text=True, timeout=60)
        assert answer.returncode == 0 and answer.stdout.strip() == expected, answer
        request = urllib.request.Request(url + "/sandboxes", headers={"X-API-Key": key})
        with urllib.request.urlopen(request, timeout=10) as listing:
            assert json.load(listing) == []  # the empty body created no sandbox
        wrong = subprocess.run(
            [sys.executable, *probe], env={**env, "AENV_KEY": "e2b_wrong"}, capture_output=True, text=True
        )
        assert wrong.returncode == 1 and "rejected the key (401)" in wrong.stderr

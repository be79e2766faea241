"""The top-level pipeline.yaml (the tutorial) loads, and plans on a machine without Docker, KVM or network."""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

from conftest import ROOT, Project

STEPS = [
    "kernel",
    "kvm",
    "ublk",
    "aenv_key",
    "aenv",
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
    "train",
]


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
    result = project.run("plan")
    assert result.code == 2, result.text  # changes pending, not an error
    assert "Traceback" not in result.text
    lines = {
        line.split()[2] if line.startswith(("+", "~", "x", "!")) else line.split()[1]: line
        for line in result.out.splitlines()
        if line and not line.startswith("plan:")
    }
    assert list(lines) == STEPS
    release = tuple(int(p) for p in platform.release().split("-")[0].split(".")[:2])
    expected_failures = {
        "kernel": release < (6, 8),
        "kvm": not os.path.exists("/dev/kvm"),
        "ublk": not os.path.exists("/sys/module/ublk_drv"),
    }
    for name, fails in expected_failures.items():
        if fails:
            assert lines[name].startswith("x fail") and "would fail" in lines[name], lines[name]
        else:
            assert lines[name].startswith("+ run"), lines[name]
    if expected_failures["ublk"]:
        assert "sudo modprobe ublk_drv" in lines["ublk"]
        assert "blocked while" in lines["aenv"] and "ublk" in lines["aenv"]
    failing = [n for n, f in expected_failures.items() if f]
    if failing:
        assert "would fail now: " + ", ".join(failing) in result.out


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
        "depth: 1",
        "--tasks_dir",
        "--output",
        "--n 8",
        "OPENENV_TB2_TASKS_DIR",
        "OPENENV_SANDBOX_BACKEND: e2b",
        "run-openenv-tbench2.py",
    ):
        assert needle in text, needle

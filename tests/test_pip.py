"""The pip kind against real pip in real virtual environments, with packages the tests build (--no-index)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Project
from tests.wheels import make_project, make_wheel


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    house = tmp_path / "wheels"
    make_wheel(house, "tinyalpha", "1.0")
    make_wheel(house, "tinyalpha", "2.0")
    make_wheel(house, "tinybeta", "0.5", requires=["tinyalpha>=1", 'tinygamma; extra == "more"'])
    make_wheel(house, "tinygamma", "3.1")
    return house


def _pipeline(project: Project, wheelhouse: Path, packages: list[str], extra: str = "") -> None:
    project.write(
        f"""
        steps:
          - name: deps
            pip:
              venv: venv
              packages: {json.dumps(packages)}
              find_links: ["{wheelhouse}"]
              no_index: true
        {extra}
        """
    )


def _installed(project: Project) -> dict[str, str]:
    out = subprocess.run(
        [str(project.path / "venv/bin/python"), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {d["name"]: d["version"] for d in json.loads(out)}


def _site_packages(project: Project) -> Path:
    return next((project.path / "venv/lib").glob("python*/site-packages"))


def test_install_noop_without_pip_and_pin_change(project: Project, wheelhouse: Path) -> None:
    _pipeline(project, wheelhouse, ["tinyalpha<2", "tinybeta[more]"])
    first = project.run("apply")
    assert first.code == 0, first.text
    installed = _installed(project)
    assert installed["tinyalpha"] == "1.0" and installed["tinybeta"] == "0.5" and installed["tinygamma"] == "3.1"
    record = json.loads((project.path / ".runner/state.json").read_text())["steps"]["deps"]
    assert record["outputs"]["versions"] == {"tinyalpha": "1.0", "tinybeta": "0.5"}

    # Prove pip does not run on the converged path: take pip away, and apply still converges.
    pip_dir = _site_packages(project) / "pip"
    shutil.move(str(pip_dir), str(project.path / "pip-aside"))
    try:
        again = project.run("apply")
        assert again.code == 0, again.text
        assert "ok       deps" in again.out
    finally:
        shutil.move(str(project.path / "pip-aside"), str(pip_dir))

    _pipeline(project, wheelhouse, ["tinyalpha>=2", "tinybeta[more]"])
    plan = project.run("plan")
    assert plan.code == 2
    assert "tinyalpha: 1.0 installed, wants >=2" in plan.out, plan.out  # the change, in this environment's terms
    result = project.run("apply")
    assert result.code == 0, result.text
    assert _installed(project)["tinyalpha"] == "2.0"


def test_drift_by_hand_is_reinstalled(project: Project, wheelhouse: Path) -> None:
    _pipeline(project, wheelhouse, ["tinyalpha==1.0"])
    assert project.run("apply").code == 0
    subprocess.run(
        [str(project.path / "venv/bin/python"), "-m", "pip", "install", "-q", "--no-index",
         "--find-links", str(wheelhouse), "tinyalpha==2.0"],
        check=True,
    )  # fmt: skip
    plan = project.run("plan")
    assert plan.code == 2 and "tinyalpha: 2.0 installed, wants ==1.0" in plan.out
    assert project.run("apply").code == 0
    assert _installed(project)["tinyalpha"] == "1.0"


def test_already_satisfied_first_run_skips_pip(project: Project, wheelhouse: Path) -> None:
    _pipeline(project, wheelhouse, ["tinyalpha"])
    assert project.run("apply").code == 0
    (project.path / ".runner/state.json").unlink()
    pip_dir = _site_packages(project) / "pip"
    shutil.move(str(pip_dir), str(project.path / "pip-aside"))
    try:
        result = project.run("apply", "-v")
        assert result.code == 0, result.text
        assert "already satisfied: pip not run" in result.out
    finally:
        shutil.move(str(project.path / "pip-aside"), str(pip_dir))


def test_editable_pointing_elsewhere_is_reinstalled(project: Project, tmp_path: Path) -> None:
    first = make_project(tmp_path / "src-a" / "tbench2_env", "tbench2-env", marker="TB2_WITHHOLD_TESTS = 0")
    second = make_project(tmp_path / "src-b" / "tbench2_env", "tbench2-env", marker="TB2_WITHHOLD_TESTS = 1")

    def write(path: Path) -> None:
        project.write(
            f"""
            steps:
              - name: env
                pip:
                  venv: venv
                  editable: ["{path}"]
                  no_index: true
                  no_build_isolation: true
              - name: check
                run: [venv/bin/python, -c, "import tbench2_env; print(tbench2_env.SOURCE)"]
            """
        )

    write(first)
    result = project.run("apply", "-v")
    assert result.code == 0, result.text
    assert str(first) in result.out
    assert project.run("apply").out.count("ok ") == 2

    write(second)
    plan = project.run("plan")
    assert plan.code == 2
    moved = project.run("apply", "-v")
    assert moved.code == 0, moved.text
    assert str(second) in moved.out
    again = project.run("plan")
    assert again.code == 0, again.text


def test_unknown_package_fails_with_pips_message(project: Project, wheelhouse: Path) -> None:
    _pipeline(project, wheelhouse, ["tinyzeta==9"])
    result = project.run("apply")
    assert result.code == 1
    assert "pip install failed" in result.out
    assert "No matching distribution found for tinyzeta==9" in result.out
    assert "check the package name" in result.out


def test_bad_requirement_is_an_input_error(project: Project) -> None:
    project.write(
        """
        steps:
          - name: deps
            pip:
              packages: ["e2b<<2.51"]
        """
    )
    result = project.run("validate")
    assert result.code == 2
    assert "pipeline.yaml:4:" in result.err and "is not a requirement" in result.err


def test_a_package_whose_dependencies_are_missing_is_not_satisfied(project: Project, wheelhouse: Path) -> None:
    """As `e2b` installed with --no-deps beside a missing `dockerfile_parse`: the probe checks the closure of
    what the step asks for (deps of deps too, extras included), still without running pip when all is there."""
    make_wheel(wheelhouse, "tinydelta", "1.0", requires=["tinybeta[more]>=0.5"])
    _pipeline(project, wheelhouse, ["tinydelta"])
    assert project.run("apply").code == 0
    assert set(_installed(project)) >= {"tinyalpha", "tinybeta", "tinygamma", "tinydelta"}
    converged = project.run("plan")
    assert converged.code == 0, converged.text
    # take away a dependency of a dependency (reached through an extra), as --no-deps or a pip uninstall would
    subprocess.run(
        [str(project.path / "venv/bin/python"), "-m", "pip", "uninstall", "-q", "-y", "tinygamma"], check=True
    )
    plan = project.run("plan")
    assert plan.code == 2, plan.text
    assert "tinygamma is not installed (needed by tinybeta[more] 0.5)" in plan.out, plan.out
    assert project.run("apply").code == 0
    assert "tinygamma" in _installed(project)

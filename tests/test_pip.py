"""The pip kind against real pip and real uv in real virtual environments, with packages the tests build
(--no-index). What the step means is the same with either installer: the tests that say so run with both."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steps._support.installer import pip_settings
from steps._support.python_env import SIMPLE_REQUIREMENT
from tests.conftest import Project
from tests.wheels import make_project, make_wheel


def _real_uv() -> str:
    from uv import find_uv_bin

    return find_uv_bin()


@pytest.fixture(params=["uv", "pip"])
def installer(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    house = tmp_path / "wheels"
    make_wheel(house, "tinyalpha", "1.0")
    make_wheel(house, "tinyalpha", "2.0")
    make_wheel(house, "tinybeta", "0.5", requires=["tinyalpha>=1", 'tinygamma; extra == "more"'])
    make_wheel(house, "tinygamma", "3.1")
    return house


def _pipeline(
    project: Project, wheelhouse: Path, packages: list[str], extra: str = "", installer: str = "auto"
) -> None:
    project.write(
        f"""
        steps:
          - name: deps
            pip:
              venv: venv
              packages: {json.dumps(packages)}
              find_links: ["{wheelhouse}"]
              no_index: true
              installer: {installer}
        {extra}
        """
    )


def _installed(project: Project, venv: str = "venv") -> dict[str, str]:
    """What the venv's own interpreter finds installed (whichever installer put it there)."""
    code = "import importlib.metadata as m, json\n"  # the first on sys.path wins, as for an import
    code += "print(json.dumps({d.metadata['Name']: d.version for d in reversed(list(m.distributions()))}))"
    out = subprocess.run([str(project.path / venv / "bin/python"), "-c", code], capture_output=True, text=True)
    return dict(json.loads(out.stdout))


def _by_hand(project: Project, *args: str) -> None:
    """What a user does beside runner: uv on the step's venv (it has no pip when uv made it)."""
    subprocess.run([_real_uv(), "pip", *args, "--python", str(project.path / "venv/bin/python")], check=True)


def _site_packages(project: Project) -> Path:
    return next((project.path / "venv/lib").glob("python*/site-packages"))


def test_install_noop_and_pin_change(project: Project, wheelhouse: Path, installer: str) -> None:
    never = "tinygamma; python_version < '3'"  # a marker that is false here: neither installer installs it
    _pipeline(project, wheelhouse, ["tinyalpha<2", "tinybeta[more]", never], installer=installer)
    first = project.run("apply", "-v")
    assert first.code == 0, first.text
    assert f"installing with {installer}" in first.out, first.out
    installed = _installed(project)
    assert installed["tinyalpha"] == "1.0" and installed["tinybeta"] == "0.5" and installed["tinygamma"] == "3.1"
    record = json.loads((project.path / ".runner/state.json").read_text())["steps"]["deps"]
    assert record["outputs"]["versions"] == {"tinyalpha": "1.0", "tinybeta": "0.5", "tinygamma": "3.1"}
    assert ("pip" in installed) == (installer == "pip")  # a venv made for uv gets no pip

    # Prove the installer does not run on the converged path: take it away, and apply still converges.
    again = project.run("apply", "-v")  # (installer: is how, not what: its spelling changes nothing)
    assert again.code == 0 and "ok       deps" in again.out, again.text
    assert "installing" not in again.out

    _pipeline(project, wheelhouse, ["tinyalpha>=2", "tinybeta[more]", never], installer=installer)
    plan = project.run("plan")
    assert plan.code == 2
    assert "tinyalpha: 1.0 installed, wants >=2" in plan.out, plan.out  # the change, in this environment's terms
    result = project.run("apply")
    assert result.code == 0, result.text
    assert _installed(project)["tinyalpha"] == "2.0"


def test_a_converged_apply_runs_no_installer(project: Project, wheelhouse: Path, tmp_path: Path) -> None:
    """uv on PATH is the one used (it records its calls, then runs the real uv); a converged apply, and a first
    apply that finds everything there, call neither it nor pip (the venv's pip is taken away)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    calls = tmp_path / "uv-calls"
    (tools / "uv").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {_real_uv()} "$@"\n')
    (tools / "uv").chmod(0o755)
    os.environ["PATH"] = f"{tools}{os.pathsep}{os.environ['PATH']}"
    try:
        _pipeline(project, wheelhouse, ["tinyalpha"])
        first = project.run("apply", "-v")
        assert first.code == 0, first.text
        assert f"installing with uv ({tools / 'uv'})" in first.out, first.out
        assert "tinyalpha" in calls.read_text()
        calls.unlink()
        assert project.run("apply").code == 0
        for name in ("state.json", "state.json.backup"):  # no record at all (a state.json alone is refused)
            (project.path / ".runner" / name).unlink()
        again = project.run("apply", "-v")
        assert again.code == 0, again.text
        assert "every requirement is already satisfied: nothing installed" in again.out
        assert not calls.exists()
    finally:
        os.environ["PATH"] = os.environ["PATH"].split(os.pathsep, 1)[1]


def test_drift_by_hand_is_reinstalled(project: Project, wheelhouse: Path, installer: str) -> None:
    _pipeline(project, wheelhouse, ["tinyalpha==1.0"], installer=installer)
    assert project.run("apply").code == 0
    _by_hand(project, "install", "-q", "--no-index", "--find-links", str(wheelhouse), "tinyalpha==2.0")
    plan = project.run("plan")
    assert plan.code == 2 and "tinyalpha: 2.0 installed, wants ==1.0" in plan.out
    assert project.run("apply").code == 0
    assert _installed(project)["tinyalpha"] == "1.0"


def test_already_satisfied_first_run_skips_pip(project: Project, wheelhouse: Path) -> None:
    _pipeline(project, wheelhouse, ["tinyalpha"], installer="pip")
    assert project.run("apply").code == 0
    for name in ("state.json", "state.json.backup"):  # no record at all (a state.json alone is refused)
        (project.path / ".runner" / name).unlink()
    pip_dir = _site_packages(project) / "pip"
    shutil.move(str(pip_dir), str(project.path / "pip-aside"))
    try:
        result = project.run("apply", "-v")
        assert result.code == 0, result.text
        assert "already satisfied: nothing installed" in result.out
    finally:
        shutil.move(str(project.path / "pip-aside"), str(pip_dir))


def test_editable_pointing_elsewhere_is_reinstalled(project: Project, tmp_path: Path, installer: str) -> None:
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
                  installer: {installer}
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
    _pipeline(project, wheelhouse, ["tinyzeta==9"])  # auto: uv fails, pip tries, pip's message is the failure
    result = project.run("apply", "-v")
    assert result.code == 1
    assert "uv failed" in result.out and "trying pip" in result.out, result.out
    assert "pip install failed" in result.out
    assert "No matching distribution found for tinyzeta==9" in result.out
    assert "check the package name" in result.out


def test_unknown_package_with_uv_fails_with_uvs_message(project: Project, wheelhouse: Path) -> None:
    _pipeline(project, wheelhouse, ["tinyzeta==9"], installer="uv")
    result = project.run("apply")
    assert result.code == 1
    assert "uv pip install failed" in result.out, result.out
    assert "tinyzeta" in result.out and "check the package name" in result.out
    assert "pip install failed" not in result.out.replace("uv pip install failed", "")


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


def test_a_package_whose_dependencies_are_missing_is_not_satisfied(
    project: Project, wheelhouse: Path, installer: str
) -> None:
    """As `e2b` installed with --no-deps beside a missing `dockerfile_parse`: the probe checks the closure of
    what the step asks for (deps of deps too, extras included), still without running pip when all is there."""
    make_wheel(wheelhouse, "tinydelta", "1.0", requires=["tinybeta[more]>=0.5"])
    _pipeline(project, wheelhouse, ["tinydelta"], installer=installer)
    assert project.run("apply").code == 0
    assert set(_installed(project)) >= {"tinyalpha", "tinybeta", "tinygamma", "tinydelta"}
    converged = project.run("plan")
    assert converged.code == 0, converged.text
    # take away a dependency of a dependency (reached through an extra), as --no-deps or an uninstall would
    _by_hand(project, "uninstall", "-q", "tinygamma")
    plan = project.run("plan")
    assert plan.code == 2, plan.text
    assert "tinygamma is not installed (needed by tinybeta[more] 0.5)" in plan.out, plan.out
    assert project.run("apply").code == 0
    assert "tinygamma" in _installed(project)


def test_inherited_packages_are_not_copied_by_uv(project: Project, wheelhouse: Path) -> None:
    """uv does not see what a venv inherits (astral-sh/uv#4466): it installs only what is missing, a
    dependency the base lacks included, and a version the step asks over the inherited one shadows it."""
    make_wheel(wheelhouse, "tinydelta", "1.0", requires=["tinybeta>=0.5"])

    def write(child: list[str]) -> None:
        project.write(
            f"""
            steps:
              - name: base
                pip: {{venv: base, packages: [tinyalpha==1.0], find_links: ["{wheelhouse}"], no_index: true}}
              - name: child
                pip:
                  venv: child
                  python: base/bin/python
                  inherit_packages: true
                  packages: {json.dumps(child)}
                  find_links: ["{wheelhouse}"]
                  no_index: true
                  installer: uv
            """
        )

    write(["tinydelta"])
    result = project.run("apply", "-v")
    assert result.code == 0, result.text
    own = next((project.path / "child/lib").glob("python*/site-packages"))
    mine = sorted(p.name.split("-")[0] for p in own.glob("*.dist-info"))
    assert mine == ["tinybeta", "tinydelta"], mine  # tinyalpha is the base's, not copied
    assert _installed(project, "child")["tinyalpha"] == "1.0"
    assert "pip finishes" not in result.out

    write(["tinydelta", "tinyalpha>=2"])
    assert project.run("apply").code == 0
    assert _installed(project, "child")["tinyalpha"] == "2.0"
    assert _installed(project, "base")["tinyalpha"] == "1.0"


def test_pips_configuration_reaches_uv(project: Project, wheelhouse: Path, tmp_path: Path) -> None:
    """An index or wheel directory and a constraint given to pip (pip.conf, PIP_*) mean the same to uv: here
    the only place the packages are is a wheel directory that pip's configuration names."""
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("tinyalpha<2\n")
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nfind-links = {wheelhouse}\n[install]\nconstraint = {constraints}\n")
    saved = dict(os.environ)
    os.environ.update({"PIP_CONFIG_FILE": str(conf), "PIP_NO_INDEX": "1"})
    os.environ.pop("PIP_FIND_LINKS", None)
    try:
        project.write("steps:\n  - name: deps\n    pip: {venv: venv, packages: [tinybeta], installer: uv}\n")
        result = project.run("apply", "-v")
        assert result.code == 0, result.text
        assert _installed(project)["tinyalpha"] == "1.0"  # the constraint held
        # a setting uv cannot be told: auto installs with pip, and says why
        os.environ["PIP_PREFER_BINARY"] = "1"
        project.write("steps:\n  - name: deps\n    pip: {venv: venv, packages: [tinygamma]}\n")
        result = project.run("apply", "-v")
        assert result.code == 0, result.text
        assert "pip's configuration sets prefer-binary, which uv is not told: installing with pip" in result.out
        assert _installed(project)["tinygamma"] == "3.1"
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_pip_settings_read_as_pip_reads_them(tmp_path: Path) -> None:
    """The configuration we hand to uv is the one pip itself reports (`pip config list`), file order, sections
    and PIP_* variables alike."""
    home = tmp_path / "home"
    (home / ".config/pip").mkdir(parents=True)
    (home / ".config/pip/pip.conf").write_text("[global]\nindex-url = http://127.0.0.1:1/user\ntimeout = 7\n")
    site = tmp_path / "etc-xdg"
    (site / "pip").mkdir(parents=True)
    (site / "pip/pip.conf").write_text("[global]\nindex-url = http://127.0.0.1:1/site\nfind-links = /a /b\n")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / "pip.conf").write_text("[install]\nfind-links = /c\n")
    env = {
        "HOME": str(home),
        "XDG_CONFIG_DIRS": str(site),
        "PATH": os.environ["PATH"],
        "PIP_TRUSTED_HOST": "127.0.0.1",
    }
    ours = pip_settings(env, str(venv))
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "config", "list"],
        env={**env, "XDG_CONFIG_HOME": str(home / ".config")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    theirs: dict[str, str] = {}
    for section in ("global", "install", ":env:"):  # pip's override order (cli/parser.py)
        for line in listed.splitlines():
            key, _, value = line.partition("=")
            if key.startswith(section + "."):
                theirs[key[len(section) + 1 :]] = value.strip("'")
    for key in ("index-url", "find-links", "timeout", "trusted-host"):
        assert ours.get(key) == theirs.get(key), (key, ours, listed)
    assert ours["index-url"] == "http://127.0.0.1:1/user" and ours["find-links"] == "/c"
    assert pip_settings({**env, "PIP_CONFIG_FILE": os.devnull}, str(venv)) == {"trusted-host": "127.0.0.1"}


@settings(max_examples=120, deadline=None)
@given(st.from_regex(SIMPLE_REQUIREMENT, fullmatch=True))
def test_what_is_taken_as_a_plain_requirement_packaging_accepts(line: str) -> None:
    """The load skips packaging for requirements matching SIMPLE_REQUIREMENT: each must be one packaging parses,
    with the same name (so the probe, which does use packaging, reads it as the load did)."""
    from packaging.requirements import Requirement

    assert Requirement(line).name == re.split(r"[\[<>=!~]", line, maxsplit=1)[0]


@pytest.mark.parametrize("line", ["a~=1", "a==1.*", "a >=1", "a>=1.0a1", "a; python_version>'3'", "a @ file:///x"])
def test_what_is_not_plain_goes_to_packaging(line: str) -> None:
    assert not SIMPLE_REQUIREMENT.fullmatch(line)

"""What a new user met in the first hour (issue 14): each test failed before its fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, Project


def _interpreters(tmp_path: Path) -> tuple[Path, Path]:
    """`python` and `python3` side by side, as a venv's bin/ has them: the same interpreter under two names."""
    folder = tmp_path / "bin"
    folder.mkdir()
    real = os.path.realpath(sys.executable)
    for name in ("python", "python3"):
        (folder / name).symlink_to(real)
    return folder / "python", folder / "python3"


def test_facts_python_is_one_name_however_runner_is_started(project: Project, tmp_path: Path) -> None:
    python, python3 = _interpreters(tmp_path)
    project.write(
        """
        name: same
        steps:
          - name: server
            run: {command: [echo, "{{ facts.python }}"]}
        """
    )

    def runner(exe: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(exe), "-m", "runner", *args], cwd=project.path, env=project.env(), capture_output=True, text=True
        )

    first = runner(python3, "apply", "-v")  # as the console script starts it (its shebang names python3)
    assert first.returncode == 0, first.stderr
    assert f"{python}\n" in first.stdout.replace("  server | ", "")
    again = runner(python, "plan")  # as `python -m runner` starts it
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing to do" in again.stdout

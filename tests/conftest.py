"""Helpers: write a pipeline into a temporary directory and run the real CLI on it, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


class Project:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, text: str, name: str = "pipeline.yaml") -> Path:
        target = self.path / name
        target.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return target

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.pop("RUNNER_DEBUG", None)
        return env

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "runner", *args]

    def run(self, *args: str, timeout: float = 120) -> Run:
        proc = subprocess.run(
            self.argv(*args), cwd=self.path, env=self.env(), capture_output=True, text=True, timeout=timeout
        )
        return Run(proc.returncode, proc.stdout, proc.stderr)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args),
            cwd=self.path,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def count(self, name: str) -> int:
        """Lines in a counter file that commands append to: how often they ran."""
        path = self.path / name
        return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)

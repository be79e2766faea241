"""Rebuild repos/*.bundle, the git bundles the quickstart clones, from the look-alike trees in lookalikes/.

    python examples/quickstart/build_bundles.py

Each bundle holds one commit on `main` with fixed author, committer and dates, so the same tree always gives
the same commit id. A test checks that every bundle still holds exactly its look-alike tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPOS = ("miles", "OpenEnv", "terminal-bench-2")
IDENTITY = {
    "GIT_AUTHOR_NAME": "runner quickstart",
    "GIT_AUTHOR_EMAIL": "quickstart@runner.invalid",
    "GIT_COMMITTER_NAME": "runner quickstart",
    "GIT_COMMITTER_EMAIL": "quickstart@runner.invalid",
    "GIT_AUTHOR_DATE": "2026-11-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-11-01T00:00:00Z",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, **IDENTITY}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def build(name: str, out_dir: Path) -> str:
    source = HERE / "lookalikes" / name
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / name
        shutil.copytree(source, work, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        git("init", "-q", "-b", "main", cwd=work)
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", f"{name}: look-alike for the runner quickstart", cwd=work)
        commit = git("rev-parse", "HEAD", cwd=work).strip()
        out_dir.mkdir(parents=True, exist_ok=True)
        git("bundle", "create", "-q", str(out_dir / f"{name}.bundle"), "HEAD", "main", cwd=work)
    return commit


def main() -> int:
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "repos"
    for name in REPOS:
        print(f"{name}: {build(name, out_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

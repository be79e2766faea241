"""The offline quickstart, end to end in a temporary copy: apply, converge, fail once, resume."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, Project, free_port

EXAMPLE = ROOT / "examples" / "quickstart"
# Runs the CLI and prints, as it exits, every module the run imported.
MODULES_AT_EXIT = (
    "import atexit, json, runpy, sys\n"
    "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))\n"
    "sys.argv = ['runner', *sys.argv[1:]]\n"
    "runpy.run_module('runner', run_name='__main__')\n"
)


@pytest.fixture
def quickstart(tmp_path: Path) -> Iterator[Project]:
    target = tmp_path / "quickstart"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns(".work", ".runner", "__pycache__"))
    project = Project(target)
    project.port = free_port()  # type: ignore[attr-defined]
    try:
        yield project
    finally:
        # the detached server must not outlive the test
        project.run("stop", "sandbox_server", "--var", f"port={project.port}")  # type: ignore[attr-defined]


def statuses(output: str) -> dict[str, str]:
    found = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("ok", "changed", "FAILED", "blocked", "skipped"):
            found[parts[1]] = parts[0]
    return found


def test_quickstart_applies_converges_and_resumes_after_a_failed_rollout(quickstart: Project) -> None:
    port = ["--var", f"port={quickstart.port}"]  # type: ignore[attr-defined]
    results = quickstart.path / ".work" / "results" / "rewards.jsonl"

    first = quickstart.run("apply", "-j", "3", *port, timeout=300)
    assert first.code == 0, first.text
    rewards = {r["task_id"]: r["reward"] for r in map(json.loads, results.read_text().splitlines())}
    assert rewards == {"count-words": 1.0, "hello-world": 1.0, "make-executable": 1.0, "sort-numbers": 0.0}
    data = (quickstart.path / ".work" / "tbench2_train.jsonl").read_text().splitlines()
    assert [json.loads(row)["metadata"]["task_id"] for row in data] == sorted(rewards)
    # the clones are real clones of the shipped bundles, and the install is an editable one in the venv
    head = subprocess.run(
        ["git", "-C", str(quickstart.path / ".work" / "terminal-bench-2"), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    state = json.loads((quickstart.path / ".runner" / "state.json").read_text())
    assert state["steps"]["terminal_bench_2"]["outputs"]["commit"] == head
    assert state["steps"]["tbench2_env"]["outputs"]["python"].endswith(".work/venv/bin/python")

    second = quickstart.run("apply", *port)
    assert second.code == 0 and "changed=0" in second.out, second.text
    assert set(statuses(second.out).values()) == {"ok"}

    # A converged run imports no e2b (about 0.3 s here) and no module of a kind the pipeline does not use.
    traced = subprocess.run(
        [sys.executable, "-c", MODULES_AT_EXIT, "apply", *port],
        cwd=quickstart.path,
        env=quickstart.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert traced.returncode == 0, traced.stdout + traced.stderr
    imported = set(json.loads(traced.stderr.strip().splitlines()[-1]))
    assert "steps.pip" in imported and "steps.git" in imported  # it does see the kinds in use
    assert not {m for m in imported if m == "e2b" or m.startswith("e2b.")}
    assert not imported & {"steps.docker", "steps._support.docker_engine", "docker", "steps.capture"}
    # Its templates are all of the subset runner renders itself, and its pip verdict is kept: no Jinja (about
    # 0.05 s with compiling the templates), no packaging (0.03 s), no tenacity (nothing runs).
    assert not {m for m in imported if m.split(".")[0] in ("jinja2", "packaging", "tenacity")}, sorted(imported)

    # The rollout fails once (its results directory is blocked by a file), then the fix resumes only it.
    results.unlink()
    results.parent.rmdir()
    results.parent.write_text("in the way\n")
    failed = quickstart.run("apply", *port)
    assert failed.code == 1, failed.text
    seen = statuses(failed.out)
    assert seen["rollout"] == "FAILED"
    assert {s for n, s in seen.items() if n != "rollout"} == {"ok"}
    results.parent.unlink()
    resumed = quickstart.run("apply", *port)
    assert resumed.code == 0, resumed.text
    seen = statuses(resumed.out)
    assert seen.pop("rollout") == "changed" and set(seen.values()) == {"ok"}
    assert results.is_file()

    # Deleting the results re-runs only the rollout.
    results.unlink()
    again = quickstart.run("apply", *port)
    seen = statuses(again.out)
    assert again.code == 0 and seen.pop("rollout") == "changed" and set(seen.values()) == {"ok"}

    # The generated key is in the secrets file and the 0600 env file only.
    key = json.loads((quickstart.path / ".runner" / "secrets.json").read_text())["aenv_key"]["value"]
    for text in (first.text, second.text, failed.text, resumed.text, again.text):
        assert key not in text
    for path in [*(quickstart.path / ".runner").rglob("*"), *(quickstart.path / ".work").glob("*.log")]:
        if path.is_file() and path.name not in ("secrets.json", "env.sh"):
            assert key not in path.read_text(errors="replace"), path


def test_bundles_hold_exactly_the_lookalike_trees(tmp_path: Path) -> None:
    for name in ("miles", "OpenEnv", "terminal-bench-2"):
        clone = tmp_path / name
        subprocess.run(["git", "clone", "-q", str(EXAMPLE / "repos" / f"{name}.bundle"), str(clone)], check=True)
        tracked = subprocess.run(
            ["git", "-C", str(clone), "ls-files"], capture_output=True, text=True, check=True
        ).stdout.split()
        source = EXAMPLE / "lookalikes" / name
        expected = sorted(
            str(p.relative_to(source)) for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts
        )
        assert sorted(tracked) == expected, f"{name}.bundle is stale: run examples/quickstart/build_bundles.py"
        for rel in expected:
            assert (clone / rel).read_bytes() == (source / rel).read_bytes(), f"{name}/{rel} differs from its bundle"

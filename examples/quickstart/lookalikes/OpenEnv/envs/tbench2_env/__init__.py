"""Look-alike of OpenEnv's tbench2_env: Terminal-Bench-2 tasks as episodes in an E2B-compatible sandbox.

The real package serves tasks to an agent over OpenEnv's HTTP API; this one keeps what the quickstart's
rollout needs: load a task, and build the script that prepares the workspace, runs an attempt and runs the
task's tests, with the tests withheld from the attempt (TB2_WITHHOLD_TESTS, in server/tbench2_env_environment.py,
the one file Miles' launcher reads to check for it).

As upstream's pyproject lays it out (package-dir: tbench2_env = ".", tbench2_env.server = "server"), this
directory is the package itself.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path

from tbench2_env.server import tbench2_env_environment as _server

# an OpenEnv before 04d259ea6 has no switch (and gives the agent the tests): the package still imports
TB2_WITHHOLD_TESTS = bool(getattr(_server, "TB2_WITHHOLD_TESTS", False))

REWARD_MARK = "TB2_REWARD="


@dataclass(frozen=True)
class Task:
    task_id: str
    instruction: str
    solution: str
    test: str
    config: str  # task.toml as text


def load_task(tasks_dir: str | os.PathLike[str], task_id: str) -> Task:
    root = Path(tasks_dir) / task_id
    if not (root / "task.toml").is_file():
        raise FileNotFoundError(f"{root} is not a Terminal-Bench-2 task (no task.toml)")
    return Task(
        task_id=task_id,
        instruction=(root / "instruction.md").read_text(encoding="utf-8").strip(),
        solution=(root / "solution" / "solve.sh").read_text(encoding="utf-8"),
        test=(root / "tests" / "test.sh").read_text(encoding="utf-8"),
        config=(root / "task.toml").read_text(encoding="utf-8"),
    )


def _file(name: str, text: str) -> str:
    data = base64.b64encode(text.encode()).decode()
    return f"echo {data} | base64 -d > {name} && chmod +x {name}"


def episode_script(task: Task, attempt: str | None = None) -> str:
    """One bash script: a fresh workspace, the attempt (default: the task's reference solution), then the tests.

    It prints `TB2_REWARD=1` when the tests pass and `TB2_REWARD=0` otherwise.
    """
    workspace = f"tb2-{task.task_id}"
    steps = [
        f"rm -rf {workspace} && mkdir -p {workspace}/.attempt {workspace}/.tests && cd {workspace}",
        _file(".attempt/solve.sh", attempt if attempt is not None else task.solution),
        "bash .attempt/solve.sh > .attempt/log 2>&1 || true",
    ]
    if TB2_WITHHOLD_TESTS:
        steps.append("# the tests arrive only now, after the attempt")
    steps += [
        _file(".tests/test.sh", task.test),
        f"if bash .tests/test.sh > .tests/log 2>&1; then echo {REWARD_MARK}1; else echo {REWARD_MARK}0; fi",
    ]
    return "\n".join(steps) + "\n"


def parse_reward(stdout: str) -> float | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(REWARD_MARK):
            return float(line[len(REWARD_MARK) :])
    return None

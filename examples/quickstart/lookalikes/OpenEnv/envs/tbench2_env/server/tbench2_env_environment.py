"""Look-alike of OpenEnv's tbench2_env/server/tbench2_env_environment.py: one Terminal-Bench-2 task as an episode.

As upstream since 04d259ea6 (#1012): with TB2_WITHHOLD_TESTS the task's tests/ are read into memory at reset() and
deleted from disk before the agent's first action, and staged again only to evaluate; evaluate runs the task's own
tests/test.sh and rewards 1.0 when it exits 0. Miles' launcher preflight reads this very file of the installed
package and refuses to start unless it names TB2_WITHHOLD_TESTS (openenv_launch_common.py).

The environment: TB2_TASKS_DIR (the staged tasks), TB2_DEFAULT_TASK_ID (the task a reset() without one gets),
TB2_COMMAND_TIMEOUT_S (each exec's budget). The agent works in the task image's WORKDIR, /app (its
environment/Dockerfile); a look-alike sandbox has no image, so reset() makes it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

from tbench2_env.models import Tbench2Action, Tbench2Observation, Tbench2State

TB2_WITHHOLD_TESTS = os.environ.get("TB2_WITHHOLD_TESTS", "1") != "0"
WORKDIR = "app"  # /app, relative to the sandbox's root, where the server runs
STAGED_TESTS = "tests"  # /tests, where the tests are staged for the verify window
_WITHHELD: dict[str, dict[str, bytes]] = {}  # task id -> its tests, kept in this process once off the disk


class Tbench2Environment:
    def __init__(self) -> None:
        self.tasks_dir = Path(os.environ.get("TB2_TASKS_DIR", ""))
        self.default_task_id = os.environ.get("TB2_DEFAULT_TASK_ID", "")
        self.command_timeout_s = float(os.environ.get("TB2_COMMAND_TIMEOUT_S", "900"))
        self._state = Tbench2State()
        self._task_dir: Path | None = None
        self._instruction = ""
        self._tests: dict[str, bytes] = {}

    def reset(self, task_id: str | None = None, **_: object) -> Tbench2Observation:
        task_id = task_id or self.default_task_id
        task_dir = self.tasks_dir / task_id
        if not (task_dir / "task.toml").is_file():
            raise FileNotFoundError(f"no task {task_id!r} in {self.tasks_dir} (TB2_TASKS_DIR)")
        tests = task_dir / "tests"
        if tests.is_dir():
            _WITHHELD[task_id] = {p.name: p.read_bytes() for p in sorted(tests.iterdir()) if p.is_file()}
        self._tests = _WITHHELD.get(task_id, {})
        if TB2_WITHHOLD_TESTS:
            shutil.rmtree(tests, ignore_errors=True)  # gone before the agent's first action
        shutil.rmtree(WORKDIR, ignore_errors=True)
        os.makedirs(WORKDIR)
        self._task_dir = task_dir
        self._instruction = (task_dir / "instruction.md").read_text(encoding="utf-8").strip()
        self._state = Tbench2State(
            episode_id=str(uuid.uuid4()), task_id=task_id, task_path=str(task_dir), terminal_ready=True
        )
        return self._observation("reset", reward=0.0)

    def step(self, action: Tbench2Action) -> Tbench2Observation:
        if self._task_dir is None:
            raise RuntimeError("reset() first")
        self._state.step_count += 1
        self._state.last_action_type = action.action_type
        if action.action_type == "exec":
            self._state.last_command = action.command
            output, ok = self._run(["bash", "-c", action.command], WORKDIR, self.command_timeout_s)
            self._state.last_output = output
            return self._observation("exec", output=output, success=ok)
        if action.action_type == "write_file":
            target = Path(WORKDIR) / action.file_path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(action.content, encoding="utf-8")
            return self._observation("write_file", output=f"wrote {action.file_path}")
        if action.action_type == "evaluate":
            return self._evaluate()
        if action.action_type == "close":
            return self._observation("close", done=True)
        raise ValueError(f"Unsupported action_type: {action.action_type}")

    def state(self) -> Tbench2State:
        return self._state

    def _evaluate(self) -> Tbench2Observation:
        shutil.rmtree(STAGED_TESTS, ignore_errors=True)
        os.makedirs(STAGED_TESTS)
        for name, data in self._tests.items():
            (Path(STAGED_TESTS) / name).write_bytes(data)
        script = os.path.abspath(os.path.join(STAGED_TESTS, "test.sh"))
        output, ok = self._run(["bash", script], WORKDIR, self.command_timeout_s)
        shutil.rmtree(STAGED_TESTS, ignore_errors=True)
        reward = 1.0 if ok else 0.0
        return self._observation("evaluate", output=output, reward=reward, done=True, info={"passed": ok})

    @staticmethod
    def _run(argv: list[str], cwd: str, timeout: float) -> tuple[str, bool]:
        try:
            done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, errors="replace", timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"(timed out after {timeout:g}s)", False
        return done.stdout + done.stderr, done.returncode == 0

    def _observation(self, action_type: str, **fields: object) -> Tbench2Observation:
        observation = Tbench2Observation(
            instruction=self._instruction,
            task_id=self._state.task_id,
            task_path=self._state.task_path,
            action_type=action_type,
        )
        for key, value in fields.items():
            setattr(observation, key, value)
        return observation

"""Look-alike of Miles' run-openenv-tbench2.py: a rollout without a model.

It checks what the real launcher's preflight checks (E2B_API_KEY, `import e2b`, `import tbench2_env` with
TB2_WITHHOLD_TESTS, an absolute OPENENV_TB2_TASKS_DIR, OPENENV_SANDBOX_BACKEND=e2b); then, for each prompt row,
it creates a sandbox with the e2b SDK, runs the task's reference solution and its tests there, kills the
sandbox, and writes one reward per task to --results (JSON lines, written whole or not at all).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def preflight() -> str:
    problems = []
    if not os.environ.get("E2B_API_KEY"):
        problems.append("E2B_API_KEY is not set")
    try:
        import e2b  # noqa: F401
    except ImportError:
        problems.append("the e2b SDK is not installed (pip install e2b)")
    try:
        import tbench2_env
    except ImportError:
        problems.append("tbench2_env is not installed (pip install -e ./OpenEnv/envs/tbench2_env)")
    else:
        source = Path(tbench2_env.__file__).read_text(encoding="utf-8")
        if "TB2_WITHHOLD_TESTS" not in source:
            problems.append("the installed tbench2_env predates TB2_WITHHOLD_TESTS (OpenEnv 04d259ea6)")
    tasks_dir = os.environ.get("OPENENV_TB2_TASKS_DIR", "")
    if not tasks_dir or not os.path.isabs(tasks_dir):
        problems.append(f"OPENENV_TB2_TASKS_DIR must be an absolute path, not {tasks_dir!r}")
    if os.environ.get("OPENENV_SANDBOX_BACKEND") != "e2b":
        problems.append("OPENENV_SANDBOX_BACKEND must be e2b")
    if problems:
        raise SystemExit("preflight failed:\n  " + "\n  ".join(problems))
    return tasks_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompt_data", required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--sandbox_timeout", type=int, default=120)
    args = parser.parse_args()
    tasks_dir = preflight()

    from e2b import Sandbox
    from tbench2_env import episode_script, load_task, parse_reward

    rows = [json.loads(line) for line in Path(args.prompt_data).read_text(encoding="utf-8").splitlines() if line]
    results = []
    for row in rows:
        task = load_task(tasks_dir, row["metadata"]["task_id"])
        started = time.monotonic()
        sandbox = Sandbox.create(template="base", timeout=args.sandbox_timeout)
        try:
            run = sandbox.commands.run(episode_script(task), timeout=args.sandbox_timeout)
        finally:
            sandbox.kill()
        reward = parse_reward(run.stdout)
        if reward is None:
            raise SystemExit(f"{task.task_id}: the episode printed no reward:\n{run.stdout}{run.stderr}")
        seconds = round(time.monotonic() - started, 2)
        results.append({"task_id": task.task_id, "reward": reward, "sandbox": sandbox.sandbox_id, "seconds": seconds})
        print(f"{task.task_id:<24} reward {reward:g}  ({seconds}s in {sandbox.sandbox_id})", flush=True)
    out = Path(args.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in results), encoding="utf-8")
    tmp.replace(out)
    mean = sum(r["reward"] for r in results) / len(results)
    print(f"{len(results)} episodes, mean reward {mean:.2f}; wrote {out}")


if __name__ == "__main__":
    sys.exit(main())

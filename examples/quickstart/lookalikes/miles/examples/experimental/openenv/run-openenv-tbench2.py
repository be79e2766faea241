"""Look-alike of Miles' run-openenv-tbench2.py: the same CLI and preflight, a rollout in place of training.

The CLI is upstream's: a typer CLI built from the ``ScriptArgs`` dataclass by ``dataclass_cli``, so every option
has dashes (``--prompt-data``, ``--num-gpus-per-node``, ``--num-nodes``, ``--skip-prepare``, ``--output-dir``) and
a ``MILES_SCRIPT_<FIELD>`` environment variable; the defaults that read the environment (OPENENV_TB2_TASKS_DIR,
OPENENV_SANDBOX_BACKEND, E2B_API_KEY_FILE) read it as upstream does. ``main`` runs ``cleanup``, the prepare
phase unless ``--skip-prepare``, and ``execute``; the preflight (openenv_launch_common.apply_optional_env_vars)
runs inside ``execute`` as upstream's does.

Here ``execute`` runs no model: for each prompt row it makes the task's template and a sandbox through the e2b
SDK (tb2_sandbox_e2b), runs the task's reference solution and tests there, kills the sandbox, and writes one
reward per task to ``<output-dir>/rewards.jsonl``. The episodes run at once, as upstream's rollout generates a
group's samples concurrently (miles/rollout/inference_rollout/inference_rollout_common.py: a semaphore of
``sglang_server_concurrency`` and ``asyncio.gather``); their lines print in prompt order.
"""

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import miles.utils.external_utils.command_utils as U
import openenv_launch_common as C
import typer


@dataclass
class ScriptArgs(U.ExecuteTrainConfig):
    mode: Literal["normal", "debug_rollout_only"] = "normal"
    run_id: str = U.create_run_id()
    megatron_model_type: str = "glm4.7-flash"
    num_gpus_per_node: int = 8
    megatron_path: str = "/root/Megatron-LM"
    skip_prepare: bool = False
    base_dir: str = "/root"
    model_name: str = "GLM-4.7-Flash"
    hf_checkpoint: str = "zai-org/GLM-4.7-Flash"
    prompt_data: str = "/root/tbench2_train.jsonl"
    openenv_tb2_tasks_dir: str = os.environ.get("OPENENV_TB2_TASKS_DIR", "")
    openenv_sandbox_backend: str = os.environ.get("OPENENV_SANDBOX_BACKEND", "")
    e2b_api_key_file: str = os.environ.get("E2B_API_KEY_FILE", "")
    sandbox_timeout: int = 120  # look-alike only: the lifetime of each episode's sandbox


def prepare(args: ScriptArgs) -> None:
    U.convert_checkpoint(args.model_name, num_gpus_per_node=args.num_gpus_per_node, dir_dst=args.base_dir)


def execute(args: ScriptArgs) -> None:
    extra_env_vars: dict[str, str] = {}
    C.apply_optional_env_vars(extra_env_vars, args)
    if not extra_env_vars.get("OPENENV_TB2_TASKS_DIR"):
        raise SystemExit("(look-alike) the rehearsal needs per-episode sandboxes: set OPENENV_TB2_TASKS_DIR")
    U.execute_train(num_gpus_per_node=args.num_gpus_per_node, config=args)
    print(f"(look-alike) actor: {args.num_nodes} node(s) x {args.num_gpus_per_node} GPU(s); rollout instead")

    import tb2_sandbox_e2b as E
    from tbench2_env import episode_script, load_task, parse_reward

    tasks_dir = Path(extra_env_vars["OPENENV_TB2_TASKS_DIR"])
    rows = [json.loads(line) for line in Path(args.prompt_data).read_text(encoding="utf-8").splitlines() if line]

    def episode(row: dict) -> dict:
        task = load_task(tasks_dir, row["metadata"]["task_id"])
        started = time.monotonic()
        sandbox = E.create_task_sandbox(tasks_dir / task.task_id, timeout=args.sandbox_timeout)
        try:
            run = sandbox.commands.run(episode_script(task), timeout=args.sandbox_timeout)
        finally:
            sandbox.kill(api_key=E.resolve_api_key())
        reward = parse_reward(run.stdout)
        if reward is None:
            raise SystemExit(f"{task.task_id}: the episode printed no reward:\n{run.stdout}{run.stderr}")
        seconds = round(time.monotonic() - started, 2)
        return {"task_id": task.task_id, "reward": reward, "sandbox": sandbox.sandbox_id, "seconds": seconds}

    results = []
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(rows)))) as pool:
        for result in pool.map(episode, rows):
            results.append(result)
            line = f"{result['task_id']:<24} reward {result['reward']:g}"
            print(f"{line}  ({result['seconds']}s in {result['sandbox']})", flush=True)
    out = Path(args.output_dir) / "rewards.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in results), encoding="utf-8")
    tmp.replace(out)
    mean = sum(r["reward"] for r in results) / len(results)
    print(f"{len(results)} episodes, mean reward {mean:.2f}; wrote {out}")


@U.dataclass_cli
def main(args: ScriptArgs):
    C.cleanup()
    if not args.skip_prepare:
        prepare(args)
    execute(args)


if __name__ == "__main__":
    typer.run(main)

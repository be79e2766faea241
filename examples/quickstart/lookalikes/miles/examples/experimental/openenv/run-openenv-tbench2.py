"""Look-alike of Miles' run-openenv-tbench2.py: the same CLI and preflight, a rollout in place of training.

The CLI is upstream's: a typer CLI built from the ``ScriptArgs`` dataclass by ``dataclass_cli``, so every option
has dashes (``--prompt-data``, ``--num-gpus-per-node``, ``--num-nodes``, ``--skip-prepare``, ``--output-dir``) and
a ``MILES_SCRIPT_<FIELD>`` environment variable; the defaults that read the environment (OPENENV_TB2_TASKS_DIR,
OPENENV_SANDBOX_BACKEND, E2B_API_KEY_FILE) read it as upstream does. ``main`` runs ``cleanup``, the prepare
phase unless ``--skip-prepare``, and ``execute``; the preflight (openenv_launch_common.apply_optional_env_vars)
runs inside ``execute`` as upstream's does.

Here ``execute`` runs no model: for each prompt row an episode as upstream's e2b agent function runs one —
``tb2_sandbox_e2b.create_task_sandbox`` (the task's template built once, a sandbox, the env server started in
it and reached at ``get_host(8000)``), then ``Tbench2Env(base_url=...)``: ``reset(task_id=...)``, one ``exec``
step whose command is the task's reference solution (read on this side: solution/ never enters the sandbox)
in place of the policy's commands, and ``evaluate``, whose reward it keeps; then ``kill_sandbox``. One reward
per task lands in ``<output-dir>/rewards.jsonl``. The episodes run at once, as upstream's rollout generates a
group's samples concurrently (miles/rollout/inference_rollout/inference_rollout_common.py: a semaphore of
``sglang_server_concurrency`` and ``asyncio.gather``); their lines print in prompt order. At most
OPENENV_E2B_CREATE_CONCURRENCY (4) creates are in flight, the slot held for the create only, as upstream's
SandboxBackend holds it (openenv_sandbox_common.py:187, 233-258); its retry of throttled creates (HTTP 429,
RateLimitException) is not copied: AgentENV's API answers no 429.
"""

import asyncio
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import miles.utils.external_utils.command_utils as U
import openenv_launch_common as C
import typer

CONCURRENCY = 8  # episodes at once (upstream: sglang_server_concurrency samples)
CREATE_CONCURRENCY = int(os.getenv("OPENENV_E2B_CREATE_CONCURRENCY", "4"))  # in-flight sandbox creates
MESSAGE_TIMEOUT_S = 900.0  # a reply on /ws (upstream's evaluate budget is of this order)


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
    from tbench2_env import Tbench2Action, Tbench2Env

    tasks_dir = Path(extra_env_vars["OPENENV_TB2_TASKS_DIR"])
    rows = [json.loads(line) for line in Path(args.prompt_data).read_text(encoding="utf-8").splitlines() if line]

    async def episode(row: dict, slots: asyncio.Semaphore, creates: asyncio.Semaphore) -> dict:
        task_id = row["metadata"]["task_id"]
        policy = (tasks_dir / task_id / "solution" / "solve.sh").read_text(encoding="utf-8")
        async with slots:
            started = time.monotonic()
            async with creates:
                sandbox, url = await asyncio.to_thread(E.create_task_sandbox, tasks_dir / task_id)
            try:
                async with Tbench2Env(base_url=url, message_timeout_s=MESSAGE_TIMEOUT_S) as env:
                    await env.reset(task_id=task_id)
                    await env.step(Tbench2Action(action_type="exec", command=policy))
                    verdict = await env.step(Tbench2Action(action_type="evaluate"))
            finally:
                await asyncio.to_thread(E.kill_sandbox, sandbox)
        if verdict.reward is None:
            raise SystemExit(f"{task_id}: evaluate gave no reward:\n{verdict.observation.output}")
        seconds = round(time.monotonic() - started, 2)
        return {"task_id": task_id, "reward": verdict.reward, "sandbox": sandbox.sandbox_id, "seconds": seconds}

    async def rollout() -> list[dict]:
        slots, creates = asyncio.Semaphore(CONCURRENCY), asyncio.Semaphore(CREATE_CONCURRENCY)
        return await asyncio.gather(*(episode(row, slots, creates) for row in rows))

    results = asyncio.run(rollout())
    for result in results:
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

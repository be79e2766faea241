"""Look-alike of miles/utils/external_utils/command_utils.py: what the OpenEnv tbench2 launcher uses.

Kept from upstream: ``ExecuteTrainConfig`` and its fields (``num_nodes`` defaults to SLURM_JOB_NUM_NODES or 1),
``get_bool_env_var`` (true/1 and false/0), ``convert_checkpoint``'s skip rule (a ``latest_checkpointed_iteration.txt``
that says ``release`` under ``<dir_dst>/<model_name>_torch_dist``), and ``execute_train``'s reading of
MILES_SCRIPT_EXTERNAL_RAY (no ``ray start``/``ray stop`` of its own) and MASTER_ADDR.

Not kept, on purpose: upstream kills sglang, ray, miles and redis processes by name (``pkill -9``) before it
starts, converts the checkpoint with ``torchrun --nproc-per-node N`` and submits a Ray job; this look-alike only
says what it would kill and convert, and ``execute_train`` hands over to the caller's rollout instead.
"""

from __future__ import annotations

import datetime
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from miles.utils.typer_utils import dataclass_cli

_ = dataclass_cli
repo_base_dir = Path(os.path.abspath(__file__)).resolve().parents[3]


def get_bool_env_var(name: str, default: str = "false") -> bool:
    value = os.getenv(name, default).lower()
    if value not in ("true", "1", "false", "0"):
        print(f"get_bool_env_var({name}) see non-understandable value={value} and treat as false")
    return value in ("true", "1")


def create_run_id() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%y%m%d-%H%M%S") + f"-{random.randint(0, 999):03d}"


@dataclass
class ExecuteTrainConfig:
    cuda_core_dump: bool = False
    num_nodes: int = field(default_factory=lambda: int(os.environ.get("SLURM_JOB_NUM_NODES", "1")))
    extra_env_vars: str = ""
    output_dir: str = "/root/shared_data"


def convert_checkpoint(model_name: str, num_gpus_per_node: int, dir_dst: str = "/root", **_: object) -> None:
    path_dst = Path(f"{dir_dst}/{model_name}_torch_dist")
    tracker = path_dst / "latest_checkpointed_iteration.txt"
    if tracker.exists() and tracker.read_text().strip() == "release":
        print(f"convert_checkpoint skip {path_dst} since tracker is 'release'")
        return
    print(f"(look-alike) would run: torchrun --nproc-per-node {num_gpus_per_node} convert_hf_to_torch_dist.py")
    path_dst.mkdir(parents=True, exist_ok=True)
    tracker.write_text("release\n")


def execute_train(num_gpus_per_node: int, config: ExecuteTrainConfig) -> dict[str, str]:
    external_ray = get_bool_env_var("MILES_SCRIPT_EXTERNAL_RAY")
    master_addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    killed = "sglang, miles, redis" if external_ray else "sglang, ray, miles, redis"
    print(f"(look-alike) upstream would now pkill -9 {killed} on this host; this one kills nothing")
    if not external_ray:
        print(
            f"(look-alike) would run: ray start --head --node-ip-address {master_addr} --num-gpus {num_gpus_per_node}"
        )
    return {"MASTER_ADDR": master_addr, "external_ray": str(external_ray)}

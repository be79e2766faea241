"""Look-alike of Miles' make_tbench2_data.py: one prompt row per Terminal-Bench-2 task.

A Tap CLI, as upstream's: the options are the field names with underscores (``--tasks_dir``, ``--output``,
``--n``, ``--tasks``), and each has upstream's default.

    python make_tbench2_data.py --tasks_dir /workspace/terminal-bench-2 --output /root/tbench2_train.jsonl [--n 8]
"""

import json
from pathlib import Path

from openenv_agent_function import TB2_AGENT_SYSTEM_PROMPT
from tap import Tap


class Args(Tap):
    tasks_dir: str = "/workspace/terminal-bench-2"  # TB2 repo checkout
    output: str = "/root/tbench2_train.jsonl"
    n: int = 0  # 0 = all discovered tasks
    tasks: str = ""  # optional comma-separated explicit task_ids


def main() -> None:
    args = Args().parse_args()
    tasks_dir = Path(args.tasks_dir).expanduser().resolve()
    if args.tasks:
        task_ids = [t.strip() for t in args.tasks.split(",") if t.strip()]
    else:
        task_ids = sorted(p.name for p in tasks_dir.iterdir() if (p / "task.toml").is_file())
        if args.n > 0:
            task_ids = task_ids[: args.n]
    missing = [t for t in task_ids if not (tasks_dir / t / "task.toml").is_file()]
    if missing:
        raise SystemExit(f"task_ids without a task.toml in {tasks_dir}: {missing}")
    out = Path(args.output)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for tid in task_ids:
            row = {"prompt": [{"role": "system", "content": TB2_AGENT_SYSTEM_PROMPT}], "metadata": {"task_id": tid}}
            handle.write(json.dumps(row) + "\n")
    tmp.replace(out)  # look-alike only: never a half-written file that `creates` would count as done
    print(f"Wrote {len(task_ids)} TB2 tasks to {args.output}")


if __name__ == "__main__":
    main()

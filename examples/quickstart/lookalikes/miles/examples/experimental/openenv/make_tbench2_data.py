"""Look-alike of Miles' make_tbench2_data.py: one prompt row per Terminal-Bench-2 task, flags with underscores.

python make_tbench2_data.py --tasks_dir ./terminal-bench-2 --output /root/tbench2_train.jsonl [--n 8]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SYSTEM_PROMPT = (
    "You are an agent solving a terminal task. On each turn respond with exactly one shell command inside a "
    "single ```bash code block. When the task is complete, reply with TASK_COMPLETE."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks_dir", required=True, help="a terminal-bench-2 checkout")
    parser.add_argument("--output", required=True, help="the prompt data (JSON lines)")
    parser.add_argument("--n", type=int, default=0, help="keep only the first N tasks (0: all)")
    parser.add_argument("--tasks", default="", help="comma-separated task ids (default: every task)")
    args = parser.parse_args()
    tasks_dir = Path(args.tasks_dir).expanduser().resolve()
    if args.tasks:
        task_ids = [t.strip() for t in args.tasks.split(",") if t.strip()]
    else:
        task_ids = sorted(p.name for p in tasks_dir.iterdir() if (p / "task.toml").is_file())
    if args.n:
        task_ids = task_ids[: args.n]
    if not task_ids:
        raise SystemExit(f"no tasks (directories with a task.toml) in {tasks_dir}")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for task_id in task_ids:
            row = {"prompt": [{"role": "system", "content": SYSTEM_PROMPT}], "metadata": {"task_id": task_id}}
            handle.write(json.dumps(row) + "\n")
    tmp.replace(out)  # never a half-written file that `creates` would count as done
    print(f"wrote {len(task_ids)} prompts to {out}")


if __name__ == "__main__":
    main()

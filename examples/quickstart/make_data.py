"""A stand-in for Miles' make_tbench2_data.py: writes prompt records as JSON lines, flags with underscores."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks_dir", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--n", type=int, default=0, help="keep only the first N tasks (0: all)")
    args = parser.parse_args()
    tasks = sorted(p for p in Path(args.tasks_dir).iterdir() if p.is_dir())
    if args.n:
        tasks = tasks[: args.n]
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for task in tasks:
            instruction = (task / "instruction.md").read_text(encoding="utf-8").strip()
            fh.write(json.dumps({"prompt": instruction, "label": task.name}) + "\n")
    tmp.replace(out)  # never a half-written output that `creates` would count as done
    print(f"wrote {len(tasks)} prompts to {out}")


if __name__ == "__main__":
    main()

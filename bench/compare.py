"""This tree against another revision of runner, side by side in one run on this machine.

    python bench/compare.py [--base HEAD~1] [--rounds 9] [--dir /tmp/runner-compare]

The base revision is checked out as a git worktree under --dir; each side runs with its own tree first on
PYTHONPATH (so a side's subprocesses, the stand-in server's included, use its code). Each side converges its
own copy of examples/quickstart and a generated 1000-step pipeline, then the two are timed alternately
(converged quickstart apply, converged 1000-step apply and plan) and the medians are printed with the ratio
this / base. A ratio above 1 is this tree being slower. Timing assertions do not belong in tests: this prints.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from converged import generated  # bench/ is on the path when this runs as a script

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def side_env(tree: Path) -> dict[str, str]:
    """A side's environment: its tree first on the path, and bytecode written and used (as an installed runner
    has it: PYTHONDONTWRITEBYTECODE would make each run compile every module, which is not what users run)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(tree), "NO_COLOR": "1"}


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} (in {cwd}) exited {proc.returncode}:\n{proc.stdout[-3000:]}")
    return elapsed


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


class Side:
    def __init__(self, label: str, tree: Path, work: Path) -> None:
        self.label = label
        self.tree = tree
        self.env = side_env(tree)
        self.quickstart = work / label / "quickstart"
        if self.quickstart.exists():
            self.stop()
            shutil.rmtree(self.quickstart)
        shutil.copytree(
            ROOT / "examples" / "quickstart",
            self.quickstart,
            ignore=shutil.ignore_patterns(".work", ".runner", "__pycache__"),
        )
        self.port = ["--var", f"port={free_port()}"]
        self.big = generated(work / label, 1000)  # bench/converged.py's pipeline, in work/label/gen-1000

    def runner(self, *args: str) -> list[str]:
        return [PY, "-m", "runner", *args]

    def converge(self) -> None:
        for _ in range(2):
            timed(self.runner("apply", *self.port), self.quickstart, self.env)
            timed(self.runner("apply"), self.big, self.env)

    def stop(self) -> None:
        subprocess.run(self.runner("stop", "sandbox_server"), cwd=self.quickstart, env=self.env, capture_output=True)

    def cases(self) -> dict[str, Callable[[], float]]:
        return {
            "converged apply, examples/quickstart": lambda: timed(
                self.runner("apply", *self.port), self.quickstart, self.env
            ),
            "converged apply, 1000 steps": lambda: timed(self.runner("apply"), self.big, self.env),
            "converged plan, 1000 steps": lambda: timed(self.runner("plan"), self.big, self.env),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD~1", help="the revision to compare with (default HEAD~1)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--dir", default="/tmp/runner-compare")
    args = parser.parse_args()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    base_tree = work / "base-tree"
    if base_tree.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, capture_output=True)
        shutil.rmtree(base_tree, ignore_errors=True)
    subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=True)
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=ROOT, check=True, capture_output=True
    )
    revision = subprocess.run(
        ["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    sides = [Side("base", base_tree, work), Side("this", ROOT, work)]
    try:
        for side in sides:
            side.converge()
        names = list(sides[0].cases())
        samples: dict[tuple[str, str], list[float]] = {}
        runs = [side.cases() for side in sides]
        for _ in range(args.rounds):
            for name in names:
                for side, cases in zip(sides, runs, strict=True):
                    samples.setdefault((name, side.label), []).append(cases[name]())
        print(f"base: {args.base} ({revision}); this: the working tree; {args.rounds} rounds, alternating; medians")
        print(f"{'':42} {'base':>8} {'this':>8} {'this/base':>10}")
        for name in names:
            base = statistics.median(samples[(name, "base")])
            this = statistics.median(samples[(name, "this")])
            print(f"{name:42} {base:7.3f}s {this:7.3f}s {this / base:9.2f}x")
    finally:
        for side in sides:
            side.stop()
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, capture_output=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Cost against the number of steps: generated pipelines of `run: {command: ["true"]}` steps.

    python bench/scale.py [--sizes 1000,5000,10000,20000] [--dir /tmp/runner-bench-scale]

For each size: `plan` of a fresh pipeline, the first `apply`, a converged `apply` and a converged `plan`, one
run each (the first apply cannot be repeated without starting over), printed with the ratio to the smallest
size per step. Linear cost means the per-step column stays flat.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def generate(path: Path, n: int) -> None:
    lines = ["name: scale", "steps:"]
    for i in range(n):
        lines += [f"  - name: s{i}", '    run: {command: ["true"]}']
    path.write_text("\n".join(lines) + "\n")


def timed(work: Path, *args: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "runner", *args], cwd=work, env=env, capture_output=True)
    took = time.perf_counter() - started
    if proc.returncode not in (0, 2):
        raise SystemExit(f"{args} failed: {proc.stderr.decode()[-500:]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000,10000,20000")
    parser.add_argument("--dir", default="/tmp/runner-bench-scale")
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    root = Path(args.dir)
    rows = []
    for n in sizes:
        work = root / f"p{n}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        generate(work / "pipeline.yaml", n)
        rows.append((n, timed(work, "plan"), timed(work, "apply"), timed(work, "apply"), timed(work, "plan")))
    base = rows[0]
    print(
        f"{'steps':>6} {'plan':>8} {'1st apply':>10} {'conv apply':>11} {'conv plan':>10}   ratios to {base[0]} steps"
    )
    for n, *figures in rows:
        ratios = " ".join(f"{f / b:6.1f}" for f, b in zip(figures, base[1:], strict=True))
        print(f"{n:>6} " + " ".join(f"{f:9.2f}s" for f in figures) + f"   {ratios}   (x{n / base[0]:.0f} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

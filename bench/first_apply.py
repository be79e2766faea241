"""The first apply: where users wait. Figures printed side by side, each the median, min and max of its rounds.

    python bench/first_apply.py [--rounds 3] [--dir /tmp/runner-bench-first] [--skip install,quickstart,dag]

- quickstart: the offline quickstart's first apply (fresh copy, fresh .work and .runner) with -j 1 and -j 4,
  installing with uv (the default) and with `installer: pip`; target <= 2.0 s.
- install: the flagship's `tbench2_env` requirements (OpenEnv envs/tbench2_env/pyproject.toml at 385de5eb:
  openenv[core]>=0.2.3, camel-ai>=0.2.90, docker>=7.1.0, and the step's typed-argument-parser and openai)
  into a fresh venv by runner's pip step, with pip and with uv (uv with an empty cache, and warm). The
  wheels are fetched once from the package index into --dir (not timed); the timed installs read only that
  directory (`no_index`), so both installers do the same work offline; before each, the disk is synced and (as
  root) the page cache dropped, not timed (see quiet_disk). Target: uv >= 5x faster than pip.
- dag: `-j 4` first apply of generated pipelines of `sleep` steps, DAGs no wider than 4 whose critical path
  is known, and the flagship's own graph (../pipeline.yaml) with a sleep per step; target wall <= 1.15x the
  critical path.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart"
TBENCH2_REQUIREMENTS = ["openenv[core]>=0.2.3", "camel-ai>=0.2.90", "docker>=7.1.0", "typed-argument-parser", "openai"]


def runner(cwd: Path, *args: str, env: dict[str, str] | None = None, expect: int = 0) -> float:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "runner", *args], cwd=cwd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    took = time.perf_counter() - started
    if proc.returncode != expect:
        raise SystemExit(f"runner {' '.join(args)} in {cwd} exited {proc.returncode}:\n{proc.stdout.decode()[-3000:]}")
    return took


def figure(values: list[float]) -> str:
    return f"{statistics.median(values):7.2f} s  (min {min(values):.2f}, max {max(values):.2f}, n={len(values)})"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---- the quickstart -------------------------------------------------------------------------------------


def steps_critical_path(work: Path) -> tuple[float, list[str]]:
    """The longest chain through the DAG by each step's own duration (the records' `duration`: from the start of
    its apply to its end) and that chain: what a -j 4 first apply cannot beat, whatever runner does."""
    import json

    sys.path.insert(0, str(ROOT))
    from runner.load import load_pipeline

    pipeline = load_pipeline(work / "pipeline.yaml")
    records = json.loads((work / ".runner" / "state.json").read_text())["steps"]
    deps = {s.name: list(pipeline.graph.deps[s.name]) for s in pipeline.steps}
    return longest_chain(deps, {name: float(records.get(name, {}).get("duration") or 0.0) for name in deps})


def quickstart(base: Path, rounds: int) -> list[tuple[str, list[float], float | None]]:
    rows: list[tuple[str, list[float], float | None]] = []
    for installer in ("uv", "pip"):
        for jobs in ("1", "4"):
            times: list[float] = []
            chains: list[float] = []
            longest: list[str] = []
            for i in range(rounds):
                work = base / f"qs-{installer}-{jobs}-{i}"
                shutil.rmtree(work, ignore_errors=True)
                shutil.copytree(QUICKSTART, work, ignore=shutil.ignore_patterns(".work", ".runner"))
                pipeline = work / "pipeline.yaml"
                text = pipeline.read_text()
                if installer == "pip":
                    marker = "      inherit_packages: true\n"
                    text = text.replace(marker, marker + "      installer: pip\n")
                pipeline.write_text(text)
                port = str(free_port())
                try:
                    times.append(runner(work, "apply", "-j", jobs, "--var", f"port={port}"))
                    if jobs == "4":
                        chain, longest = steps_critical_path(work)
                        chains.append(chain)
                finally:
                    subprocess.run(
                        [sys.executable, "-m", "runner", "stop", "sandbox_server", "--var", f"port={port}"],
                        cwd=work,
                        env={**os.environ, "PYTHONPATH": str(ROOT)},
                        capture_output=True,
                    )
            rows.append((f"quickstart first apply -j {jobs}, {installer}", times, 2.0 if installer == "uv" else None))
            if chains:
                rows.append((f"  its steps' own critical path ({installer})", chains, None))
                share = [t - c for t, c in zip(times, chains, strict=True)]
                rows.append((f"  runner's share: wall - that path ({installer})", share, None))
                print(f"  quickstart, {installer}, -j 4: the longest chain of the last round: {' -> '.join(longest)}")
    return rows


# ---- the flagship's tbench2_env requirements --------------------------------------------------------------


def quiet_disk() -> bool:
    """Before each timed install (not timed): the last one's writes flushed, and — as root — the page cache
    dropped, so that every install starts from the same state. On these VMs an install that runs while the page
    cache holds the last few GB of installs is slowed by reclaim (measured: uv 3 s, then 6 s, then 9 s in a row;
    3.7-4.1 s each with the cache dropped). True when the cache was dropped."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as fh:
            fh.write("3\n")
    except OSError:
        return False
    return True


def install(base: Path, rounds: int) -> list[tuple[str, list[float], float | None]]:
    wheels = base / "tbench2-wheels"
    if not (wheels / ".complete").exists():
        print(f"fetching the wheels of {', '.join(TBENCH2_REQUIREMENTS)} into {wheels} (once, not timed)", flush=True)
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "-d",
                str(wheels),
                *TBENCH2_REQUIREMENTS,
                "setuptools",
                "wheel",
            ],
            check=True,
        )
        (wheels / ".complete").touch()
    warm_cache = base / "uv-cache-warm"
    if quiet_disk():
        print("  the page cache is dropped before each timed install (root)", flush=True)
    results: dict[str, list[float]] = {"pip": [], "uv, empty cache": [], "uv, warm cache": []}
    order = ["uv, warm cache", "pip", "uv, empty cache"]
    for i in range(rounds + 1):  # round 0 warms the uv cache and is not counted
        for label in order:
            work = base / f"install-{label.split(',')[0]}-{i}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            packages = ", ".join(f'"{r}"' for r in TBENCH2_REQUIREMENTS)
            installer = label.split(",")[0]
            (work / "pipeline.yaml").write_text(
                "steps:\n  - name: tbench2_env\n    pip:\n      venv: venv\n"
                f'      packages: [{packages}]\n      find_links: ["{wheels}"]\n      no_index: true\n'
                f"      installer: {installer}\n"
            )
            cache = warm_cache if label == "uv, warm cache" else work / "uv-cache"
            env = {"UV_CACHE_DIR": str(cache), "PIP_NO_CACHE_DIR": "1"}
            quiet_disk()
            took = runner(work, "apply", env=env)
            if i > 0:
                results[label].append(took)
            shutil.rmtree(work, ignore_errors=True)
    pip_median = statistics.median(results["pip"])
    rows: list[tuple[str, list[float], float | None]] = []
    for label in ("pip", "uv, empty cache", "uv, warm cache"):
        target = pip_median / 5 if label.startswith("uv") else None
        rows.append((f"tbench2_env requirements into a fresh venv, {label}", results[label], target))
    return rows


# ---- DAGs of sleeps --------------------------------------------------------------------------------------


def longest_chain(deps: dict[str, list[str]], cost: dict[str, float]) -> tuple[float, list[str]]:
    """The DAG's critical path: its length and its steps (`name cost` each)."""
    done: dict[str, tuple[float, list[str]]] = {}

    def finish(name: str) -> tuple[float, list[str]]:
        if name not in done:
            before = max((finish(d) for d in deps[name]), default=(0.0, []))
            done[name] = (before[0] + cost[name], [*before[1], f"{name} {cost[name]:.2f}"])
        return done[name]

    return max(finish(n) for n in deps)


def write_sleeps(path: Path, deps: dict[str, list[str]], cost: dict[str, float]) -> None:
    lines = ["name: dag", "steps:"]
    for name, needs in deps.items():
        lines += [f"  - name: {name}", f"    needs: [{', '.join(needs)}]", f'    run: [sleep, "{cost[name]:.2f}"]']
    path.write_text("\n".join(lines) + "\n")


def generated(seed: int, layers: int = 6, width: int = 4) -> tuple[dict[str, list[str]], dict[str, float]]:
    rng = random.Random(seed)
    deps: dict[str, list[str]] = {}
    cost: dict[str, float] = {}
    previous: list[str] = []
    for layer in range(layers):
        current = [f"l{layer}s{i}" for i in range(rng.randint(2, width))]
        for name in current:
            deps[name] = sorted(rng.sample(previous, k=min(len(previous), rng.randint(1, 2)))) if previous else []
            cost[name] = round(rng.uniform(0.1, 0.6), 2)
        previous = current
    return deps, cost


# a plausible time per kind for the flagship's shape (the real container pull and installs take longer)
FLAGSHIP_COST = {
    "assert": 0.1, "run": 0.5, "secret": 0.05, "docker": 1.5, "capture": 0.2, "env": 0.05, "pip": 1.0,
    "e2b": 0.8, "git": 0.8, "launch": 0.5,
}  # fmt: skip


def flagship_shape() -> tuple[dict[str, list[str]], dict[str, float]]:
    sys.path.insert(0, str(ROOT))
    from runner.load import load_pipeline

    pipeline = load_pipeline(ROOT / "pipeline.yaml")
    deps = {s.name: list(pipeline.graph.deps[s.name]) for s in pipeline.steps}
    cost = {s.name: FLAGSHIP_COST.get(s.kind, 0.3) for s in pipeline.steps}
    return deps, cost


def dag(base: Path, rounds: int) -> list[tuple[str, list[float], float | None]]:
    cases = [(f"generated DAG {seed}", *generated(seed)) for seed in (1, 2, 3)]
    cases.append(("the flagship's graph", *flagship_shape()))
    rows: list[tuple[str, list[float], float | None]] = []
    for label, deps, cost in cases:
        path = longest_chain(deps, cost)[0]
        times: list[float] = []
        for i in range(rounds):
            work = base / f"dag-{i}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            write_sleeps(work / "pipeline.yaml", deps, cost)
            times.append(runner(work, "apply", "-j", "4"))
        name = f"-j 4 first apply, {label}: {len(deps)} steps, critical path {path:.2f} s"
        name += f", total {sum(cost.values()):.2f} s"
        rows.append((name, times, path * 1.15))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/runner-bench-first")
    parser.add_argument("--skip", default="", help="comma-separated: quickstart, install, dag")
    args = parser.parse_args()
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        print("PYTHONDONTWRITEBYTECODE was set: unset for every timed run (bytecode written, as on a user's machine)")
    rows: list[tuple[str, list[float], float | None]] = []
    for name, section in (("quickstart", quickstart), ("install", install), ("dag", dag)):
        if name not in skip:
            rows += section(base, args.rounds)
    print(f"\nfirst apply, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    for label, values, target in rows:
        verdict = ""
        if target is not None:
            verdict = f"  target <= {target:.2f} s: " + ("met" if statistics.median(values) <= target else "MISSED")
        print(f"  {label:<96} {figure(values)}{verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

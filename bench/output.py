"""Output floods: how fast a step's output passes through runner, and how much memory runner takes meanwhile.

    python bench/output.py [--rounds 3] [--dir /tmp/runner-bench-output] [--quick]

Each case is a one-step pipeline whose command writes a known stream; the bench times `apply` (the wall time of
the command alone beside it), reads runner's peak RSS (VmHWM of the runner process, polled every 20 ms) and checks
that the step log holds every byte. Cases:

- 1,000,000 short lines (`seq`), with stdout a pipe (plain reporter), on a pseudo-terminal (the live view, the
  terminal drained by the bench) and with `-v` on a pipe (every line printed);
- one 100 MB line with no newline;
- 500 MB of 41-byte lines (`yes ... | head -c`);
- 20 MB of random bytes (invalid UTF-8, escape sequences among them) on a pseudo-terminal: kept in the log byte
  for byte.

Prints a table of median/min/max per case. `--quick` divides the sizes by 10.
"""

from __future__ import annotations

import argparse
import os
import pty
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def watch_hwm(pid: int, peak: list[float]) -> threading.Thread:
    """Runner's own high-water mark of resident memory (VmHWM, MiB), read every 20 ms until it exits: wait4's
    ru_maxrss would count the pages of the process it was forked from."""

    def watch() -> None:
        while True:
            try:
                with open(f"/proc/{pid}/status", encoding="ascii") as fh:
                    for line in fh:
                        if line.startswith("VmHWM:"):
                            peak[0] = max(peak[0], int(line.split()[1]) / 1024)
            except OSError:
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def run_case(work: Path, command: str, expected: int, *, terminal: bool, verbose: bool) -> dict[str, float]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "pipeline.yaml").write_text(f"name: flood\nsteps:\n  - name: flood\n    run: {command!r}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100", "LINES": "40", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    argv = [sys.executable, "-m", "runner", "apply", *(["-v"] if verbose else [])]
    started = time.perf_counter()
    if terminal:
        leader, follower = pty.openpty()
        proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
        os.close(follower)
        shown = [0]

        def drain() -> None:
            while True:
                try:
                    data = os.read(leader, 1 << 16)
                except OSError:
                    return
                if not data:
                    return
                shown[0] += len(data)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
    else:
        proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)  # fmt: skip
        shown = [0]

        def drain_pipe() -> None:
            assert proc.stdout is not None
            for chunk in iter(lambda: proc.stdout.read(1 << 16), b""):  # type: ignore[union-attr]
                shown[0] += len(chunk)

        reader = threading.Thread(target=drain_pipe, daemon=True)
        reader.start()
    peak = [0.0]
    watcher = watch_hwm(proc.pid, peak)
    proc.wait()
    watcher.join(timeout=5)
    wall = time.perf_counter() - started
    reader.join(timeout=10)
    if terminal:
        os.close(leader)
    code = proc.returncode
    logs = list((work / ".runner" / "logs").glob("*/flood.log"))
    logged = logs[0].stat().st_size if logs else 0
    if code != 0:
        raise SystemExit(f"apply failed ({code}) for {command}")
    return {"wall": wall, "rss_mb": peak[0], "logged": logged, "shown": shown[0], "expected": expected}


def bare(command: str) -> float:
    started = time.perf_counter()
    subprocess.run(["sh", "-c", command], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/runner-bench-output")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    root = Path(args.dir)
    lines = 1_000_000 // scale
    seq_bytes = len("".join(f"{i}\n" for i in range(1, lines + 1)))
    one_line = 100_000_000 // scale
    flood = 500_000_000 // scale
    noise = 20_000_000 // scale
    noise_file = root / "noise.bin"
    root.mkdir(parents=True, exist_ok=True)
    noise_file.write_bytes(os.urandom(noise))
    cases = [
        (f"{lines:,} lines, stdout a pipe", f"seq {lines}", seq_bytes, False, False),
        (f"{lines:,} lines, live view (pty)", f"seq {lines}", seq_bytes, True, False),
        (f"{lines:,} lines, -v on a pipe", f"seq {lines}", seq_bytes, False, True),
        (f"one {one_line // 1_000_000} MB line", f"head -c {one_line} /dev/zero | tr '\\0' x", one_line, False, False),
        (
            f"{flood // 1_000_000} MB of lines",
            f"yes 0123456789012345678901234567890123456789 | head -c {flood}",
            flood,
            False,
            False,
        ),  # fmt: skip
        (f"{noise // 1_000_000} MB random bytes, pty", f"cat {noise_file}", noise, True, False),
    ]
    print(f"{'case':<34} {'bare s':>7} {'apply s (med/min/max)':>24} {'MB/s':>7} {'peak RSS MB':>12} {'log':>6}")
    for title, command, expected, terminal, verbose in cases:
        alone = bare(command)
        runs = [run_case(root / "work", command, expected, terminal=terminal, verbose=verbose)
                for _ in range(args.rounds)]  # fmt: skip
        walls = [r["wall"] for r in runs]
        rss = max(r["rss_mb"] for r in runs)
        whole = all(r["logged"] == expected for r in runs)
        med = statistics.median(walls)
        print(
            f"{title:<34} {alone:7.2f} {med:8.2f} / {min(walls):5.2f} / {max(walls):5.2f} "
            f"{expected / 1e6 / med:7.1f} {rss:12.1f} {'whole' if whole else 'SHORT':>6}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

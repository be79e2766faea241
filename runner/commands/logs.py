"""`runner logs STEP [-f] [--run N]`: a step's log (a detached job's, a Ray job's from its cluster), or follow it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from runner.commands import EXIT_FAILED, EXIT_OK, check_step, open_engine


def run(args: argparse.Namespace) -> int:
    engine, _, _ = open_engine(args)
    if "[" not in args.step:  # a for_each item's log is `name[key]`
        check_step(engine, args.step)
        if args.run is None:
            from steps.base import StepError

            try:
                remote = engine.remote_log(args.step, args.follow)
                if remote is not None:
                    for chunk in remote:
                        sys.stdout.write(chunk)
                        sys.stdout.flush()
                    return EXIT_OK
            except StepError as exc:
                print(f"error: {args.step}: {exc.message}", file=sys.stderr)
                return EXIT_FAILED
            except KeyboardInterrupt:
                return EXIT_OK
    return show_log(engine.log_of(args.step, args.run), args.step, args.follow)


def show_log(path: Path | None, name: str, follow: bool) -> int:
    if path is None or not path.exists():
        print(f"{name}: no log yet" + (f" ({path})" if path else ""), file=sys.stderr)
        return EXIT_FAILED
    with open(path, encoding="utf-8", errors="replace") as fh:
        while True:
            chunk = fh.read(65536)
            if chunk:
                sys.stdout.write(chunk)
                sys.stdout.flush()
                continue
            if not follow:
                return EXIT_OK
            try:
                time.sleep(0.25)
            except KeyboardInterrupt:
                return EXIT_OK

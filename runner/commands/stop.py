"""`runner stop STEP`: stop the job a launch step started."""

from __future__ import annotations

import argparse
import sys

from runner.commands import EXIT_FAILED, EXIT_OK, check_step, open_engine


def run(args: argparse.Namespace) -> int:
    from steps.base import StepError

    engine, _, _ = open_engine(args)
    engine.load_state()
    if not engine.is_removed(args.step):  # a step removed from the pipeline can still be stopped, forgotten
        check_step(engine, args.step)
    try:
        print(f"{args.step}: {engine.stop(args.step)}")
    except StepError as exc:
        print(f"error: {args.step}: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK

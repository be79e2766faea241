"""`runner mark-done STEP`: accept the current state of a step as done, without running it."""

from __future__ import annotations

import argparse
import sys

from runner.commands import EXIT_FAILED, EXIT_OK, check_step, open_engine
from steps.base import StepError


def run(args: argparse.Namespace) -> int:
    engine, _, _ = open_engine(args)
    check_step(engine, args.step)
    try:
        what = engine.mark_done(args.step)
    except StepError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    shown = args.step if what == args.step else f"{args.step} ({what})"
    print(f"{shown}: marked done; apply will treat it as up to date")
    return EXIT_OK

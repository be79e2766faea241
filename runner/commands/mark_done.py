"""`runner mark-done STEP`: accept the current state of a step as done, without running it."""

from __future__ import annotations

import argparse

from runner.commands import EXIT_OK, check_step, open_engine


def run(args: argparse.Namespace) -> int:
    engine, _, _ = open_engine(args)
    check_step(engine, args.step)
    engine.mark_done(args.step)
    print(f"{args.step}: marked done; apply will treat it as up to date")
    return EXIT_OK

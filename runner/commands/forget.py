"""`runner forget STEP`: drop a step's record (and its items' and secrets) so it runs next time."""

from __future__ import annotations

import argparse

from runner.commands import EXIT_OK, check_step, open_engine


def run(args: argparse.Namespace) -> int:
    engine, _, _ = open_engine(args)
    engine.load_state()
    removed = engine.is_removed(args.step)
    if not removed:  # a step removed from the pipeline can still be stopped, forgotten
        check_step(engine, args.step)
    existed = engine.forget(args.step)
    if not existed:
        print(f"{args.step}: had no record")
    elif removed:
        print(f"{args.step}: forgotten; it is no longer in the pipeline, so nothing of it runs again")
    else:
        print(f"{args.step}: forgotten; it runs on the next apply")
    return EXIT_OK

"""`runner forget STEP`: drop a step's record (and its items' and secrets) so it runs next time."""

from __future__ import annotations

import argparse

from runner.commands import EXIT_OK, check_step, open_engine


def run(args: argparse.Namespace) -> int:
    engine, _, _ = open_engine(args)
    engine.load_state()
    if not engine.is_removed(args.step):  # a step removed from the pipeline can still be stopped, forgotten
        check_step(engine, args.step)
    existed = engine.forget(args.step)
    print(f"{args.step}: forgotten; it runs on the next apply" if existed else f"{args.step}: had no record")
    return EXIT_OK

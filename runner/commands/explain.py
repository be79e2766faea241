"""`runner explain STEP`: one step's full reasoning: dependencies, record, fingerprint, rendered spec, probe."""

from __future__ import annotations

import argparse

from runner.commands import EXIT_OK, check_step, open_engine


def run(args: argparse.Namespace) -> int:
    engine, _, _ = open_engine(args)
    check_step(engine, args.step)
    print(engine.explain(args.step))
    return EXIT_OK

"""`runner plan`: what apply would do and why; exit 2 when anything would run, fail or is blocked."""

from __future__ import annotations

import argparse

from runner.commands import EXIT_OK, EXIT_PENDING, open_engine

PENDING = ("run", "maybe", "pending", "fail", "block")


def run(args: argparse.Namespace) -> int:
    engine, reporter, pipeline = open_engine(args)
    reporter.run_started(pipeline.name, str(args.file), [s.name for s in pipeline.steps], "plan")
    decisions = engine.plan()
    reporter.plan(decisions)
    for line in engine.removal_notices():
        reporter.notice(line)
    return EXIT_PENDING if any(d.action in PENDING for d in decisions) else EXIT_OK

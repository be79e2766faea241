"""`runner status`: each step's last result, when, how long, and whether it is up to date."""

from __future__ import annotations

import argparse

from runner.commands import EXIT_OK, open_engine


def run(args: argparse.Namespace) -> int:
    from runner.errors import InputError
    from runner.state import iso
    from runner.ui import fmt_duration

    engine, _, pipeline = open_engine(args)
    try:
        decisions = {d.name: d for d in engine.plan()}
    except InputError:
        decisions = {}
    removed = engine.removed()
    width = max(len(n) for n in [*engine.graph.names, *(r.name for r in removed)])
    print(f"{'STEP':<{width}}  {'KIND':<7} {'LAST':<11} {'FINISHED':<19} {'TOOK':>7}  UP TO DATE")
    for step in pipeline.steps:
        rec = engine.record(step.name)
        last = (rec.status or "-") if rec else "-"
        took = fmt_duration(rec.duration) if rec and rec.duration is not None else "-"
        d = decisions.get(step.name)
        if d is None:
            current = "?"
        elif d.action == "ok":
            current = "yes"
        elif d.action == "skip":
            current = "skipped"
        else:
            current = f"no: {d.reason}"
        finished = iso(rec.finished if rec else None)
        print(f"{step.name:<{width}}  {step.kind:<7} {last:<11} {finished:<19} {took:>7}  {current}")
    for gone in removed:
        rec = engine.record(gone.name)
        last = (rec.status or "-") if rec else "-"
        finished = iso(rec.finished if rec else None)
        still = f"still there: `runner down` {gone.live}" if gone.live else "nothing of it runs"
        row = f"{gone.name:<{width}}  {gone.kind:<7} {last:<11} {finished:<19} {'-':>7}"
        print(f"{row}  removed from the pipeline ({still})")
    return EXIT_OK

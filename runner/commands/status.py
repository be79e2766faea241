"""`runner status`: each step's last result, when, how long, and whether it is up to date."""

from __future__ import annotations

import argparse

from runner.commands import EXIT_OK, open_engine


def run(args: argparse.Namespace) -> int:
    from runner.errors import InputError
    from runner.state import iso, lock_holder
    from runner.ui import fmt_duration

    engine, _, pipeline = open_engine(args)
    try:
        decisions = {d.name: d for d in engine.plan()}
    except InputError:
        decisions = {}
    holder = lock_holder(pipeline.state_dir)  # an apply running now: its steps `started` are running, not crashed
    removed = engine.removed()
    width = max(len(n) for n in ["STEP", *engine.graph.names, *(r.name for r in removed)])
    print(f"{'STEP':<{width}}  {'KIND':<7} {'LAST':<11} {'FINISHED':<19} {'TOOK':>7}  UP TO DATE")
    for step in pipeline.steps:
        rec = engine.record(step.name)
        last = (rec.status or "-") if rec else "-"
        took = fmt_duration(rec.duration) if rec and rec.duration is not None else "-"
        finished = iso(rec.finished if rec else None)
        d = decisions.get(step.name)
        if d is None:
            current = "?"
        elif d.action == "ok":
            current = "yes"
        elif d.action == "skip":
            current = "skipped"
        else:
            current = f"no: {d.reason}"
        if last == "started":  # in this apply, or one that crashed: the time and length of the last are not its
            finished, took = "-", "-"
            if holder is not None:
                last = "running"
                current = f"running now (apply pid {holder.get('pid', '?')})"
        elif engine.run.holding.get(step.name) == "stopped":
            last = "stopped"
            current = f"yes, stopped on purpose: {d.reason}" if d is not None else current
        elif d is not None and d.cause.data.get("exit_code") is not None:
            last = f"exited {d.cause.data['exit_code']}"
        print(f"{step.name:<{width}}  {step.kind:<7} {last:<11} {finished:<19} {took:>7}  {current}")
    for gone in removed:
        rec = engine.record(gone.name)
        last = (rec.status or "-") if rec else "-"
        finished = iso(rec.finished if rec else None)
        still = f"still there: `runner down` {gone.live}" if gone.live else "nothing of it runs"
        row = f"{gone.name:<{width}}  {gone.kind:<7} {last:<11} {finished:<19} {'-':>7}"
        print(f"{row}  removed from the pipeline ({still})")
    return EXIT_OK

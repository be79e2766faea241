"""`runner down [--purge] [--dry-run]`: remove what the pipeline runs (containers, detached and Ray jobs) and
drop its records; with --purge, also what it made on disk (clones, venvs, `creates` files)."""

from __future__ import annotations

import argparse

from runner.commands import EXIT_FAILED, EXIT_OK, open_engine


def run(args: argparse.Namespace) -> int:
    engine, _, _ = open_engine(args)
    said = engine.down(purge=args.purge, dry_run=args.dry_run)
    width = max([20, *(len(name) + 2 for name, _, _ in said)])
    for name, text, bad in said:
        print(f"{'FAILED' if bad else '-':<8} {name:<{width}} {text}")
    unfinished = [name for name, _, bad in said if bad]
    if unfinished:
        print(f"down: not finished ({', '.join(unfinished)}); the records are kept: fix it and run down again")
        return EXIT_FAILED
    if args.dry_run:
        print(
            "down: nothing done (--dry-run)"
            + ("" if args.purge else "; clones, venvs and data are kept (--purge removes them)")
        )
    elif not said:
        print("down: nothing to remove")
    else:
        print("down: done" + ("" if args.purge else "; clones, venvs and data are kept (--purge removes them)"))
    return EXIT_OK

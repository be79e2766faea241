"""`runner validate`: load and check the pipeline only."""

from __future__ import annotations

import argparse

from runner.commands import EXIT_OK, load


def run(args: argparse.Namespace) -> int:
    pipeline = load(args)
    count = len(pipeline.steps)
    print(f"{args.file}: ok ({count} step{'' if count == 1 else 's'})")
    for note in pipeline.notes:
        print(f"note: {note}")
    return EXIT_OK

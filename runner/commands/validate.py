"""`runner validate`: load and check the pipeline only."""

from __future__ import annotations

import argparse

from runner.commands import EXIT_OK, load


def run(args: argparse.Namespace) -> int:
    pipeline = load(args)
    print(f"{args.file}: ok ({len(pipeline.steps)} steps)")
    for note in pipeline.notes:
        print(f"note: {note}")
    return EXIT_OK

"""`runner restore-state`: put the last good snapshot (state.json.backup) back as state.json."""

from __future__ import annotations

import argparse

from runner.commands import EXIT_OK, load


def run(args: argparse.Namespace) -> int:
    from runner.state import restore_backup

    pipeline = load(args)
    print(restore_backup(pipeline.state_dir))
    return EXIT_OK

"""`runner env`: the exported variables as export lines, for `eval "$(runner env)"`."""

from __future__ import annotations

import argparse
import shlex

from runner.commands import EXIT_OK, open_engine


def run(args: argparse.Namespace) -> int:
    engine, _, _ = open_engine(args)
    for key, value in engine.exported_env().items():
        print(f"export {key}={shlex.quote(value)}")
    return EXIT_OK

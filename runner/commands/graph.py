"""`runner graph [--format text|dot|mermaid]`: the dependency graph."""

from __future__ import annotations

import argparse

from runner.commands import EXIT_OK, load


def run(args: argparse.Namespace) -> int:
    from runner.graph import to_dot, to_mermaid, to_text

    pipeline = load(args)
    render = {"text": to_text, "dot": to_dot, "mermaid": to_mermaid}[args.format]
    print(render(pipeline.graph))
    return EXIT_OK

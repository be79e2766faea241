"""`runner schema [-o FILE]`: the JSON Schema of the pipeline file, for editors."""

from __future__ import annotations

import argparse
import json
import sys

from runner.commands import EXIT_OK


def run(args: argparse.Namespace) -> int:
    from runner.schema import pipeline_schema

    text = json.dumps(pipeline_schema(), indent=2) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"wrote {args.output}; point editors at it with a first line of")
        print(f"# yaml-language-server: $schema={args.output}")
    else:
        sys.stdout.write(text)
    return EXIT_OK

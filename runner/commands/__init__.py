"""One module per command, each a `run(args) -> exit code` over the engine's public API; runner/cli.py parses
the command line and picks the module from its table. What several commands share lives here: the exit codes,
loading the pipeline with its reporter, making the engine, and naming an unknown step.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.engine import Engine
    from runner.model import Pipeline
    from runner.ui import Reporter

EXIT_OK, EXIT_FAILED, EXIT_INPUT = 0, 1, 2
EXIT_PENDING = 2  # plan: something would run, fail or is blocked


class UsageError(Exception):
    pass


def parse_vars(items: list[str], files: list[str] | None = None) -> dict[str, Any]:
    """The vars given on the command line: $RUNNER_VAR_FILE's files, then each --var-file, then each --var (the
    last one given wins)."""
    from runner.load import read_var_file

    out: dict[str, Any] = {}
    env_files = [f for f in os.environ.get("RUNNER_VAR_FILE", "").split(os.pathsep) if f]
    for file in [*env_files, *(files or [])]:
        out.update(read_var_file(file))
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _var_name(key):
            raise UsageError(f"--var {item!r}: expected NAME=VALUE, NAME made of letters, digits and _")
        out[key] = value
    return out


def load(args: argparse.Namespace) -> Pipeline:
    from runner.load import load_pipeline

    return load_pipeline(args.file, parse_vars(args.var, getattr(args, "var_file", [])))


def reporter_for(args: argparse.Namespace, pipeline: Pipeline) -> Reporter:
    from runner.ui import JsonReporter, LiveReporter, Reporter, use_live_view

    width = max([20, *(len(s.name) + 2 for s in pipeline.steps)])
    if getattr(args, "json", False):
        return JsonReporter(width=width)
    if args.command == "apply" and use_live_view(sys.stdout):
        return LiveReporter(width=width)
    return Reporter(width=width)


def open_engine(args: argparse.Namespace) -> tuple[Engine, Reporter, Pipeline]:
    """The pipeline, its reporter and an engine with the command's options."""
    from runner.engine import Engine, Options

    pipeline = load(args)
    reporter = reporter_for(args, pipeline)
    options = Options(
        only=getattr(args, "only", []),
        from_step=getattr(args, "from_step", None),
        force=set(getattr(args, "force", [])),
        jobs=getattr(args, "jobs", 1),
        keep_going=getattr(args, "keep_going", False),
        verbose=getattr(args, "verbose", False),
    )
    if options.jobs < 1:
        raise UsageError("-j must be at least 1")
    return Engine(pipeline, reporter, options), reporter, pipeline


def check_step(engine: Engine, name: str, *, items: bool = True) -> str:
    """The step a command names (`NAME`, or `NAME[key]` for one item of a for_each step); InputError (exit 2)
    with the nearest name otherwise."""
    return engine.check_target(name, items=items)


def _var_name(key: str) -> bool:
    from runner.load import VAR_NAME

    return bool(VAR_NAME.match(key))

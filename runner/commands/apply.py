"""`runner apply`: converge; exit 1 when a step failed or was blocked, 2 on bad input, 130/143 on a signal."""

from __future__ import annotations

import argparse

from runner.commands import EXIT_FAILED, EXIT_INPUT, EXIT_OK, open_engine


def run(args: argparse.Namespace) -> int:
    from runner.engine import Interrupted

    engine, reporter, pipeline = open_engine(args)
    reporter.run_started(pipeline.name, str(args.file), [s.name for s in pipeline.steps], "apply")
    try:
        results = engine.apply()
    except Interrupted as exc:
        reporter.close()
        code = 130 if exc.signum == 2 else 143
        reporter.error("interrupted: the running step was stopped; run apply again to resume")
        return code
    except BaseException:
        reporter.close()
        raise
    if any(r.input_error for r in results if r.status == "failed"):
        code = EXIT_INPUT
    elif any(r.status in ("failed", "interrupted", "blocked") for r in results):
        code = EXIT_FAILED
    else:
        code = EXIT_OK
    reporter.run_finished(results, code)
    return code

"""Commands and flags -> engine calls; exit codes: 0 success, 1 a step failed, 2 bad input or usage."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import sys
import traceback
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_INPUT = 0, 1, 2
VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 on usage errors already; keep its text short
        self.print_usage(sys.stderr)
        print(f"runner: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_INPUT)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="runner",
        description="Converge this machine to pipeline.yaml: run only what is missing or stale; re-run to resume.",
    )
    parser.add_argument("--version", action="version", version="runner 0.1.0")
    common = _Parser(add_help=False)
    common.add_argument("-f", "--file", default="pipeline.yaml", help="the pipeline file (default: pipeline.yaml)")
    common.add_argument("--var", action="append", default=[], metavar="K=V", help="override a var (repeatable)")
    common.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    # `logs -f` follows, as in docker and journalctl; there the pipeline file is `--file` only.
    common_long = _Parser(add_help=False)
    common_long.add_argument("--file", default="pipeline.yaml", help="the pipeline file (default: pipeline.yaml)")
    common_long.add_argument("--var", action="append", default=[], metavar="K=V", help="override a var")
    common_long.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def selection(p: argparse.ArgumentParser) -> None:
        p.add_argument("--only", action="append", default=[], metavar="STEP", help="only STEP and what it needs")
        p.add_argument("--from", dest="from_step", metavar="STEP", help="STEP and every step after it")

    p = sub.add_parser("apply", parents=[common], help="converge: run what is missing or stale")
    selection(p)
    p.add_argument("--force", action="append", default=[], metavar="STEP", help="run STEP even if it is ok")
    p.add_argument("-j", "--jobs", type=int, default=1, metavar="N", help="run up to N independent steps at once")
    p.add_argument("--keep-going", action="store_true", help="after a failure, go on with independent steps")
    p.add_argument("-v", "--verbose", action="store_true", help="stream each step's output")
    p.add_argument("--json", action="store_true", help="one JSON object a line for every event (docs/events.md)")
    p = sub.add_parser("plan", parents=[common], help="what apply would do and why (exit 2: changes pending)")
    selection(p)
    p.add_argument("--force", action="append", default=[], metavar="STEP", help="plan as if STEP were forced")
    p.add_argument("--json", action="store_true", help="one JSON object a line per step, then a summary")
    p = sub.add_parser("explain", parents=[common], help="one step's full reasoning: spec, inputs, record, decision")
    p.add_argument("step")
    sub.add_parser("status", parents=[common], help="each step's last result and whether it is up to date")
    p = sub.add_parser("graph", parents=[common], help="the dependency graph")
    p.add_argument("--format", choices=["text", "dot", "mermaid"], default="text")
    sub.add_parser("env", parents=[common], help='exported variables as export lines: eval "$(runner env)"')
    p = sub.add_parser("forget", parents=[common], help="drop a step's record so it runs next time")
    p.add_argument("step")
    p = sub.add_parser("mark-done", parents=[common], help="accept the current state of a step as done")
    p.add_argument("step")
    p = sub.add_parser("logs", parents=[common_long], help="show a step's log (a job's log for a detached launch)")
    p.add_argument("step")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines (Ctrl-C to stop)")
    p.add_argument("--run", type=int, metavar="N", help="the log of the step's Nth most recent run (1: latest)")
    p = sub.add_parser("stop", parents=[common], help="stop the job a launch step started")
    p.add_argument("step")
    sub.add_parser("validate", parents=[common], help="load and check the pipeline only")
    p = sub.add_parser("schema", help="the JSON Schema of the pipeline file, for editors")
    p.add_argument("-o", "--output", metavar="FILE", help="write it to FILE (default: print it)")
    return parser


def parse_vars(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not VAR_NAME.match(key):
            raise UsageError(f"--var {item!r}: expected NAME=VALUE, NAME made of letters, digits and _")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return EXIT_INPUT
    debug = getattr(args, "debug", False) or os.environ.get("RUNNER_DEBUG") == "1"
    from runner.errors import InputError, LockedError, StateError

    as_json = getattr(args, "json", False)

    def json_error(message: str) -> None:
        if as_json:  # the event stream says it too, so a consumer of stdout alone sees why it ended
            print(json.dumps({"event": "error", "message": message}), flush=True)

    try:
        return dispatch(args)
    except UsageError as exc:
        print(f"runner: error: {exc}", file=sys.stderr)
        json_error(str(exc))
        return EXIT_INPUT
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        json_error(str(exc))
        return EXIT_INPUT
    except (StateError, LockedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        json_error(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `runner plan | head`: the reader left; so do we, quietly
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # noqa: BLE001 - the user sees a message, --debug shows the traceback
        if debug:
            traceback.print_exc()
        else:
            print(
                f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
                file=sys.stderr,
            )
        return EXIT_FAILED


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "schema":
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

    from runner.engine import Engine, Interrupted, Options
    from runner.load import load_pipeline
    from runner.ui import JsonReporter, LiveReporter, Reporter, use_live_view

    overrides = parse_vars(args.var)
    pipeline = load_pipeline(args.file, overrides)
    width = max([20, *(len(s.name) + 2 for s in pipeline.steps)])
    reporter: Reporter
    if getattr(args, "json", False):
        reporter = JsonReporter(width=width)
    elif args.command == "apply" and use_live_view(sys.stdout):
        reporter = LiveReporter(width=width)
    else:
        reporter = Reporter(width=width)
    if args.command == "validate":
        print(f"{args.file}: ok ({len(pipeline.steps)} steps)")
        return EXIT_OK
    if args.command == "graph":
        from runner.graph import to_dot, to_mermaid, to_text

        render = {"text": to_text, "dot": to_dot, "mermaid": to_mermaid}[args.format]
        print(render(pipeline.graph))
        return EXIT_OK

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
    engine = Engine(pipeline, reporter, options)

    if args.command == "plan":
        reporter.run_started(pipeline.name, str(args.file), [s.name for s in pipeline.steps], "plan")
        decisions = engine.plan()
        reporter.plan(decisions)
        return 2 if any(d.action in ("run", "maybe", "pending", "fail", "block") for d in decisions) else EXIT_OK
    if args.command == "explain":
        engine_check(engine, args.step)
        print(engine.explain(args.step))
        return EXIT_OK
    if args.command == "apply":
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
    if args.command == "status":
        return show_status(engine)
    if args.command == "env":
        for key, value in engine.exported_env().items():
            print(f"export {key}={shlex.quote(value)}")
        return EXIT_OK
    if args.command == "forget":
        engine_check(engine, args.step)
        existed = engine.forget(args.step)
        print(f"{args.step}: forgotten; it runs on the next apply" if existed else f"{args.step}: had no record")
        return EXIT_OK
    if args.command == "mark-done":
        engine_check(engine, args.step)
        engine.mark_done(args.step)
        print(f"{args.step}: marked done; apply will treat it as up to date")
        return EXIT_OK
    if args.command == "logs":
        if "[" not in args.step:  # a for_each item's log is `name[key]`
            engine_check(engine, args.step)
            if args.run is None:
                from steps.base import StepError

                try:
                    remote = engine.remote_log(args.step, args.follow)
                    if remote is not None:
                        for chunk in remote:
                            sys.stdout.write(chunk)
                            sys.stdout.flush()
                        return EXIT_OK
                except StepError as exc:
                    print(f"error: {args.step}: {exc.message}", file=sys.stderr)
                    return EXIT_FAILED
                except KeyboardInterrupt:
                    return EXIT_OK
        return show_log(engine.log_of(args.step, args.run), args.step, args.follow)
    if args.command == "stop":
        from steps.base import StepError

        engine_check(engine, args.step)
        try:
            print(f"{args.step}: {engine.stop(args.step)}")
        except StepError as exc:
            print(f"error: {args.step}: {exc.message}", file=sys.stderr)
            if exc.hint:
                print(f"hint: {exc.hint}", file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK
    raise UsageError(f"unknown command {args.command}")


def show_log(path: Any, name: str, follow: bool) -> int:
    import time

    if path is None or not path.exists():
        print(f"{name}: no log yet" + (f" ({path})" if path else ""), file=sys.stderr)
        return EXIT_FAILED
    with open(path, encoding="utf-8", errors="replace") as fh:
        while True:
            chunk = fh.read(65536)
            if chunk:
                sys.stdout.write(chunk)
                sys.stdout.flush()
                continue
            if not follow:
                return EXIT_OK
            try:
                time.sleep(0.25)
            except KeyboardInterrupt:
                return EXIT_OK


def engine_check(engine: Any, name: str) -> None:
    from runner.errors import InputError
    from runner.load import suggest

    if name not in engine.graph.names:
        raise InputError(f"no step named {name!r}" + suggest(name, list(engine.graph.names)))


def show_status(engine: Any) -> int:
    from runner.errors import InputError
    from runner.state import iso
    from runner.ui import fmt_duration

    try:
        decisions = {d.name: d for d in engine.plan()}
    except InputError:
        decisions = {}
    width = max(len(n) for n in engine.graph.names)
    print(f"{'STEP':<{width}}  {'KIND':<7} {'LAST':<11} {'FINISHED':<19} {'TOOK':>7}  UP TO DATE")
    for step in engine.pipeline.steps:
        rec = engine.record(step.name)
        last = (rec.status or "-") if rec else "-"
        took = fmt_duration(rec.duration) if rec and rec.duration is not None else "-"
        d = decisions.get(step.name)
        if d is None:
            current = "?"
        elif d.action == "ok":
            current = "yes"
        elif d.action == "skip":
            current = "skipped"
        else:
            current = f"no: {d.reason}"
        finished = iso(rec.finished if rec else None)
        print(f"{step.name:<{width}}  {step.kind:<7} {last:<11} {finished:<19} {took:>7}  {current}")
    return EXIT_OK

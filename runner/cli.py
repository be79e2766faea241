"""The command line: the parser, and a table from each command to its module in runner/commands; exit codes:
0 success, 1 a step failed, 2 bad input or usage (and, for plan, changes pending)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import sys
import time
import traceback
from typing import Any

from runner.commands import EXIT_FAILED, EXIT_INPUT, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 on usage errors already; keep its text short
        self.print_usage(sys.stderr)
        print(f"runner: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_INPUT)


def _pipeline_options(parser: argparse.ArgumentParser, *, short: bool, top: bool = False) -> None:
    """-f/--file, --var, --var-file, --debug: on the top-level parser (dest `top_*`) and on each command's."""
    pre = "top_" if top else ""
    names = ["-f", "--file"] if short else ["--file"]
    parser.add_argument(
        *names, dest=pre + "file", default=None, metavar="FILE", help="the pipeline file (default: pipeline.yaml)"
    )
    parser.add_argument(
        "--var", dest=pre + "var", action="append", default=[], metavar="K=V", help="override a var (repeatable)"
    )
    parser.add_argument(
        "--var-file",
        dest=pre + "var_file",
        action="append",
        default=[],
        metavar="FILE",
        help="vars from a YAML mapping (repeatable; --var wins; also $RUNNER_VAR_FILE)",
    )
    parser.add_argument("--debug", dest=pre + "debug", action="store_true", help="show tracebacks of internal errors")


def _merge_pipeline_options(args: argparse.Namespace) -> None:
    """One value of each pipeline option, whether it was given before the command or after it."""
    top, own = getattr(args, "top_file", None), getattr(args, "file", None)
    if top and own and top != own:
        raise UsageError(f"two pipeline files: -f {top} before the command and {own} after it")
    args.file = own or top or "pipeline.yaml"
    args.var = [*getattr(args, "top_var", []), *getattr(args, "var", [])]
    args.var_file = [*getattr(args, "top_var_file", []), *getattr(args, "var_file", [])]
    args.debug = bool(getattr(args, "top_debug", False) or getattr(args, "debug", False))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="runner",
        description="Converge this machine to pipeline.yaml: run only what is missing or stale; re-run to resume.",
    )
    parser.add_argument("--version", action="version", version="runner 0.1.0")
    # The pipeline options go before the command (`runner -f FILE logs STEP -f`, as docker compose takes them) or
    # after it (`runner plan -f FILE`); after `logs`, `-f` follows, so there the file is `--file`.
    _pipeline_options(parser, short=True, top=True)
    common = _Parser(add_help=False)
    _pipeline_options(common, short=True)
    common_long = _Parser(add_help=False)
    _pipeline_options(common_long, short=False)
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
    p = sub.add_parser(
        "down", parents=[common], help="remove what the pipeline runs (containers, jobs) and drop its records"
    )
    p.add_argument("--purge", action="store_true", help="also remove the clones, venvs and `creates` files it made")
    p.add_argument("--dry-run", action="store_true", help="only say what it would do")
    sub.add_parser("validate", parents=[common], help="load and check the pipeline only")
    sub.add_parser("restore-state", parents=[common], help="put back the last good state snapshot (state.json.backup)")
    p = sub.add_parser("init", parents=[common], help="write a commented starter pipeline.yaml (-f FILE: there)")
    p.add_argument("--force", action="store_true", help="replace the file if it exists")
    p = sub.add_parser("completion", help='a shell completion script: eval "$(runner completion bash)"')
    p.add_argument("shell", choices=["bash", "zsh", "fish"])
    p = sub.add_parser("_names", parents=[common])  # for the completion scripts: no help, not listed
    p.add_argument("--for", dest="for_command", default="")
    p = sub.add_parser("_options")
    p.add_argument("of")
    p = sub.add_parser("schema", help="the JSON Schema of the pipeline file, for editors")
    p.add_argument("-o", "--output", metavar="FILE", help="write it to FILE (default: print it)")
    return parser


def entry() -> int:
    """`runner` and `python -m runner`: main(), then what is left for the interpreter's shutdown made cheap. The
    shutdown's garbage collections walk every object the run made (pydantic's schemas, the kinds): 40 ms of a
    converged run. gc.freeze() moves them to the generation no collection looks at; they are still freed by
    reference count as the modules are torn down, so files are closed and flushed as before."""
    code = main()
    gc.freeze()
    return code


def main(argv: list[str] | None = None) -> int:
    # runner makes many small objects and few cycles: the default collector (a collection every 700 allocations,
    # a full one every 70,000) took 1.4 s of a 3.7 s converged apply of 10,000 steps
    gc.set_threshold(50_000, 20, 100)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        hint = ""
        if args.command == "logs" and args.follow and len(extra) == 1 and not extra[0].startswith("-"):
            file, step = extra[0], args.step  # `logs STEP -f FILE`
            if step.endswith((".yaml", ".yml")) or os.path.isfile(step):  # `logs -f FILE STEP`
                file, step = step, file
            hint = (
                f" (after `logs`, -f means follow, as in docker compose: name the file before the command, "
                f"`runner -f {file} logs {step} -f`, or with --file)"
            )
        parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    if not args.command:
        parser.print_help()
        return EXIT_INPUT
    debug = args.top_debug or getattr(args, "debug", False) or os.environ.get("RUNNER_DEBUG") == "1"
    from runner.errors import InputError, LockedError, StateError

    as_json = getattr(args, "json", False)

    def json_error(message: str) -> None:
        if as_json:  # the event stream says it too, so a consumer of stdout alone sees why it ended
            print(json.dumps({"event": "error", "time": round(time.time(), 3), "message": message}), flush=True)

    from runner.ui import install_printable

    install_printable(args.command)
    try:
        _merge_pipeline_options(args)
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


# command -> its module under runner/commands (imported only when that command runs: `--help` stays fast)
COMMANDS = {
    "apply": "apply",
    "plan": "plan",
    "explain": "explain",
    "status": "status",
    "graph": "graph",
    "env": "env",
    "forget": "forget",
    "mark-done": "mark_done",
    "logs": "logs",
    "stop": "stop",
    "down": "down",
    "validate": "validate",
    "restore-state": "restore_state",
    "schema": "schema",
    "init": "init",
    "completion": "completion",
    "_names": "completion:run_names",
    "_options": "completion:run_options",
}


def dispatch(args: argparse.Namespace) -> int:
    name, _, function = COMMANDS[args.command].partition(":")
    module = importlib.import_module(f"runner.commands.{name}")
    code: int = getattr(module, function or "run")(args)
    return code

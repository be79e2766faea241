"""`runner logs STEP [-f] [--run N]`: a step's log (a detached job's, a Ray job's from its cluster), or follow it."""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time
from pathlib import Path

from runner.commands import EXIT_FAILED, EXIT_OK, check_step, open_engine
from runner.secrets import Masker


def run(args: argparse.Namespace) -> int:
    engine, _, _ = open_engine(args)
    check_step(engine, args.step)
    from runner.state import check_no_links

    check_no_links(engine.pipeline.state_dir)  # as apply and stop: nothing is read through a planted link
    if "[" in args.step:
        engine.check_item(args.step)
    if "[" not in args.step and engine.pipeline.step(args.step).common.for_each is None:
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
    masker = engine.run.masker
    step = engine.pipeline.step(args.step.partition("[")[0])
    if step.common.for_each is not None and "[" not in args.step and args.run is None:
        logs = engine.item_logs(args.step)
        if not logs:
            print(f"{args.step}: no item has a log yet", file=sys.stderr)
            return EXIT_FAILED
        if args.follow:  # one item's log is followed; a loop's are shown once each
            return show_log(logs[-1][1], logs[-1][0], True, masker)
        for i, (item, path) in enumerate(logs):
            sys.stdout.write(("\n" if i else "") + f"==> {item} ({path}) <==\n")
            show_log(path, item, False, masker)
        return EXIT_OK
    return show_log(engine.log_of(args.step, args.run), args.step, args.follow, masker)


def show_log(path: Path | None, name: str, follow: bool, masker: Masker) -> int:
    """The log, masked as it is shown: a detached job writes its own output to its file as it printed it."""
    if path is None or not os.path.lexists(path):
        print(f"{name}: no log yet" + (f" ({path})" if path else ""), file=sys.stderr)
        return EXIT_FAILED
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            print(f"{name}: {path} is a symbolic link: runner never reads a log through one", file=sys.stderr)
        else:
            print(f"{name}: cannot read {path}: {exc.strerror}", file=sys.stderr)
        return EXIT_FAILED
    pending = ""  # what is held back so that no secret is shown cut in two (and so unmasked)
    with open(fd, encoding="utf-8", errors="replace") as fh:
        while True:
            chunk = fh.read(65536)
            if chunk:
                pending += chunk
                cut = pending.rfind("\n") + 1 if len(pending) < 1 << 20 else masker.safe_cut(pending, len(pending))
                sys.stdout.write(masker.mask(pending[:cut]))
                sys.stdout.flush()
                pending = pending[cut:]
                continue
            if pending:  # nothing more for now: the rest of the line, up to where a secret might go on
                cut = masker.safe_end(pending) if follow else len(pending)
                sys.stdout.write(masker.mask(pending[:cut]))
                sys.stdout.flush()
                pending = pending[cut:]
            if not follow:
                return EXIT_OK
            try:
                time.sleep(0.25)
            except KeyboardInterrupt:
                return EXIT_OK

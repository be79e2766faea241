"""apply(): takes the lock, schedules the steps over the graph with -j, and turns signals into Interrupted."""

from __future__ import annotations

import contextlib
import heapq
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FuturesTimeout
from pathlib import Path
from types import FrameType

from runner import words
from runner.causes import cause
from runner.engine.base import Interrupted, RunState
from runner.engine.execute import STATUS_OUTCOME, Executor
from runner.engine.prepare import Removals
from runner.engine.walk import Outcome, Walk
from runner.events import Result
from runner.model import StepDecl
from runner.state import check_writable, pipeline_lock
from runner.util import sweep
from steps import kind_class

RUN_ID = re.compile(r"\d{8}-\d{6}-\d+")  # as RunState makes them: 20261203-234843-5193
KEPT_RUNS = 20


class Scheduler:
    """apply(): the lock, the scheduler (-j, keep-going, blocking), signals and log pruning."""

    def __init__(self, run: RunState, removals: Removals, walk: Walk, executor: Executor) -> None:
        self.run = run
        self.removals = removals
        self.walk = walk
        self.executor = executor

    def apply(self) -> list[Result]:
        with pipeline_lock(self.run.pipeline.state_dir, notice=self.run.reporter.notice):
            self.run.load_state()
            for line in self.removals.removal_notices():
                self.run.reporter.notice(line)
            self.run.secrets.ensure_digest_key()
            self.run.holding.clear()
            check_writable(self.run.pipeline.state_dir)
            log_dir = self.run.pipeline.state_dir / "logs" / self.run.run_id
            self._prune_logs()
            try:
                with _signals_raise(self.run.hurry):
                    return self._schedule(log_dir)
            finally:
                sweep.GUARDIAN.close()
                self.run.state.compact()  # state.json alone holds the whole state once apply ends

    def _prune_logs(self) -> None:
        logs = self.run.pipeline.state_dir / "logs"
        if not logs.is_dir():
            return
        if logs.is_symlink():
            return  # never pruned through a link (check_writable refuses one before any step runs)
        # only the run directories runner made (named by their run id), never a link
        runs = sorted(p for p in logs.iterdir() if RUN_ID.fullmatch(p.name) and p.is_dir() and not p.is_symlink())
        for old in runs[: max(0, len(runs) - KEPT_RUNS + 1)]:
            shutil.rmtree(old, ignore_errors=True)

    def _schedule(self, log_dir: Path) -> list[Result]:
        """The walk in apply: each step is decided (runner/engine/walk.py) once what it waits on has finished,
        with their real outcomes, and carried out; -j N steps at once."""
        self.walk.begin_walk()
        order = self.run.graph.order()
        index = {n: i for i, n in enumerate(order)}
        remaining = {n: len(self.run.graph.after[n]) for n in order}
        ready = [index[n] for n in order if remaining[n] == 0]
        heapq.heapify(ready)
        results: dict[str, Result] = {}
        outcomes: dict[str, Outcome] = {}
        running: dict[Future[Result], str] = {}
        stop = False
        jobs = max(1, self.run.options.jobs)

        def finish(name: str, result: Result) -> None:
            nonlocal stop
            results[name] = result
            outcomes[name] = STATUS_OUTCOME[result.status]
            if result.status in ("failed", "interrupted") and not self.run.options.keep_going:
                stop = True
            for child in self.run.graph.dependents[name]:
                remaining[child] -= 1
                if remaining[child] == 0:
                    heapq.heappush(ready, index[child])

        executor = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="step")
        try:
            while ready or running:
                while ready and len(running) < jobs and not stop:
                    name = order[heapq.heappop(ready)]
                    before = {d: outcomes[d] for d in self.run.graph.after[name]}
                    step = self.run.pipeline.step(name)
                    if step.common.for_each is None and (jobs == 1 or _local_probe(step)):
                        # looked at here: a step that is up to date costs no hand-over to a worker
                        looked = self.executor.look_at(name, before, log_dir, time.monotonic())
                        if isinstance(looked, Result):
                            finish(name, looked)
                            continue
                        running[executor.submit(self.executor.execute, *looked)] = name
                        continue
                    running[executor.submit(self.executor.run_one, name, before, log_dir)] = name
                if not running:
                    break
                done, _ = wait(list(running), timeout=0.2, return_when=FIRST_COMPLETED)
                for fut in done:
                    finish(running.pop(fut), fut.result())
        except Interrupted:
            self.run.cancel.set()
            # the steps running now stop (their groups get the stop signal, then SIGKILL after the grace) and are
            # recorded `interrupted` before apply returns; a second signal only takes the grace away
            said = False
            for fut, name in list(running.items()):
                while True:
                    if self.run.hurry.is_set() and not said:
                        said = True
                        self.run.reporter.notice("stopping now: what still runs gets SIGKILL")
                    try:
                        result = fut.result(timeout=0.1)
                    except FuturesTimeout:
                        continue
                    except Exception as exc:  # noqa: BLE001 - reported, not raised
                        result = Result(name, "interrupted", error=str(exc))
                    break
                results[name] = result
            raise
        finally:
            executor.shutdown(wait=True)
        # Steps never reached (after a failure without --keep-going): those that wait on what failed are blocked
        # by it, as --keep-going would have blocked them; the rest were only not started.
        for name in order:
            if name not in results and name in self.walk.selected_names:
                stopped = [d for d in self.run.graph.after[name] if d in results and _stops(results[d])]
                why = self.walk.waits_on(name, stopped, happened=True).cause if stopped else cause("not_started")
                results[name] = Result(name, "blocked", words.reason(why), cause=why)
                self.run.reporter.never_reached(results[name])
        return [results[n] for n in order if n in results and results[n].status != "unselected"]


def _stops(result: Result) -> bool:
    """What a step waiting on it cannot start after: a failure, or a block that is not a mere "not started"."""
    if result.status in ("failed", "interrupted"):
        return True
    return result.status == "blocked" and (result.cause is None or result.cause.kind != "not_started")


@contextlib.contextmanager
def _signals_raise(hurry: threading.Event) -> Iterator[None]:
    """The first SIGINT or SIGTERM becomes Interrupted in the main thread, so running steps are stopped cleanly
    and recorded; another one while they stop sets `hurry` (no more grace) and is never raised: apply does not
    leave before what it started is stopped and recorded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal raised
        if raised:
            hurry.set()
            return
        raised = True
        raise Interrupted(signum)

    old_int = signal.signal(signal.SIGINT, handler)
    old_term = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def _local_probe(step: StepDecl) -> bool:
    """Its probe reads only this machine: its kind's, and no `host:` sends it elsewhere."""
    if step.common.host:
        return False
    return kind_class(step.kind).local_probe

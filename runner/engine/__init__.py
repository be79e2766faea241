"""The engine: plan() probes every step and decides, with reasons; apply() runs what is needed, journaling each
step. It knows steps only through the contract in steps/base.py; kinds come from the registry.

One module a job, each a collaborator holding the one RunState and the collaborators it asks (``Engine`` builds
them and answers for them):

- ``base``      RunState: the run's shared state (pipeline, records, secrets, outputs, exports) and the selection
- ``prepare``   Preparer: templates, for_each items, ``when``, the validated spec and the fingerprint; Removals
- ``observe``   Observer: what to look at, looking (probe, changes, live work), runner.decide
- ``walk``      Walk: a step's decision from the outcomes before it, for plan and apply alike
- ``plan``      Planner: the walk in graph order with each decision fed back as its outcome
- ``execute``   Executor: one step run and recorded (retries, cancel); a for_each step's items
- ``deadline``  a step's `timeout:`: the kind's apply in a thread, cancelled then killed past it
- ``schedule``  Scheduler: apply(): the lock, -j over the graph, keep-going and blocking, signals
- ``admin``     Admin: explain, forget, mark-done, stop, logs, env
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from runner.engine.admin import Admin
from runner.engine.base import Interrupted, Options, RunState
from runner.engine.execute import Executor
from runner.engine.observe import Observer
from runner.engine.plan import Planner
from runner.engine.prepare import Item, Prepared, Preparer, Removals, RemovedStep
from runner.engine.schedule import Scheduler
from runner.engine.walk import Walk
from runner.events import Decision, Reporter, Result
from runner.graph import Graph
from runner.model import Pipeline
from runner.record import StepRecord

__all__ = ["Engine", "Interrupted", "Item", "Options", "Prepared"]


class Engine:
    """Engine(pipeline, reporter, options): plan(), apply(), and the other commands' queries. It builds the
    collaborators, each holding the one RunState and only the collaborators it asks, and answers for them."""

    def __init__(self, pipeline: Pipeline, reporter: Reporter, options: Options | None = None) -> None:
        self.run = RunState(pipeline, reporter, options)
        self.prep = Preparer(self.run)
        self.removals = Removals(self.run, self.prep)
        self.observer = Observer(self.run)
        self.walk = Walk(self.run, self.prep, self.observer)
        self.planner = Planner(self.run, self.walk)
        self.executor = Executor(self.run, self.prep, self.walk)
        self.scheduler = Scheduler(self.run, self.removals, self.walk, self.executor)
        self.admin = Admin(self.run, self.prep, self.removals, self.observer, self.planner, self.executor)

    @property
    def pipeline(self) -> Pipeline:
        return self.run.pipeline

    @property
    def graph(self) -> Graph:
        return self.run.graph

    def load_state(self) -> None:
        self.run.load_state()

    def check_target(self, target: str, *, items: bool = True) -> str:
        return self.run.check_target(target, items=items)

    def record(self, name: str) -> StepRecord | None:
        return self.run.record(name)

    def plan(self) -> list[Decision]:
        return self.planner.plan()

    def apply(self) -> list[Result]:
        return self.scheduler.apply()

    def removal_notices(self) -> list[str]:
        return self.removals.removal_notices()

    def removed(self) -> list[RemovedStep]:
        return self.removals.removed()

    def is_removed(self, name: str) -> bool:
        return self.removals.is_removed(name)

    def explain(self, target: str) -> str:
        return self.admin.explain(target)

    def forget(self, name: str) -> bool:
        return self.admin.forget(name)

    def mark_done(self, target: str) -> str:
        return self.admin.mark_done(target)

    def down(self, purge: bool, dry_run: bool) -> list[tuple[str, str, bool]]:
        return self.admin.down(purge, dry_run)

    def stop(self, name: str) -> str:
        return self.admin.stop(name)

    def remote_log(self, name: str, follow: bool) -> Iterator[str] | None:
        return self.admin.remote_log(name, follow)

    def check_item(self, target: str) -> None:
        self.admin.check_item(target)

    def item_keys(self, name: str) -> list[str]:
        return self.admin.item_keys(name)

    def log_of(self, name: str, run: int | None = None) -> Path | None:
        return self.admin.log_of(name, run)

    def item_logs(self, name: str) -> list[tuple[str, Path]]:
        return self.admin.item_logs(name)

    def exported_env(self) -> dict[str, str]:
        return self.admin.exported_env()

"""The engine's shared state, and the selection of steps for a run."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from runner.errors import InputError
from runner.events import Reporter
from runner.model import Pipeline
from runner.record import StepRecord
from runner.secrets import Masker, SecretStore
from runner.state import StateStore
from runner.template import Facts
from runner.util.datatype import datatype, field


@datatype
class Options:
    only: list[str] = field(default_factory=list)
    from_step: str | None = None
    force: set[str] = field(default_factory=set)
    jobs: int = 1
    keep_going: bool = False
    verbose: bool = False


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived during apply."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class RunState:
    """The run's shared state, one object every collaborator of the engine holds: the pipeline, records and
    secrets, what steps produced and exported, the holds, the cancel, and the selection."""

    def __init__(self, pipeline: Pipeline, reporter: Reporter, options: Options | None = None) -> None:
        self.pipeline = pipeline
        self.reporter = reporter
        self.options = options or Options()
        self.state = StateStore(pipeline.state_dir)
        self.secrets = SecretStore(pipeline.state_dir)
        self.masker = Masker(pipeline.not_secret)
        for name in pipeline.secrets:
            if self.masker.add_data(pipeline.vars[name]):  # each string of it masked; these too short to be
                reporter.notice(
                    f"warning: secret var {name!r} has a value (or part) shorter than 4 characters: it cannot be "
                    "masked without masking ordinary text; use a longer secret"
                )
        self.masker.scan(pipeline.vars)  # vars named like secrets (api_key, hf_token), URL passwords
        self.facts = Facts()
        self.outputs: dict[str, dict[str, Any]] = {}
        self.digests: dict[str, str] = {}
        # a step this apply ran -> the outputs it had before: what a dependent re-run says changed ("container_id")
        self.replaced: dict[str, dict[str, Any]] = {}
        self.exports: dict[str, dict[str, str]] = {}
        # steps up to date whose service is down on purpose -> how ("stopped", "restart_pending"): what depends
        # on them and would run is blocked (Observer.decide)
        self.holding: dict[str, str] = {}
        self.cancel = threading.Event()
        self.hurry = threading.Event()  # a second signal: what still runs gets SIGKILL, no grace
        self.run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        self.graph = pipeline.graph
        self._check_names()

    def load_state(self) -> None:
        """Read state.json and the secrets file; every kept secret is masked from here on."""
        self.state.load()
        if self.state.skipped:
            shown = "; ".join(self.state.skipped[:5]) + (
                f"; and {len(self.state.skipped) - 5} more" if len(self.state.skipped) > 5 else ""
            )
            self.reporter.notice(
                f"notice: {self.pipeline.state_dir} held corrupt state, left out: {shown}; the steps it recorded "
                "are probed (and run if need be) again"
            )
        self.secrets.load()
        for value in self.secrets.values():
            self.masker.add(value)

    def _check_names(self) -> None:
        wanted = [*self.options.only, *self.options.force]
        if self.options.from_step:
            wanted.append(self.options.from_step)
        for name in wanted:
            self.check_target(name, items=name in self.options.force)

    def check_target(self, target: str, *, items: bool = True) -> str:
        """The step a command names: `NAME`, or `NAME[key]` (an item of a for_each step) where `items` allows;
        InputError otherwise. Returns the step's name (whether the item exists is known once its items render)."""
        from runner.errors import suggest

        known = list(self.graph.names)
        name, bracket, rest = target.partition("[")
        if bracket and not (items and rest.endswith("]") and len(rest) > 1):
            if not items:
                raise InputError(f"{target!r}: name a step here, not an item")
            raise InputError(f"{target!r}: an item is NAME[key], e.g. {name}[first]")
        if name not in known:
            raise InputError(f"no step named {name!r}" + suggest(name, known))
        if bracket and self.pipeline.step(name).common.for_each is None:
            raise InputError(f"{target!r}: step {name!r} has no items (it has no for_each)")
        return name

    def selected(self) -> set[str]:
        """The steps this run may execute: `--only` (with what they need) and `--from` (it and what follows)."""
        names = set(self.graph.names)
        if self.options.only:
            names = self.graph.upstream(set(self.options.only))
        if self.options.from_step:
            start = self.pipeline.step(self.options.from_step).index
            names &= {s.name for s in self.pipeline.steps if s.index >= start}
        return names

    def record(self, name: str) -> StepRecord | None:
        return StepRecord.of(self.state.record(name))

    def adopt_record(self, name: str) -> None:
        record = self.record(name) or StepRecord({})
        self.outputs[name] = {**record.outputs, **self.secrets.get(name)}
        self.digests[name] = record.output_digest

"""plan(): the walk (runner/engine/walk.py) over the whole graph in order, each decision fed back as the step's
outcome; nothing is run. The same rules decide each step in apply."""

from __future__ import annotations

from runner.causes import cause
from runner.engine.base import RunState
from runner.engine.walk import Outcome, Walk, outcome_of
from runner.errors import InputError
from runner.events import Decision
from runner.state import lock_holder


class Planner:
    """plan(): a decision for every selected step, in graph order."""

    def __init__(self, run: RunState, walk: Walk) -> None:
        self.run = run
        self.walk = walk

    def plan(self) -> list[Decision]:
        self.run.load_state()
        self.walk.begin_walk()
        crashed_ok = lock_holder(self.run.pipeline.state_dir) is None
        outcomes: dict[str, Outcome] = {}
        decisions: list[Decision] = []
        for name in self.run.graph.order():
            looked = self.walk.look(name, outcomes, planning=True, crashed_ok=crashed_ok)
            if looked.error is not None:
                if isinstance(looked.error, InputError):
                    raise looked.error
                problem = self.run.masker.mask(looked.error.message)
                if looked.error_item:
                    problem = f"item {looked.error_item}: {problem}"
                outcomes[name] = "failed"
                decisions.append(Decision(name, "fail", cause("would_fail", problem=problem)))
                continue
            if looked.decision is None:
                outcomes[name] = "unselected"
                continue
            outcomes[name] = outcome_of(looked.decision)
            decisions.append(looked.decision)
        return decisions

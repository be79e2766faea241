"""plan(): the walk (runner/engine/walk.py) over the whole graph in order, each decision fed back as the step's
outcome; nothing is run. The same rules decide each step in apply."""

from __future__ import annotations

from runner.causes import cause
from runner.engine.walk import Outcome, Walking, outcome_of
from runner.errors import InputError
from runner.events import Decision
from runner.state import lock_holder


class Planning(Walking):
    """plan(): a decision for every selected step, in graph order."""

    def plan(self) -> list[Decision]:
        self.load_state()
        self.begin_walk()
        crashed_ok = lock_holder(self.pipeline.state_dir) is None
        outcomes: dict[str, Outcome] = {}
        decisions: list[Decision] = []
        for name in self.graph.order():
            looked = self.look(name, outcomes, planning=True, crashed_ok=crashed_ok)
            if looked.error is not None:
                if isinstance(looked.error, InputError):
                    raise looked.error
                problem = self.masker.mask(looked.error.message)
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

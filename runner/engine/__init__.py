"""The engine: plan() probes every step and decides, with reasons; apply() runs what is needed, journaling each
step. It knows steps only through the contract in steps/base.py; kinds come from the registry.

One module a job, each layer built on the one before (``Engine`` is the last):

- ``base``      the run's shared state (pipeline, records, secrets, outputs, exports) and the selection
- ``prepare``   rendering: templates, for_each items, ``when``, the validated spec and the fingerprint
- ``observe``   deciding one step: what to look at, looking (probe, changes, live work), runner.decide
- ``walk``      the one walk: a step's decision from the outcomes before it, for plan and apply alike
- ``plan``      the walk in graph order with each decision fed back as its outcome
- ``execute``   one step run and recorded (retries, cancel); a for_each step's items
- ``deadline``  a step's `timeout:`: the kind's apply in a thread, cancelled then killed past it
- ``schedule``  apply(): the lock, -j over the graph, keep-going and blocking, signals
- ``admin``     explain, forget, mark-done, stop, logs, env
"""

from __future__ import annotations

from runner.engine.admin import Admin
from runner.engine.base import Interrupted, Options
from runner.engine.prepare import Item, Prepared

__all__ = ["Engine", "Interrupted", "Item", "Options", "Prepared"]


class Engine(Admin):
    """Engine(pipeline, reporter, options): plan(), apply(), and the other commands' queries."""

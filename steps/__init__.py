"""Step kinds. Each module defines one kind through the contract in :mod:`steps.base`.

The registry maps a kind key (``run``, ``env``, ``assert`` ...) to the module that implements it, so the
engine imports only the kinds a pipeline uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from steps.base import StepKind

# kind key -> "module:ClassName"; modules are imported on first use only.
KINDS: dict[str, str] = {
    "run": "steps.run:RunStep",
    "env": "steps.env:EnvStep",
    "assert": "steps.assert_:AssertStep",
    "docker": "steps.docker:DockerStep",
    "git": "steps.git:GitStep",
    "pip": "steps.pip:PipStep",
    "launch": "steps.launch:LaunchStep",
    "wait": "steps.wait:WaitStep",
    "capture": "steps.capture:CaptureStep",
    "secret": "steps.secret:SecretStep",
    "e2b": "steps.e2b:E2bStep",
}


_LOADED: dict[str, type[StepKind]] = {}


def kind_class(kind: str) -> type[StepKind]:
    cls = _LOADED.get(kind)
    if cls is None:
        module_name, _, class_name = KINDS[kind].partition(":")
        cls = _LOADED[kind] = getattr(importlib.import_module(module_name), class_name)
    return cls

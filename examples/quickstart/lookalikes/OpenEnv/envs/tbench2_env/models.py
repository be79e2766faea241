"""Look-alike of tbench2_env/models.py: the action, observation and state of a Terminal-Bench-2 episode.

Upstream's are pydantic models on openenv.core's Action, Observation and State; these are dataclasses with the
same fields and defaults, so the env server runs on a bare interpreter inside a sandbox (no openenv, no pydantic).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Tbench2Action:
    """Action for interacting with a TB2 task session."""

    action_type: str = "exec"  # exec, write_file, evaluate, close (this look-alike's subset of upstream's)
    command: str = ""
    session_id: str | None = None
    block: bool = True
    wait_seconds: float | None = None
    file_path: str = ""
    content: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Tbench2Observation:
    """Observation returned from the TB2 environment."""

    instruction: str = ""
    output: str = ""
    success: bool = True
    error: str = ""
    task_id: str = ""
    task_path: str = ""
    session_id: str | None = None
    action_type: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Tbench2State:
    """Server-side state for a TB2 task."""

    episode_id: str | None = None
    step_count: int = 0
    task_id: str = ""
    task_path: str = ""
    session_id: str = ""
    terminal_ready: bool = False
    last_action_type: str = ""
    last_command: str = ""
    last_output: str = ""

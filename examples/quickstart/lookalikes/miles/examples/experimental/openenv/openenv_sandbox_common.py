"""Look-alike of Miles' openenv_sandbox_common.py: the backend registry and its one alias.

As upstream: the names are daytona, e2b and modal, "agentenv" is an alias of e2b (AgentENV speaks the E2B API),
and there is no default: a missing or unknown name is an error that lists the accepted ones.
"""

AGENT_MODULES = {
    "daytona": "openenv_daytona_agent_function",
    "e2b": "openenv_e2b_agent_function",
    "modal": "openenv_modal_agent_function",
}
AGENT_FUNCTIONS = {backend: f"{module}.run" for backend, module in AGENT_MODULES.items()}
_ALIASES = {"agentenv": "e2b"}


def backend_names() -> str:
    return ", ".join(sorted([*AGENT_FUNCTIONS, *_ALIASES]))


def resolve_backend(name: str | None) -> str:
    backend = (name or "").strip().lower()
    allowed = backend_names()
    if not backend:
        raise ValueError(f"no sandbox backend named; choose one of: {allowed}")
    backend = _ALIASES.get(backend, backend)
    if backend not in AGENT_FUNCTIONS:
        raise ValueError(f"unknown sandbox backend {name!r}; choose one of: {allowed}")
    return backend

"""Look-alike of Miles' openenv_agent_function.py: the agent contract and its imports.

Upstream imports the OpenAI client at module level, so make_tbench2_data.py (which takes the system prompt from
here) needs the ``openai`` package installed: the flagship's tbench2_env step installs it for that reason.
"""

from openai import AsyncOpenAI  # noqa: F401 - imported for what upstream's import costs, not used here

TB2_AGENT_SYSTEM_PROMPT = (
    "You are an agent solving a terminal task. On each turn respond with exactly one shell command inside a "
    "single ```bash code block. When the task is complete, reply with TASK_COMPLETE."
)

"""Look-alike of OpenEnv's tbench2_env: Terminal-Bench-2 tasks as OpenEnv episodes.

As upstream it exports the client and the models; its server (server/app.py) runs inside each task's sandbox and
serves the task over OpenEnv's /ws protocol. As upstream's pyproject lays it out (package-dir: tbench2_env = ".",
tbench2_env.server = "server"), this directory is the package itself.
"""

from tbench2_env.client import Tbench2Env
from tbench2_env.models import Tbench2Action, Tbench2Observation, Tbench2State

__all__ = ["Tbench2Action", "Tbench2Observation", "Tbench2Env", "Tbench2State"]

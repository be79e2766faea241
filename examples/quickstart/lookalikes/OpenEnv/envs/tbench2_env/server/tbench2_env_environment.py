"""Look-alike of OpenEnv's tbench2_env/server/tbench2_env_environment.py: the native-evaluate contract.

Since OpenEnv 04d259ea6 (#1012) the tests are withheld from the agent's workspace until evaluation. Miles'
launcher preflight reads this very file of the installed package and refuses to start unless it names
TB2_WITHHOLD_TESTS (examples/experimental/openenv/openenv_launch_common.py), so the switch lives here.
"""

from __future__ import annotations

import os

TB2_WITHHOLD_TESTS = os.environ.get("TB2_WITHHOLD_TESTS", "1") != "0"

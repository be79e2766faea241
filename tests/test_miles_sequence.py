"""The look-alike of Miles' tb2_sandbox_e2b.py, driven against the stand-in through the sequence Miles' real module
runs (radixark/miles 31f1ca96, examples/experimental/openenv/tb2_sandbox_e2b.py:120-260): the alias, a build with
user root and the recipe's layers, a sandbox with the recipe's metadata, the env server started in the background,
its /health reached at get_host(8000) through the stand-in's proxy, the set_timeout keepalive, an episode over /ws,
and the kill. Every answer checked here is one docs/upstream.md cites (AgentENV e3dcc6a, e2b 2.63).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from standin import standin

KEY = "e2b_" + "5eed" * 10
LOOKALIKES = ROOT / "examples" / "quickstart" / "lookalikes"
OPENENV_DIR = LOOKALIKES / "miles" / "examples" / "experimental" / "openenv"

SEQUENCE = r"""
import json, sys, time
from pathlib import Path
import requests
from e2b import Sandbox, Template
import tb2_sandbox_e2b as E
from tbench2_env import Tbench2Action, Tbench2Env

tasks = Path(sys.argv[1])
said = {}
alias = E.template_alias(tasks / "hello-world")
said["alias"] = alias
said["existed_before"] = Template.alias_exists(alias, api_key=E.resolve_api_key())
first, url = E.create_task_sandbox(tasks / "hello-world", command_timeout_s=30, ready_timeout_s=20)
second, url2 = E.create_task_sandbox(tasks / "count-words", command_timeout_s=30, ready_timeout_s=20)
said["exists_after"] = Template.alias_exists(alias, api_key=E.resolve_api_key())
said["ids"] = [first.sandbox_id, second.sandbox_id]
said["urls"] = [url, url2]
info = Sandbox.get_info(first.sandbox_id, api_key=E.resolve_api_key())
said["metadata"] = dict(info.metadata or {})
said["resources"] = [info.cpu_count, info.memory_mb]
said["health"] = [requests.get(u + "/health", timeout=5).json() for u in (url, url2)]
end0 = info.end_at.timestamp()
time.sleep(3.2)  # the keepalive (TTL 6 s: every 1 s) re-arms the TTL
said["end_moved"] = Sandbox.get_info(first.sandbox_id, api_key=E.resolve_api_key()).end_at.timestamp() - end0
for u, task, solution in ((url, "hello-world", True), (url2, "count-words", False)):
    with Tbench2Env(base_url=u, message_timeout_s=30).sync() as env:
        reset = env.reset()
        listing = env.step(Tbench2Action(action_type="exec", command="ls ../opt/tb2-tasks/" + task))
        if solution:
            env.step(Tbench2Action(action_type="exec", command=(tasks / task / "solution" / "solve.sh").read_text()))
        verdict = env.step(Tbench2Action(action_type="evaluate"))
        said[task] = {"task": reset.observation.task_id, "staged": listing.observation.output.split(),
                      "reward": verdict.reward, "done": verdict.done}
E.kill_sandbox(first)
E.kill_sandbox(second)
said["left"] = [s.sandbox_id for s in Sandbox.list(api_key=E.resolve_api_key()).next_items()]
print(json.dumps(said))
"""


def test_the_lookalike_sandbox_module_runs_mileses_sequence_against_the_standin(tmp_path: Path) -> None:
    tasks = tmp_path / "terminal-bench-2"
    shutil.copytree(LOOKALIKES / "terminal-bench-2", tasks)
    with standin(tmp_path, KEY, "--proxy-domains", "sandboxes.test") as url:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(OPENENV_DIR), str(LOOKALIKES / "OpenEnv" / "envs")]),
            "E2B_API_URL": url,
            "E2B_SANDBOX_URL": url,
            "E2B_API_KEY": KEY,
            "OPENENV_E2B_URL_SCHEME": "http",
            "OPENENV_E2B_SANDBOX_TTL_S": "6",
            "OPENENV_LAUNCHER": "tester",
            "OPENENV_RUN_ID": "run-7",
            "HTTP_PROXY": url,  # no DNS for *.sandboxes.test: the stand-in routes those hosts by Host
            "NO_PROXY": "127.0.0.1,localhost",
        }
        done = subprocess.run(
            [sys.executable, "-c", SEQUENCE, str(tasks)], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr + (tmp_path / f"standin-{url.rsplit(':', 1)[1]}.log").read_text()
        said = json.loads(done.stdout.splitlines()[-1])
        sandboxes = list((tmp_path).glob("sb-*/sandboxes/*"))
        templates = list((tmp_path).glob("sb-*/templates/*"))

    assert said["alias"].startswith("tb2-hello-world-") and not said["existed_before"] and said["exists_after"]
    # sandbox.rs:228-231: the create answer carries the configured domain, so get_host(8000) is routable
    assert said["urls"] == [f"http://8000-{sid}.sandboxes.test" for sid in said["ids"]]
    assert said["metadata"] == {
        "openenv-tbench2-task": "hello-world",
        "openenv-launcher": "tester",
        "openenv-run-id": "run-7",
    }
    assert said["resources"] == [1, 2048]  # the template's resources (the recipe's floors), not the default
    # proxy.rs:165-177: each host reaches port 8000 in its own sandbox; two sandboxes both serve 8000
    assert said["health"] == [{"status": "healthy"}, {"status": "healthy"}]
    assert said["end_moved"] > 2.0, said  # POST /sandboxes/{id}/timeout (204) re-armed the TTL
    # the staged task has no solution/ (the recipe keeps it out) and, withheld at reset, no tests/
    assert said["hello-world"] == {
        "task": "hello-world",
        "staged": ["environment", "instruction.md", "task.toml"],
        "reward": 1.0,
        "done": True,
    }
    assert said["count-words"]["task"] == "count-words" and said["count-words"]["reward"] == 0.0
    assert said["left"] == [] and sandboxes == []  # killed, their directories gone
    assert len(templates) == 2  # one build per task: the second create of nothing rebuilt


def test_the_alias_changes_with_every_input_of_the_recipe(tmp_path: Path) -> None:
    tasks = tmp_path / "terminal-bench-2"
    shutil.copytree(LOOKALIKES / "terminal-bench-2", tasks)
    source = tmp_path / "envs"
    shutil.copytree(LOOKALIKES / "OpenEnv" / "envs", source)
    script = (
        "import sys; from pathlib import Path; import tb2_sandbox_e2b as E; "
        "print(E.template_alias(Path(sys.argv[1]) / 'hello-world'))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(OPENENV_DIR), str(source)])}

    def alias() -> str:
        done = subprocess.run([sys.executable, "-c", script, str(tasks)], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    seen = [alias()]
    assert alias() == seen[0]  # deterministic: the same inputs, the same alias
    (tasks / "hello-world" / "tests" / "test.sh").write_text("#!/bin/bash\nexit 0\n")  # the staged task
    seen.append(alias())
    (source / "tbench2_env" / "server" / "app.py").write_text("# changed\n", encoding="utf-8")  # the env source
    seen.append(alias())
    toml = tasks / "hello-world" / "task.toml"
    toml.write_text(toml.read_text().replace("memory_mb = 2048", "memory_mb = 4096"))  # the resources
    seen.append(alias())
    (tasks / "hello-world" / "solution" / "solve.sh").write_text("echo other\n")  # not in the image: no rebuild
    seen.append(alias())
    assert len(set(seen[:4])) == 4 and seen[4] == seen[3], seen

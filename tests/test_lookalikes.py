"""The look-alike repositories behave as upstream does where the pipelines touch them (docs/upstream.md).

The launcher is a typer CLI made from a dataclass (dash options, MILES_SCRIPT_* variables, typer's exit 2 for an
unknown option); make_tbench2_data.py is a Tap CLI (underscore options, no mkdir of the output's directory); the
preflight refuses what upstream's openenv_launch_common refuses. A look-alike that accepted what upstream
rejects would let a wrong pipeline pass its rehearsal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

LOOK = ROOT / "examples" / "quickstart" / "lookalikes"
OPENENV_DIR = LOOK / "miles" / "examples" / "experimental" / "openenv"
LAUNCHER = OPENENV_DIR / "run-openenv-tbench2.py"
DATA = OPENENV_DIR / "make_tbench2_data.py"
TASKS = LOOK / "terminal-bench-2"


def run(
    script: Path, *args: str, tmp_path: Path, envs_dir: Path = LOOK / "OpenEnv" / "envs", **env: str
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MILES_SCRIPT_", "OPENENV_", "E2B_"))}
    base["PYTHONPATH"] = os.pathsep.join([str(LOOK / "miles"), str(envs_dir)])
    base["HOME"] = str(tmp_path)  # no ~/.config/e2b/api_key of the user's
    base["_TYPER_STANDARD_TRACEBACK"] = "1"  # plain tracebacks: messages unwrapped
    base["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def table(output: str) -> dict[str, str]:
    """The resolved-arguments table dataclass_cli prints before it calls main."""
    rows = {}
    for line in output.splitlines():
        if line.startswith("| ") and line.count("|") == 3:
            name, value = (cell.strip() for cell in line.strip("|").split("|"))
            rows[name] = value
    return rows


def test_the_launcher_refuses_underscore_options_as_typer_does(tmp_path: Path) -> None:
    result = run(LAUNCHER, "--prompt_data", "/x.jsonl", tmp_path=tmp_path)
    assert result.returncode == 2
    assert "No such option" in result.stderr and "--prompt_data" in result.stderr
    helped = run(LAUNCHER, "--help", tmp_path=tmp_path)
    assert helped.returncode == 0
    for option in ("--prompt-data", "--num-gpus-per-node", "--num-nodes", "--skip-prepare", "--base-dir"):
        assert option in helped.stdout, option
    assert "MILES_SCRIPT_PROMPT_DATA" in helped.stdout


def test_options_and_miles_script_variables_set_the_same_fields(tmp_path: Path) -> None:
    defaults = run(LAUNCHER, "--skip-prepare", tmp_path=tmp_path)
    rows = table(defaults.stdout)
    assert rows["prompt_data"] == "/root/tbench2_train.jsonl" and rows["num_gpus_per_node"] == "8"
    assert rows["num_nodes"] == "1"  # SLURM_JOB_NUM_NODES unset

    from_env = run(
        LAUNCHER,
        "--skip-prepare",
        tmp_path=tmp_path,
        MILES_SCRIPT_PROMPT_DATA="/from/env.jsonl",
        MILES_SCRIPT_NUM_GPUS_PER_NODE="2",
        SLURM_JOB_NUM_NODES="4",
    )
    rows = table(from_env.stdout)
    assert rows["prompt_data"] == "/from/env.jsonl" and rows["num_gpus_per_node"] == "2" and rows["num_nodes"] == "4"

    both = run(
        LAUNCHER,
        "--skip-prepare",
        "--prompt-data",
        "/from/option.jsonl",
        tmp_path=tmp_path,
        MILES_SCRIPT_PROMPT_DATA="/from/env.jsonl",
    )
    assert table(both.stdout)["prompt_data"] == "/from/option.jsonl"  # the option wins, as click resolves it


def test_prepare_converts_once_on_num_gpus_per_node(tmp_path: Path) -> None:
    first = run(LAUNCHER, "--base-dir", str(tmp_path), "--num-gpus-per-node", "3", tmp_path=tmp_path)
    assert "torchrun --nproc-per-node 3" in first.stdout
    tracker = tmp_path / "GLM-4.7-Flash_torch_dist" / "latest_checkpointed_iteration.txt"
    assert tracker.read_text().strip() == "release"
    again = run(LAUNCHER, "--base-dir", str(tmp_path), tmp_path=tmp_path)
    assert "convert_checkpoint skip" in again.stdout and "torchrun" not in again.stdout


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OPENENV_TB2_TASKS_DIR": str(TASKS)}, "set openenv_sandbox_backend (OPENENV_SANDBOX_BACKEND)"),
        ({"OPENENV_SANDBOX_BACKEND": "agentenv"}, "set openenv_tb2_tasks_dir"),
        (
            {"OPENENV_TB2_TASKS_DIR": str(TASKS), "OPENENV_SANDBOX_BACKEND": "agentenv", "E2B_API_KEY_FILE": "/no"},
            "E2B_API_KEY_FILE=/no is missing or empty",
        ),
        (
            {"OPENENV_TB2_TASKS_DIR": str(TASKS), "OPENENV_SANDBOX_BACKEND": "agentenv"},
            "the E2B sandbox mode needs credentials",
        ),
        (
            {
                "OPENENV_TB2_TASKS_DIR": str(TASKS),
                "OPENENV_SANDBOX_BACKEND": "agentenv",
                "E2B_API_KEY": "e2b_x",
                "E2B_API_URL": "http://user:pw@127.0.0.1:8000",
            },
            "E2B_API_URL looks like it embeds credentials ('@')",
        ),
    ],
    ids=["backend-missing", "tasks-dir-missing", "key-file-missing", "no-key", "url-with-credentials"],
)
def test_the_preflight_refuses_what_upstream_refuses(tmp_path: Path, env: dict[str, str], message: str) -> None:
    result = run(LAUNCHER, "--skip-prepare", tmp_path=tmp_path, **env)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-2000:]


def test_the_preflight_reads_one_file_of_tbench2_env(tmp_path: Path) -> None:
    """Upstream checks server/tbench2_env_environment.py alone: the switch named elsewhere does not count."""
    envs = tmp_path / "envs"
    shutil.copytree(LOOK / "OpenEnv" / "envs" / "tbench2_env", envs / "tbench2_env")
    server = envs / "tbench2_env" / "server" / "tbench2_env_environment.py"
    server.write_text(server.read_text().replace("TB2_WITHHOLD_TESTS", "TB2_OLD_SWITCH"))
    (envs / "tbench2_env" / "README.md").write_text("TB2_WITHHOLD_TESTS is described here\n")
    env = {"OPENENV_TB2_TASKS_DIR": str(TASKS), "OPENENV_SANDBOX_BACKEND": "agentenv", "E2B_API_KEY": "e2b_x"}
    result = run(LAUNCHER, "--skip-prepare", tmp_path=tmp_path, envs_dir=envs, **env)
    assert result.returncode != 0
    assert "lacks the native-evaluate contract (canonical test.sh scoring / TB2_WITHHOLD_TESTS)" in result.stderr


def test_make_tbench2_data_is_a_tap_cli_with_underscores(tmp_path: Path) -> None:
    dashed = run(DATA, "--tasks-dir", str(TASKS), "--output", str(tmp_path / "d.jsonl"), tmp_path=tmp_path)
    assert dashed.returncode == 2 and "unrecognized arguments: --tasks-dir" in dashed.stderr

    out = tmp_path / "d.jsonl"
    made = run(DATA, "--tasks_dir", str(TASKS), "--output", str(out), "--n", "2", tmp_path=tmp_path)
    assert made.returncode == 0, made.stderr
    assert len(out.read_text().splitlines()) == 2 and f"Wrote 2 TB2 tasks to {out}" in made.stdout

    # upstream opens the output for writing and makes no directory for it
    nested = run(DATA, "--tasks_dir", str(TASKS), "--output", str(tmp_path / "no" / "d.jsonl"), tmp_path=tmp_path)
    assert nested.returncode != 0 and "No such file or directory" in nested.stderr

"""What a new user trips on, round two (issue 34): each case as a user met it, in process through the real CLI
(tests/harness.py), with real `run` steps where a shell command is the point."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.conftest import Project
from tests.harness import WORLD, Harness

PREP_COUNT_TRAIN = """
    steps:
      - name: prep
        for_each: "{{ vars.items }}"
        run: {command: "mkdir -p data && echo {{ item }} > data/{{ item }}.txt", creates: ["data/{{ item }}.txt"]}
      - name: count
        run: {command: "cat data/*.txt | wc -l"}
      - name: train
        run: {command: "echo trained on {{ steps.count.stdout }} > trained"}
"""


def test_a_step_left_ok_after_a_file_order_upstream_ran_says_so_and_how_to_re_run_it(runner: Harness) -> None:
    runner.write(PREP_COUNT_TRAIN)
    assert runner("apply", "--var", "items=a,b").code == 0
    note = "not re-run for prep above it in the file (file order only orders): `needs: [prep]` re-runs it"

    plan = runner("plan", "--var", "items=a,b,c")
    assert plan.planned()["count"].startswith("ok up to date; " + note), plan.out
    assert note not in plan.planned()["train"]  # it depends on count by data: nothing ran above it
    applied = runner("apply", "--var", "items=a,b,c")
    assert applied.code == 0
    count_line = next(line for line in applied.out.splitlines() if " count " in line)
    assert count_line.startswith("ok") and note in count_line, applied.out
    as_json = runner("apply", "--json", "--var", "items=a,b,c,d").finished()
    assert as_json["count"]["cause"]["order_only"] == ["prep"], as_json["count"]
    # nothing ran above it this time: no word of it
    assert note not in runner("plan", "--var", "items=a,b,c,d").out

    explained = runner("explain", "count", "--var", "items=a,b,c,d").out
    assert "depends on: nothing" in explained and "runs after: prep (file order" in explained, explained
    assert "needed by: train" in explained
    assert "runs before: count (file order only)" in runner("explain", "prep", "--var", "items=a,b,c,d").out

    # the fix it names works: with `needs: [prep]`, a new item re-runs count and so train
    runner.write(PREP_COUNT_TRAIN.replace("      - name: count\n", "      - name: count\n        needs: [prep]\n"))
    assert runner("apply", "--var", "items=a,b,c,d").code == 0
    fixed = runner("apply", "--var", "items=a,b,c,d,e")
    assert "changed  count" in fixed.out and "changed  train" in fixed.out, fixed.out
    assert (runner.path / "trained").read_text().split() == ["trained", "on", "5"]


def test_a_yaml_merge_may_be_overridden_and_x_keys_hold_anchors(runner: Harness) -> None:
    runner.write(
        """
        x-common: &common
          retries: 1
          timeout: 30
          fake: {value: merged}
        steps:
          - name: a
            <<: *common
            retries: 3
            fake: {value: own}
          - name: b
            <<: *common
        """
    )
    checked = runner("validate")
    assert checked.code == 0 and "ok (2 steps)" in checked.out, checked.err
    assert runner("apply").code == 0
    assert WORLD.made == {"a": "own", "b": "merged"}
    from runner.load import load_pipeline

    a, b = load_pipeline(runner.path / "pipeline.yaml").steps
    assert (a.common.retries, a.common.timeout, b.common.retries) == (3, 30, 1)


def test_a_templated_port_mapping_is_checked_once_rendered(runner: Harness) -> None:
    runner.write(
        """
        vars: {port: "8123"}
        steps:
          - name: c
            docker: {name: c1, image: busybox, ports: ["{{ vars.port }}:8080"], volumes: ["./{{ vars.port }}:/d"]}
        """
    )
    assert runner("validate").code == 0
    explained = runner("explain", "c")
    assert '"8123:8080"' in explained.out, explained.err
    bad = runner("plan", "--var", "port=abc")
    assert bad.code == 2 and "pipeline.yaml:4:" in bad.err and "'abc:8080' is not a port mapping" in bad.err, bad.err


def test_forget_of_a_removed_step_does_not_say_it_runs_again(runner: Harness) -> None:
    runner.write("steps:\n  - name: a\n    fake: {}\n  - name: gone\n    fake: {}\n")
    assert runner("apply").code == 0
    runner.write("steps:\n  - name: a\n    fake: {}\n")
    said = runner("forget", "gone")
    assert said.code == 0 and "no longer in the pipeline" in said.out and "runs on the next apply" not in said.out
    kept = runner("forget", "a")
    assert kept.code == 0 and "a: forgotten; it runs on the next apply" in kept.out


def test_logs_of_an_item_that_does_not_exist_is_bad_input(runner: Harness) -> None:
    runner.write('steps:\n  - name: loop\n    for_each: "alpha,beta"\n    run: {command: "echo {{ item }}"}\n')
    assert runner("apply").code == 0
    wrong = runner("logs", "loop[alpah]")
    assert wrong.code == 2 and "step 'loop' has no item 'alpah'; did you mean 'alpha'?" in wrong.err, wrong.err
    right = runner("logs", "loop[beta]")
    assert right.code == 0 and right.out.strip() == "beta"
    # an item dropped from the list keeps its log: still known
    runner.write('steps:\n  - name: loop\n    for_each: "alpha"\n    run: {command: "echo {{ item }}"}\n')
    assert runner("logs", "loop[beta]").code == 0


def test_logs_dash_f_before_the_file_gets_the_command_it_meant(capsys: pytest.CaptureFixture[str]) -> None:
    from runner import cli

    for argv, meant in (
        (["logs", "-f", "other.yaml", "a"], "`runner -f other.yaml logs a -f`"),
        (["logs", "a", "-f", "other.yaml"], "`runner -f other.yaml logs a -f`"),
    ):
        with pytest.raises(SystemExit) as ended:
            cli.main(argv)
        assert ended.value.code == 2
        assert meant in capsys.readouterr().err


def test_fail_fast_recap_tells_blocked_from_not_started(runner: Harness) -> None:
    runner.write(
        """
        steps:
          - name: a
            fake: {fail: true}
          - name: b
            fake: {}
          - name: c
            needs: []
            fake: {}
          - name: d
            needs: [b]
            fake: {}
        """
    )
    said = runner("apply")
    assert said.code == 1
    assert "blocked=2 (b, d) not-started=1 (c)" in said.out, said.out
    finished = runner("apply", "--json").finished()  # every step has its step_finished, reached or not
    assert finished["c"]["status"] == "blocked" and finished["c"]["cause"] == {"kind": "not_started"}
    assert finished["d"]["cause"] == {"kind": "waits_on", "roots": ["a"], "via": ["b"], "holds": {}, "happened": True}
    kept = runner("apply", "--keep-going")
    assert "blocked=2 (b, d)" in kept.out and "not-started" not in kept.out, kept.out


def test_a_re_run_for_an_upstream_that_ran_says_what_of_it_changed(runner: Harness) -> None:
    runner.write(
        """
        steps:
          - name: a
            run: {command: "date +%N"}
          - name: c
            needs: [a]
            run: {command: "echo c"}
        """
    )
    assert runner("apply").code == 0
    forced = runner("apply", "--force", "a")
    line = next(line for line in forced.out.splitlines() if line.startswith("running  c"))
    assert "upstream changed: a (re-run by --force; new stdout)" in line, forced.out
    cause = runner("apply", "--json", "--force", "a").finished()["c"]["cause"]
    assert cause["outputs"] == {"a": ["stdout"]} and cause["forced"] == ["a"], cause


def test_a_failed_script_check_shows_its_message_not_its_script(runner: Harness) -> None:
    runner.write(
        """
        steps:
          - name: chk
            assert:
              command: |
                test -f /nonexistent
                echo checking more
                exit 1
              message: the file is missing
        """
    )
    said = runner("apply")
    errors = [line for line in said.out.splitlines() if "error:" in line]
    assert errors == ["    error: the file is missing (`test -f /nonexistent ... (3 lines)` exited with code 1)"], (
        said.out
    )


def test_plan_says_a_container_would_fail_without_an_engine(
    runner: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    runner.write(
        """
        steps:
          - name: aenv
            docker: {name: runner-test-no-engine, image: busybox}
          - name: after
            run: {command: "echo {{ steps.aenv.container_id }}"}
        """
    )
    plan = runner("plan")
    assert plan.code == 2
    planned = plan.planned()
    assert planned["aenv"].startswith("fail would fail: cannot reach the Docker Engine at unix://"), plan.out
    assert planned["after"] == "block blocked: aenv would fail"
    applied = runner("apply", "--keep-going")
    assert "cannot reach the Docker Engine" in applied.out and "blocked=1 (after)" in applied.out, applied.out


def _until(predicate, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_status_says_stopped_exited_and_running_and_keeps_its_columns(runner: Harness) -> None:
    runner.write(
        """
        steps:
          - name: j
            launch: {detach: true, command: "sleep 600"}
          - name: k
            launch: {detach: true, command: "sleep 1.5; exit 5"}
          - name: s
            run: {command: "sleep 2"}
        """
    )
    try:
        assert runner("apply").code == 0
        assert runner("stop", "j").code == 0
        _until(lambda: "exited 5" in runner("status").out)
        rows = runner("status").out.splitlines()
        assert rows[0].startswith("STEP  KIND    LAST ")  # the header and the rows share their columns
        row = {line.split()[0]: line for line in rows[1:]}
        assert all(line.index("launch") == rows[0].index("KIND") for line in (row["j"], row["k"]))
        assert row["j"].split()[2] == "stopped" and "yes, stopped on purpose: stopped by `runner stop`" in row["j"]
        assert row["k"].split()[2:4] == ["exited", "5"] and "no: the job exited with code 5" in row["k"]

        project = Project(runner.path)
        started = project.popen("apply", "--force", "s", "--only", "s")
        seen: list[str] = []
        _until(lambda: bool(seen.append(runner("status").out) or "running now" in seen[-1]))
        during = {line.split()[0]: line for line in seen[-1].splitlines()[1:]}
        assert started.wait(timeout=30) == 0
        assert during["s"].split()[2:4] == ["running", "-"], during["s"]
        assert f"running now (apply pid {started.pid})" in during["s"]
        after = {line.split()[0]: line for line in runner("status").out.splitlines()[1:]}
        assert after["s"].split()[2] == "done" and after["s"].endswith("yes")
    finally:
        runner("down")


def test_a_stdout_cut_at_64_kib_is_said_when_it_is_cut(runner: Harness) -> None:
    runner.write(
        """
        steps:
          - name: big
            run: {command: "python3 -c 'print(\\"x\\" * 100000)'"}
          - name: small
            run: {command: "echo {{ steps.big.stdout | length }} > length"}
        """
    )
    said = runner("apply")
    assert said.code == 0
    assert "big: its output is longer than 64 KiB: `steps.big.stdout` keeps the first 64 KiB" in said.err, said.err
    assert (runner.path / "length").read_text().strip() == str(64 * 1024)
    assert "longer than" not in runner("apply", "--force", "small").err  # said of the step that was cut only


def test_work_whose_creates_all_exist_but_has_no_record_names_mark_done(runner: Harness) -> None:
    runner.write(PREP_COUNT_TRAIN)
    assert runner("apply", "--var", "items=a,b,c").code == 0
    assert runner("apply", "--var", "items=a,b").code == 0  # c dropped from the list: its record goes
    plan = runner("plan", "--var", "items=a,b,c")
    hint = "no record yet; every `creates` exists: `runner mark-done prep[c]` takes it as done"
    assert hint in plan.planned()["prep"], plan.out
    assert runner("mark-done", "prep[c]", "--var", "items=a,b,c").code == 0
    assert runner("plan", "--var", "items=a,b,c").planned()["prep"] == "ok 3 items up to date"
    # renamed: the same hint for the new name; a creates that is missing gets none
    runner.write(PREP_COUNT_TRAIN.replace("name: prep", "name: make"))
    assert "`runner mark-done make[a]`" in runner("plan", "--var", "items=a,b,c").out
    (runner.path / "data" / "a.txt").unlink()
    planned = runner("plan", "--var", "items=a,b,c").planned()["make"]
    assert "a (no record yet)" in planned and "mark-done make[a]" not in planned, planned


def test_the_live_view_keeps_its_columns_past_a_wide_line_and_shows_a_progress_line(tmp_path: Path) -> None:
    import re

    import pyte

    project = Project(tmp_path)
    wide = "w" * 300
    script = f"import sys, time\nprint('{wide}', flush=True)\ntime.sleep(1.2)\nfor p in range(1, 15):\n"
    script += "    sys.stdout.write(f'{p}% done\\r'); sys.stdout.flush(); time.sleep(0.15)\nprint('end')\n"
    (tmp_path / "step.py").write_text(script)
    project.write("steps:\n  - name: wide_one\n    run: {command: [python3, step.py]}\n")
    code, raw = project.on_a_terminal("apply")
    assert code == 0, raw.decode(errors="replace")
    screen = pyte.Screen(100, 40)
    stream = pyte.ByteStream(screen)
    clocks: set[str] = set()  # the times shown while the wide line is the step's latest
    progress: set[str] = set()
    for start in range(0, len(raw), 64):
        stream.feed(raw[start : start + 64])
        rows = screen.display
        for i, row in enumerate(rows):
            match = re.search(r"wide_one\s+(\d+\.\d\d)s", row)
            if match and not row.startswith("changed"):
                below = rows[i + 1] if i + 1 < len(rows) else ""
                if "wwwww" in below:
                    clocks.add(match.group(1))
                if "% done" in below:
                    progress.add(below.strip())
        assert all(len(row) <= 100 for row in rows)
    assert len(clocks) >= 4, clocks  # the clock column stays (and moves) while a wide line is the latest
    assert len(progress) >= 2, progress  # the `\r` progress shows in the step's row as it moves
    assert not any(wide in row for row in screen.display)  # the wide line was cut, never wrapped over rows
    log = next((tmp_path / ".runner" / "logs").glob("*/wide_one.log")).read_text()
    assert wide in log and "14% done" in log  # the log has it all


def test_plain_rows_put_their_detail_at_one_column_and_end_without_spaces(runner: Harness) -> None:
    runner.write(
        """
        steps:
          - name: version
            capture: {command: "echo 1.2.3"}
          - name: quick
            fake: {}
          - name: broken
            needs: []
            fake: {fail: true}
          - name: after_broken
            needs: [broken]
            fake: {}
        """
    )
    said = runner("apply", "--keep-going")
    lines = said.out.splitlines()
    rows = {line.split()[1]: line for line in lines if line.split()[0] in ("changed", "ok", "blocked", "FAILED")}
    assert not [line for line in lines if line != line.rstrip()], said.out
    assert rows["after_broken"].index("blocked: broken failed") == rows["version"].index("= 1.2.3"), said.out
    again = runner("apply", "--keep-going").out.splitlines()
    assert "ok       quick" in again and "ok       version" in again, again  # no trailing spaces


def test_init_writes_a_starter_that_validates_applies_and_converges(runner: Harness) -> None:
    made = runner("init")
    assert made.code == 0 and "wrote pipeline.yaml" in made.out, made.err
    assert runner("validate").code == 0
    first = runner("apply")
    assert first.code == 0, first.out
    assert (runner.path / ".work" / "report.txt").read_text().strip() == "2 items prepared"
    again = runner("apply")
    assert again.code == 0 and "changed=0" in again.out and "failed=0" in again.out, again.out
    added = runner("apply", "--var", "items=alpha,beta,gamma")
    assert "changed  prep[gamma]" in added.out and "prep[alpha]" not in added.out, added.out
    assert "changed  count" in added.out  # it names prep in `needs`: a new item re-runs it

    text = (runner.path / "pipeline.yaml").read_text()
    refused = runner("init")
    assert refused.code == 2 and "exists" in refused.err and "--force" in refused.err
    assert (runner.path / "pipeline.yaml").read_text() == text
    elsewhere = runner("init", "-f", "other.yaml")
    assert elsewhere.code == 0 and "`runner plan -f other.yaml`" in elsewhere.out
    (runner.path / "pipeline.yaml").write_text("steps: []\n")
    assert runner("init", "--force").code == 0 and (runner.path / "pipeline.yaml").read_text() == text


def _completing(tmp_path: Path) -> dict[str, str]:
    """A pipeline with a for_each step in tmp_path, and an environment whose `runner` (what the completion
    scripts call) is this checkout's."""
    import shlex
    import sys

    from tests.conftest import ROOT

    Project(tmp_path).write(PREP_COUNT_TRAIN.replace("{{ vars.items }}", "alpha,beta"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "runner").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m runner "$@"\n')
    (bin_dir / "runner").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}


def test_bash_completion_offers_commands_options_steps_and_items(tmp_path: Path) -> None:
    import shlex
    import subprocess

    env = _completing(tmp_path)
    Project(tmp_path).write("steps:\n  - name: other_one\n    run: {command: 'true'}\n", name="other.yaml")

    def complete(*words: str) -> list[str]:
        script = 'eval "$(runner completion bash)"\n'
        script += f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        script += '_runner_complete; printf "%s\\n" "${COMPREPLY[@]}"\n'
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return [line for line in done.stdout.splitlines() if line]

    assert complete("runner", "lo") == ["logs"]
    assert "init" in complete("runner", "") and "_names" not in complete("runner", "")
    assert complete("runner", "plan", "--fr") == ["--from"]
    assert complete("runner", "stop", "") == ["prep", "count", "train"]
    assert complete("runner", "logs", "pre") == ["prep", "prep[alpha]", "prep[beta]"]
    assert complete("runner", "-f", "other.yaml", "explain", "") == ["other_one"]
    assert complete("runner", "logs", "--file", "other.yaml", "") == ["other_one"]
    assert complete("runner", "logs", "-f", "c") == ["count"]  # after `logs`, -f follows
    (tmp_path / "pipeline.yaml").write_text("steps: [\n")  # a broken pipeline: no names, and no error shown
    assert complete("runner", "stop", "") == []


def _shell(name: str) -> str:
    """zsh or fish: installed if missing (as root under CI, as the sshd tests install OpenSSH), else skipped."""
    import shutil
    import subprocess

    if shutil.which(name) is None and os.geteuid() == 0 and os.environ.get("CI") == "true":
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if subprocess.run(["apt-get", "install", "-y", "-q", name], env=env, capture_output=True).returncode:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
            subprocess.run(["apt-get", "install", "-y", "-q", name], env=env, capture_output=True)
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed and could not be (apt-get install {name})")
        pytest.skip(f"{name} is not installed here")
    return found


def test_fish_completion_offers_commands_steps_and_items(tmp_path: Path) -> None:
    import shlex
    import subprocess

    fish = _shell("fish")
    env = _completing(tmp_path)
    (tmp_path / "runner.fish").write_text(Harness(tmp_path)("completion", "fish").out)

    def complete(line: str) -> list[str]:
        script = f"source runner.fish; complete -C {shlex.quote(line)}"
        done = subprocess.run([fish, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return [row.split("\t")[0] for row in done.stdout.splitlines() if row]

    assert complete("runner lo") == ["logs"]
    assert sorted(complete("runner stop ")) == ["count", "prep", "train"]
    assert sorted(complete("runner logs pr")) == ["prep", "prep[alpha]", "prep[beta]"]
    assert complete("runner plan --fr") == ["--from"]


def test_the_zsh_script_parses_and_offers_commands_steps_and_options(tmp_path: Path) -> None:
    """Its function run with compadd stubbed to print what it is given (zsh filters by the prefix itself)."""
    import shlex
    import subprocess

    zsh = _shell("zsh")
    env = _completing(tmp_path)
    (tmp_path / "_runner").write_text(Harness(tmp_path)("completion", "zsh").out)
    checked = subprocess.run([zsh, "-n", str(tmp_path / "_runner")], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    stubs = 'compdef() { :; }; compadd() { local a; for a in "$@"; do [[ $a == -* ]] || print -r -- ${(P)a}; done; }'

    def offered(*words: str) -> str:
        quoted = " ".join(shlex.quote(w) for w in words)
        script = f"{stubs}; source ./_runner; words=({quoted}); CURRENT={len(words)}; _runner"
        done = subprocess.run([zsh, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert "logs" in offered("runner", "lo").split() and "_names" not in offered("runner", "").split()
    assert offered("runner", "stop", "").split() == ["prep", "count", "train"]
    assert offered("runner", "logs", "pr").split() == ["prep", "count", "train", "prep[alpha]", "prep[beta]"]
    assert "--from" in offered("runner", "plan", "--f").split()


def test_a_step_whose_start_cannot_be_recorded_gets_its_verdict_line(
    runner: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runner.errors import StateError
    from runner.state import StateStore

    runner.write("steps:\n  - name: a\n    fake: {}\n  - name: b\n    fake: {}\n")
    real = StateStore.replace

    def full_disk(self: StateStore, name: str, record: dict[str, object] | None) -> None:
        if name == "b" and record is not None and record.get("status") == "started":
            raise StateError(f"cannot write {self.path}: No space left on device; the previous state is kept")
        real(self, name, record)

    monkeypatch.setattr(StateStore, "replace", full_disk)
    said = runner("apply")
    assert said.code == 1
    assert "FAILED   b" in said.out, said.out
    assert "its start could not be recorded, so it did not run: cannot write" in said.out, said.out
    assert "No space left on device" in said.err and WORLD.runs == ["a"]

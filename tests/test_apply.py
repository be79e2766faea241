"""apply converges, re-runs exactly what changed, and resumes after failures and crashes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from conftest import Project

THREE_STEPS = """
name: demo
steps:
  - name: a
    run: {command: "echo a >> a.count && echo out-a"}
  - name: b
    needs: [a]
    run: {command: "echo b >> b.count"}
  - name: c
    needs: []
    run: {command: "echo c >> c.count"}
"""


def test_second_apply_executes_nothing(project: Project) -> None:
    project.write(THREE_STEPS)
    first = project.run("apply")
    assert first.code == 0, first.text
    assert "changed=3" in first.out
    second = project.run("apply")
    assert second.code == 0, second.text
    assert "ok=3 changed=0" in second.out
    assert [project.count(f"{n}.count") for n in "abc"] == [1, 1, 1]


def test_editing_one_step_reruns_it_and_its_dependents_only(project: Project) -> None:
    project.write(THREE_STEPS)
    assert project.run("apply").code == 0
    project.write(THREE_STEPS.replace("echo out-a", "echo out-a2"))
    result = project.run("apply")
    assert result.code == 0, result.text
    assert [project.count(f"{n}.count") for n in "abc"] == [2, 2, 1]
    assert "spec changed: command" in result.out
    # Editing the dependent alone re-runs only it.
    project.write(THREE_STEPS.replace("echo out-a", "echo out-a2").replace("echo b >>", "echo B >>"))
    assert project.run("apply").code == 0
    assert [project.count(f"{n}.count") for n in "abc"] == [2, 3, 1]


def test_failing_middle_step_then_fix_resumes(project: Project) -> None:
    failing = """
    steps:
      - name: first
        run: {command: "echo 1 >> first.count"}
      - name: middle
        run: {command: "echo 1 >> middle.count; echo something broke; test -f fixed"}
      - name: last
        run: {command: "echo 1 >> last.count"}
    """
    project.write(failing)
    result = project.run("apply")
    assert result.code == 1, result.text
    assert "FAILED" in result.out and "middle" in result.out
    assert "something broke" in result.out  # the failing step's last output
    log_line = next(line for line in result.out.splitlines() if "log:" in line)
    log_path = Path(log_line.split("log:", 1)[1].strip())
    assert "something broke" in log_path.read_text()
    assert project.count("last.count") == 0
    (project.path / "fixed").write_text("")
    again = project.run("apply")
    assert again.code == 0, again.text
    assert "failed last time" in again.out
    assert [project.count(f"{n}.count") for n in ("first", "middle", "last")] == [1, 2, 1]


def test_kill_9_inside_a_step_reruns_that_step(project: Project) -> None:
    # The same spec both times: only the first run sleeps, so the crash alone is what re-runs the step.
    project.write(
        """
        steps:
          - name: before
            run: {command: "echo 1 >> before.count"}
          - name: slow
            run: {command: "echo 1 >> slow.count; if [ ! -f slow.started ]; then touch slow.started; sleep 30; fi"}
          - name: after
            run: {command: "echo 1 >> after.count"}
        """
    )
    proc = project.popen("apply")
    deadline = time.monotonic() + 30
    while not (project.path / "slow.started").exists():
        assert time.monotonic() < deadline, "the slow step never started"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    from runner.state import StateStore  # mid-run, the state is the snapshot plus its journal

    assert (StateStore(project.path / ".runner").load().record("slow") or {})["status"] == "started"
    plan = project.run("plan")
    assert plan.code == 2
    result = project.run("apply")
    assert result.code == 0, result.text
    assert "stopped inside this step" in result.out
    assert [project.count(f"{n}.count") for n in ("before", "slow", "after")] == [1, 2, 1]


def test_crash_record_alone_triggers_rerun(project: Project) -> None:
    project.write('steps:\n  - name: s\n    run: {command: "echo 1 >> s.count"}\n')
    assert project.run("apply").code == 0
    state_path = project.path / ".runner" / "state.json"
    state = json.loads(state_path.read_text())
    state["steps"]["s"]["status"] = "started"  # what a kill -9 inside the step leaves behind
    state_path.write_text(json.dumps(state))
    result = project.run("apply")
    assert "stopped inside this step" in result.out
    assert project.count("s.count") == 2


def test_plan_exit_codes_and_changes_nothing(project: Project) -> None:
    project.write(THREE_STEPS)
    plan = project.run("plan")
    assert plan.code == 2, plan.text
    assert "no record yet" in plan.out
    assert project.count("a.count") == 0
    assert project.run("apply").code == 0
    plan = project.run("plan")
    assert plan.code == 0, plan.text
    assert "nothing to do" in plan.out


def test_parallel_steps_overlap(project: Project) -> None:
    project.write(
        """
        steps:
          - name: one
            needs: []
            run: {command: "date +%s.%N > one.start; sleep 1; date +%s.%N > one.end"}
          - name: two
            needs: []
            run: {command: "date +%s.%N > two.start; sleep 1; date +%s.%N > two.end"}
        """
    )
    result = project.run("apply", "-j", "2")
    assert result.code == 0, result.text

    def read(name: str) -> float:
        return float((project.path / name).read_text())

    assert read("one.start") < read("two.end") and read("two.start") < read("one.end")


def test_without_jobs_steps_run_in_file_order(project: Project) -> None:
    project.write(
        """
        steps:
          - name: one
            run: {command: "date +%s.%N > one.start; sleep 0.3; date +%s.%N > one.end"}
          - name: two
            run: {command: "date +%s.%N > two.start"}
        """
    )
    assert project.run("apply", "-j", "2").code == 0
    assert float((project.path / "two.start").read_text()) >= float((project.path / "one.end").read_text())


def test_when_false_skips_and_var_override(project: Project) -> None:
    project.write(
        """
        vars: {smoke: "false"}
        steps:
          - name: small
            when: "vars.smoke | bool"
            run: {command: "echo 1 >> small.count"}
        """
    )
    result = project.run("apply")
    assert result.code == 0 and "skipped=1" in result.out, result.text
    assert project.count("small.count") == 0
    result = project.run("apply", "--var", "smoke=true")
    assert "changed=1" in result.out, result.text
    assert project.count("small.count") == 1


def test_retries_until_success(project: Project) -> None:
    project.write(
        """
        steps:
          - name: flaky
            retries: 3
            retry_delay: 0
            run: {command: "echo 1 >> tries; test $(wc -l < tries) -ge 3"}
        """
    )
    result = project.run("apply")
    assert result.code == 0, result.text
    assert project.count("tries") == 3
    assert "attempt 2 of 4 failed" in result.err


def test_timeout_stops_the_step(project: Project) -> None:
    project.write('steps:\n  - name: slow\n    timeout: 0.5\n    run: {command: "sleep 20"}\n')
    started = time.monotonic()
    result = project.run("apply")
    assert result.code == 1
    assert "timed out after 0.5s" in result.out
    assert time.monotonic() - started < 15


def test_creates_missing_reruns_and_uncreated_fails(project: Project) -> None:
    project.write(
        """
        steps:
          - name: make
            run: {command: "echo 1 >> make.count; mkdir -p out; echo x > out/data.jsonl", creates: ["out/*.jsonl"]}
        """
    )
    assert project.run("apply").code == 0
    (project.path / "out" / "data.jsonl").unlink()
    result = project.run("apply")
    assert "out/*.jsonl does not exist" in result.out
    assert project.count("make.count") == 2
    project.write('steps:\n  - name: make\n    run: {command: "true", creates: [never.txt]}\n')
    result = project.run("apply")
    assert result.code == 1
    assert "did not create never.txt" in result.out


def test_inputs_content_changes_rerun(project: Project) -> None:
    (project.path / "data.csv").write_text("1\n")
    project.write('steps:\n  - name: p\n    run: {command: "echo 1 >> p.count", inputs: ["*.csv"]}\n')
    assert project.run("apply").code == 0
    assert project.run("apply").code == 0
    assert project.count("p.count") == 1
    (project.path / "data.csv").write_text("2\n")
    result = project.run("apply")
    assert "inputs changed" in result.out, result.text
    assert project.count("p.count") == 2


def test_upstream_outputs_feed_templates_and_changes_propagate(project: Project) -> None:
    (project.path / "version").write_text("v1\n")
    project.write(
        """
        steps:
          - name: read
            run: {command: "cat version", inputs: [version]}
          - name: use
            run: {command: "echo {{ steps.read.stdout }} >> used"}
        """
    )
    assert project.run("apply").code == 0
    (project.path / "version").write_text("v2\n")
    result = project.run("apply")
    assert result.code == 0, result.text
    assert (project.path / "used").read_text().split() == ["v1", "v2"]


def test_only_from_and_force(project: Project) -> None:
    project.write(THREE_STEPS)
    result = project.run("apply", "--only", "b")
    assert result.code == 0, result.text
    assert [project.count(f"{n}.count") for n in "abc"] == [1, 1, 0]
    result = project.run("apply", "--force", "a", "--only", "a")
    assert [project.count(f"{n}.count") for n in "abc"] == [2, 1, 0]
    result = project.run("apply", "--from", "c")
    assert [project.count(f"{n}.count") for n in "abc"] == [2, 1, 1]
    bad = project.run("apply", "--only", "nope")
    assert bad.code == 2 and "no step named 'nope'" in bad.err


def test_keep_going_runs_independent_steps(project: Project) -> None:
    project.write(
        """
        steps:
          - name: bad
            run: {command: "false"}
          - name: dependent
            needs: [bad]
            run: {command: "echo 1 >> dependent.count"}
          - name: independent
            needs: []
            run: {command: "echo 1 >> independent.count"}
        """
    )
    result = project.run("apply", "--keep-going")
    assert result.code == 1
    assert project.count("independent.count") == 1 and project.count("dependent.count") == 0
    assert "blocked" in result.out


def test_forget_and_mark_done(project: Project) -> None:
    project.write(THREE_STEPS)
    assert project.run("apply").code == 0
    assert project.run("forget", "c").code == 0
    assert project.run("apply").code == 0
    assert project.count("c.count") == 2
    project.write(THREE_STEPS.replace("echo c >>", "echo C >>"))
    assert project.run("mark-done", "c").code == 0
    plan = project.run("plan")
    assert plan.code == 0, plan.text
    assert project.run("forget", "zzz").code == 2


def test_second_apply_is_refused_while_one_runs(project: Project) -> None:
    project.write('steps:\n  - name: slow\n    run: {command: "touch started; test -f taken-over || sleep 5"}\n')
    proc = project.popen("apply")
    try:
        deadline = time.monotonic() + 30
        while not (project.path / "started").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        began = time.monotonic()
        second = project.run("apply")
        assert time.monotonic() - began < 10  # it does not wait for the lock
        assert second.code == 1
        assert f"pid {proc.pid}" in second.err and "since" in second.err
        status = project.run("status")
        assert status.code == 0 and "slow" in status.out
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # The dead holder's lock is taken over with a notice (and the step, re-run, need not wait this time).
    (project.path / "taken-over").touch()
    result = project.run("apply")
    assert "took over the lock" in result.err
    assert result.code == 0, result.text


def _running(pid: int) -> bool:
    """True while pid exists and is not a zombie waiting to be reaped."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return False
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return False
        time.sleep(0.05)
    return True


def test_sigterm_stops_the_step_and_its_children(project: Project) -> None:
    project.write('steps:\n  - name: slow\n    run: {command: "sleep 300 & echo $! > child.pid; wait"}\n')
    proc = project.popen("apply")
    deadline = time.monotonic() + 30
    while not (project.path / "child.pid").exists() or not (project.path / "child.pid").read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int((project.path / "child.pid").read_text())
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode == 143
    assert not _running(child), "the step's child process was left running"
    state = json.loads((project.path / ".runner" / "state.json").read_text())
    assert state["steps"]["slow"]["status"] == "interrupted"
    plan = project.run("plan")
    assert "interrupted last time" in plan.out


def test_env_step_exports_and_env_file(project: Project) -> None:
    project.write(
        """
        vars: {port: 8000}
        steps:
          - name: settings
            env: {E2B_API_URL: "http://127.0.0.1:{{ vars.port }}", QUOTED: "a b'c"}
          - name: use
            run: {command: "echo $E2B_API_URL > url.txt"}
        """
    )
    assert project.run("apply").code == 0
    assert (project.path / "url.txt").read_text().strip() == "http://127.0.0.1:8000"
    env_file = project.path / ".runner" / "env.sh"
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    shown = project.run("env")
    assert "export E2B_API_URL=http://127.0.0.1:8000" in shown.out
    import subprocess

    echoed = subprocess.run(
        ["sh", "-c", f'eval "$(cat {env_file})"; printf %s "$QUOTED"'], capture_output=True, text=True
    )
    assert echoed.stdout == "a b'c"
    # A changed env value re-runs the steps after it.
    result = project.run("apply", "--var", "port=9000")
    assert result.code == 0, result.text
    assert (project.path / "url.txt").read_text().strip() == "http://127.0.0.1:9000"


def test_secret_vars_never_reach_output_or_state(project: Project) -> None:
    secret = "e2b_0123456789abcdef0123456789abcdef"
    project.write(
        f"""
        vars: {{api_key: "{secret}"}}
        secrets: [api_key]
        steps:
          - name: use
            run: {{command: "echo key is {{{{ vars.api_key }}}}; exit 3"}}
        """
    )
    result = project.run("apply")
    assert result.code == 1
    assert secret not in result.text
    assert "key is ********" in result.out
    for path in (project.path / ".runner").rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path


def test_status_and_graph(project: Project) -> None:
    project.write(THREE_STEPS)
    assert project.run("apply").code == 0
    status = project.run("status")
    assert status.code == 0
    assert all(line.rstrip().endswith("yes") for line in status.out.splitlines()[1:])
    text = project.run("graph").out
    assert "b [run]  <- needs a" in text
    dot = project.run("graph", "--format", "dot").out
    assert '"a" -> "b";' in dot
    mermaid = project.run("graph", "--format", "mermaid").out
    assert mermaid.startswith("flowchart LR") and "s0 --> s1" in mermaid


def test_schema_is_json_schema_of_every_kind(project: Project) -> None:
    result = project.run("schema")
    schema = json.loads(result.out)
    titles = [v["title"] for v in schema["properties"]["steps"]["items"]["oneOf"]]
    from steps import KINDS

    assert titles == [f"{kind} step" for kind in KINDS]
    assert {"run", "env", "assert", "docker", "git", "pip", "launch", "wait", "capture", "secret"} <= set(KINDS)
    run_step = schema["properties"]["steps"]["items"]["oneOf"][0]
    assert "creates" in run_step["properties"]["run"]["properties"]


def test_an_env_step_waits_only_for_what_it_references(project: Project) -> None:
    """An env step is not a barrier: it orders after what its values reference and its needs, not after every
    step above it; so a failing prerequisite above it blocks only what depends on that prerequisite. A step
    with `needs: []` that reads an export (`{{ env.X }}`) waits for the env step that exports it."""
    project.write(
        """
        steps:
          - name: broken
            assert: {path: /no/such/device, message: "no device"}
          - name: key
            needs: []
            run: {command: "echo key.txt"}
          - name: settings
            env: {KEY_FILE: "{{ steps.key.stdout }}", MODE: fast}
          - name: uses
            needs: []
            run: {command: "echo {{ env.MODE }} {{ env.KEY_FILE }} > used.txt"}
          - name: device_env
            env: {DEVICE: /no/such/device}
            needs: [broken]
          - name: late
            needs: []
            run: {command: "echo {{ env.DEVICE }} > late.txt"}
        """
    )
    plan = project.run("plan")
    lines = {line.split()[2]: line for line in plan.out.splitlines() if line[:1] in "+~x-"}
    assert lines["broken"].startswith("x fail")
    assert lines["settings"].startswith("+ run") and "no record yet; after key" in lines["settings"]
    assert lines["uses"].startswith(("+ run", "~ maybe")) and "broken" not in lines["uses"], lines["uses"]
    assert lines["device_env"].startswith("- block") and "broken would fail" in lines["device_env"]
    assert lines["late"].startswith("- block") and "(via device_env)" in lines["late"]
    applied = project.run("apply", "-j", "2", "--keep-going")
    assert applied.code == 1
    statuses = {p[1]: p[0] for p in (line.split() for line in applied.out.splitlines()) if len(p) > 1}
    assert statuses["broken"] == "FAILED" and statuses["device_env"] == "blocked" and statuses["late"] == "blocked"
    assert statuses["settings"] == "changed" and statuses["uses"] == "changed"
    assert (project.path / "used.txt").read_text().split() == ["fast", "key.txt"]
    assert not (project.path / "late.txt").exists()


def test_numbers_in_an_argv_list_are_words_and_a_number_for_a_string_says_quote_it(project: Project) -> None:
    """Issue 14, item 10: `[echo, 1]` is the argv it looks like; `ref: 1.0` is refused with how to write it."""
    project.write(
        """
        steps:
          - name: words
            run: {command: [sh, -c, 'echo "$@" > words.txt', sh, 8, 2.5, true]}
        """
    )
    result = project.run("apply")
    assert result.code == 0, result.text
    assert (project.path / "words.txt").read_text().split() == ["8", "2.5", "true"]
    project.write(
        """
        steps:
          - name: src
            git: {url: ./x.bundle, dest: src, ref: 1.0}
        """
    )
    refused = project.run("validate")
    assert refused.code == 2
    assert "pipeline.yaml:3" in refused.err and "expected a string, got the number 1.0" in refused.err, refused.err
    assert 'quote it as written (e.g. "1.0")' in refused.err

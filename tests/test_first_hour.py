"""What a new user met in the first hour (issue 14): each test failed before its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Project

from tests.gitrepos import Upstream, isolated_git_config


def _interpreters(tmp_path: Path) -> tuple[Path, Path]:
    """`python` and `python3` side by side, as a venv's bin/ has them: the same interpreter under two names."""
    folder = tmp_path / "bin"
    folder.mkdir()
    real = os.path.realpath(sys.executable)
    for name in ("python", "python3"):
        (folder / name).symlink_to(real)
    return folder / "python", folder / "python3"


def test_facts_python_is_one_name_however_runner_is_started(project: Project, tmp_path: Path) -> None:
    python, python3 = _interpreters(tmp_path)
    project.write(
        """
        name: same
        steps:
          - name: server
            run: {command: [echo, "{{ facts.python }}"]}
        """
    )

    def runner(exe: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(exe), "-m", "runner", *args], cwd=project.path, env=project.env(), capture_output=True, text=True
        )

    first = runner(python3, "apply", "-v")  # as the console script starts it (its shebang names python3)
    assert first.returncode == 0, first.stderr
    assert f"{python}\n" in first.stdout.replace("  server | ", "")
    again = runner(python, "plan")  # as `python -m runner` starts it
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing to do" in again.stdout


def test_a_var_file_keeps_per_host_values_for_every_command(project: Project) -> None:
    project.write(
        """
        name: hosts
        vars: {who: nobody, hosts: []}
        steps:
          - name: greet
            for_each: "{{ vars.hosts }}"
            run: {command: [echo, "{{ vars.who }} on {{ item }}"]}
        """
    )
    (project.path / "site.yaml").write_text("who: alice\nhosts: [gpu-1, gpu-2]\n")
    (project.path / "late.yaml").write_text("who: bob\n")
    first = project.run("apply", "-v", "--var-file", "site.yaml", "--var-file", "late.yaml")
    assert first.code == 0, first.text
    assert "bob on gpu-1" in first.out and "bob on gpu-2" in first.out  # the later file wins
    # the same values from the environment: the later command means the same pipeline without repeating them
    env = {**project.env(), "RUNNER_VAR_FILE": "site.yaml:late.yaml"}
    plan = subprocess.run(project.argv("plan"), cwd=project.path, env=env, capture_output=True, text=True)
    assert plan.returncode == 0 and "nothing to do" in plan.stdout, plan.stdout + plan.stderr
    # --var wins over every file
    override = subprocess.run(
        project.argv("plan", "--var", "who=carol"), cwd=project.path, env=env, capture_output=True, text=True
    )
    assert override.returncode == 2 and "carol" in override.stdout, override.stdout


def test_a_bad_var_file_names_its_file_and_line(project: Project) -> None:
    project.write("name: t\nsteps:\n  - name: a\n    run: {command: [echo, hi]}\n")
    (project.path / "list.yaml").write_text("- a\n- b\n")
    (project.path / "names.yaml").write_text("ok: 1\n2bad: x\n")
    (project.path / "syntax.yaml").write_text("a: [1, 2\n")
    for file, expected in (
        ("list.yaml", "list.yaml:1:1: a var file is a mapping"),
        ("names.yaml", "names.yaml:2:1: "),
        ("syntax.yaml", "syntax.yaml:2:"),
        ("missing.yaml", "no var file at"),
    ):
        result = project.run("plan", "--var-file", file)
        assert result.code == 2, result.text
        assert expected in result.err and "Traceback" not in result.text, result.err


def test_the_pipeline_file_goes_before_the_command_too(project: Project) -> None:
    project.write("name: t\nsteps:\n  - name: a\n    run: {command: [echo, hello]}\n", name="other.yaml")
    assert project.run("-f", "other.yaml", "apply").code == 0
    shown = project.run("-f", "other.yaml", "logs", "a", "--run", "1")
    assert shown.code == 0 and shown.out == "hello\n", shown.text
    wrong = project.run("logs", "a", "-f", "other.yaml")  # -f follows after `logs`: the error says what to write
    assert wrong.code == 2 and "runner -f other.yaml logs a -f" in wrong.err, wrong.err
    both = project.run("-f", "other.yaml", "plan", "-f", "pipeline.yaml")
    assert both.code == 2 and "two pipeline files" in both.err


LOOP = """
name: loop
steps:
  - name: check
    needs: []
    assert: {path: ./needed}
  - name: bake
    needs: []
    for_each: [a, b]
    run:
      command: "echo baking {{ item }}; echo {{ item }} >> ran; touch made-{{ item }}"
      creates: ["made-{{ item }}"]
  - name: after
    needs: [bake]
    run: {command: [echo, "{{ steps.bake.count }} baked"]}
"""


def test_items_are_named_alike_by_every_command(project: Project) -> None:
    project.write(LOOP)
    (project.path / "needed").touch()
    assert project.run("apply").code == 0
    assert project.count("ran") == 2
    forced = project.run("apply", "--force", "bake[b]")  # one item, not the loop
    assert forced.code == 0 and (project.path / "ran").read_text() == "a\nb\nb\n", forced.text
    explained = project.run("explain", "bake[a]")
    assert explained.code == 0 and "decision: ok" in explained.out and '"made-a"' in explained.out, explained.text
    unknown = project.run("explain", "bake[c]")
    assert unknown.code == 2 and "bake has no item 'c'" in unknown.err, unknown.text
    bad_item = project.run("apply", "--force", "bake[c]")  # bad input, found when the items render: exit 2
    assert bad_item.code == 2 and "bake has no item 'c'" in bad_item.out, bad_item.text
    assert project.run("apply", "--force", "check[x]").code == 2  # not a for_each step
    assert project.run("forget", "bake[a]").code == 0
    plan = project.run("plan")
    forgotten = "1 of 2 items to run: a (no record yet; every `creates` exists: `runner mark-done bake[a]`"
    assert plan.code == 2 and forgotten in plan.out, plan.out  # its file is there: mark-done is named
    logs = project.run("logs", "bake")  # a loop's log is its items' logs
    assert logs.code == 0 and "==> bake[a]" in logs.out and "baking b" in logs.out, logs.text
    one = project.run("logs", "bake[b]")
    assert one.code == 0 and one.out == "baking b\n", one.text


def test_mark_done_accepts_what_the_next_apply_would_accept(project: Project) -> None:
    project.write(LOOP)
    refused = project.run("mark-done", "check")  # an assert is judged on every apply
    assert refused.code == 2 and "cannot be marked done" in refused.err, refused.text
    missing = project.run("mark-done", "bake")  # what it creates is not there: apply would run it anyway
    assert missing.code == 1 and "made-a does not exist" in missing.err, missing.text
    (project.path / "made-a").touch()
    (project.path / "made-b").touch()
    marked = project.run("mark-done", "bake")  # every item (it failed with "'item' is undefined")
    assert marked.code == 0 and "2 item(s)" in marked.out, marked.text
    (project.path / "needed").touch()
    applied = project.run("apply")
    assert applied.code == 0 and project.count("ran") == 0, applied.text
    assert "2 items up to date" in applied.out


def test_logs_shows_the_latest_run_when_the_record_has_no_log(project: Project) -> None:
    project.write("name: t\nsteps:\n  - name: a\n    run: {command: [echo, hello]}\n")
    assert project.run("apply").code == 0
    assert project.run("mark-done", "a").code == 0  # a record with no log of its own
    shown = project.run("logs", "a")
    assert shown.code == 0 and shown.out == "hello\n", shown.text


def test_plan_shows_the_element_of_a_list_that_changed(project: Project) -> None:
    path = project.write("name: t\nsteps:\n  - name: a\n    run: {command: [echo, make.py, --n, '8', --out, x]}\n")
    assert project.run("apply").code == 0
    path.write_text(path.read_text().replace("'8'", "'16'"))
    plan = project.run("plan")
    assert plan.code == 2 and 'command[3]: "8" -> "16"' in plan.out, plan.out
    path.write_text(path.read_text().replace("--out, x", "--out, x, --smoke"))
    plan = project.run("plan")
    assert 'command[3]: "8" -> "16"' in plan.out and 'command[6]: added "--smoke"' in plan.out, plan.out
    long_tail = "echo " + "a" * 80
    path.write_text(f"name: t\nsteps:\n  - name: a\n    run: {{command: '{long_tail} one'}}\n")
    assert project.run("apply").code == 0
    path.write_text(f"name: t\nsteps:\n  - name: a\n    run: {{command: '{long_tail} two'}}\n")
    plan = project.run("plan")
    assert "one" in plan.out and "two" in plan.out, plan.out  # a long string is cut where it differs


def test_needs_empty_is_independent_of_earlier_env_steps(project: Project) -> None:
    project.write(
        """
        name: indep
        steps:
          - name: slow
            needs: []
            run: {command: "sleep 0.3; echo slow >> order"}
          - name: settings
            needs: [slow]
            env: {SETTING: "from-settings", OTHER: "x"}
          - name: free
            needs: []
            run: {command: "echo free-${SETTING:-unset} >> order"}
          - name: reader
            needs: []
            run: {command: [sh, -c, "echo reader-{{ env.OTHER }} >> order"]}
          - name: later
            run: {command: "echo later-$SETTING >> order"}
        """
    )
    graph = project.run("graph")
    assert graph.code == 0, graph.text
    from runner.load import load_pipeline

    pipeline = load_pipeline(project.path / "pipeline.yaml")
    assert pipeline.graph.deps["free"] == []  # it waited for `settings` (so for `slow`) before
    assert pipeline.graph.deps["reader"] == ["settings"]  # it reads env.OTHER, which settings exports
    assert "settings" in pipeline.graph.deps["later"]
    applied = project.run("apply", "-j", "3")
    assert applied.code == 0, applied.text
    order = (project.path / "order").read_text().splitlines()
    assert order[0] == "free-unset", order  # it ran at once, and sees no export it does not depend on
    assert order.index("slow") < order.index("reader-x") and order[-1] == "later-from-settings", order


def test_a_misspelled_output_is_found_at_load_time(project: Project) -> None:
    project.write(
        """
        name: typo
        steps:
          - name: a
            run: {command: [echo, hi]}
          - name: loop
            for_each: [x]
            run: {command: [echo, "{{ item }}"]}
          - name: b
            run: {command: [echo, "{{ steps.a.stdoutt }}"]}
        """
    )
    for command in ("validate", "plan"):
        result = project.run(command)
        assert result.code == 2, result.text
        assert "pipeline.yaml:9:" in result.err and "step 'a' (run) has no output 'stdoutt'" in result.err
        assert "did you mean 'stdout'" in result.err
    assert not (project.path / ".runner" / "state.json").exists()
    path = project.path / "pipeline.yaml"
    path.write_text(path.read_text().replace("steps.a.stdoutt", "steps.loop['stdout']"))
    result = project.run("validate")
    assert result.code == 2 and "step 'loop' (a for_each run) has no output 'stdout'" in result.err, result.err
    path.write_text(path.read_text().replace("steps.loop['stdout']", "steps.loop.count"))
    assert project.run("validate").code == 0


def test_an_unset_env_variable_says_so(project: Project) -> None:
    project.write('name: t\nsteps:\n  - name: a\n    run: "echo {{ env.RUNNER_TEST_UNSET }}"\n')
    result = project.run("plan")
    assert result.code == 2 and "env.RUNNER_TEST_UNSET is not set" in result.err, result.err
    assert "'dict object'" not in result.err and "default('')" in result.err


def test_values_named_like_secrets_and_url_passwords_are_masked(project: Project) -> None:
    path = project.write(
        """
        name: s
        vars: {hf_token: hf_abcdefgh123, key_path: /etc/ssl/some.pem}
        not_secret: [DISPLAY_KEY]
        steps:
          - name: settings
            env: {E2B_API_KEY: e2b_literal_key_1234, E2B_API_KEY_FILE: /shared/aenv.key, DISPLAY_KEY: shown-1234}
          - name: clone
            run:
              command: [echo, "https://user:TOKEN123456@example.invalid/x.git", "{{ vars.hf_token }}", "$DISPLAY_KEY"]
        """
    )
    first = project.run("apply", "-v")
    assert first.code == 0, first.text
    path.write_text(path.read_text().replace("e2b_literal_key_1234", "e2b_other_key_5678"))
    plan = project.run("plan")
    explained = project.run("explain", "clone")
    settings = project.run("explain", "settings")
    texts = [first.text, plan.text, explained.text, settings.text]
    state = project.path / ".runner"
    texts += [p.read_text() for p in state.rglob("*") if p.is_file() and p.name not in ("secrets.json", "env.sh")]
    for text in texts:
        for secret in ("e2b_literal_key_1234", "e2b_other_key_5678", "TOKEN123456", "hf_abcdefgh123"):
            assert secret not in text, (secret, text)
    assert "https://user:********@example.invalid/x.git" in explained.out
    assert "/shared/aenv.key" in settings.out and "shown-1234" in settings.out  # a path and a declared name
    assert plan.code == 2 and "settings" in plan.out


def test_secret_names() -> None:
    from runner.secrets import mask_url_credentials, secret_name

    for name in ("E2B_API_KEY", "HF_TOKEN", "db_password", "apiKey", "key", "AWS_SECRET", "GITHUB_TOKEN"):
        assert secret_name(name), name
    for name in ("E2B_API_KEY_FILE", "key_digest", "monkey", "keys", "tokenizer", "E2B_API_URL", ""):
        assert not secret_name(name), name
    assert mask_url_credentials("ssh://git@github.com/x") == "ssh://git@github.com/x"
    assert mask_url_credentials("https://ghp_abc123@github.com/x") == "https://********@github.com/x"
    assert mask_url_credentials("git+https://u:p4ss@h/x") == "git+https://u:********@h/x"


@pytest.fixture
def upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Upstream:
    """A bare repository with one commit, and a git configuration of the test's own."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(isolated_git_config(tmp_path)))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    repo = Upstream(tmp_path)
    repo.commit("README", "hello\n")
    return repo


def test_the_smaller_surprises(project: Project, upstream: Upstream) -> None:
    project.write(
        f"""
        name: small
        steps:
          - name: gate
            needs: []
            assert: {{path: ./gate}}
          - name: first
            needs: []
            run: {{command: [echo, one]}}
          - name: second
            needs: [first]
            run: {{command: [echo, "{{{{ steps.first.stdout }}}}"]}}
          - name: clone
            needs: []
            git: {{url: "{upstream.url}", dest: clone, ref: main}}
          - name: behind_gate_a
            needs: [gate]
            run: {{command: "true"}}
          - name: behind_gate_b
            needs: [gate]
            run: {{command: "true"}}
        """
    )
    # a step that has never run runs, whatever its upstream gives: `+ run`, not `~ maybe`
    plan = project.run("plan")
    line = next(x for x in plan.out.splitlines() if " second " in x)
    assert line.startswith("+ run") and "no record yet; after first runs" in line, plan.out
    # blocked steps are named, not only counted
    applied = project.run("apply", "--keep-going")
    assert applied.code == 1 and "blocked=2 (behind_gate_a, behind_gate_b)" in applied.out, applied.out
    # a forced clone already at its commit changed nothing: ok, not changed
    forced = project.run("apply", "--force", "clone", "--only", "clone")
    assert forced.code == 0 and "changed=0" in forced.out, forced.out
    assert "forced (--force): nothing to change" in forced.out, forced.out
    # a path in pip.packages points at editable: and `name @ file://`
    path = project.write("name: p\nsteps:\n  - name: p\n    pip: {packages: [./mypkg], venv: v}\n", "p.yaml")
    refused = project.run("validate", "-f", path.name)
    assert refused.code == 2 and "editable: [./mypkg]" in refused.err and "@ file://" in refused.err


def test_an_interrupted_step_keeps_the_status_column(project: Project) -> None:
    import signal
    import time

    project.write("name: t\nsteps:\n  - name: slow\n    run: {command: [sleep, '30']}\n")
    proc = project.popen("apply")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (project.path / ".runner" / "logs").exists():
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    line = next(x for x in out.splitlines() if " slow " in f" {x} " and not x.startswith("running"))
    assert line.startswith("stopped  slow "), out  # the mark fits the column of the others (8 wide)


def test_a_taken_quickstart_port_says_how_to_choose_another(tmp_path: Path) -> None:
    import shutil
    import socket

    from conftest import ROOT

    target = tmp_path / "quickstart"
    shutil.copytree(
        ROOT / "examples" / "quickstart", target, ignore=shutil.ignore_patterns(".work", ".runner", "__pycache__")
    )
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        result = Project(target).run("apply", "--only", "sandbox_server", "--var", f"port={port}")
    finally:
        holder.close()
    assert result.code == 1, result.text
    assert f"hint: if port {port} is taken by another program" in result.out and "--var port=N" in result.out
    assert "Address already in use" in result.out


def test_what_needs_a_stopped_or_held_job_is_blocked_by_name(project: Project) -> None:
    from conftest import free_port

    port = free_port()
    fetch = "import urllib.request as u; u.urlopen('http://127.0.0.1:{{ vars.port }}/'); open('fetched', 'w')"
    path = project.write(
        f"""
        name: held
        vars: {{port: "{port}"}}
        steps:
          - name: server
            launch:
              command: [python3, -m, http.server, --bind, 127.0.0.1, "{{{{ vars.port }}}}"]
              detach: true
          - name: ready
            needs: [server]
            wait: {{tcp: "127.0.0.1:{{{{ vars.port }}}}", timeout: 10, interval: 0.1}}
          - name: fetch
            needs: [ready]
            run:
              command: [python3, -c, "{fetch}"]
              creates: [fetched]
          - name: unrelated
            needs: []
            run: {{command: [touch, unrelated]}}
        """
    )
    try:
        assert project.run("apply").code == 0
        assert project.run("stop", "server").code == 0
        (project.path / "fetched").unlink()  # fetch would run now, against a stopped server
        plan = project.run("plan")
        line = next(x for x in plan.out.splitlines() if " fetch " in x)
        assert line.startswith("- block") and "server is stopped" in line, plan.out
        applied = project.run("apply", "--keep-going")
        assert applied.code == 1, applied.text
        line = next(x for x in applied.out.splitlines() if x.split()[1:2] == ["fetch"])
        assert line.startswith("blocked") and "server is stopped" in line, applied.out
        assert "Traceback" not in applied.text and "ConnectionRefused" not in applied.text
        assert project.run("apply", "--force", "server").code == 0  # relaunched: what needed it runs again
        assert (project.path / "fetched").exists()

        # a changed port holds the restart; the wait on the new port is blocked, not timed out
        other = free_port()
        path.write_text(path.read_text().replace(f'port: "{port}"', f'port: "{other}"'))
        held = project.run("apply")
        assert held.code == 1, held.text
        line = next(x for x in held.out.splitlines() if x.split()[1:2] == ["ready"])
        assert line.startswith("blocked") and "server has a restart pending" in line, held.out
        plan = project.run("plan")
        assert "- block ready" in plan.out.replace("  ", " ") or "block ready" in " ".join(plan.out.split()), plan.out
    finally:
        project.run("stop", "server")


def test_the_live_view_keeps_asked_for_output_and_moves_its_clock(project: Project) -> None:
    import re

    import pyte

    project.write(
        """
        name: tty
        steps:
          - name: quiet_one
            run: {command: [sleep, "1.6"]}
          - name: chatty
            run: {command: [echo, from-verbose]}
          - name: rollout
            launch: {command: [python3, -c, "print('mean reward 0.75')"], creates: []}
        """
    )
    code, raw = project.on_a_terminal("apply", "-v")
    assert code == 0, raw.decode(errors="replace")
    screen = pyte.Screen(100, 40)
    stream = pyte.ByteStream(screen)
    elapsed: set[str] = set()
    columns: set[int] = set()
    for start in range(0, len(raw), 64):
        stream.feed(raw[start : start + 64])
        for row in screen.display:
            match = re.search(r"quiet_one\s+(\d+\.\d\d)s", row)
            if match and not row.startswith("changed"):
                elapsed.add(match.group(1))
                columns.add(match.start(1))
    final = "\n".join(screen.display)
    assert len(elapsed) >= 3, elapsed  # the clock of a silent step moves (it stayed at 0.00s)
    assert len(columns) == 1, columns  # and its column does not jitter between frames
    assert "rollout | mean reward 0.75" in final, final  # a foreground job's output stays on screen
    assert "chatty | from-verbose" in final, final  # so does -v output
    assert re.search(r"^changed\s+quiet_one", final, re.M), final


def test_down_stops_jobs_drops_records_and_purges_only_when_asked(project: Project, upstream: Upstream) -> None:
    project.write(
        f"""
        name: down
        steps:
          - name: key
            secret: {{bytes: 8}}
          - name: clone
            git: {{url: "{upstream.url}", dest: clone}}
          - name: data
            run: {{command: "echo rows > data.txt", creates: [data.txt]}}
          - name: job
            launch: {{command: [sleep, "300"], detach: true}}
        """
    )
    assert project.run("apply").code == 0
    state = project.path / ".runner"
    pid = json.loads((state / "jobs" / "job.json").read_text())["pid"]
    dry = project.run("down", "--dry-run", "--purge")
    assert dry.code == 0 and f"would stop pid {pid}" in dry.out and "would remove the clone" in dry.out, dry.out
    assert (project.path / "clone").is_dir() and _alive(pid)
    down = project.run("down")
    assert down.code == 0, down.text
    assert not _alive(pid) and "stopped pid" in down.out
    assert json.loads((state / "state.json").read_text())["steps"] == {}
    assert not (state / "secrets.json").exists()
    assert (project.path / "clone").is_dir() and (project.path / "data.txt").exists()  # kept without --purge
    assert project.run("apply").code == 0
    purged = project.run("down", "--purge")
    assert purged.code == 0, purged.text
    assert not (project.path / "clone").exists() and not (project.path / "data.txt").exists()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_secrets_of_every_shape_and_form_are_masked(project: Project) -> None:
    """Issue 19, item 4: a mapping or list secret, a multi-line one echoed line by line, the usual transforms."""
    project.write(
        """
        name: shapes
        vars:
          creds: {user: deploy-user-1, password: "p@ss w0rd/xyz"}
          tokens: [tok-aaaa-1111, tok-bbbb-2222]
          pem: "-----BEGIN KEY-----\\nMIIBOgIBAAJBAKj34GkxFhD9\\nZ0N1eXpTb2Z0d2FyZTEw\\n-----END KEY-----"
          short: abc
        secrets: [creds, tokens, pem, short]
        steps:
          - name: leak
            run:
              command: >-
                printf '%s\\n' {{ vars.creds.user | quote }} {{ vars.creds.password | upper | quote }}
                {{ vars.tokens | tojson | quote }} {{ vars.creds.password | urlencode | quote }}
                {{ vars.pem | quote }}
        """
    )
    result = project.run("apply", "-v")
    assert result.code == 0, result.text
    assert "secret var 'short'" in result.err and "shorter than 4" in result.err
    texts = [result.text, *(p.read_text() for p in (project.path / ".runner").rglob("*.log"))]
    texts.append((project.path / ".runner" / "state.json").read_text())
    for text in texts:
        for leaked in ("deploy-user-1", "P@SS W0RD/XYZ", "tok-aaaa-1111", "p%40ss%20w0rd%2Fxyz", "MIIBOgIBAAJB"):
            assert leaked not in text, (leaked, text)

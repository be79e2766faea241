"""What people and programs see: the JSON event stream (against its schema), the live view, plain output."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time

import jsonschema
from conftest import ROOT, Project

SCHEMA = json.loads((ROOT / "docs" / "events.schema.json").read_text())

MIXED = """
name: mixed
secrets: [token]
vars: {token: "s3cr3t-t0ken-value", tasks: [one, two]}
steps:
  - name: key
    needs: []
    secret: {prefix: k_, bytes: 8}
  - name: hello
    needs: []
    run: "echo hello; echo {{ vars.token }}"
  - name: each
    needs: []
    for_each: "{{ vars.tasks }}"
    run: "echo {{ item }}"
  - name: never
    needs: []
    when: false
    run: "echo never"
  - name: broken
    needs: [hello]
    run: "echo about to fail; exit 3"
  - name: after
    needs: [broken]
    run: "echo unreachable"
"""


def events(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_json_events_follow_their_schema_and_hide_secrets(project: Project) -> None:
    project.write(MIXED)
    result = project.run("apply", "--json", "-v", "--keep-going")
    assert result.code == 1
    stream = events(result.out)  # stdout holds nothing but events
    for event in stream:
        jsonschema.validate(event, SCHEMA)
    kinds = [e["event"] for e in stream]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    finished = {e["step"]: e for e in stream if e["event"] == "step_finished"}
    assert finished["hello"]["status"] == "changed" and finished["never"]["status"] == "skipped"
    assert finished["broken"]["status"] == "failed" and "exited with code 3" in finished["broken"]["error"]
    assert "about to fail" in finished["broken"]["tail"] and finished["broken"]["log"].endswith("broken.log")
    assert finished["after"]["status"] == "blocked"
    assert finished["each"]["outputs"] == {"keys": ["one", "two"], "count": 2}
    assert "value" not in finished["key"]["outputs"]  # a secret output never goes into events
    assert {e["line"] for e in stream if e["event"] == "output" and e["step"] == "hello"} >= {"hello", "********"}
    assert stream[-1]["recap"] == {"ok": 0, "changed": 3, "failed": 1, "skipped": 1, "blocked": 1, "pending": 0}
    assert stream[-1]["exit_code"] == 1
    secret_value = json.loads((project.path / ".runner" / "secrets.json").read_text())["key"]["value"]
    assert "s3cr3t-t0ken-value" not in result.out + result.err and secret_value not in result.out

    plan = project.run("plan", "--json")
    assert plan.code == 2
    planned = events(plan.out)
    for event in planned:
        jsonschema.validate(event, SCHEMA)
    actions = {e["step"]: e["action"] for e in planned if e["event"] == "planned"}
    assert actions["hello"] == "ok" and actions["broken"] == "run" and actions["never"] == "skip"
    assert (
        planned[-1]["event"] == "plan_finished" and planned[-1]["actions"]["run"] == 2
    )  # broken, and after (never ran)


def test_bad_input_under_json_is_an_error_event(project: Project) -> None:
    project.write("name: bad\nsteps:\n  - name: x\n    run: {command: 3}\n")
    result = project.run("apply", "--json")
    assert result.code == 2
    (event,) = events(result.out)
    jsonschema.validate(event, SCHEMA)
    assert event["event"] == "error" and "pipeline.yaml:4" in event["message"]
    assert abs(event["time"] - time.time()) < 60  # the schema requires it, as on every event


def test_live_view_renders_a_real_run_into_a_recorded_console(project: Project) -> None:
    from rich.console import Console

    from runner.engine import Engine, Options
    from runner.load import load_pipeline
    from runner.ui import LiveReporter

    project.write(MIXED)
    console = Console(record=True, force_terminal=True, width=110, file=io.StringIO(), color_system="truecolor")
    reporter = LiveReporter(console=console, width=22)
    pipeline = load_pipeline(str(project.path / "pipeline.yaml"), {})
    results = Engine(pipeline, reporter, Options(keep_going=True, verbose=True)).apply()
    reporter.run_finished(results, 1)
    text = console.export_text(clear=False)
    assert "changed  hello" in text and "FAILED   broken" in text and "skipped  never" in text
    assert "error: command exited with code 3" in text and "recap: ok=0 changed=3 failed=1" in text
    assert "s3cr3t-t0ken-value" not in text
    assert "\x1b[" in console.export_text(styles=True)  # it is coloured


def test_plain_output_has_no_escape_codes_and_no_color_turns_the_live_view_off(project: Project) -> None:
    project.write('name: p\nsteps:\n  - name: a\n    run: "echo hi"\n')
    piped = project.run("apply")
    assert piped.code == 0 and "\x1b" not in piped.text and "changed  a" in piped.out

    def on_a_terminal(extra: dict[str, str]) -> str:
        (project.path / ".runner").exists() and subprocess.run(
            [sys.executable, "-m", "runner", "forget", "a"], cwd=project.path, env=project.env(), check=True
        )
        _, raw = project.on_a_terminal("apply", extra=extra)
        return raw.decode(errors="replace")

    live = on_a_terminal({})
    assert "\x1b[" in live and "changed" in live
    plain = on_a_terminal({"NO_COLOR": "1"})
    assert "\x1b[" not in plain and re.search(r"changed\s+a", plain)


GOLDEN = ROOT / "tests" / "golden"


def normalise(text: str, project: Project) -> str:
    text = text.replace(str(project.path), "<dir>")
    text = re.sub(r"\d+\.\d\ds\b", "N.NNs", text)
    text = re.sub(r"logs/[0-9-]+/", "logs/<run>/", text)
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<time>", text)
    return text


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("RUNNER_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs (RUNNER_UPDATE_GOLDEN=1 rewrites it after a deliberate change)"


def test_golden_plain_apply_and_plan_with_diffs(project: Project) -> None:
    project.write(
        """
        name: golden
        vars: {port: "8000", greeting: hello}
        steps:
          - name: prepare
            run:
              command: "echo {{ vars.greeting }} > data.txt"
              creates: [data.txt]
          - name: settings
            env: {API_URL: "http://127.0.0.1:{{ vars.port }}"}
          - name: report
            run: "wc -c < data.txt; echo $API_URL"
          - name: fails
            needs: []
            run: "echo 'something went wrong' >&2; exit 4"
        """
    )
    first = project.run("apply", "--keep-going")
    check_golden("apply-first.txt", normalise(first.out, project))
    plan = project.run("plan", "--var", "port=8001", "--var", "greeting=hi")
    check_golden("plan-diffs.txt", normalise(plan.out, project))

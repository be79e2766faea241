"""The state store: journal between snapshots, replay after a crash, torn lines, compaction, readers."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from conftest import Project

from runner.state import COMPACT_MIN, StateStore


def test_transitions_are_journalled_and_replayed_without_a_snapshot(tmp_path: Path) -> None:
    store = StateStore(tmp_path).load()
    store.update("a", status="started")
    store.update("a", status="done", outputs={"x": 1})
    store.update("b", status="started")
    # a crash here: no compaction ran, state.json does not even exist
    assert not (tmp_path / "state.json").exists()
    again = StateStore(tmp_path).load()
    assert again.record("a") == {"status": "done", "outputs": {"x": 1}}
    assert again.record("b") == {"status": "started"}


def test_a_torn_last_line_is_ignored_and_the_next_append_starts_clean(tmp_path: Path) -> None:
    store = StateStore(tmp_path).load()
    store.update("a", status="done")
    journal = store.journal_path()
    with open(journal, "ab") as fh:
        fh.write(b'{"record":{"status":"fai')  # kill -9 in the middle of an append
    reader = StateStore(tmp_path).load()
    assert reader.record("a") == {"status": "done"}
    reader.update("b", status="done")
    assert StateStore(tmp_path).load().steps == {"a": {"status": "done"}, "b": {"status": "done"}}


def test_compaction_folds_the_journal_and_drops_old_generations(tmp_path: Path) -> None:
    store = StateStore(tmp_path).load()
    for i in range(COMPACT_MIN + 5):
        store.update(f"s{i % 3}", n=i)
    snapshot = json.loads((tmp_path / "state.json").read_text())
    assert snapshot["generation"] >= 1
    store.compact()
    assert [p.name for p in tmp_path.glob("journal-*.jsonl")] == []
    final = json.loads((tmp_path / "state.json").read_text())
    last = {f"s{k}": max(i for i in range(COMPACT_MIN + 5) if i % 3 == k) for k in range(3)}
    assert {k: v["n"] for k, v in final["steps"].items()} == last
    assert StateStore(tmp_path).load().steps == final["steps"]


def test_writes_stay_proportional_to_the_transitions(tmp_path: Path) -> None:
    store = StateStore(tmp_path).load()
    written = 0
    for i in range(600):
        store.update(f"step{i}", status="started", spec={"command": "x" * 200})
        store.update(f"step{i}", status="done", spec={"command": "x" * 200})
    for path in tmp_path.iterdir():
        written += path.stat().st_size
    # 1200 transitions of ~260 bytes: rewriting the whole state each time would be ~100 MB; the journal and
    # its occasional snapshots keep what is on disk (and what was written) small.
    assert written < 1_000_000
    assert len(StateStore(tmp_path).load().steps) == 600


def test_fifty_parallel_steps_are_all_recorded(project: Project) -> None:
    steps = "\n".join(f'  - name: p{i}\n    needs: []\n    run: {{command: "true"}}' for i in range(50))
    project.write(f"name: many\nsteps:\n{steps}\n")
    result = project.run("apply", "-j", "8")
    assert result.code == 0, result.text
    state = json.loads((project.path / ".runner" / "state.json").read_text())
    assert sorted(state["steps"]) == sorted(f"p{i}" for i in range(50))
    assert {r["status"] for r in state["steps"].values()} == {"done"}
    assert list((project.path / ".runner").glob("journal-*.jsonl")) == []


def test_loads_racing_compactions_never_fail(tmp_path: Path) -> None:
    import threading

    writer = StateStore(tmp_path).load()
    errors: list[str] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                store = StateStore(tmp_path).load()
                assert all(isinstance(r, dict) for r in store.steps.values())
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                errors.append(repr(exc))

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    try:
        for i in range(1500):  # a compaction every ~64 transitions: many chances to race a reader
            writer.update(f"s{i % 5}", n=i)
    finally:
        done.set()
        for t in readers:
            t.join()
    assert errors == []


@pytest.mark.parametrize(
    "entry", ["logs", "lock", "state.json", "secrets.json", "env.sh", "journal-0.jsonl", "jobs/job.log"]
)
def test_runner_never_writes_through_a_link_in_its_state_directory(
    project: Project, tmp_path: Path, entry: str
) -> None:
    project.write(
        """
        steps:
          - name: key
            secret: {bytes: 8}
          - name: settings
            env: {A: "1"}
          - name: job
            run: {command: [echo, hi]}
        """
    )
    assert project.run("apply").code == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "precious"
    if entry == "logs":
        target.mkdir()
        for i in range(25):
            (target / f"2026010{i % 10}-00000{i % 10}-{i}").mkdir(exist_ok=True)  # look like run directories
        before = sorted(p.name for p in target.iterdir())
    else:
        target.write_text("keep me\n")
    link = project.path / ".runner" / entry
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    elif link.exists() or link.is_symlink():
        link.unlink()
    link.symlink_to(target)
    (project.path / "pipeline.yaml").write_text((project.path / "pipeline.yaml").read_text().replace("hi", "ho"))
    result = project.run("apply")
    assert result.code == 1, result.text
    assert "is a symbolic link" in result.err and str(link) in result.err, result.err
    if entry == "logs":
        assert sorted(p.name for p in target.iterdir()) == before  # nothing pruned there
    else:
        assert target.read_text() == "keep me\n"  # neither truncated nor appended to


def test_records_and_journal_lines_of_the_wrong_type_are_left_out_and_said(project: Project) -> None:
    project.write("steps:\n  - name: a\n    run: {command: [echo, hi]}\n  - name: b\n    run: {command: [echo, ho]}\n")
    assert project.run("apply").code == 0
    state = project.path / ".runner" / "state.json"
    data = json.loads(state.read_text())
    data["steps"]["a"] = "a string, not a record"
    data["steps"]["b"] = {"status": None, "outputs": [1, 2], "fingerprint": 5, "upstream": "x", "spec": 3}
    state.write_text(json.dumps(data))
    journal = project.path / ".runner" / f"journal-{data['generation']}.jsonl"
    lines = [{"step": [1], "record": {}}, {"step": 5, "record": "x"}, {"step": "\x1b[31mred", "record": 7}]
    journal.write_text("".join(json.dumps(x) + "\n" for x in lines))
    for command in ("plan", "status", "explain a", "apply"):
        result = project.run(*command.split())
        assert "internal error" not in result.text and "Traceback" not in result.text, (command, result.text)
        assert "held corrupt state" in result.err and "line 1" in result.err and "'a'" in result.err, result.err
        assert "\x1b" not in result.text
    assert project.run("apply").err == ""  # rewritten whole by the apply: nothing corrupt is left
    assert project.run("plan").code == 0


def test_two_pipeline_files_in_one_directory_keep_their_own_state(project: Project) -> None:
    """-f a.yaml and -f b.yaml beside each other (issue 19, item 2): same-named steps no longer re-run on every
    apply, each file's secret is its own and stable, and one file's apply does not lock out the other."""
    for name in ("a", "b"):
        project.write(
            f"""
            name: {name}
            vars: {{hold: ""}}
            steps:
              - name: key
                secret: {{bytes: 8}}
              - name: work
                run: "echo {name} >> work-{name}.count; echo {{{{ steps.key.value }}}} > key-{name}.txt"
              - name: slow
                run: "{{{{ 'touch held; until [ -e release ]; do sleep 0.05; done' if vars.hold else 'true' }}}}"
            """,
            name=f"{name}.yaml",
        )
    assert project.run("apply", "-f", "a.yaml").code == 0
    assert project.run("apply", "-f", "b.yaml").code == 0
    for _ in range(2):
        for name in ("a", "b"):
            again = project.run("apply", "-f", f"{name}.yaml")
            assert again.code == 0 and "changed=0" in again.out, again.text
    assert project.count("work-a.count") == 1 and project.count("work-b.count") == 1
    key_a, key_b = (project.path / "key-a.txt").read_text(), (project.path / "key-b.txt").read_text()
    assert key_a != key_b
    assert (project.path / ".runner-a.yaml" / "state.json").exists()
    assert (project.path / ".runner-b.yaml" / "state.json").exists()
    # one file's long apply holds only its own lock
    slow = project.popen("apply", "-f", "a.yaml", "--var", "hold=1", "--force", "slow")
    deadline = time.monotonic() + 30
    while not (project.path / "held").exists():  # a.yaml's apply is inside its step, holding its lock
        assert slow.poll() is None and time.monotonic() < deadline, slow.communicate()
        time.sleep(0.05)
    other = project.run("apply", "-f", "b.yaml", "--force", "work")
    (project.path / "release").touch()
    assert other.code == 0, other.text
    assert slow.wait(timeout=30) == 0


def test_a_state_directory_made_before_by_another_file_stays_its_own(project: Project) -> None:
    """A `.runner/` made by `-f b.yaml` before each file had its own stays b.yaml's while no pipeline.yaml claims
    it: an upgrade does not re-run what was done."""
    project.write("name: b\nsteps:\n  - name: work\n    run: 'echo 1 >> work.count'\n", name="b.yaml")
    assert project.run("apply", "-f", "b.yaml").code == 0
    made = project.path / ".runner-b.yaml"
    made.rename(project.path / ".runner")  # where an older runner kept it
    again = project.run("apply", "-f", "b.yaml")
    assert again.code == 0 and "changed=0" in again.out, again.text
    assert project.count("work.count") == 1


@pytest.mark.parametrize("damage", ["torn", "removed", "not UTF-8"])
def test_a_damaged_state_is_restored_from_its_backup_without_re_running(project: Project, damage: str) -> None:
    """A state.json torn mid-write (issue 18, item 5), removed by hand, or not UTF-8 text: every command names
    the backup and the command that restores it; after `runner restore-state` nothing that was done runs again."""
    project.write(
        """
        name: backup
        steps:
          - name: one
            run: "echo 1 >> one.count"
          - name: two
            run: "echo 1 >> two.count"
        """
    )
    assert project.run("apply").code == 0
    state = project.path / ".runner" / "state.json"
    backup = project.path / ".runner" / "state.json.backup"
    assert json.loads(backup.read_text()) == json.loads(state.read_text())
    text = state.read_bytes()
    if damage == "torn":
        with open(state, "r+b") as fh:  # torn in place, as a crash on a file system without atomic rename leaves it
            fh.truncate(len(text) // 2)
    elif damage == "removed":
        state.unlink()
    else:
        state.write_bytes(text.replace(b'"steps"', b'"st\xffeps"'))
    for command in ("plan", "apply", "status"):
        refused = project.run(command)
        assert refused.code == 1, refused.text
        assert "state.json.backup" in refused.err and "runner restore-state" in refused.err, refused.err
        assert "Traceback" not in refused.err and "internal error" not in refused.err, refused.err
    assert project.count("one.count") == 1
    restored = project.run("restore-state")
    assert restored.code == 0 and "restored" in restored.out, restored.text
    damaged = list((project.path / ".runner").glob("state.json.damaged-*"))
    assert bool(damaged) == (damage != "removed"), "the damaged state was not kept"
    again = project.run("apply")
    assert again.code == 0 and "changed=0" in again.out, again.text
    assert project.count("one.count") == 1 and project.count("two.count") == 1


def test_restore_state_without_a_good_backup_says_so(project: Project) -> None:
    project.write("name: t\nsteps:\n  - name: a\n    run: 'true'\n")
    assert project.run("apply").code == 0
    (project.path / ".runner" / "state.json").write_text("{")
    (project.path / ".runner" / "state.json.backup").write_text("{")
    refused = project.run("plan")
    assert refused.code == 1 and "move it away to start over" in refused.err
    restore = project.run("restore-state")
    assert restore.code == 1 and "missing or damaged too" in restore.err, restore.text


def test_logs_never_reads_through_a_planted_link(project: Project, tmp_path: Path) -> None:
    """`runner logs` refuses a symbolic link where a log is, as apply and stop refuse one in .runner/: a step's
    run log replaced by a link, and a link planted in .runner/jobs/."""
    project.write('name: l\nsteps:\n  - name: job\n    run: "echo from-the-step"\n')
    assert project.run("apply").code == 0
    assert "from-the-step" in project.run("logs", "job").out
    private = tmp_path / "private"
    private.write_text("not-for-runner-to-show\n")
    (log,) = (project.path / ".runner" / "logs").glob("*/job.log")
    log.unlink()
    log.symlink_to(private)
    shown = project.run("logs", "job")
    assert shown.code == 1 and "is a symbolic link" in shown.err, shown.text
    assert "not-for-runner-to-show" not in shown.text
    log.unlink()
    jobs = project.path / ".runner" / "jobs"
    jobs.mkdir(exist_ok=True)
    (jobs / "job.log").symlink_to(private)
    shown = project.run("logs", "job")
    assert shown.code == 1 and "is a symbolic link" in shown.err and "job.log" in shown.err, shown.text
    assert "not-for-runner-to-show" not in shown.text

"""The launch kind: foreground jobs, and detached jobs adopted, relaunched, held and stopped across applies."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Project


@pytest.fixture
def jobs(project: Project) -> Iterator[Project]:
    yield project
    for jobfile in (project.path / ".runner/jobs").glob("*.json"):
        try:
            job = json.loads(jobfile.read_text())
            os.killpg(int(job["pgid"]), signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass


def _job(project: Project) -> dict:
    return json.loads((project.path / ".runner/jobs/train.json").read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def _train(project: Project, lr: str = "0.1", command: str = "") -> None:
    command = command or f"echo start lr={lr} >> starts.txt; echo training; exec sleep 300"
    project.write(
        f"""
        steps:
          - name: train
            launch:
              command: "{command}"
              env: {{LR: "{lr}"}}
              detach: true
              stop_timeout: 2
        """
    )


def test_detached_job_is_adopted_not_relaunched(jobs: Project) -> None:
    _train(jobs)
    first = jobs.run("apply")
    assert first.code == 0, first.text
    job = _job(jobs)
    assert _alive(job["pid"])
    again = jobs.run("apply")
    assert again.code == 0, again.text
    assert "running since" in again.out and f"pid {job['pid']}" in again.out
    assert jobs.count("starts.txt") == 1
    log = jobs.run("logs", "train")
    assert log.code == 0 and "training" in log.out


def test_killed_job_is_relaunched(jobs: Project) -> None:
    _train(jobs)
    assert jobs.run("apply").code == 0
    job = _job(jobs)
    _wait_for(lambda: "child_pid" in _job(jobs))
    os.kill(_job(jobs)["child_pid"], signal.SIGKILL)
    _wait_for(lambda: "exit_code" in _job(jobs))
    plan = jobs.run("plan")
    assert plan.code == 2 and "exited with code -9" in plan.out
    assert jobs.run("apply").code == 0
    assert jobs.count("starts.txt") == 2
    # The supervisor itself killed too (as by a reboot): the job is gone without an exit status.
    second = _job(jobs)
    assert second["pid"] != job["pid"]
    os.killpg(second["pgid"], signal.SIGKILL)
    _wait_for(lambda: not _alive(second["pid"]))
    plan = jobs.run("plan")
    assert "the job is gone" in plan.out
    assert jobs.run("apply").code == 0
    assert jobs.count("starts.txt") == 3


def test_finished_job_is_not_relaunched(jobs: Project) -> None:
    _train(jobs, command="echo start >> starts.txt")
    assert jobs.run("apply").code == 0
    _wait_for(lambda: _job(jobs).get("exit_code") == 0)
    result = jobs.run("apply")
    assert result.code == 0
    assert "finished at" in result.out and "(exit code 0)" in result.out
    assert jobs.count("starts.txt") == 1


def test_change_while_running_is_held_until_forced(jobs: Project) -> None:
    _train(jobs, lr="0.1")
    assert jobs.run("apply").code == 0
    pid = _job(jobs)["pid"]
    _train(jobs, lr="0.2")
    plan = jobs.run("plan")
    assert plan.code == 2
    assert "restart pending" in plan.out and "apply --force train" in plan.out
    held = jobs.run("apply")
    assert held.code == 0, held.text
    assert "pending" in held.out and "restart pending" in held.out
    assert _alive(pid) and _job(jobs)["pid"] == pid and jobs.count("starts.txt") == 1

    forced = jobs.run("apply", "--force", "train")
    assert forced.code == 0, forced.text
    new = _job(jobs)
    assert new["pid"] != pid and _alive(new["pid"])
    _wait_for(lambda: not _alive(pid))
    assert (jobs.path / "starts.txt").read_text().splitlines()[-1] == "start lr=0.2"
    assert jobs.run("plan").code == 0


def test_stop_then_apply_leaves_it_stopped(jobs: Project) -> None:
    _train(jobs)
    assert jobs.run("apply").code == 0
    pid = _job(jobs)["pid"]
    stopped = jobs.run("stop", "train")
    assert stopped.code == 0, stopped.text
    assert f"stopped pid {pid} (SIGTERM)" in stopped.out
    assert not _alive(pid)
    after = jobs.run("apply")
    assert after.code == 0 and "stopped by `runner stop`" in after.out
    assert jobs.count("starts.txt") == 1
    assert jobs.run("stop", "train").out.strip().startswith("train: not running")


def test_job_that_exits_at_once_fails_with_its_log(jobs: Project) -> None:
    _train(jobs, command="echo cannot find GPUs; exit 3")
    result = jobs.run("apply")
    assert result.code == 1
    assert "exited at once with code 3" in result.out and "cannot find GPUs" in result.out


def test_foreground_job_streams_and_reports_its_exit_status(jobs: Project) -> None:
    jobs.write(
        """
        steps:
          - name: train
            launch:
              command: "echo step 1; echo step 2; exit 4"
        """
    )
    result = jobs.run("apply")
    assert result.code == 1
    assert "train | step 2" in result.out
    assert "the job exited with code 4" in result.out
    jobs.write(
        """
        steps:
          - name: train
            launch: {command: "echo all done"}
        """
    )
    assert jobs.run("apply").code == 0
    assert jobs.run("apply").out.count("ok       train") == 1


def test_a_job_whose_supervisor_was_killed_is_not_launched_twice(jobs: Project) -> None:
    """kill -9 of the supervisor alone (issue 19, item 8): the job itself still runs; the next apply adopts it
    (it used to say "the job is gone" and start a second copy beside it), and `runner stop` stops it."""
    _train(jobs)
    assert jobs.run("apply").code == 0
    _wait_for(lambda: "child_pid" in _job(jobs))
    job = _job(jobs)
    os.kill(job["pid"], signal.SIGKILL)
    _wait_for(lambda: not _alive(job["pid"]))
    assert _alive(job["child_pid"])
    plan = jobs.run("plan")
    assert "nothing to do" in plan.out, plan.text
    again = jobs.run("apply")
    assert again.code == 0 and "its supervisor" in again.out and "is gone" in again.out, again.text
    assert jobs.count("starts.txt") == 1
    stopped = jobs.run("stop", "train")
    assert stopped.code == 0, stopped.text
    _wait_for(lambda: not _alive(job["child_pid"]))


def test_a_job_file_edited_by_hand_never_signals_another_program(jobs: Project) -> None:
    """A pid or pgid edited into the job file names an unrelated process: stop and apply leave it alone (the
    job's identity is its start time and its token, not the numbers in the file)."""
    import subprocess

    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        _train(jobs)
        assert jobs.run("apply").code == 0
        _wait_for(lambda: "child_pid" in _job(jobs))
        job = _job(jobs)
        path = jobs.path / ".runner/jobs/train.json"
        path.write_text(json.dumps({**job, "pgid": victim.pid}))  # the group of another program
        stop = jobs.run("stop", "train")
        assert stop.code != 0 and "nothing was signalled" in stop.text, stop.text
        assert _alive(victim.pid) and _alive(job["child_pid"])

        # the pid of another program, with the real start time of ours: not the job's (no token), so not running
        path.write_text(json.dumps({**job, "pid": victim.pid, "child_pid": victim.pid, "pgid": victim.pid}))
        stop = jobs.run("stop", "train")
        assert "not running" in stop.out, stop.text
        assert _alive(victim.pid)
        path.write_text(json.dumps(job))
        assert jobs.run("stop", "train").code == 0
        _wait_for(lambda: not _alive(job["child_pid"]))
        assert _alive(victim.pid)
    finally:
        victim.kill()
        victim.wait()


def test_a_step_removed_from_the_pipeline_is_still_seen_stopped_and_forgotten(jobs: Project) -> None:
    """A detached launch deleted from the pipeline (issue 18, item 3): it used to keep running with apply and
    status silent and `runner stop` answering "no step named". Its record is listed, its job can be stopped,
    `down` reaches it, and `forget` drops the record."""
    _train(jobs)
    assert jobs.run("apply").code == 0
    _wait_for(lambda: "child_pid" in _job(jobs))
    job = _job(jobs)
    jobs.write("steps:\n  - name: other\n    run: 'true'\n")
    plan = jobs.run("plan")
    assert "train (launch) was removed from the pipeline" in plan.text and f"stop pid {job['pid']}" in plan.text
    assert "runner stop train" in plan.text, plan.text
    applied = jobs.run("apply")
    assert applied.code == 0 and "train (launch) was removed from the pipeline" in applied.text, applied.text
    status = jobs.run("status")
    assert "removed from the pipeline" in status.out and "train" in status.out, status.text
    stopped = jobs.run("stop", "train")
    assert stopped.code == 0 and "stopped pid" in stopped.out, stopped.text
    _wait_for(lambda: not _alive(job["child_pid"]))
    plan = jobs.run("plan")
    assert "(nothing of it runs): `runner forget train`" in plan.text, plan.text
    assert jobs.run("forget", "train").code == 0
    assert "removed from the pipeline" not in jobs.run("plan").text


def test_down_reaches_a_removed_steps_job(jobs: Project) -> None:
    _train(jobs)
    assert jobs.run("apply").code == 0
    _wait_for(lambda: "child_pid" in _job(jobs))
    job = _job(jobs)
    jobs.write("steps:\n  - name: other\n    run: 'true'\n")
    down = jobs.run("down")
    assert down.code == 0 and "(removed from the pipeline)" in down.out, down.text
    _wait_for(lambda: not _alive(job["child_pid"]))

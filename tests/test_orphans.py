"""Nothing a step started outlives the runner's death, an interrupt, a timeout or the step's failure — setsid'd
and double-forked children included, which leave the step's process group (issue 15, item 1). A step that ends
well keeps what it left running in a session of its own (a daemon, `ray start`)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from conftest import Project


def sleeps_in(path: Path) -> dict[int, str]:
    """Live `sleep` processes whose working directory is `path` (what the test's steps started): pid -> argv."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cwd == str(path) and argv and argv[0].endswith(b"sleep") and state != "Z":
            found[int(entry)] = b" ".join(argv).decode().strip()
    return found


def wait_for(predicate, timeout: float = 20, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def no_sleeps_left(project: Project):  # type: ignore[no-untyped-def]
    yield
    for pid in sleeps_in(project.path):  # never leave a stray process to the next test
        os.kill(pid, signal.SIGKILL)


# the command: one child in a session of its own, one in the background, one in the foreground
THREE = "setsid sleep 7771 & sleep 7772 & (sleep 7773 &) ; [ -e again ] && exit 0; sleep 7774"


def _three(project: Project, extra: str = "") -> None:
    project.write(
        f"""
        name: orphans
        steps:
          - name: spawn
            {extra}
            run: {{command: [sh, -c, "{THREE}"]}}
          - name: after
            run: "echo 1 >> after.count"
        """
    )


def _guardian_of(runner: int) -> int | None:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                argv = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[1]) == runner and b"--guard" in argv:
                return int(entry)
    return None


def test_a_kill_9_of_the_runner_leaves_nothing_it_started_running(project: Project, no_sleeps_left: None) -> None:
    _three(project)
    proc = project.popen("apply")
    wait_for(lambda: len(sleeps_in(project.path)) == 4, what="the four sleeps")
    os.kill(proc.pid, signal.SIGKILL)  # the runner alone, as a crash or the OOM killer does
    proc.wait(timeout=10)
    wait_for(lambda: not sleeps_in(project.path), timeout=10, what="the guardian to stop the step's processes")
    (project.path / "again").touch()
    again = project.run("apply")
    assert again.code == 0, again.text
    assert project.count("after.count") == 1


def test_what_a_crash_left_running_is_reported_and_stopped_by_the_next_apply(
    project: Project, no_sleeps_left: None
) -> None:
    _three(project)
    proc = project.popen("apply")
    wait_for(lambda: len(sleeps_in(project.path)) == 4, what="the four sleeps")
    guardian = _guardian_of(proc.pid)
    assert guardian is not None, "no guardian beside the runner"
    os.kill(guardian, signal.SIGKILL)  # both die: nothing is left to clean up but the next apply
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    time.sleep(0.3)
    left = sleeps_in(project.path)
    assert len(left) == 4, left  # the crash really left them (setsid'd, double-forked, all re-parented)

    plan = project.run("plan")  # the four sleeps and their shell
    assert "5 process(es) it started still running, stopped before it runs again" in plan.out, plan.text
    assert "sleep 777" in plan.out
    assert set(left) == set(sleeps_in(project.path)), "plan only looks"

    (project.path / "again").touch()
    again = project.run("apply")
    assert again.code == 0, again.text
    assert "had left 5 process(es) running; stopped them before running it again" in again.text, again.text
    assert not set(left) & set(sleeps_in(project.path))


@pytest.mark.parametrize("how", ["timeout", "interrupt", "failure"])
def test_a_step_that_does_not_end_well_leaves_nothing_running(project: Project, no_sleeps_left: None, how: str) -> None:
    if how == "failure":
        project.write(
            """
            name: orphans
            steps:
              - name: spawn
                run: {command: [sh, -c, "setsid sleep 7781 & (sleep 7782 &); sleep 0.3; exit 3"]}
            """
        )
    else:
        # a child that ignores SIGTERM too: after the grace it gets SIGKILL
        _three(project, "timeout: 2" if how == "timeout" else "")
        text = (project.path / "pipeline.yaml").read_text()
        text = text.replace("setsid sleep 7771 &", "setsid sh -c 'trap \\\"\\\" TERM; sleep 7771; :' &")
        (project.path / "pipeline.yaml").write_text(text)
    proc = project.popen("apply")
    if how == "interrupt":
        wait_for(lambda: len(sleeps_in(project.path)) == 4, what="the four sleeps")
        os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == {"timeout": 1, "interrupt": 130, "failure": 1}[how], out + err
    assert not sleeps_in(project.path), f"left running after a {how}: {sleeps_in(project.path)}"
    if how != "interrupt":
        assert "process(es) it had left running: " in out + err, out + err


def test_a_step_that_ends_well_keeps_its_daemon(project: Project, no_sleeps_left: None) -> None:
    project.write(
        """
        name: daemon
        steps:
          - name: start_daemon
            run: "setsid sleep 7791 > /dev/null 2>&1 < /dev/null & sleep 0.2"
        """
    )
    done = project.run("apply")
    assert done.code == 0, done.text
    time.sleep(0.5)  # the guardian has seen the end of its pipe by now
    assert list(sleeps_in(project.path).values()) == ["sleep 7791"]


def test_three_ctrl_c_stop_a_stubborn_step_and_record_it(project: Project, no_sleeps_left: None) -> None:
    """Signals during the stop take the grace away; apply still waits until the step is stopped and recorded
    (it used to exit 130 with the process alive and the record `started`)."""
    project.write(
        """
        name: stubborn
        steps:
          - name: stubborn
            run: "trap '' TERM INT; sleep 7801; :"
        """
    )
    proc = project.popen("apply")
    wait_for(lambda: len(sleeps_in(project.path)) == 1, what="the step")
    for _ in range(3):
        os.kill(proc.pid, signal.SIGINT)
        time.sleep(0.25)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, out + err
    assert not sleeps_in(project.path)
    status = project.run("status")
    assert "interrupted" in status.out and "started" not in status.out.split("\n", 1)[1], status.text


def test_a_daemon_that_keeps_the_steps_output_does_not_hold_the_run(project: Project, no_sleeps_left: None) -> None:
    """A child in a session of its own that keeps writing to the step's stdout: the step ends when its command
    does (once nothing has come for half a second; it used to wait 5 s and show the daemon's lines as the step's),
    and what the daemon writes while the run goes on is drained, never blocking it, and not shown."""
    project.write(
        """
        name: chatty_daemon
        steps:
          - name: start
            run: "setsid sh -c 'sleep 0.8; while :; do echo tick-late; sleep 0.05; done' & echo started"
          - name: after
            run: "sleep 7792 & sleep 1.5; kill $!; echo after"
        """
    )
    done = project.run("apply", "-v")
    assert done.code == 0, done.text
    assert "started" in done.out and "tick-late" not in done.out, done.out
    assert "after" in done.out

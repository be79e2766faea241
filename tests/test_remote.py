"""Steps on other machines over ssh, against a real OpenSSH server on loopback: node1 is 127.0.0.1 and node2 is
127.0.0.2 (one sshd, two addresses, so two hosts with a connection each). Every kind that takes `host:` is run
there, converged, and re-run; the connections the server let in are counted from its own log."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Project, close_masters, free_port
from wheels import make_wheel

SECRET = "s3cr3t-" + "Q" * 12 + "-value"


def _repo(where: Path) -> tuple[Path, str, str]:
    """A bare repository with a main branch of two commits and a tag v1 on the first: (path, first, second)."""
    work = where / "src"
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"

    def git(*args: str, cwd: Path = work) -> str:
        return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout

    work.mkdir(parents=True)
    git("init", "-q", "-b", "main")
    (work / "f").write_text("1\n")
    git("add", "f")
    git("commit", "-qm", "one")
    git("tag", "v1")
    first = git("rev-parse", "HEAD").strip()
    (work / "f").write_text("2\n")
    git("commit", "-qam", "two")
    second = git("rev-parse", "HEAD").strip()
    bare = where / "repo.git"
    git("clone", "-q", "--bare", str(work), str(bare), cwd=where)
    return bare, first, second


def test_every_remote_kind_converges_on_two_hosts_and_a_rerun_opens_one_connection_per_host(
    project: Project, remote: dict[str, Any], tmp_path: Path
) -> None:
    server = remote["server"]
    there = tmp_path / "there"  # "the other machine's" files (same filesystem: loopback)
    there.mkdir()
    bare, first, _ = _repo(tmp_path / "git")
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "alpha", "1.0", ["beta>=2"])
    make_wheel(wheels, "beta", "2.1")
    port = remote["port"]
    project.write(
        f"""
        name: remote
        vars: {{hosts: [node1, node2], there: "{there}"}}
        steps:
          - name: creds
            env: {{SERVICE_API_KEY: "{SECRET}", MODE: fast}}
          - name: prepare
            needs: [creds]
            for_each: "{{{{ vars.hosts }}}}"
            host: "{{{{ item }}}}"
            run:
              command: >-
                mkdir -p "{there}/{{{{ item }}}}" && printf '%s' "$SERVICE_API_KEY" > "{there}/{{{{ item }}}}/key" &&
                echo "$MODE" > "{there}/{{{{ item }}}}/it's a \\$file" && echo ran >> "{there}/count"
              creates: ["{there}/{{{{ item }}}}/it's a $file"]
          - name: checks
            needs: [prepare]
            host: node1
            assert:
              path: "{there}/node1/*"
              program: [sh, git]
              kernel: "3.0"
              sysctl: {{kernel.pid_max: 300}}
              env: SERVICE_API_KEY
              file: "{there}/node1/key"
              contains: "{SECRET[:8]}"
          - name: kernel
            needs: [checks]
            host: node2
            capture: {{command: "uname -r"}}
          - name: key_back
            needs: [prepare]
            host: node2
            capture: {{command: [cat, "{there}/node2/key"], secret: true}}
          - name: clone
            needs: [checks]
            host: node1
            git: {{url: "{bare}", dest: "{there}/clone", ref: v1}}
          - name: deps
            needs: [checks]
            host: node2
            pip:
              python: "{sys.executable}"
              venv: "{there}/venv"
              packages: [alpha]
              find_links: ["{wheels}"]
              no_index: true
          - name: sshd_seen_from_node2
            needs: [checks]
            host: node2
            wait: {{tcp: "127.0.0.2:{port}", timeout: 10}}
          - name: job
            needs: [clone, deps]
            host: node1
            launch:
              cwd: "{there}/clone"
              command: ["{there}/venv/bin/python", -c, "import alpha, beta; print('job', alpha.VERSION, beta.VERSION)"]
        """
    )
    first_run = project.run("apply", "-j", "4")
    assert first_run.code == 0, first_run.text
    assert "changed=" in first_run.out and "failed=0" in first_run.out
    assert (there / "node1" / "it's a $file").read_text() == "fast\n"  # exported MODE reached both hosts
    assert (there / "node2" / "key").read_text() == SECRET
    assert (there / "clone" / "f").read_text() == "1\n"
    assert (
        subprocess.run(
            ["git", "-C", str(there / "clone"), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        == first
    )
    assert "job 1.0 2.1" in first_run.out  # a foreground launch streams, as a local one does
    assert (there / "count").read_text().count("ran") == 2

    state = json.loads((project.path / ".runner" / "state.json").read_text())["steps"]
    assert {"prepare[node1]", "prepare[node2]"} <= set(state)  # one record per host
    assert state["prepare[node1]"]["outputs"]["host"] == "node1"
    assert state["kernel"]["outputs"]["value"] == os.uname().release
    assert state["deps"]["outputs"]["versions"] == {"alpha": "1.0"}
    assert state["clone"]["outputs"]["host"] == "node1"

    # nothing secret in what runner printed, logged or kept in the clear (the 0600 files are for secrets)
    for path in [*project.path.joinpath(".runner").rglob("*")]:
        if path.is_file() and path.name in ("secrets.json", "env.sh"):
            assert path.stat().st_mode & 0o077 == 0, path
        elif path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
    assert SECRET not in first_run.text

    # a converged re-run with no master left: one connection per host, nothing run
    close_masters(remote["config"], remote["control"])
    before = server.accepted()
    again = project.run("apply", "-j", "4")
    assert again.code == 0 and "changed=0" in again.out, again.text
    assert (there / "count").read_text().count("ran") == 2
    assert server.accepted() - before == 2, "a converged run opens one connection to each of its two hosts"

    # and the next one, within ControlPersist, opens none
    before = server.accepted()
    third = project.run("apply")
    assert third.code == 0 and "changed=0" in third.out, third.text
    assert server.accepted() == before


def test_no_secret_on_a_command_line_there(project: Project, remote: dict[str, Any], tmp_path: Path) -> None:
    """While a remote step runs, no process on the machine (the local ssh, sshd's session, the remote shell)
    carries the exported secret in its argv: it travelled on stdin."""
    found = tmp_path / "found"
    project.write(
        f"""
        name: argv
        steps:
          - name: creds
            env: {{SERVICE_API_KEY: "{SECRET}"}}
          - name: look
            needs: [creds]
            host: node1
            run:
              command: >-
                printf '%s' "$SERVICE_API_KEY" > {tmp_path}/needle;
                for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < "$f" 2>/dev/null; echo; done
                | grep -c -F -f {tmp_path}/needle > {found}; test -s {tmp_path}/needle
        """
    )
    result = project.run("apply")
    assert result.code == 0, result.text
    assert found.read_text().strip() == "0"
    assert (tmp_path / "needle").read_text() == SECRET  # the value did arrive, by stdin


def _ssh_config(remote: dict[str, Any], tmp_path: Path, body: str) -> str:
    config = tmp_path / "ssh_config"
    config.write_text(body + f"Host *\n  User {remote['user']}\n  IdentitiesOnly yes\n  StrictHostKeyChecking yes\n")
    return str(config)


def test_connection_errors_name_the_host_and_what_to_check(
    project: Project, remote: dict[str, Any], tmp_path: Path
) -> None:
    root = remote["root"]
    other_key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    empty_known = tmp_path / "known_hosts_empty"
    empty_known.write_text("")
    other_host_key = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_host_key)], check=True)
    wrong_known = tmp_path / "known_hosts_wrong"  # the machine "was reinstalled": another key under its name
    kind, key = other_host_key.with_suffix(".pub").read_text().split()[:2]
    wrong_known.write_text(f"[127.0.0.1]:{remote['port']} {kind} {key}\n")
    dead = free_port()
    config = _ssh_config(
        remote,
        tmp_path,
        f"Host stranger\n  HostName 127.0.0.1\n  Port {remote['port']}\n  IdentityFile {root}/client_key\n"
        f"  UserKnownHostsFile {empty_known}\n"
        f"Host wrongkey\n  HostName 127.0.0.1\n  Port {remote['port']}\n  IdentityFile {other_key}\n"
        f"  UserKnownHostsFile {root}/known_hosts\n"
        f"Host impostor\n  HostName 127.0.0.1\n  Port {remote['port']}\n  IdentityFile {root}/client_key\n"
        f"  UserKnownHostsFile {wrong_known}\n"
        f"Host down\n  HostName 127.0.0.1\n  Port {dead}\n  IdentityFile {root}/client_key\n"
        f"Host node1\n  HostName 127.0.0.1\n  Port {remote['port']}\n  IdentityFile {root}/client_key\n"
        f"  UserKnownHostsFile {root}/known_hosts\n",
    )
    project.extra_env["RUNNER_SSH_CONFIG"] = config
    project.write(
        """
        name: errors
        steps:
          - {name: unknown_key, needs: [], run: {host: stranger, command: "true"}}
          - {name: refused, needs: [], run: {host: wrongkey, command: "true"}}
          - {name: unreachable, needs: [], run: {host: down, command: "true"}}
          - {name: changed_key, needs: [], run: {host: impostor, command: "true"}}
          - {name: missing_command, needs: [], run: {host: node1, command: "no-such-program-xyz --flag"}}
          - {name: missing_program, needs: [], launch: {host: node1, command: [no-such-program-xyz]}}
        """
    )
    result = project.run("apply", "--keep-going")
    assert result.code == 1, result.text
    out = result.out
    assert "cannot reach stranger over ssh: host key unknown" in out
    assert "known_hosts" in out and "ssh-keyscan" in out
    assert "cannot reach wrongkey over ssh: authentication refused" in out and "BatchMode" in out
    assert "cannot reach down over ssh: unreachable" in out and "sshd listens" in out
    assert "cannot reach impostor over ssh: host key changed" in out and "ssh-keygen -R" in out
    assert "exited with code 127 on node1: no-such-program-xyz --flag" in out
    assert "a command was not found on node1 (exit 127)" in out
    assert "the job exited with code 127 on node1" in out
    assert "Traceback" not in result.text


@pytest.mark.parametrize(
    "host",
    ["-oProxyCommand=touch /tmp/pwned", "a b", "ops@host:22", "ssh://ops@host:99999", "host;id"],
)
def test_a_host_that_is_no_ssh_destination_is_bad_input(project: Project, host: str) -> None:
    project.write(
        f"""
        name: bad
        steps:
          - name: x
            host: "{host}"
            run: {{command: "true"}}
        """
    )
    result = project.run("plan")
    assert result.code == 2, result.text
    assert "pipeline.yaml:4:" in result.err and "(x).host:" in result.err, result.err
    assert "Traceback" not in result.text


def test_a_detached_job_there_is_adopted_stopped_and_its_log_followed(
    project: Project, remote: dict[str, Any], tmp_path: Path
) -> None:
    marker = tmp_path / "ended"
    project.write(
        f"""
        name: job
        steps:
          - name: creds
            env: {{SERVICE_API_KEY: "{SECRET}"}}
          - name: train
            needs: [creds]
            host: node2
            launch:
              detach: true
              stop_signal: INT
              stop_timeout: 5
              command: >-
                trap 'echo got INT; touch {marker}; exit 3' INT;
                echo "key $SERVICE_API_KEY"; i=0; while [ $i -lt 600 ]; do echo tick $i; i=$((i+1)); sleep 0.1; done
          - name: short
            needs: []
            host: node1
            launch: {{detach: true, command: "echo one; sleep 1; echo two"}}
        """
    )
    started = project.run("apply")
    assert started.code == 0, started.text
    job = json.loads((project.path / ".runner" / "jobs" / "train.json").read_text())
    assert job["host"] == "node2" and job["pid"] > 1
    assert SECRET not in json.dumps(job)

    again = project.run("apply")
    assert again.code == 0 and "changed=0" in again.out, again.text
    assert "running on node2" in again.out
    assert json.loads((project.path / ".runner" / "jobs" / "train.json").read_text())["pid"] == job["pid"]

    # the log, read there: masked, and -f ends with the job
    time.sleep(0.5)
    log = project.run("logs", "train")
    assert log.code == 0 and "tick 1" in log.out, log.text
    assert SECRET not in log.out and "key ********" in log.out
    followed = project.run("logs", "short", "-f", timeout=30)
    assert followed.code == 0 and "one" in followed.out and "two" in followed.out, followed.text

    stopped = project.run("stop", "train")
    assert stopped.code == 0 and "stopped pid" in stopped.out and "on node2" in stopped.out, stopped.text
    assert marker.exists()  # the stop signal asked (SIGINT), the job's trap ran
    assert not Path(f"/proc/{job['pid']}").exists() or _zombie(job["pid"])
    plan = project.run("plan")
    assert "stopped by `runner stop`" in plan.out, plan.text
    forced = project.run("apply", "--force", "train")
    assert forced.code == 0, forced.text
    relaunched = json.loads((project.path / ".runner" / "jobs" / "train.json").read_text())
    assert relaunched["pid"] != job["pid"]
    down = project.run("down")
    assert down.code == 0 and "on node2" in down.out, down.text


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not _zombie(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _zombie(pid), f"pid {pid} is still running"


def _guardian_of(pid: int) -> int | None:
    """The runner's guardian (`sweep.py --guard`), a child of the runner process."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == pid and b"--guard" in cmdline:
            return int(entry.name)
    return None


def _running(needle: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if needle in line and "ps -eo" not in line]


def _jobs(command: str) -> list[str]:
    """The processes that are `command` itself (not the shells around it)."""
    return [line for line in _running(command) if line.split(None, 1)[1].startswith(command)]


@pytest.mark.parametrize("guardian_dies_too", [False, True])
def test_kill_9_of_the_runner_stops_the_remote_step_and_the_next_apply_resumes(
    project: Project, remote: dict[str, Any], tmp_path: Path, guardian_dies_too: bool
) -> None:
    """kill -9 of the runner in the middle of a remote step: the command there stops (its stdin, the line from
    the runner, ends), the step is not recorded done, and the next apply runs it again from the start. With the
    guardian killed too (the control machine lost power), what the step had left running there outside its group
    (a setsid'd daemon) is found by its tag and stopped, there, by the next apply before the step runs again."""
    started = tmp_path / "started"
    fast = tmp_path / "fast"
    done = tmp_path / "done"
    main_sleep = f"sleep {700 + os.getpid() % 200}.25"
    daemon_sleep = f"sleep {900 + os.getpid() % 200}.75"
    project.write(
        f"""
        name: crash
        steps:
          - name: long
            host: node1
            run:
              command: >-
                echo go >> {started}; [ -f {fast} ] || {{ setsid {daemon_sleep} </dev/null >/dev/null 2>&1 &
                {main_sleep}; }}; touch {done}
              creates: ["{done}"]
        """
    )
    proc = project.popen("apply")
    deadline = time.monotonic() + 30
    while not (_running(main_sleep) and _running(daemon_sleep)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(main_sleep) and _running(daemon_sleep), proc.communicate(timeout=10)
    guardian = _guardian_of(proc.pid)
    assert guardian is not None
    if guardian_dies_too:
        # The guardian first: the test's "remote" host is this machine, where a guardian that saw the runner die
        # would find the daemon by its tag in /proc and stop it, which it could not do on a real other machine.
        os.kill(guardian, signal.SIGKILL)
        _wait_gone(guardian)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)

    deadline = time.monotonic() + 15
    while _running(main_sleep) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(main_sleep), "the remote command outlived the killed runner"
    assert not done.exists()
    if guardian_dies_too:
        assert _running(daemon_sleep), "the daemon left its group: only its tag finds it"

    fast.touch()
    resumed = project.run("apply")
    assert resumed.code == 0, resumed.text
    assert "changed" in resumed.out and done.exists()
    assert started.read_text().count("go") == 2  # run again, from the start, once
    assert not _running(daemon_sleep)
    if guardian_dies_too:
        assert "had left 1 process(es) running; stopped them before running it again" in resumed.text
        assert "(on node1)" in resumed.text


def test_a_failed_remote_step_leaves_nothing_running_there(project: Project, remote: dict[str, Any]) -> None:
    daemon_sleep = f"sleep {500 + os.getpid() % 200}.5"
    project.write(
        f"""
        name: failing
        steps:
          - name: bad
            host: node2
            run: {{command: "setsid {daemon_sleep} </dev/null >/dev/null 2>&1 & sleep 0.3; exit 4"}}
        """
    )
    result = project.run("apply")
    assert result.code == 1 and "exited with code 4 on node2" in result.out, result.text
    assert "stopped 1 process(es) it had left running" in result.text and "(on node2)" in result.text
    assert not _running(daemon_sleep)


def test_a_remote_step_that_times_out_is_stopped_there(project: Project, remote: dict[str, Any]) -> None:
    """A step's `timeout` cuts the connection, and the command there stops with it (its stdin ended): the error
    names the machine, nothing of the command is left running, and the next apply runs it again."""
    sleeper = f"sleep {600 + os.getpid() % 100}.625"
    project.write(
        f"""
        name: slow
        steps:
          - name: slow
            timeout: 1
            host: node2
            run: {{command: "unset RUNNER_STEP_TAG; echo started; {sleeper}; echo never"}}
        """
    )  # untagged: on loopback, runner's sweep of the step's tag in this machine's /proc would find it too
    result = project.run("apply")
    assert result.code == 1, result.text
    assert "command timed out after 1s on node2 (stopped there too)" in result.out, result.text
    assert "started" in result.out and "never" not in result.out
    deadline = time.monotonic() + 10
    while _running(sleeper) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(sleeper), "the command outlived its step's timeout on the other machine"
    plan = project.run("plan")
    assert plan.code == 2 and "slow" in plan.out, plan.text


def test_plan_and_apply_agree_on_a_failing_remote_check(project: Project, remote: dict[str, Any]) -> None:
    project.write(
        """
        name: agree
        steps:
          - name: kvm
            host: node1
            assert: {path: /dev/no-such-device-here, message: "no KVM on the AgentENV host"}
          - name: after
            needs: [kvm]
            host: node1
            run: {command: "true"}
        """
    )
    plan = project.run("plan")
    assert "would fail: no KVM on the AgentENV host (/dev/no-such-device-here does not exist on node1)" in plan.out
    apply = project.run("apply")
    assert apply.code == 1
    assert "no KVM on the AgentENV host (/dev/no-such-device-here does not exist on node1)" in apply.out
    assert "blocked=1 (after)" in apply.out


def test_a_check_written_once_fails_there_in_the_words_it_fails_here(
    project: Project, remote: dict[str, Any], tmp_path: Path
) -> None:
    """The assert kind has one path (steps/_support/machine.py): the same failing checks on node1 and on this
    machine (the same filesystem, over loopback) give the same failures, each ending "on node1" there."""
    notes = tmp_path / "notes.txt"
    notes.write_text("first line\nsecond line\n")
    checks = (
        f'path: "{tmp_path}/nothing-*", program: [sh, no-such-program-9], kernel: "999.0", '
        f'sysctl: {{kernel.pid_max: 999999999999}}, env: [NO_SUCH_VARIABLE_9], file: "{notes}", '
        f'contains: "first line\\nthird line", command: "exit 3"'
    )
    project.write(
        f"""
        name: once
        steps:
          - name: here
            needs: []
            assert: {{{checks}}}
          - name: there
            needs: []
            host: node1
            assert: {{{checks}}}
        """
    )
    result = project.run("apply", "--keep-going")
    assert result.code == 1, result.text
    failures = [line.split("check failed: ", 1)[1] for line in result.out.splitlines() if "check failed: " in line]
    assert len(failures) == 2, result.out
    here, there = sorted(failures, key=lambda f: " on node1" in f)
    assert "no-such-program-9 is not on PATH" in here and "`exit 3` exited with code 3" in here, here
    assert len(here.split("; ")) == 7, here  # path, program, kernel, sysctl, env, contains, command
    assert there.count(" on node1") == 7, there
    assert there.replace(" on node1", "") == here, (here, there)


def test_the_multinode_recipe_checks_each_machine_where_it_runs(
    project: Project, remote: dict[str, Any], tmp_path: Path
) -> None:
    """examples/multinode with its machines on loopback (the AgentENV host node1, the head node2, one worker
    node1): `plan` reads the AgentENV host's prerequisites on node1 and the head's `ray` on node2, in one
    connection per machine, and says which machine a failing check failed on."""
    import shutil

    root = Path(__file__).resolve().parent.parent
    shutil.copy(root / "examples" / "multinode" / "pipeline.yaml", project.path / "pipeline.yaml")
    import yaml

    cluster = yaml.safe_load((root / "examples" / "multinode" / "cluster.yaml").read_text())
    cluster.update(aenv_ssh="node1", head_ssh="node2", workers_ssh=["node1"], shared=f"{tmp_path}/shared")
    (project.path / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    before = remote["server"].accepted()
    plan = project.run("plan", "--var-file", "cluster.yaml")
    assert plan.code in (0, 2) and "plan:" in plan.out, plan.text
    assert "cannot reach" not in plan.out, plan.out
    lines = {line.split()[2]: line for line in plan.out.splitlines() if len(line.split()) > 2}
    assert "aenv_ublk" in lines, plan.text
    if not Path("/sys/module/ublk_drv").exists():
        assert "would fail: ublk_drv is not loaded on the AgentENV host" in lines["aenv_ublk"]
        assert "/sys/module/ublk_drv does not exist on node1" in lines["aenv_ublk"]
    if shutil.which("ray") is None:
        assert "ray is not on PATH on node2" in lines["ray_head"], lines["ray_head"]
    assert remote["server"].accepted() - before == 2  # node1 and node2, once each


def test_the_docker_kind_takes_a_machine_as_the_other_kinds_spell_it() -> None:
    from steps.docker import DockerSpec

    assert DockerSpec(name="x", image="i", host="ops@gpu-7").host == "ssh://ops@gpu-7"
    assert DockerSpec(name="x", image="i", host="gpu-7").host == "ssh://gpu-7"
    assert DockerSpec(name="x", image="i", host="ssh://ops@gpu-7:2222").host == "ssh://ops@gpu-7:2222"
    assert DockerSpec(name="x", image="i", host="unix:///var/run/docker.sock").host == "unix:///var/run/docker.sock"
    with pytest.raises(ValueError, match="not an ssh destination"):
        DockerSpec(name="x", image="i", host="-oProxyCommand=x")


def test_a_detached_job_that_moves_machine_is_stopped_where_it_ran_never_left_untracked(
    project: Project, remote: dict[str, Any], tmp_path: Path
) -> None:
    """A launch's `host` changed while its job runs: a restart pending (the job keeps running) until forced; the
    forced apply stops the job where it ran (node1, then this machine) before starting it where the spec says."""
    loop = f"sleep {300 + os.getpid() % 100}.125"

    def write(host_line: str) -> None:
        project.write(
            f"""
            name: moving
            steps:
              - name: train
                launch:
                  {host_line}
                  detach: true
                  stop_timeout: 2
                  command: "{loop}"
            """
        )

    def job() -> dict[str, Any]:
        return json.loads((project.path / ".runner" / "jobs" / "train.json").read_text())

    write("host: node1")
    assert project.run("apply").code == 0
    first = job()
    assert first["host"] == "node1"

    write("host: node2")
    pending = project.run("apply")
    assert "restart pending" in pending.text and "on node1" in pending.text, pending.text
    assert job()["pid"] == first["pid"] and len(_jobs(loop)) == 1

    forced = project.run("apply", "--force", "train")
    assert forced.code == 0, forced.text
    second = job()
    assert second["host"] == "node2" and second["pid"] != first["pid"]
    assert not Path(f"/proc/{first['pid']}").exists() or _zombie(first["pid"])
    assert len(_jobs(loop)) == 1

    write("cwd: .")  # no host: this machine
    pending = project.run("apply")
    assert "restart pending" in pending.text and "on node2" in pending.text, pending.text
    forced = project.run("apply", "--force", "train")
    assert forced.code == 0, forced.text
    third = job()
    assert "host" not in third and third["pid"] != second["pid"]
    assert not Path(f"/proc/{second['pid']}").exists() or _zombie(second["pid"])
    assert len(_jobs(loop)) == 1
    assert project.run("down").code == 0
    deadline = time.monotonic() + 10
    while _running(loop) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(loop)


def test_inputs_and_requirements_files_are_read_on_the_host(
    project: Project, remote: dict[str, Any], tmp_path: Path
) -> None:
    """A remote step's `inputs` and a remote pip's requirements files are the files there: a change to one
    re-runs what it feeds and nothing else; a requirements file missing there fails the step, naming the host."""
    there = tmp_path / "there"
    (there / "conf").mkdir(parents=True)
    (there / "conf" / "a.txt").write_text("one\n")
    (there / "reqs.txt").write_text("alpha\n")
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "alpha", "1.0")
    make_wheel(wheels, "gamma", "3.0")
    project.write(
        f"""
        name: inputs
        steps:
          - name: digest
            host: node1
            run:
              command: cat {there}/conf/*.txt > {there}/digest; echo ran >> {there}/digest-runs
              inputs: ["{there}/conf/*.txt"]
          - name: deps
            host: node2
            pip:
              python: "{sys.executable}"
              venv: "{there}/venv"
              requirements: ["{there}/reqs.txt"]
              find_links: ["{wheels}"]
              no_index: true
        """
    )
    first = project.run("apply")
    assert first.code == 0 and "changed=2" in first.out, first.text
    again = project.run("apply")
    assert again.code == 0 and "changed=0" in again.out, again.text

    (there / "conf" / "b.txt").write_text("two\n")  # a new file the pattern names, there
    changed = project.run("apply")
    assert changed.code == 0 and "changed=1" in changed.out, changed.text
    assert (there / "digest").read_text() == "one\ntwo\n"
    assert (there / "digest-runs").read_text().count("ran") == 2

    (there / "reqs.txt").write_text("alpha\ngamma>=3\n")
    grown = project.run("apply")
    assert grown.code == 0 and "changed=1" in grown.out, grown.text
    state = json.loads((project.path / ".runner" / "state.json").read_text())["steps"]
    assert state["deps"]["outputs"]["versions"] == {"alpha": "1.0", "gamma": "3.0"}
    assert (there / "digest-runs").read_text().count("ran") == 2

    (there / "reqs.txt").unlink()
    plan = project.run("plan")
    missing = project.run("apply")
    assert missing.code == 1, missing.text
    assert f"requirements file {there}/reqs.txt is missing on node2" in missing.out, missing.text
    assert "would fail now: deps" in plan.out and "reqs.txt is missing on node2" in plan.out, plan.text


def test_a_pattern_there_names_what_python_glob_names_here(
    remote: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`creates`, `inputs` and assert's `path` on a host glob there as glob.glob(recursive=True) does here (the
    local kinds' rule): `**` is any depth of directories, hidden names are left out, odd characters are
    literal. Each pattern is expanded on node1 by the shell text the kinds send, and compared with Python's."""
    import glob

    from steps._support import remote as remote_support
    from steps._support import ssh

    monkeypatch.setenv("RUNNER_SSH_CONFIG", remote["config"])
    monkeypatch.setenv("RUNNER_SSH_CONTROL_DIR", remote["control"])
    tree = tmp_path / "tree"
    for name in ("a.txt", "sub/b.txt", "sub/deep/c.txt", "sub/deep/er/d.log", ".hidden.txt", "sub/.h/e.txt"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(name)
    (tree / "odd name's [x] $y.txt").write_text("odd")
    patterns = [
        "*.txt",
        "**/*.txt",
        "sub/**",
        "sub/**/c.txt",
        "**/d.log",
        "sub/*/c.txt",
        "no/**/where",
        "odd*",
        "odd name's [[]x] $y.txt",
        "sub/deep",
        "a.txt",
        "missing.txt",
    ]
    monkeypatch.chdir(tree)
    try:
        for pattern in patterns:
            code, out = ssh.quick("node1", f"cd {ssh.quote(str(tree))} && {remote_support.match_lines(pattern)}")
            assert code == 0, out
            there = sorted(line.rstrip("/") for line in out.splitlines())
            here = sorted(p.rstrip("/") for p in glob.glob(pattern, recursive=True))
            assert there == here, pattern
            code, _ = ssh.quick("node1", f"cd {ssh.quote(str(tree))} && {remote_support.any_match(pattern)}")
            assert (code == 0) == bool(here), pattern
    finally:
        agent = ssh._AGENTS.pop("node1", None)
        if agent is not None:
            agent._stop()
        ssh._MASTERS.pop("node1", None)


def test_git_there_retries_the_network_only_and_takes_a_path_from_the_login_directory(
    project: Project, remote: dict[str, Any], tmp_path: Path
) -> None:
    """As the local kind does, a clone on a host retries what git says is the network (a refused connection) and
    fails at once on what is not (no such repository); runner's own protocol lines stay out of the error. A
    relative `dest` is the login directory's, and pinning a commit works there too."""
    bare, first, _ = _repo(tmp_path / "git")
    dead = free_port()
    home = Path(os.path.expanduser("~"))  # node1 is this machine: its login directory is this user's home
    rel = f".runner-test-{os.getpid()}-{dead}"
    project.write(
        f"""
        name: clones
        steps:
          - {{name: wrong, needs: [], git: {{host: node1, url: "{tmp_path}/no-such.git", dest: "{tmp_path}/w"}}}}
          - name: offline
            needs: []
            host: node1
            git: {{url: "git://127.0.0.1:{dead}/x.git", dest: "{tmp_path}/o", attempts: 2}}
          - {{name: pinned, needs: [], git: {{host: node1, url: "{bare}", dest: "{rel}/clone", ref: "{first}"}}}}
        """
    )
    try:
        result = project.run("apply", "--keep-going")
        assert result.code == 1, result.text
        out = result.out
        missing = f"fatal: repository '{tmp_path}/no-such.git' does not exist"
        assert f"git clone failed on node1 (exit 128): {missing}" in out, out
        assert "not a network error, so not retried" in out
        assert "git clone failed on node1 after 2 attempt(s)" in out and "check that node1 reaches" in out
        assert "RUNNER-GIT" not in result.text
        logs = project.path / ".runner" / "logs"
        assert "attempt 1 of 3 failed" not in "".join(p.read_text() for p in logs.rglob("wrong.log"))
        assert "clone attempt 1 of 2 failed (" in "".join(p.read_text() for p in logs.rglob("offline.log"))
        head = subprocess.run(
            ["git", "-C", str(home / rel / "clone"), "rev-parse", "HEAD"], capture_output=True, text=True
        )
        assert head.stdout.strip() == first, head.stderr
        state = json.loads((project.path / ".runner" / "state.json").read_text())["steps"]
        assert state["pinned"]["outputs"]["path"] == str((home / rel / "clone").resolve())
        assert not list((home / rel).glob(".clone.runner-clone-*"))
        again = project.run("apply", "--only", "pinned")
        assert again.code == 0 and "changed=0" in again.out, again.text
    finally:
        import shutil

        shutil.rmtree(home / rel, ignore_errors=True)


def test_a_machine_whose_engine_is_not_there_is_named_with_where_runner_looked(
    project: Project, remote: dict[str, Any], tmp_path: Path
) -> None:
    """An ssh:// engine is looked for where that machine's own `docker` would look (its login environment's
    DOCKER_HOST here): none there is an error naming the machine and the socket, and plan, which can reach the
    machine, says the step would run (an earlier step may install the engine), as it does for a local engine."""
    root = remote["root"]
    config = _ssh_config(
        remote,
        tmp_path,
        f"Host nodocker\n  HostName 127.0.0.1\n  Port {remote['port']}\n  IdentityFile {root}/client_key\n"
        f"  UserKnownHostsFile {root}/known_hosts\n  SetEnv DOCKER_HOST=unix:///nonexistent/runner/docker.sock\n",
    )
    project.extra_env["RUNNER_SSH_CONFIG"] = config
    project.write(
        """
        name: engine
        steps:
          - {name: box, docker: {host: nodocker, name: x, image: "busybox:latest"}}
        """
    )
    plan = project.run("plan")
    assert plan.code == 2 and "would fail" not in plan.out, plan.text
    result = project.run("apply")
    assert result.code == 1, result.text
    assert (
        "cannot reach the Docker Engine at ssh://nodocker: there is no socket /nonexistent/runner/docker.sock "
        "on nodocker" in result.out
    ), result.out
    assert "set DOCKER_HOST for that user" in result.out and "Traceback" not in result.text


def test_a_pipeline_moved_to_the_steps_host_keeps_its_records(
    project: Project, remote: dict[str, Any], tmp_path: Path
) -> None:
    """The older spelling inside the kind, applied, then written as the step's `host:`: nothing runs again (the
    records are the same)."""
    there = tmp_path / "there"
    there.mkdir()
    bare, first, _ = _repo(tmp_path / "git")

    def write(moved: bool) -> None:
        def step(name: str, kind: str, host: str, fields: list[str]) -> str:
            if moved:
                return "\n".join(
                    [f"  - name: {name}", f"    host: {host}", f"    {kind}:", *(f"      {f}" for f in fields)]
                )
            return "\n".join(
                [f"  - name: {name}", f"    {kind}:", f"      host: {host}", *(f"      {f}" for f in fields)]
            )

        made = [f'command: "echo x > {there}/made && echo ran >> {there}/count"', f'creates: ["{there}/made"]']
        clone = [f'url: "{bare}"', f'dest: "{there}/clone"', f'ref: "{first}"']
        steps = [step("made", "run", "node1", made), step("clone", "git", "node2", clone)]
        steps.append(step("check", "assert", "node1", [f'path: "{there}/clone/f"']))
        project.write("name: moving\nsteps:\n" + "\n".join(steps) + "\n")

    write(moved=False)
    assert project.run("apply").code == 0
    assert "`run.host` is written on the step now" in project.run("validate").out
    write(moved=True)
    said = project.run("validate")
    assert said.code == 0 and "note:" not in said.out, said.out
    plan = project.run("plan")
    assert plan.code == 0 and "nothing to do" in plan.out, plan.out
    apply = project.run("apply")
    assert apply.code == 0 and (there / "count").read_text() == "ran\n", apply.out
    assert "changed=0" in apply.out, apply.out


@pytest.mark.parametrize("how", ["stopped", "host key changed", "stalled"])
def test_a_machine_that_does_not_answer_is_not_a_step_to_run_again(
    project: Project, remote: dict[str, Any], tmp_path: Path, how: str
) -> None:
    """A converged step there whose machine stops answering (its sshd gone, a host key that is not the known one,
    a session that stalls) fails as unreachable without running, plan says so first, what waits on it is
    blocked, its done record is kept, and once the machine answers again the next apply runs nothing; a job
    there parked by `runner stop` is not launched again, neither while it does not answer nor after."""
    root, port = remote["root"], remote["port"]
    there = tmp_path / "there"
    there.mkdir()

    def config_for(node1: str) -> str:
        return _ssh_config(
            remote, tmp_path, f"Host node1\n  HostName 127.0.0.1\n  IdentityFile {root}/client_key\n{node1}"
        )

    answering = f"  Port {port}\n  UserKnownHostsFile {root}/known_hosts\n"
    project.extra_env["RUNNER_SSH_CONFIG"] = config_for(answering)
    project.write(
        f"""
        name: unreachable
        steps:
          - name: made
            host: node1
            run: {{command: "echo ran >> {there}/count && touch {there}/made", creates: ["{there}/made"]}}
          - name: after
            run: "echo after >> after.count"
          - name: parked
            needs: []
            host: node1
            launch: {{detach: true, command: "echo up >> {there}/launches; sleep 600"}}
        """
    )
    assert project.run("apply").code == 0
    parked = project.run("stop", "parked")
    assert parked.code == 0 and "stopped pid" in parked.out, parked.text
    state = project.path / ".runner" / "state.json"
    done = json.loads(state.read_text())["steps"]["made"]
    assert done["status"] == "done"

    paused: list[int] = []
    if how == "stopped":
        close_masters(project.extra_env["RUNNER_SSH_CONFIG"], remote["control"])  # no master of the last run helps
        project.extra_env["RUNNER_SSH_CONFIG"] = config_for(f"  Port {free_port()}\n")
        expected = "cannot reach node1 over ssh: unreachable"
    elif how == "host key changed":
        close_masters(project.extra_env["RUNNER_SSH_CONFIG"], remote["control"])
        other = tmp_path / "other_host_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
        kind, key = other.with_suffix(".pub").read_text().split()[:2]
        (tmp_path / "wrong_known").write_text(f"[127.0.0.1]:{port} {kind} {key}\n")
        wrong = f"  Port {port}\n  UserKnownHostsFile {tmp_path}/wrong_known\n"
        project.extra_env["RUNNER_SSH_CONFIG"] = config_for(wrong)
        expected = "cannot reach node1 over ssh: host key changed"
    else:  # the machine stalls with the connection up: the last run's master stays, the server side stops
        paused = _descendants(remote["server"].proc.pid)
        for pid in paused:
            with contextlib.suppress(ProcessLookupError):  # a session that was ending as it was listed
                os.kill(pid, signal.SIGSTOP)
        project.extra_env["RUNNER_SSH_ANSWER_TIMEOUT"] = "2"
        expected = "node1 did not answer within 2s over ssh"
    try:
        plan = project.run("plan")
        assert plan.code == 2, plan.text
        assert re.search(rf"x fail\s+made\s+.*{expected}", plan.out), plan.out
        assert re.search(r"- block\s+after", plan.out), plan.out

        failed = project.run("apply")
        assert failed.code == 1, failed.text
        assert expected in failed.out and "nothing ran" in failed.out, failed.out
        assert "Traceback" not in failed.text
        assert (there / "count").read_text().count("ran") == 1  # it never ran again
        assert project.count("after.count") == 1  # what waits on it was blocked, not run
        assert json.loads(state.read_text())["steps"]["made"] == done  # the record is the one it was
        assert (there / "launches").read_text() == "up\n"  # the parked job was not launched again
    finally:
        for pid in paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    close_masters(project.extra_env["RUNNER_SSH_CONFIG"], remote["control"])
    project.extra_env["RUNNER_SSH_CONFIG"] = config_for(answering)  # it answers again
    again = project.run("apply")
    assert again.code == 0 and "changed=0" in again.out, again.text
    assert (there / "count").read_text().count("ran") == 1
    assert (there / "launches").read_text() == "up\n" and "stopped by `runner stop`" in again.out, again.out


def _descendants(pid: int) -> list[int]:
    """The processes below `pid` (the sshd sessions under the listener), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_a_command_there_that_exits_255_is_its_own_failure(project: Project, remote: dict[str, Any]) -> None:
    """255 is also ssh's exit for a lost connection: with the machine still answering, it is the command's."""
    project.write('name: e\nsteps:\n  - {name: x, host: node1, run: {command: "exit 255"}}\n')
    result = project.run("apply")
    assert result.code == 1 and "command exited with code 255 on node1" in result.out, result.text
    assert "cannot reach" not in result.out
    assert json.loads((project.path / ".runner" / "state.json").read_text())["steps"]["x"]["status"] == "failed"


def _masters(control: str) -> list[int]:
    """The ssh master processes (`ssh ... -N`) whose control path is under `control`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:1] == [b"ssh"] and b"-N" in argv and any(control.encode() in a for a in argv):
                found.append(int(entry))
    return found


def test_a_killed_master_leaves_no_socket_that_disables_the_next_one(project: Project, remote: dict[str, Any]) -> None:
    """kill -9 of the ssh master leaves its socket: the next apply removes it and starts one master that binds,
    instead of a connection that says "disabling multiplexing" and lives for good."""
    project.write('name: m\nsteps:\n  - {name: x, host: node1, run: {command: "true"}}\n')
    assert project.run("apply").code == 0
    (master,) = _masters(remote["control"])
    os.kill(master, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while master in _masters(remote["control"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in Path(remote["control"]).iterdir()], "the killed master left no socket to test with"
    for _ in range(2):
        again = project.run("apply", "--force", "x")
        assert again.code == 0, again.text
    assert len(_masters(remote["control"])) == 1, _masters(remote["control"])
    check = subprocess.run(
        ["ssh", "-F", remote["config"], "-o", f"ControlPath={remote['control']}/%C", "-O", "check", "node1"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr  # the one master binds the socket and serves


def test_a_job_there_whose_wrapper_is_killed_is_adopted_not_started_twice(
    project: Project, remote: dict[str, Any], tmp_path: Path
) -> None:
    """kill -9 of a remote job's sh wrapper while the job lives: the next apply adopts the job (its exit will not
    be recorded) instead of starting a second one beside it, and `runner stop` stops the job itself."""
    starts = tmp_path / "starts"
    project.write(
        f"""
        name: orphan
        steps:
          - name: train
            host: node1
            launch: {{detach: true, command: "echo start >> {starts}; exec sleep 97779"}}
        """
    )
    assert project.run("apply").code == 0
    job = json.loads((project.path / ".runner" / "jobs" / "train.json").read_text())
    os.kill(job["pid"], signal.SIGKILL)  # node1 is this machine: the wrapper's pid is a pid here
    deadline = time.monotonic() + 5
    while Path(f"/proc/{job['pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)

    def sleeping() -> list[str]:
        return [e for e in os.listdir("/proc") if e.isdigit() and _cmdline(e) == b"sleep\0" + b"97779\0"]

    assert len(sleeping()) == 1
    again = project.run("apply")
    assert again.code == 0 and "changed=0" in again.out, again.text
    assert "is gone: the exit status will not be recorded" in again.out, again.out
    assert starts.read_text().count("start") == 1 and len(sleeping()) == 1  # not started a second time
    stopped = project.run("stop", "train")
    assert stopped.code == 0, stopped.text
    deadline = time.monotonic() + 10
    while sleeping() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sleeping() == [], "the adopted job was not stopped"


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""

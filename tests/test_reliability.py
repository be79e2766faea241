"""Signals, a full disk, a read-only state directory, readers racing a writer, faults of the outside world,
and secrets searched for in every artifact."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Project

from runner.state import StateStore


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # zombies of the group count as gone: look for a live member
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_step_and_its_whole_process_group(project: Project, sig: int, code: int) -> None:
    project.write(
        """
        name: signals
        steps:
          - name: before
            run: "echo 1 >> before.count"
          - name: slow
            run: "sh -c 'sleep 300 & sleep 300 & wait' & echo $$ > group.pid; wait"
          - name: after
            run: "echo 1 >> after.count"
        """
    )
    proc = project.popen("apply")
    deadline = time.monotonic() + 30
    while not (project.path / "group.pid").exists() or not (project.path / "group.pid").read_text().strip():
        assert time.monotonic() < deadline, "the slow step never started"
        time.sleep(0.05)
    pgid = int((project.path / "group.pid").read_text())  # the step's shell leads its own process group
    time.sleep(0.3)
    assert _group_alive(pgid)
    proc.send_signal(sig)
    proc.wait(timeout=30)
    assert proc.returncode == code
    assert not _group_alive(pgid), "processes of the step were left running"
    assert (StateStore(project.path / ".runner").load().record("slow") or {})["status"] == "interrupted"
    (project.path / "group.pid").unlink()
    project.write((project.path / "pipeline.yaml").read_text().replace("sh -c 'sleep 300 & sleep 300 & wait' & ", ""))
    resumed = project.run("apply")
    assert resumed.code == 0, resumed.text
    assert project.count("before.count") == 1 and project.count("after.count") == 1


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs: a disk that fills up for real (ENOSPC)."""
    where = tmp_path / "small-disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # the disk is full
    finally:
        os.close(fd)


def test_a_clone_into_a_full_disk_is_the_disk_not_the_network(small_disk: Path, tmp_path: Path) -> None:
    """git says "early EOF" or "invalid index-pack output" after the disk filled: that is not the network, so it
    is one attempt, said as the disk, and no half clone is left there."""
    src = tmp_path / "src"
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True)
    (src / "big").write_bytes(os.urandom(2 * 1024 * 1024))  # does not compress: more than the 512 KiB disk
    subprocess.run(["git", "-C", str(src), "add", "big"], check=True, env=env)
    subprocess.run(["git", "-C", str(src), "commit", "-qm", "big"], check=True, env=env)
    project = Project(tmp_path / "project")
    project.path.mkdir()
    project.write(f'name: full\nsteps:\n  - name: repo\n    git: {{url: "file://{src}", dest: "{small_disk}/repo"}}\n')
    result = project.run("apply")
    assert result.code == 1, result.text
    assert "No space left on device" in result.out or "no space left on device" in result.out, result.out
    assert "retrying" not in result.text and "not retried: it is the disk" in result.out, result.text
    assert not [p.name for p in small_disk.iterdir()], "a half clone was left on the full disk"
    assert "Traceback" not in result.text


def test_a_full_disk_is_a_clear_error_and_the_state_is_kept(small_disk: Path) -> None:
    project = Project(small_disk)
    project.write('name: disk\nvars: {n: "1"}\nsteps:\n  - name: a\n    run: "echo {{ vars.n }}"\n')
    assert project.run("apply").code == 0
    state_dir = small_disk / ".runner"
    before = (state_dir / "state.json").read_text()

    _fill(small_disk / "filler")  # full before the run: said up front, nothing runs
    result = project.run("apply", "--var", "n=2")
    assert result.code == 1, result.text
    assert "No space left on device" in result.err and "the previous state is kept" in result.err
    assert "Traceback" not in result.text
    assert (state_dir / "state.json").read_text() == before
    (small_disk / "filler").unlink()

    # Full in the middle of the run: the step that filled the disk cannot be recorded as done.
    project.write(
        'name: disk\nvars: {n: "1"}\nsteps:\n  - name: a\n    run: "echo {{ vars.n }}"\n'
        '  - name: hog\n    run: "test -f hogged || { touch hogged; cat /dev/zero > filler; true; }"\n'
    )
    result = project.run("apply", "--var", "n=2")
    assert result.code == 1, result.text
    assert "No space left on device" in result.text and "Traceback" not in result.text
    StateStore(state_dir).load()  # what is there still loads
    (small_disk / "filler").unlink()
    resumed = project.run("apply", "--var", "n=2")
    assert resumed.code == 0, resumed.text


def test_a_read_only_state_directory_is_a_clear_error(project: Project) -> None:
    project.write('name: ro\nvars: {n: "1"}\nsteps:\n  - name: a\n    run: "echo {{ vars.n }} >> ran.txt"\n')
    assert project.run("apply").code == 0
    state_dir = project.path / ".runner"
    before = (state_dir / "state.json").read_text()
    made = subprocess.run(["chattr", "+i", str(state_dir)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is not supported here: {made.stderr.strip()}")
    try:
        result = project.run("apply", "--var", "n=2")
    finally:
        subprocess.run(["chattr", "-i", str(state_dir)], check=True)
    assert result.code == 1, result.text
    assert f"cannot write to {state_dir}" in result.err and "nothing was run" in result.err
    assert "Traceback" not in result.text
    assert (state_dir / "state.json").read_text() == before
    assert project.count("ran.txt") == 1  # the step did not run unrecorded


def test_readers_never_see_a_half_written_state(project: Project) -> None:
    steps = "\n".join(f'  - name: s{i}\n    needs: []\n    run: "true"' for i in range(120))
    project.write(f"name: many\nsteps:\n{steps}\n")
    errors: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                StateStore(project.path / ".runner").load()
            except Exception as exc:  # noqa: BLE001 - any failure is what we look for
                errors.append(repr(exc))

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    try:
        result = project.run("apply", "-j", "4")
        status = project.run("status")
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert result.code == 0 and status.code == 0
    assert errors == []
    assert len(StateStore(project.path / ".runner").load().steps) == 120


# ---- the outside world ---------------------------------------------------------------------------------


class Silent:
    """A TCP server that accepts and then says nothing: a remote that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_a_git_remote_that_hangs_times_out_with_a_clear_error(project: Project) -> None:
    silent = Silent()
    try:
        project.write(
            f"""
            name: hang
            steps:
              - name: src
                timeout: 3
                git: {{url: "git://127.0.0.1:{silent.port}/repo.git", dest: src, attempts: 1}}
            """
        )
        began = time.monotonic()
        result = project.run("apply", timeout=60)
    finally:
        silent.close()
    assert result.code == 1 and "timed out after 3s" in result.out, result.text
    assert time.monotonic() - began < 30
    assert not (project.path / "src").exists()
    assert json.loads((project.path / ".runner" / "state.json").read_text())["steps"]["src"]["status"] == "failed"


def test_an_unreachable_package_index_is_a_clear_error(project: Project) -> None:
    project.write(
        f"""
        name: index
        steps:
          - name: deps
            pip:
              venv: venv
              python: {sys.executable}
              packages: [definitely-not-installed-pkg]
              index_url: http://127.0.0.1:9/simple
              extra_args: [--retries, "0", --timeout, "2"]
        """
    )
    result = project.run("apply", timeout=300)
    assert result.code == 1, result.text
    assert "definitely-not-installed-pkg" in result.out and "Traceback" not in result.text
    assert "error:" in result.out


def test_a_command_that_is_not_there_and_a_creates_that_never_appears(project: Project) -> None:
    project.write(
        """
        name: outside
        steps:
          - name: missing
            needs: []
            run: {command: [no-such-program-anywhere, --flag]}
          - name: uncreated
            needs: []
            run: {command: "true", creates: [never.txt]}
        """
    )
    result = project.run("apply", "--keep-going")
    assert result.code == 1
    assert "command not found: no-such-program-anywhere" in result.out
    assert "never.txt" in result.out
    state = json.loads((project.path / ".runner" / "state.json").read_text())["steps"]
    assert state["missing"]["status"] == "failed" and state["uncreated"]["status"] == "failed"


def test_no_docker_engine_is_a_clear_error(project: Project, tmp_path: Path) -> None:
    project.write(
        f"""
        name: engine
        steps:
          - name: box
            docker: {{name: x, image: busybox, host: "unix://{tmp_path}/nothing.sock"}}
        """
    )
    result = project.run("apply")
    assert result.code == 1 and "cannot reach the Docker Engine at unix://" in result.out, result.text
    assert "Traceback" not in result.text


# ---- secrets -------------------------------------------------------------------------------------------


def test_a_secret_appears_in_no_artifact(project: Project) -> None:
    project.write(
        """
        name: leak
        secrets: [token]
        vars: {token: "tok-5ecret-value-0042"}
        steps:
          - name: key
            secret: {prefix: key_, bytes: 12}
          - name: settings
            env: {API_KEY: "{{ steps.key.value }}", TOKEN: "{{ vars.token }}"}
          - name: echo
            run: "echo key=$API_KEY token=$TOKEN; echo {{ steps.key.value }} >&2; exit 3"
        """
    )
    outputs = [
        project.run("apply"),
        project.run("apply", "-v"),
        project.run("apply", "--json", "-v"),
        project.run("plan"),
        project.run("plan", "--json"),
        project.run("status"),
        project.run("explain", "echo"),
        project.run("explain", "settings"),
        project.run("logs", "echo"),
        project.run("graph"),
    ]
    key = json.loads((project.path / ".runner" / "secrets.json").read_text())["key"]["value"]
    assert (project.path / ".runner" / "secrets.json").stat().st_mode & 0o777 == 0o600
    assert (project.path / ".runner" / "env.sh").stat().st_mode & 0o777 == 0o600
    for value in (key, "tok-5ecret-value-0042"):
        for result in outputs:
            assert value not in result.out and value not in result.err
        for path in (project.path / ".runner").rglob("*"):
            if path.is_file() and path.name not in ("secrets.json", "env.sh"):
                assert value not in path.read_text(errors="replace"), path
    assert "key=******** token=********" in outputs[1].out


def test_a_secret_as_a_for_each_item_names_nothing(tmp_path: Path) -> None:
    """Secrets as for_each items (issue 33, item 5) — inside a string, a list var in `secrets:`, a generated key,
    a value under a secret-sounding name in an item — and an interpreter whose path holds one: each such item is
    named `secret-<keyed digest>`, stable across applies, and no output, record, log, job file, file name or
    pip cache under .runner/ carries the value."""
    from harness import Harness

    token, keys, named = "tok-5ecret-value-0042", ["kA-alpha-secret-1", "kB-beta-secret-22"], "tk-named-in-item-77"
    interpreter = tmp_path / f"py-{token}"
    interpreter.mkdir()
    (interpreter / "python").symlink_to(sys.executable)
    runner = Harness(tmp_path)
    runner.write(
        f"""
        name: items
        secrets: [token, keys]
        vars: {{token: "{token}", keys: {json.dumps(keys)}}}
        steps:
          - name: key
            secret: {{bytes: 12}}
          - name: one
            for_each: "{{{{ vars.token }}}},other"
            run: "echo {{{{ item }}}}"
          - name: listed
            for_each: "{{{{ vars.keys }}}}"
            run: "echo {{{{ item }}}}"
          - name: made
            for_each: ["{{{{ steps.key.value }}}}", plain]
            run: "echo {{{{ item }}}}"
          - name: named
            for_each: [{{region: eu, api_token: "{named}"}}]
            run: "echo {{{{ item.region }}}}"
          - name: job
            for_each: ["{{{{ vars.token }}}}"]
            launch: {{command: "echo started {{{{ item }}}}", detach: true}}
          - name: deps
            pip: {{python: "py-{{{{ vars.token }}}}/python", packages: [pip]}}
        """
    )
    first = runner("apply", "--json")
    assert first.code == 0, first.out + first.err
    again = runner("apply")
    assert again.code == 0 and "changed=0" in again.out, again.out  # the same names: nothing runs again
    finished = first.finished()
    secret_keys = sorted(name for name in finished if "[secret-" in name)
    assert [name.split("[")[0] for name in secret_keys] == ["job", "listed", "listed", "made", "named", "one"]
    assert "one[other]" in finished and "made[plain]" in finished
    plan = runner("plan")
    assert plan.code == 0 and "nothing to do" in plan.out, plan.out
    one = next(name for name in secret_keys if name.startswith("one["))
    outputs = [first, again, plan, runner("plan", "--json"), runner("status"), runner("explain", one)]
    job = next(name for name in secret_keys if name.startswith("job["))
    outputs += [runner("logs", one), runner("explain", "job"), runner("graph"), runner("logs", job)]
    assert outputs[6].code == 0 and "********" in outputs[6].out, outputs[6].out
    # a detached job writes its own output to its log as it printed it; the header and `runner logs` mask it
    job_log = tmp_path / ".runner" / "jobs" / f"{job}.log"
    assert job_log.read_text().splitlines()[1] == f"started {token}"
    assert outputs[-1].out.splitlines()[0].endswith("echo started ********"), (outputs[-1].out, outputs[-1].err)
    assert outputs[-1].out.splitlines()[1] == "started ********", outputs[-1].out
    value = json.loads((tmp_path / ".runner" / "secrets.json").read_text())["key"]["value"]
    files = [p for p in (tmp_path / ".runner").rglob("*") if p.name not in ("secrets.json", "env.sh", job_log.name)]
    assert any(p.parent.name == "pip" for p in files) is False  # the one interpreter's path carries a secret
    for leak in (token, *keys, named, value):
        for said in outputs:
            assert leak not in said.out and leak not in said.err, said.out
        for path in files:
            assert leak not in str(path.relative_to(tmp_path)), path
            if path.is_file():
                assert leak not in path.read_text(errors="replace"), path


def test_a_followed_log_never_shows_the_start_of_a_secret_before_its_end() -> None:
    """`runner logs -f` shows a line as far as it has come, but holds back an end that could begin a secret."""
    from runner.secrets import Masker

    masker = Masker()
    masker.add("tok-5ecret-value-0042")
    for partial in ("step 3/9 tok-5ec", "step 3/9 tok-", "step 3/9 tok-5ecret-value-004"):
        assert masker.safe_end(partial) == len("step 3/9 "), partial
    for whole in ("step 3/9 done", "step 3/9 tok"):  # fewer than 4 characters are not held (nor masked)
        assert masker.safe_end(whole) == len(whole)
    assert masker.safe_end("x tok-5ecret-value-0042") == len("x tok-5ecret-value-0042")  # whole: masked as it is


def test_slices_and_base64_of_a_secret_are_masked(project: Project) -> None:
    """Transformed secrets (issue 19, item 4): a slice of 8 characters or more rendered into a step (in any
    case), and the secret's base64 wherever it sits in the encoded stream, are masked in the log, the state
    and the output."""
    import base64

    token = "s3cr3t-t0ken-value-1234567890"
    project.write(
        f"""
        name: shapes
        secrets: [token]
        vars: {{token: "{token}"}}
        steps:
          - name: leak
            run: >-
              echo {{{{ vars.token[:12] }}}};
              echo {{{{ vars.token[4:16] | upper }}}};
              printf %s {{{{ vars.token }}}} | base64 -w0; echo;
              echo {{{{ vars.token }}}} | base64 -w0; echo;
              printf 'user:%s' {{{{ vars.token }}}} | base64 -w0; echo
        """
    )
    result = project.run("apply", "-v")
    assert result.code == 0, result.text
    logs = "".join(p.read_text() for p in (project.path / ".runner" / "logs").glob("*/*.log"))
    state = (project.path / ".runner" / "state.json").read_text()
    leaks = [token[:12], token[4:16].upper(), base64.b64encode(token.encode()).decode()[:20]]
    leaks += [base64.b64encode(b"user:" + token.encode()).decode()[8:28]]
    for where, text in (("output", result.text), ("log", logs), ("state", state)):
        for leak in leaks:
            assert leak not in text, f"{leak!r} in the {where}"
    assert logs.count("********") >= 5, logs


def test_a_step_log_that_cannot_be_opened_leaves_the_command_run_and_said(tmp_path: Path) -> None:
    """A log path that cannot be opened (here a link, refused by O_NOFOLLOW): the command still runs, its
    output reaches the tail, the link's target is never written, and a notice says so. (The log used to be
    opened after the process had started, and a failure left the child running with nobody reading it.)"""
    from steps._support.process import run_process
    from steps.base import StepContext

    target = tmp_path / "elsewhere.txt"
    link = tmp_path / "step.log"
    link.symlink_to(target)
    notices: list[str] = []
    ctx = StepContext(
        name="x", pipeline_dir=tmp_path, state_dir=tmp_path, env=dict(os.environ), exported={}, log_path=link,
        notice=notices.append,
    )  # fmt: skip
    result = run_process(["sh", "-c", "echo hello"], ctx)
    assert result.returncode == 0 and result.tail == ["hello"]
    assert not target.exists()
    assert len(notices) == 1 and "could not be written" in notices[0], notices

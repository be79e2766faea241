"""The supervisor of a detached job: `python supervise.py JOBFILE LOG FINGERPRINT -- argv...`.

Started by the launch kind in a session of its own, it starts the job with output to LOG, writes JOBFILE
(pid, process start time, child pid, fingerprint) and, when the job ends, its exit status. It imports
nothing from runner, so it runs with any interpreter and outlives the apply that started it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

TOKEN_VARIABLE = "RUNNER_JOB_TOKEN"
SHOWN_VARIABLE = "RUNNER_JOB_SHOWN"  # the command as the job file and the log show it (secrets masked), JSON


def carries(pid: int, token: str) -> bool:
    """Whether the process's environment holds TOKEN_VARIABLE=token (its identity as runner's job)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    return f"{TOKEN_VARIABLE}={token}".encode() in data.split(b"\0")


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if it is gone.

    A zombie counts as gone: in containers whose init does not reap, a dead supervisor lingers as one.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def write(path: str, data: dict[str, object]) -> None:
    """The job file, atomically. Its own small copy of files.atomic_write: this script runs as a file by any
    interpreter, with no project package on its path, so it imports nothing of the project."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        print("usage: supervise.py JOBFILE LOG FINGERPRINT -- COMMAND...", file=sys.stderr)
        return 2
    jobfile, log, fingerprint, command = argv[0], argv[1], argv[2], argv[4:]
    try:
        shown = json.loads(os.environ.pop(SHOWN_VARIABLE, ""))  # not passed on to the job
    except ValueError:
        shown = None
    if not (isinstance(shown, list) and len(shown) == len(command)):
        shown = command
    # The supervisor outlives signals sent to the job's group, so it can record how the job ended.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    record: dict[str, object] = {
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "start_time": start_time(os.getpid()),
        "fingerprint": fingerprint,
        # in the job's environment too: who signals the job checks it there first (a pid and a start time alone
        # could be edited into the job file)
        "token": os.environ.get(TOKEN_VARIABLE, ""),
        "command": shown,
        "log": log,
        "started": time.time(),
    }
    with open(log, "ab") as out:
        out.write(f"=== job started {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(map(str, shown))}\n".encode())
        out.flush()
        try:
            child = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_default_signals
            )
        except OSError as exc:
            out.write(f"cannot start the job: {exc}\n".encode())
            write(jobfile, {**record, "exit_code": 127, "finished": time.time(), "error": str(exc)})
            return 127
        record.update(child_pid=child.pid, child_start_time=start_time(child.pid))
        write(jobfile, record)
        code = child.wait()
        out.write(f"=== job ended {time.strftime('%Y-%m-%d %H:%M:%S')} with exit code {code}\n".encode())
    write(jobfile, {**record, "exit_code": code, "finished": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

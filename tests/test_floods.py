"""Output floods and hostile bytes (issue 15, item 6): a 100 MB line with no newline, tens of MB of lines,
invalid UTF-8 and terminal escape sequences. The log keeps every byte (secrets masked), runner's memory stays
bounded, and neither the terminal, nor a pipe, nor `--json` gets a raw escape sequence from a step."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import Project

from bench.output import watch_hwm
from runner.secrets import MASK

# clear the screen, set the terminal's title, move the cursor, a C1 CSI, a bell; then bytes that are not UTF-8
HOSTILE = b"before \x1b[2J\x1b]0;PWNED\x07 \x1b[10;10H \xc2\x9b31m \x08\x08 \xff\xfe\x80 after\n"
SECRET = "flood-s3cr3t-value-42"


def _write_stream(project: Project, data: bytes) -> Path:
    path = project.path / "stream.bin"
    path.write_bytes(data)
    return path


def _log(project: Project, step: str = "noisy") -> bytes:
    logs = sorted((project.path / ".runner" / "logs").glob(f"*/{step}.log"))
    assert logs, "no step log"
    return logs[-1].read_bytes()


def _apply_measured(project: Project, *args: str) -> tuple[int, bytes, float]:
    """apply's exit code, its output (stdout and stderr) and runner's peak RSS in MiB."""
    out_path = project.path / "apply.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            project.argv("apply", *args), cwd=project.path, env=project.env(), stdout=out, stderr=subprocess.STDOUT
        )
        peak = [0.0]
        watcher = watch_hwm(proc.pid, peak)
        proc.wait(timeout=300)
        watcher.join(timeout=5)
    return proc.returncode, out_path.read_bytes(), peak[0]


def test_hostile_bytes_reach_the_log_whole_and_no_screen_raw(project: Project) -> None:
    stream = HOSTILE * 3 + f"the secret is {SECRET}\n".encode() + b"\x1b[31mred\x1b[0m and no newline at the end"
    _write_stream(project, stream)
    project.write(
        f"""
        name: hostile
        secrets: [token]
        vars: {{token: "{SECRET}"}}
        steps:
          - name: noisy
            run: "cat stream.bin; echo '{{{{ vars.token }}}}' > /dev/null; cat stream.bin; exit 4"
        """
    )
    code, out, _ = _apply_measured(project, "-v")
    assert code == 1, out
    expected = stream.replace(SECRET.encode(), MASK.encode()) * 2
    assert _log(project) == expected, "the log does not hold the bytes as they came"
    assert b"\x1b" not in out and b"\x07" not in out and b"\xc2\x9b" not in out, out
    assert b"\\x1b[2J" in out and b"\\x1b]0;PWNED\\x07" in out  # shown, visibly
    assert SECRET.encode() not in out
    assert b"\xef\xbf\xbd" in out  # invalid UTF-8 shown as the replacement character, not passed on

    events = project.run("apply", "--json")
    assert "\x1b" not in events.out and SECRET not in events.out
    for line in events.out.splitlines():
        json.loads(line)  # every line parses
    lines = [json.loads(line) for line in events.out.splitlines()]
    failed = next(e for e in lines if e["event"] == "step_finished" and e["step"] == "noisy")
    assert "PWNED" in failed["tail"]  # the tail is there, escaped by JSON

    code, screen = project.on_a_terminal("apply")
    assert code == 1
    for raw in (b"\x1b]0;PWNED", b"\x1b[2J", b"\x1b[10;10H", b"\xc2\x9b", b"\x07", b"\x08"):
        assert raw not in screen, (raw, screen[-2000:])  # rich's own codes are there; none of the step's
    assert b"PWNED" in screen and SECRET.encode() not in screen

    status = project.run("status")  # messages that quote output (the recorded error) stay printable too
    assert "\x1b" not in status.out + status.err


def test_a_100_mb_line_with_no_newline_is_logged_whole_in_bounded_memory(project: Project) -> None:
    size = 100_000_000
    project.write(
        f"""
        name: flood
        steps:
          - name: noisy
            run: "head -c {size} /dev/zero | tr '\\\\0' x; exit 5"
        """
    )
    code, out, rss = _apply_measured(project)
    assert code == 1, out[-2000:]
    log = _log(project)
    assert len(log) == size and set(log) == {ord("x")}, f"the log holds {len(log)} bytes"
    assert rss < 150, f"runner's peak RSS was {rss:.0f} MiB for a 100 MB line"
    assert len(out) < 20_000, f"the terminal got {len(out)} bytes"  # the tail shows the line's start, once
    assert b"a line longer than 1024 KiB: the log has it whole" in out


def test_a_flood_of_lines_is_logged_whole_in_bounded_memory(project: Project) -> None:
    size = 200_000_000
    line = b"0123456789012345678901234567890123456789\n"
    project.write(
        f"""
        name: flood
        steps:
          - name: noisy
            run: "yes 0123456789012345678901234567890123456789 | head -c {size}"
        """
    )
    code, out, rss = _apply_measured(project)
    assert code == 0, out[-2000:]
    log = _log(project)  # capped at the default 128 MiB: its first and its last 64 MiB
    assert log[: len(line) * 3] == line * 3
    cap = 128 << 20
    assert cap <= len(log) <= cap + 300 and b"[runner: " in log and b"bytes left out here" in log
    assert f"of {size} (RUNNER_LOG_LIMIT={cap})".encode() in log
    assert rss < 150, f"runner's peak RSS was {rss:.0f} MiB for {size // 1_000_000} MB of output"


def test_a_reader_that_leaves_ends_output_quietly_and_the_run_goes_on(project: Project) -> None:
    """`runner apply -v | head -2` (issue 19, item 5): no BrokenPipeError traceback from the reader thread, no
    child blocked on a full pipe; the steps finish, are recorded, and apply exits as it would have."""
    project.write(
        """
        name: pipe
        steps:
          - name: chatty
            run: "seq 300000; echo done > chatty.out"
          - name: train
            launch: {command: [sh, -c, "seq 200000; echo trained > train.out"]}
        """
    )
    proc = subprocess.Popen(
        project.argv("apply", "-v"), cwd=project.path, env=project.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = [proc.stdout.readline() for _ in range(2)]
    proc.stdout.close()  # as `head -2` does
    proc.stdout = None
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("apply hung once its reader left") from None
    code = proc.returncode
    assert first[0].startswith(b"running"), first
    assert code == 0, err
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err
    assert (project.path / "chatty.out").exists() and (project.path / "train.out").exists()
    assert "changed=0" in project.run("apply").out


def test_names_and_messages_with_escape_sequences_stay_printable(project: Project) -> None:
    """A for_each key and a failing command's message that carry escape sequences (issue 19, item 3): plan,
    apply, status, explain and the errors show them as \\x1b, on stdout and stderr alike."""
    project.write(
        r"""
        name: keys
        steps:
          - name: each
            for_each: ["\e[2Jcleared", "\e]0;title\a"]
            run: "exit 3"
          - name: grab
            needs: []
            capture: {command: [sh, -c, "printf '\\033[31mred\\033[0m'; exit 4"]}
        """
    )
    outputs = [project.run(*args) for args in (("plan",), ("apply", "--keep-going"), ("status",))]
    outputs.append(project.run("explain", "each"))
    for result in outputs:
        assert "\x1b" not in result.out + result.err and "\x07" not in result.out + result.err, result.text
    applied = outputs[1].text
    assert "internal error" not in applied
    assert "2Jcleared" in applied and "\\x1b[31mred" in applied, applied


def test_a_step_log_is_capped_at_its_first_and_last_part(project: Project) -> None:
    """RUNNER_LOG_LIMIT (default 128 MiB): a step log keeps the first half and the last half of the cap, and a
    line that says how much was left out between them; the tail is rotated on disk, not held in memory."""
    project.write(
        """
        name: capped
        steps:
          - name: noisy
            run: "seq 1 2000000"
        """
    )
    env = {**project.env(), "RUNNER_LOG_LIMIT": "1000000"}
    done = subprocess.run(project.argv("apply"), cwd=project.path, env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    log = _log(project)
    whole = b"".join(b"%d\n" % i for i in range(1, 2_000_001))
    head, _, rest = log.partition(b"\n[runner: ")
    note, _, tail = rest.partition(b"]\n")
    assert head == whole[: len(head)] and len(head) == 500_000
    assert whole.endswith(tail) and 250_000 <= len(tail) <= 500_000
    left_out = int(note.split(b" ", 1)[0])
    assert left_out == len(whole) - len(head) - len(tail), note
    assert not list((project.path / ".runner" / "logs").glob("*/*.part-*")), "rotating parts left behind"

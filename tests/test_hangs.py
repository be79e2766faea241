"""Inputs and patterns that would never end (issue 19, item 7): a device or a FIFO in `inputs` is bad input, a
`creates` glob over the whole disk is given up at the step's timeout or a Ctrl-C, hashing a huge input stops
at a Ctrl-C, and a converged plan does not hash again what has not changed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from conftest import Project


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_an_input_that_never_ends_is_bad_input(project: Project, kind: str) -> None:
    path = "/dev/zero"
    if kind == "fifo":
        os.mkfifo(project.path / "pipe")
        path = "pipe"
    project.write(
        f"""
        name: endless
        steps:
          - name: hash
            run: {{command: "true", inputs: ["{path}"]}}
        """
    )
    for command in ("plan", "apply"):
        started = time.monotonic()
        result = project.run(command, timeout=30)
        assert result.code == 2, result.text
        assert time.monotonic() - started < 10
        text = result.text
        assert "pipeline.yaml:4:" in text and "run.inputs" in text, text
        assert "is not a regular file" in text and ("character device" in text or "FIFO" in text)
        assert "Traceback" not in text


def test_a_creates_glob_over_the_whole_disk_ends_at_the_step_timeout(project: Project) -> None:
    project.write(
        """
        name: everywhere
        steps:
          - name: find
            timeout: 2
            run: {command: "true", creates: ["/**/no-such-file-anywhere-7c1e"]}
        """
    )
    started = time.monotonic()
    result = project.run("apply", timeout=60)
    took = time.monotonic() - started
    assert result.code == 1, result.text
    assert took < 15, f"apply took {took:.1f}s"
    assert "took longer than the step's timeout (2s)" in result.text, result.text


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_long_glob_or_hash_ends_apply_at_once(project: Project, sig: int) -> None:
    big = project.path / "huge.bin"
    with open(big, "wb") as fh:
        fh.truncate(50 * 1024**3)  # 50 GiB, sparse: hashing it would take minutes
    project.write(
        """
        name: long
        steps:
          - name: hash
            run: {command: "true", inputs: [huge.bin]}
          - name: find
            needs: []
            run: {command: "true", creates: ["/**/no-such-file-anywhere-7c1e"]}
        """
    )
    proc = project.popen("apply", "-j", "2")
    time.sleep(2.5)
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("apply did not end after the signal") from None
    assert time.monotonic() - sent < 10
    assert proc.returncode == (130 if sig == signal.SIGINT else 143), out + err
    assert "Traceback" not in err


def test_a_converged_plan_does_not_hash_unchanged_inputs_again(project: Project) -> None:
    data = project.path / "data.bin"
    data.write_bytes(os.urandom(100_000))
    project.write(
        """
        name: cached
        steps:
          - name: prep
            run: {command: "echo 1 >> prep.count", inputs: [data.bin]}
        """
    )
    assert project.run("apply").code == 0
    cache_file = project.path / ".runner" / "cache" / "hashes.json"
    cache = json.loads(cache_file.read_text())
    (entry,) = [v for k, v in cache["files"].items() if k.endswith("data.bin")]
    assert oct(cache_file.stat().st_mode & 0o777) == "0o600"
    # the cache answers for a file whose identity is unchanged: a digest planted there is believed...
    entry[1] = "0" * 64
    cache_file.write_text(json.dumps(cache))
    assert "prep" in project.run("plan").out and "input" in project.run("plan").out.lower()
    # ...and a file that was written to (its ctime moves) is read again: the real digest, nothing to do
    data.write_bytes(data.read_bytes())
    plan = project.run("plan")
    assert "nothing to do" in plan.out, plan.text
    assert project.count("prep.count") == 1
